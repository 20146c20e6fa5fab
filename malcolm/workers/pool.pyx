# cython: language_level=3
"""The worker pool: W threads that pop the central queue and run the handler without the GIL.

Each worker feeds its measured service times to the load ``Estimator`` (the rate the policy
and the gateway use) and to its own histogram (what the service times really were). With
``workers=0`` there are no threads: the gateway calls :meth:`WorkerPool.run_task` itself
between polls.
"""
import math
import threading

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memset

from malcolm._core cimport (
    est_free, est_init, est_observe, mc_aligned_alloc, mc_cpu_relax, mc_load_acq, mc_now_ns,
    mc_store_rel, mpmc_bytes, mpmc_init, mpmc_push,
)
from malcolm._hist cimport N_BUCKETS, Hist, hist_add, hist_lower, hist_upper
from malcolm._system cimport PR_SET_NAME, PR_SET_TIMERSLACK, prctl
from malcolm.net._wire cimport ST_BAD_INPUT, ST_HANDLER_ERROR, ST_OK, ST_TIMED_OUT
from malcolm.workers.handlers cimport MALCOLM_BAD_INPUT, malcolm_task


def name_thread(str name):
    """Name the calling thread (``top -H``, ``/proc/*/task/*/comm``: at most 15 characters)."""
    cdef bytes b = name.encode()[:15]
    prctl(PR_SET_NAME, <unsigned long><const char*>b, 0, 0, 0)


cdef class WorkerPool:
    """Task slots, the run and done queues, the estimator and the worker threads of a server.

    Parameters
    ----------
    transport : Transport
        The gateway's: workers wake it when a task is done.
    handler : Handler
    workers : int
        Threads; 0 for a gateway that runs tasks itself.
    capacity : int
        Task slots: the most tasks the server holds (waiting + running).
    n_types : int
    busy : bool
        Spin without pause (one core each) rather than spin ``spin_us`` then block.
    spin_us : float
        As :class:`malcolm.runtime.server.Server` takes it.
    est_alpha, prior_service_us : float
        The estimator's EWMA weight and its prior mean service time.
    """

    def __init__(self, Transport transport not None, Handler handler not None, int workers,
                 int capacity, int n_types, bint busy, double spin_us, double est_alpha,
                 double prior_service_us):
        cdef uint32_t cap2 = 1
        self.tr = transport
        self.handler = handler
        self.n_workers = workers
        self.capacity = capacity
        self.busy = busy
        self.spin_ns = <int64_t>(spin_us * 1000)
        while cap2 < <uint32_t>capacity:
            cap2 <<= 1
        self.slots = <TaskSlot*>mc_aligned_alloc(64, sizeof(TaskSlot) * capacity)
        self.runq = <Mpmc*>mc_aligned_alloc(64, mpmc_bytes(cap2))
        self.stealq = <Mpmc*>mc_aligned_alloc(64, mpmc_bytes(cap2))
        self.doneq = <Mpmc*>mc_aligned_alloc(64, mpmc_bytes(cap2))
        self.svc_hist = <Hist*>mc_aligned_alloc(64, sizeof(Hist) * max(workers, 1))
        if (self.slots == NULL or self.runq == NULL or self.stealq == NULL
                or self.doneq == NULL or self.svc_hist == NULL):
            raise MemoryError("cannot allocate the server's queues")
        if (mpmc_init(self.runq, cap2) != 0 or mpmc_init(self.stealq, cap2) != 0
                or mpmc_init(self.doneq, cap2) != 0):
            raise MemoryError("cannot initialise the server's queues")
        if est_init(&self.est, max(workers, 1), n_types, est_alpha, prior_service_us * 1000) != 0:
            raise ValueError("bad estimator parameters")
        self.est_ok = True
        memset(self.svc_hist, 0, sizeof(Hist) * max(workers, 1))
        memset(&self.count, 0, sizeof(PoolCounters))
        memset(&self.bell, 0, sizeof(mc_doorbell))
        self.threads = []

    def __dealloc__(self):
        free(self.slots)
        free(self.runq)
        free(self.stealq)
        free(self.doneq)
        free(self.svc_hist)
        if self.est_ok:
            est_free(&self.est)

    # ------------------------------------------------------------ threads
    def start(self, str prefix, pin):
        """Start the worker threads, named ``PREFIX-workerW``; ``pin(w)`` pins the calling
        thread (worker ``w``) to its CPU."""
        self.stop_flag = 0
        self.threads = [threading.Thread(target=self._main, args=(w, prefix, pin), daemon=True,
                                         name=f"malcolm-worker-{w}")
                        for w in range(self.n_workers)]
        for t in self.threads:
            t.start()

    def signal_stop(self):
        """Tell the workers to exit (they finish the task they are running)."""
        mc_store_rel(&self.stop_flag, 1)
        mc_bell_ring(&self.bell)

    def _main(self, int w, str prefix, pin):
        name_thread(f"{prefix}-worker{w}")
        pin(w)
        with nogil:
            prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
            self.loop(w)

    cdef int64_t run_task(self, int w, uint64_t idx, int64_t t0) noexcept nogil:
        """Run the task in slot ``idx`` as worker ``w``, starting at ``t0`` (a clock read the
        caller just made), and queue it for its response. Returns the clock at the end."""
        cdef TaskSlot* s = &self.slots[idx]
        cdef malcolm_task t
        cdef int64_t t1 = t0
        cdef int rc
        if s.deadline_ns > 0 and t0 > s.deadline_ns:
            # Not started by its deadline (the client's, or the rack's task_timeout_ms).
            s.status = ST_TIMED_OUT
            s.out_len = 0
            s.measured_ns = 0
            mc_add64_relaxed(&self.count.timed_out, 1)
        else:
            # The handler's ABI (workers/malcolm_handler.h), not the wire's: a C struct that
            # shared-library handlers compile against.
            t.client_id = s.client_id
            t.task_type = s.task_type
            t.flags = s.flags
            t.request_id = s.request_id
            t.service_ns = s.service_ns
            t.payload = s.payload
            t.payload_len = s.payload_len
            t.worker = w
            t.out = s.out
            t.out_cap = MAX_PAYLOAD
            t.out_len = 0
            rc = self.handler.fn(self.handler.ctx, &t)
            t1 = mc_now_ns()
            s.measured_ns = t1 - t0
            est_observe(&self.est, w, s.task_type, <double>(t1 - t0))
            # Every handler run, by the worker that ran it (no sharing): what the service
            # times really were, so a report can state the load the rack really carried.
            hist_add(&self.svc_hist[w], t1 - t0)
            if rc == 0:
                s.status = ST_OK
                s.out_len = t.out_len if t.out_len <= MAX_PAYLOAD else MAX_PAYLOAD
                mc_add64_relaxed(&self.count.completed, 1)
            elif rc == MALCOLM_BAD_INPUT:
                s.status = ST_BAD_INPUT     # the handler found the request malformed
                s.out_len = 0               # (counted in bad_input by the gateway)
            else:
                s.status = ST_HANDLER_ERROR
                s.out_len = 0
                mc_add64_relaxed(&self.count.handler_errors, 1)
        mpmc_push(self.doneq, idx)      # never full: it holds at most `capacity`
        return t1

    cdef void loop(self, int w) noexcept nogil:
        cdef uint64_t idx
        cdef int64_t t0, idle_since = 0
        cdef uint32_t ticket
        while not mc_load_acq(&self.stop_flag):
            if pool_pop(self, &idx):
                idle_since = 0
                self.run_task(w, idx, mc_now_ns())
                self.tr.wake()
                continue
            if self.busy:
                mc_cpu_relax()
                continue
            t0 = mc_now_ns()
            if idle_since == 0:
                idle_since = t0
            if t0 - idle_since < self.spin_ns:
                mc_cpu_relax()
                continue
            ticket = mc_bell_prepare(&self.bell)
            if pool_waiting(self) or mc_load_acq(&self.stop_flag):
                mc_bell_cancel(&self.bell)
                continue
            mc_bell_wait(&self.bell, ticket, IDLE_WAIT_NS)

    # ------------------------------------------------------------ statistics
    def counters(self):
        """The workers' counters (a dict, read racily while running)."""
        return dict(self.count)

    def service_times(self, buckets=True):
        """The measured handler times of all workers, merged (read racily while running).

        Returns
        -------
        dict
            ``count``, ``mean_us``, ``p50_us``, ``p99_us``, ``min_us``, ``max_us``, and with
            ``buckets`` the non-empty histogram buckets ``[lower_ns, upper_ns, count]``
            (log-linear, each at most 1/16 of its values wide: eight of ``malcolm/_hist.pxd``'s
            buckets merged).
            Percentiles are bucket midpoints clamped to the exact min and max, as the load
            generator reports them (``malcolm.loadgen.hist``).
        """
        cdef int w, i
        cdef Hist* h
        cdef uint64_t n = 0, c
        cdef double total = 0.0
        cdef int64_t lo = 0, hi = 0
        counts = {}
        for w in range(max(self.n_workers, 1)):
            h = &self.svc_hist[w]
            if h.n == 0:
                continue
            if n == 0 or h.min < lo:
                lo = h.min
            if n == 0 or h.max > hi:
                hi = h.max
            total += h.sum
            for i in range(N_BUCKETS):
                c = h.counts[i]
                if c:
                    counts[i] = counts.get(i, 0) + c
                    n += c      # from the buckets: a racy read may see a count before its n
        nan = float("nan")
        out = {"count": int(n), "mean_us": total / n / 1e3 if n else nan,
               "p50_us": _svc_pct(counts, n, 50.0, lo, hi),
               "p99_us": _svc_pct(counts, n, 99.0, lo, hi),
               "min_us": lo / 1e3 if n else nan, "max_us": hi / 1e3 if n else nan}
        if buckets:
            # Eight buckets to one (each 1/16 of its values wide, about 200 for a workload
            # spanning 1 µs..10 ms): `--stats-json` writes these several times a second and
            # the fine ones cost a 2-core machine 0.1 core of JSON; percentiles above use
            # the fine ones.
            coarse = {}
            for i, c in counts.items():
                coarse[i >> 3] = coarse.get(i >> 3, 0) + c
            out["buckets"] = [[int(hist_lower(g << 3)), int(hist_upper((g << 3) + 7)),
                               int(coarse[g])] for g in sorted(coarse)]
        return out


def _svc_pct(dict counts, uint64_t n, double q, int64_t lo, int64_t hi):
    cdef uint64_t rank, cum = 0
    cdef int i
    cdef double mid
    if n == 0:
        return float("nan")
    rank = max(1, <uint64_t>math.ceil(q / 100.0 * n))
    for i in sorted(counts):
        cum += counts[i]
        if cum >= rank:
            mid = (0.5 * (hist_lower(i) + hist_upper(i) - 1) if i >= 256
                   else <double>hist_lower(i))
            return min(max(mid, <double>lo), <double>hi) / 1e3
    return hi / 1e3
