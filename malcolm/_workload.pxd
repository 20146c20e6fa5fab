# cython: language_level=3
"""Native, nogil sampler of a service-time mixture (see ``malcolm.workloads``).

Times are nanoseconds. The struct is plain C memory with no pointers, so it can be copied
or embedded by value (the simulator keeps one; the load generator may keep one per thread).
"""
from malcolm._core cimport Rng

cdef enum:
    WL_MAX = 16
    WL_CONST = 0
    WL_EXP = 1
    WL_UNIFORM = 2
    WL_LOGNORMAL = 3
    WL_EMPIRICAL = 4        # piecewise-linear quantile function (a measured distribution)
    WL_EMP_POINTS = 24      # at most this many (probability, value) points per component


ctypedef struct WorkloadC:
    int n                   # components (task types)
    int _pad
    double cdf[WL_MAX]      # cumulative weights, cdf[n-1] == 1
    int kind[WL_MAX]
    double a[WL_MAX]        # ns: const value / exp mean / uniform low / lognormal log-mean
    double b[WL_MAX]        # ns: uniform high; lognormal shape sigma (dimensionless)
    double mean_ns          # mixture mean
    int emp_n[WL_MAX]       # empirical: number of points (>= 2)
    double emp_p[WL_MAX][WL_EMP_POINTS]   # increasing probabilities, 0 first, 1 last
    double emp_x[WL_MAX][WL_EMP_POINTS]   # ns: the quantile at each probability


cdef double wl_sample(const WorkloadC* w, Rng* r, int* task_type) noexcept nogil


cdef class NativeWorkload:
    cdef WorkloadC c
