/* Small C helpers that Cython cannot spell: atomics with explicit memory order, futexes and
   the doorbell, a spin hint, the TSC, clocks and aligned allocation. Header-only, static
   inline; declared for Cython in _native.pxd. */
#ifndef MALCOLM_NATIVE_H
#define MALCOLM_NATIVE_H
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

/* MALCOLM_DEBUG=1 builds check the cdef API's preconditions (which the Python wrappers check
   anyway); release builds compile the checks away. */
#ifdef MALCOLM_DEBUG
#include <assert.h>
#define mc_assert(cond) assert(cond)
#else
#define mc_assert(cond) ((void)0)
#endif

static inline uint64_t mc_load_acq(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline uint64_t mc_load_relaxed(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void mc_store_rel(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline void mc_store_relaxed(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
static inline int mc_cas(uint64_t *p, uint64_t *expected, uint64_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}
static inline uint64_t mc_fetch_add(uint64_t *p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
static inline void mc_fence_acq(void) { __atomic_thread_fence(__ATOMIC_ACQUIRE); }
static inline void mc_fence_rel(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }
static inline void mc_fence_seq(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
/* Aligned 8-byte loads and stores are single instructions on the targets we support, so a
   reader never sees half of a double; volatile keeps the compiler from caching the value. */
static inline double mc_load_f64(const double *p) { return *(volatile const double*)p; }
static inline void mc_store_f64(double *p, double v) { *(volatile double*)p = v; }

static inline uint64_t mc_mulhi(uint64_t a, uint64_t b) { return (uint64_t)(((unsigned __int128)a * b) >> 64); }

static inline void mc_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}
static inline uint64_t mc_rdtsc(void) {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
#endif
}
static inline int64_t mc_now_ns(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (int64_t)t.tv_sec * 1000000000ll + t.tv_nsec;
}
/* exp() for the softmax, written so that GCC vectorizes the loop that calls it (libm's exp
   is a scalar call and dominates the softmax otherwise). Range reduction x = k ln2 + r with
   |r| <= ln2/2 (Cody-Waite, two constants), a degree-12 Taylor polynomial for e^r, and 2^k
   built in the exponent bits. Relative error below 4e-16 on [-708, 0]; below -708 it
   returns exactly 0 (a select, so the loop still vectorizes), which is how padding lanes of
   a softmax (logit -1e300) drop out. */
static inline double mc_exp_nonpos(double x) {
  const double log2e = 1.4426950408889634, ln2_hi = 0.6931471803691238, ln2_lo = 1.9082149292705877e-10;
  const double shifter = 6755399441055744.0; /* 2^52 + 2^51: adding it rounds to an integer */
  const double x0 = x;
  x = x < -708.0 ? -708.0 : x;
  double t = x * log2e + shifter;
  double k = t - shifter;
  double r = (x - k * ln2_hi) - k * ln2_lo;
  /* Estrin's scheme: the same degree-12 Taylor polynomial as Horner, but with a dependency
     chain of 5 multiply-adds instead of 12, which is what bounds a short softmax. */
  const double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
  const double a01 = 1.0 + r, a23 = 0.5 + r * (1.0 / 6.0), a45 = 1.0 / 24.0 + r * (1.0 / 120.0);
  const double a67 = 1.0 / 720.0 + r * (1.0 / 5040.0), a89 = 1.0 / 40320.0 + r * (1.0 / 362880.0);
  const double a1011 = 1.0 / 3628800.0 + r * (1.0 / 39916800.0), a12 = 1.0 / 479001600.0;
  const double b03 = a01 + r2 * a23, b47 = a45 + r2 * a67, b811 = a89 + r2 * a1011;
  const double c07 = b03 + r4 * b47, c812 = b811 + r4 * a12;
  const double p = c07 + r8 * c812;
  union { double d; int64_t i; } u, s;
  u.d = t;
  s.i = (int64_t)((uint64_t)(u.i - 0x4338000000000000ll + 1023) << 52); /* t's low bits hold k */
  return x0 < -708.0 ? 0.0 : p * s.d;
}

/* f += dx * col over n entries. restrict tells the compiler the two never overlap, so the
   vectorized loop needs no run-time overlap check: that check is most of the cost at N=4. */
static inline void mc_axpy(double *restrict f, const double *restrict col, double dx, int n) {
  for (int i = 0; i < n; i++) f[i] += dx * col[i];
}

static inline void *mc_aligned_alloc(size_t align, size_t size) {
  void *p = NULL;
  if (posix_memalign(&p, align, size ? size : align) != 0) return NULL;
  return p;
}
/* ------------------------------------------------------------ 32-bit atomics and futexes */
static inline uint32_t mc_ld32_acq(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void mc_st32_rel(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline uint32_t mc_add32(uint32_t *p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline uint64_t mc_add64_relaxed(uint64_t *p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline int64_t mc_addi64(int64_t *p, int64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
static inline int64_t mc_ldi64(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void mc_sti64(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* Shared futexes (no FUTEX_PRIVATE_FLAG) so that they work across processes on a shared
   mapping as well as between threads. */
static inline int mc_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
  struct timespec ts, *tp = NULL;
  if (timeout_ns >= 0) { ts.tv_sec = timeout_ns / 1000000000ll; ts.tv_nsec = timeout_ns % 1000000000ll; tp = &ts; }
  return (int)syscall(SYS_futex, word, FUTEX_WAIT, expected, tp, NULL, 0);
}
static inline int mc_futex_wake(uint32_t *word, int n) {
  return (int)syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* A doorbell lets a consumer block until a producer rings. The waiter announces itself in
   `sleepers` before re-checking its queues, so a producer that sees sleepers == 0 after its
   push knows the waiter will see the push: no lost wake-ups, and no syscall while the
   consumer is awake. */
typedef struct mc_doorbell { uint32_t seq; uint32_t sleepers; } mc_doorbell;

static inline void mc_bell_ring_n(mc_doorbell *d, int n) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(&d->sleepers, __ATOMIC_RELAXED)) {
    __atomic_fetch_add(&d->seq, 1, __ATOMIC_SEQ_CST);
    mc_futex_wake(&d->seq, n);
  }
}
static inline void mc_bell_ring(mc_doorbell *d) { mc_bell_ring_n(d, 0x7fffffff); }
/* Step 1 of a wait: returns the ticket to pass to mc_bell_wait. */
static inline uint32_t mc_bell_prepare(mc_doorbell *d) {
  uint32_t s = __atomic_load_n(&d->seq, __ATOMIC_ACQUIRE);
  __atomic_fetch_add(&d->sleepers, 1, __ATOMIC_SEQ_CST);
  return s;
}
/* Step 2, after the caller re-checked that there is nothing to do. */
static inline void mc_bell_wait(mc_doorbell *d, uint32_t ticket, int64_t timeout_ns) {
  mc_futex_wait(&d->seq, ticket, timeout_ns);
  __atomic_fetch_sub(&d->sleepers, 1, __ATOMIC_SEQ_CST);
}
static inline void mc_bell_cancel(mc_doorbell *d) { __atomic_fetch_sub(&d->sleepers, 1, __ATOMIC_SEQ_CST); }

#endif
