/* SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012), 64-bit
 * output, written from the paper's algorithm: 2 compression rounds per 8-byte word and
 * 4 finalisation rounds. The message authentication code of the malcolm wire format
 * (docs/runtime.md); tests/test_security.py checks it against the 64 published test vectors
 * (key 00..0f, messages 00..k-1).
 *
 * Keyed with the rack key; not a hash for anything else. Reads the message byte-wise into
 * little-endian words, so it works at any alignment and on any host byte order. */
#ifndef MALCOLM_SIPHASH_H
#define MALCOLM_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

#define MC_ROTL64(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

#define MC_SIPROUND                                                          \
    do {                                                                     \
        v0 += v1; v1 = MC_ROTL64(v1, 13); v1 ^= v0; v0 = MC_ROTL64(v0, 32);  \
        v2 += v3; v3 = MC_ROTL64(v3, 16); v3 ^= v2;                          \
        v0 += v3; v3 = MC_ROTL64(v3, 21); v3 ^= v0;                          \
        v2 += v1; v1 = MC_ROTL64(v1, 17); v1 ^= v2; v2 = MC_ROTL64(v2, 32);  \
    } while (0)

static inline uint64_t mc_sip_le64(const uint8_t *p) {
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) |
           ((uint64_t)p[3] << 24) | ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) |
           ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

/* The 128-bit key as two little-endian words (k0 = bytes 0..7, k1 = bytes 8..15). */
typedef struct {
    uint64_t k0, k1;
} mc_sipkey;

static inline void mc_sipkey_set(mc_sipkey *k, const uint8_t key[16]) {
    k->k0 = mc_sip_le64(key);
    k->k1 = mc_sip_le64(key + 8);
}

static inline uint64_t mc_siphash24(const mc_sipkey *key, const uint8_t *in, size_t len) {
    uint64_t v0 = 0x736f6d6570736575ULL ^ key->k0;
    uint64_t v1 = 0x646f72616e646f6dULL ^ key->k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ key->k0;
    uint64_t v3 = 0x7465646279746573ULL ^ key->k1;
    const uint8_t *end = in + (len - (len % 8));
    uint64_t m, b = ((uint64_t)len) << 56;
    int left = (int)(len & 7);
    for (; in != end; in += 8) {
        m = mc_sip_le64(in);
        v3 ^= m;
        MC_SIPROUND;
        MC_SIPROUND;
        v0 ^= m;
    }
    switch (left) {
    case 7: b |= ((uint64_t)in[6]) << 48; /* fall through */
    case 6: b |= ((uint64_t)in[5]) << 40; /* fall through */
    case 5: b |= ((uint64_t)in[4]) << 32; /* fall through */
    case 4: b |= ((uint64_t)in[3]) << 24; /* fall through */
    case 3: b |= ((uint64_t)in[2]) << 16; /* fall through */
    case 2: b |= ((uint64_t)in[1]) << 8;  /* fall through */
    case 1: b |= ((uint64_t)in[0]); break;
    case 0: break;
    }
    v3 ^= b;
    MC_SIPROUND;
    MC_SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    MC_SIPROUND;
    MC_SIPROUND;
    MC_SIPROUND;
    MC_SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

#endif
