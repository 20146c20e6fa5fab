# cython: language_level=3
"""The policy thread of a server: the window loop of ``policy/driver.pxd``, on the real clock.

It never spins: it sleeps until its window ends or the gateway rings it for a heartbeat. It
calls ``observe_peer`` for each heartbeat as it arrives (eq. 6.1 applies each load at once),
with the time the gateway took it in, and, at each window boundary, ``observe_local`` (the
load now), ``end_window`` and ``fill_heartbeat``: the simulator's own code, so the two
clocks run one protocol. The heartbeat it fills is handed to the gateway, which alone
touches the transport (and stamps it when it sends it).

**A quiet rack sleeps.** Each window costs every server a few wake-ups (this thread's timer,
its gateway's sends, each peer's receive and inbox), about half a core a server on a
2-vCPU machine at 100 µs windows with no task anywhere. After QUIET_WINDOWS window ends in
a row at which this server had been empty for WINDOW_IDLE windows and no peer's heartbeat
since the last reported a task (``queue_len`` > 0), each window is twice the last, up to
``sleep_ns``. A long window ends at once when the gateway takes in a task (``wake``) or a
peer's heartbeat reports one: the heartbeat that window end sends wakes the peers in turn,
so a rack wakes within about a hop of its first task. Tasks never wait for this thread (the
gateway queues them and wakes the workers); what waits is the first heartbeat. Each
heartbeat says the window after it (wire version 5), so the peers suspect a sleeping server
only after 3 of its long windows, and still send it tasks, which wake it. An idle peer's
heartbeat does not ring this thread in a long window: it is observed at the window's end,
with the time the gateway took it in (the gateway rings for a busy peer's at once, and
when the inbox is half full). No task is in the rack while it sleeps, so the simulator,
which always has tasks in flight, has no such windows to model.
"""
import threading

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memset

from malcolm._core cimport (
    mc_aligned_alloc, mc_fence_seq, mc_load_acq, mc_load_relaxed, mc_now_ns, mc_store_rel)
from malcolm._system cimport PR_SET_TIMERSLACK, prctl
from malcolm.policy.driver cimport (
    WINDOW_IDLE, drv_end_window, drv_observe_peer, drv_start, drv_window_ns)
from malcolm._native cimport mc_bell_cancel, mc_bell_prepare, mc_bell_ring, mc_bell_wait

from malcolm.policy.defaults import WINDOW_TASKS
from malcolm.workers.pool import name_thread


cdef class PolicyThread:
    """The window loop of one server.

    Parameters
    ----------
    policy : Policy
    pool : WorkerPool
        Whose estimator and held tasks are the own load.
    transport : Transport
        The gateway's, woken when a heartbeat is ready.
    window_us : float
        The longest window; each is ``window_tasks`` of the server's measured task times
        within [window_us / 5, window_us] (``drv_window_ns``, the simulator's rule).
    window_tasks : float
        0: every window is ``window_us``.
    sleep_us : float
        The longest window of a quiet rack (module docstring); at most ``window_us``: the
        windows never lengthen.
    """

    def __init__(self, Policy policy not None, WorkerPool pool not None,
                 Transport transport not None, double window_us,
                 double window_tasks=WINDOW_TASKS, double sleep_us=0.0):
        self.policy = policy
        self.pool = pool
        self.tr = transport
        self.window_ns = <int64_t>(window_us * 1000)
        self.window_now = self.window_ns
        self.win_tasks = window_tasks if window_tasks > 0.0 else 0.0
        self.sleep_ns = <int64_t>(sleep_us * 1000) if sleep_us * 1000 > self.window_ns else 0
        self.quiet = 0
        self.peer_busy = False
        self.sleeping = 0
        self.wake_req = 0
        self.idle_windows = 0
        self.idle_wakes = 0
        self.wakeups = 0
        self.hb_in = <Heartbeat*>mc_aligned_alloc(64, sizeof(Heartbeat) * HB_RING)
        self.hb_rx_ns = <int64_t*>mc_aligned_alloc(64, sizeof(int64_t) * HB_RING)
        self.hb_out = <Heartbeat*>mc_aligned_alloc(64, sizeof(Heartbeat))
        if self.hb_in == NULL or self.hb_rx_ns == NULL or self.hb_out == NULL:
            raise MemoryError("cannot allocate the heartbeat rings")
        memset(&self.bell, 0, sizeof(mc_doorbell))
        self.thread = None

    def __dealloc__(self):
        free(self.hb_in)
        free(self.hb_rx_ns)
        free(self.hb_out)

    def start(self, str prefix, pin):
        """Start the thread, named ``PREFIX-policy``; ``pin()`` pins it."""
        self.stop_flag = 0
        self.thread = threading.Thread(target=self._main, args=(prefix, pin), daemon=True,
                                       name="malcolm-policy")
        self.thread.start()

    def signal_stop(self):
        mc_store_rel(&self.stop_flag, 1)
        mc_bell_ring(&self.bell)

    def counters(self):
        return {"hb_observed": self.hb_observed, "hb_skipped": self.hb_skipped,
                "windows": self.windows, "window_us": self.window_now / 1000.0,
                "idle_windows": self.idle_windows, "idle_wakes": self.idle_wakes,
                "policy_wakeups": self.wakeups}

    cdef void wake(self) noexcept nogil:
        """The gateway, after it queued a task and rang the workers (a full fence): end a
        long window now. Read ``sleeping`` first; a ring costs a syscall only if this thread
        sleeps."""
        if mc_load_relaxed(&self.sleeping):
            mc_store_rel(&self.wake_req, 1)
            mc_bell_ring(&self.bell)

    def _main(self, str prefix, pin):
        name_thread(f"{prefix}-policy")
        pin()
        with nogil:
            prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
            self.loop()

    cdef bint observe_heartbeats(self) noexcept nogil:
        """Each heartbeat in the inbox to ``observe_peer``; True if one reported a task."""
        cdef uint64_t head = self.hb_head
        cdef bint busy = False
        while head != mc_load_acq(&self.hb_tail):
            busy |= hb_reports_tasks(&self.hb_in[head % HB_RING])
            # At the time the gateway received it: the delay it measures (the hop estimate,
            # sent_ns being when the sender's gateway sent it) is then what a migrated task
            # pays, the network and the receiving gateway, not also this thread's wake-up.
            drv_observe_peer(self.policy, self.hb_rx_ns[head % HB_RING],
                             &self.hb_in[head % HB_RING])
            head += 1
            mc_store_rel(&self.hb_head, head)
            self.hb_observed += 1
        self.peer_busy |= busy
        return busy

    cdef void loop(self) noexcept nogil:
        # The own load is observed at each boundary before end_window, and the driver stamps
        # the heartbeat.
        cdef int64_t now = mc_now_ns()
        cdef int64_t end = now + self.window_ns
        cdef uint32_t ticket
        cdef Heartbeat* hb
        cdef bint cut, filled
        drv_start(&self.win, self.policy, &self.pool.est, now, <double>self.pool.held)
        while not mc_load_acq(&self.stop_flag):
            # a long window ends at once for a busy peer or a task in (module docstring)
            cut = self.observe_heartbeats()
            if mc_load_acq(&self.wake_req):
                mc_store_rel(&self.wake_req, 0)
                cut = True
            now = mc_now_ns()
            if cut and self.sleeping:
                end = now
                self.quiet = 0
                self.idle_wakes += 1
            if now >= end:
                # The gateway has not sent the last heartbeat yet: no new one this window.
                hb = NULL if mc_load_acq(&self.hb_out_pending) else self.hb_out
                filled = drv_end_window(&self.win, self.policy, &self.pool.est, now,
                                        <double>self.pool.held, hb)
                self.windows += 1
                self.window_now = drv_window_ns(&self.win, &self.pool.est, self.window_ns,
                                                self.win_tasks)
                self.next_window()
                # The heartbeat says the window that follows (the gateway reads it after
                # this release): when its next one is due.
                if filled:
                    mc_store_rel(&self.hb_out_pending, 1)
                    self.tr.wake()
                else:
                    self.hb_skipped += 1
                now = mc_now_ns()
                end += self.window_now
                if end <= now:          # we fell behind (descheduled): skip, do not burst
                    end = now + self.window_now
                continue
            # Never spins, in either poll mode: its work comes at window ends and when
            # heartbeats arrive (the gateway rings for those), so a busy-polling server
            # spins only its gateway and its workers.
            ticket = mc_bell_prepare(&self.bell)
            if (self.hb_head != mc_load_acq(&self.hb_tail) or mc_load_acq(&self.stop_flag)
                    or mc_load_acq(&self.wake_req)):
                mc_bell_cancel(&self.bell)
                continue
            mc_bell_wait(&self.bell, ticket, end - now)
            self.wakeups += 1
        # The gateway has stopped: hand the policy what it received last.
        self.observe_heartbeats()

    cdef void next_window(self) noexcept nogil:
        """After a window end: the rack quiet one more window end, or not; from
        QUIET_WINDOWS on, the next window is twice the last, up to ``sleep_ns``."""
        cdef int64_t w
        if self.win.idle >= WINDOW_IDLE and not self.peer_busy:
            if self.quiet < QUIET_WINDOWS + 20:     # the longest window by then; no wrap
                self.quiet += 1
        else:
            self.quiet = 0
        self.peer_busy = False
        if self.sleep_ns == 0 or self.quiet < QUIET_WINDOWS:
            if self.sleeping:
                mc_store_rel(&self.sleeping, 0)
            return
        w = self.window_ns << min(self.quiet - QUIET_WINDOWS + 1, 20)
        self.window_now = w if w < self.sleep_ns else self.sleep_ns
        self.idle_windows += 1
        if not self.sleeping:
            # Dekker with the gateway (it adds to held, fences, then reads sleeping): a
            # task that came in meanwhile is seen here or rings us.
            mc_store_rel(&self.sleeping, 1)
            mc_fence_seq()
            if mc_load_relaxed(<uint64_t*>&self.pool.held):
                mc_store_rel(&self.sleeping, 0)
                self.quiet = 0
                self.idle_windows -= 1
                self.window_now = self.window_ns
