# cython: language_level=3
"""Native encode/decode of the wire format (layout in ``docs/runtime.md`` and ``wire.py``).

All functions are ``noexcept nogil`` and work on raw byte buffers. Decoders check every
length and field and return a negative ``WireError`` instead of reading out of bounds.

Every message ends in a 24-byte trailer (``AUTH_LEN``): the sender's epoch, a sequence
number and a SipHash-2-4 MAC under the rack key of everything before the MAC. Encoders
(``wire_put_*``) write the header's length with the trailer included and return the length
*without* it; ``wire_seal`` then appends the trailer. Receivers check the header
(``wire_header``), then ``wire_open`` verifies the MAC and returns the length of the body,
which the ``wire_get_*`` decoders take.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from malcolm.policy.base cimport Heartbeat


cdef extern from "net/_netc.h" nogil:
    uint16_t mc_ld16(const uint8_t* p)
    uint32_t mc_ld32(const uint8_t* p)
    uint64_t mc_ld64(const uint8_t* p)
    double mc_ldf64(const uint8_t* p)
    void mc_st16(uint8_t* p, uint16_t v)
    void mc_st32(uint8_t* p, uint32_t v)
    void mc_st64(uint8_t* p, uint64_t v)
    void mc_stf64(uint8_t* p, double v)
    int mc_isfinite(double d)


cdef enum:
    WIRE_MAGIC = 0x4C4D          # bytes "ML"
    WIRE_VERSION = 5             # 3: a task carries the client's deadline (budget_us);
    #                              4: a heartbeat carries echo_ns (the hop without clocks);
    #                              5: ... and window_us (when its sender's next one is due)
    HDR_LEN = 8
    AUTH_LEN = 24                # trailer on every message: u64 epoch, u64 seq, u64 MAC
    TASK_LEN = 48                # fixed part of a task
    MOVE_LEN = 80                # fixed part of a forwarded or stolen task
    STEAL_REQ_LEN = 24
    STEAL_EMPTY_LEN = 16
    RESP_LEN = 56                # fixed part of a response
    HB_LEN = 80                  # fixed part of a heartbeat (theta follows)
    MAX_HB_WINDOW_US = 60000000  # a heartbeat's window_us: at most idle_window_us's bound
    MAX_PAYLOAD = 1024           # bytes of task or response payload
    MAX_MSG = 4032               # the largest message any transport must carry
    CLIENT_SRC = 0xFFFF          # header src of a message sent by a client
    ADDR_LEN = 24
    FAM_SHM = 0x5348             # NetAddr.family of a shared-memory endpoint
    FAM_VERBS = 0x5642           # reserved for the RDMA transport


cdef enum WireKind:
    K_TASK = 1
    K_RESPONSE = 2
    K_FORWARD = 3
    K_STEAL_REQ = 4
    K_STEAL_REPLY = 5
    K_HEARTBEAT = 6
    K_MAX = 6


cdef enum WireError:
    E_OK = 0
    E_SHORT = -1                 # shorter than a header
    E_MAGIC = -2
    E_VERSION = -3
    E_KIND = -4
    E_LENGTH = -5                # header length != bytes received, or != the kind's layout
    E_PAYLOAD = -6               # payload length over MAX_PAYLOAD
    E_FIELD = -7                 # a field out of range (negative time, NaN load, ...)
    E_THETA = -8                 # more critic parameters than MAX_THETA
    E_SRC = -9                   # src not a server of this rack (or a client where one is required)
    E_ADDR = -10                 # the message came from an address outside the rack
    E_UNEXPECTED = -11           # a valid message this endpoint does not accept
    E_MAC = -12                  # the MAC does not verify: wrong key, or altered on the way
    E_REPLAY = -13               # a sequence number already seen, or too far behind
    E_EPOCH = -14                # an epoch older than the sender's current one
    E_STALE = -15                # a heartbeat older than the last one applied
    E_NCODES = 16


cdef enum TaskFlag:
    F_MIGRATED = 1
    F_STOLEN = 2


cdef enum Status:
    ST_OK = 0
    ST_DROPPED = 1               # no room in the server's queue
    ST_BAD_INPUT = 2             # a field of the task was out of range
    ST_HANDLER_ERROR = 3         # the handler returned an error
    ST_STOPPED = 4               # the server stopped before running the task
    ST_TIMED_OUT = 5             # waited longer than the server's task timeout
    ST_OVERLOADED = 6            # refused at arrival: the queued work would make it wait too long


cdef extern from "net/_netc.h" nogil:
    # One C type shared with the transports' C helpers.
    ctypedef struct NetAddr "mc_addr":
        uint16_t family          # AF_INET, AF_INET6, or FAM_SHM
        uint16_t port
        uint32_t extra           # IPv6 scope id (udp and verbs addresses); 0 for shm
        uint8_t addr[16]         # IPv4 in the first 4 bytes; an shm endpoint name


cdef extern from "net/_siphash.h" nogil:
    ctypedef struct mc_sipkey:
        uint64_t k0
        uint64_t k1
    void mc_sipkey_set(mc_sipkey* k, const uint8_t* key)
    uint64_t mc_siphash24(const mc_sipkey* key, const uint8_t* data, size_t n)


# What a receiver remembers of one sender, against replays: its current epoch (random at
# its start, from the realtime clock, so a restart has a larger one), the highest sequence
# number seen in it and a bitmap of the REPLAY_WINDOW numbers below (datagrams may reorder).
ctypedef struct WireReplay:
    uint64_t epoch
    uint64_t top
    uint64_t bits


ctypedef struct WireHdr:
    uint16_t kind
    uint16_t src
    uint32_t length


ctypedef struct WireTask:
    uint32_t client_id
    uint16_t task_type
    uint16_t payload_len
    uint64_t request_id
    int64_t service_ns           # requested service time (synthetic handlers)
    int64_t send_ns              # the client's intended send time, echoed back
    NetAddr reply                # where the response goes (forwarded/stolen tasks)
    uint16_t origin              # the server the client sent it to
    uint16_t flags               # TaskFlag bits
    uint32_t seq                 # steal sequence number (steal replies)
    uint32_t budget_us           # the client's deadline, relative: µs left to answer (0: none)
    const uint8_t* payload


ctypedef struct WireResp:
    uint32_t client_id
    uint16_t task_type
    uint16_t payload_len
    uint64_t request_id
    int64_t send_ns
    int64_t service_ns           # measured on the worker
    double load                  # piggybacked server load, ns
    uint32_t queue_len
    uint16_t server              # the server that answered
    uint8_t status
    uint8_t flags
    const uint8_t* payload


cdef int wire_header(const uint8_t* buf, uint32_t n, WireHdr* h) noexcept nogil
cdef int wire_open(const uint8_t* buf, uint32_t n, const mc_sipkey* key, uint64_t* epoch,
                   uint64_t* seq) noexcept nogil
cdef void wire_dst_key(const mc_sipkey* base, uint16_t dst, mc_sipkey* out) noexcept nogil
cdef uint32_t wire_seal(uint8_t* buf, uint32_t n, const mc_sipkey* key, uint64_t epoch,
                        uint64_t seq) noexcept nogil
cdef int wire_replay_check(WireReplay* r, uint64_t epoch, uint64_t seq) noexcept nogil
cdef uint64_t wire_new_epoch() noexcept nogil
cdef int wire_get_task(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil
cdef int wire_get_move(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil
cdef int wire_get_steal_req(const uint8_t* buf, uint32_t n, uint32_t* seq,
                            int64_t* sent_ns) noexcept nogil
cdef int wire_get_steal_reply(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil
cdef int wire_get_resp(const uint8_t* buf, uint32_t n, WireResp* r) noexcept nogil
cdef int wire_get_heartbeat(const uint8_t* buf, uint32_t n, Heartbeat* hb,
                            int64_t* echo_ns, uint32_t* window_us) noexcept nogil

cdef uint32_t wire_put_task(uint8_t* buf, uint32_t cap, const WireTask* t) noexcept nogil
cdef uint32_t wire_put_move(uint8_t* buf, uint32_t cap, uint16_t src, uint8_t kind,
                            const WireTask* t) noexcept nogil
cdef uint32_t wire_put_steal_req(uint8_t* buf, uint32_t cap, uint16_t src, uint32_t seq,
                                 int64_t sent_ns) noexcept nogil
cdef uint32_t wire_put_steal_empty(uint8_t* buf, uint32_t cap, uint16_t src,
                                   uint32_t seq) noexcept nogil
cdef uint32_t wire_put_resp(uint8_t* buf, uint32_t cap, uint16_t src,
                            const WireResp* r) noexcept nogil
cdef uint32_t wire_put_heartbeat(uint8_t* buf, uint32_t cap, uint16_t src,
                                 const Heartbeat* hb, int64_t echo_ns,
                                 uint32_t window_us) noexcept nogil

cdef const char* wire_error_name(int code) noexcept nogil
