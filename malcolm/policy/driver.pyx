# cython: language_level=3
"""Python side of the window driver (``driver.pxd``): a policy that records the window
protocol, for tests. The shared defaults are in ``malcolm/policy/defaults.py``.

The protocol itself is inline in ``driver.pxd`` and compiled into each caller
(``malcolm/sim/_engine.pyx``; at runtime ``malcolm/runtime/policy_thread.pyx`` and, for the
steal gate, ``malcolm/runtime/gateway.pyx``).
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from malcolm._core cimport Estimator, mc_now_ns
from malcolm.policy.base cimport Heartbeat, Policy

#: The most steal requests in flight a StealGate tracks (defaults.MAX_STEALS_IN_FLIGHT).
STEAL_GATE_CAPACITY = STEAL_MAX_IN_FLIGHT
#: How far ``drv_window_ns`` shortens a window (defaults.WINDOW_SHRINK), and the completions a
#: worker it waits for.
WINDOW_SHRINK_NATIVE = WINDOW_SHRINK
WINDOW_WARM_NATIVE = WINDOW_WARM
#: Idle windows in a row after which ``drv_window_ns`` gives the configured window.
WINDOW_IDLE_NATIVE = WINDOW_IDLE


def window_ns(windows, int n_workers, int64_t base_ns, double tasks):
    """``drv_window_ns`` after the windows ``[(completions, their total service ns), ...]``
    of a server of ``n_workers`` workers, each folded in as a window's end folds it: the
    next window's length in ns (for tests). A window may add a third item, the tasks in the
    server at its end (default 1: not idle)."""
    cdef WindowState w
    cdef Estimator e
    cdef uint64_t done = 0
    cdef double sum_ns = 0.0
    memset(&w, 0, sizeof(w))
    for win in windows:
        k, t, q = win if len(win) == 3 else (*win, 1.0)
        done += <uint64_t>k
        sum_ns += <double>t
        _window_completions(&w, done, sum_ns, n_workers, q)
    memset(&e, 0, sizeof(e))
    e.n_workers = n_workers
    return drv_window_ns(&w, &e, base_ns, tasks)


# What RecordingPolicy logs: the policy thread's calls (the gateway's are not logged, so
# the log has a single writer).
cdef enum:
    CALL_OBSERVE_LOCAL = 1
    CALL_OBSERVE_PEER = 2
    CALL_END_WINDOW = 3
    CALL_FILL_HEARTBEAT = 4
CALL_NAMES = {CALL_OBSERVE_LOCAL: "observe_local", CALL_OBSERVE_PEER: "observe_peer",
              CALL_END_WINDOW: "end_window", CALL_FILL_HEARTBEAT: "fill_heartbeat"}


ctypedef struct CallRec:
    int32_t kind
    int32_t src
    uint32_t seq
    int32_t workers             # observe_local: the worker count the driver set
    int64_t now
    int64_t sent_ns
    double load
    double queue_len
    double rate


cdef class RecordingPolicy(Policy):
    """Accepts every task, never steals, and logs each window-protocol call.

    For tests: the same sequence of calls must come from the simulator and from the runtime,
    because both run ``driver.pxd``. The log holds at most ``max_calls`` entries; later calls
    are counted in ``overflow``.

    Parameters
    ----------
    n, me, seed : int
        As :class:`malcolm.policy.base.Policy`.
    max_calls : int
        Size of the log.
    busy_us : float
        Each ``end_window`` keeps the calling thread busy this long (µs; default 0): a slow
        policy, for tests of what the runtime does meanwhile.
    """

    cdef CallRec* log
    cdef Py_ssize_t cap
    cdef Py_ssize_t count
    cdef readonly Py_ssize_t overflow
    cdef double last_load, last_queue, last_rate
    cdef int64_t busy_ns

    def __cinit__(self):
        self.log = NULL

    def __init__(self, int n, int me, unsigned long long seed=0, Py_ssize_t max_calls=100_000,
                 double busy_us=0.0):
        Policy.__init__(self, n, me, seed)
        if max_calls < 1:
            raise ValueError("max_calls must be >= 1")
        if not 0.0 <= busy_us <= 1e6:
            raise ValueError("busy_us must be in [0, 1e6]")
        self.busy_ns = <int64_t>(busy_us * 1000.0)
        self.log = <CallRec*>malloc(sizeof(CallRec) * max_calls)
        if self.log == NULL:
            raise MemoryError()
        self.cap = max_calls
        self.count = 0
        self.overflow = 0

    def __dealloc__(self):
        free(self.log)

    cdef CallRec* _rec(self, int kind, int64_t now) noexcept nogil:
        cdef CallRec* r
        if self.count >= self.cap:
            self.overflow += 1
            return NULL
        r = &self.log[self.count]
        self.count += 1
        memset(r, 0, sizeof(CallRec))
        r.kind = kind
        r.now = now
        return r

    cdef void observe_local(self, int64_t now, double load, double queue_len,
                            double rate) noexcept nogil:
        cdef CallRec* r = self._rec(CALL_OBSERVE_LOCAL, now)
        self.last_load = load
        self.last_queue = queue_len
        self.last_rate = rate
        if r != NULL:
            r.src = self.me
            r.workers = self.n_workers
            r.load = load
            r.queue_len = queue_len
            r.rate = rate

    cdef void observe_peer(self, int64_t now, const Heartbeat* hb) noexcept nogil:
        cdef CallRec* r = self._rec(CALL_OBSERVE_PEER, now)
        if r != NULL:
            r.src = hb.src
            r.seq = hb.seq
            r.sent_ns = hb.sent_ns
            r.load = hb.load
            r.queue_len = hb.queue_len
            r.rate = hb.rate

    cdef void end_window(self, int64_t now) noexcept nogil:
        cdef int64_t until
        self._rec(CALL_END_WINDOW, now)
        if self.busy_ns > 0:
            until = mc_now_ns() + self.busy_ns
            while mc_now_ns() < until:
                pass

    cdef void fill_heartbeat(self, Heartbeat* hb) noexcept nogil:
        Policy.fill_heartbeat(self, hb)
        hb.load = self.last_load
        hb.queue_len = self.last_queue
        hb.rate = self.last_rate
        self._rec(CALL_FILL_HEARTBEAT, 0)

    def calls(self):
        """The log: a list of dicts with ``call`` (name), ``now`` and, where they apply,
        ``src``, ``seq``, ``sent_ns``, ``load``, ``queue_len``, ``rate`` and (observe_local)
        ``workers``."""
        cdef Py_ssize_t i
        cdef CallRec* r
        out = []
        for i in range(self.count):
            r = &self.log[i]
            d = {"call": CALL_NAMES[r.kind], "now": r.now}
            if r.kind == CALL_OBSERVE_LOCAL:
                d.update(load=r.load, queue_len=r.queue_len, rate=r.rate, workers=r.workers)
            elif r.kind == CALL_OBSERVE_PEER:
                d.update(src=r.src, seq=r.seq, sent_ns=r.sent_ns, load=r.load,
                         queue_len=r.queue_len, rate=r.rate)
            out.append(d)
        return out
