# cython: language_level=3
"""The native core: random numbers and the categorical policy distribution.

The ``cdef`` functions (declared in ``_core.pxd``) are what the gateway, workers, policy
thread and simulator use, without the GIL. The Python classes at the bottom wrap them for
configuration, tests and tools; they validate their arguments, the ``cdef`` functions do not.
The load estimator (``_estimator.pyx``) and the lock-free queues (``_lockfree.pyx``) are
modules of their own; ``_core.pxd`` re-exports their ``cdef`` API.
"""
from libc.math cimport isfinite
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


cdef inline double _exp_shifted(const double* f, double* e, int n) noexcept nogil:
    """e = exp(f - max f) over ``n`` entries; returns 1 / sum(e), the softmax's scale.
    Shifting by the max keeps every exponent <= 0 (no overflow)."""
    cdef int i
    cdef double m = f[0]
    cdef double z = 0.0
    for i in range(1, n):
        m = f[i] if f[i] > m else m
    for i in range(n):
        e[i] = mc_exp_nonpos(f[i] - m)
    for i in range(n):
        z += e[i]
    return 1.0 / z


cdef void softmax(const double* f, double* p, int n) noexcept nogil:
    cdef int i
    cdef double z = _exp_shifted(f, p, n)
    for i in range(n):
        p[i] *= z


cdef void softmax_cdf(const double* f, double* cdf, double* tmp, int n, int npad) noexcept nogil:
    """Softmax of the logits, accumulated into a CDF whose last entry is exactly 1.

    ``f`` and ``tmp`` have ``npad`` entries (padding logits -1e300 give exactly 0); only
    ``cdf[:n]`` is written, so the padding of a table (2.0) is left alone."""
    cdef int i
    cdef double z = _exp_shifted(f, tmp, npad)
    cdef double acc = 0.0
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


def now_ns():
    """CLOCK_MONOTONIC in ns (the runtime's clock)."""
    return mc_now_ns()
