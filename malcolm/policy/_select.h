/* The medians of the critic's consensus (malcolm/policy/actor_critic.pyx, _consensus):
 * 64 values per coordinate on a 64-server rack. A quickselect per coordinate replaced an
 * insertion sort (O(k) instead of O(k^2)); a sorting network of rows replaces both. */
#ifndef MALCOLM_SELECT_H
#define MALCOLM_SELECT_H

/* The coordinate-wise medians of k rows of MC_MED_W doubles at once (the consensus with
   d <= MC_MED_W critic features): the rows, padded with +inf to the next power of two,
   go through Batcher's odd-even merge sorting network, each comparator the lane-wise
   min and max of two rows. No branch depends on the values (the quickselect's
   partitions mispredicted about once per value, a seventh of the simulator's missed
   branches on 64 servers), and the five medians of the default critic share every
   comparator. The network sorts each lane, so lane l of row t is the t-th smallest of
   lane l's values: the median is the middle one, or for even k the mean of the two
   middle ones, 0.5 (a + b), with the bits the quickselect gave (values not NaN). r holds
   MC_MED_ROWS rows, its lanes past d unused; k <= MC_MED_ROWS. */
#define MC_MED_W 8
#define MC_MED_ROWS 64
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
#define MC_MED_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MC_MED_CLONES
#endif
_Static_assert(MC_MED_W == 8, "actor_critic's consensus steps by 8 coordinates");
typedef double mc_med_v4d __attribute__((vector_size(32)));
typedef long long mc_med_v4l __attribute__((vector_size(32)));
/* rows a, b <- their lane-wise min and max, y < x ? y : x and y < x ? x : y, as masks:
   GCC turned the ternaries on doubles into a branch per lane here. Equal values keep
   their rows (x stays low); they are the same number either way. */
static inline __attribute__((always_inline)) void mc_med_cx(double *a, double *b) {
    for (int h = 0; h < MC_MED_W; h += 4) {
        mc_med_v4d x, y;
        mc_med_v4l m, xl, yl, lo, hi;
        __builtin_memcpy(&x, a + h, sizeof x);
        __builtin_memcpy(&y, b + h, sizeof y);
        m = y < x;                      /* a true lane is all ones */
        xl = (mc_med_v4l)x;
        yl = (mc_med_v4l)y;
        lo = (yl & m) | (xl & ~m);
        hi = (xl & m) | (yl & ~m);
        __builtin_memcpy(a + h, &lo, sizeof lo);
        __builtin_memcpy(b + h, &hi, sizeof hi);
    }
}
/* Batcher's odd-even merge sort networks for 2, 4, ..., MC_MED_ROWS rows, as lists of
   comparators (row offsets in doubles, lower row first), filled once by mc_med_init: the
   network's index arithmetic and its tests, done per comparator, took most of the time and
   mispredicted on their irregular pattern. Network s (2^(s+1) rows) is
   mc_med_net[mc_med_at[s] .. mc_med_at[s + 1]); 543 comparators for 64 rows. A static
   table per module: each that calls mc_median_rows fills its copy at import. */
#define MC_MED_NETS 6
#define MC_MED_CMPS 822
static unsigned short mc_med_net[MC_MED_CMPS][2];
static int mc_med_at[MC_MED_NETS + 1];
_Static_assert(MC_MED_ROWS == 2 << (MC_MED_NETS - 1), "one network per power of two");
static inline __attribute__((unused)) void mc_med_init(void) {
    int s, n, p, q, j, i, c = 0;
    for (s = 0; s < MC_MED_NETS; s++) {
        n = 2 << s;
        mc_med_at[s] = c;
        for (p = 1; p < n; p <<= 1)
            for (q = p; q >= 1; q >>= 1)
                for (j = q % p; j + q < n; j += 2 * q)
                    for (i = 0; i < q && i + j + q < n; i++)
                        if ((i + j) / (2 * p) == (i + j + q) / (2 * p) && c < MC_MED_CMPS) {
                            mc_med_net[c][0] = (unsigned short)((i + j) * MC_MED_W);
                            mc_med_net[c][1] = (unsigned short)((i + j + q) * MC_MED_W);
                            c++;
                        }
    }
    mc_med_at[MC_MED_NETS] = c;
}
static MC_MED_CLONES void mc_median_rows(double *r, int k, int d, double *out) {
    int n = 2, s = 0, c, e, h = k >> 1, i, l;
    if (__builtin_expect(mc_med_at[MC_MED_NETS] == 0, 0))
        mc_med_init();              /* a module that did not call it at import */
    while (n < k) {
        n <<= 1;
        s++;
    }
    for (i = k; i < n; i++)
        for (l = 0; l < MC_MED_W; l++) r[i * MC_MED_W + l] = __builtin_inf();
    for (c = mc_med_at[s], e = mc_med_at[s + 1]; c < e; c++)
        mc_med_cx(r + mc_med_net[c][0], r + mc_med_net[c][1]);
    for (l = 0; l < d; l++)
        out[l] = (k & 1) ? r[h * MC_MED_W + l]
                         : 0.5 * (r[(h - 1) * MC_MED_W + l] + r[h * MC_MED_W + l]);
}
#endif
