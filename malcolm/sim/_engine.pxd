# cython: language_level=3
"""Data layout of the discrete-event rack simulator (see ``_engine.pyx``)."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from malcolm._core cimport Estimator, Rng
from malcolm._workload cimport WorkloadC
from malcolm.policy.base cimport Heartbeat, MAX_SERVERS
from malcolm.policy.driver cimport StealGate, WindowState


ctypedef struct Event:
    int64_t t
    uint64_t sk             # (sequence << 8) | kind: sequence breaks ties deterministically
    int32_t a
    int32_t b
    double x


ctypedef struct Task:
    int64_t sent            # client send time
    int64_t idx             # creation index
    double work             # remaining work, ns at speed 1
    double total            # total work, ns at speed 1
    double tag              # ideal PS: virtual finish time
    int32_t type
    int32_t client
    int32_t moved           # migrated or stolen: never offered to decide_arrival again
    int32_t _pad


ctypedef struct Ring:
    int32_t* buf
    int64_t head
    int64_t count
    int64_t cap             # a power of two


ctypedef struct Server:
    int32_t W
    int32_t first           # global index of worker 0
    double speed
    Ring queue              # waiting tasks, oldest first
    int32_t* idle           # stack of idle local worker indices
    int32_t nidle
    uint32_t epoch          # ideal PS: completion events of older epochs are stale
    int64_t ntasks          # tasks in the server: waiting + in service
    # ideal PS: tasks in a binary min-heap on their virtual finish tag
    int32_t* ps
    int32_t ps_n
    int32_t ps_cap
    double V                # virtual time: work each task has received
    int64_t vlast
    uint32_t ps_rr          # which worker "observes" the next PS completion
    int64_t windows
    int64_t gw_free         # the gateway is busy with earlier messages until then
    Estimator est
    # statistics
    double busy_ns          # worker-ns of service
    double load_sum
    double q_sum
    uint64_t accepted
    uint64_t completed
    uint64_t migrations
    uint64_t steals
    uint64_t steal_requests
    uint64_t steal_empty
    uint64_t bad_decisions
    uint64_t dropped        # tasks refused at capacity, answered at once
    uint64_t gw_msgs        # messages the gateway handled
    # cold: once per window or per steal decision
    WindowState win         # the policy thread's window protocol (policy/driver.pxd)
    StealGate steal         # steal requests in flight
