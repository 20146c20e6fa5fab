# cython: language_level=3
"""Microbenchmarks of the native core, each timed inside a native loop.

Method (the same as ``shared/tools/floor.c``, so the two compare): run the loop ``iters``
times, take the best of 7 repetitions, and report ns per operation.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free

from malcolm._core cimport (
    Categorical, Estimator, Mpmc, Rng, cat_free, cat_init, cat_publish, cat_recompute,
    cat_sample, cat_update, est_free, est_init, est_observe, mc_aligned_alloc, mc_now_ns,
    mpmc_bytes, mpmc_init, mpmc_pop, mpmc_push, rng_seed, Spsc, spsc_bytes, spsc_init,
    spsc_pop, spsc_push,
)

cdef volatile double _sink_f = 0.0
cdef volatile uint64_t _sink_u = 0


cdef double _bench_sample(Categorical* c, Rng* r, long iters) noexcept nogil:
    # The generator lives in a local, as it does in the gateway's poll loop: the seqlock's
    # compiler barriers would otherwise force its state through memory on every draw.
    cdef Rng lr = r[0]
    cdef long _k
    cdef uint64_t acc = 0
    cdef int64_t t0 = mc_now_ns()
    for _k in range(iters):
        acc += cat_sample(c, &lr)
    cdef int64_t t1 = mc_now_ns()
    global _sink_u
    _sink_u = acc
    r[0] = lr
    return <double>(t1 - t0) / iters


cdef double _bench_incremental(Categorical* c, long iters) noexcept nogil:
    cdef long k
    cdef int mask = c.n_in - 1
    cdef int64_t t0 = mc_now_ns()
    for k in range(iters):
        cat_update(c, <int>(k & mask), 1e-6 * (k & 7))
    cdef int64_t t1 = mc_now_ns()
    global _sink_f
    _sink_f = c.f[0]
    return <double>(t1 - t0) / iters


cdef double _bench_rebuild(Categorical* c, long iters) noexcept nogil:
    cdef long k
    cdef int mask = c.n_out - 1
    cdef int64_t t0 = mc_now_ns()
    for k in range(iters):
        c.f[k & mask] += 1e-9
        cat_publish(c)
    cdef int64_t t1 = mc_now_ns()
    global _sink_f
    _sink_f = c.tables[0].cdf[0]
    return <double>(t1 - t0) / iters


cdef double _bench_mpmc(Mpmc* q, long iters) noexcept nogil:
    cdef long k
    cdef uint64_t v, acc = 0
    cdef int64_t t0 = mc_now_ns()
    for k in range(iters):
        mpmc_push(q, <uint64_t>k)
        mpmc_pop(q, &v)
        acc += v
    cdef int64_t t1 = mc_now_ns()
    global _sink_u
    _sink_u = acc
    return <double>(t1 - t0) / iters


cdef double _bench_spsc(Spsc* q, long iters) noexcept nogil:
    cdef long k
    cdef uint64_t v, acc = 0
    cdef int64_t t0 = mc_now_ns()
    for k in range(iters):
        spsc_push(q, <uint64_t>k)
        spsc_pop(q, &v)
        acc += v
    cdef int64_t t1 = mc_now_ns()
    global _sink_u
    _sink_u = acc
    return <double>(t1 - t0) / iters


cdef double _bench_estimator(Estimator* e, long iters) noexcept nogil:
    # What a worker does after each task: est_observe on its own row (one type here), with
    # service times that vary so that nothing is folded away
    cdef long k
    cdef int mask = e.n_workers - 1
    cdef int64_t t0 = mc_now_ns()
    for k in range(iters):
        est_observe(e, <int>(k & mask), 0, 40_000.0 + <double>(k & 1023) * 20.0)
    cdef int64_t t1 = mc_now_ns()
    global _sink_f
    _sink_f = e.ew[0]
    return <double>(t1 - t0) / iters


cdef int _setup(Categorical* c, int n) except -1:
    cdef int i
    if cat_init(c, n, n) != 0:
        raise MemoryError
    for i in range(n * n):
        c.W[i] = 1e-3 * i
    for i in range(n):
        c.b[i] = 0.01 * i
        c.x[i] = 0.0
    cat_recompute(c)
    cat_publish(c)
    return 0


def core(sizes=(4, 8, 16, 32), long iters=2_000_000, long rebuild_iters=500_000,
         int repeats=7):
    """Run every core microbenchmark; returns a flat dict of ns per operation (the best of
    ``repeats`` runs of ``single``).

    Keys: ``sample_ns.N``, ``incremental_ns.N``, ``rebuild_ns.N`` for each N in ``sizes``,
    and ``queue_pushpop_ns`` (MPMC push + pop, one thread), ``spsc_pushpop_ns``,
    ``estimator_observe_ns`` (one completion recorded by the load estimator).
    """
    out = {}
    for n in sizes:
        for op in ("sample", "incremental", "rebuild"):
            it = rebuild_iters if op == "rebuild" else iters
            out[f"{op}_ns.{n}"] = min(single(op, n, it) for _ in range(repeats))
    out["queue_pushpop_ns"] = min(single("mpmc", 0, iters) for _ in range(repeats))
    out["spsc_pushpop_ns"] = min(single("spsc", 0, iters) for _ in range(repeats))
    out["estimator_observe_ns"] = min(single("estimator", 4, iters) for _ in range(repeats))
    return out


def single(str op, int n=8, long iters=200_000):
    """Run one benchmark loop once; returns ns per operation. ``op`` is one of ``sample``,
    ``incremental``, ``rebuild``, ``mpmc``, ``spsc`` or ``estimator`` (``n`` workers)."""
    cdef Categorical c
    cdef Rng r
    cdef Mpmc* q
    cdef Spsc* s
    cdef Estimator e
    cdef double v
    cdef int which = {"sample": 0, "incremental": 1, "rebuild": 2}.get(op, -1)
    rng_seed(&r, 1, 0)
    if which >= 0:
        if n < 1 or n > 64 or n & (n - 1):
            raise ValueError("n must be a power of two in 1..64")
        _setup(&c, n)
        with nogil:
            if which == 0:
                v = _bench_sample(&c, &r, iters)
            elif which == 1:
                v = _bench_incremental(&c, iters)
            else:
                v = _bench_rebuild(&c, iters)
        cat_free(&c)
    elif op == "mpmc":
        q = <Mpmc*>mc_aligned_alloc(64, mpmc_bytes(1024))
        mpmc_init(q, 1024)
        with nogil:
            v = _bench_mpmc(q, iters)
        free(q)
    elif op == "spsc":
        s = <Spsc*>mc_aligned_alloc(64, spsc_bytes(1024))
        spsc_init(s, 1024)
        with nogil:
            v = _bench_spsc(s, iters)
        free(s)
    elif op == "estimator":
        if n < 1 or n > 64 or n & (n - 1):
            raise ValueError("n must be a power of two in 1..64")
        if est_init(&e, n, 1, 0.05, 50_000.0) != 0:
            raise MemoryError
        with nogil:
            v = _bench_estimator(&e, iters)
        est_free(&e)
    else:
        raise ValueError(f"unknown benchmark {op!r}")
    return v
