# cython: language_level=3
"""A network emulator in the transport: per-hop delay, jitter, reordering and loss.

This VM's kernel has no ``sch_netem``, and ``--dilate K`` must scale the network's delay with
the service times (issue 11 item 5), so the delay lives in the sender. :class:`DelayTransport`
wraps any :class:`~malcolm.net.transport.Transport` (udp, shm, verbs) and holds every message
it is asked to send until ``now + delay`` (plus a uniform ``[0, jitter)``), in a timed queue
(a binary heap on the due time) owned by the sending thread:

* ``tx_flush`` moves the batch into the queue, then sends what is due;
* ``rx_poll`` first sends what has come due (the gateway and the load generator poll in a
  loop), so nothing needs a timer thread or a system call of its own;
* ``wait_idle`` sleeps at most until the earliest due time, so a message is late by no more
  than the medium's wake-up latency when the sender is otherwise idle.

Like netem, ``reorder`` is the fraction of messages sent at once, overtaking the delayed ones
(jitter reorders too: every message draws its own delay, as the simulator's ``jitter_us``
does), and ``loss`` the fraction dropped on the way (counted in ``n_net_lost``; a real network
does not tell the sender either). With ``delay = jitter = 0`` and no reordering a message
goes straight through; :func:`wrap` returns the transport itself when nothing is asked for.

Only the owning thread calls the methods, except ``wake()``, as for every transport.
"""
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy

from malcolm._core cimport Rng, mc_aligned_alloc, mc_now_ns, rng_seed, rng_uniform
from malcolm.net._wire cimport MAX_MSG, NetAddr
from malcolm.net.transport cimport BATCH, MsgBuf, Transport


ctypedef struct Held:
    int64_t due          # when it may go (CLOCK_MONOTONIC ns)
    uint64_t order       # ties (and zero jitter) keep the order of sending
    uint32_t slot        # its bytes: mem + slot * MAX_MSG
    uint32_t len
    NetAddr peer


cdef inline bint _before(const Held* a, const Held* b) noexcept nogil:
    return a.due < b.due or (a.due == b.due and a.order < b.order)


cdef class DelayTransport(Transport):
    """Hold each outgoing message of ``inner`` for a per-hop delay (see the module docstring).

    Parameters
    ----------
    inner : Transport
        The medium; it is owned (closed with this one).
    delay_us, jitter_us : float
        Every message waits ``delay_us + U[0, jitter_us)`` before it is handed to ``inner``.
    reorder : float
        Fraction of messages sent without the delay (ahead of the held ones), 0..1.
    loss : float
        Fraction of messages dropped, 0..1.
    capacity : int
        Messages that may be held at once (``capacity * 4032`` bytes, allocated at the first
        one held). When it is full the earliest-due message goes out early (counted in
        ``n_early``): a burst is never dropped for the emulator's sake.
    seed : int
        Seed of the jitter, reordering and loss draws.
    """
    cdef readonly Transport inner
    cdef int64_t delay_ns, jitter_ns
    cdef double reorder, loss
    cdef Rng rng
    cdef Held* heap
    cdef uint32_t* free_slots
    cdef uint8_t* mem
    cdef int n_held, n_free, cap
    cdef uint64_t order
    cdef public uint64_t n_delayed      # messages that waited in the queue
    cdef public uint64_t n_net_lost     # dropped on purpose (``loss``)
    cdef public uint64_t n_reordered    # sent at once, overtaking held ones (``reorder``)
    cdef public uint64_t n_early        # sent before their due time: the queue was full
    cdef public int64_t max_late_ns     # the latest a held message went out after its due

    def __init__(self, Transport inner not None, double delay_us=0.0, double jitter_us=0.0,
                 double reorder=0.0, double loss=0.0, int capacity=1024, unsigned long seed=1):
        for name, v, hi in (("delay_us", delay_us, 60e6), ("jitter_us", jitter_us, 60e6),
                            ("reorder", reorder, 1.0), ("loss", loss, 1.0)):
            if not 0.0 <= v <= hi:          # also refuses NaN
                raise ValueError(f"{name} = {v!r} must be in 0..{hi:g}")
        if capacity < 1:
            raise ValueError(f"capacity = {capacity} must be >= 1")
        self.inner = inner
        self.kind = inner.kind
        inner.local_addr(&self.me)
        self.delay_ns = <int64_t>(delay_us * 1e3)
        self.jitter_ns = <int64_t>(jitter_us * 1e3)
        self.reorder, self.loss = reorder, loss
        rng_seed(&self.rng, seed, 0xDE1A7)
        self.cap = capacity
        for i in range(BATCH):
            self.rx[i].cap = inner.rx[i].cap
        self.closed = inner.closed

    def __dealloc__(self):
        free(self.heap)
        free(self.free_slots)
        free(self.mem)

    @property
    def held(self):
        """Messages waiting for their due time now."""
        return self.n_held

    @property
    def delay_us(self):
        return self.delay_ns / 1e3

    @property
    def jitter_us(self):
        return self.jitter_ns / 1e3

    # ------------------------------------------------------------ the timed queue
    cdef int _alloc(self) noexcept nogil:
        cdef int i
        self.heap = <Held*>mc_aligned_alloc(64, sizeof(Held) * self.cap)
        self.free_slots = <uint32_t*>mc_aligned_alloc(64, sizeof(uint32_t) * self.cap)
        self.mem = <uint8_t*>mc_aligned_alloc(64, <size_t>self.cap * MAX_MSG)
        if self.heap == NULL or self.free_slots == NULL or self.mem == NULL:
            return -1
        for i in range(self.cap):
            self.free_slots[i] = self.cap - 1 - i
        self.n_free = self.cap
        return 0

    cdef void _push(self, const Held* h) noexcept nogil:
        cdef int i = self.n_held, p
        self.n_held += 1
        while i > 0:
            p = (i - 1) >> 1
            if not _before(h, &self.heap[p]):
                break
            self.heap[i] = self.heap[p]
            i = p
        self.heap[i] = h[0]

    cdef void _pop(self, Held* out) noexcept nogil:
        cdef int i = 0, c, n
        cdef Held last
        out[0] = self.heap[0]
        self.n_held -= 1
        n = self.n_held
        if n == 0:
            return
        last = self.heap[n]
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and _before(&self.heap[c + 1], &self.heap[c]):
                c += 1
            if not _before(&self.heap[c], &last):
                break
            self.heap[i] = self.heap[c]
            i = c
        self.heap[i] = last

    cdef inline void _out(self, const NetAddr* peer, const uint8_t* data,
                          uint32_t n) noexcept nogil:
        cdef MsgBuf* b = self.inner.tx_next(peer)
        memcpy(b.data, data, n)
        b.len = n

    cdef void _release_due(self, int64_t now, bint all_) noexcept nogil:
        """Hand every held message that is due (``all_``: every one) to the medium."""
        cdef Held h
        cdef int64_t late
        while self.n_held and (all_ or self.heap[0].due <= now):
            self._pop(&h)
            late = now - h.due
            if late > self.max_late_ns:
                self.max_late_ns = late
            self._out(&h.peer, self.mem + <size_t>h.slot * MAX_MSG, h.len)
            self.free_slots[self.n_free] = h.slot
            self.n_free += 1

    cdef void _pump(self) noexcept nogil:
        """Send what has come due; one clock read, and none when nothing is held."""
        if self.n_held == 0:
            return
        cdef int64_t now = mc_now_ns()
        if self.heap[0].due <= now:
            self._release_due(now, False)
            self._flush_inner()

    cdef inline void _flush_inner(self) noexcept nogil:
        self.inner.tx_flush()
        self.n_sent = self.inner.n_sent
        self.n_send_failed = self.inner.n_send_failed

    # ------------------------------------------------------------ the interface
    cdef int tx_flush(self) noexcept nogil:
        cdef int i, n = self.n_tx
        cdef int64_t now
        cdef Held h
        cdef MsgBuf* m
        self.n_tx = 0
        if n == 0 and self.n_held == 0:
            return 0
        now = mc_now_ns()
        for i in range(n):
            m = &self.tx[i]
            if self.loss > 0.0 and rng_uniform(&self.rng) < self.loss:
                self.n_net_lost += 1
                continue
            if self.reorder > 0.0 and rng_uniform(&self.rng) < self.reorder:
                if self.n_held:
                    self.n_reordered += 1
                self._out(&m.peer, m.data, m.len)
                continue
            h.due = now + self.delay_ns
            if self.jitter_ns > 0:
                h.due += <int64_t>(rng_uniform(&self.rng) * <double>self.jitter_ns)
            if h.due <= now and self.n_held == 0:
                self._out(&m.peer, m.data, m.len)
                continue
            if self.heap == NULL and self._alloc() < 0:
                self._out(&m.peer, m.data, m.len)       # no memory: no delay, no loss
                continue
            if self.n_held == self.cap:
                self.n_early += 1
                self._release_due(now, False)
                if self.n_held == self.cap:             # nothing due yet: the earliest goes
                    self._pop(&h)
                    self._out(&h.peer, self.mem + <size_t>h.slot * MAX_MSG, h.len)
                    self.free_slots[self.n_free] = h.slot
                    self.n_free += 1
                    h.due = now + self.delay_ns
                    if self.jitter_ns > 0:
                        h.due += <int64_t>(rng_uniform(&self.rng) * <double>self.jitter_ns)
            self.n_free -= 1
            h.slot = self.free_slots[self.n_free]
            h.len = m.len
            h.peer = m.peer
            h.order = self.order
            self.order += 1
            memcpy(self.mem + <size_t>h.slot * MAX_MSG, m.data, m.len)
            self._push(&h)
            self.n_delayed += 1
        self._release_due(now, False)
        self._flush_inner()
        return n

    cdef int rx_poll(self, int max_n) noexcept nogil:
        cdef int n
        self._pump()
        n = self.inner.rx_poll(max_n)
        if n > 0:
            memcpy(self.rx, self.inner.rx, sizeof(MsgBuf) * n)
        self.n_recv = self.inner.n_recv
        return n

    cdef void rx_release(self, int n) noexcept nogil:
        self.inner.rx_release(n)

    cdef void wait_prepare(self) noexcept nogil:
        self.inner.wait_prepare()

    cdef void wait_idle(self, int64_t timeout_ns) noexcept nogil:
        cdef int64_t left
        if self.n_held:
            left = self.heap[0].due - mc_now_ns()
            if left <= 0:
                self.inner.wait_cancel()
                self._pump()
                return
            if timeout_ns < 0 or left < timeout_ns:
                timeout_ns = left
        self.inner.wait_idle(timeout_ns)
        self._pump()

    cdef void wait_cancel(self) noexcept nogil:
        self.inner.wait_cancel()

    cdef void wake(self) noexcept nogil:
        self.inner.wake()

    cdef void local_addr(self, NetAddr* out) noexcept nogil:
        self.inner.local_addr(out)

    def flush_held(self):
        """Send every held message now (before a close: a clean stop loses nothing)."""
        with nogil:
            self._release_due(0, True)
            self._flush_inner()

    def stats(self):
        """The emulator's counters (a dict)."""
        return {"delay_us": self.delay_ns / 1e3, "jitter_us": self.jitter_ns / 1e3,
                "reorder": self.reorder, "loss": self.loss, "delayed": self.n_delayed,
                "net_lost": self.n_net_lost, "reordered": self.n_reordered,
                "early": self.n_early, "held": self.n_held,
                "max_late_us": self.max_late_ns / 1e3}

    def close(self):
        if not self.closed:
            if not self.inner.closed:
                self.flush_held()
            self.closed = True
            self.inner.close()


def wrap(Transport tr not None, double delay_us=0.0, double jitter_us=0.0,
         double reorder=0.0, double loss=0.0, unsigned long seed=1):
    """``tr`` behind a :class:`DelayTransport`, or ``tr`` itself when nothing is emulated."""
    if delay_us == 0.0 and jitter_us == 0.0 and reorder == 0.0 and loss == 0.0:
        return tr
    return DelayTransport(tr, delay_us, jitter_us, reorder, loss, seed=seed)
