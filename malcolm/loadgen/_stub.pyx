# cython: language_level=3
"""A stub server for testing the load generator: it answers every task after a fixed delay.

It speaks the real wire format over a real transport, so it checks the generator end to end,
but it has no queueing of its own: task k is answered ``delay`` after it was received (FIFO,
so the order of answers is the order of arrival). It can misbehave on purpose:

* **stall**: answer nothing between two instants, then answer everything that came due;
* **reject** every k-th task with a given status (answered at once, in FIFO order);
* **drop** every k-th task (never answered: the client must time it out);
* mark every k-th response migrated or stolen.

The loop runs without the GIL in its own thread (:class:`malcolm.loadgen.stub.StubServer`).
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free

from malcolm._core cimport mc_aligned_alloc, mc_cpu_relax, mc_load_acq, mc_now_ns, \
    mc_store_rel
from malcolm.net._wire cimport *
from malcolm._system cimport PR_SET_TIMERSLACK, prctl
from malcolm.net.transport cimport BATCH, MsgBuf, Transport


ctypedef struct Pending:
    NetAddr peer
    WireResp r
    int64_t due


cdef class StubCore:
    """The native part of the stub (see the module docstring). Parameters are in ns."""
    cdef Transport tr
    cdef uint16_t index
    cdef int64_t delay_ns, spin_ns
    cdef uint64_t every_reject, every_drop, every_migrated, every_stolen
    cdef uint8_t reject_status
    cdef bint busy
    cdef Pending* q
    cdef uint64_t head, tail, cap
    cdef uint64_t stall_from, stall_until, stop_flag
    cdef public uint64_t tasks, answered, rejected, ignored, malformed, overflow
    cdef mc_sipkey key              # the all-zero key: the stub is an unauthenticated rack
    cdef uint64_t epoch, tx_seq

    def __init__(self, Transport transport not None, int index=0, double delay_us=100.0,
                 int every_reject=0, int reject_status=1, int every_drop=0,
                 int every_migrated=0, int every_stolen=0, bint busy=False,
                 double spin_us=30.0, int capacity=1 << 18):
        if not 1 <= reject_status <= 5:
            raise ValueError("reject_status must be a non-ok status 1..5")
        self.tr = transport
        self.index = index
        self.delay_ns = <int64_t>(delay_us * 1e3)
        self.spin_ns = <int64_t>(spin_us * 1e3)
        self.every_reject = every_reject
        self.every_drop = every_drop
        self.every_migrated = every_migrated
        self.every_stolen = every_stolen
        self.reject_status = reject_status
        self.busy = busy
        self.cap = capacity
        self.q = <Pending*>mc_aligned_alloc(64, sizeof(Pending) * self.cap)
        if self.q == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.q)

    def stall(self, double after_s, double duration_s):
        """Answer nothing from ``after_s`` from now for ``duration_s`` seconds."""
        cdef int64_t now = mc_now_ns()
        mc_store_rel(&self.stall_until, <uint64_t>(now + <int64_t>((after_s + duration_s) * 1e9)))
        mc_store_rel(&self.stall_from, <uint64_t>(now + <int64_t>(after_s * 1e9)))

    def stop(self):
        mc_store_rel(&self.stop_flag, 1)
        self.tr.wake()

    def run(self):
        with nogil:
            prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
            self._loop()

    @property
    def pending(self):
        return self.tail - self.head

    cdef void _on_msg(self, MsgBuf* m, int64_t now) noexcept nogil:
        cdef WireHdr h
        cdef WireTask t
        cdef Pending* p
        cdef uint64_t k
        cdef uint64_t ep, aseq
        cdef int rc = wire_header(m.data, m.len, &h)
        if rc != K_TASK:
            self.malformed += 1
            return
        rc = wire_open(m.data, m.len, &self.key, &ep, &aseq)
        if rc < 0:
            self.malformed += 1
            return
        rc = wire_get_task(m.data, <uint32_t>rc, &t)
        if rc < 0:
            self.malformed += 1
            return
        k = self.tasks
        self.tasks += 1
        if self.every_drop and k % self.every_drop == self.every_drop - 1:
            self.ignored += 1
            return
        if self.tail - self.head >= self.cap:
            self.overflow += 1
            return
        p = &self.q[self.tail % self.cap]
        self.tail += 1
        p.peer = m.peer
        p.due = now + self.delay_ns
        p.r.client_id = t.client_id
        p.r.task_type = t.task_type
        p.r.request_id = t.request_id
        p.r.send_ns = t.send_ns
        p.r.service_ns = t.service_ns
        p.r.payload_len = 0
        p.r.payload = NULL
        p.r.server = self.index
        p.r.status = ST_OK
        p.r.flags = 0
        if self.every_reject and k % self.every_reject == self.every_reject - 1:
            p.r.status = self.reject_status
            p.due = now
            self.rejected += 1
        if self.every_migrated and k % self.every_migrated == 0:
            p.r.flags |= F_MIGRATED
        if self.every_stolen and k % self.every_stolen == 0:
            p.r.flags |= F_STOLEN

    cdef void _loop(self) noexcept nogil:
        cdef int n, i, k
        cdef int64_t now, until, wait, s_from, s_until
        cdef Pending* p
        cdef MsgBuf* b
        cdef bint stalled
        while not mc_load_acq(&self.stop_flag):
            n = self.tr.rx_poll(BATCH)
            # Read the clock after the receive: a task must never be due before it arrived.
            now = mc_now_ns()
            for i in range(n):
                self._on_msg(&self.tr.rx[i], now)
            self.tr.rx_release(n)
            s_from = <int64_t>mc_load_acq(&self.stall_from)
            s_until = <int64_t>mc_load_acq(&self.stall_until)
            stalled = s_from <= now < s_until
            k = 0
            if not stalled:
                while self.head < self.tail and self.q[self.head % self.cap].due <= now:
                    p = &self.q[self.head % self.cap]
                    p.r.queue_len = <uint32_t>(self.tail - self.head)
                    p.r.load = <double>(self.tail - self.head) * <double>self.delay_ns
                    b = self.tr.tx_next(&p.peer)
                    self.tx_seq += 1
                    b.len = wire_seal(b.data, wire_put_resp(b.data, b.cap, self.index, &p.r),
                                      &self.key, self.epoch, self.tx_seq)
                    self.head += 1
                    self.answered += 1
                    k += 1
                if k:
                    self.tr.tx_flush()
            if n or k:
                continue
            if self.busy:
                mc_cpu_relax()
                continue
            if self.head < self.tail:
                until = s_until if stalled else self.q[self.head % self.cap].due
                wait = until - now - self.spin_ns
            else:
                wait = 5_000_000
            if wait < 20_000:
                mc_cpu_relax()
                continue
            self.tr.wait_prepare()
            self.tr.wait_idle(min(wait, 5_000_000))
