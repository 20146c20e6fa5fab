# cython: language_level=3
"""The worker pool of a server: task slots, the central FCFS queue and the worker threads.

The gateway (``malcolm/runtime/gateway.pyx``) fills slots and pushes their indices on
``runq`` (a task it stole, where its policy says ``stolen_first``, on ``stealq``, which the
workers empty first: ``pool_pop``); workers pop them, run the handler without the GIL and
push them on ``doneq``; the gateway turns those into responses. The two inline helpers below
are the only copies between a slot and the wire's ``WireTask``: every path (accept, forward,
steal, answer) goes through them.
"""
cimport cython
from libc.stdint cimport UINT32_MAX, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from malcolm._core cimport Estimator, Mpmc, mpmc_pop, mpmc_size
from malcolm._hist cimport Hist
from malcolm._native cimport (
    mc_add64_relaxed, mc_bell_cancel, mc_bell_prepare, mc_bell_ring, mc_bell_ring_n, mc_bell_wait,
    mc_doorbell,
)
from malcolm.net._wire cimport MAX_PAYLOAD, NetAddr, WireTask
from malcolm.net.transport cimport Transport
from malcolm.workers.handlers cimport Handler


cdef enum:
    IDLE_WAIT_NS = 5_000_000     # longest block in adaptive mode: bounds the reaction to stop


ctypedef struct TaskSlot:
    NetAddr reply
    uint32_t client_id
    uint16_t task_type
    uint16_t flags
    uint64_t request_id
    int64_t service_ns
    int64_t send_ns
    int64_t arrive_ns
    int64_t deadline_ns         # answer TIMED_OUT if not started by then (0: no deadline)
    int64_t measured_ns
    uint16_t origin
    uint8_t status
    uint8_t _pad
    uint32_t payload_len
    uint32_t out_len
    uint8_t payload[MAX_PAYLOAD]
    uint8_t out[MAX_PAYLOAD]


# Written by the workers (atomically: several write each), read racily by stats().
ctypedef struct PoolCounters:
    uint64_t completed           # handler returned 0
    uint64_t handler_errors
    uint64_t timed_out           # not started by its deadline


cdef inline void slot_from_task(TaskSlot* s, const WireTask* t, const NetAddr* reply,
                                uint16_t flags, uint16_t origin, int64_t now,
                                int64_t deadline) noexcept nogil:
    """Keep task ``t`` in slot ``s`` (its payload copied: the receive buffer is reused)."""
    s.reply = reply[0]
    s.client_id = t.client_id
    s.task_type = t.task_type
    s.flags = flags
    s.request_id = t.request_id
    s.service_ns = t.service_ns
    s.send_ns = t.send_ns
    s.arrive_ns = now
    s.deadline_ns = deadline
    s.origin = origin
    s.payload_len = t.payload_len
    if t.payload_len:
        memcpy(s.payload, t.payload, t.payload_len)


cdef inline void slot_to_task(const TaskSlot* s, WireTask* t, uint16_t flags,
                              uint32_t seq) noexcept nogil:
    """The wire form of the task in slot ``s`` (its payload points into the slot; no
    deadline: a move sets ``budget_us`` with :func:`budget_left_us`)."""
    t.client_id = s.client_id
    t.task_type = s.task_type
    t.payload_len = <uint16_t>s.payload_len
    t.request_id = s.request_id
    t.service_ns = s.service_ns
    t.send_ns = s.send_ns
    t.reply = s.reply
    t.origin = s.origin
    t.flags = flags
    t.seq = seq
    t.budget_us = 0
    t.payload = s.payload


cdef inline uint32_t budget_left_us(int64_t deadline_ns, int64_t now) noexcept nogil:
    """What is left of a deadline, for the wire (at least 1 µs; 0: no deadline)."""
    cdef int64_t left
    if deadline_ns <= 0:
        return 0
    left = (deadline_ns - now) // 1000
    return <uint32_t>(1 if left < 1 else (left if left < UINT32_MAX else UINT32_MAX))


# final: calls between the hot methods are direct C calls, not through the vtable
@cython.final
cdef class WorkerPool:
    cdef readonly int n_workers
    cdef readonly uint32_t capacity
    cdef readonly bint busy
    cdef Handler handler
    cdef Transport tr               # woken after each task: the gateway sends the response
    cdef TaskSlot* slots
    cdef Mpmc* runq                 # waiting tasks (slot indices), FIFO
    cdef Mpmc* stealq               # waiting stolen tasks, FIFO, taken before runq's
    cdef Mpmc* doneq                # run, waiting for the gateway to answer them
    cdef int64_t held               # tasks held: waiting + running (only the gateway writes)
    cdef Estimator est              # service rates, from the workers' measurements
    cdef bint est_ok
    cdef Hist* svc_hist             # one per worker (inline: one): measured handler times
    cdef int64_t spin_ns
    cdef uint64_t stop_flag
    cdef mc_doorbell bell           # rung by the gateway, one sleeping worker per task
    cdef PoolCounters count
    cdef object threads

    cdef int64_t run_task(self, int w, uint64_t idx, int64_t t0) noexcept nogil
    cdef void loop(self, int w) noexcept nogil


cdef inline bint pool_pop(WorkerPool p, uint64_t* idx) noexcept nogil:
    """The next waiting task for a worker: a stolen one first (the victim's oldest, which
    behind this server's own arrivals would wait a second time), else the oldest."""
    return mpmc_pop(p.stealq, idx) or mpmc_pop(p.runq, idx)


cdef inline uint64_t pool_waiting(WorkerPool p) noexcept nogil:
    """Tasks waiting for a worker (both queues)."""
    return mpmc_size(p.runq) + mpmc_size(p.stealq)
