# cython: language_level=3
"""cimport API of ``_native.h``: the C helpers that Cython cannot spell (atomics with explicit
memory order, futexes and the doorbell, a spin hint, clocks, aligned allocation, the
vectorizable exp). One home for them: the core, the runtime and the transports cimport them
from here (``malcolm._core`` re-exports the ones it has always offered)."""
from libc.stdint cimport int64_t, uint32_t, uint64_t


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
    # 32-bit atomics, 64-bit counters, futexes and the doorbell
    ctypedef struct mc_doorbell:
        uint32_t seq
        uint32_t sleepers
    uint32_t mc_ld32_acq(const uint32_t* p)
    void mc_st32_rel(uint32_t* p, uint32_t v)
    uint32_t mc_add32(uint32_t* p, uint32_t v)
    uint64_t mc_add64_relaxed(uint64_t* p, uint64_t v)
    int64_t mc_addi64(int64_t* p, int64_t v)
    int64_t mc_ldi64(const int64_t* p)
    void mc_sti64(int64_t* p, int64_t v)
    int mc_futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns)
    int mc_futex_wake(uint32_t* word, int n)
    void mc_bell_ring(mc_doorbell* d)
    void mc_bell_ring_n(mc_doorbell* d, int n)
    uint32_t mc_bell_prepare(mc_doorbell* d)
    void mc_bell_wait(mc_doorbell* d, uint32_t ticket, int64_t timeout_ns)
    void mc_bell_cancel(mc_doorbell* d)


cdef enum:
    CACHELINE = 64
