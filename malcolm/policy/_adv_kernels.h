/* The per-outcome loops of AgentState._marginal_advantages (malcolm/policy/agent_state.pyx):
 * each outcome's one-decision change of the imbalance, through F(a) = sum_k |a - v_k| over
 * the sorted loads (_sort_kernels.h), for every peer i != me at once.
 *
 * Each outcome takes one to two binary searches of the 64 sorted slots, whose steps are a
 * chain of dependent loads: in the Cython loops they were a tenth of the simulator's time
 * on 64 servers. With AVX2 four outcomes go through each step together, one gather a step.
 * Every lane computes what the scalar code computes, the same operations in the same order
 * (no FMA: the AVX2 function is built for AVX2 alone, and the extension for the baseline),
 * so both paths give the same bits; mc_adv_scalar forces the scalar one (tests). */
#ifndef MALCOLM_ADV_KERNELS_H
#define MALCOLM_ADV_KERNELS_H
#include <math.h>
#include "_sort_kernels.h"
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
#include <immintrin.h>
#define MC_ADV_AVX2 1
#else
#define MC_ADV_AVX2 0
#endif

/* What the loops read: the sorted loads srt[0..63] (+inf after the k known) with prefix
   sums pre[0..k], F at each sorted load (fv, by position pos[i]), and the window's
   constants of _marginal_advantages. */
typedef struct {
    const double *srt, *pre, *fv, *x, *rate, *pm, *ps;
    const int *pos;
    const unsigned char *known;
    int n, me, k, herd, do_mig, do_stl;
    double inv, ls, norm, hq, hcs, mcost, scost, cstl, hop, hc, sme, vme, vs, fme, fme_up;
} mc_adv_in;

static int mc_adv_scalar = 0;       /* 1: the scalar path only (tests compare the two) */
static inline __attribute__((unused)) void mc_adv_set_scalar(int on) { mc_adv_scalar = on; }

/* the scalar lanes: the Cython loops' arithmetic, one outcome */
static inline double mc_adv_si(const mc_adv_in *a, int i) {
    return a->rate[i] > 0.0 ? 1.0 / (a->rate[i] * a->ls) : 1.0;
}
static inline double mc_adv_cost(const mc_adv_in *a, double si, double c) {
    double t = a->hc * (si + a->sme);
    return c + (t < a->hop ? t : a->hop);          /* min(hop, hc (si + sme)): hop_cap */
}
/* migrate: the task goes to i, F(vi + si) - si - F(vi) (with the herd term: both at the
   load the herd would give i); 0.0 where not taken (unknown, masked, no decision) */
static inline double mc_adv_mig_one(const mc_adv_in *a, int i) {
    double si, vi, di, dh;
    if (!a->known[i] || i == a->me || !(a->do_mig && a->pm[i] > 0.0)) return 0.0;
    si = mc_adv_si(a, i);
    vi = a->x[i] * a->inv;
    if (a->herd) {
        dh = (a->hq * a->pm[i] - a->hcs * a->rate[i]) * si;
        di = mc_absdev_step64(a->srt, a->pre, a->k, vi, si, dh);
    } else {
        di = mc_absdev64(a->srt, a->pre, a->k, vi + si) - si - a->fv[a->pos[i]];
    }
    return -a->norm * di - mc_adv_cost(a, si, a->mcost);
}
/* steal: one task moves from i to me, over k != i, me; our own terms at vs */
static inline double mc_adv_stl_one(const mc_adv_in *a, int i) {
    double si, vi, di;
    if (i == a->me || !a->do_stl || a->ps[i] <= 0.0) return 0.0;
    if (!a->known[i]) return -a->cstl;             /* no information: nothing moves */
    si = mc_adv_si(a, i);
    vi = a->x[i] * a->inv;
    di = ((mc_absdev64(a->srt, a->pre, a->k, vi - si) - si - fabs(vi - si - a->vme))
          - (a->fv[a->pos[i]] - fabs(vi - a->vme)));
    di += ((a->fme_up - fabs(a->vs + a->sme - vi) - a->sme) - (a->fme - fabs(a->vs - vi)));
    di += fabs((vi - si) - (a->vs + a->sme)) - fabs(vi - a->vs);     /* the pair (i, me) */
    return -a->norm * di - mc_adv_cost(a, si, a->scost);
}

#if MC_ADV_AVX2
#define MC_ADV_T __attribute__((target("avx2")))
/* mc_absdev64 of four queries: mc_count_below64's seven steps, one gather each, then
   mc_absdev_at's expression */
static inline MC_ADV_T __m256d mc_adv_absdev4(const mc_adv_in *a, __m256d q) {
    __m256i b = _mm256_setzero_si256();
    __m128i lo, klo;
    __m256d lod, prelo;
    static const int step[6] = {32, 16, 8, 4, 2, 1};
    for (int s = 0; s < 6; s++) {
        __m256i idx = _mm256_add_epi64(b, _mm256_set1_epi64x(step[s] - 1));
        __m256d v = _mm256_i64gather_pd(a->srt, idx, 8);
        __m256i m = _mm256_castpd_si256(_mm256_cmp_pd(v, q, _CMP_LT_OQ));
        b = _mm256_add_epi64(b, _mm256_and_si256(m, _mm256_set1_epi64x(step[s])));
    }
    {
        __m256d v = _mm256_i64gather_pd(a->srt, b, 8);
        __m256i m = _mm256_castpd_si256(_mm256_cmp_pd(v, q, _CMP_LT_OQ));
        b = _mm256_sub_epi64(b, m);                /* + 1 where v[b] < a */
    }
    /* the counts (< 2^31) as 32-bit lanes, for the conversion to double */
    lo = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
        b, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
    klo = _mm_sub_epi32(_mm_set1_epi32(a->k), lo);
    lod = _mm256_cvtepi32_pd(lo);
    prelo = _mm256_i32gather_pd(a->pre, lo, 8);
    /* (a lo - pre[lo]) + (pre[k] - pre[lo] - a (k - lo)) */
    return _mm256_add_pd(_mm256_sub_pd(_mm256_mul_pd(q, lod), prelo),
                         _mm256_sub_pd(_mm256_sub_pd(_mm256_set1_pd(a->pre[a->k]), prelo),
                                       _mm256_mul_pd(q, _mm256_cvtepi32_pd(klo))));
}
static inline MC_ADV_T __m256d mc_adv_fabs4(__m256d x) {
    return _mm256_andnot_pd(_mm256_set1_pd(-0.0), x);
}
/* the lanes' si = rate > 0 ? 1 / (rate ls) : 1, vi = x inv, and the cost term */
static inline MC_ADV_T __m256d mc_adv_si4(const mc_adv_in *a, __m256d r) {
    __m256d pos = _mm256_cmp_pd(r, _mm256_setzero_pd(), _CMP_GT_OQ);
    __m256d s = _mm256_div_pd(_mm256_set1_pd(1.0), _mm256_mul_pd(r, _mm256_set1_pd(a->ls)));
    return _mm256_blendv_pd(_mm256_set1_pd(1.0), s, pos);
}
static inline MC_ADV_T __m256d mc_adv_cost4(const mc_adv_in *a, __m256d si, double c) {
    __m256d t = _mm256_mul_pd(_mm256_set1_pd(a->hc), _mm256_add_pd(si, _mm256_set1_pd(a->sme)));
    __m256d h = _mm256_set1_pd(a->hop);
    return _mm256_add_pd(_mm256_set1_pd(c),
                         _mm256_blendv_pd(h, t, _mm256_cmp_pd(t, h, _CMP_LT_OQ)));
}
/* the lanes' F at v_i (fv[pos[i]]) */
static inline MC_ADV_T __m256d mc_adv_fvi4(const mc_adv_in *a, int i) {
    return _mm256_i32gather_pd(a->fv, _mm_loadu_si128((const __m128i *)(a->pos + i)), 8);
}
/* the lanes where known[i] != 0 (all ones), from four flag bytes */
static inline MC_ADV_T __m256d mc_adv_known4(const mc_adv_in *a, int i) {
    int w;
    __builtin_memcpy(&w, a->known + i, 4);
    __m256i kb = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(w));
    return _mm256_castsi256_pd(_mm256_xor_si256(_mm256_cmpeq_epi64(kb, _mm256_setzero_si256()),
                                                _mm256_set1_epi64x(-1)));
}

static MC_ADV_T void mc_adv_mig_avx2(const mc_adv_in *a, double *am, int n4) {
    const __m256d nn = _mm256_set1_pd(-a->norm), zero = _mm256_setzero_pd();
    for (int i = 0; i < n4; i += 4) {
        __m256d r = _mm256_loadu_pd(a->rate + i), pm = _mm256_loadu_pd(a->pm + i);
        __m256d si = mc_adv_si4(a, r), vi = _mm256_mul_pd(_mm256_loadu_pd(a->x + i),
                                                         _mm256_set1_pd(a->inv));
        __m256d di, out, ok;
        if (a->herd) {
            __m256d dh = _mm256_mul_pd(_mm256_sub_pd(_mm256_mul_pd(_mm256_set1_pd(a->hq), pm),
                                                     _mm256_mul_pd(_mm256_set1_pd(a->hcs), r)),
                                       si);
            __m256d b0 = _mm256_add_pd(vi, dh);
            /* (F(vi + dh + s) - F(vi + dh)) - (|dh + s| - |dh|) */
            di = _mm256_sub_pd(_mm256_sub_pd(mc_adv_absdev4(a, _mm256_add_pd(b0, si)),
                                             mc_adv_absdev4(a, b0)),
                               _mm256_sub_pd(mc_adv_fabs4(_mm256_add_pd(dh, si)),
                                             mc_adv_fabs4(dh)));
        } else {
            di = _mm256_sub_pd(_mm256_sub_pd(mc_adv_absdev4(a, _mm256_add_pd(vi, si)), si),
                               mc_adv_fvi4(a, i));
        }
        out = _mm256_sub_pd(_mm256_mul_pd(nn, di), mc_adv_cost4(a, si, a->mcost));
        ok = _mm256_and_pd(mc_adv_known4(a, i), _mm256_cmp_pd(pm, zero, _CMP_GT_OQ));
        _mm256_storeu_pd(am + i, _mm256_and_pd(out, ok));   /* 0.0 where not taken */
    }
}

static MC_ADV_T void mc_adv_stl_avx2(const mc_adv_in *a, double *st, int n4) {
    const __m256d nn = _mm256_set1_pd(-a->norm), zero = _mm256_setzero_pd();
    const __m256d vme = _mm256_set1_pd(a->vme), vs = _mm256_set1_pd(a->vs);
    const __m256d sme = _mm256_set1_pd(a->sme), vss = _mm256_set1_pd(a->vs + a->sme);
    /* (fme_up - |vs + sme - vi| - sme) - (fme - |vs - vi|): its constant parts */
    const __m256d fup = _mm256_set1_pd(a->fme_up), fme = _mm256_set1_pd(a->fme);
    for (int i = 0; i < n4; i += 4) {
        __m256d r = _mm256_loadu_pd(a->rate + i);
        __m256d si = mc_adv_si4(a, r), vi = _mm256_mul_pd(_mm256_loadu_pd(a->x + i),
                                                         _mm256_set1_pd(a->inv));
        __m256d vmsi = _mm256_sub_pd(vi, si), di, out, kn, ok;
        di = _mm256_sub_pd(
            _mm256_sub_pd(_mm256_sub_pd(mc_adv_absdev4(a, vmsi), si),
                          mc_adv_fabs4(_mm256_sub_pd(vmsi, vme))),
            _mm256_sub_pd(mc_adv_fvi4(a, i), mc_adv_fabs4(_mm256_sub_pd(vi, vme))));
        di = _mm256_add_pd(di, _mm256_sub_pd(
            _mm256_sub_pd(_mm256_sub_pd(fup, mc_adv_fabs4(_mm256_sub_pd(vss, vi))), sme),
            _mm256_sub_pd(fme, mc_adv_fabs4(_mm256_sub_pd(vs, vi)))));
        di = _mm256_add_pd(di, _mm256_sub_pd(mc_adv_fabs4(_mm256_sub_pd(vmsi, vss)),
                                             mc_adv_fabs4(_mm256_sub_pd(vi, vs))));
        out = _mm256_sub_pd(_mm256_mul_pd(nn, di), mc_adv_cost4(a, si, a->scost));
        kn = mc_adv_known4(a, i);
        out = _mm256_blendv_pd(_mm256_set1_pd(-a->cstl), out, kn);
        ok = _mm256_cmp_pd(_mm256_loadu_pd(a->ps + i), zero, _CMP_GT_OQ);
        _mm256_storeu_pd(st + i, _mm256_and_pd(out, ok));
    }
}
#endif

/* am[i] (migrate) and st[i] (steal) for every i != me; am[me] and st[me] are left 0.0 for
   the caller. An actor that took no decision (do_mig, do_stl) gets 0.0 throughout. */
static inline void mc_adv_outcomes(const mc_adv_in *a, double *am, double *st) {
    int i = 0, n = a->n;
#if MC_ADV_AVX2
    static int avx2 = -1;
    if (avx2 < 0) {
        __builtin_cpu_init();
        avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    if (avx2 && !mc_adv_scalar) {
        int n4 = n & ~3;
        if (a->do_mig) mc_adv_mig_avx2(a, am, n4);
        else for (int j = 0; j < n4; j++) am[j] = 0.0;
        if (a->do_stl) mc_adv_stl_avx2(a, st, n4);
        else for (int j = 0; j < n4; j++) st[j] = 0.0;
        am[a->me] = st[a->me] = 0.0;
        i = n4;
    }
#endif
    for (; i < n; i++) {
        am[i] = mc_adv_mig_one(a, i);
        st[i] = mc_adv_stl_one(a, i);
    }
}
#endif
