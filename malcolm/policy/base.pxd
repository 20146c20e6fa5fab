# cython: language_level=3
"""The policy interface: the one seam between a load-balancing policy and whatever drives it.

The simulator (`malcolm.sim`) and the real server runtime (`malcolm.net`/`malcolm.workers`)
call exactly these methods; only the clock and the transport differ (docs/design.md, "One
policy, two clocks"). Times are integer nanoseconds on the driver's clock.

Who calls what
--------------
gateway thread (hot path, tens of ns):
    ``decide_arrival``  on each new task from a client: return ``self.me`` to accept, or the
                        index of the peer to migrate it to.
    ``decide_steal``    after each task completes: return a victim's index, or -1.
policy thread (once per window, default 100 µs):
    ``observe_completions`` this server's completions so far (count, sums of ln ns and
                        of ns), just before each ``observe_local``: its speed.
    ``observe_local``   this server's own load at the start of the window.
    ``observe_peer``    each heartbeat from a peer, as it arrives.
    ``end_window``      end of the window: learn, then publish the new distributions.
    ``fill_heartbeat``  what this server tells its peers.

A policy never reads another server's true state: everything it knows about peers arrives in
heartbeats (or, for client-side policies, in responses).

Migrated and stolen tasks are not offered to ``decide_arrival`` again: a task moves at most
once, so that nothing can bounce between servers.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from malcolm._core cimport Rng


# cpdef: Python code (rack parsers, configuration) imports these limits from
# malcolm.policy.base instead of copying them.
cpdef enum:
    MAX_SERVERS = 64
    MAX_THETA = 256
    # the largest speed code a heartbeat may carry (256 log2 of the service time in ns;
    # 2^48 ns is three days)
    MAX_SVC_LG = 12288


ctypedef struct Heartbeat:
    int32_t src
    uint32_t seq
    int64_t sent_ns
    double load                 # x_src: tasks in the server / service rate, in ns
    double queue_len            # tasks in the server (waiting + in service)
    double rate                 # estimated service rate, tasks per ns
    uint64_t migrations         # cumulative tasks this server migrated away
    uint64_t steals             # cumulative tasks this server stole
    int32_t n_theta             # critic parameters carried (0 for baselines)
    int32_t svc_lg              # the sender's speed: 256 log2 of its geometric-mean service
    #                             time in ns, rounded (0: not known; on the wire a u16)
    double theta[MAX_THETA]


cdef int heartbeat_init(Heartbeat* hb, int src, uint32_t seq, int64_t sent_ns, double load,
                        double queue_len, double rate, uint64_t migrations, uint64_t steals,
                        object theta, int svc_lg=*) except -1


cdef class Policy:
    cdef readonly int n             # servers in the rack
    cdef readonly int me            # this server's index
    cdef Rng rng                    # the gateway thread's generator
    cdef public uint64_t migrations
    cdef public uint64_t steals
    # This server's worker count: local knowledge, not a peer's. The window driver sets it
    # from its estimator at every own observation (driver.pxd), so both clocks pass it the
    # same way; 1 until then. Python reads and sets it as ``workers``.
    cdef int n_workers
    # A stolen task waits ahead of the tasks that arrived here (the gateway's queue, in
    # both clocks): it is the victim's oldest. Python reads it as ``stolen_first``.
    cdef public bint stolen_first

    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil
    cdef int decide_steal(self, int64_t now) noexcept nogil
    cdef bint grant_steal(self, int64_t now, double waiting, double rate) noexcept nogil
    cdef void observe_local(self, int64_t now, double load, double queue_len,
                            double rate) noexcept nogil
    cdef void observe_completions(self, uint64_t n, double log_sum,
                                  double sum_ns) noexcept nogil
    cdef void observe_peer(self, int64_t now, const Heartbeat* hb) noexcept nogil
    cdef void end_window(self, int64_t now) noexcept nogil
    cdef void fill_heartbeat(self, Heartbeat* hb) noexcept nogil


cdef class ClientPolicy:
    """A policy that runs in a client: it picks the server each task is sent to."""
    cdef readonly int n
    cdef Rng rng

    cdef int pick(self, int64_t now) noexcept nogil
    cdef void on_response(self, int64_t now, int server, double load,
                          double queue_len) noexcept nogil
