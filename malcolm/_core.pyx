# cython: language_level=3
"""The native core: random numbers, the categorical policy distribution, the load estimator
and bounded lock-free queues.

The ``cdef`` functions (declared in ``_core.pxd``) are what the gateway, workers, policy
thread and simulator use, without the GIL. The Python classes at the bottom wrap them for
configuration, tests and tools; they validate their arguments, the ``cdef`` functions do not.
"""
from libc.math cimport isfinite, log
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

import numpy as np

cimport numpy as cnp

cnp.import_array()


# ---------------------------------------------------------------- random numbers

cdef inline uint64_t _splitmix64(uint64_t* x) noexcept nogil:
    x[0] += 0x9E3779B97F4A7C15ULL
    cdef uint64_t z = x[0]
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef void rng_seed(Rng* r, uint64_t seed, uint64_t stream) noexcept nogil:
    """Seed from (seed, stream) through splitmix64, so that every thread gets its own
    reproducible stream and no two streams start from related states."""
    cdef uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ULL)
    cdef int i
    for i in range(4):
        r.s[i] = _splitmix64(&x)
    if (r.s[0] | r.s[1] | r.s[2] | r.s[3]) == 0:
        r.s[0] = 1


cdef double rng_exponential(Rng* r, double mean) noexcept nogil:
    # 1 - u is in (0, 1], so the log is finite.
    return -mean * log(1.0 - rng_uniform(r))


# ---------------------------------------------------------------- categorical distribution

# Logit of a padding lane: far below anything real, yet finite so that f - max stays finite.
cdef double PAD_LOGIT = -1e300


cdef int cat_init(Categorical* c, int n_out, int n_in) noexcept nogil:
    """Allocate a distribution over ``n_out`` outcomes with ``n_in`` inputs. Starts with zero
    weights (uniform). Returns 0, or -1 when out of memory or sizes are out of range."""
    cdef int i, k, npad
    memset(c, 0, sizeof(Categorical))
    if n_out < 1 or n_out > MAX_OUT or n_in < 1 or n_in > MAX_IN:
        return -1
    npad = (n_out + 3) & ~3
    c.n_out = n_out
    c.n_in = n_in
    c.npad = npad
    c.W = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * npad * n_in)
    c.b = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * npad)
    c.x = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * n_in)
    c.f = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * npad)
    c.scratch = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * npad)
    c.tables = <CdfTable*>mc_aligned_alloc(CACHELINE, sizeof(CdfTable) * 2)
    if (c.W == NULL or c.b == NULL or c.x == NULL or c.f == NULL or c.scratch == NULL
            or c.tables == NULL):
        cat_free(c)
        return -1
    memset(c.W, 0, sizeof(double) * npad * n_in)
    memset(c.x, 0, sizeof(double) * n_in)
    memset(c.tables, 0, sizeof(CdfTable) * 2)
    for i in range(npad):
        c.b[i] = 0.0 if i < n_out else PAD_LOGIT
        c.f[i] = c.b[i]
    for k in range(2):
        c.tables[k].n = n_out
        c.tables[k].npad = npad
        for i in range(MAX_OUT):
            c.tables[k].cdf[i] = 2.0
    c.current = 0
    softmax_cdf(c.f, c.tables[0].cdf, c.scratch, n_out, npad)
    return 0


cdef void cat_free(Categorical* c) noexcept nogil:
    free(c.W)
    free(c.b)
    free(c.x)
    free(c.f)
    free(c.scratch)
    free(c.tables)
    c.W = c.b = c.x = c.f = c.scratch = NULL
    c.tables = NULL


cdef void cat_set_params(Categorical* c, const double* W, const double* b) noexcept nogil:
    """Copy new weights (column-major, column stride ``n_out``: the padding is added here)
    and biases, then recompute the logits."""
    cdef int j
    for j in range(c.n_in):
        memcpy(c.W + <Py_ssize_t>j * c.npad, W + <Py_ssize_t>j * c.n_out,
               sizeof(double) * c.n_out)
    memcpy(c.b, b, sizeof(double) * c.n_out)
    cat_recompute(c)


cdef void cat_set_inputs(Categorical* c, const double* x) noexcept nogil:
    memcpy(c.x, x, sizeof(double) * c.n_in)
    cat_recompute(c)


cdef void cat_recompute(Categorical* c) noexcept nogil:
    """Full recompute f = W x + b (column by column, so the inner loop is contiguous)."""
    cdef int i, j
    cdef int n = c.npad
    cdef double xj
    cdef const double* col
    cdef double* f = c.f
    for i in range(n):
        f[i] = c.b[i]
    for j in range(c.n_in):
        xj = c.x[j]
        col = c.W + <Py_ssize_t>j * n
        for i in range(n):
            f[i] += xj * col[i]


cdef void softmax(const double* f, double* p, int n) noexcept nogil:
    cdef int i
    cdef double m = f[0]
    cdef double z = 0.0
    for i in range(1, n):
        m = f[i] if f[i] > m else m
    for i in range(n):
        p[i] = mc_exp_nonpos(f[i] - m)
    for i in range(n):
        z += p[i]
    z = 1.0 / z
    for i in range(n):
        p[i] *= z


cdef void softmax_cdf(const double* f, double* cdf, double* tmp, int n, int npad) noexcept nogil:
    """Softmax of the logits, accumulated into a CDF whose last entry is exactly 1.

    ``f`` and ``tmp`` have ``npad`` entries (padding logits -1e300 give exactly 0); only
    ``cdf[:n]`` is written, so the padding of a table (2.0) is left alone."""
    cdef int i
    cdef double m = f[0]
    cdef double z = 0.0
    cdef double acc = 0.0
    for i in range(1, npad):
        m = f[i] if f[i] > m else m
    for i in range(npad):
        tmp[i] = mc_exp_nonpos(f[i] - m)
    for i in range(npad):
        z += tmp[i]
    z = 1.0 / z
    for i in range(n):
        acc += tmp[i] * z
        cdf[i] = acc
    cdf[n - 1] = 1.0


cdef inline void _publish_cdf(Categorical* c, const double* src_f,
                              const double* src_p) noexcept nogil:
    # Fill the half that readers are not using, under its seqlock, then flip `current`.
    # A reader that still holds the other half keeps a consistent table; a reader that
    # stalls across two publishes sees the sequence change and retries.
    cdef uint64_t gen = c.current
    cdef CdfTable* t = &c.tables[(gen + 1) & 1]
    cdef uint64_t s = t.seq
    cdef int i
    cdef double acc = 0.0
    mc_store_relaxed(&t.seq, s + 1)
    mc_fence_rel()
    if src_p == NULL:
        softmax_cdf(src_f, t.cdf, c.scratch, c.n_out, c.npad)
    else:
        for i in range(c.n_out):
            acc += src_p[i]
            t.cdf[i] = acc
        t.cdf[c.n_out - 1] = 1.0
    mc_store_rel(&t.seq, s + 2)
    mc_store_rel(&c.current, gen + 1)


cdef void cat_publish(Categorical* c) noexcept nogil:
    """End of window: softmax of the current logits becomes the live distribution."""
    _publish_cdf(c, c.f, NULL)


cdef void cat_publish_probs(Categorical* c, const double* p) noexcept nogil:
    """Publish explicit probabilities (they must be >= 0 and sum to 1)."""
    _publish_cdf(c, NULL, p)


cdef void cat_snapshot(Categorical* c, double* cdf_out) noexcept nogil:
    """Copy the live CDF, with the same consistency guarantee as ``cat_sample``."""
    cdef uint64_t s
    cdef CdfTable* t
    while True:
        t = cat_read_begin(c, &s)
        memcpy(cdf_out, t.cdf, sizeof(double) * c.n_out)
        if cat_read_valid(t, s):
            return


cdef void cat_probs(Categorical* c, double* p_out) noexcept nogil:
    """Probabilities of the live distribution (differences of its CDF)."""
    cdef int i
    cat_snapshot(c, p_out)
    for i in range(c.n_out - 1, 0, -1):
        p_out[i] -= p_out[i - 1]


# ---------------------------------------------------------------- load estimator

cdef int est_init(Estimator* e, int n_workers, int n_types, double alpha,
                  double prior_service_ns) noexcept nogil:
    memset(e, 0, sizeof(Estimator))
    if n_workers < 1 or n_types < 1 or not (0.0 < alpha <= 1.0) or not (prior_service_ns > 0):
        return -1
    e.n_workers = n_workers
    e.n_types = n_types
    # A whole number of cache lines per worker row, so workers never share a line.
    e.stride = ((n_types + 7) // 8) * 8
    e.alpha = alpha
    e.prior_rate = 1.0 / prior_service_ns
    e.ew = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * n_workers * e.stride)
    e.count = <uint64_t*>mc_aligned_alloc(CACHELINE, sizeof(uint64_t) * n_workers * e.stride)
    e.mix = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * e.stride)
    if e.ew == NULL or e.count == NULL or e.mix == NULL:
        est_free(e)
        return -1
    memset(e.ew, 0, sizeof(double) * n_workers * e.stride)
    memset(e.count, 0, sizeof(uint64_t) * n_workers * e.stride)
    memset(e.mix, 0, sizeof(double) * e.stride)
    return 0


cdef void est_free(Estimator* e) noexcept nogil:
    free(e.ew)
    free(e.count)
    free(e.mix)
    e.ew = NULL
    e.count = NULL
    e.mix = NULL


cdef int est_set_mode(Estimator* e, int mode) noexcept nogil:
    """Choose what the EWMA averages (before the first sample). Returns -1 if unknown.

    ``EST_MEAN`` (the default) averages service times and inverts the average. The thesis
    words it as an EWMA of inverse service times (``EST_INVERSE``), but that estimates
    E[1/S], which is not the rate 1/E[S] and is infinite for exponential service times: it is
    dominated by the shortest recent tasks and overstates the rate several times over."""
    if mode != EST_MEAN and mode != EST_INVERSE:
        return -1
    e.mode = mode
    return 0


cdef void est_observe(Estimator* e, int worker, int task_type, double service_ns) noexcept nogil:
    """Worker ``worker`` finished a task of ``task_type`` in ``service_ns``."""
    cdef Py_ssize_t k = <Py_ssize_t>worker * e.stride + task_type
    cdef double v
    mc_assert(0 <= worker < e.n_workers and 0 <= task_type < e.n_types)
    if service_ns < 1.0:
        service_ns = 1.0      # a zero-length task would make the rate infinite
    v = service_ns if e.mode == EST_MEAN else 1.0 / service_ns
    if e.count[k] == 0:
        mc_store_f64(&e.ew[k], v)   # the first sample replaces the prior outright
    else:
        mc_store_f64(&e.ew[k], e.ew[k] + e.alpha * (v - e.ew[k]))
    e.count[k] += 1


cdef void est_note_arrival(Estimator* e, int task_type) noexcept nogil:
    """The gateway accepted a task of ``task_type``: track the mix of types."""
    cdef int t
    for t in range(e.n_types):
        e.mix[t] += e.alpha * ((1.0 if t == task_type else 0.0) - e.mix[t])


cdef double _worker_type_rate(Estimator* e, int w, int t) noexcept nogil:
    cdef Py_ssize_t k = <Py_ssize_t>w * e.stride + t
    cdef double v = mc_load_f64(&e.ew[k])
    if v <= 0.0:
        return e.prior_rate
    return 1.0 / v if e.mode == EST_MEAN else v


cdef double est_worker_rate(Estimator* e, int worker) noexcept nogil:
    """Tasks per ns of one worker on the current type mix: 1 / sum_t share_t / rate_t.

    With several types, the expected service time of a random task is the mix-weighted mean
    of the per-type ones."""
    cdef int t
    cdef double z = 0.0
    cdef double s = 0.0
    cdef double m
    if e.n_types == 1:
        return _worker_type_rate(e, worker, 0)
    for t in range(e.n_types):
        m = mc_load_f64(&e.mix[t])
        z += m
        s += m / _worker_type_rate(e, worker, t)
    if z <= 0.0:
        return _worker_type_rate(e, worker, 0)
    return z / s


cdef double est_rate(Estimator* e) noexcept nogil:
    """Service rate of the server: the sum over its workers (tasks per ns)."""
    cdef int w
    cdef double r = 0.0
    for w in range(e.n_workers):
        r += est_worker_rate(e, w)
    return r


cdef double est_load(Estimator* e, double queue_len) noexcept nogil:
    """Load = queue length / service rate: the expected wait of the last task, in ns."""
    return queue_len / est_rate(e)


# ---------------------------------------------------------------- queues

cdef inline MpmcCell* _mpmc_cells(Mpmc* q) noexcept nogil:
    return <MpmcCell*>(<char*>q + sizeof(Mpmc))


cdef size_t mpmc_bytes(uint64_t capacity) noexcept nogil:
    return sizeof(Mpmc) + sizeof(MpmcCell) * capacity


cdef int mpmc_init(Mpmc* q, uint64_t capacity) noexcept nogil:
    """Initialise a queue in ``mpmc_bytes(capacity)`` bytes at ``q``. Capacity: power of 2 >= 2."""
    cdef uint64_t i
    cdef MpmcCell* cells = _mpmc_cells(q)
    if capacity < 2 or (capacity & (capacity - 1)) != 0:
        return -1
    memset(q, 0, sizeof(Mpmc))
    q.mask = capacity - 1
    q.capacity = capacity
    for i in range(capacity):
        cells[i].seq = i
        cells[i].value = 0
    mc_fence_seq()
    return 0


cdef bint mpmc_push(Mpmc* q, uint64_t v) noexcept nogil:
    """Vyukov's bounded MPMC enqueue. Returns False when full; never blocks."""
    cdef MpmcCell* cells = _mpmc_cells(q)
    cdef MpmcCell* cell
    cdef uint64_t pos = mc_load_relaxed(&q.enq)
    mc_assert(q.capacity >= 2 and q.mask == q.capacity - 1)
    cdef uint64_t seq
    cdef int64_t dif
    while True:
        cell = &cells[pos & q.mask]
        seq = mc_load_acq(&cell.seq)
        dif = <int64_t>(seq - pos)
        if dif == 0:
            if mc_cas(&q.enq, &pos, pos + 1):
                break
        elif dif < 0:
            return False
        else:
            pos = mc_load_relaxed(&q.enq)
    cell.value = v
    mc_store_rel(&cell.seq, pos + 1)
    return True


cdef bint mpmc_pop(Mpmc* q, uint64_t* out) noexcept nogil:
    """Dequeue the oldest item. Returns False when empty (or when the producer that claimed
    the next cell has not finished writing it yet); never blocks."""
    cdef MpmcCell* cells = _mpmc_cells(q)
    cdef MpmcCell* cell
    cdef uint64_t pos = mc_load_relaxed(&q.deq)
    cdef uint64_t seq
    cdef int64_t dif
    while True:
        cell = &cells[pos & q.mask]
        seq = mc_load_acq(&cell.seq)
        dif = <int64_t>(seq - (pos + 1))
        if dif == 0:
            if mc_cas(&q.deq, &pos, pos + 1):
                break
        elif dif < 0:
            return False
        else:
            pos = mc_load_relaxed(&q.deq)
    out[0] = cell.value
    mc_store_rel(&cell.seq, pos + q.mask + 1)
    return True


cdef uint64_t mpmc_size(Mpmc* q) noexcept nogil:
    """Approximate number of items (exact when the queue is quiescent)."""
    cdef uint64_t d = mc_load_acq(&q.deq)
    cdef uint64_t e = mc_load_acq(&q.enq)
    return e - d if e > d else 0


cdef inline uint64_t* _spsc_slots(Spsc* q) noexcept nogil:
    return <uint64_t*>(<char*>q + sizeof(Spsc))


cdef size_t spsc_bytes(uint64_t capacity) noexcept nogil:
    return sizeof(Spsc) + sizeof(uint64_t) * capacity


cdef int spsc_init(Spsc* q, uint64_t capacity) noexcept nogil:
    if capacity < 2 or (capacity & (capacity - 1)) != 0:
        return -1
    memset(q, 0, sizeof(Spsc))
    q.mask = capacity - 1
    q.capacity = capacity
    mc_fence_seq()
    return 0


cdef bint spsc_push(Spsc* q, uint64_t v) noexcept nogil:
    cdef uint64_t tail = q.tail
    if tail - q.head_cache >= q.capacity:
        # Re-read the consumer's cursor only when the cached copy says full: one shared
        # cache-line read per lap instead of one per push.
        q.head_cache = mc_load_acq(&q.head)
        if tail - q.head_cache >= q.capacity:
            return False
    _spsc_slots(q)[tail & q.mask] = v
    mc_store_rel(&q.tail, tail + 1)
    return True


cdef bint spsc_pop(Spsc* q, uint64_t* out) noexcept nogil:
    cdef uint64_t head = q.head
    if head >= q.tail_cache:
        q.tail_cache = mc_load_acq(&q.tail)
        if head >= q.tail_cache:
            return False
    out[0] = _spsc_slots(q)[head & q.mask]
    mc_store_rel(&q.head, head + 1)
    return True


cdef uint64_t spsc_size(Spsc* q) noexcept nogil:
    cdef uint64_t h = mc_load_acq(&q.head)
    cdef uint64_t t = mc_load_acq(&q.tail)
    return t - h if t > h else 0


# ================================================================ Python API

cdef object _as_f64(object a, str name, tuple shape):
    arr = np.ascontiguousarray(a, dtype=np.float64)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return arr


cdef class Generator:
    """A xoshiro256 generator (one per thread), reproducible from ``(seed, stream)``.

    Parameters
    ----------
    seed : int
        Seed shared by all streams of a run.
    stream : int
        Stream number; each thread or server uses its own.
    """
    cdef Rng _r

    def __init__(self, uint64_t seed=0, uint64_t stream=0):
        rng_seed(&self._r, seed, stream)

    def next_u64(self):
        """Next 64-bit output (xoshiro256**)."""
        return rng_next(&self._r)

    def uniform(self, Py_ssize_t size):
        """``size`` doubles uniform on [0, 1)."""
        cdef cnp.ndarray[cnp.float64_t, ndim=1] out = np.empty(size, dtype=np.float64)
        cdef double* p = <double*>out.data
        cdef Py_ssize_t i
        with nogil:
            for i in range(size):
                p[i] = rng_uniform(&self._r)
        return out

    def exponential(self, double mean, Py_ssize_t size):
        """``size`` exponential variates with the given mean."""
        cdef cnp.ndarray[cnp.float64_t, ndim=1] out = np.empty(size, dtype=np.float64)
        cdef double* p = <double*>out.data
        cdef Py_ssize_t i
        with nogil:
            for i in range(size):
                p[i] = rng_exponential(&self._r, mean)
        return out


cdef class Distribution:
    """Softmax policy distribution with logits ``f = W x + b`` over ``n_out`` outcomes.

    The distribution that ``sample`` draws from changes only at ``publish``; between
    publishes, ``update`` moves the logits incrementally (thesis eq. 6.1).

    Parameters
    ----------
    n_out : int
        Number of outcomes (1..64).
    n_in : int, optional
        Number of inputs; defaults to ``n_out`` (one load per server).
    seed, stream : int
        Seed of the generator that ``sample`` uses.
    """
    cdef Categorical c
    cdef Rng rng
    cdef bint ok

    def __cinit__(self, int n_out, n_in=None, uint64_t seed=0, uint64_t stream=0):
        cdef int ni = n_out if n_in is None else int(n_in)
        self.ok = False
        if not 1 <= n_out <= MAX_OUT:
            raise ValueError(f"n_out={n_out}: a categorical needs 1..{MAX_OUT} outcomes")
        if not 1 <= ni <= MAX_IN:
            raise ValueError(f"n_in={ni}: the logits take 1..{MAX_IN} inputs")
        if cat_init(&self.c, n_out, ni) != 0:
            raise MemoryError("cannot allocate the categorical distribution")
        rng_seed(&self.rng, seed, stream)
        self.ok = True

    def __dealloc__(self):
        if self.ok:
            cat_free(&self.c)

    @property
    def n_out(self):
        return self.c.n_out

    @property
    def n_in(self):
        return self.c.n_in

    def set_params(self, W, b):
        """Set weights ``W`` (shape ``(n_out, n_in)``) and biases ``b`` (``(n_out,)``);
        recomputes the logits. Does not publish."""
        Wa = _as_f64(W, "W", (self.c.n_out, self.c.n_in))
        ba = _as_f64(b, "b", (self.c.n_out,))
        cdef cnp.ndarray[cnp.float64_t, ndim=2] Wc = np.asfortranarray(Wa)
        cdef cnp.ndarray[cnp.float64_t, ndim=1] bc = ba
        cat_set_params(&self.c, <double*>Wc.data, <double*>bc.data)

    def set_inputs(self, x):
        """Set all inputs at once and recompute the logits."""
        cdef cnp.ndarray[cnp.float64_t, ndim=1] xa = _as_f64(x, "x", (self.c.n_in,))
        cat_set_inputs(&self.c, <double*>xa.data)

    def update(self, int j, double xj):
        """Input ``j`` changed to ``xj``: incremental O(n_out) update of the logits."""
        if not 0 <= j < self.c.n_in:
            raise IndexError(f"input index {j} out of range 0..{self.c.n_in - 1}")
        if not isfinite(xj):
            raise ValueError(f"input value {xj} is not finite")
        cat_update(&self.c, j, xj)

    def update_many(self, idx, values):
        """Apply many incremental updates in one native loop (for tests and benchmarks)."""
        cdef cnp.ndarray[cnp.int64_t, ndim=1] ia = np.ascontiguousarray(idx, dtype=np.int64)
        cdef cnp.ndarray[cnp.float64_t, ndim=1] va = np.ascontiguousarray(values,
                                                                          dtype=np.float64)
        cdef Py_ssize_t k, m = ia.shape[0]
        if va.shape[0] != m:
            raise ValueError("idx and values must have the same length")
        if m and (ia.min() < 0 or ia.max() >= self.c.n_in):
            raise IndexError(f"input indices must be in 0..{self.c.n_in - 1}")
        if not np.all(np.isfinite(va)):
            raise ValueError("values contain NaN or infinite values")
        with nogil:
            for k in range(m):
                cat_update(&self.c, <int>ia[k], va[k])

    def recompute(self):
        """Full recompute of the logits from W, x and b."""
        cat_recompute(&self.c)

    def publish(self):
        """Softmax of the current logits becomes the distribution that ``sample`` uses."""
        cat_publish(&self.c)

    def publish_probs(self, p):
        """Publish explicit probabilities (non-negative, summing to 1)."""
        cdef cnp.ndarray[cnp.float64_t, ndim=1] pa = _as_f64(p, "p", (self.c.n_out,))
        if np.any(pa < 0) or abs(pa.sum() - 1.0) > 1e-9:
            raise ValueError("probabilities must be non-negative and sum to 1")
        cat_publish_probs(&self.c, <double*>pa.data)

    def logits(self):
        return np.array(<double[:self.c.n_out]>self.c.f, copy=True)

    def inputs(self):
        return np.array(<double[:self.c.n_in]>self.c.x, copy=True)

    def probs(self):
        """Probabilities of the published distribution."""
        cdef cnp.ndarray[cnp.float64_t, ndim=1] p = np.empty(self.c.n_out)
        cat_probs(&self.c, <double*>p.data)
        return p

    def sample(self, Py_ssize_t size=1):
        """Draw ``size`` outcomes in one native loop; returns an int64 array."""
        cdef cnp.ndarray[cnp.int64_t, ndim=1] out = np.empty(size, dtype=np.int64)
        cdef cnp.int64_t* o = <cnp.int64_t*>out.data
        cdef Py_ssize_t i
        with nogil:
            for i in range(size):
                o[i] = cat_sample(&self.c, &self.rng)
        return out


cdef class LoadEstimator:
    """Service-rate and load estimator of one server (thesis §3.2 "Load estimation").

    Each worker keeps an EWMA of the inverse service time per task type; the server's service
    rate is the sum over workers, and its load is queue length / service rate (ns).

    Parameters
    ----------
    n_workers : int
    n_types : int
    alpha : float
        Weight of a new sample in the EWMA, in (0, 1].
    prior_service_ns : float
        Service time assumed for a worker and type before its first sample.
    mode : {"mean", "inverse"}
        ``"mean"`` (default): EWMA of service times, rate = 1 / EWMA. ``"inverse"``: EWMA of
        inverse service times read as the rate, as the thesis words it; biased (see
        ``est_set_mode``), kept for comparison.
    """
    cdef Estimator e
    cdef bint ok

    def __cinit__(self, int n_workers, int n_types=1, double alpha=0.01,
                  double prior_service_ns=50_000.0, str mode="mean"):
        self.ok = False
        if n_workers < 1:
            raise ValueError(f"n_workers={n_workers}: a server needs at least one worker")
        if n_types < 1:
            raise ValueError(f"n_types={n_types}: there is at least one task type")
        if not (0.0 < alpha <= 1.0):
            raise ValueError(f"alpha={alpha} must be in (0, 1]")
        if not (prior_service_ns > 0 and isfinite(prior_service_ns)):
            raise ValueError(f"prior_service_ns={prior_service_ns} must be positive")
        if mode not in ("mean", "inverse"):
            raise ValueError(f"mode={mode!r} must be 'mean' or 'inverse'")
        if est_init(&self.e, n_workers, n_types, alpha, prior_service_ns) != 0:
            raise MemoryError("cannot allocate the estimator")
        self.ok = True
        est_set_mode(&self.e, EST_MEAN if mode == "mean" else EST_INVERSE)

    def __dealloc__(self):
        if self.ok:
            est_free(&self.e)

    def observe(self, int worker, int task_type, double service_ns):
        """Record one completed task."""
        self._check(worker, task_type)
        if not (service_ns >= 0 and isfinite(service_ns)):
            raise ValueError(f"service time {service_ns} must be finite and >= 0")
        est_observe(&self.e, worker, task_type, service_ns)

    def observe_many(self, workers, types, service_ns):
        """Record many completions in one native loop."""
        cdef cnp.ndarray[cnp.int64_t, ndim=1] w = np.ascontiguousarray(workers, dtype=np.int64)
        cdef cnp.ndarray[cnp.int64_t, ndim=1] t = np.ascontiguousarray(types, dtype=np.int64)
        cdef cnp.ndarray[cnp.float64_t, ndim=1] s = np.ascontiguousarray(service_ns,
                                                                         dtype=np.float64)
        cdef Py_ssize_t k, m = w.shape[0]
        if t.shape[0] != m or s.shape[0] != m:
            raise ValueError("workers, types and service_ns must have the same length")
        if m:
            if w.min() < 0 or w.max() >= self.e.n_workers:
                raise IndexError(f"worker indices must be in 0..{self.e.n_workers - 1}")
            if t.min() < 0 or t.max() >= self.e.n_types:
                raise IndexError(f"task types must be in 0..{self.e.n_types - 1}")
            if not (np.all(np.isfinite(s)) and np.all(s >= 0)):
                raise ValueError("service times must be finite and >= 0")
        with nogil:
            for k in range(m):
                est_observe(&self.e, <int>w[k], <int>t[k], s[k])

    def note_arrival(self, int task_type):
        """Record the type of an accepted task (tracks the type mix)."""
        self._check(0, task_type)
        est_note_arrival(&self.e, task_type)

    def worker_rate(self, int worker):
        self._check(worker, 0)
        return est_worker_rate(&self.e, worker)

    def rate(self):
        """Service rate of the server in tasks per ns."""
        return est_rate(&self.e)

    def load(self, double queue_len):
        """Expected wait of the last queued task, in ns."""
        return est_load(&self.e, queue_len)

    def ewma(self):
        """The EWMA per worker and type, shape (n_workers, n_types): of service times (ns)
        in ``"mean"`` mode, of their inverses in ``"inverse"`` mode; 0 where nothing was seen."""
        a = np.array(<double[:self.e.n_workers * self.e.stride]>self.e.ew, copy=True)
        return a.reshape(self.e.n_workers, self.e.stride)[:, :self.e.n_types].copy()

    def type_mix(self):
        return np.array(<double[:self.e.n_types]>self.e.mix, copy=True)

    def _check(self, int worker, int task_type):
        if not 0 <= worker < self.e.n_workers:
            raise IndexError(f"worker {worker} out of range 0..{self.e.n_workers - 1}")
        if not 0 <= task_type < self.e.n_types:
            raise IndexError(f"task type {task_type} out of range 0..{self.e.n_types - 1}")


cdef object _check_capacity(uint64_t capacity):
    if capacity < 2 or (capacity & (capacity - 1)) != 0:
        raise ValueError(f"capacity={capacity} must be a power of two >= 2")


cdef class MPMCQueue:
    """Bounded lock-free multi-producer multi-consumer FIFO of 64-bit items.

    ``push`` returns False when full and ``pop`` returns None when empty; neither blocks.
    """
    cdef Mpmc* q

    def __cinit__(self, uint64_t capacity):
        _check_capacity(capacity)
        self.q = <Mpmc*>mc_aligned_alloc(CACHELINE, mpmc_bytes(capacity))
        if self.q == NULL:
            raise MemoryError("cannot allocate the queue")
        mpmc_init(self.q, capacity)

    def __dealloc__(self):
        free(self.q)

    @property
    def capacity(self):
        return self.q.capacity

    def push(self, uint64_t v):
        return mpmc_push(self.q, v)

    def pop(self):
        cdef uint64_t v
        return v if mpmc_pop(self.q, &v) else None

    def __len__(self):
        return mpmc_size(self.q)

    cdef Mpmc* ptr(self):
        return self.q


cdef class SPSCQueue:
    """Bounded lock-free single-producer single-consumer FIFO of 64-bit items."""
    cdef Spsc* q

    def __cinit__(self, uint64_t capacity):
        _check_capacity(capacity)
        self.q = <Spsc*>mc_aligned_alloc(CACHELINE, spsc_bytes(capacity))
        if self.q == NULL:
            raise MemoryError("cannot allocate the queue")
        spsc_init(self.q, capacity)

    def __dealloc__(self):
        free(self.q)

    @property
    def capacity(self):
        return self.q.capacity

    def push(self, uint64_t v):
        return spsc_push(self.q, v)

    def pop(self):
        cdef uint64_t v
        return v if spsc_pop(self.q, &v) else None

    def __len__(self):
        return spsc_size(self.q)


def now_ns():
    """CLOCK_MONOTONIC in ns (the runtime's clock)."""
    return mc_now_ns()
