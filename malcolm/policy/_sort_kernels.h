/* Sorting the known loads (malcolm/policy/agent_state.pyx, _sort_loads).
 *
 * A rank sort: each key's place is the number of keys before it in sorted order, counted
 * with comparisons that vectorize (O(k^2) compares, but no data-dependent branch and no
 * dependency chain). On a 64-server rack, whose loads change order between two sorts, it
 * takes about 0.4 us where the insertion sort it replaces took 1.1 us and a branch-free
 * merge sort 2 us (bench: docs/policy.md "Scale"). Stable; k <= MC_SORT_MAX. */
#ifndef MALCOLM_SORT_KERNELS_H
#define MALCOLM_SORT_KERNELS_H

#define MC_SORT_MAX 64

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
#define MC_SORT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MC_SORT_CLONES
#endif

/* rk[i] <- the number of keys that sort before key i: smaller ones, and equal ones at a
   lower index (so the ranks are a permutation and the sort is stable). */
static MC_SORT_CLONES void mc_sort_ranks(const double *restrict key, int *restrict rk, int k) {
    for (int i = 0; i < k; i++) {
        double ki = key[i];
        long c = 0;
        for (int j = 0; j < i; j++) c += key[j] <= ki;
        for (int j = i; j < k; j++) c += key[j] < ki;
        rk[i] = (int)c;
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
#endif
