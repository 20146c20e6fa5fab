# cython: language_level=3
"""Native, nogil sampler of a service-time mixture (see ``malcolm.workloads``).

Times are nanoseconds. The struct is plain C memory with no pointers, so it can be copied
or embedded by value (the simulator keeps one; the load generator may keep one per thread).
An empirical component (measured service times) samples the inverse of its empirical CDF,
kept as ``WL_EMP_N`` quantiles from the smallest to the largest sample in the struct itself
(16 kB each), so at most ``WL_EMP_MAX`` components of a mixture can be empirical (two: the
RocksDB GET(16)/GET(64) mixes measured on the real handler).
"""
from malcolm._core cimport Rng

cdef enum:
    WL_MAX = 16
    WL_CONST = 0
    WL_EXP = 1
    WL_UNIFORM = 2
    WL_LOGNORMAL = 3
    WL_EMPIRICAL = 4
    WL_EMP_N = 2048         # quantiles of an empirical component: min, ..., max
    WL_EMP_MAX = 2          # empirical components per mixture


ctypedef struct WorkloadC:
    int n                   # components (task types)
    int _pad
    double cdf[WL_MAX]      # cumulative weights, cdf[n-1] == 1
    int kind[WL_MAX]
    # ns: const value / exp mean / uniform low / lognormal log-mean / empirical mean
    double a[WL_MAX]
    double b[WL_MAX]        # ns: uniform high; lognormal shape sigma (dimensionless)
    double mean_ns          # mixture mean
    int emp_slot[WL_MAX]    # empirical component -> its row of emp
    double emp[WL_EMP_MAX][WL_EMP_N]   # ns: quantiles k / (WL_EMP_N - 1)


cdef double wl_sample(const WorkloadC* w, Rng* r, int* task_type) noexcept nogil


cdef class NativeWorkload:
    cdef WorkloadC c

    cdef double _set_table(self, table, int n_emp) except -1.0
