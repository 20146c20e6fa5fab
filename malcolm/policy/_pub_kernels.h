/* Kernels of the actor-critic's publish step (malcolm/policy/actor_critic.pyx, _publish).
 *
 * Plain C so that GCC vectorizes them (see _ac_kernels.h for the same pattern). */
#ifndef MALCOLM_PUB_KERNELS_H
#define MALCOLM_PUB_KERNELS_H
#include <math.h>
#include "_native.h"
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
#define MC_PUB_CLONES __attribute__((target_clones("arch=x86-64-v3", "default"), unused))
#else
#define MC_PUB_CLONES __attribute__((unused))
#endif
/* An AVX clone (not x86-64-v3): AVX has no FMA, so nothing can be contracted and the clone
   gives the baseline's bits, with 4-lane vectors where the baseline has 2 (the kernels'
   loops in half the instructions). The dispatch is an indirect call per kernel and window:
   nothing at the window's scale (bench_window N = 16 unchanged, 4 within its noise). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
#define MC_PUB_AVX __attribute__((target_clones("avx", "default"), unused))
#else
#define MC_PUB_AVX __attribute__((unused))
#endif
#define MC_PUB_MAX 64       /* servers (MAX_SERVERS in policy/base.pxd) */

typedef double mc_pub_v4d __attribute__((vector_size(32)));
typedef long long mc_pub_v4l __attribute__((vector_size(32)));

/* mc_exp_nonpos (_native.h) of four lanes x <= 0, the same operations on each lane (the
   same Cody-Waite reduction and Estrin polynomial, so that a build contracts them into the
   same fused multiply-adds), without its clamp of x to -708: the caller zeroes the lanes
   below -708 (where the clamped value only kept the arithmetic finite, and whatever the
   unclamped lanes compute there is masked out bit by bit). In place, and always inlined:
   a 4-lane vector passed by value has another ABI in the AVX2 clone than in this
   (baseline) function. */
typedef unsigned long long mc_pub_v4u __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) void mc_pub_exp4_unclamped(mc_pub_v4d *v) {
    mc_pub_v4d x = *v;
    const double log2e = 1.4426950408889634, ln2_hi = 0.6931471803691238,
                 ln2_lo = 1.9082149292705877e-10, shifter = 6755399441055744.0;
    mc_pub_v4d t = x * log2e + shifter;
    mc_pub_v4d k = t - shifter;
    mc_pub_v4d r = (x - k * ln2_hi) - k * ln2_lo;
    mc_pub_v4d r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    mc_pub_v4d a01 = 1.0 + r, a23 = 0.5 + r * (1.0 / 6.0), a45 = 1.0 / 24.0 + r * (1.0 / 120.0);
    mc_pub_v4d a67 = 1.0 / 720.0 + r * (1.0 / 5040.0), a89 = 1.0 / 40320.0 + r * (1.0 / 362880.0);
    mc_pub_v4d a1011 = 1.0 / 3628800.0 + r * (1.0 / 39916800.0);
    const double a12 = 1.0 / 479001600.0;
    mc_pub_v4d b03 = a01 + r2 * a23, b47 = a45 + r2 * a67, b811 = a89 + r2 * a1011;
    mc_pub_v4d c07 = b03 + r4 * b47, c812 = b811 + r4 * a12;
    mc_pub_v4d p = c07 + r8 * c812;
    mc_pub_v4u e = ((mc_pub_v4u)t - 0x4338000000000000ull + 1023ull) << 52;
    *v = p * (mc_pub_v4d)e;
}

/* p = w * exp(g) / sum(w * exp(g)): the softmax of g + log(w), without the n logs.
   w_i = 0 masks outcome i (p_i = 0 exactly). The shift is the largest g over the
   unmasked outcomes, so every exponent is <= 0 for them; the masked ones are computed
   with a clamped exponent and multiplied by 0. The max and the sum run in four lanes
   (a sequential sum of 64 terms is a chain of 64 dependent adds), written as 4-lane
   vectors: lane l sums p[l], p[l + 4], ... in order as the scalar lanes did, and the max
   of the unmasked non-NaN g is the same whatever the lanes (up to the sign of a zero
   shift, which leaves every g - m unchanged). The exponentials of each 4-block, w exp(min(g
   - m, 0)) with mc_exp_nonpos's bits (0 below -708), are summed as they are computed, as
   4-lane vectors with masks for the selects (the scalar form compiled to compares and
   blends for the special cases 0 and -708 that cost more than the polynomial). Returns
   0, or -1 (p untouched) when no outcome is left or the sum is not a positive finite
   number: the caller decides. */
static MC_PUB_CLONES int mc_pub_softmax_w(const double *restrict g, const double *restrict w,
                                          double *restrict p, int n) {
    const mc_pub_v4d lowv = {-1e300, -1e300, -1e300, -1e300}, zerov = {0.0, 0.0, 0.0, 0.0};
    const mc_pub_v4d lim = {-708.0, -708.0, -708.0, -708.0};
    mc_pub_v4d mv = lowv, zv = zerov;
    double m0, m1, m2, m3, m, z, z0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        mc_pub_v4d gv, wv;
        mc_pub_v4l on, gt;
        __builtin_memcpy(&gv, g + i, sizeof gv);
        __builtin_memcpy(&wv, w + i, sizeof wv);
        on = (mc_pub_v4l)(wv > zerov);
        gv = (mc_pub_v4d)(((mc_pub_v4l)gv & on) | ((mc_pub_v4l)lowv & ~on));
        gt = (mc_pub_v4l)(gv > mv);
        mv = (mc_pub_v4d)(((mc_pub_v4l)gv & gt) | ((mc_pub_v4l)mv & ~gt));
    }
    m0 = mv[0];
    m1 = mv[1];
    m2 = mv[2];
    m3 = mv[3];
    for (; i < n; i++) m0 = (w[i] > 0.0 && g[i] > m0) ? g[i] : m0;
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    m = m2 > m0 ? m2 : m0;
    if (!(m > -1e300)) return -1;
    for (i = 0; i + 4 <= n; i += 4) {
        mc_pub_v4d gv, wv, d, e;
        __builtin_memcpy(&gv, g + i, sizeof gv);
        __builtin_memcpy(&wv, w + i, sizeof wv);
        d = gv - m;
        d = (mc_pub_v4d)((mc_pub_v4l)d & (mc_pub_v4l)(d < zerov));   /* d < 0 ? d : +0.0 */
        e = d;
        mc_pub_exp4_unclamped(&e);
        e = (mc_pub_v4d)((mc_pub_v4l)e & ~(mc_pub_v4l)(d < lim));     /* 0 below -708 */
        e = wv * e;
        __builtin_memcpy(p + i, &e, sizeof e);
        zv += e;
    }
    z0 = zv[0];
    for (; i < n; i++) {
        double d = g[i] - m;
        p[i] = w[i] * mc_exp_nonpos(d < 0.0 ? d : 0.0);
        z0 += p[i];
    }
    z = (z0 + zv[1]) + (zv[2] + zv[3]);
    if (!(z > 0.0) || !(z < 1e308)) return -1;
    z = 1.0 / z;
    for (i = 0; i < n; i++) p[i] *= z;
    return 0;
}

/* How many of a[0..n) are > 0 (the known rates: AgentState._rescale and the migrate
   weights, every window). As 2-lane compares whose masks (-1 or 0) are subtracted, two
   per pass: GCC leaves the scalar loop (a compare, a flag, an add per server)
   unvectorized, and lowers 4-lane vectors without AVX to worse code than this. */
typedef double mc_pub_v2d __attribute__((vector_size(16)));
typedef long long mc_pub_v2l __attribute__((vector_size(16)));
static inline int mc_pub_count_pos(const double *restrict a, int n) {
    const mc_pub_v2d zero = {0.0, 0.0};
    mc_pub_v2l acc = {0, 0};
    const double *p = a, *end = a + (n & ~3);
    int j, k;
    for (; p != end; p += 4) {
        mc_pub_v2d v, w;
        __builtin_memcpy(&v, p, sizeof v);
        __builtin_memcpy(&w, p + 2, sizeof w);
        acc -= (mc_pub_v2l)(v > zero) + (mc_pub_v2l)(w > zero);
    }
    k = (int)(acc[0] + acc[1]);
    for (j = n & ~3; j < n; j++) k += a[j] > 0.0;
    return k;
}

/* How many servers are known (known[j] != 0): the migrate and steal weights and the actors'
   inputs each take the mask-free path once all n are. */
static inline int mc_pub_count_known(const unsigned char *restrict known, int n) {
    int k = 0;
    for (int j = 0; j < n; j++) k += known[j] != 0;
    return k;
}

/* A peer's task time over the own, from the two speed codes (256 log2 of each server's
   geometric-mean service time in ns, as heartbeats carry them): the one reading of a code,
   for the overload mask here, the herd term's busy share, and the hop gate's speed shift
   and the grant bar (gateway_rules.pyx). 2^(d/256) for d = code - lg, from a table of the
   same exp2 of the same argument (so the same bits) for |d| <= MC_SPEED_TAB_R, a factor of
   256 either way, and from exp2 beyond: the grant bar took one exp2 per peer and window
   (a 64-server rack: 17 a window, 1.6% of the simulator's instructions with the busy
   share's). Each module that reads it fills its own copy once, at import
   (mc_speed_tab_init), before any policy exists; a copy not filled (its centre, 2^0 = 1,
   still 0) is never read: exp2 then, the same value. */
#define MC_SPEED_TAB_R 2048
static double mc_speed_tab[2 * MC_SPEED_TAB_R + 1] __attribute__((unused));
static inline void mc_speed_tab_init(void) {
    for (int d = -MC_SPEED_TAB_R; d <= MC_SPEED_TAB_R; d++)
        mc_speed_tab[d + MC_SPEED_TAB_R] = exp2((double)d * (1.0 / 256.0));
}
static inline double mc_speed_ratio_d(int d) {      /* 2^(d/256), d a codes' difference */
    if ((unsigned)(d + MC_SPEED_TAB_R) <= 2u * MC_SPEED_TAB_R
            && mc_speed_tab[MC_SPEED_TAB_R] == 1.0)
        return mc_speed_tab[d + MC_SPEED_TAB_R];
    return exp2((double)d * (1.0 / 256.0));
}
static inline double mc_speed_ratio(int code, int lg) {
    return mc_speed_ratio_d(code - lg);
}

typedef unsigned short mc_pub_v8u __attribute__((vector_size(16)));

/* The least and the largest known speed code of code[0..n) (0, not known, is neither; lo
   0xFFFF and hi 0 when none is known), in one pass that vectorizes (PMINUW and PMAXUW in the
   AVX clones that inline it). */
static inline __attribute__((always_inline)) void mc_pub_code_range(
        const uint16_t *restrict code, int n, int *lo_out, int *hi_out) {
    uint16_t lo = 0xFFFF, hi = 0;
    for (int j = 0; j < n; j++) {
        uint16_t c = code[j], k = c | (uint16_t)-(c == 0);     /* c, or 0xFFFF for 0 */
        lo = k < lo ? k : lo;
        hi = c > hi ? c : hi;
    }
    *lo_out = lo;
    *hi_out = hi;
}

/* The least known speed code (GatewayRules._speed_shift's test whether any peer is slower
   than the band): the Cython loop's 9 instructions a peer, scalar, were 1.7% of the
   simulator's on a 64-server rack. */
static MC_PUB_AVX int mc_pub_code_min(const uint16_t *restrict code, int n) {
    int lo, hi;
    mc_pub_code_range(code, n, &lo, &hi);
    return lo;
}

/* The grant bar's busy share (GatewayRules._grant_bar, whose docstring says what it is):
   sums[0] = sum r_j and sums[1] = sum r_j [x_j r_j + 1/2 >= r_j t q_j] over the peers j != me,
   q_j = mc_speed_ratio_d(code_j - lg), d = 0 (q = 1) where lg or code_j is 0 (not known),
   each sum in the order of j as the Cython loop summed them, every other operation the
   same: (x_j r_j) + 1/2 and (r_j t) q_j. That loop took 30 instructions a peer (5% of the
   simulator's on a 64-server rack); here the ratios are table reads without a test per
   peer once the codes' range is known to lie in the table, the terms a pass that
   vectorizes, and the two sums two chains of adds side by side (GCC pairs them in one
   register's two lanes). AVX, not x86-64-v3: no FMA may fuse x r + 1/2. */
static MC_PUB_AVX void mc_pub_grant_share(const double *restrict x,
                                          const double *restrict rate,
                                          const uint16_t *restrict code, int n, int me,
                                          double t, int lg, double *restrict sums) {
    double q[MC_PUB_MAX], u[MC_PUB_MAX], rs = 0.0, us = 0.0;
    int j, lo = 0xFFFF, hi = 0;
    if (lg != 0)
        mc_pub_code_range(code, n, &lo, &hi);
    if (hi == 0) {                  /* no code known (or lg not): d = 0 for every peer */
        for (j = 0; j < n; j++) q[j] = 1.0;
    } else if (lo >= lg - MC_SPEED_TAB_R && hi <= lg + MC_SPEED_TAB_R
               && mc_speed_tab[MC_SPEED_TAB_R] == 1.0) {
        /* the index R + code - lg (R where the code is not known), eight a pass in 16-bit
           lanes (an index in the table is below 2^13, whatever the lanes wrapped around to
           on the way), each lane then a scalar read: AVX has no gather, and the scalar loop
           (a test, a branch and an index per peer) cost 10 instructions a peer */
        const mc_pub_v8u zero = {0}, mid = zero + (uint16_t)MC_SPEED_TAB_R;
        const mc_pub_v8u base = zero + (uint16_t)(MC_SPEED_TAB_R - lg);
        for (j = 0; j + 8 <= n; j += 8) {
            mc_pub_v8u c, m, i;
            __builtin_memcpy(&c, code + j, sizeof c);
            m = (mc_pub_v8u)(c == zero);
            i = ((c + base) & ~m) | (mid & m);
            for (int l = 0; l < 8; l++) q[j + l] = mc_speed_tab[i[l]];
        }
        for (; j < n; j++) q[j] = mc_speed_tab[MC_SPEED_TAB_R + (code[j] ? code[j] - lg : 0)];
    } else {
        for (j = 0; j < n; j++) q[j] = mc_speed_ratio_d(code[j] ? code[j] - lg : 0);
    }
    for (j = 0; j < n; j++) {
        double cw = x[j] * rate[j] + 0.5, c0 = rate[j] * t * q[j];
        u[j] = cw >= c0 ? rate[j] : 0.0;
    }
    for (j = 0; j < me; j++) {
        rs += rate[j];
        us += u[j];
    }
    for (j = me + 1; j < n; j++) {
        rs += rate[j];
        us += u[j];
    }
    sums[0] = rs;
    sums[1] = us;
}

/* The steal bars of GatewayRules._steal_thresholds (whose docstring says what they are),
   stored in out[0..n) (steal_pub), each word with its own relaxed store: t_j = ceil(1 - r e_j)
   (at least -1e9) where r > 0 and e_j > 0, 1 otherwise, then t_j - off, or `never` where
   hd + max(e_j, 0) < 0 (hd < 0); the word carries t_j as int32 in its low half. e_j = x_j - xm.
   The Cython loop's operations, branch-free: half the peers are above the mean, and its
   branch on e_j > 0 missed about as often. With r > 0 and hd >= 0 (a rate known and the gate
   not closed for speed: nearly every window) the two tests that then always hold are left
   out, and the stores go four a pass (the Cython loop that stored them took 6 instructions
   a peer). AVX, not x86-64-v3: no FMA may fuse 1 - r e. */
static MC_PUB_AVX void mc_pub_steal_bars(const double *restrict x, int n, double xm,
                                         double r, double off, double hd, double never,
                                         uint64_t *out) {
    uint32_t b[MC_PUB_MAX];
    int j;
    if (r > 0.0 && hd >= 0.0) {
        for (j = 0; j < n; j++) {
            double e = x[j] - xm, c = ceil(1.0 - r * e);
            c = c > -1e9 ? c : -1e9;
            b[j] = (uint32_t)(int32_t)((e > 0.0 ? c : 1.0) - off);
        }
    } else {
        for (j = 0; j < n; j++) {
            double e = x[j] - xm, c = ceil(1.0 - r * e), t;
            c = c > -1e9 ? c : -1e9;
            t = (r > 0.0) & (e > 0.0) ? c : 1.0;
            e = e > 0.0 ? e : 0.0;
            t = (hd >= 0.0) | (hd + e >= 0.0) ? t - off : never;
            b[j] = (uint32_t)(int32_t)t;
        }
    }
    for (j = 0; j + 4 <= n; j += 4) {
        mc_store_relaxed(out + j, b[j]);
        mc_store_relaxed(out + j + 1, b[j + 1]);
        mc_store_relaxed(out + j + 2, b[j + 2]);
        mc_store_relaxed(out + j + 3, b[j + 3]);
    }
    for (; j < n; j++) mc_store_relaxed(out + j, b[j]);
}

/* The herd term's busy share (AgentState._marginal_advantages): the peers' busy workers over
   their workers, sum_j min(w_j, k_j) / sum_j w_j over the peers with a rate, w_j = r_j t_j
   (t_j = t at j's speed code, t where a code is not known) and k_j = x_j r_j its tasks. A
   herd's tasks wait only where no worker is idle. 1 while t is not measured. */
static inline double mc_busy_share(const double *x, const double *rate,
                                   const unsigned short *code, int n, int me, double t,
                                   int lg) {
    double w = 0.0, b = 0.0;
    if (!(t > 0.0)) return 1.0;
    for (int j = 0; j < n; j++) {
        if (j == me || !(rate[j] > 0.0)) continue;
        double wj = rate[j] * ((lg > 0 && code[j] != 0) ? t * mc_speed_ratio(code[j], lg) : t);
        double kj = x[j] * rate[j];
        w += wj;
        b += kj < wj ? kj : wj;
    }
    return w > 0.0 ? b / w : 1.0;
}

/* The migrate outcomes' weights (AgentState._migrate_weights, whose docstring says what
   they are); returns how many peers the overload mask zeroed. The same values as the
   Cython loops this replaced (each sum in its order; a build with FMA, MALCOLM_NATIVE=1,
   may fuse rsum + km1 * r here as it did there), with the sums without selects and the
   per-server divisions in loops that vectorize. Cloned for AVX, not x86-64-v3: an AVX2
   clone made the cache-hot 16-server window 10% slower (fourth session) and its FMA would
   change the bits. */
static MC_PUB_AVX int mc_pub_migrate_weights(const double *restrict x,
                                             const double *restrict rate,
                                             const unsigned char *restrict known,
                                             double *restrict w, int n, int me, double ls,
                                             int capacity_prior, double mask_factor,
                                             const uint16_t *restrict code, int lg,
                                             double t) {
    double rbar, vbar = 0.0, vme, lim, rsum = 0.0, spare = 0.0, c, km1;
    int j, k, kr, flow, prior;
    long long nm = 0;
    /* x_j >= 0 (0 while j is unknown: x is never written before known_j) and rate_j >= 0
       (0 or a clamped positive rate), so the sums add x and rate of every server: the
       terms the selects made +0.0 add nothing to a sum that starts at +0.0 */
    k = mc_pub_count_known(known, n);
    kr = mc_pub_count_pos(rate, n);
    for (j = 0; j < n; j++) {       /* the two sums in one pass, each in its own order */
        vbar += x[j];
        rsum += rate[j];
    }
    vbar /= (double)(k > 0 ? k : 1) * ls;
    vme = x[me] / ls;
    k = kr;
    rbar = k > 0 ? rsum / k : 0.0;
    prior = capacity_prior && rbar > 0.0;
    flow = prior && k > 1 && rate[me] > 0.0;
    km1 = (double)(k - 1);
    if (flow) {
        for (j = 0; j < n; j++) {
            double r = rate[j], q = r * r / (rsum + km1 * r);
            w[j] = r > 0.0 ? q : 0.0;
        }
        w[me] = 0.0;                /* accepting is not a peer's share */
        for (j = 0; j < n; j++) spare += w[j];
        c = (rsum - rate[me]) / (spare * rbar);
        for (j = 0; j < n; j++) w[j] = rate[j] > 0.0 ? c * w[j] : 1.0;
    } else if (prior) {
        double inv_rbar = 1.0 / rbar;
        for (j = 0; j < n; j++) w[j] = rate[j] > 0.0 ? rate[j] * inv_rbar : 1.0;
    } else {
        for (j = 0; j < n; j++) w[j] = 1.0;
    }
    if (prior && rate[me] > 0.0) w[me] = rate[me] / rbar;
    if (mask_factor > 0.0) {
        /* masked: a known peer j with v_j > v_me, v_j > lim and v_j > lim + s_j. v_j > v_me
           already excludes j = me (v_me is v_j's own division) and every unknown j
           (v_j = 0 <= v_me). The divisions v_j in a loop that vectorizes; s_j's only for
           the few servers above both first limits (a division costs more time than the
           branch that skips it) */
        double v[MC_PUB_MAX];
        int above[MC_PUB_MAX], na = 0, a;
        lim = mask_factor * vbar;
        for (j = 0; j < n; j++) v[j] = x[j] / ls;
        /* the peers above both, listed without a branch (one per peer missed as often as
           a few random peers were above), then each in the order of j */
        for (j = 0; j < n; j++) {
            above[na] = j;
            na += (v[j] > vme) & (v[j] > lim);
        }
        for (a = 0; a < na; a++) {
            j = above[a];
            double s = rate[j] > 0.0 ? 1.0 / (rate[j] * ls) : 1.0;
            /* With the speed codes known, not while j has a worker idle (its load
               x_j = tasks / rate is then at most one task time there, t_j = t
               2^((code_j - lg) / 256), t the own mean and the codes the geometric
               means' logs: a task sent now starts at once), nor while a task sent
               there would finish no later than one kept here (x_j + t_j <= x_me + t).
               Tasks in service count in x_j, so a many-worker server with no queue
               stood far above peers left empty and was masked (a 16-worker server at
               half load beside slow servers that keep nothing: p99 2-3.6x SED's;
               docs/policy.md, item 15). Unknown codes: the rule before. */
            double tj = (lg > 0 && t > 0.0 && code[j] != 0)
                        ? t * mc_speed_ratio((int)code[j], lg) : 0.0;
            if (v[j] > lim + s && (tj == 0.0 || (x[j] > tj && x[j] + tj > x[me] + t))) {
                w[j] = 0.0;
                nm++;
            }
        }
    }
    return (int)nm;
}

/* The steal outcomes' weights (AgentState._steal_weights): 0 for the known peers not
   busier than us when the mask is on, 1 elsewhere. With every server known (a rack after
   its first window) the loop needs neither the byte mask nor the index test, and
   vectorizes. */
static MC_PUB_AVX void mc_pub_steal_weights(const double *restrict x,
                                            const unsigned char *restrict known,
                                            double *restrict w, int n, int me, int mask) {
    double xme = x[me];
    int j, k = mc_pub_count_known(known, n);
    if (mask && k == n) {
        for (j = 0; j < n; j++) w[j] = x[j] <= xme ? 0.0 : 1.0;
        w[me] = 1.0;
        return;
    }
    for (j = 0; j < n; j++)
        w[j] = ((j != me) & mask & (known[j] != 0) & (x[j] <= xme)) ? 0.0 : 1.0;
}
/* The sparse actors' inputs (AgentState._actor_inputs): z_j = u_j - the mean of the known
   u, clipped to +-zclip, 0 for unknown servers. The same operations in the same order as
   the Cython loops they replace (the sum stays sequential). Not cloned: the sum is a chain
   of dependent adds whatever the lanes, and the clip below is SSE2's MAXPD and MINPD.
   The clip min(max(t, -zclip), zclip) gives, for every t (NaN and signed zeros included),
   what t > zclip ? zclip : (t < -zclip ? -zclip : t) gives: max(-zclip, t) is
   -zclip > t ? -zclip : t (t when t is NaN), and above zclip it is t itself. GCC keeps such
   selects as compares and blends (it may not assume IEEE max semantics): on x86 they are
   MAXPD and MINPD, whose operand order gives exactly these selects. With every server
   known (a rack after its first window, counted in a loop that vectorizes) the sum needs
   no test per server: it adds the same terms in the same order. */
static inline void mc_pub_clip_dev(const double *restrict u, double ub, double *restrict z,
                                   int n, double zclip) {
    int j = 0;
#if defined(__SSE2__)
    const __m128d hi = _mm_set1_pd(zclip), lo = _mm_set1_pd(-zclip), m = _mm_set1_pd(ub);
    for (; j + 4 <= n; j += 4) {       /* two per pass: half the loop's own instructions */
        __m128d t0 = _mm_sub_pd(_mm_loadu_pd(u + j), m);
        __m128d t1 = _mm_sub_pd(_mm_loadu_pd(u + j + 2), m);
        _mm_storeu_pd(z + j, _mm_min_pd(hi, _mm_max_pd(lo, t0)));
        _mm_storeu_pd(z + j + 2, _mm_min_pd(hi, _mm_max_pd(lo, t1)));
    }
    for (; j + 2 <= n; j += 2) {
        __m128d t = _mm_sub_pd(_mm_loadu_pd(u + j), m);
        _mm_storeu_pd(z + j, _mm_min_pd(hi, _mm_max_pd(lo, t)));
    }
#endif
    for (; j < n; j++) {
        double t = u[j] - ub;
        z[j] = t > zclip ? zclip : (t < -zclip ? -zclip : t);
    }
}

/* What the peers moved in a window (AgentState._peer_moves), from n (migrations, steals)
   pairs of cumulative counts: last[] as the peers' latest heartbeats reported them, base[]
   as they stood at the last call (set to last[] here). Per count d = last - base where that
   is positive (0 where a count went down), at most cap; *big counts the counts over cap.
   Integer sums: any order gives the same. Once per window and agent instead of a read of
   each peer's last counts in every heartbeat. */
static MC_PUB_CLONES void mc_peer_moves(const uint64_t *restrict last, uint64_t *restrict base,
                                        int n, uint64_t cap, uint64_t *mig, uint64_t *stl,
                                        uint64_t *big) {
    const mc_pub_v4u cv = {cap, cap, cap, cap};
    mc_pub_v4u acc = {0, 0, 0, 0}, nb = acc;
    uint64_t m = 0, s = 0, b = 0;
    int j = 0, k = 2 * n;
    for (; j + 4 <= k; j += 4) {        /* two pairs a pass: lanes m, s, m, s */
        mc_pub_v4u l, o, d, over;
        __builtin_memcpy(&l, last + j, sizeof l);
        __builtin_memcpy(&o, base + j, sizeof o);
        d = (l - o) & (mc_pub_v4u)(l > o);
        over = (mc_pub_v4u)(d > cv);
        nb -= over;                     /* a true lane is all ones: -1 */
        acc += (d & ~over) | (cv & over);
        __builtin_memcpy(base + j, &l, sizeof l);
    }
    for (; j < k; j += 2) {
        uint64_t dm = last[j] > base[j] ? last[j] - base[j] : 0;
        uint64_t ds = last[j + 1] > base[j + 1] ? last[j + 1] - base[j + 1] : 0;
        b += (dm > cap) + (ds > cap);
        m += dm > cap ? cap : dm;
        s += ds > cap ? cap : ds;
        base[j] = last[j];
        base[j + 1] = last[j + 1];
    }
    *mig = m + acc[0] + acc[2];
    *stl = s + acc[1] + acc[3];
    *big = b + nb[0] + nb[1] + nb[2] + nb[3];
}

/* u_j <- x_j / ls, clipped above at clip, for every j (AgentState._actor_inputs and the
   per-server _features, the sparse actors' readers of u, and _rescale for all actors): the
   sparse actors' inputs, computed where they are read instead of in every heartbeat (n - 1
   a window, each a write to one more cache line of the receiver's). The same division and
   the same select as _store_load's v > clip ? clip : v: MINPD(clip, v) returns v unless
   clip < v. A server never heard of has x_j = 0 and so u_j = 0, as if never written. */
static inline void mc_pub_scaled_loads(const double *restrict x, double *restrict u, int n,
                                       double ls, double clip) {
    int j = 0;
#if defined(__SSE2__)
    const __m128d c = _mm_set1_pd(clip), l = _mm_set1_pd(ls);
    for (; j + 4 <= n; j += 4) {
        _mm_storeu_pd(u + j, _mm_min_pd(c, _mm_div_pd(_mm_loadu_pd(x + j), l)));
        _mm_storeu_pd(u + j + 2, _mm_min_pd(c, _mm_div_pd(_mm_loadu_pd(x + j + 2), l)));
    }
#endif
    for (; j < n; j++) {
        double v = x[j] / ls;
        u[j] = v > clip ? clip : v;
    }
}

static inline void mc_pub_actor_inputs(const double *restrict u,
                                       const unsigned char *restrict known,
                                       double *restrict z, int n, double zclip) {
    double ub = 0.0;
    int j, k = mc_pub_count_known(known, n);
    if (k == n) {       /* every server known: no mask */
        for (j = 0; j < n; j++) ub += u[j];
        ub /= (double)(k > 0 ? k : 1);
        mc_pub_clip_dev(u, ub, z, n, zclip);
        return;
    }
    for (j = 0; j < n; j++) {
        if (known[j]) ub += u[j];
    }
    ub /= (double)(k > 0 ? k : 1);
    for (j = 0; j < n; j++) {
        double t = known[j] ? u[j] - ub : 0.0;
        z[j] = t > zclip ? zclip : (t < -zclip ? -zclip : t);
    }
}

/* Lost heartbeats (docs/policy.md, item 22), at each window's end (now, ns): which peers'
   reports are stale. Per peer: seq[n + j] its sequence number at the last look (0: none
   yet), f[j] when that number last advanced, f[n + j] its heartbeat period in ns (0: not
   measured yet). A lost heartbeat shows as a jump of the number, so the time between
   advances over the jump measures the peer's own period whatever the loss, and in time, not
   in windows, whatever either server's window. The period follows a longer one at once and
   a shorter one by an EWMA (1/4): a peer's window may lengthen, and a late estimate then errs
   towards fresh. Stale (1) where no advance came for (1 + after) periods: without loss
   never, since a report comes every period and is seen within the own window (shorter than
   the period where that matters). Returns how many are stale (only the count is used: while
   every known peer is stale, no load steers the actors; AgentState._actor_inputs). */
static inline int mc_pub_peer_ages(uint32_t *restrict seq, const unsigned char *restrict known,
                                   double *restrict f, int n, int me, double now,
                                   double after) {
    uint32_t *snap = seq + n;
    double *t = f, *per = f + n, k1 = 1.0 + after;
    int j, k = 0;
    for (j = 0; j < n; j++) {
        uint32_t s = seq[j], o = snap[j];
        if (s != o) {                       /* it advanced (or this is the first look) */
            double p = now - t[j], q = per[j];
            uint32_t dq = s - o;
            if (dq != 1)                    /* heartbeats lost (or a reordered one dropped) */
                p /= (double)dq;
            if (o != 0)
                per[j] = (q == 0.0 || p > q) ? p : q + 0.25 * (p - q);
            snap[j] = s;
            t[j] = now;
        }
        k += (j != me) & (known[j] != 0) & (per[j] > 0.0) & (now - t[j] >= k1 * per[j]);
    }
    return k;
}

/* The sparse actors' learned logit parts (AgentState._learned_logits) from the gathered
   block A = [B | W_jj | W_j,me] (migrate, then steal): g_j = B_j + W_jj z_j + W_j,me z_me,
   evaluated as (B_j + W_jj z_j) + W_j,me z_me like the Cython loop it replaces. */
static MC_PUB_AVX void mc_pub_learned_logits(const double *restrict A,
                                              const double *restrict z, double *restrict g,
                                              int n, int me) {
    const double *restrict bm = A, *restrict dm = A + n, *restrict cm = A + 2 * n;
    const double *restrict bs = A + 3 * n, *restrict ds = A + 4 * n, *restrict cs = A + 5 * n;
    double *restrict gm = g, *restrict gs = g + n;
    double zme = z[me];
    for (int j = 0; j < n; j++) gm[j] = bm[j] + dm[j] * z[j] + cm[j] * zme;
    for (int j = 0; j < n; j++) gs[j] = bs[j] + ds[j] * z[j] + cs[j] * zme;
}
#endif
