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
* ``Estimator``: worker ``w`` is the only writer of row ``w``; ``est_note_arrival`` has a
  single writer (the gateway); anyone may read.
* ``Mpmc``: any number of producers and consumers. ``Spsc``: one of each.
  Queues are position-independent blocks (header then cells, no pointers), so they can live
  in shared memory between processes.
"""
from libc.stdint cimport int32_t, int64_t, uint64_t


cdef extern from "_native.h" nogil:
    uint64_t mc_load_acq(const uint64_t* p)
    uint64_t mc_load_relaxed(const uint64_t* p)
    void mc_store_rel(uint64_t* p, uint64_t v)
    void mc_store_relaxed(uint64_t* p, uint64_t v)
    bint mc_cas(uint64_t* p, uint64_t* expected, uint64_t desired)
    uint64_t mc_fetch_add(uint64_t* p, uint64_t v)
    uint64_t mc_mulhi(uint64_t a, uint64_t b)
    void mc_fence_acq()
    void mc_fence_rel()
    void mc_fence_seq()
    double mc_load_f64(const double* p)
    void mc_store_f64(double* p, double v)
    void mc_cpu_relax()
    uint64_t mc_rdtsc()
    int64_t mc_now_ns()
    void* mc_aligned_alloc(size_t align, size_t size)
    double mc_exp_nonpos(double x)
    void mc_assert(bint cond)
    void mc_axpy(double* f, const double* col, double dx, int n)


cdef enum:
    MAX_OUT = 64       # outcomes of a categorical distribution (servers in a rack)
    MAX_IN = 256       # inputs (features) of its logits
    CACHELINE = 64


# ---------------------------------------------------------------- random numbers
ctypedef struct Rng:
    uint64_t s[4]


cdef void rng_seed(Rng* r, uint64_t seed, uint64_t stream) noexcept nogil
cdef double rng_exponential(Rng* r, double mean) noexcept nogil


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
    matches the width of the double compares, which lets the loop vectorize cleanly."""
    cdef int i
    cdef int64_t idx = 0
    if npad == 4:
        return (u >= cdf[0]) + (u >= cdf[1]) + (u >= cdf[2])
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


# ---------------------------------------------------------------- load estimator
cdef enum:
    EST_MEAN = 0                # EWMA of the service time S; rate = 1 / EWMA (default)
    EST_INVERSE = 1             # EWMA of 1/S, read as the rate (the thesis's literal wording)


ctypedef struct Estimator:
    int32_t n_workers
    int32_t n_types
    int32_t stride              # doubles per worker row, a whole number of cache lines
    int32_t mode                # EST_MEAN or EST_INVERSE
    double alpha                # EWMA weight of a new sample
    double prior_rate           # per-worker rate (tasks/ns) used before any sample
    double* ew                  # [n_workers * stride]: the EWMA per worker and type
    double* mix                 # [n_types]: EWMA of the arrival share of each type
    uint64_t* count             # [n_workers * stride]: samples per worker and type


cdef int est_init(Estimator* e, int n_workers, int n_types, double alpha,
                  double prior_service_ns) noexcept nogil
cdef void est_free(Estimator* e) noexcept nogil
cdef int est_set_mode(Estimator* e, int mode) noexcept nogil
cdef void est_observe(Estimator* e, int worker, int task_type, double service_ns) noexcept nogil
cdef void est_note_arrival(Estimator* e, int task_type) noexcept nogil
cdef double est_worker_rate(Estimator* e, int worker) noexcept nogil
cdef double est_rate(Estimator* e) noexcept nogil
cdef double est_load(Estimator* e, double queue_len) noexcept nogil


# ---------------------------------------------------------------- bounded lock-free queues
ctypedef struct MpmcCell:
    uint64_t seq
    uint64_t value


ctypedef struct Mpmc:
    uint64_t mask
    uint64_t capacity
    uint64_t _pad0[6]
    uint64_t enq                # producers' cursor, own cache line
    uint64_t _pad1[7]
    uint64_t deq                # consumers' cursor, own cache line
    uint64_t _pad2[7]
    # MpmcCell cells[capacity] follow the header


ctypedef struct Spsc:
    uint64_t mask
    uint64_t capacity
    uint64_t _pad0[6]
    uint64_t tail               # written by the producer
    uint64_t head_cache         # producer's stale copy of head
    uint64_t _pad1[6]
    uint64_t head               # written by the consumer
    uint64_t tail_cache         # consumer's stale copy of tail
    uint64_t _pad2[6]
    # uint64_t slots[capacity] follow the header


cdef size_t mpmc_bytes(uint64_t capacity) noexcept nogil
cdef int mpmc_init(Mpmc* q, uint64_t capacity) noexcept nogil
cdef bint mpmc_push(Mpmc* q, uint64_t v) noexcept nogil
cdef bint mpmc_pop(Mpmc* q, uint64_t* out) noexcept nogil
cdef uint64_t mpmc_size(Mpmc* q) noexcept nogil

cdef size_t spsc_bytes(uint64_t capacity) noexcept nogil
cdef int spsc_init(Spsc* q, uint64_t capacity) noexcept nogil
cdef bint spsc_push(Spsc* q, uint64_t v) noexcept nogil
cdef bint spsc_pop(Spsc* q, uint64_t* out) noexcept nogil
cdef uint64_t spsc_size(Spsc* q) noexcept nogil
