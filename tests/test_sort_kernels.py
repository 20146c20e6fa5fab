"""The sort kernels' equivalence claims (``malcolm/policy/_sort_kernels.h``), checked in C.

``mc_sort_ranks`` must give every key its place in a stable sort (checked against a
pairwise count on key sets of 1..64 keys with many ties, zeros of both signs and
infinities: the eighth session's eight-keys-per-pass loop must not change a rank).
``mc_count_below64`` (the advantages' search over the sorted loads padded with +inf to 64
slots, seven fixed selects) must return what ``mc_count_below`` (the binary search it
replaces in ``_marginal_advantages``) returns for every sorted key set of 1..64 keys and any
query: ties, zeros of both signs, infinities, NaN. The simulator's fixed-seed runs depend
on it (docs/policy-log.md "Scale: earlier sessions", eighth session).
"""

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <stdint.h>
#include "policy/_sort_kernels.h"

static uint64_t st = 0x9E3779B97F4A7C15ull;
static double rnd(void) {
    st ^= st >> 12; st ^= st << 25; st ^= st >> 27;
    return (double)((st * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static int rint_(int m) { return (int)(rnd() * m); }
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void) {
    double v[64], pre[65];
    int rk[64];
    long bad = 0, checked = 0, sorted = 0;
    for (int t = 0; t < 100000; t++) {
        int k = 1 + rint_(64);
        for (int i = 0; i < k; i++) {
            int r = rint_(5);
            v[i] = r == 0 ? (double)rint_(4) : r == 1 ? -0.0 : r == 2 ? INFINITY : rnd() * 8;
        }
        mc_sort_ranks(v, rk, k);
        for (int i = 0; i < k; i++) {
            int c = 0;
            for (int j = 0; j < k; j++) c += v[j] < v[i] || (v[j] == v[i] && j < i);
            bad += rk[i] != c;
        }
        sorted++;
    }
    for (int t = 0; t < 200000; t++) {
        int k = 1 + rint_(64);
        for (int i = 0; i < k; i++) {
            int r = rint_(6);
            v[i] = r == 0 ? (double)rint_(5) : r == 1 ? -0.0 : r == 2 ? 0.0
                 : r == 3 ? 1e12 : rnd() * 8;
        }
        qsort(v, k, sizeof v[0], cmp);
        for (int i = k; i < 64; i++) v[i] = INFINITY;
        pre[0] = 0.0;
        for (int i = 0; i < k; i++) pre[i + 1] = pre[i] + v[i];
        for (int q = 0; q < 8; q++) {
            int r = rint_(7);
            double a = r == 0 ? v[rint_(k)] : r == 1 ? NAN : r == 2 ? -0.0 : r == 3 ? INFINITY
                     : r == 4 ? -1.0 : r == 5 ? nextafter(v[rint_(k)], 1e300) : rnd() * 9;
            double d1 = mc_absdev(v, pre, k, a), d2 = mc_absdev64(v, pre, k, a);
            checked++;
            bad += mc_count_below(v, k, a) != mc_count_below64(v, a);
            bad += !(d1 == d2 || (d1 != d1 && d2 != d2));
        }
    }
    printf("%ld %ld %ld\n", sorted, checked, bad);
    return bad != 0;
}
"""


def test_rank_sort_and_count_below64(c_program):
    out = c_program(PROGRAM, "sort", opt="-O2")
    sorted_, checked, bad = map(int, out.stdout.split())
    assert sorted_ == 100_000 and checked == 1_600_000
    assert bad == 0 and out.returncode == 0
