/* Authenticated address introductions of the verbs transport (docs/rdma.md, "Authenticated
 * introductions"; issue 13). Used by _verbs.pyx only.
 *
 * Keyless, a control datagram is the 32-byte introduction (magic "MCV1", type, 0, LID, QP
 * number, Q_Key, GID). With a rack key it is 64 bytes: the same 32 with byte 5 = 1, then
 *
 *   32..39  epoch of the sender (wire_new_epoch: realtime us << 16 | random; a restart is
 *           larger), big-endian
 *   40..47  nonce: a query's sequence number (the querier's monotonic clock in ns, strictly
 *           increasing); a reply echoes its query's
 *   48..55  cookie: SipHash-2-4 under the querier's own random secret of (nonce, the
 *           address queried); a reply echoes it
 *   56..63  MAC: SipHash-2-4 under the rack key of bytes 0..55, the sender's address and the
 *           receiver's address (family, port, 16 address bytes each; not the IPv6 scope id,
 *           which is local to a host), little-endian like the wire's MAC
 *
 * The MAC binds a datagram to its two ends: a captured one sent from another source or to
 * another endpoint fails it. A query is a claim "I am at this QP now": accepted only with a
 * larger epoch, or a larger nonce in the same epoch, than the last query accepted from that
 * address, so a captured query replayed later cannot move a peer back to an older QP. A reply
 * is accepted only when its cookie is ours for that address (we queried it), its query was
 * sent within MCV_ANSWER_NS, and no later query of ours to it was answered yet: a reply to
 * no outstanding query is dropped. The cookie needs no table shared with the polling thread
 * (which sends the queries): the address thread recomputes it.
 *
 * Threads: the polling thread calls mcv_query (it alone writes last_nonce); the address
 * thread calls mcv_check, mcv_commit and mcv_reply (it alone touches recs); keys and epoch
 * are set before either runs. */
#ifndef MALCOLM_VERBS_CTL_H
#define MALCOLM_VERBS_CTL_H

#include "net/_netc.h"
#include "net/_siphash.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MCV_LEN 32             /* keyless control datagram: the introduction */
#define MCV_AUTH_LEN 64        /* keyed: + epoch, nonce, cookie, MAC */
#define MCV_QUERY 1
#define MCV_REPLY 2
/* The senders we remember (epoch, nonce): 1024 sets of 4, the least recently heard of a set
   giving way. Only key holders get a record (the MAC is checked first). */
#define MCV_SETS 1024
#define MCV_WAYS 4
/* A reply answers a query sent at most this long ago (a querier gives up after 2 s). */
#define MCV_ANSWER_NS 3000000000LL

enum { MCV_BAD = -1, MCV_BAD_MAC = -2, MCV_REPLAY = -3, MCV_UNSOLICITED = -4 };

typedef struct {
    uint8_t a[20];             /* the sender's address, canonical (mcv_canon) */
    uint8_t used;
    uint64_t epoch;            /* its epoch we last accepted */
    uint64_t nonce;            /* its last query accepted in that epoch */
    uint64_t answered;         /* our last query to it that a reply answered */
    int64_t heard_ns;          /* when accepted last (which record of a full set goes) */
} mcv_rec;

typedef struct {
    mc_sipkey key;             /* the rack key */
    mc_sipkey local;           /* this endpoint's own secret (cookies, record sets) */
    uint64_t epoch;
    uint64_t last_nonce;       /* polling thread */
    mcv_rec *recs;             /* address thread: MCV_SETS * MCV_WAYS */
} mcv_auth;

static inline void mcv_st64be(uint8_t *p, uint64_t v) {
    for (int i = 7; i >= 0; i--) { p[i] = (uint8_t)v; v >>= 8; }
}

static inline uint64_t mcv_ld64be(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

/* An address as both ends see it: family, port, address bytes (no scope id). */
static inline void mcv_canon(const mc_addr *a, uint8_t out[20]) {
    out[0] = (uint8_t)(a->family >> 8); out[1] = (uint8_t)a->family;
    out[2] = (uint8_t)(a->port >> 8); out[3] = (uint8_t)a->port;
    memcpy(out + 4, a->addr, 16);
}

static inline uint64_t mcv_mac(const mcv_auth *au, const uint8_t *m, const mc_addr *src,
                               const mc_addr *dst) {
    uint8_t in[56 + 40];
    memcpy(in, m, 56);
    mcv_canon(src, in + 56);
    mcv_canon(dst, in + 76);
    return mc_siphash24(&au->key, in, sizeof(in));
}

static inline uint64_t mcv_cookie(const mcv_auth *au, uint64_t nonce, const mc_addr *dst) {
    uint8_t in[28];
    mcv_st64be(in, nonce);
    mcv_canon(dst, in + 8);
    return mc_siphash24(&au->local, in, sizeof(in));
}

static inline void mcv_seal(const mcv_auth *au, uint8_t *m, const mc_addr *me,
                            const mc_addr *dst) {
    uint64_t t = mcv_mac(au, m, me, dst);
    for (int i = 0; i < 8; i++) { m[56 + i] = (uint8_t)t; t >>= 8; }
}

/* 0 on success; -1 when out of memory. key: 16 bytes; local: 16 random bytes. */
static inline int mcv_init(mcv_auth *au, const uint8_t *key, const uint8_t *local,
                           uint64_t epoch) {
    mc_sipkey_set(&au->key, key);
    mc_sipkey_set(&au->local, local);
    au->epoch = epoch;
    au->last_nonce = 0;
    au->recs = (mcv_rec *)calloc((size_t)MCV_SETS * MCV_WAYS, sizeof(mcv_rec));
    return au->recs ? 0 : -1;
}

/* A query to dst from the 32-byte introduction tmpl (polling thread). */
static inline void mcv_query(mcv_auth *au, const uint8_t *tmpl, const mc_addr *me,
                             const mc_addr *dst, int64_t now, uint8_t out[MCV_AUTH_LEN]) {
    uint64_t nonce = (uint64_t)now;
    if (nonce <= au->last_nonce) nonce = au->last_nonce + 1;
    au->last_nonce = nonce;
    memcpy(out, tmpl, MCV_LEN);
    out[4] = MCV_QUERY;
    out[5] = 1;
    mcv_st64be(out + 32, au->epoch);
    mcv_st64be(out + 40, nonce);
    mcv_st64be(out + 48, mcv_cookie(au, nonce, dst));
    mcv_seal(au, out, me, dst);
}

/* The reply to an accepted query q from dst (address thread). */
static inline void mcv_reply(const mcv_auth *au, const uint8_t *tmpl, const uint8_t *q,
                             const mc_addr *me, const mc_addr *dst,
                             uint8_t out[MCV_AUTH_LEN]) {
    memcpy(out, tmpl, MCV_LEN);
    out[4] = MCV_REPLY;
    out[5] = 1;
    mcv_st64be(out + 32, au->epoch);
    memcpy(out + 40, q + 40, 16);
    mcv_seal(au, out, me, dst);
}

static inline mcv_rec *mcv_set(const mcv_auth *au, const uint8_t c[20]) {
    return au->recs + (mc_siphash24(&au->local, c, 20) & (MCV_SETS - 1)) * MCV_WAYS;
}

static inline mcv_rec *mcv_find(const mcv_auth *au, const uint8_t c[20]) {
    mcv_rec *s = mcv_set(au, c);
    for (int i = 0; i < MCV_WAYS; i++)
        if (s[i].used && memcmp(s[i].a, c, 20) == 0) return &s[i];
    return NULL;
}

/* Check a keyed datagram of n bytes from frm (address thread): MCV_QUERY or MCV_REPLY when
 * it is to be applied (then call mcv_commit once it is), else a negative reason. The caller
 * has checked the introduction's own fields (magic, type, QP number). */
static inline int mcv_check(const mcv_auth *au, const uint8_t *m, int n, const mc_addr *frm,
                            const mc_addr *me, int64_t now) {
    uint8_t c[20];
    uint64_t t = 0, epoch, nonce;
    const mcv_rec *r;
    if (n == MCV_LEN && m[5] == 0) return MCV_BAD_MAC;         /* unsigned */
    if (n != MCV_AUTH_LEN || m[5] != 1) return MCV_BAD;
    for (int i = 7; i >= 0; i--) t = (t << 8) | m[56 + i];
    if (t != mcv_mac(au, m, frm, me)) return MCV_BAD_MAC;
    epoch = mcv_ld64be(m + 32);
    nonce = mcv_ld64be(m + 40);
    mcv_canon(frm, c);
    r = mcv_find(au, c);
    if (m[4] == MCV_QUERY) {
        if (r && (epoch < r->epoch || (epoch == r->epoch && nonce <= r->nonce)))
            return MCV_REPLAY;
        return MCV_QUERY;
    }
    /* A reply: to a query of ours to frm (the cookie), recent, and newer than the last one
       answered (a copy of an answer already taken changes nothing, and is not taken). */
    if (mcv_ld64be(m + 48) != mcv_cookie(au, nonce, frm)) return MCV_UNSOLICITED;
    if ((int64_t)nonce < now - MCV_ANSWER_NS || (int64_t)nonce > now + 1000000)
        return MCV_UNSOLICITED;
    if (r && nonce <= r->answered) return MCV_REPLAY;
    return MCV_REPLY;
}

/* Record an applied datagram that mcv_check accepted (address thread). */
static inline void mcv_commit(mcv_auth *au, const uint8_t *m, const mc_addr *frm,
                              int64_t now) {
    uint8_t c[20];
    uint64_t epoch = mcv_ld64be(m + 32), nonce = mcv_ld64be(m + 40);
    mcv_rec *r, *s;
    mcv_canon(frm, c);
    r = mcv_find(au, c);
    if (r == NULL) {
        s = mcv_set(au, c);
        r = &s[0];
        for (int i = 0; i < MCV_WAYS; i++) {
            if (!s[i].used) { r = &s[i]; break; }
            if (s[i].heard_ns < r->heard_ns) r = &s[i];
        }
        memset(r, 0, sizeof(*r));
        memcpy(r->a, c, 20);
        r->used = 1;
        r->epoch = epoch;
    }
    if (m[4] == MCV_QUERY) {
        r->epoch = epoch;
        r->nonce = nonce;
    } else {
        r->answered = nonce;
        /* The reply is fresh (it answers our recent query), so its epoch is the sender's
           now, even one smaller than recorded (its clock was set back before a restart):
           its next queries are taken. */
        if (epoch != r->epoch) { r->epoch = epoch; r->nonce = 0; }
    }
    r->heard_ns = now;
}

#endif
