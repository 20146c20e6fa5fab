# cython: language_level=3
"""Native, nogil sampler of a service-time mixture. Build it from Python with
``malcolm.workloads.parse_workload(spec).native()``."""
from libc.math cimport cos, exp, log, sqrt, M_PI

import numpy as np

from malcolm._core cimport Rng, rng_exponential, rng_seed, rng_uniform


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
        return rng_exponential(r, w.a[t])
    if k == WL_CONST:
        return w.a[t]
    if k == WL_UNIFORM:
        return w.a[t] + (w.b[t] - w.a[t]) * rng_uniform(r)
    if k == WL_EMPIRICAL:
        # inverse CDF, linear between quantiles: continuous, from the smallest to the
        # largest measured time
        z = rng_uniform(r) * (WL_EMP_N - 1)
        i = <int>z
        k = w.emp_slot[t]
        if i >= WL_EMP_N - 1:
            return w.emp[k][WL_EMP_N - 1]
        return w.emp[k][i] + (z - i) * (w.emp[k][i + 1] - w.emp[k][i])
    # Lognormal: Box-Muller for the normal (one of the pair is dropped; cheap enough);
    # -2 ln(1 - u) is twice a unit exponential, bit for bit.
    z = sqrt(2.0 * rng_exponential(r, 1.0)) * cos(2.0 * M_PI * rng_uniform(r))
    return exp(w.a[t] + w.b[t] * z)


cdef class NativeWorkload:
    """A mixture in C memory. Parameters as in ``malcolm.workloads.Component`` (µs).

    Parameters
    ----------
    weights : sequence of float
    kinds : sequence of int
        0 const, 1 exp, 2 uniform, 3 lognormal, 4 empirical.
    a, b : sequence of float
        Component parameters in µs (lognormal: mean in µs and shape sigma; empirical: its
        mean, unused).
    table : sequence of float, optional
        The empirical component's ``WL_EMP_N`` quantiles in µs, non-decreasing.
    tables : sequence of sequences, optional
        Instead of ``table`` when there are several: one table per empirical component, in
        component order (at most ``WL_EMP_MAX``).
    """

    def __init__(self, weights, kinds, a, b, table=None, tables=None):
        cdef int n = len(weights), i, n_emp = 0
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
                if tables is not None:
                    table = tables[n_emp] if n_emp < len(tables) else None
                self.c.emp_slot[i] = n_emp
                m = self._set_table(table, n_emp)
                n_emp += 1
                self.c.a[i] = m * 1e3
                self.c.b[i] = 0.0
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

    cdef double _set_table(self, table, int n_emp) except -1.0:
        """Store the empirical quantiles (µs) in ns; return their distribution's mean (µs)."""
        cdef int j
        if n_emp >= WL_EMP_MAX:
            raise ValueError(f"at most {WL_EMP_MAX} components of a workload can be empirical")
        if table is None or len(table) != WL_EMP_N:
            raise ValueError(f"an empirical component needs {WL_EMP_N} quantiles")
        q = np.asarray(table, dtype=np.float64)
        if not np.all(np.isfinite(q)) or q[0] < 0 or np.any(np.diff(q) < 0):
            raise ValueError("empirical quantiles must be finite, >= 0 and non-decreasing")
        for j in range(WL_EMP_N):
            self.c.emp[n_emp][j] = q[j] * 1e3
        # mean of the piecewise-linear inverse CDF that wl_sample draws from
        return float((q.sum() - 0.5 * (q[0] + q[WL_EMP_N - 1])) / (WL_EMP_N - 1))

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
