# cython: language_level=3
"""Native loops of ``malcolm bench runtime``: plain-C floors (``_floor.h``) and the matching
malcolm measurements (a ping client and a flooder on the real transports, the gateway's
per-task decision path). Every loop runs without the GIL."""
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memset

import numpy as np

from malcolm._core cimport (
    Estimator, Mpmc, Rng, Spsc, est_free, est_init, est_note_arrival, mc_aligned_alloc,
    mc_cpu_relax, mc_now_ns, mpmc_bytes, mpmc_init, mpmc_pop, mpmc_push, rng_seed,
    rng_uniform, spsc_bytes, spsc_init, spsc_pop, spsc_push,
)
from malcolm.net._wire cimport *
from malcolm.net.transport cimport BATCH, MsgBuf, Transport, addr_parse
from malcolm.policy.base cimport Policy


cdef extern from "bench/_floor.h" nogil:
    ctypedef struct mc_ring_hdr:
        pass
    ctypedef struct fl_refl:
        uint64_t count
        int64_t cpu_ns
        int64_t wall_ns
        int64_t busy_ns
    int fl_udp_pingpong(int n, int size, int64_t* rtt, double max_s, int block)
    int fl_shm_pingpong(int n, int size, int64_t* rtt, double max_s, int block)
    int fl_udp_reflect(double seconds, int size, fl_refl* out)
    int fl_shm_reflect(double seconds, int size, fl_refl* out)


def _kind(str kind):
    if kind not in ("udp", "shm"):
        raise ValueError(f"floor transport {kind!r} must be udp or shm")
    return kind == "udp"


def floor_pingpong(str kind, int n=20000, int size=64, double max_s=5.0, bint block=False):
    """Round-trip times (ns, numpy) of a plain-C ping-pong over ``udp`` or ``shm`` rings:
    ``n`` of them, or as many as fit in ``max_s`` seconds. The pinging side busy-polls; the
    answering side too, or with ``block`` it blocks (udp: in ``recv``; shm: on the ring's
    futex doorbell) like a server that sleeps when idle."""
    rtt = np.zeros(n, dtype=np.int64)
    cdef int64_t[::1] v = rtt
    cdef int rc
    cdef bint udp = _kind(kind)
    with nogil:
        if udp:
            rc = fl_udp_pingpong(n, size, &v[0], max_s, block)
        else:
            rc = fl_shm_pingpong(n, size, &v[0], max_s, block)
    if rc < 0:
        raise OSError(-rc, f"floor {kind} ping-pong failed")
    return rtt[:rc]


def floor_reflect(str kind, double seconds=1.0, int size=48):
    """A plain-C reflector flooded for ``seconds``: messages, its CPU and wall time (s), and
    its busy time (passes that moved messages, measured as the gateway measures its own)."""
    cdef fl_refl r
    cdef int rc
    cdef bint udp = _kind(kind)
    memset(&r, 0, sizeof(r))
    with nogil:
        if udp:
            rc = fl_udp_reflect(seconds, size, &r)
        else:
            rc = fl_shm_reflect(seconds, size, &r)
    if rc < 0:
        raise OSError(-rc, f"floor {kind} reflector failed")
    return {"count": r.count, "cpu_s": r.cpu_ns / 1e9, "wall_s": r.wall_ns / 1e9,
            "busy_s": r.busy_ns / 1e9}


# The benchmarks load unauthenticated servers: the all-zero MAC key (its cost is measured
# separately, ``mac_cost`` below).
cdef mc_sipkey _ZERO
_ZERO.k0 = 0
_ZERO.k1 = 0


cdef inline int _open_resp(MsgBuf* m, WireResp* r) noexcept nogil:
    cdef WireHdr h
    cdef uint64_t ep, aseq
    cdef int rc = wire_header(m.data, m.len, &h)
    if rc != K_RESPONSE:
        return -1
    rc = wire_open(m.data, m.len, &_ZERO, &ep, &aseq)
    if rc < 0:
        return rc
    return wire_get_resp(m.data, <uint32_t>rc, r)


cdef inline uint32_t _put_task(MsgBuf* b, uint64_t rid, int64_t now) noexcept nogil:
    cdef WireTask t
    t.client_id = 1
    t.task_type = 0
    t.payload_len = 0
    t.payload = NULL
    t.request_id = rid
    t.service_ns = 0
    t.send_ns = now
    t.budget_us = 0
    return wire_seal(b.data, wire_put_task(b.data, b.cap, &t), &_ZERO, 1, rid + 1)


def ping_server(Transport tr not None, server, int n=20000, int warm=1000,
                double max_s=5.0):
    """Round trips (ns) of one task at a time through a real server, busy-polling: ``n``
    of them (after ``warm``), or as many as fit in ``max_s`` seconds."""
    cdef NetAddr dst
    cdef MsgBuf* b
    cdef int i, j, k, got
    cdef int64_t t0
    cdef int64_t[::1] v
    cdef WireResp r
    cdef int64_t spins, deadline, warm_deadline
    cdef int done = 0
    addr_parse(tr.kind, server, &dst)
    rtt = np.zeros(n, dtype=np.int64)
    v = rtt
    with nogil:
        deadline = mc_now_ns() + <int64_t>(max_s * 1e9)
        warm_deadline = mc_now_ns() + <int64_t>(max_s * 0.2e9)
        i = -warm
        while i < n:
            t0 = mc_now_ns()
            if t0 > deadline:
                break
            if i < 0 and t0 > warm_deadline:
                i = 0
            b = tr.tx_next(&dst)
            b.len = _put_task(b, <uint64_t>(i + warm), t0)
            tr.tx_flush()
            got = 0
            spins = 0
            while not got:
                k = tr.rx_poll(BATCH)
                if k:
                    for j in range(k):
                        if (_open_resp(&tr.rx[j], &r) == 0
                                and r.request_id == <uint64_t>(i + warm)):
                            got = 1
                    tr.rx_release(k)
                else:
                    mc_cpu_relax()
                    spins += 1
                    if spins > 2_000_000_000:
                        break
            if i >= 0:
                v[i] = mc_now_ns() - t0
                done += 1
            i += 1
    return rtt[:done]


def flood_server(Transport tr not None, server, double seconds=1.0, int window=256):
    """Keep up to ``window`` tasks in flight at a server for ``seconds``. Tasks the transport
    reports it could not send free their place at once; over udp, where the kernel drops
    silently, the window is refilled after 50 ms without any response."""
    cdef NetAddr dst
    cdef MsgBuf* b
    cdef int k
    cdef int64_t now, end, last_rx
    cdef uint64_t sent = 0, recv = 0, failed0 = tr.n_send_failed
    cdef bint udp = tr.kind == "udp"
    addr_parse(tr.kind, server, &dst)
    with nogil:
        now = mc_now_ns()
        end = now + <int64_t>(seconds * 1e9)
        last_rx = now
        while now < end:
            if sent - recv < <uint64_t>window:
                k = 0
                while k < BATCH and sent - recv < <uint64_t>window:
                    b = tr.tx_next(&dst)
                    b.len = _put_task(b, sent, now)
                    sent += 1
                    k += 1
                tr.tx_flush()
                recv += tr.n_send_failed - failed0
                failed0 = tr.n_send_failed
            k = tr.rx_poll(BATCH)
            if k:
                recv += k
                tr.rx_release(k)
                last_rx = now
            elif udp and now - last_rx > 50_000_000:
                recv = sent          # lost in the kernel: refill the window
                last_rx = now
            now = mc_now_ns()
    return {"sent": sent}


# ---------------------------------------------------------------- the decision path

def decision_overhead(Policy pol not None, long long iters=1_000_000, int n_types=8):
    """ns per task of the gateway's per-task work besides I/O, and of its parts:
    a timestamp, the policy's ``decide_arrival``, and the enqueue (estimator arrival note +
    push on the central MPMC queue + the worker's pop)."""
    cdef Mpmc* q = <Mpmc*>mc_aligned_alloc(64, mpmc_bytes(1024))
    cdef Estimator est
    cdef long long i, _i
    cdef int64_t t0, t1, t2, t3, t4, now
    cdef uint64_t x, sink = 0
    if q == NULL or mpmc_init(q, 1024) != 0 or est_init(&est, 2, n_types, 0.01, 50000) != 0:
        free(q)
        raise MemoryError()
    try:
        with nogil:
            t0 = mc_now_ns()
            for _i in range(iters):
                sink += <uint64_t>mc_now_ns()
            t1 = mc_now_ns()
            for i in range(iters):
                sink += <uint64_t>pol.decide_arrival(<int64_t>i, <int>(i % n_types))
            t2 = mc_now_ns()
            for i in range(iters):
                est_note_arrival(&est, <int>(i % n_types))
                mpmc_push(q, <uint64_t>i)
                mpmc_pop(q, &x)
                sink += x
            t3 = mc_now_ns()
            for i in range(iters):
                now = mc_now_ns()
                if pol.decide_arrival(now, <int>(i % n_types)) == pol.me:
                    est_note_arrival(&est, <int>(i % n_types))
                    mpmc_push(q, <uint64_t>i)
                    mpmc_pop(q, &x)
                    sink += x
            t4 = mc_now_ns()
    finally:
        est_free(&est)
        free(q)
    cdef double it = <double>iters
    return {"timestamp_ns": (t1 - t0) / it, "decide_ns": (t2 - t1) / it,
            "enqueue_ns": (t3 - t2) / it, "total_ns": (t4 - t3) / it, "_sink": sink}


def decision_floor(long long iters=1_000_000, int n=4):
    """Plain-loop floor of the same path: a clock read, one xoshiro draw and a branch-free
    scan of an n-entry CDF, and an SPSC push+pop."""
    cdef Spsc* q = <Spsc*>mc_aligned_alloc(64, spsc_bytes(1024))
    cdef Rng rng
    cdef double cdf[64]
    cdef long long _i
    cdef int j, idx
    cdef double u
    cdef int64_t t0, t1
    cdef uint64_t x, sink = 0
    if q == NULL or spsc_init(q, 1024) != 0:
        free(q)
        raise MemoryError()
    for j in range(n):
        cdf[j] = (j + 1.0) / n
    rng_seed(&rng, 1, 1)
    with nogil:
        t0 = mc_now_ns()
        for _i in range(iters):
            sink += <uint64_t>mc_now_ns()
            u = rng_uniform(&rng)
            idx = 0
            for j in range(n):
                idx += u >= cdf[j]
            spsc_push(q, <uint64_t>idx)
            spsc_pop(q, &x)
            sink += x
        t1 = mc_now_ns()
    free(q)
    return {"total_ns": (t1 - t0) / <double>iters, "_sink": sink}


def mac_cost(int size, long long reps=200_000):
    """Best per-message ns of sealing (SipHash-2-4 MAC over ``size - 8`` bytes, the trailer
    written) and of opening (verifying) a ``size``-byte message, on this core, under a
    non-zero key: what authentication adds to each message the runtime sends and receives."""
    cdef uint8_t buf[MAX_MSG]
    cdef mc_sipkey k
    cdef long long i, _j
    cdef int64_t t0, t1, t2
    cdef uint64_t ep, aseq, sink = 0
    cdef uint32_t body
    if not HDR_LEN + AUTH_LEN <= size <= MAX_MSG or reps < 1:
        raise ValueError(f"size must be in {HDR_LEN + AUTH_LEN}..{MAX_MSG}")
    k.k0 = 0x0706050403020100
    k.k1 = 0x0f0e0d0c0b0a0908
    memset(buf, 0x5A, MAX_MSG)
    body = <uint32_t>(size - AUTH_LEN)
    with nogil:
        t0 = mc_now_ns()
        for i in range(reps):
            buf[9] = <uint8_t>i
            sink += wire_seal(buf, body, &k, 1, <uint64_t>i + 1)
        t1 = mc_now_ns()
        for _j in range(reps):
            sink += <uint64_t>wire_open(buf, <uint32_t>size, &k, &ep, &aseq)
        t2 = mc_now_ns()
    return {"size": size, "seal_ns": (t1 - t0) / <double>reps,
            "open_ns": (t2 - t1) / <double>reps, "check": int(sink & 1)}
