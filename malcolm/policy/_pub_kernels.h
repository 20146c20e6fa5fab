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
   with a clamped exponent and multiplied by 0. Returns 0, or -1 (p untouched) when no
   outcome is left or the sum is not a positive finite number: the caller decides. */
static MC_PUB_CLONES int mc_pub_softmax_w(const double *restrict g, const double *restrict w,
                                          double *restrict p, int n) {
    double m = -1e300, z = 0.0;
    int i;
    for (i = 0; i < n; i++) m = (w[i] > 0.0 && g[i] > m) ? g[i] : m;
    if (!(m > -1e300)) return -1;
    for (i = 0; i < n; i++) {
        double d = g[i] - m;
        p[i] = w[i] * mc_exp_nonpos(d < 0.0 ? d : 0.0);
    }
    for (i = 0; i < n; i++) z += p[i];
    if (!(z > 0.0) || !(z < 1e308)) return -1;
    z = 1.0 / z;
    for (i = 0; i < n; i++) p[i] *= z;
    return 0;
}
#endif
