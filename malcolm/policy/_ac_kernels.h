/* AdamW and rank-1 kernels of the actor-critic (malcolm/policy/actor_critic.pyx).
 *
 * Plain C so that GCC vectorizes them: `restrict` pointers, no aliasing, contiguous or
 * fixed-stride loops. Declared to Cython in actor_critic.pyx. */
#ifndef MALCOLM_AC_KERNELS_H
#define MALCOLM_AC_KERNELS_H
/* The per-parameter kernels, with `restrict` so that they vectorize; on x86-64 GCC also
   builds an AVX2+FMA clone picked at load time, so the wheel stays portable. */
#include <math.h>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
#define MC_AC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MC_AC_CLONES
#endif
/* One parameter's AdamW step: decay, moments, bias-corrected update, gradient cleared.
   `static inline`, so both loops below compile it in place (and the contiguous one still
   vectorizes): the arithmetic is written once.
   kb > 0 (`lr_boost` - 1, the actors only): the step is multiplied by 1 + kb q^2, q =
   min(1, d^2), d = m^ / (sqrt(v^) + eps) Adam's own direction. |d| is near 1 when the
   recent gradients agree in sign and size and about sqrt((1 - b1) / (1 + b1)) = 0.23 for
   zero-mean noise (b1 = 0.9), so the step grows up to lr_boost times where there is
   something to learn, and on steady noise its mean size by about 1 + 8 kb 0.053^2 = 1 +
   kb / 45 (E|d|^5 / E|d| = 8 s^4 for Gaussian d). Adam's bias correction makes d near 1
   for the first few steps of any parameter, so a cold start takes boosted steps on noise
   too (tests/test_lr_boost.py). kb = 0 computes the same bits as without the boost. */
static inline __attribute__((always_inline)) void mc_ac_adamw_at(double *restrict p,
        double *restrict g, double *restrict m, double *restrict v, long i, double lr,
        double decay, double b1, double b2, double c1, double c2, double eps, double inv_b,
        double kb) {
    double gi = g[i] * inv_b;
    double mi = b1 * m[i] + (1.0 - b1) * gi;
    double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
    double den = sqrt(vi) * c2 + eps;
    double st = lr * (mi * c1) / den;     /* not lr * d: kb = 0 keeps plain AdamW's bits */
    m[i] = mi;
    v[i] = vi;
    if (kb > 0.0) {
        double d = (mi * c1) / den;
        double q = d * d;
        /* min(1, d^2) as a select, not fmin (a libm call per parameter that kept this loop
           scalar); the same value, NaN included (fmin(1, NaN) = 1 = the select's) */
        q = q < 1.0 ? q : 1.0;
        st *= 1.0 + kb * q * q;
    }
    p[i] = p[i] * decay - st;
    g[i] = 0.0;
}
static MC_AC_CLONES void mc_ac_adamw(double *restrict p, double *restrict g,
        double *restrict m, double *restrict v, int n, double lr, double decay,
        double b1, double b2, double c1, double c2, double eps, double inv_b, double kb) {
    for (int i = 0; i < n; i++)
        mc_ac_adamw_at(p, g, m, v, i, lr, decay, b1, b2, c1, c2, eps, inv_b, kb);
}
/* gw (column-major n x n) += coef u^T */
static MC_AC_CLONES void mc_ac_rank1(double *restrict gw, const double *restrict u,
        const double *restrict coef, int n) {
    for (int j = 0; j < n; j++) {
        double uj = u[j];
        double *restrict col = gw + (long)j * n;
        for (int i = 0; i < n; i++) col[i] += uj * coef[i];
    }
}
/* The actors' per-window gradient loops (MalcolmPolicy._learn_window), in C so that the
   element-wise ones vectorize (restrict; the Cython loops could not be). Not cloned for
   AVX2: FMA contraction would change the bits of what the Cython loops computed; the sums
   stay sequential, in their order. */
/* coef_i = -p_i (a_i - p . a): the difference advantage's descent gradient */
static inline void mc_ac_adv_coef(const double *restrict p, const double *restrict a,
                                  double *restrict coef, int n) {
    double abar = 0.0;
    for (int i = 0; i < n; i++) abar += p[i] * a[i];
    for (int i = 0; i < n; i++) coef[i] = -p[i] * (a[i] - abar);
}
/* coef_i += ent p_i (log p_i + H): - entropy * H(pi), the thesis's entropy bonus */
static inline void mc_ac_ent_coef(const double *restrict p, double *restrict coef, int n,
                                  double ent) {
    double h = 0.0;
    for (int i = 0; i < n; i++)
        if (p[i] > 1e-300) h -= p[i] * log(p[i]);
    for (int i = 0; i < n; i++)
        if (p[i] > 1e-300) coef[i] += ent * p[i] * (log(p[i]) + h);
}
/* coef_i += ent p_i (g_i - p . g): entropy * KL(pi || pi_safe) */
static inline void mc_ac_kl_coef(const double *restrict p, const double *restrict g,
                                 double *restrict coef, int n, double ent) {
    double h = 0.0;
    for (int i = 0; i < n; i++) h += p[i] * g[i];
    for (int i = 0; i < n; i++) coef[i] += ent * p[i] * (g[i] - h);
}
/* The sparse actor's gradients: B_i += coef_i, W_ii += coef_i z_i (gd), W_i,me += coef_i
   z_me for i != me (gw, column me) */
static inline void mc_ac_sparse_grad(const double *restrict coef, const double *restrict z,
                                     double *restrict gb, double *restrict gd,
                                     double *restrict gw, int n, int me) {
    double zme = z[me], keep = gw[me];
    for (int i = 0; i < n; i++) gb[i] += coef[i];
    for (int i = 0; i < n; i++) gd[i] += coef[i] * z[i];
    for (int i = 0; i < n; i++) gw[i] += coef[i] * zme;
    gw[me] = keep;          /* W_me,me is the diagonal's (gd) */
}
#endif
