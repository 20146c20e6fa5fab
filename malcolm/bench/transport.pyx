# cython: language_level=3
"""Transport benchmarks for every transport (udp, shm, verbs): an echo loop and round trips,
both busy-polling without the GIL through the transport interface (``transport.pxd``).

They need nothing but that interface, so they build without libibverbs; a verbs transport
is benchmarked like the others when its extension is built. ``python3 -m
malcolm.bench.pingpong`` runs them between two processes or machines.
"""
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from malcolm._core cimport mc_cpu_relax, mc_now_ns
from malcolm.net._wire cimport MAX_MSG, NetAddr
from malcolm.net.transport cimport BATCH, MsgBuf, Transport, addr_parse

import numpy as np


def transport_echo(Transport t, double seconds, long max_msgs=-1):
    """Send every message back to its sender, busy-polling without the GIL.

    Stops after ``seconds`` or ``max_msgs`` messages; returns how many were echoed. Works on
    any transport (udp and shm too, for comparisons).
    """
    if t.closed:
        raise RuntimeError("transport is closed")
    cdef int64_t deadline = mc_now_ns() + <int64_t>(seconds * 1e9)
    cdef long done = 0
    cdef int n, i
    cdef uint32_t spins = 0
    cdef MsgBuf *b
    with nogil:
        while max_msgs < 0 or done < max_msgs:
            n = t.rx_poll(BATCH)
            for i in range(n):
                b = t.tx_next(&t.rx[i].peer)
                memcpy(b.data, t.rx[i].data, t.rx[i].len)
                b.len = t.rx[i].len
            t.rx_release(n)
            if n:
                t.tx_flush()
                done += n
                continue
            spins += 1
            if (spins & 1023) == 0 and mc_now_ns() > deadline:
                break
            mc_cpu_relax()
    return done


def transport_pingpong(Transport t, dst, int iters, int size=32, double timeout=1.0):
    """Round trips to an echoing peer (:func:`transport_echo`), busy-polling without the GIL.

    Returns ``(rtt_ns, lost)``: the round-trip time of each completed round trip, and how many
    got no answer within ``timeout`` seconds.
    """
    if size < 8 or size > MAX_MSG:
        raise ValueError(f"size must be in [8, {MAX_MSG}]")
    cdef NetAddr d
    addr_parse(t.kind, dst, &d)
    rtt = np.zeros(iters, np.int64)
    cdef int64_t[::1] r = rtt
    cdef int64_t t0, limit = <int64_t>(timeout * 1e9)
    cdef uint64_t seq, got
    cdef int i, n, k, done = 0, lost = 0
    cdef bint ok
    cdef MsgBuf *b
    with nogil:
        for i in range(iters):
            seq = <uint64_t>i + 1
            t0 = mc_now_ns()
            b = t.tx_next(&d)
            memset(b.data, 0, size)
            memcpy(b.data, &seq, 8)
            b.len = size
            t.tx_flush()
            ok = False
            while not ok and mc_now_ns() - t0 < limit:
                n = t.rx_poll(BATCH)
                for k in range(n):
                    if t.rx[k].len >= 8:
                        memcpy(&got, t.rx[k].data, 8)
                        if got == seq:
                            ok = True
                t.rx_release(n)
                if not ok:
                    mc_cpu_relax()
            if ok:
                r[done] = mc_now_ns() - t0
                done += 1
            else:
                lost += 1
    return rtt[:done], lost
