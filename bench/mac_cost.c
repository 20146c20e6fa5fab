/* Cost of one message authentication code per wire message, three well-kept primitives:
 * SipHash-2-4 (malcolm/net/_siphash.h, what the runtime uses), HMAC-SHA256 and keyed
 * BLAKE2b-256 from OpenSSL's libcrypto. HMAC keeps its keyed context and re-initialises it
 * per message (the key's pads are computed once); keyed BLAKE2b absorbs the key as its first
 * block by design, so it pays for it per message.
 *
 *   cc -O2 -I malcolm bench/mac_cost.c -o /tmp/mac_cost -lcrypto && /tmp/mac_cost
 *
 * Prints ns per MAC for the wire format's typical sizes (a task, a response, a heartbeat with
 * 16 critic parameters, a task with a 1 KiB payload). Single thread; take the median of runs. */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/core_names.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "net/_siphash.h"

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static volatile uint64_t sink;

int main(void) {
    static const size_t sizes[] = {48, 64, 168, 1104};
    uint8_t key[32], msg[2048], out[64];
    size_t i, s;
    int reps = 200000;
    mc_sipkey sk;
    for (i = 0; i < sizeof(key); i++) key[i] = (uint8_t)(i * 7 + 1);
    for (i = 0; i < sizeof(msg); i++) msg[i] = (uint8_t)i;
    mc_sipkey_set(&sk, key);
    EVP_MAC *bmac = EVP_MAC_fetch(NULL, "BLAKE2BMAC", NULL);
    EVP_MAC_CTX *bctx = bmac ? EVP_MAC_CTX_new(bmac) : NULL;
    size_t bsize = 32;
    OSSL_PARAM bp[2] = {OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &bsize),
                        OSSL_PARAM_construct_end()};
    EVP_MAC *hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *hctx = EVP_MAC_CTX_new(hmac);
    OSSL_PARAM hp[2] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, "SHA256", 0),
                        OSSL_PARAM_construct_end()};
    if (!hctx || !EVP_MAC_init(hctx, key, 32, hp)) {
        fprintf(stderr, "no HMAC in libcrypto\n");
        return 1;
    }
    printf("%-8s %12s %12s %12s\n", "bytes", "siphash24", "hmac-sha256", "blake2b-256");
    for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = sizes[s];
        int64_t t0 = now_ns();
        for (int r = 0; r < reps; r++) {
            msg[0] = (uint8_t)r;
            sink ^= mc_siphash24(&sk, msg, n);
        }
        double sip = (double)(now_ns() - t0) / reps;
        t0 = now_ns();
        for (int r = 0; r < reps / 4; r++) {
            size_t ol;
            msg[0] = (uint8_t)r;
            EVP_MAC_init(hctx, NULL, 0, NULL);      /* same key: reuses its pads */
            EVP_MAC_update(hctx, msg, n);
            EVP_MAC_final(hctx, out, &ol, sizeof(out));
            sink ^= out[0];
        }
        double hm = (double)(now_ns() - t0) / (reps / 4);
        double bl = -1;
        if (bctx) {
            size_t ol;
            t0 = now_ns();
            for (int r = 0; r < reps / 4; r++) {
                msg[0] = (uint8_t)r;
                EVP_MAC_init(bctx, key, 32, bp);
                EVP_MAC_update(bctx, msg, n);
                EVP_MAC_final(bctx, out, &ol, sizeof(out));
                sink ^= out[0];
            }
            bl = (double)(now_ns() - t0) / (reps / 4);
        }
        printf("%-8zu %10.1f ns %10.1f ns %10.1f ns\n", n, sip, hm, bl);
    }
    EVP_MAC_CTX_free(hctx);
    EVP_MAC_free(hmac);
    EVP_MAC_CTX_free(bctx);
    EVP_MAC_free(bmac);
    return 0;
}
