# cython: language_level=3
"""The load estimator of one server (thesis §3.2 "Load estimation"): the ``cdef`` functions of
``_estimator.pxd`` and their Python wrapper :class:`LoadEstimator`."""
from libc.math cimport isfinite, log
from libc.stdint cimport uint64_t
from libc.stdlib cimport free
from libc.string cimport memset

import numpy as np

cimport numpy as cnp

from malcolm._native cimport (
    CACHELINE, mc_aligned_alloc, mc_assert, mc_load_f64, mc_load_relaxed, mc_store_f64,
    mc_store_relaxed,
)

cnp.import_array()


cdef int est_init(Estimator* e, int n_workers, int n_types, double alpha,
                  double prior_service_ns) noexcept nogil:
    memset(e, 0, sizeof(Estimator))
    if n_workers < 1 or n_types < 1 or not (0.0 < alpha <= 1.0) or not (prior_service_ns > 0):
        return -1
    e.n_workers = n_workers
    e.n_types = n_types
    # A whole number of cache lines per worker row, so workers never share a line: the
    # n_types EWMAs, then the sums of log S and of S over all the worker's completions.
    e.stride = ((n_types + 2 + 7) // 8) * 8
    e.alpha = alpha
    e.prior_rate = 1.0 / prior_service_ns
    e.ew = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * n_workers * e.stride)
    e.count = <uint64_t*>mc_aligned_alloc(CACHELINE, sizeof(uint64_t) * n_workers * e.stride)
    e.mix = <double*>mc_aligned_alloc(CACHELINE, sizeof(double) * e.stride)
    if e.ew == NULL or e.count == NULL or e.mix == NULL:
        est_free(e)
        return -1
    memset(e.ew, 0, sizeof(double) * n_workers * e.stride)
    memset(e.count, 0, sizeof(uint64_t) * n_workers * e.stride)
    memset(e.mix, 0, sizeof(double) * e.stride)
    return 0


cdef void est_free(Estimator* e) noexcept nogil:
    free(e.ew)
    free(e.count)
    free(e.mix)
    e.ew = NULL
    e.count = NULL
    e.mix = NULL


cdef int est_set_mode(Estimator* e, int mode) noexcept nogil:
    """Choose what the EWMA averages (before the first sample). Returns -1 if unknown.

    ``EST_MEAN`` (the default) averages service times and inverts the average. The thesis
    words it as an EWMA of inverse service times (``EST_INVERSE``), but that estimates
    E[1/S], which is not the rate 1/E[S] and is infinite for exponential service times: it is
    dominated by the shortest recent tasks and overstates the rate several times over."""
    if mode != EST_MEAN and mode != EST_INVERSE:
        return -1
    e.mode = mode
    return 0


cdef void est_observe(Estimator* e, int worker, int task_type, double service_ns) noexcept nogil:
    """Worker ``worker`` finished a task of ``task_type`` in ``service_ns``."""
    cdef Py_ssize_t k = <Py_ssize_t>worker * e.stride + task_type
    cdef double v
    mc_assert(0 <= worker < e.n_workers and 0 <= task_type < e.n_types)
    if service_ns < 1.0:
        service_ns = 1.0      # a zero-length task would make the rate infinite
    v = service_ns if e.mode == EST_MEAN else 1.0 / service_ns
    if e.count[k] == 0:
        mc_store_f64(&e.ew[k], v)   # the first sample replaces the prior outright
    else:
        mc_store_f64(&e.ew[k], e.ew[k] + e.alpha * (v - e.ew[k]))
    e.count[k] += 1
    # the speed statistics (est_totals): whatever the type
    k = <Py_ssize_t>worker * e.stride + e.n_types
    mc_store_f64(&e.ew[k], e.ew[k] + log(service_ns))
    mc_store_f64(&e.ew[k + 1], e.ew[k + 1] + service_ns)
    mc_store_relaxed(&e.count[k], e.count[k] + 1)


cdef void est_note_arrival(Estimator* e, int task_type) noexcept nogil:
    """The gateway accepted a task of ``task_type``: track the mix of types."""
    cdef int t
    for t in range(e.n_types):
        e.mix[t] += e.alpha * ((1.0 if t == task_type else 0.0) - e.mix[t])


cdef double _worker_type_rate(Estimator* e, int w, int t) noexcept nogil:
    cdef Py_ssize_t k = <Py_ssize_t>w * e.stride + t
    cdef double v = mc_load_f64(&e.ew[k])
    if v <= 0.0:
        return e.prior_rate
    return 1.0 / v if e.mode == EST_MEAN else v


cdef double est_worker_rate(Estimator* e, int worker) noexcept nogil:
    """Tasks per ns of one worker on the current type mix: 1 / sum_t share_t / rate_t.

    With several types, the expected service time of a random task is the mix-weighted mean
    of the per-type ones."""
    cdef int t
    cdef double z = 0.0
    cdef double s = 0.0
    cdef double m
    if e.n_types == 1:
        return _worker_type_rate(e, worker, 0)
    for t in range(e.n_types):
        m = mc_load_f64(&e.mix[t])
        z += m
        s += m / _worker_type_rate(e, worker, t)
    if z <= 0.0:
        return _worker_type_rate(e, worker, 0)
    return z / s


cdef double est_rate(Estimator* e) noexcept nogil:
    """Service rate of the server: the sum over its workers (tasks per ns)."""
    cdef int w
    cdef double r = 0.0
    for w in range(e.n_workers):
        r += est_worker_rate(e, w)
    return r


cdef double est_load(Estimator* e, double queue_len) noexcept nogil:
    """Load = queue length / service rate: the expected wait of the last task, in ns."""
    return queue_len / est_rate(e)


cdef uint64_t est_totals(Estimator* e, double* log_sum, double* sum_ns) noexcept nogil:
    """The server's completions so far: their count (returned), the sum of their log service
    times (ln ns) and of their service times (ns), over all workers and types.

    The policy compares servers' speeds with these (``AgentState.observe_local``): the mean
    log service time is the log of the geometric mean, which a speed factor shifts by its log
    whatever the task mix, and which heavy-tailed service moves far less than the mean (the
    rate's EWMA moves by half its value after one long task under HyperExp-2). Read with
    relaxed loads, each worker's three values a few completions apart at worst."""
    cdef int w
    cdef Py_ssize_t k
    cdef uint64_t n = 0
    cdef double ls = 0.0, ss = 0.0
    for w in range(e.n_workers):
        k = <Py_ssize_t>w * e.stride + e.n_types
        n += mc_load_relaxed(&e.count[k])
        ls += mc_load_f64(&e.ew[k])
        ss += mc_load_f64(&e.ew[k + 1])
    log_sum[0] = ls
    sum_ns[0] = ss
    return n


cdef class LoadEstimator:
    """Service-rate and load estimator of one server (thesis §3.2 "Load estimation").

    Each worker keeps an EWMA of the inverse service time per task type; the server's service
    rate is the sum over workers, and its load is queue length / service rate (ns).

    Parameters
    ----------
    n_workers : int
    n_types : int
    alpha : float
        Weight of a new sample in the EWMA, in (0, 1].
    prior_service_ns : float
        Service time assumed for a worker and type before its first sample.
    mode : {"mean", "inverse"}
        ``"mean"`` (default): EWMA of service times, rate = 1 / EWMA. ``"inverse"``: EWMA of
        inverse service times read as the rate, as the thesis words it; biased (see
        ``est_set_mode``), kept for comparison.
    """
    cdef Estimator e
    cdef bint ok

    def __cinit__(self, int n_workers, int n_types=1, double alpha=0.01,
                  double prior_service_ns=50_000.0, str mode="mean"):
        self.ok = False
        if n_workers < 1:
            raise ValueError(f"n_workers={n_workers}: a server needs at least one worker")
        if n_types < 1:
            raise ValueError(f"n_types={n_types}: there is at least one task type")
        if not (0.0 < alpha <= 1.0):
            raise ValueError(f"alpha={alpha} must be in (0, 1]")
        if not (prior_service_ns > 0 and isfinite(prior_service_ns)):
            raise ValueError(f"prior_service_ns={prior_service_ns} must be positive")
        if mode not in ("mean", "inverse"):
            raise ValueError(f"mode={mode!r} must be 'mean' or 'inverse'")
        if est_init(&self.e, n_workers, n_types, alpha, prior_service_ns) != 0:
            raise MemoryError("cannot allocate the estimator")
        self.ok = True
        est_set_mode(&self.e, EST_MEAN if mode == "mean" else EST_INVERSE)

    def __dealloc__(self):
        if self.ok:
            est_free(&self.e)

    def observe(self, int worker, int task_type, double service_ns):
        """Record one completed task."""
        self._check(worker, task_type)
        if not (service_ns >= 0 and isfinite(service_ns)):
            raise ValueError(f"service time {service_ns} must be finite and >= 0")
        est_observe(&self.e, worker, task_type, service_ns)

    def observe_many(self, workers, types, service_ns):
        """Record many completions in one native loop."""
        cdef cnp.ndarray[cnp.int64_t, ndim=1] w = np.ascontiguousarray(workers, dtype=np.int64)
        cdef cnp.ndarray[cnp.int64_t, ndim=1] t = np.ascontiguousarray(types, dtype=np.int64)
        cdef cnp.ndarray[cnp.float64_t, ndim=1] s = np.ascontiguousarray(service_ns,
                                                                         dtype=np.float64)
        cdef Py_ssize_t k, m = w.shape[0]
        if t.shape[0] != m or s.shape[0] != m:
            raise ValueError("workers, types and service_ns must have the same length")
        if m:
            if w.min() < 0 or w.max() >= self.e.n_workers:
                raise IndexError(f"worker indices must be in 0..{self.e.n_workers - 1}")
            if t.min() < 0 or t.max() >= self.e.n_types:
                raise IndexError(f"task types must be in 0..{self.e.n_types - 1}")
            if not (np.all(np.isfinite(s)) and np.all(s >= 0)):
                raise ValueError("service times must be finite and >= 0")
        with nogil:
            for k in range(m):
                est_observe(&self.e, <int>w[k], <int>t[k], s[k])

    def note_arrival(self, int task_type):
        """Record the type of an accepted task (tracks the type mix)."""
        self._check(0, task_type)
        est_note_arrival(&self.e, task_type)

    def worker_rate(self, int worker):
        self._check(worker, 0)
        return est_worker_rate(&self.e, worker)

    def rate(self):
        """Service rate of the server in tasks per ns."""
        return est_rate(&self.e)

    def load(self, double queue_len):
        """Expected wait of the last queued task, in ns."""
        return est_load(&self.e, queue_len)

    def totals(self):
        """``(n, log_sum, sum_ns)``: the completions so far, the sum of their log service
        times (ln ns) and of their service times (ns), over all workers and types."""
        cdef double ls, ss
        cdef uint64_t n = est_totals(&self.e, &ls, &ss)
        return int(n), ls, ss

    def ewma(self):
        """The EWMA per worker and type, shape (n_workers, n_types): of service times (ns)
        in ``"mean"`` mode, of their inverses in ``"inverse"`` mode; 0 where nothing was seen."""
        a = np.array(<double[:self.e.n_workers * self.e.stride]>self.e.ew, copy=True)
        return a.reshape(self.e.n_workers, self.e.stride)[:, :self.e.n_types].copy()

    def type_mix(self):
        return np.array(<double[:self.e.n_types]>self.e.mix, copy=True)

    def _check(self, int worker, int task_type):
        if not 0 <= worker < self.e.n_workers:
            raise IndexError(f"worker {worker} out of range 0..{self.e.n_workers - 1}")
        if not 0 <= task_type < self.e.n_types:
            raise IndexError(f"task type {task_type} out of range 0..{self.e.n_types - 1}")
