/* The median of a small array by quickselect, for the critic's consensus
 * (malcolm/policy/actor_critic.pyx, _consensus): O(k) expected instead of the O(k^2)
 * insertion sort it replaces (64 values per coordinate on a 64-server rack). */
#ifndef MALCOLM_SELECT_H
#define MALCOLM_SELECT_H

/* Rearranges a[0..k-1] so that a[t] is the t-th smallest value (0-based), everything
   before it <= a[t] and everything after it >= a[t]. Values must not be NaN. */
static inline void mc_select(double *a, int k, int t) {
    int lo = 0, hi = k - 1;
    while (hi > lo) {
        /* median of three as the pivot: sorted or reversed input stays O(k) */
        int mid = lo + ((hi - lo) >> 1);
        double x, tmp;
        if (a[mid] < a[lo]) { tmp = a[mid]; a[mid] = a[lo]; a[lo] = tmp; }
        if (a[hi] < a[lo]) { tmp = a[hi]; a[hi] = a[lo]; a[lo] = tmp; }
        if (a[hi] < a[mid]) { tmp = a[hi]; a[hi] = a[mid]; a[mid] = tmp; }
        x = a[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i] < x) i++;
            while (a[j] > x) j--;
            if (i <= j) { tmp = a[i]; a[i] = a[j]; a[j] = tmp; i++; j--; }
        }
        /* now a[lo..j] <= x <= a[i..hi], and a[j+1..i-1] == x */
        if (t <= j) hi = j;
        else if (t >= i) lo = i;
        else return;
    }
}

/* The median of a[0..k-1] (k >= 1): the middle value, or the mean of the two middle ones
   for even k, exactly as a sort would give it. Reorders a. */
static inline double mc_median(double *a, int k) {
    int h = k >> 1, i;
    double lo;
    mc_select(a, k, h);
    if (k & 1) return a[h];
    lo = a[0];                      /* the largest of a[0..h-1] is the (h-1)-th smallest */
    for (i = 1; i < h; i++) lo = a[i] > lo ? a[i] : lo;
    return 0.5 * (lo + a[h]);
}
#endif
