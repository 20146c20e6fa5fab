# cython: language_level=3
"""The simulator's ideal centralized references (``malcolm.policy.registry``'s ``central``
kind): cFCFS, one rack-wide FCFS queue that hands each task to the fastest idle worker, and
RackSched's power-of-d on true queue lengths. Inline functions on the engine's state, so that
they compile into the engine's event loop; the distributed path never calls them."""
from libc.stdint cimport int32_t

from malcolm._core cimport est_note_arrival, rng_below
from malcolm.policy.base cimport MAX_SERVERS
from malcolm.sim._engine cimport (
    EV_CDISPATCH, ERR_NOMEM, Engine, Server,
)
from malcolm.sim._queues cimport ring_pop, ring_push


cdef inline void cfcfs_start(Engine e, int gw, int32_t slot) noexcept nogil:
    """cFCFS: the task reaches global worker ``gw``, reserved for it, and starts."""
    cdef int s = e.w_server[gw]
    cdef Server* v = &e.servers[s]
    est_note_arrival(&v.est, e.tasks[slot].type)
    v.accepted += 1
    v.ntasks += 1
    e.start(s, gw - v.first, slot)


cdef inline void cfcfs_dispatch(Engine e, int s, int lw, int32_t slot) noexcept nogil:
    cdef int gw = e.servers[s].first + lw
    e.w_slot[gw] = slot       # reserved while the task travels
    if e.cdelay == 0:
        cfcfs_start(e, gw, slot)
    else:
        e.push(e.now + e.cdelay, EV_CDISPATCH, gw, slot, 0.0)


cdef inline void cfcfs_arrival(Engine e, int32_t slot) noexcept nogil:
    """cFCFS: a new task goes to the fastest server with an idle worker, else it waits."""
    cdef int i, s, lw
    cdef Server* v
    for i in range(e.n):
        s = e.speed_order[i]
        v = &e.servers[s]
        if v.nidle > 0:
            v.nidle -= 1
            lw = v.idle[v.nidle]
            cfcfs_dispatch(e, s, lw, slot)
            return
    if ring_push(&e.servers[0].queue, slot) != 0:    # server 0's ring is the rack queue
        e.err = ERR_NOMEM


cdef inline void cfcfs_idle(Engine e, int gw) noexcept nogil:
    """cFCFS: the scheduler learns that global worker ``gw`` is idle."""
    cdef int s = e.w_server[gw]
    cdef Server* v = &e.servers[s]
    cdef int32_t nxt = ring_pop(&e.servers[0].queue)
    if nxt >= 0:
        cfcfs_dispatch(e, s, gw - v.first, nxt)
    else:
        v.idle[v.nidle] = gw - v.first
        v.nidle += 1


cdef inline int pod_pick(Engine e) noexcept nogil:
    """RackSched: the server with the fewest tasks among ``pod_d`` distinct ones drawn
    uniformly (ties: the first drawn)."""
    cdef int best = -1, k = 0, i, j
    cdef int32_t picked[MAX_SERVERS]
    while k < e.pod_d:
        j = <int>rng_below(&e.r_misc, e.n)
        for i in range(k):
            if picked[i] == j:
                j = -1
                break
        if j < 0:
            continue
        picked[k] = j
        k += 1
        if best < 0 or e.servers[j].ntasks < e.servers[best].ntasks:
            best = j
    return best
