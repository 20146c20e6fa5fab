# cython: language_level=3
cimport cython
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from malcolm.net._wire cimport E_NCODES, NetAddr, WireReplay, WireTask, mc_sipkey
from malcolm.net.transport cimport MsgBuf, Transport
from malcolm.policy.base cimport MAX_SERVERS, Policy
from malcolm.policy.driver cimport StealGate
from malcolm.runtime.clients cimport ClientNets
from malcolm.runtime.policy_thread cimport PolicyThread
from malcolm.workers.pool cimport TaskSlot, WorkerPool


# Replay state of one client, by client id (authenticated, in the task). A direct-mapped
# table bounds the memory: a client whose slot another took starts afresh, so a replay of
# its messages is caught unless its slot was taken in between.
ctypedef struct ClientReplay:
    uint32_t client_id
    uint32_t _pad
    WireReplay w


# Written by the gateway thread alone, read racily by stats(). The steal counters are the
# StealGate's; the workers' and the policy thread's are their own.
ctypedef struct GatewayCounters:
    uint64_t rx_msgs
    uint64_t tasks_in            # tasks received from clients
    uint64_t accepted            # client tasks this server kept
    uint64_t migrated_out
    uint64_t forwarded_in
    uint64_t stolen_in
    uint64_t stolen_out
    uint64_t stolen_ahead        # stolen tasks queued ahead of the waiting ones (stolen_first)
    uint64_t steal_req_recv
    uint64_t steal_empty_sent
    uint64_t steal_empty_recv
    uint64_t kept_for_silent     # decide_arrival named a peer not heard from: kept here
    uint64_t steals_to_silent    # decide_steal named a peer not heard from: not sent
    uint64_t hb_sent             # heartbeat messages (one per peer)
    uint64_t hb_recv
    uint64_t hb_theta_recv       # critic parameters received in heartbeats (sum of n_theta)
    uint64_t hb_dropped          # the policy thread's inbox was full
    uint64_t responses
    uint64_t dropped_full
    uint64_t overloaded          # refused at arrival: expected wait over max_wait_ns
    uint64_t bad_input
    uint64_t stopped             # answered "server stopped"
    uint64_t malformed
    uint64_t unexpected
    uint64_t gateway_busy_ns     # time in loop passes that moved a message or task
    uint64_t peer_joins          # a peer heard from (authenticated) while presumed absent
    uint64_t peer_leaves         # a peer silent for peer_timeout_ms: presumed down
    uint64_t peer_restarts       # a peer came back with a new epoch (it restarted)
    uint64_t hb_stale            # heartbeats older than one already applied (reordered)
    uint64_t by_reason[E_NCODES]


# final: calls between the hot methods are direct C calls, not through the vtable
@cython.final
cdef class Gateway:
    # configuration
    cdef int n, me, n_types
    cdef Transport tr
    cdef Policy policy
    cdef WorkerPool pool
    cdef PolicyThread pt
    cdef NetAddr peers[MAX_SERVERS]
    cdef ClientNets clients
    cdef int64_t max_service_ns, peer_timeout_ns
    cdef int64_t timeout_ns         # task_timeout_ms: a task's deadline when its client gives none
    cdef int64_t suspect_ns         # silent this long: no migrations to it, no steals from it
    # ... or, for a peer whose heartbeats come further apart (a quiet rack's long windows),
    # 3 of the windows its last heartbeat gave, at most peer_timeout_ns (on_heartbeat)
    cdef int64_t peer_suspect[MAX_SERVERS]
    cdef uint64_t mig_to[MAX_SERVERS]       # tasks migrated to each peer
    cdef int64_t mig_last_ns[MAX_SERVERS]   # when the last one went (0: never)
    cdef int64_t max_wait_ns        # admission control: 0 off
    cdef double adm_rate            # service rate (tasks/ns) for admission, once per batch
    # membership
    cdef int64_t peer_seen[MAX_SERVERS]    # last message from each peer (gateway clock)
    cdef bint peer_up[MAX_SERVERS]         # heard from within peer_timeout_ns
    cdef uint32_t peer_left[MAX_SERVERS]   # times each peer left (serve logs who, by index)
    cdef int64_t next_member_check
    # authentication (docs/runtime.md, "Wire format"): the rack key, this run's epoch, a
    # sequence number per destination server (so each receiver sees a dense sequence and a
    # 64-wide replay window suffices), one for everything sent to clients, and per peer what
    # its replay window and heartbeat order need
    cdef mc_sipkey key
    # what servers send each other goes under the destination's own key (wire_dst_key):
    # peer_keys[j] signs what goes to j, peer_keys[me] verifies what comes from peers; the
    # rack key itself (all of them without one) signs clients' tasks and their responses
    cdef mc_sipkey peer_keys[MAX_SERVERS]
    cdef readonly bint authenticated
    cdef readonly uint64_t epoch
    cdef uint64_t tx_seq[MAX_SERVERS]
    cdef uint64_t tx_seq_client
    cdef WireReplay rx_replay[MAX_SERVERS]
    # the last 8 epochs each peer started here (a ring; from_member): an older epoch is
    # taken from a peer presumed down only if it is none of them
    cdef uint64_t ep_seen[MAX_SERVERS][8]
    cdef uint8_t ep_next[MAX_SERVERS]
    cdef uint64_t hb_top[MAX_SERVERS]      # trailer seq of the last heartbeat applied
    cdef uint32_t hb_local_seq[MAX_SERVERS]
    cdef uint32_t hb_wire_seq[MAX_SERVERS]  # the sender's number of that heartbeat (0: none)
    # our clock when we took in each peer's last heartbeat less its sent_ns: its one-way delay
    # plus our clock's offset from its (0: none yet); echoed to it in our heartbeats
    cdef int64_t hb_delay_in[MAX_SERVERS]
    # a heartbeat taken in this pass reported tasks (queue_len > 0): the policy thread is
    # rung for it even in a quiet rack's long window, which it ends (policy_thread.pyx)
    cdef bint hb_busy
    # added to the clock this gateway stamps heartbeats with and takes them in by: 0, or in
    # tests a host whose clock is not its peers' (set before start)
    cdef public int64_t clock_offset_ns
    cdef ClientReplay* cli_replay
    # state
    cdef uint32_t* free_slots      # a LIFO stack, so the hottest slot is reused
    cdef uint32_t n_free
    cdef uint64_t stop_flag
    cdef bint draining
    cdef int64_t drain_deadline
    cdef StealGate steals          # the rule for steal requests in flight (policy/driver.pxd)
    cdef GatewayCounters count
    cdef NetAddr last_bad_addr
    cdef int last_bad_code
    cdef object thread

    cdef void bad(self, MsgBuf* m, int code) noexcept nogil
    cdef uint32_t seal(self, MsgBuf* b, uint32_t n, int dst) noexcept nogil
    cdef void respond(self, const WireTask* t, const NetAddr* to, uint8_t status,
                      uint16_t flags, int64_t service_ns, const uint8_t* out,
                      uint32_t out_len, double load) noexcept nogil
    cdef void respond_now(self, const WireTask* t, const NetAddr* to, uint8_t status,
                          uint16_t flags) noexcept nogil
    cdef bint enqueue(self, const WireTask* t, const NetAddr* reply, uint16_t flags,
                      uint16_t origin, int64_t now) noexcept nogil
    cdef void send_move(self, int dst, uint8_t kind, const WireTask* t) noexcept nogil
    cdef void free_slot(self, uint64_t idx) noexcept nogil
    cdef bint valid_task(self, const WireTask* t) noexcept nogil
    cdef int on_msg(self, MsgBuf* m, int64_t now) noexcept nogil
    cdef int on_task(self, MsgBuf* m, int src, uint32_t blen, uint64_t ep, uint64_t aseq,
                     int64_t now) noexcept nogil
    cdef bint from_member(self, MsgBuf* m, int src, uint64_t ep, uint64_t aseq,
                          int64_t now) noexcept nogil
    cdef bint epoch_seen(self, int src, uint64_t ep) noexcept nogil
    cdef int on_forward(self, MsgBuf* m, uint32_t blen, int64_t now) noexcept nogil
    cdef void on_steal_req(self, MsgBuf* m, int src, uint32_t blen, int64_t now) noexcept nogil
    cdef int on_steal_reply(self, MsgBuf* m, uint32_t blen, int64_t now) noexcept nogil
    cdef void on_heartbeat(self, MsgBuf* m, int src, uint32_t blen,
                           uint64_t aseq) noexcept nogil
    cdef bint client_fresh(self, MsgBuf* m, uint32_t client_id, uint64_t ep,
                           uint64_t aseq) noexcept nogil
    cdef void check_members(self, int64_t now) noexcept nogil
    cdef void maybe_steal(self, int64_t now) noexcept nogil
    cdef int completions(self, int64_t now) noexcept nogil
    cdef void heartbeat_out(self) noexcept nogil
    cdef void drain_waiting(self) noexcept nogil
    cdef int64_t idle_timeout(self, int64_t now) noexcept nogil
    cdef void loop(self) noexcept nogil
