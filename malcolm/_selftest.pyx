# cython: language_level=3
"""Native multi-threaded stress tests of the core, driven from the test suite.

They run on real pthreads without the GIL, the way the gateway, workers and policy thread
use the core. Every loop has a deadline, so a bug shows up as a failed check, not a hang.
"""
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

from malcolm._core cimport (
    Categorical, Mpmc, Rng, Spsc, cat_free, cat_init, cat_publish_probs, cat_sample,
    cat_snapshot, mc_aligned_alloc, mc_cpu_relax, mc_fetch_add, mc_load_acq, mc_now_ns,
    mc_store_rel, mpmc_bytes, mpmc_init, mpmc_pop, mpmc_push, rng_seed, rng_uniform,
    spsc_bytes, spsc_init, spsc_pop, spsc_push,
)
from malcolm._system cimport nanosleep, pthread_create, pthread_join, pthread_t, timespec


ctypedef struct QueueJob:
    int kind                    # 0 = MPMC, 1 = SPSC
    Mpmc* mq
    Spsc* sq
    int role                    # 0 = producer, 1 = consumer
    uint64_t first, count       # producer: items [first, first + count)
    uint64_t* seen              # consumer: delivery count per item
    uint64_t* consumed          # shared total of items consumed
    uint64_t total
    uint64_t order_errors       # SPSC consumer: items out of order
    int64_t deadline_ns
    int timed_out


cdef inline void _back_off(int* spins) noexcept nogil:
    # Spin, then sleep 20 µs every 64 failed tries. With more threads than cores (8 on
    # CI's 2) a thread preempted between claiming a slot and publishing it stalls every
    # other thread on that slot; spinning (or sched_yield, which CFS barely honours) then
    # burns whole time slices while the holder waits for a core, and a loaded machine ran
    # past the deadline (timed_out) with the queue correct. A sleeping thread leaves the
    # run queue, so the holder gets the core.
    cdef timespec ts
    mc_cpu_relax()
    spins[0] += 1
    if (spins[0] & 63) == 0:
        ts.tv_sec = 0
        ts.tv_nsec = 20_000
        nanosleep(&ts, NULL)


cdef void* _queue_worker(void* arg) noexcept nogil:
    cdef QueueJob* j = <QueueJob*>arg
    cdef uint64_t i, v, last = 0
    cdef bint ok
    cdef int spins = 0
    if j.role == 0:
        i = 0
        while i < j.count:
            if j.kind == 0:
                ok = mpmc_push(j.mq, j.first + i)
            else:
                ok = spsc_push(j.sq, j.first + i)
            if ok:
                i += 1
            else:
                _back_off(&spins)
                if (spins & 1023) == 0 and mc_now_ns() > j.deadline_ns:
                    j.timed_out = 1
                    return NULL
    else:
        while mc_load_acq(j.consumed) < j.total:
            if j.kind == 0:
                ok = mpmc_pop(j.mq, &v)
            else:
                ok = spsc_pop(j.sq, &v)
            if ok:
                if v < j.total:
                    mc_fetch_add(&j.seen[v], 1)
                if j.kind == 1:
                    if v != last:
                        j.order_errors += 1
                    last = v + 1
                mc_fetch_add(j.consumed, 1)
            else:
                _back_off(&spins)
                if (spins & 1023) == 0 and mc_now_ns() > j.deadline_ns:
                    j.timed_out = 1
                    return NULL
    return NULL


def queue_stress(str kind, int producers, int consumers, uint64_t items_per_producer,
                 uint64_t capacity=1024, double timeout_s=20.0):
    """Push distinct items from ``producers`` threads and pop them from ``consumers`` threads.

    Returns a dict: ``missing`` and ``duplicated`` item counts, ``order_errors`` (SPSC only),
    ``timed_out`` threads, ``delivered``.
    """
    if kind not in ("mpmc", "spsc"):
        raise ValueError("kind must be 'mpmc' or 'spsc'")
    if kind == "spsc" and (producers != 1 or consumers != 1):
        raise ValueError("an SPSC queue has exactly one producer and one consumer")
    cdef int nthreads = producers + consumers
    cdef uint64_t total = producers * items_per_producer
    cdef QueueJob* jobs = <QueueJob*>calloc(nthreads, sizeof(QueueJob))
    cdef pthread_t* tids = <pthread_t*>calloc(nthreads, sizeof(pthread_t))
    cdef uint64_t* seen = <uint64_t*>calloc(total + 1, sizeof(uint64_t))
    cdef uint64_t consumed = 0
    cdef Mpmc* mq = NULL
    cdef Spsc* sq = NULL
    cdef int k
    cdef int64_t deadline = mc_now_ns() + <int64_t>(timeout_s * 1e9)
    if kind == "mpmc":
        mq = <Mpmc*>mc_aligned_alloc(64, mpmc_bytes(capacity))
        mpmc_init(mq, capacity)
    else:
        sq = <Spsc*>mc_aligned_alloc(64, spsc_bytes(capacity))
        spsc_init(sq, capacity)
    for k in range(nthreads):
        jobs[k].kind = 0 if mq != NULL else 1
        jobs[k].mq = mq
        jobs[k].sq = sq
        jobs[k].role = 0 if k < producers else 1
        jobs[k].first = k * items_per_producer
        jobs[k].count = items_per_producer
        jobs[k].seen = seen
        jobs[k].consumed = &consumed
        jobs[k].total = total
        jobs[k].deadline_ns = deadline
    with nogil:
        for k in range(nthreads):
            pthread_create(&tids[k], NULL, _queue_worker, &jobs[k])
        for k in range(nthreads):
            pthread_join(tids[k], NULL)
    missing = sum(1 for i in range(total) if seen[i] == 0)
    duplicated = sum(1 for i in range(total) if seen[i] > 1)
    result = dict(missing=missing, duplicated=duplicated, delivered=consumed,
                  order_errors=sum(jobs[k].order_errors for k in range(nthreads)),
                  timed_out=sum(jobs[k].timed_out for k in range(nthreads)))
    free(jobs)
    free(tids)
    free(seen)
    free(mq)
    free(sq)
    return result


ctypedef struct DistJob:
    Categorical* c
    int role                    # 0 = writer, 1 = sampling reader, 2 = snapshot reader
    int unsafe                  # writer: write the live table in place, no seqlock
    uint64_t iterations
    uint64_t* stop
    uint64_t torn
    uint64_t reads
    uint64_t seed


cdef void* _dist_worker(void* arg) noexcept nogil:
    # Writer alternates between all mass on outcome 0 and all mass on outcome n-1.
    # Any other sampled index, or a CDF that is neither of the two, is a torn read.
    cdef DistJob* j = <DistJob*>arg
    cdef Categorical* c = j.c
    cdef int n = c.n_out
    cdef double pa[64]
    cdef double pb[64]
    cdef double cdf[64]
    cdef uint64_t it
    cdef int i, idx
    cdef bint is_a, is_b
    cdef Rng r
    rng_seed(&r, j.seed, 7)
    memset(pa, 0, sizeof(pa))
    memset(pb, 0, sizeof(pb))
    pa[0] = 1.0
    pb[n - 1] = 1.0
    if j.role == 0:
        for it in range(j.iterations):
            if j.unsafe:
                # Control: overwrite the live half in place, so readers can see a mix.
                for i in range(n - 1):
                    c.tables[c.current & 1].cdf[i] = 1.0 if (it & 1) == 0 else 0.0
            else:
                if (it & 1) == 0:
                    cat_publish_probs(c, pa)
                else:
                    cat_publish_probs(c, pb)
        mc_store_rel(j.stop, 1)
    elif j.role == 1:
        while mc_load_acq(j.stop) == 0:
            if j.unsafe:
                idx = 0
                for i in range(n - 1):
                    idx += rng_uniform(&r) * 0.0 + 0.5 >= c.tables[c.current & 1].cdf[i]
            else:
                idx = cat_sample(c, &r)
            j.reads += 1
            if idx != 0 and idx != n - 1:
                j.torn += 1
    else:
        while mc_load_acq(j.stop) == 0:
            cat_snapshot(c, cdf)
            j.reads += 1
            is_a = True
            is_b = True
            for i in range(n - 1):
                is_a = is_a and cdf[i] == 1.0
                is_b = is_b and cdf[i] == 0.0
            if not (is_a or is_b) or cdf[n - 1] != 1.0:
                j.torn += 1
    return NULL


def publish_stress(int n, int samplers, int snapshotters, uint64_t publishes,
                   bint unsafe=False):
    """One writer publishes ``publishes`` alternating distributions while reader threads sample.

    Returns ``(torn, reads)``. With ``unsafe=True`` the writer bypasses the double buffer and
    seqlock (a control that shows the check can detect tearing)."""
    if not 3 <= n <= 64:
        raise ValueError("n must be in 3..64 so that torn reads are observable")
    cdef Categorical c
    cdef int nthreads = 1 + samplers + snapshotters
    cdef DistJob* jobs = <DistJob*>calloc(nthreads, sizeof(DistJob))
    cdef pthread_t* tids = <pthread_t*>calloc(nthreads, sizeof(pthread_t))
    cdef uint64_t stop = 0
    cdef int k
    cat_init(&c, n, 1)
    cdef double p0[64]
    memset(p0, 0, sizeof(p0))
    p0[0] = 1.0
    cat_publish_probs(&c, p0)
    for k in range(nthreads):
        jobs[k].c = &c
        jobs[k].role = 0 if k == 0 else (1 if k <= samplers else 2)
        jobs[k].unsafe = unsafe
        jobs[k].iterations = publishes
        jobs[k].stop = &stop
        jobs[k].seed = k
    with nogil:
        # Readers first, so they are running when the writer starts.
        for k in range(nthreads - 1, -1, -1):
            pthread_create(&tids[k], NULL, _dist_worker, &jobs[k])
        for k in range(nthreads):
            pthread_join(tids[k], NULL)
    torn = sum(jobs[k].torn for k in range(1, nthreads))
    reads = sum(jobs[k].reads for k in range(1, nthreads))
    free(jobs)
    free(tids)
    cat_free(&c)
    return torn, reads
