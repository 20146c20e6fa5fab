/* Plain-C floors for the policy hot path (copied from the project's shared tools so that the
   project does not depend on them), measured in the same run as the project by
   `malcolm bench micro --floor`. Prints JSON: sample_ns.N, incremental_ns.N, rebuild_ns.N. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static uint64_t s[4] = {0x9E3779B97F4A7C15ull, 0xBF58476D1CE4E5B9ull, 0x94D049BB133111EBull, 1};
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static inline uint64_t next(void) {
  uint64_t r = s[0] + s[3], t = s[1] << 17;
  s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
  return r;
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

static double best(double (*f)(int, long), int n, long iters) {
  double b = 1e18;
  for (int r = 0; r < 7; r++) { double v = f(n, iters); if (v < b) b = v; }
  return b;
}
static double cdf[64], W[64 * 64], f[64], x[64];
static volatile uint64_t sink;

static double bench_sample(int n, long iters) {  /* branch-free linear scan over a CDF */
  for (int i = 0; i < n; i++) cdf[i] = (i + 1.0) / n;
  uint64_t acc = 0; double t0 = now();
  for (long k = 0; k < iters; k++) {
    double u = (next() >> 11) * 0x1.0p-53; int idx = 0;
    for (int i = 0; i < n - 1; i++) idx += (u >= cdf[i]);
    acc += idx;
  }
  double t = now() - t0; sink = acc; return t / iters;
}
static double bench_incr(int n, long iters) {  /* f += dx * col_j(W), column-major */
  for (int i = 0; i < n * n; i++) W[i] = 1e-3 * i;
  double t0 = now();
  for (long k = 0; k < iters; k++) {
    int j = k & (n - 1); double dx = 1e-6 * (k & 7);
    const double *c = W + (long)j * n;
    for (int i = 0; i < n; i++) f[i] += dx * c[i];
  }
  double t = now() - t0; sink = (uint64_t)f[0]; return t / iters;
}
static double bench_rebuild(int n, long iters) {  /* softmax into a CDF */
  for (int i = 0; i < n; i++) f[i] = 0.01 * i;
  double t0 = now();
  for (long k = 0; k < iters; k++) {
    f[k & (n - 1)] += 1e-9;
    double m = f[0]; for (int i = 1; i < n; i++) m = f[i] > m ? f[i] : m;
    double z = 0; for (int i = 0; i < n; i++) { x[i] = exp(f[i] - m); z += x[i]; }
    double c = 0, iz = 1.0 / z; for (int i = 0; i < n; i++) { c += x[i] * iz; cdf[i] = c; }
  }
  double t = now() - t0; sink = (uint64_t)(cdf[0] * 1e9); return t / iters;
}
int main(void) {
  int ns[] = {4, 8, 16, 32}; printf("{");
  for (int a = 0; a < 4; a++) {
    int n = ns[a];
    printf("%s\"sample_ns.%d\": %.3f, \"incremental_ns.%d\": %.3f, \"rebuild_ns.%d\": %.3f", a ? ", " : "",
           n, best(bench_sample, n, 2000000), n, best(bench_incr, n, 2000000), n, best(bench_rebuild, n, 500000));
  }
  printf("}\n"); return 0;
}
