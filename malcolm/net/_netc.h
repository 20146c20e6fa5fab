/* C helpers of the wire format and the transports that Cython cannot spell: little-endian
   loads and stores at any alignment, and the shared-memory message ring of the `shm`
   transport. Header-only, static inline. The atomics, futexes and the doorbell they use are
   in ../_native.h (declared for Cython in malcolm/_native.pxd). */
#ifndef MALCOLM_NETC_H
#define MALCOLM_NETC_H
#include <stdint.h>
#include <string.h>
#include "../_native.h"

/* An endpoint address, as the transports and the wire format carry it (24 bytes). */
typedef struct mc_addr {
  uint16_t family;      /* AF_INET, AF_INET6, or 0x5348 for a shared-memory endpoint */
  uint16_t port;
  uint32_t extra;       /* IPv6 scope id (udp and verbs addresses); 0 for shm */
  uint8_t addr[16];     /* IPv4 in the first 4 bytes; an shm endpoint name */
} mc_addr;

/* ------------------------------------------------------------ little-endian fields
   memcpy compiles to one unaligned load/store; the byte swap is a no-op on x86/arm64. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define MC_LE16(x) __builtin_bswap16(x)
#define MC_LE32(x) __builtin_bswap32(x)
#define MC_LE64(x) __builtin_bswap64(x)
#else
#define MC_LE16(x) (x)
#define MC_LE32(x) (x)
#define MC_LE64(x) (x)
#endif
static inline uint16_t mc_ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return MC_LE16(v); }
static inline uint32_t mc_ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return MC_LE32(v); }
static inline uint64_t mc_ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return MC_LE64(v); }
static inline double mc_ldf64(const uint8_t *p) { uint64_t v = mc_ld64(p); double d; memcpy(&d, &v, 8); return d; }
static inline void mc_st16(uint8_t *p, uint16_t v) { v = MC_LE16(v); memcpy(p, &v, 2); }
static inline void mc_st32(uint8_t *p, uint32_t v) { v = MC_LE32(v); memcpy(p, &v, 4); }
static inline void mc_st64(uint8_t *p, uint64_t v) { v = MC_LE64(v); memcpy(p, &v, 8); }
static inline void mc_stf64(uint8_t *p, double d) { uint64_t v; memcpy(&v, &d, 8); mc_st64(p, v); }
static inline int mc_isfinite(double d) { return __builtin_isfinite(d); }

/* ------------------------------------------------------------ shared-memory message ring
   A bounded multi-producer, single-consumer ring of fixed-size cells (Vyukov's scheme with
   the message bytes inside the cell). Position independent: header then cells, so it can
   be mapped at different addresses in different processes. The consumer reads messages in
   place and releases them after use, so a receive copies nothing. */
#define MC_RING_MAGIC 0x4d4352494e4731ull   /* "MCRING1" */
/* owner_flags: the owner holds an exclusive flock on the ring's file while it runs, which the
   kernel drops when it dies however it dies: whether it runs is then known from the file,
   whatever its pid has come to name (reused, or in another pid namespace). */
#define MC_RING_LOCKED 1u
typedef struct mc_ring_hdr {
  uint64_t magic;
  uint32_t capacity;          /* power of two */
  uint32_t cell_bytes;        /* bytes per cell, header included */
  uint32_t alive;             /* 1 while the owner runs; 0 after a clean stop */
  int32_t owner_pid;
  /* the pid namespace owner_pid is a pid of (the inode of /proc/self/ns/pid; 0: not known,
     and in rings made before it was kept): a pid means nothing in another namespace */
  uint64_t owner_ns;
  uint32_t owner_flags;       /* MC_RING_LOCKED */
  uint32_t _padf;
  uint64_t _pad0[3];
  uint64_t enq;               /* producers' cursor */
  uint64_t _pad1[7];
  uint64_t deq;               /* the consumer's cursor */
  uint64_t _pad2[7];
  mc_doorbell bell;           /* rung by producers when the consumer sleeps */
  uint64_t _pad3[7];
} mc_ring_hdr;

typedef struct mc_cell_hdr {
  uint64_t seq;
  uint32_t len;
  uint32_t _pad;
  uint8_t src[24];            /* the sender's address (a NetAddr) */
  uint8_t _pad2[24];
} mc_cell_hdr;                /* 64 bytes; the message follows */

static inline size_t mc_ring_bytes(uint32_t capacity, uint32_t cell_bytes) {
  return sizeof(mc_ring_hdr) + (size_t)capacity * cell_bytes;
}
static inline mc_cell_hdr *mc_ring_cell(mc_ring_hdr *r, uint64_t pos) {
  return (mc_cell_hdr *)((uint8_t *)r + sizeof(mc_ring_hdr) +
                         (size_t)(pos & (r->capacity - 1)) * r->cell_bytes);
}
static inline void mc_ring_init(mc_ring_hdr *r, uint32_t capacity, uint32_t cell_bytes, int32_t pid,
                                uint64_t pid_ns, uint32_t flags) {
  memset(r, 0, sizeof(*r));
  r->capacity = capacity; r->cell_bytes = cell_bytes; r->owner_pid = pid; r->owner_ns = pid_ns;
  r->owner_flags = flags;
  for (uint64_t i = 0; i < capacity; i++) mc_ring_cell(r, i)->seq = i;
  r->alive = 1;
  __atomic_store_n(&r->magic, MC_RING_MAGIC, __ATOMIC_RELEASE);
}
/* Producer: copy one message in. Returns 0, or -1 when the ring is full or len too big. */
static inline int mc_ring_push(mc_ring_hdr *r, const uint8_t *src_addr, const uint8_t *msg, uint32_t len) {
  if (len + sizeof(mc_cell_hdr) > r->cell_bytes) return -1;
  uint64_t pos = __atomic_load_n(&r->enq, __ATOMIC_RELAXED);
  mc_cell_hdr *c;
  for (;;) {
    c = mc_ring_cell(r, pos);
    uint64_t seq = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
    int64_t dif = (int64_t)(seq - pos);
    if (dif == 0) {
      if (__atomic_compare_exchange_n(&r->enq, &pos, pos + 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) break;
    } else if (dif < 0) {
      return -1;
    } else {
      pos = __atomic_load_n(&r->enq, __ATOMIC_RELAXED);
    }
  }
  c->len = len;
  memcpy(c->src, src_addr, 24);
  memcpy((uint8_t *)(c + 1), msg, len);
  __atomic_store_n(&c->seq, pos + 1, __ATOMIC_RELEASE);
  return 0;
}
/* Consumer: the i-th ready message after the cursor, or NULL. */
static inline mc_cell_hdr *mc_ring_peek(mc_ring_hdr *r, uint64_t i) {
  uint64_t pos = r->deq + i;
  mc_cell_hdr *c = mc_ring_cell(r, pos);
  if (__atomic_load_n(&c->seq, __ATOMIC_ACQUIRE) != pos + 1) return NULL;
  return c;
}
/* Consumer: hand the first n peeked cells back to the producers. */
static inline void mc_ring_release(mc_ring_hdr *r, uint64_t n) {
  uint64_t pos = r->deq;
  for (uint64_t i = 0; i < n; i++) {
    mc_cell_hdr *c = mc_ring_cell(r, pos + i);
    __atomic_store_n(&c->seq, pos + i + r->capacity, __ATOMIC_RELEASE);
  }
  r->deq = pos + n;
}
static inline int mc_ring_empty(mc_ring_hdr *r) { return mc_ring_peek(r, 0) == NULL; }

#endif
