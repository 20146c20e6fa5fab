/* Kernels of the actor-critic's publish step (malcolm/policy/actor_critic.pyx, _publish).
 *
 * Plain C so that GCC vectorizes them (see _ac_kernels.h for the same pattern). */
#ifndef MALCOLM_PUB_KERNELS_H
#define MALCOLM_PUB_KERNELS_H
#include "_native.h"
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
#define MC_PUB_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MC_PUB_CLONES
#endif

/* p = w * exp(g) / sum(w * exp(g)): the softmax of g + log(w), without the n logs.
   w_i = 0 masks outcome i (p_i = 0 exactly). The shift is the largest g over the
   unmasked outcomes, so every exponent is <= 0 for them; the masked ones are computed
   with a clamped exponent and multiplied by 0. The max and the sum run in four lanes
   (a sequential sum of 64 terms is a chain of 64 dependent adds). Returns 0, or -1
   (p untouched) when no outcome is left or the sum is not a positive finite number: the
   caller decides. */
static MC_PUB_CLONES int mc_pub_softmax_w(const double *restrict g, const double *restrict w,
                                          double *restrict p, int n) {
    double m0 = -1e300, m1 = -1e300, m2 = -1e300, m3 = -1e300, m, z;
    double z0 = 0.0, z1 = 0.0, z2 = 0.0, z3 = 0.0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        double a0 = w[i] > 0.0 ? g[i] : -1e300, a1 = w[i + 1] > 0.0 ? g[i + 1] : -1e300;
        double a2 = w[i + 2] > 0.0 ? g[i + 2] : -1e300, a3 = w[i + 3] > 0.0 ? g[i + 3] : -1e300;
        m0 = a0 > m0 ? a0 : m0;
        m1 = a1 > m1 ? a1 : m1;
        m2 = a2 > m2 ? a2 : m2;
        m3 = a3 > m3 ? a3 : m3;
    }
    for (; i < n; i++) m0 = (w[i] > 0.0 && g[i] > m0) ? g[i] : m0;
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    m = m2 > m0 ? m2 : m0;
    if (!(m > -1e300)) return -1;
    for (i = 0; i < n; i++) {
        double d = g[i] - m;
        p[i] = w[i] * mc_exp_nonpos(d < 0.0 ? d : 0.0);
    }
    for (i = 0; i + 4 <= n; i += 4) {
        z0 += p[i];
        z1 += p[i + 1];
        z2 += p[i + 2];
        z3 += p[i + 3];
    }
    for (; i < n; i++) z0 += p[i];
    z = (z0 + z1) + (z2 + z3);
    if (!(z > 0.0) || !(z < 1e308)) return -1;
    z = 1.0 / z;
    for (i = 0; i < n; i++) p[i] *= z;
    return 0;
}
#endif
