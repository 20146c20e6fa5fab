# cython: language_level=3
"""Native, nogil sampler of a service-time mixture. Build it from Python with
``malcolm.workloads.parse_workload(spec).native()``."""
from libc.math cimport cos, exp, log, sqrt, M_PI

import numpy as np

from malcolm._core cimport Rng, rng_seed, rng_uniform


cdef double wl_sample(const WorkloadC* w, Rng* r, int* task_type) noexcept nogil:
    """Draw one task: its type into ``task_type``, its service time (ns) as the result."""
    cdef double u = rng_uniform(r)
    cdef int t = 0, i, k
    cdef double z
    for i in range(w.n - 1):        # branch-free scan; n <= 16
        t += u >= w.cdf[i]
    task_type[0] = t
    k = w.kind[t]
    if k == WL_EXP:
        # inline rather than _core.rng_exponential: cross-module cdef calls are indirect
        return -w.a[t] * log(1.0 - rng_uniform(r))
    if k == WL_CONST:
        return w.a[t]
    if k == WL_UNIFORM:
        return w.a[t] + (w.b[t] - w.a[t]) * rng_uniform(r)
    if k == WL_EMPIRICAL:
        return _emp_sample(w, t, rng_uniform(r))
    # Lognormal: Box-Muller for the normal (one of the pair is dropped; cheap enough).
    z = sqrt(-2.0 * log(1.0 - rng_uniform(r))) * cos(2.0 * M_PI * rng_uniform(r))
    return exp(w.a[t] + w.b[t] * z)


cdef inline double _emp_sample(const WorkloadC* w, int t, double u) noexcept nogil:
    """Inverse of the piecewise-linear CDF through the measured quantiles."""
    cdef int i = 1, n = w.emp_n[t]
    cdef double p0, p1
    while i < n - 1 and w.emp_p[t][i] <= u:
        i += 1
    p0 = w.emp_p[t][i - 1]
    p1 = w.emp_p[t][i]
    if p1 <= p0:
        return w.emp_x[t][i]
    return w.emp_x[t][i - 1] + (w.emp_x[t][i] - w.emp_x[t][i - 1]) * (u - p0) / (p1 - p0)


cdef class NativeWorkload:
    """A mixture in C memory. Parameters as in ``malcolm.workloads.Component`` (µs).

    Parameters
    ----------
    weights : sequence of float
    kinds : sequence of int
        0 const, 1 exp, 2 uniform, 3 lognormal, 4 empirical.
    a, b : sequence of float
        Component parameters in µs (lognormal: mean in µs and shape sigma; empirical: the
        mean in µs, and unused).
    tables : sequence or None
        Empirical components: ``((p, x_us), ...)`` with p from 0 to 1 increasing and x
        non-decreasing (``None`` or empty for the other kinds).
    """

    def __init__(self, weights, kinds, a, b, tables=None):
        cdef int n = len(weights), i
        if not 1 <= n <= WL_MAX:
            raise ValueError(f"a workload has 1..{WL_MAX} components, got {n}")
        if not (len(kinds) == len(a) == len(b) == n):
            raise ValueError("weights, kinds, a and b must have the same length")
        tot = float(sum(weights))
        if not tot > 0 or any(not x > 0 for x in weights):
            raise ValueError("weights must be positive")
        self.c.n = n
        acc = 0.0
        mean = 0.0
        for i in range(n):
            acc += weights[i] / tot
            self.c.cdf[i] = acc
            k = int(kinds[i])
            if not 0 <= k <= 4:
                raise ValueError(f"unknown component kind {k}")
            self.c.kind[i] = k
            if k == WL_EMPIRICAL:
                tab = list(tables[i]) if tables is not None and tables[i] else []
                if not 2 <= len(tab) <= WL_EMP_POINTS:
                    raise ValueError(f"an empirical component needs 2..{WL_EMP_POINTS} "
                                     "(p, value) points")
                ps = [float(p) for p, _ in tab]
                xs = [float(x) for _, x in tab]
                # (ps[len(ps) - 1]: this module is built without wraparound)
                if (ps[0] != 0.0 or ps[len(ps) - 1] != 1.0 or xs[0] < 0
                        or any(q <= p for p, q in zip(ps, ps[1:]))
                        or any(y < x for x, y in zip(xs, xs[1:]))):
                    raise ValueError("empirical points: p must rise from 0 to 1 and the "
                                     "values must be >= 0 and non-decreasing")
                self.c.emp_n[i] = len(tab)
                for j in range(len(tab)):
                    self.c.emp_p[i][j] = ps[j]
                    self.c.emp_x[i][j] = xs[j] * 1e3
                self.c.a[i] = 0.0
                self.c.b[i] = 0.0
                m = sum((ps[j + 1] - ps[j]) * (xs[j] + xs[j + 1]) / 2
                        for j in range(len(tab) - 1))
            elif k == WL_LOGNORMAL:
                s = float(b[i])
                self.c.a[i] = log(float(a[i]) * 1e3) - 0.5 * s * s
                self.c.b[i] = s
                m = float(a[i])
            else:
                self.c.a[i] = float(a[i]) * 1e3
                self.c.b[i] = float(b[i]) * 1e3
                m = 0.5 * (a[i] + b[i]) if k == WL_UNIFORM else float(a[i])
            mean += weights[i] / tot * m
        self.c.cdf[n - 1] = 1.0
        self.c.mean_ns = mean * 1e3

    @property
    def n_types(self):
        return self.c.n

    @property
    def mean_ns(self):
        return self.c.mean_ns

    def sample(self, Py_ssize_t n, unsigned long long seed=0, unsigned long long stream=0):
        """Draw ``n`` tasks: returns ``(types int32, service_ns float64)``."""
        cdef Rng r
        cdef Py_ssize_t i
        cdef int t
        types = np.empty(n, dtype=np.int32)
        svc = np.empty(n, dtype=np.float64)
        cdef int[::1] tv = types
        cdef double[::1] sv = svc
        rng_seed(&r, seed, stream)
        with nogil:
            for i in range(n):
                sv[i] = wl_sample(&self.c, &r, &t)
                tv[i] = t
        return types, svc
