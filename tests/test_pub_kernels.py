"""The publish kernels' bit-identity claims (``malcolm/policy/_pub_kernels.h``), checked in C.

The simulator's fixed-seed runs depend on the last bits of these kernels, and two of their
forms exist only for speed: the AVX clones (no FMA, so they must give the baseline's bits)
and the vector forms of selects (MAXPD/MINPD for the inputs' clip, masks in the softmax's
exponentials). A small C program runs them on random and edge inputs; it is compiled once
with the clones (as the package is) and once without (``MALCOLM_DEBUG``: the baseline code
only), and both builds must agree bit for bit on the AVX-cloned kernels.
"""

PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include <math.h>
#include <stdint.h>
#include "policy/_pub_kernels.h"

static uint64_t st = 0x9E3779B97F4A7C15ull, h = 1469598103934665603ull;
static double rnd(void) {            /* xorshift64*: the same inputs in every build */
    st ^= st >> 12; st ^= st << 25; st ^= st >> 27;
    return (double)((st * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static int rint_(int m) { return (int)(rnd() * m); }
static void mix(const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) { h ^= c[i]; h *= 1099511628211ull; }
}
static const double edge[] = {0.0, -0.0, 4.0, -4.0, 4.000000000000001, -4.000000000000001,
                              INFINITY, -INFINITY, NAN, 1e-310, -1e300, 1e300};

int main(void) {
    double x[64], rate[64], w[64], A[6 * 64], z[64], g[128], p[64], u[64];
    unsigned char known[64];
    uint16_t code[64];
    long bad = 0;
    for (long it = 0; it < 20000; it++) {
        int n = 1 + rint_(64), me = rint_(n);
        double ub = (rnd() - 0.5) * 12;
        for (int j = 0; j < n; j++) {
            known[j] = rint_(10) != 0 || j == me;
            x[j] = known[j] && rint_(8) ? rnd() * 1e6 * (1 + rint_(4)) : 0.0;
            rate[j] = known[j] && rint_(6) ? rnd() * 1e-4 * (1 + rint_(16)) : 0.0;
            z[j] = (rnd() - 0.5) * 8;
            code[j] = rint_(5) ? (uint16_t)(4096 + rint_(2048)) : 0;
            u[j] = rint_(4) ? (rnd() - 0.5) * 20 : edge[rint_(12)] + ub;
        }
        if (it % 3 == 0) memset(known, 1, (size_t)n);
        for (int j = 0; j < 6 * n; j++) A[j] = (rnd() - 0.5) * 3;
        /* the AVX-cloned kernels: hashed, compared between the two builds */
        int nm = mc_pub_migrate_weights(x, rate, known, w, n, me, 5e4 * (0.5 + rnd()),
                                        rint_(4) != 0, rint_(3) ? 1.5 : 0.0, code,
                                        rint_(4) ? 4096 + rint_(2048) : 0, 1e4 * rnd());
        mix(&nm, sizeof nm);
        mix(w, sizeof(double) * n);
        mc_pub_steal_weights(x, known, w, n, me, rint_(4) != 0);
        mix(w, sizeof(double) * n);
        mc_pub_learned_logits(A, z, g, n, me);
        mix(g, sizeof(double) * 2 * n);
        if (it == 10000) mc_speed_tab_init();      /* the ratios by exp2, then the table */
        {   /* the grant bar's share and the least code: GatewayRules' loops they replaced
               (codes in and beyond the table's range, some not known, near-ties) */
            int lg = rint_(5) ? 4096 + rint_(2048) : 0, far = rint_(3) == 0, lo = 0xFFFF;
            double t = 1e4 * rnd(), xs[64], s[2], rs = 0.0, us = 0.0;
            for (int j = 0; j < n; j++) {
                int d;
                code[j] = rint_(6) ? (uint16_t)(4096 + rint_(far ? 6000 : 2048)) : 0;
                d = lg != 0 && code[j] != 0 ? (int)code[j] - lg : 0;
                xs[j] = rint_(4) || !(rate[j] > 0.0) ? x[j]
                        : rate[j] * t * mc_speed_ratio_d(d) / rate[j] - 0.5 / rate[j];
                if (j != me) {
                    rs += rate[j];
                    us += xs[j] * rate[j] + 0.5 >= rate[j] * t * mc_speed_ratio_d(d)
                          ? rate[j] : 0.0;
                }
                lo = code[j] && code[j] < lo ? code[j] : lo;
            }
            mc_pub_grant_share(xs, rate, code, n, me, t, lg, s);
            bad += memcmp(&rs, &s[0], sizeof rs) != 0 || memcmp(&us, &s[1], sizeof us) != 0;
            bad += mc_pub_code_min(code, n) != lo;
        }
        {   /* the steal bars: the loop the kernel replaced, whichever path it takes */
            double xm = rnd() * 2e6, r = rint_(5) ? rnd() * 1e-5 : (rint_(2) ? 0.0 : NAN);
            double off = rint_(3) ? 0.0 : 1e8 + rint_(100), never = 2147483647.0;
            double hd = rint_(3) ? rnd() * 1e4 : (rint_(5) ? -rnd() * 1e6 : NAN);
            uint64_t out[64];
            mc_pub_steal_bars(x, n, xm, r, off, hd, never, out);
            for (int j = 0; j < n; j++) {
                double e = x[j] - xm, c = ceil(1.0 - r * e), b;
                c = c > -1e9 ? c : -1e9;
                b = (r > 0.0) & (e > 0.0) ? c : 1.0;
                e = e > 0.0 ? e : 0.0;
                b = (hd >= 0.0) | (hd + e >= 0.0) ? b - off : never;
                bad += out[j] != (uint64_t)(uint32_t)(int32_t)b;
            }
        }
        /* the clip: exactly the nested select, for every value */
        mc_pub_clip_dev(u, ub, w, n, 4.0);
        for (int j = 0; j < n; j++) {
            double t = u[j] - ub, r = t > 4.0 ? 4.0 : (t < -4.0 ? -4.0 : t);
            bad += memcmp(&r, &w[j], sizeof r) != 0;
        }
        /* the same draws in both builds, so that the streams stay equal */
        for (int j = 0; j < n; j++) {
            g[j] = (rnd() - 0.5) * (it % 2 ? 2000.0 : 20.0);
            w[j] = rint_(5) ? rnd() * 3 : 0.0;
            if (rint_(30) == 0) g[j] = -1e300;
        }
#ifdef MALCOLM_DEBUG
        /* without clones nothing is contracted: the softmax's vector exponentials must
           give w * mc_exp_nonpos(min(g - m, 0)) / sum, lane by lane */
        if (mc_pub_softmax_w(g, w, p, n) == 0) {
            double m = -1e300, s = 0.0, e[64];
            for (int j = 0; j < n; j++) m = (w[j] > 0.0 && g[j] > m) ? g[j] : m;
            for (int j = 0; j < n; j++) {
                double d = g[j] - m;
                e[j] = w[j] * mc_exp_nonpos(d < 0.0 ? d : 0.0);
            }
            {   /* the kernel's sum: 4 lanes in order, then the tail into lane 0 */
                double l[4] = {0.0, 0.0, 0.0, 0.0};
                int j = 0;
                for (; j + 4 <= n; j += 4)
                    for (int q = 0; q < 4; q++) l[q] += e[j + q];
                for (; j < n; j++) l[0] += e[j];
                s = (l[0] + l[1]) + (l[2] + l[3]);
            }
            for (int j = 0; j < n; j++) {
                double r = e[j] * (1.0 / s);
                bad += memcmp(&r, &p[j], sizeof r) != 0;
            }
        }
#endif
    }
    printf("%016llx %ld\n", (unsigned long long)h, bad);
    return bad != 0;
}
"""


def _run(c_program, name, extra):
    out = c_program(PROGRAM, name, extra)
    assert out.returncode == 0, out.stdout + out.stderr
    digest, bad = out.stdout.split()
    assert bad == "0"
    return digest


def test_avx_clones_give_the_baseline_bits_and_vector_selects_the_scalar_ones(c_program):
    cloned = _run(c_program, "cloned", [])
    baseline = _run(c_program, "baseline", ["-DMALCOLM_DEBUG=1"])
    assert cloned == baseline
