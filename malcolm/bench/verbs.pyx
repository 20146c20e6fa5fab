# cython: language_level=3
"""The verbs-only benchmark: UD round trips between two queues driven by one nogil loop.

Built only where libibverbs is (setup.py gates it with :mod:`malcolm.net._ud_queue`); the
transport benchmarks for every transport, verbs included, are :mod:`malcolm.bench.transport`.
"""
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memcmp, memcpy

from malcolm._core cimport mc_now_ns
from malcolm.net._ud_queue cimport UDMsg, UDQueue, uq_flush, uq_poll_recv, uq_reap, uq_send

import numpy as np


def pingpong(UDQueue a, int a_to_b, UDQueue b, int b_to_a, int iters, int size,
             double timeout=1.0):
    """Round trips a -> b -> a in one thread, without the GIL.

    Parameters
    ----------
    a, b : UDQueue
        Two queues; ``a_to_b`` is b's peer index on a and ``b_to_a`` is a's on b.
    iters, size : int
        Number of round trips and message size in bytes.
    timeout : float
        Seconds to wait for any single message before counting it lost.

    Returns
    -------
    rtt_ns : ndarray of int64
        Round-trip time of each completed round trip.
    lost : int
        Round trips that timed out (UD does not retransmit).
    """
    if size < 8 or size > a.payload or size > b.payload:
        raise ValueError(f"size must be in [8, {min(a.payload, b.payload)}]")
    rtt = np.zeros(iters, np.int64)
    cdef int64_t[::1] r = rtt
    cdef uint8_t[::1] msg = np.zeros(size, np.uint8)
    cdef UDMsg got[16]
    cdef int i, n, done = 0, lost = 0, failed = 0
    cdef int64_t t0, limit = <int64_t>(timeout * 1e9)
    cdef uint64_t seq
    with nogil:
        for i in range(iters):
            seq = <uint64_t>i
            memcpy(&msg[0], &seq, 8)
            t0 = mc_now_ns()
            if uq_send(a, a_to_b, &msg[0], size) != 1 or uq_flush(a) != 0:
                failed = 1
                break
            # b echoes what it gets.
            n = 0
            while n == 0 and mc_now_ns() - t0 < limit:
                n = uq_poll_recv(b, got, 16)
            if n <= 0:
                lost += 1
                continue
            if uq_send(b, b_to_a, got[0].data, got[0].length) != 1 or uq_flush(b) != 0:
                failed = 1
                break
            n = 0
            while n == 0 and mc_now_ns() - t0 < limit:
                n = uq_poll_recv(a, got, 16)
            if n <= 0 or memcmp(got[0].data, &seq, 8) != 0:
                lost += 1
                continue
            r[done] = mc_now_ns() - t0
            done += 1
            if i % 8 == 7:
                uq_reap(a)
                uq_reap(b)
    if failed:
        raise OSError("posting a send failed during the ping-pong")
    return rtt[:done], lost
