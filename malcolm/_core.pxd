# cython: language_level=3
"""cimport API of the native core.

Everything here is ``noexcept nogil`` and works on plain C memory, so the gateway, the
workers, the policy thread and the simulator can call it without the GIL. The hottest
functions (PRNG, sampling, the incremental logit update) are ``inline`` in this file so that
they inline into the modules that cimport them.

Threading contract
------------------
* ``Rng``: one state per thread.
* ``Categorical``: one writer (the policy thread calls update/recompute/publish), any number of
  concurrent readers (``cat_sample``/``cat_snapshot``). Readers only ever see a whole
  published table: a double buffer whose halves carry a seqlock.
* ``Estimator`` (``_estimator.pxd``): worker ``w`` is the only writer of row ``w``;
  ``est_note_arrival`` has a single writer (the gateway); anyone may read.
* ``Mpmc`` (``_lockfree.pxd``): any number of producers and consumers. ``Spsc``: one of each.
"""
from libc.math cimport log
from libc.stdint cimport int32_t, int64_t, uint64_t

# The core's API is also the home of what it builds on (one cimport for its users): the
# native helpers, the load estimator and the lock-free queues, each defined in its module.
from malcolm._native cimport (
    CACHELINE, mc_load_acq, mc_load_relaxed, mc_store_rel, mc_store_relaxed, mc_cas, mc_fetch_add,
    mc_mulhi, mc_fence_acq, mc_fence_rel, mc_fence_seq, mc_load_f64, mc_store_f64, mc_cpu_relax,
    mc_rdtsc, mc_now_ns, mc_aligned_alloc, mc_exp_nonpos, mc_assert, mc_axpy,
)
from malcolm._estimator cimport (
    EST_INVERSE, EST_MEAN, Estimator, est_free, est_init, est_load, est_note_arrival,
    est_observe, est_rate, est_set_mode, est_totals, est_worker_rate,
)
from malcolm._lockfree cimport (
    Mpmc, MpmcCell, Spsc, mpmc_bytes, mpmc_init, mpmc_pop, mpmc_push, mpmc_size, spsc_bytes,
    spsc_init, spsc_pop, spsc_push, spsc_size,
)


cdef enum:
    MAX_OUT = 64       # outcomes of a categorical distribution (servers in a rack)
    MAX_IN = 256       # inputs (features) of its logits


# ---------------------------------------------------------------- random numbers
ctypedef struct Rng:
    uint64_t s[4]


cdef void rng_seed(Rng* r, uint64_t seed, uint64_t stream) noexcept nogil


cdef inline uint64_t _rotl(uint64_t x, int k) noexcept nogil:
    return (x << k) | (x >> (64 - k))


cdef inline void _rng_advance(Rng* r) noexcept nogil:
    cdef uint64_t t = r.s[1] << 17
    r.s[2] ^= r.s[0]
    r.s[3] ^= r.s[1]
    r.s[1] ^= r.s[2]
    r.s[0] ^= r.s[3]
    r.s[2] ^= t
    r.s[3] = _rotl(r.s[3], 45)


cdef inline uint64_t rng_next(Rng* r) noexcept nogil:
    """xoshiro256**: 64 good bits."""
    cdef uint64_t out = _rotl(r.s[1] * 5, 7) * 9
    _rng_advance(r)
    return out


cdef inline double rng_uniform(Rng* r) noexcept nogil:
    """Uniform on [0, 1) from the xoshiro256+ output (its top 53 bits are the good ones)."""
    cdef uint64_t out = r.s[0] + r.s[3]
    _rng_advance(r)
    return <double>(out >> 11) * (1.0 / 9007199254740992.0)


cdef inline uint64_t rng_below(Rng* r, uint64_t n) noexcept nogil:
    """Uniform integer in [0, n) by Lemire's multiply-shift (bias < n / 2**64)."""
    return mc_mulhi(rng_next(r), n)


cdef inline double rng_exponential(Rng* r, double mean) noexcept nogil:
    """Exponential with the given mean. 1 - u is in (0, 1], so the log is finite. Inline:
    the simulator, the workload sampler and the load generator draw one per task."""
    return -mean * log(1.0 - rng_uniform(r))


# ---------------------------------------------------------------- categorical distribution
ctypedef struct CdfTable:
    # The header fills one cache line so that cdf starts on one: the scan's vector loads then
    # never straddle two lines.
    uint64_t seq                # seqlock: odd while the writer is filling this half
    int32_t n
    int32_t npad                # n rounded up to a multiple of 4
    uint64_t _pad[6]
    double cdf[MAX_OUT]         # cdf[n-1] == 1.0 exactly; cdf[n:npad] == 2.0 (never drawn)


ctypedef struct Categorical:
    # Outcome vectors are padded to npad (a multiple of 4) so that every loop runs in whole
    # SIMD blocks with no scalar tail; padding lanes have weight 0 and bias/logit -1e300, so
    # they get probability exactly 0.
    int32_t n_out
    int32_t n_in
    int32_t npad                # n_out rounded up to a multiple of 4: the column stride of W
    int32_t _pad
    double* W                   # column-major npad x n_in: column j is W[j*npad : j*npad+n_out]
    double* b                   # npad
    double* x                   # n_in, the inputs the logits currently reflect
    double* f                   # npad, logits f = W x + b
    double* scratch             # npad
    CdfTable* tables            # two halves, each on its own cache lines
    uint64_t current            # publish generation; tables[current & 1] is the live half


cdef int cat_init(Categorical* c, int n_out, int n_in) noexcept nogil
cdef void cat_free(Categorical* c) noexcept nogil
cdef void cat_set_params(Categorical* c, const double* W, const double* b) noexcept nogil
cdef void cat_set_inputs(Categorical* c, const double* x) noexcept nogil
cdef void cat_recompute(Categorical* c) noexcept nogil
cdef void cat_publish(Categorical* c) noexcept nogil
cdef void cat_publish_probs(Categorical* c, const double* p) noexcept nogil
cdef void cat_snapshot(Categorical* c, double* cdf_out) noexcept nogil
cdef void cat_probs(Categorical* c, double* p_out) noexcept nogil
cdef void softmax(const double* f, double* p, int n) noexcept nogil
cdef void softmax_cdf(const double* f, double* cdf, double* tmp, int n, int npad) noexcept nogil


cdef inline void cat_update(Categorical* c, int j, double xj) noexcept nogil:
    """Thesis eq. 6.1: input j changed, so f += (xj - x_j) * col_j(W). O(n_out)."""
    mc_assert(0 <= j < c.n_in)
    cdef double dx = xj - c.x[j]
    c.x[j] = xj
    mc_axpy(c.f, c.W + <Py_ssize_t>j * c.npad, dx, c.npad)


cdef inline int cdf_search(const double* cdf, int npad, double u) noexcept nogil:
    """Branch-free scan: the number of CDF entries <= u, for u in [0, 1). The last real
    entry is 1.0 and the padding is 2.0, so neither is ever counted. The 64-bit counter
    matches the width of the double compares, which lets the loop vectorize cleanly.

    Beyond 32 entries a branch-free binary search gives the same count (the entries do not
    decrease, so ``cdf[i] <= u`` holds for a prefix): six halvings and a compare at 64
    servers, where the scan took 5 instructions an entry (320 a draw; the search saves 2.5%
    of a simulated 64-server rack's event loop, and a 64-way sample took 11 ns against 32).
    At 32 entries and below, where every rack of the micro-benchmarks and of the thesis's
    figures lies, the scan is kept: its independent compares beat the search's chain of
    dependent loads there."""
    cdef int i, half, n
    cdef int64_t idx = 0
    if npad == 4:
        return (u >= cdf[0]) + (u >= cdf[1]) + (u >= cdf[2])
    if npad > 32:
        # idx: entries known <= u; n: those still to decide, from cdf[idx] on. Index
        # arithmetic on the compare (SETcc), not a select of pointers, which GCC turns into
        # a branch that mispredicts every other step (_sort_kernels.h, mc_count_below64).
        n = npad
        while n > 1:
            half = n >> 1
            idx += half if cdf[idx + half - 1] <= u else 0
            n -= half
        return <int>(idx + (cdf[idx] <= u))
    for i in range(npad):
        idx += u >= cdf[i]
    return <int>idx


cdef inline CdfTable* cat_read_begin(Categorical* c, uint64_t* seq) noexcept nogil:
    """Seqlock read, step 1: the live table and its (even) sequence number."""
    cdef uint64_t gen, s
    cdef CdfTable* t
    while True:
        gen = mc_load_acq(&c.current)
        t = &c.tables[gen & 1]
        s = mc_load_acq(&t.seq)
        if (s & 1) == 0:
            seq[0] = s
            return t
        mc_cpu_relax()


cdef inline bint cat_read_valid(CdfTable* t, uint64_t seq) noexcept nogil:
    """Seqlock read, step 2: True if the table did not change while it was being read."""
    mc_fence_acq()
    return mc_load_relaxed(&t.seq) == seq


cdef inline int cat_sample(Categorical* c, Rng* r) noexcept nogil:
    """Draw an outcome from the published distribution; never sees a half-written table."""
    cdef double u = rng_uniform(r)
    cdef uint64_t s
    cdef CdfTable* t
    cdef int idx
    while True:
        t = cat_read_begin(c, &s)
        idx = cdf_search(t.cdf, t.npad, u)
        mc_assert(0 <= idx < t.n)
        if cat_read_valid(t, s):
            return idx


cdef inline int cat_sample_except(Categorical* c, Rng* r, int skip) noexcept nogil:
    """Draw an outcome other than ``skip`` from the published distribution renormalised
    without it (``skip`` itself only when it holds all the mass); one uniform, one scan."""
    cdef double u = rng_uniform(r), lo, w, v
    cdef uint64_t s
    cdef CdfTable* t
    cdef int idx
    while True:
        t = cat_read_begin(c, &s)
        lo = t.cdf[skip - 1] if skip > 0 else 0.0
        w = t.cdf[skip] - lo
        if w < 1.0:
            # v uniform on [0, 1 - w), then stepped over skip's interval [lo, lo + w)
            v = u * (1.0 - w)
            idx = cdf_search(t.cdf, t.npad, v + (w if v >= lo else 0.0))
            # v + w can round up to 1.0 (u within 2^-53 of 1), which no entry but the
            # padding exceeds: the last outcome, never an index past the table
            idx = idx if idx < t.n else t.n - 1
        else:
            idx = skip
        mc_assert(0 <= idx < t.n)
        if cat_read_valid(t, s):
            return idx
