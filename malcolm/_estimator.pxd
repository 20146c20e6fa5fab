# cython: language_level=3
"""cimport API of the load estimator (thesis §3.2): per worker and task type an EWMA of the
service time, the server's service rate and its load. ``malcolm._core`` re-exports it.

Threading contract: worker ``w`` is the only writer of row ``w``; ``est_note_arrival`` has a
single writer (the gateway); anyone may read.
"""
from libc.stdint cimport int32_t, uint64_t


cdef enum:
    EST_MEAN = 0                # EWMA of the service time S; rate = 1 / EWMA (default)
    EST_INVERSE = 1             # EWMA of 1/S, read as the rate (the thesis's literal wording)


ctypedef struct Estimator:
    int32_t n_workers
    int32_t n_types
    int32_t stride              # doubles per worker row, a whole number of cache lines:
    #                             n_types EWMAs, then the row's sums of log S and of S
    int32_t mode                # EST_MEAN or EST_INVERSE
    double alpha                # EWMA weight of a new sample
    double prior_rate           # per-worker rate (tasks/ns) used before any sample
    double* ew                  # [n_workers * stride]: the EWMA per worker and type
    double* mix                 # [n_types]: EWMA of the arrival share of each type
    uint64_t* count             # [n_workers * stride]: samples per worker and type (at
    #                             n_types: all the worker's samples, those the sums hold)


cdef int est_init(Estimator* e, int n_workers, int n_types, double alpha,
                  double prior_service_ns) noexcept nogil
cdef void est_free(Estimator* e) noexcept nogil
cdef int est_set_mode(Estimator* e, int mode) noexcept nogil
cdef void est_observe(Estimator* e, int worker, int task_type, double service_ns) noexcept nogil
cdef void est_note_arrival(Estimator* e, int task_type) noexcept nogil
cdef double est_worker_rate(Estimator* e, int worker) noexcept nogil
cdef double est_rate(Estimator* e) noexcept nogil
cdef double est_load(Estimator* e, double queue_len) noexcept nogil
cdef uint64_t est_totals(Estimator* e, double* log_sum, double* sum_ns) noexcept nogil
