# cython: language_level=3
"""The window protocol and the steal gate: the one implementation that both clocks call.

A server's policy thread does the same thing every window whether the clock is simulated
(``malcolm/sim/_engine.pyx``) or real (``malcolm/runtime/policy_thread.pyx``)::

    start:            observe_local(now, load, queue, rate)          drv_start
    each heartbeat:   observe_peer(now, hb)                          drv_observe_peer
    each window end:  observe_local(now, load, queue, rate)          drv_end_window
                      end_window(now)
                      fill_heartbeat(hb); stamp src, seq, sent_ns    (unless the previous
                                                                      heartbeat is unsent)

The own load is observed *before* ``end_window`` so that ``end_window`` learns from the state
its window's decisions led to (observed after, every load a TD error saw predated the
window's decisions: docs/loadgen.md, "Why Malcolm loses in the demo"). ``load`` is
``queue / rate`` with one read of the estimator's rate, so the two always agree. The
server's worker count (the estimator's ``n_workers``: the simulator's per-server workers,
the runtime pool's ``workers``, 1 when the gateway runs tasks itself) goes to the policy at
the same point, as ``Policy.n_workers``.

The driver owns the heartbeat header (``src``, ``seq`` from 1, ``sent_ns``) and the
``Policy.migrations``/``steals`` counters (``drv_migrated``/``drv_stole``, called by the
gateway when it forwards a task or receives a stolen one); a policy only fills the body.

``StealGate`` is the rule for steal requests in flight: at most ``max_in_flight`` (the
runtime allows one), each given up after ``timeout_ns``; a reply that comes after its request
was given up still brings its task. Everything here is ``nogil`` and inline: no call crosses
a module boundary on the hot path.

The defaults both clocks share (the estimator's weight and prior, steals in flight, the
window's length in task times) are in ``malcolm/policy/defaults.py``; ``drv_window_ns``
gives each window's length from them.
"""
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

from malcolm._core cimport Estimator, est_rate, est_totals
from malcolm.policy.base cimport Heartbeat, Policy


cdef enum:
    STEAL_MAX_IN_FLIGHT = 16        # the most a StealGate can track (defaults.py agrees)
    WINDOW_SHRINK = 5               # drv_window_ns: the shortest window, base / 5 (ditto)
    WINDOW_WARM = 40                # drv_window_ns: completions a worker before its task
    #                                 time counts, and about how many its mean remembers
    WINDOW_IDLE = 5                 # drv_window_ns: idle windows in a row before the
    #                                 configured window returns (at the shortest windows, one
    #                                 configured window's worth)


ctypedef struct WindowState:
    uint32_t hb_seq             # seq of the last heartbeat filled; the first one is 1
    uint32_t idle               # windows in a row that completed nothing and ended empty
    #                             (at most WINDOW_IDLE; drv_window_ns)
    uint64_t windows            # end_window calls
    uint64_t hb_filled
    uint64_t hb_skipped         # window ends whose heartbeat slot was still busy
    double load                 # the last own observation: queue / rate, ns
    double queue_len
    double rate                 # tasks per ns
    uint64_t done               # the server's completions so far (est_totals)
    double sum_ns               # ... and the sum of their service times
    double task_ns              # recent mean service time, ns (0: none yet; drv_window_ns)


ctypedef struct StealGate:
    int32_t max_in_flight       # 1..STEAL_MAX_IN_FLIGHT
    int32_t n                   # requests outstanding
    int64_t timeout_ns
    uint32_t seq                # seq of the last request sent; the first one is 1
    uint32_t _pad
    uint32_t pend_seq[STEAL_MAX_IN_FLIGHT]
    int64_t pend_deadline[STEAL_MAX_IN_FLIGHT]
    uint64_t sent
    uint64_t suppressed         # the policy said steal while max_in_flight were outstanding
    uint64_t timeouts           # requests given up
    uint64_t late_replies       # replies to requests already given up
    int32_t max_seen            # the most outstanding at once


# ---------------------------------------------------------------- window protocol
cdef inline void _window_completions(WindowState* w, uint64_t done, double sum_ns,
                                     int n_workers, double queue_len) noexcept nogil:
    """The server's completion totals at a window's end (``done``, ``sum_ns``): the mean
    service time of those since the last one folded into ``w.task_ns`` with a weight of
    k / (k + WINDOW_WARM c) for k completions (c workers), about the last WINDOW_WARM c
    completions' mean, each alike; then the totals kept. Not the estimator's rate: a worker
    that has served few tasks (its first sample replaces the prior) can dominate a
    many-worker server's sum of per-worker rates. A window that completed nothing and ends
    with no task in the server (``queue_len``) counts as idle (``w.idle``)."""
    cdef double k, m, c = <double>(n_workers if n_workers > 0 else 1)
    if done == w.done and not (queue_len > 0.0):
        if w.idle < WINDOW_IDLE:
            w.idle += 1
    else:
        w.idle = 0
    if done > w.done and sum_ns > w.sum_ns:
        k = <double>(done - w.done)
        m = (sum_ns - w.sum_ns) / k
        if w.task_ns > 0.0:
            w.task_ns += k / (k + WINDOW_WARM * c) * (m - w.task_ns)
        else:
            w.task_ns = m
    w.done = done
    w.sum_ns = sum_ns


cdef inline void drv_observe_local(WindowState* w, Policy p, Estimator* est, int64_t now,
                                   double queue_len) noexcept nogil:
    cdef double rate = est_rate(est), log_sum, sum_ns
    cdef uint64_t done = est_totals(est, &log_sum, &sum_ns)
    p.n_workers = est.n_workers     # local knowledge (the hop gate counts idle workers)
    p.observe_completions(done, log_sum, sum_ns)        # ... and compares speeds
    w.queue_len = queue_len
    w.rate = rate
    _window_completions(w, done, sum_ns, est.n_workers, queue_len)
    w.load = queue_len / rate
    p.observe_local(now, w.load, queue_len, rate)


cdef inline void drv_start(WindowState* w, Policy p, Estimator* est, int64_t now,
                           double queue_len) noexcept nogil:
    """The policy thread starts: the policy learns its own load before any heartbeat."""
    w.hb_seq = 0
    w.windows = 0
    w.hb_filled = 0
    w.hb_skipped = 0
    w.idle = 0
    w.done = 0
    w.sum_ns = 0.0
    w.task_ns = 0.0
    drv_observe_local(w, p, est, now, queue_len)


cdef inline void drv_observe_peer(Policy p, int64_t now, const Heartbeat* hb) noexcept nogil:
    # Nothing of the window's state: a count here was read nowhere (the runtime's policy
    # thread keeps its own, ``hb_observed``), and on a simulated 64-server rack its write was
    # a cache line of another server's state per copy, n (n - 1) a window.
    p.observe_peer(now, hb)


cdef inline bint drv_end_window(WindowState* w, Policy p, Estimator* est, int64_t now,
                                double queue_len, Heartbeat* hb) noexcept nogil:
    """A window ends at ``now`` with ``queue_len`` tasks in the server.

    ``hb`` is where this window's heartbeat goes, or NULL when the previous one has not been
    sent yet (the runtime's gateway may lag): then no heartbeat is filled (counted in
    ``hb_skipped``), so a peer never sees two with one seq. Returns True if ``hb`` was filled.
    """
    drv_observe_local(w, p, est, now, queue_len)
    p.end_window(now)
    w.windows += 1
    if hb == NULL:
        w.hb_skipped += 1
        return False
    p.fill_heartbeat(hb)
    w.hb_seq += 1
    w.hb_filled += 1
    hb.src = p.me
    hb.seq = w.hb_seq
    hb.sent_ns = now
    return True


cdef inline int64_t drv_window_ns(const WindowState* w, const Estimator* est, int64_t base_ns,
                                  double tasks) noexcept nogil:
    """The next window's length (ns): ``tasks`` of this server's own task times, within
    [``base_ns`` / WINDOW_SHRINK, ``base_ns``]; ``base_ns`` where ``tasks`` <= 0, where no
    task time is known yet, and after WINDOW_IDLE idle windows in a row.

    A load report is as stale as the window is long, and what staleness costs is counted in
    task times: the configured window (the thesis's 100 µs) is two 50 µs tasks, but twenty
    5 µs ones, and the server-side policies then lost to po2, whose client reads fresh
    queue lengths (docs/policy.md, "Short tasks"). The task time is the mean service time
    of the server's recent completions (``w.task_ns``, kept at each window's end from the
    estimator's totals), the same on both clocks, and counts only once the server has
    completed WINDOW_WARM tasks a worker (before that a few short first tasks would shorten
    the windows). The bounds keep the heartbeats' cost (n - 1 per server and window) within
    WINDOW_SHRINK times what the configured window costs, never above it.

    An idle server has nothing new to report, and its last tasks' time would keep its
    windows short (the mean moves only with completions): after WINDOW_IDLE windows that
    completed nothing and ended empty it goes back to the configured window, and so to that
    window's heartbeat cost, until a task completes or waits at a window's end.
    """
    cdef double t, c = <double>(est.n_workers if est.n_workers > 0 else 1)
    cdef int64_t lo
    if (not (tasks > 0.0) or not (w.task_ns > 0.0) or <double>w.done < WINDOW_WARM * c
            or w.idle >= WINDOW_IDLE):
        return base_ns
    t = tasks * w.task_ns
    if t >= <double>base_ns:
        return base_ns
    lo = base_ns // WINDOW_SHRINK
    return lo if t <= <double>lo else <int64_t>t


cdef inline void drv_migrated(Policy p) noexcept nogil:
    """The gateway forwarded a task that ``decide_arrival`` sent to a peer."""
    p.migrations += 1


cdef inline void drv_stole(Policy p) noexcept nogil:
    """A stolen task arrived and was kept."""
    p.steals += 1


# ---------------------------------------------------------------- steals in flight
cdef inline void steal_gate_init(StealGate* g, int max_in_flight,
                                 int64_t timeout_ns) noexcept nogil:
    cdef int i
    if max_in_flight < 1:
        max_in_flight = 1
    if max_in_flight > STEAL_MAX_IN_FLIGHT:
        max_in_flight = STEAL_MAX_IN_FLIGHT
    g.max_in_flight = max_in_flight
    g.n = 0
    g.timeout_ns = timeout_ns
    g.seq = 0
    g.sent = g.suppressed = g.timeouts = g.late_replies = 0
    g.max_seen = 0
    for i in range(STEAL_MAX_IN_FLIGHT):
        g.pend_seq[i] = 0
        g.pend_deadline[i] = 0


cdef inline void steal_gate_expire(StealGate* g, int64_t now) noexcept nogil:
    """Give up the requests whose deadline has passed."""
    cdef int i = 0
    while i < g.n:
        if now >= g.pend_deadline[i]:
            g.n -= 1
            g.pend_seq[i] = g.pend_seq[g.n]
            g.pend_deadline[i] = g.pend_deadline[g.n]
            g.timeouts += 1
        else:
            i += 1


cdef inline uint32_t steal_gate_open(StealGate* g, int64_t now) noexcept nogil:
    """The policy wants to steal: the seq of the request to send, or 0 if it must not."""
    steal_gate_expire(g, now)
    if g.n >= g.max_in_flight:
        g.suppressed += 1
        return 0
    g.seq += 1
    if g.seq == 0:
        g.seq = 1
    g.pend_seq[g.n] = g.seq
    g.pend_deadline[g.n] = now + g.timeout_ns
    g.n += 1
    if g.n > g.max_seen:
        g.max_seen = g.n
    g.sent += 1
    return g.seq


cdef inline bint steal_gate_reply(StealGate* g, uint32_t seq, int64_t now) noexcept nogil:
    """The reply to request ``seq`` arrived at ``now`` (with a task or empty). False if it
    came after its request was given up."""
    cdef int i
    steal_gate_expire(g, now)
    for i in range(g.n):
        if g.pend_seq[i] == seq:
            g.n -= 1
            g.pend_seq[i] = g.pend_seq[g.n]
            g.pend_deadline[i] = g.pend_deadline[g.n]
            return True
    g.late_replies += 1
    return False
