# cython: language_level=3
cimport cython
from libc.stdint cimport int64_t, uint64_t

from malcolm.net.transport cimport Transport
from malcolm.policy.base cimport Heartbeat, Policy
from malcolm.policy.driver cimport WindowState
from malcolm._native cimport mc_doorbell
from malcolm.workers.pool cimport WorkerPool


cdef enum:
    HB_RING = 64                 # heartbeats in flight from the gateway to the policy thread


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
    cdef object thread

    cdef void observe_heartbeats(self) noexcept nogil
    cdef void loop(self) noexcept nogil
