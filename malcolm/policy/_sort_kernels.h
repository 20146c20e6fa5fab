/* Sorting the known loads (malcolm/policy/agent_state.pyx, _sort_loads).
 *
 * A rank sort: each key's place is the number of keys before it in sorted order, counted
 * with comparisons that vectorize (O(k^2) compares, but no data-dependent branch and no
 * dependency chain). On a 64-server rack, whose loads change order between two sorts, it
 * takes about 0.4 us where the insertion sort it replaces took 1.1 us and a branch-free
 * merge sort 2 us (bench: docs/policy-log.md "Scale: earlier sessions"). Stable;
 * k <= MC_SORT_MAX. */
#ifndef MALCOLM_SORT_KERNELS_H
#define MALCOLM_SORT_KERNELS_H
#include <math.h>

#define MC_SORT_MAX 64

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
#define MC_SORT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MC_SORT_CLONES
#endif

typedef double mc_sort_v4d __attribute__((vector_size(32)));
typedef long long mc_sort_v4l __attribute__((vector_size(32)));

/* rk[i] <- the number of keys that sort before key i: smaller ones, and equal ones at a
   lower index (so the ranks are a permutation and the sort is stable). Counted as
   #{j : key[j] < key[i]} over all keys, in one loop over a copy padded with +inf to a
   multiple of 4 (4-lane compares, no scalar tail per i, eight keys i per pass), plus the
   equal keys at lower indices, handed out in a second O(k) pass: equal keys have equal
   counts of smaller keys and different keys different counts, so fill[c] numbers the keys
   equal to one value in index order. The same ranks as comparing each pair with <= below i
   and < from i on, in about half the instructions (docs/policy-log.md "Scale:
   earlier sessions", sixth session). */
static MC_SORT_CLONES void mc_sort_ranks(const double *restrict key, int *restrict rk, int k) {
    double kp[MC_SORT_MAX] __attribute__((aligned(32)));
    int lt[MC_SORT_MAX], fill[MC_SORT_MAX];
    int i, j, m = (k + 3) & ~3;
    for (i = 0; i < k; i++) kp[i] = key[i];
    for (; i < m; i++) kp[i] = __builtin_inf();    /* never below a key (keys not NaN) */
    /* eight keys i at a time (four while fewer than eight are left), each 4-lane load of
       the keys j compared with all of them (the padding keys' counts are computed and
       never read) */
    for (i = 0; i + 8 <= m; i += 8) {
        mc_sort_v4d k0 = {kp[i], kp[i], kp[i], kp[i]};
        mc_sort_v4d k1 = {kp[i + 1], kp[i + 1], kp[i + 1], kp[i + 1]};
        mc_sort_v4d k2 = {kp[i + 2], kp[i + 2], kp[i + 2], kp[i + 2]};
        mc_sort_v4d k3 = {kp[i + 3], kp[i + 3], kp[i + 3], kp[i + 3]};
        mc_sort_v4d k4 = {kp[i + 4], kp[i + 4], kp[i + 4], kp[i + 4]};
        mc_sort_v4d k5 = {kp[i + 5], kp[i + 5], kp[i + 5], kp[i + 5]};
        mc_sort_v4d k6 = {kp[i + 6], kp[i + 6], kp[i + 6], kp[i + 6]};
        mc_sort_v4d k7 = {kp[i + 7], kp[i + 7], kp[i + 7], kp[i + 7]};
        mc_sort_v4l c0 = {0, 0, 0, 0}, c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
                    c7 = c0;
        for (j = 0; j < m; j += 4) {
            mc_sort_v4d a;
            __builtin_memcpy(&a, kp + j, sizeof a);
            c0 -= (mc_sort_v4l)(a < k0);      /* a true lane is -1 */
            c1 -= (mc_sort_v4l)(a < k1);
            c2 -= (mc_sort_v4l)(a < k2);
            c3 -= (mc_sort_v4l)(a < k3);
            c4 -= (mc_sort_v4l)(a < k4);
            c5 -= (mc_sort_v4l)(a < k5);
            c6 -= (mc_sort_v4l)(a < k6);
            c7 -= (mc_sort_v4l)(a < k7);
        }
        lt[i] = (int)(c0[0] + c0[1] + c0[2] + c0[3]);
        lt[i + 1] = (int)(c1[0] + c1[1] + c1[2] + c1[3]);
        lt[i + 2] = (int)(c2[0] + c2[1] + c2[2] + c2[3]);
        lt[i + 3] = (int)(c3[0] + c3[1] + c3[2] + c3[3]);
        lt[i + 4] = (int)(c4[0] + c4[1] + c4[2] + c4[3]);
        lt[i + 5] = (int)(c5[0] + c5[1] + c5[2] + c5[3]);
        lt[i + 6] = (int)(c6[0] + c6[1] + c6[2] + c6[3]);
        lt[i + 7] = (int)(c7[0] + c7[1] + c7[2] + c7[3]);
    }
    for (; i < m; i += 4) {
        mc_sort_v4d k0 = {kp[i], kp[i], kp[i], kp[i]};
        mc_sort_v4d k1 = {kp[i + 1], kp[i + 1], kp[i + 1], kp[i + 1]};
        mc_sort_v4d k2 = {kp[i + 2], kp[i + 2], kp[i + 2], kp[i + 2]};
        mc_sort_v4d k3 = {kp[i + 3], kp[i + 3], kp[i + 3], kp[i + 3]};
        mc_sort_v4l c0 = {0, 0, 0, 0}, c1 = c0, c2 = c0, c3 = c0;
        for (j = 0; j < m; j += 4) {
            mc_sort_v4d a;
            __builtin_memcpy(&a, kp + j, sizeof a);
            c0 -= (mc_sort_v4l)(a < k0);      /* a true lane is -1 */
            c1 -= (mc_sort_v4l)(a < k1);
            c2 -= (mc_sort_v4l)(a < k2);
            c3 -= (mc_sort_v4l)(a < k3);
        }
        lt[i] = (int)(c0[0] + c0[1] + c0[2] + c0[3]);
        lt[i + 1] = (int)(c1[0] + c1[1] + c1[2] + c1[3]);
        lt[i + 2] = (int)(c2[0] + c2[1] + c2[2] + c2[3]);
        lt[i + 3] = (int)(c3[0] + c3[1] + c3[2] + c3[3]);
    }
    for (i = 0; i < k; i++) fill[i] = 0;
    for (i = 0; i < k; i++) {
        int c = lt[i];
        rk[i] = c + fill[c]++;
    }
}

/* Sorts key[0..k-1] ascending, moving idx[] with it; k <= MC_SORT_MAX, keys not NaN. */
static inline void mc_sort_pairs(double *restrict key, int *restrict idx, int k) {
    double kt[MC_SORT_MAX];
    int it[MC_SORT_MAX], rk[MC_SORT_MAX], i;
    if (k < 2) return;
    mc_sort_ranks(key, rk, k);
    for (i = 0; i < k; i++) { kt[rk[i]] = key[i]; it[rk[i]] = idx[i]; }
    for (i = 0; i < k; i++) { key[i] = kt[i]; idx[i] = it[i]; }
}

/* The number of keys v[0..k-1] (sorted ascending) that are < a: a binary search whose
   steps select with conditional moves instead of branching (the walk from a hint it
   replaces mispredicted on most of its steps). */
static inline int mc_count_below(const double *v, int k, double a) {
    const double *base = v;
    int len = k;
    if (len <= 0) return 0;
    while (len > 1) {
        int half = len >> 1;
        base = base[half] < a ? base + half : base;
        len -= half;
    }
    return (int)(base - v) + (base[0] < a);
}
/* The same count for v[0..MC_SORT_MAX) sorted with +inf after its k keys (_sort_loads
   pads srt so): no padding slot is below any a, NaN included. Seven fixed selects of a
   search over 64 slots, where mc_count_below's loop takes 9 instructions per step (its
   steps were most of _marginal_advantages' 2n searches per sampled window). */
_Static_assert(MC_SORT_MAX == 64, "mc_count_below64 searches exactly 64 slots");
static inline int mc_count_below64(const double *v, double a) {
    /* index arithmetic on the compares (SETcc): GCC compiles pointer selects here into
       branches, which mispredict on every other step (10% slower loop_s, same counts) */
    int b = 0;
    b += v[b + 31] < a ? 32 : 0;
    b += v[b + 15] < a ? 16 : 0;
    b += v[b + 7] < a ? 8 : 0;
    b += v[b + 3] < a ? 4 : 0;
    b += v[b + 1] < a ? 2 : 0;
    b += v[b] < a ? 1 : 0;
    return b + (v[b] < a);
}
/* sum_k |a - v_k| over the sorted v[0..k-1] with prefix sums pre[0..k], given lo = the
   number of v_k below a: the one expression of this sum, so that _marginal_advantages'
   O(n) pass (which knows lo) and mc_absdev (which searches for it) give the same bits. */
static inline double mc_absdev_at(const double *pre, int k, double a, int lo) {
    return (a * lo - pre[lo]) + (pre[k] - pre[lo] - a * (k - lo));
}

/* the same sum for any a (AgentState._marginal_advantages, 2n + 1 per sampled window) */
static inline double mc_absdev(const double *v, const double *pre, int k, double a) {
    return mc_absdev_at(pre, k, a, mc_count_below(v, k, a));
}
/* the same, v padded with +inf to MC_SORT_MAX slots: mc_count_below64 above 32 keys, where
   its seven steps are fewer than the loop's; below, the loop's log2(k) steps (the same
   count either way; a 4- or 8-server window was 7-9% slower with the fixed search) */
static inline double mc_absdev64(const double *v, const double *pre, int k, double a) {
    return mc_absdev_at(pre, k, a, k > 32 ? mc_count_below64(v, a) : mc_count_below(v, k, a));
}

/* The herd term (AgentState._marginal_advantages, herd > 0): peer i's load raised by what
   it would receive if every agent of the rack migrated as this one does, dh_i = (hq p_i -
   hc r_i) s_i, where p is the published migrate distribution, r the peers' rates and s_i
   one task at i. Its two scales: hq = hm / (1 - p_me) turns p_i into this agent's share
   of its migrations, hc = hm / sum_{j != me} r_j gives i's capacity share, and hm = herd
   times the rack's migrations in the last window times the peers' busy share to the power
   herd_busy (mc_busy_share). 0 where a share is undefined. */
static inline void mc_herd_scales(const double *p, const double *r, int n, int me, double hm,
                                  double *hq, double *hc) {
    double q = 1.0 - p[me], c = 0.0;
    for (int j = 0; j < n; j++) c += j != me ? r[j] : 0.0;
    *hq = q > 1e-9 ? hm / q : 0.0;
    *hc = c > 0.0 ? hm / c : 0.0;
}

/* sum_{k != i} |v_i + dh + s - v_k| - |v_i + dh - v_k|: one task of load s joining server
   i after the herd raised its load by dh, over the sorted loads v (which hold v_i itself,
   whose own term |dh + s| - |dh| is taken off). */
static inline double mc_absdev_step64(const double *v, const double *pre, int k, double vi,
                                      double s, double dh) {
    return (mc_absdev64(v, pre, k, vi + dh + s) - mc_absdev64(v, pre, k, vi + dh))
           - (fabs(dh + s) - fabs(dh));
}
#endif
