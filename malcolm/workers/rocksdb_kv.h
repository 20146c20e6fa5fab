/* The malcolm RocksDB dictionary and its GET(n) request, in one place: `malcolm rocksdb load`
   writes the dictionary with these functions, the `rocksdb` handler reads it, and the load
   generator builds requests and checks every value it gets back with the same functions.

   Dictionary: key k (0 <= k < n_keys) is stored as 4 bytes, big endian (so the keys sort in
   index order and a bulk load writes them in order); its value is value_size bytes of
   mc_kv_value(k). One extra key, MC_KV_META (longer than 4 bytes, so it cannot collide),
   holds "malcolm-kv 1 keys=N value_size=V".

   GET(n) request payload: u32 n, then n u32 key indices (little endian); the payload must be
   exactly 4 + 4 n bytes. Response payload: the n values, value_size bytes each, in request
   order. */
#ifndef MALCOLM_ROCKSDB_KV_H
#define MALCOLM_ROCKSDB_KV_H
#include <stdint.h>
#include <string.h>

#define MC_KV_META "malcolm-kv:meta"
#define MC_KV_META_LEN 15
#define MC_KV_MAX_KEYS 64          /* most keys in one GET */
#define MC_KV_MAX_VALUE 1024       /* a value must fit in a response payload */

/* splitmix64's finaliser: a bijection of u64 with good avalanche. */
static inline uint64_t mc_kv_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static inline void mc_kv_key(uint32_t k, uint8_t out[4]) {
  out[0] = (uint8_t)(k >> 24);
  out[1] = (uint8_t)(k >> 16);
  out[2] = (uint8_t)(k >> 8);
  out[3] = (uint8_t)k;
}

/* The value of key k: word j is mix(k << 20 | j), little endian, cut to n bytes. */
static inline void mc_kv_value(uint32_t k, uint8_t *out, uint32_t n) {
  uint32_t j, off, take;
  uint64_t w;
  for (j = 0, off = 0; off < n; j++, off += 8) {
    w = mc_kv_mix(((uint64_t)k << 20) | j);
    take = n - off < 8 ? n - off : 8;
    for (uint32_t b = 0; b < take; b++) out[off + b] = (uint8_t)(w >> (8 * b));
  }
}

/* 1 if the n bytes at p are key k's value, else 0. */
static inline int mc_kv_check(uint32_t k, const uint8_t *p, uint32_t n) {
  uint8_t want[MC_KV_MAX_VALUE];
  if (n > MC_KV_MAX_VALUE) return 0;
  mc_kv_value(k, want, n);
  return memcmp(want, p, n) == 0;
}

static inline uint32_t mc_kv_ld32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void mc_kv_st32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
#endif
