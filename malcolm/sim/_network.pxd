# cython: language_level=3
"""The simulated rack's messages between servers, on the engine's state: heartbeats (one copy
per peer, lost or delayed by the network, held by the gateways) and steal requests and
replies. Inline functions, as in ``_central.pxd``, so that they compile into the engine's
event loop (``_engine.pyx``), which owns the clock, the event heap and the servers; the tasks'
own messages (a client's task, a migration, a response) are the loop's.

Every message that reaches a server goes through ``via_gateway`` first: with a gateway cost
it waits for that server's gateway (a FIFO single server) and comes back as its ``*_GW``
event kind.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from malcolm._core cimport est_rate, rng_uniform
from malcolm.policy.base cimport Heartbeat, Policy
from malcolm.policy.driver cimport (
    drv_observe_peer, drv_stole, steal_gate_open, steal_gate_reply,
)
from malcolm.sim._engine cimport (
    EV_HB, EV_HB_GW, EV_HBALL, EV_STEAL_REP, EV_STEAL_REQ, SCHED_PS, Engine, Server,
)
from malcolm.sim._queues cimport Event, ring_pop


cdef inline bint via_gateway(Engine e, const Event* ev, int handled_kind) noexcept nogil:
    """With a gateway cost, a message that reaches server ev.a first waits for its gateway
    and comes back as ``handled_kind``: True if it was deferred so."""
    if e.gw_ns > 0:
        e.push(e.gw_take(ev.a, 1), handled_kind, ev.a, ev.b, ev.x)
        return True
    return False


cdef inline bint hb_lost_on_way(Engine e) noexcept nogil:
    """One heartbeat copy goes to a peer: True if the network loses it (both counted)."""
    e.hb_sent += 1
    if e.loss > 0.0 and rng_uniform(&e.r_net) < e.loss:
        e.hb_lost += 1
        return True
    return False


# ------------------------------------------------------------------ heartbeats
cdef inline void hb_send(Engine e, int s, int idx, uint32_t seq) noexcept nogil:
    """Server s's heartbeat, in ring slot ``idx``, leaves now for every peer. Without jitter
    every copy takes the same delay, so one event delivers them all (``hb_deliver_all``)."""
    cdef int j
    cdef int64_t t = e.now
    if e.gw_ns > 0:
        t = e.gw_take(s, e.n - 1)     # one copy per peer, sent together
    if e.jitter == 0:
        e.push(t + e.delay, EV_HBALL, s, idx, <double>seq)
    else:
        for j in range(e.n):
            if j != s and not hb_lost_on_way(e):
                e.push(t + e.net(), EV_HB, j, idx, <double>seq)


cdef inline void hb_deliver(Engine e, int dst, const Heartbeat* hb) noexcept nogil:
    drv_observe_peer(<Policy>e.pol[dst], e.now, hb)


cdef inline void hb_deliver_range(void** pol, int lo, int hi, int64_t now,
                                  const Heartbeat* hb) noexcept nogil:
    """Deliver to servers lo..hi-1, with the engine's fields in locals: through the policy's
    (opaque) call the compiler would reload them for every copy."""
    cdef int j
    for j in range(lo, hi):
        drv_observe_peer(<Policy>pol[j], now, hb)


cdef inline void hb_deliver_all(Engine e, int src, int idx, double seq) noexcept nogil:
    """Server src's heartbeat reaches every peer at once (no jitter), each copy lost or held
    by its gateway on its own."""
    cdef int j, n = e.n
    cdef const Heartbeat* hb = &e.hbuf[idx]
    if not (e.loss > 0.0) and e.gw_ns == 0:
        # Nothing lost and no gateway: the loop below without its two tests per copy (n - 1
        # per heartbeat, n (n - 1) per window), with the same counts and the same deliveries
        # in the same order. The loop counted one of the n - 1 receptions already.
        e.hb_sent += <uint64_t>(n - 1)
        e.events += <uint64_t>(n - 2)
        hb_deliver_range(e.pol, 0, src, e.now, hb)
        hb_deliver_range(e.pol, src + 1, n, e.now, hb)
        return
    for j in range(n):
        if j == src or hb_lost_on_way(e):
            continue
        if e.gw_ns > 0:      # each peer's gateway takes it in its own time
            e.push(e.gw_take(j, 1), EV_HB_GW, j, idx, seq)
            continue
        e.events += 1        # each reception counts as one simulated event
        hb_deliver(e, j, hb)
    if e.gw_ns == 0:
        e.events -= 1        # the loop counted this event already


cdef inline void hb_deliver_gw(Engine e, int dst, int idx, double seq) noexcept nogil:
    """A heartbeat that waited for dst's gateway; its ring slot may have been reused."""
    if e.hbuf[idx].seq != <uint32_t>seq:
        e.hb_overrun += 1
        return
    hb_deliver(e, dst, &e.hbuf[idx])


# ------------------------------------------------------------------ steals
cdef inline void steal_ask(Engine e, int s) noexcept nogil:
    """After a completion at server s: the policy may send a steal request."""
    cdef int victim = (<Policy>e.pol[s]).decide_steal(e.now)
    cdef uint32_t seq = 0
    cdef int64_t t = e.now
    cdef Server* v = &e.servers[s]
    if victim >= 0:
        if victim < e.n and victim != s:
            if e.max_steals > 0:
                seq = steal_gate_open(&v.steal, e.now)
                if seq == 0:
                    return
            if v.gw_free > t:
                t = v.gw_free      # after the response the gateway is sending
            v.steal_requests += 1
            e.push(t + e.net(), EV_STEAL_REQ, victim, s, <double>seq)
        else:
            v.bad_decisions += 1


cdef inline void steal_request(Engine e, int victim, int thief, double seq) noexcept nogil:
    """A steal request reaches its victim: the oldest waiting task, if any, goes back."""
    cdef Server* v = &e.servers[victim]
    cdef int32_t slot = -1
    # under ideal PS no task is waiting; the victim's policy may keep its waiting tasks
    # (a task it stole itself is not given away again; it counts as waiting work)
    if e.sched != SCHED_PS and v.queue.count > 0 and (<Policy>e.pol[victim]).grant_steal(
            e.now, <double>(v.queue.count + v.stolen.count), est_rate(&v.est)):
        slot = ring_pop(&v.queue)
    if slot >= 0:
        v.ntasks -= 1
        e.tasks[slot].moved = 1
    else:
        e.servers[thief].steal_empty += 1
    e.push(e.now + e.net(), EV_STEAL_REP, thief, slot, seq)


cdef inline void steal_reply(Engine e, int thief, int32_t slot, double seq) noexcept nogil:
    """A steal reply reaches its thief, with a task (``slot``) or without (-1)."""
    cdef Server* v = &e.servers[thief]
    if e.max_steals > 0:
        steal_gate_reply(&v.steal, <uint32_t>seq, e.now)
    if slot < 0:
        return
    # A task always counts, even if its request was given up (as in the runtime).
    if e.cap > 0 and v.ntasks >= e.cap:
        e.drop(thief, slot)
        return
    v.steals += 1
    drv_stole(<Policy>e.pol[thief])
    e.accept(thief, slot, True)
