# cython: language_level=3
cimport cython
from libc.stdint cimport int64_t, uint32_t, uint64_t

from malcolm.net.transport cimport Transport
from malcolm.policy.base cimport Heartbeat, Policy
from malcolm.policy.driver cimport WindowState
from malcolm._native cimport mc_doorbell
from malcolm.workers.pool cimport WorkerPool


cdef enum:
    HB_RING = 64                 # heartbeats in flight from the gateway to the policy thread
    QUIET_WINDOWS = 50           # window ends of a quiet rack before the windows lengthen


cdef inline bint hb_reports_tasks(const Heartbeat* hb) noexcept nogil:
    """A peer's heartbeat that reports tasks: it ends a quiet rack's long window. The one
    rule for both threads: the gateway rings for it at once, the policy thread cuts."""
    return hb.queue_len > 0.0


# final: calls between the hot methods are direct C calls, not through the vtable
@cython.final
cdef class PolicyThread:
    cdef Policy policy
    cdef WorkerPool pool            # its estimator and the tasks held: the own load
    cdef Transport tr               # woken when a heartbeat is ready to send
    cdef int64_t window_ns          # the configured window: the longest (drv_window_ns)
    cdef int64_t window_now         # the window drv_window_ns gave last
    cdef double win_tasks           # task times per window; 0: window_ns, fixed
    cdef Heartbeat* hb_in           # ring: the gateway writes at hb_tail, this thread reads
    cdef int64_t* hb_rx_ns          # the same ring: when the gateway received each
    cdef uint64_t hb_head, hb_tail
    cdef Heartbeat* hb_out          # this thread -> the gateway, one at a time
    cdef uint64_t hb_out_pending
    cdef mc_doorbell bell           # the gateway rings it when heartbeats arrive
    cdef WindowState win            # the window protocol (policy/driver.pxd)
    cdef uint64_t stop_flag
    cdef uint64_t windows, hb_observed, hb_skipped
    # A quiet rack (this server empty, no peer reporting a task) lengthens its windows up
    # to sleep_ns, which cuts the idle rack's wake-ups; a task in or a busy peer ends the
    # long window at once (module docstring).
    cdef int64_t sleep_ns           # the longest window of a quiet rack; <= window_ns: off
    cdef uint32_t quiet             # window ends in a row with the rack quiet
    cdef bint peer_busy             # a heartbeat since the last window end reported tasks
    cdef uint64_t sleeping          # 1 while the window is longer than window_ns (gateway)
    cdef uint64_t wake_req          # set by the gateway: a task came in during a long window
    cdef uint64_t idle_windows, idle_wakes
    cdef uint64_t wakeups           # waits that ended (a window's end or a ring)
    cdef object thread

    cdef void wake(self) noexcept nogil
    cdef bint observe_heartbeats(self) noexcept nogil
    cdef void loop(self) noexcept nogil
    cdef void next_window(self) noexcept nogil
