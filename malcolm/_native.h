/* Small C helpers the Cython core needs and Cython cannot spell: atomics with explicit
   memory order, a spin hint, the TSC, and aligned allocation. Header-only, static inline. */
#ifndef MALCOLM_NATIVE_H
#define MALCOLM_NATIVE_H
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
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
static inline void *mc_aligned_alloc(size_t align, size_t size) {
  void *p = NULL;
  if (posix_memalign(&p, align, size ? size : align) != 0) return NULL;
  return p;
}
#endif
