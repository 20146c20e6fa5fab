# cython: language_level=3
"""The transport interface: how a gateway (or a client) moves messages, without the GIL.

It is shaped after RDMA verbs so that the ``verbs`` transport fits without copies:

* **receive**: ``rx_poll(max)`` fills ``rx[0:n]`` with descriptors that point into buffers the
  transport owns (for verbs: registered receive buffers, one per completion polled from the
  CQ). The caller reads them in place, then hands them all back with ``rx_release(n)`` (verbs:
  repost the receives in one batch).
* **send**: ``tx_next(dst)`` returns the next descriptor of the send batch, whose ``data``
  points into transport-owned (for verbs: registered) memory; the caller writes the message
  there and sets ``len``. ``tx_flush()`` posts the whole batch (sendmmsg / ring pushes /
  a chain of work requests). ``tx_next`` flushes by itself when the batch is full.
* **adaptive blocking**: ``wait_prepare()``; the caller re-checks its own in-process queues;
  then ``wait_idle(timeout)`` (blocks until input may be ready, ``wake()`` is called, or the
  timeout passes) or ``wait_cancel()``. ``wake()`` may be called from any thread and costs
  nothing unless the owner is about to sleep (verbs: the CQ's completion channel fd).

Only the thread that owns a transport calls its methods, except ``wake()``.
"""
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

from malcolm.net._wire cimport NetAddr


cdef enum:
    BATCH = 64          # descriptors per receive or send batch
    SLOT = 4096         # bytes per staging buffer (>= MAX_MSG)


ctypedef struct MsgBuf:
    uint8_t* data
    uint32_t len
    uint32_t cap
    NetAddr peer        # source of a received message / destination of a sent one


cdef class Transport:
    cdef readonly str kind
    cdef NetAddr me
    cdef MsgBuf rx[BATCH]
    cdef MsgBuf tx[BATCH]
    cdef int n_tx
    cdef uint8_t* txmem
    cdef readonly bint closed
    cdef public uint64_t n_sent         # messages handed to the medium
    cdef public uint64_t n_recv
    cdef public uint64_t n_send_failed  # messages that could not be sent (full, no such peer)

    cdef int rx_poll(self, int max_n) noexcept nogil
    cdef void rx_release(self, int n) noexcept nogil
    cdef MsgBuf* tx_next(self, const NetAddr* dst) noexcept nogil
    cdef int tx_flush(self) noexcept nogil
    cdef void wait_prepare(self) noexcept nogil
    cdef void wait_idle(self, int64_t timeout_ns) noexcept nogil
    cdef void wait_cancel(self) noexcept nogil
    cdef void wake(self) noexcept nogil
    cdef void local_addr(self, NetAddr* out) noexcept nogil


cdef bint addr_eq(const NetAddr* a, const NetAddr* b) noexcept nogil
cdef int addr_parse(str kind, object obj, NetAddr* out) except -1
cdef object addr_py(const NetAddr* a)
