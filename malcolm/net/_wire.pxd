# cython: language_level=3
"""Native encode/decode of the wire format (layout in ``docs/runtime.md`` and ``wire.py``).

All functions are ``noexcept nogil`` and work on raw byte buffers. Decoders check every
length and field and return a negative ``WireError`` instead of reading out of bounds.
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
    WIRE_VERSION = 1
    HDR_LEN = 8
    TASK_LEN = 40                # fixed part of a task
    MOVE_LEN = 72                # fixed part of a forwarded or stolen task
    STEAL_REQ_LEN = 24
    STEAL_EMPTY_LEN = 16
    RESP_LEN = 56                # fixed part of a response
    HB_LEN = 64                  # fixed part of a heartbeat (theta follows)
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
    E_NCODES = 12


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


cdef extern from "net/_netc.h" nogil:
    # One C type shared with the transports' C helpers.
    ctypedef struct NetAddr "mc_addr":
        uint16_t family          # AF_INET, AF_INET6, or FAM_SHM
        uint16_t port
        uint32_t extra           # IPv6 scope id; unused for shm; a QP number for verbs
        uint8_t addr[16]         # IPv4 in the first 4 bytes; an shm endpoint name


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
cdef int wire_get_task(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil
cdef int wire_get_move(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil
cdef int wire_get_steal_req(const uint8_t* buf, uint32_t n, uint32_t* seq,
                            int64_t* sent_ns) noexcept nogil
cdef int wire_get_steal_reply(const uint8_t* buf, uint32_t n, WireTask* t) noexcept nogil
cdef int wire_get_resp(const uint8_t* buf, uint32_t n, WireResp* r) noexcept nogil
cdef int wire_get_heartbeat(const uint8_t* buf, uint32_t n, Heartbeat* hb) noexcept nogil

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
                                 const Heartbeat* hb) noexcept nogil

cdef const char* wire_error_name(int code) noexcept nogil
