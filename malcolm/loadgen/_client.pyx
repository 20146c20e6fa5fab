# cython: language_level=3
"""The load generator's native client: one open-loop sender and receiver per thread.

Each :class:`LoadClient` owns a transport endpoint and runs, without the GIL, a loop that

* sends every task at its **intended** time (a Poisson, fixed-interval or trace-driven
  schedule fixed in advance of the network: a late send keeps its intended time, and the
  generator bursts to catch up), and records how late each send actually was;
* gives each task a payload of a sampled size (fixed, uniform or exponential, within the
  wire's limit) filled with zeros, random bytes, or a pattern that an echo can be checked
  against;
* receives responses and measures latency from the intended send time, so that a stalled
  server shows up in the percentiles instead of silently slowing the generator down
  (no coordinated omission);
* accounts for every task: completed, rejected by a server (by status), or timed out on the
  client; late and duplicate responses and malformed datagrams are counted too.

Requests are tracked in a power-of-two window indexed by request id (ids are sequential per
client), which is enough to detect timeouts in order of intended send time.
"""
from libc.stdint cimport UINT32_MAX, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

import numpy as np

from malcolm._shares import cumulative

from malcolm._core cimport Rng, mc_aligned_alloc, mc_cpu_relax, mc_load_acq, mc_now_ns, \
    mc_store_rel, rng_below, rng_exponential, rng_next, rng_seed, rng_uniform
from malcolm._workload cimport NativeWorkload, WorkloadC, wl_sample
from malcolm._hist cimport Hist, hist_add
from malcolm.loadgen._apps cimport KvApp
from malcolm.loadgen._hist_py cimport hist_py
from malcolm.net._wire cimport *
from malcolm.net.transport cimport BATCH, MsgBuf, Transport, addr_parse
from malcolm.policy.base cimport MAX_SERVERS, ClientPolicy


from malcolm._system cimport prctl, PR_SET_TIMERSLACK


cdef inline int64_t _i64max() noexcept nogil:
    return 0x7FFFFFFFFFFFFFFF


cdef class LoadClient:
    """One open-loop client (run it in its own thread: :meth:`run` releases the GIL).

    Parameters
    ----------
    transport : Transport
        An open endpoint; the client owns it from now on.
    servers : list
        Server addresses in the transport's Python form.
    workload : malcolm._workload.NativeWorkload
    client_id : int
    seed : int
    phases : list of (start_s, rate_per_s, shares or None)
        The schedule relative to the start of the run (warm-up included); the first phase
        starts at 0. ``shares`` are per-server weights (``None``: uniform).
    warmup_s, duration_s : float
        Tasks intended before ``warmup_s`` are sent and accounted, but not measured.
    timeout_s : float
        A task with no response this long after its intended send time is timed out.
    policy : ClientPolicy or None
        A client-side policy that picks each task's server (overrides shares).
    busy : bool
        Spin while idle; otherwise block in the transport until the next send is near.
    spin_us : float
        In adaptive mode, spin this long before a send instead of blocking.
    raw_capacity : int
        Keep up to this many exact latency samples (0: histogram only).
    lag_threshold_us : float
        A send later than this behind its schedule counts as late.
    app : malcolm.loadgen._apps.KvApp or None
        A real application (``--app rocksdb1``): it writes each request's payload and type,
        and checks each response (``malcolm/loadgen/apps.py``).
    arrival : int
        0: Poisson (exponential gaps), 1: fixed gaps (deterministic), 2: the gaps of
        ``trace`` in turn.
    trace : array of float64 or None
        Inter-arrival gaps with mean 1; each is scaled by the phase's mean gap, so a trace
        keeps its shape and follows the target rate. Replayed in a loop from ``trace_start``.
    first_offset_s : float
        Delay of the first arrival (spreads fixed schedules of several threads apart).
    segment_s : float
        Also account the measured interval in segments of this many seconds, by intended
        send time (0: not): counts and a latency histogram per segment (at most
        MAX_SEGMENTS), for long runs that must show drift.
    payload_size : (kind, a, b)
        Payload bytes: kind 0 fixed ``a``; 1 uniform in ``a..b``; 2 exponential of mean
        ``a``, capped at ``b``. Never above the wire's MAX_PAYLOAD.
    payload_content : int
        0 zeros, 1 random bytes, 2 the pattern ``byte[i] = (request_id + i) % 251``.
    check_echo : bool
        Check that every completed response carries the pattern of its own task (servers
        running the ``echo`` handler); mismatches are counted in ``echo_bad``.
    """
    cdef Transport tr
    cdef NetAddr servers[MAX_SERVERS]
    cdef int n_servers
    cdef ClientPolicy pol
    cdef bint use_pol
    cdef KvApp app
    cdef bint use_app
    cdef WorkloadC wl
    cdef Rng rng
    cdef uint32_t client_id
    cdef int n_phases
    cdef int64_t ph_start[MAX_PHASES]
    cdef double ph_mean_gap[MAX_PHASES]          # ns; <= 0 means rate 0
    cdef bint ph_uniform[MAX_PHASES]
    cdef double ph_cdf[MAX_PHASES][MAX_SERVERS]
    cdef int64_t warm_ns, dur_ns, timeout_ns, spin_ns, lag_thr_ns
    cdef bint busy
    cdef uint64_t cap, mask
    cdef int64_t* req_t
    cdef uint8_t* req_state
    cdef uint64_t* resp_ep          # the (epoch, seq) of the answer that completed the slot
    cdef uint64_t* resp_seq
    cdef uint64_t next_id, oldest
    cdef Hist* lat
    cdef Hist* lag
    cdef int64_t* raw
    cdef uint64_t n_raw, raw_cap
    cdef Counts c
    cdef uint64_t stop_flag
    cdef readonly int64_t t0_ns, end_ns, finished_ns
    cdef readonly double wall_s
    cdef mc_sipkey key
    cdef uint64_t epoch
    cdef uint64_t tx_seq[MAX_SERVERS]      # per server: each sees a dense sequence
    cdef int arrival
    cdef double* trace
    cdef uint64_t trace_n, trace_pos, trace_pos0
    cdef int64_t first_off_ns
    cdef int ps_kind, ps_a, ps_b, pcontent
    cdef bint check_echo
    cdef uint8_t* pbuf                    # 2 * MAX_PAYLOAD: random content is a window of it
    cdef uint16_t* req_len                # with check_echo: each request's payload length
    cdef int n_seg                        # 0: no segments
    cdef int64_t seg_ns
    cdef SegCounts* seg
    cdef Hist* seg_lat

    def __init__(self, Transport transport not None, servers, NativeWorkload workload not None,
                 long long client_id, unsigned long long seed, phases, double warmup_s,
                 double duration_s, double timeout_s, ClientPolicy policy=None,
                 bint busy=False, double spin_us=50.0, long long raw_capacity=0,
                 double lag_threshold_us=50.0, long long window=0, KvApp app=None,
                 key=None, int arrival=A_POISSON, trace=None, long long trace_start=0,
                 double first_offset_s=0.0, payload_size=(PS_FIXED, 0, 0),
                 int payload_content=PC_ZEROS, bint check_echo=False, long long stream=-1,
                 double segment_s=0.0):
        cdef int i, j, n
        cdef double rate, acc
        if not 1 <= len(servers) <= MAX_SERVERS:
            raise ValueError(f"1..{MAX_SERVERS} servers, got {len(servers)}")
        if not 1 <= len(phases) <= MAX_PHASES:
            raise ValueError(f"1..{MAX_PHASES} phases, got {len(phases)}")
        if duration_s <= 0 or warmup_s < 0 or timeout_s <= 0:
            raise ValueError("duration and timeout must be > 0, warm-up >= 0")
        cdef bytes kb = bytes(16) if key is None else bytes(key)
        if len(kb) != 16:
            raise ValueError(f"the rack MAC key is 16 bytes, got {len(kb)}")
        # Tasks are sealed under the rack key (all zero without one) and responses that do
        # not verify under it are counted as forged and otherwise ignored.
        mc_sipkey_set(&self.key, <const uint8_t*>(<const char*>kb))
        self.epoch = wire_new_epoch()
        memset(self.tx_seq, 0, sizeof(self.tx_seq))
        self.tr = transport
        self.n_servers = len(servers)
        for i, s in enumerate(servers):
            addr_parse(transport.kind, s, &self.servers[i])
        self.wl = workload.c
        if not 0 <= client_id <= 0xFFFFFFFF:
            raise ValueError(f"client_id {client_id} must fit in 32 bits")
        self.client_id = <uint32_t>client_id
        self.use_pol = policy is not None
        self.app = app
        self.use_app = app is not None
        self.pol = policy
        if policy is not None and policy.n != self.n_servers:
            raise ValueError(f"client policy built for {policy.n} servers, not {self.n_servers}")
        self.n_phases = len(phases)
        for i, (start, rate, shares) in enumerate(phases):
            if i == 0 and start != 0:
                raise ValueError("the first phase must start at 0")
            if i > 0 and start < phases[i - 1][0]:
                raise ValueError("phases must be in time order")
            if not rate >= 0:
                raise ValueError(f"rate {rate} must be >= 0")
            self.ph_start[i] = <int64_t>(start * 1e9)
            self.ph_mean_gap[i] = 1e9 / rate if rate > 0 else -1.0
            self.ph_uniform[i] = shares is None
            if shares is not None:
                n = len(shares)
                if n != self.n_servers:
                    raise ValueError(f"{n} shares for {self.n_servers} servers")
                if not float(sum(shares)) > 0 or any(not x >= 0 for x in shares):
                    raise ValueError("shares must be >= 0 with a positive sum")
                for j, acc in enumerate(cumulative(shares)):
                    self.ph_cdf[i][j] = acc
                self.ph_cdf[i][n - 1] = 2.0     # never above: the last server catches rounding
        self.warm_ns = <int64_t>(warmup_s * 1e9)
        self.dur_ns = <int64_t>(duration_s * 1e9)
        self.timeout_ns = <int64_t>(timeout_s * 1e9)
        self.spin_ns = <int64_t>(spin_us * 1e3)
        self.lag_thr_ns = <int64_t>(lag_threshold_us * 1e3)
        self.busy = busy
        self._init_arrivals(arrival, trace, trace_start, first_offset_s)
        self._init_payload(payload_size, payload_content, check_echo)
        self._init_segments(segment_s, duration_s)
        self._seed(seed, stream)
        # The request window must hold every task that can be outstanding: those sent
        # within one timeout at the highest rate, with a margin for bursts.
        if window <= 0:
            peak = max(float(r) for _, r, _ in phases)
            window = int(4 * peak * (timeout_s + 0.05)) + 4096
        self.cap = 1
        while self.cap < <uint64_t>window:
            self.cap <<= 1
        if self.cap > (1 << 26):
            raise ValueError(f"request window of {self.cap} is too large; lower the rate "
                             "or the timeout, or use more client threads")
        self.mask = self.cap - 1
        if self.check_echo:
            self.req_len = <uint16_t*>mc_aligned_alloc(64, self.cap * sizeof(uint16_t))
            if self.req_len == NULL:
                raise MemoryError()
        self.req_t = <int64_t*>mc_aligned_alloc(64, self.cap * sizeof(int64_t))
        self.req_state = <uint8_t*>mc_aligned_alloc(64, self.cap)
        self.resp_ep = <uint64_t*>mc_aligned_alloc(64, self.cap * sizeof(uint64_t))
        self.resp_seq = <uint64_t*>mc_aligned_alloc(64, self.cap * sizeof(uint64_t))
        self.lat = <Hist*>mc_aligned_alloc(64, sizeof(Hist))
        self.lag = <Hist*>mc_aligned_alloc(64, sizeof(Hist))
        if self.req_t == NULL or self.req_state == NULL or self.lat == NULL or self.lag == NULL \
                or self.resp_ep == NULL or self.resp_seq == NULL:
            raise MemoryError()
        memset(self.req_state, 0, self.cap)
        memset(self.lat, 0, sizeof(Hist))
        memset(self.lag, 0, sizeof(Hist))
        memset(&self.c, 0, sizeof(Counts))
        self.raw_cap = raw_capacity if raw_capacity > 0 else 0
        if self.raw_cap:
            self.raw = <int64_t*>mc_aligned_alloc(64, self.raw_cap * sizeof(int64_t))
            if self.raw == NULL:
                raise MemoryError()

    cdef _init_arrivals(self, int arrival, trace, long long trace_start, double first_offset_s):
        cdef uint64_t i
        if arrival not in (A_POISSON, A_FIXED, A_TRACE):
            raise ValueError(f"arrival {arrival} must be 0 (Poisson), 1 (fixed) or 2 (trace)")
        if not (first_offset_s >= 0 and first_offset_s < 1e6):
            raise ValueError(f"first_offset_s {first_offset_s} must be in [0, 1e6)")
        self.arrival = arrival
        self.first_off_ns = <int64_t>(first_offset_s * 1e9)
        if arrival != A_TRACE:
            return
        gaps = np.ascontiguousarray(trace, dtype=np.float64) if trace is not None else None
        if gaps is None or gaps.ndim != 1 or gaps.size == 0:
            raise ValueError("a trace needs at least one inter-arrival gap")
        if not (np.isfinite(gaps).all() and (gaps >= 0).all() and gaps.sum() > 0):
            raise ValueError("trace gaps must be finite, >= 0, with a positive sum")
        gaps = gaps / gaps.mean()
        self.trace_n = gaps.size
        self.trace = <double*>mc_aligned_alloc(64, self.trace_n * sizeof(double))
        if self.trace == NULL:
            raise MemoryError()
        cdef double[::1] g = gaps
        for i in range(self.trace_n):
            self.trace[i] = g[i]
        self.trace_pos0 = <uint64_t>(trace_start % <long long>self.trace_n)

    cdef _init_segments(self, double segment_s, double duration_s):
        if segment_s == 0:
            return
        if not (segment_s > 0 and segment_s <= duration_s):
            raise ValueError(f"segment_s {segment_s} must be in (0, duration]")
        n = int(-(-duration_s // segment_s))
        if duration_s / segment_s - (n - 1) < 1e-9:     # a float hair past a whole number
            n -= 1
        if n > MAX_SEGMENTS:
            raise ValueError(f"{n} segments of {segment_s:g} s in {duration_s:g} s: at most "
                             f"{MAX_SEGMENTS}; make them longer")
        self.n_seg = max(1, n)
        self.seg_ns = <int64_t>(segment_s * 1e9)
        self.seg = <SegCounts*>mc_aligned_alloc(64, self.n_seg * sizeof(SegCounts))
        self.seg_lat = <Hist*>mc_aligned_alloc(64, self.n_seg * sizeof(Hist))
        if self.seg == NULL or self.seg_lat == NULL:
            raise MemoryError()
        memset(self.seg, 0, self.n_seg * sizeof(SegCounts))
        memset(self.seg_lat, 0, self.n_seg * sizeof(Hist))

    cdef inline int _seg_of(self, int64_t intended) noexcept nogil:
        """The segment of a measured task sent (intended) at ``intended``; -1 without."""
        cdef int64_t i
        if self.n_seg == 0:
            return -1
        i = (intended - self.t0_ns - self.warm_ns) // self.seg_ns
        if i < 0:
            return 0
        return <int>i if i < self.n_seg else self.n_seg - 1

    cdef _init_payload(self, payload_size, int content, bint check_echo):
        cdef int kind, a, b
        kind, a, b = (int(x) for x in payload_size)
        if kind not in (PS_FIXED, PS_UNIFORM, PS_EXP):
            raise ValueError(f"payload size kind {kind} must be 0, 1 or 2")
        if not (0 <= a <= MAX_PAYLOAD and 0 <= b <= MAX_PAYLOAD):
            raise ValueError(f"payload sizes must be in 0..{MAX_PAYLOAD} bytes")
        if kind == PS_UNIFORM and b < a:
            raise ValueError(f"payload size uniform:{a}:{b}: the maximum is below the minimum")
        if content not in (PC_ZEROS, PC_RANDOM, PC_PATTERN):
            raise ValueError(f"payload content {content} must be 0, 1 or 2")
        if check_echo and content != PC_PATTERN:
            raise ValueError("checking echoes needs the pattern content")
        if (kind != PS_FIXED or a > 0) and self.use_app:
            raise ValueError("an application writes its own payloads")
        self.ps_kind, self.ps_a, self.ps_b = kind, a, b
        self.pcontent, self.check_echo = content, check_echo
        self.pbuf = <uint8_t*>mc_aligned_alloc(64, 2 * MAX_PAYLOAD)
        if self.pbuf == NULL:
            raise MemoryError()
        memset(self.pbuf, 0, 2 * MAX_PAYLOAD)

    cdef void _seed(self, unsigned long long seed, long long stream) noexcept nogil:
        """Start the client's random stream: per client id (distinct across runs and
        processes), or a given one (``stream`` >= 0: common random numbers, the same arrivals
        in every run). Random payload content is a window of its first draws."""
        cdef int i
        rng_seed(&self.rng, seed, 7919 + (self.client_id if stream < 0 else <uint64_t>stream))
        self.trace_pos = self.trace_pos0
        if self.pcontent == PC_RANDOM:
            for i in range(2 * MAX_PAYLOAD):
                self.pbuf[i] = <uint8_t>(rng_next(&self.rng) >> 56)

    def __dealloc__(self):
        free(self.trace)
        free(self.pbuf)
        free(self.req_len)
        free(self.req_t)
        free(self.req_state)
        free(self.resp_ep)
        free(self.resp_seq)
        free(self.lat)
        free(self.lag)
        free(self.raw)
        free(self.seg)
        free(self.seg_lat)

    def stop(self):
        """Ask a running :meth:`run` to stop sending now (it still drains; thread-safe)."""
        mc_store_rel(&self.stop_flag, 1)

    def run(self, long long t0_ns=0):
        """Run the schedule from ``t0_ns`` (CLOCK_MONOTONIC; 0: now). Releases the GIL."""
        if t0_ns <= 0:
            t0_ns = mc_now_ns()
        self.t0_ns = t0_ns
        with nogil:
            # Blocking waits must end on time: the default 50 µs timer slack would make
            # every adaptive wait late by up to that much.
            prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
            self._loop()
        self.wall_s = (self.finished_ns - self.t0_ns) / 1e9

    # ------------------------------------------------------------ the nogil loop
    cdef int _server_for(self, int ph, int64_t now) noexcept nogil:
        cdef double u
        cdef int j
        if self.use_pol:
            # one draw all the same: the arrivals that follow stay those of a client without
            # a client policy (common random numbers across policies)
            rng_uniform(&self.rng)
            return self.pol.pick(now)
        if self.ph_uniform[ph]:
            return <int>(rng_uniform(&self.rng) * self.n_servers)
        u = rng_uniform(&self.rng)
        j = 0
        while self.ph_cdf[ph][j] <= u:
            j += 1
        return j

    cdef int64_t _next_time(self, int64_t t, int* ph) noexcept nogil:
        """The arrival after intended time ``t`` (absolute ns), moving through phases: the
        exponential gap is memoryless, so at a phase boundary we restart from it."""
        cdef double gap = self.ph_mean_gap[ph[0]]
        cdef int64_t t2
        if gap > 0:
            t2 = t + self._gap(gap)
        else:
            t2 = _i64max()
        while ph[0] + 1 < self.n_phases and t2 >= self.t0_ns + self.ph_start[ph[0] + 1]:
            ph[0] += 1
            t = self.t0_ns + self.ph_start[ph[0]]
            gap = self.ph_mean_gap[ph[0]]
            t2 = t + self._gap(gap) if gap > 0 else _i64max()
        return t2

    cdef int64_t _gap(self, double mean) noexcept nogil:
        """The next inter-arrival gap, ns (>= 1), of mean ``mean``."""
        cdef double g
        if self.arrival == A_FIXED:
            g = mean
        elif self.arrival == A_TRACE:
            g = self.trace[self.trace_pos] * mean
            self.trace_pos += 1
            if self.trace_pos == self.trace_n:
                self.trace_pos = 0
        else:
            g = rng_exponential(&self.rng, mean)
        return <int64_t>g + 1

    cdef int _payload(self, WireTask* t) noexcept nogil:
        """Size and fill this task's payload; returns its length."""
        cdef int n, i
        cdef uint64_t rid = t.request_id
        if self.ps_kind == PS_FIXED:
            n = self.ps_a
        elif self.ps_kind == PS_UNIFORM:
            n = self.ps_a + <int>rng_below(&self.rng, <uint64_t>(self.ps_b - self.ps_a + 1))
        else:
            n = <int>rng_exponential(&self.rng, <double>self.ps_a)
            if n > self.ps_b:
                n = self.ps_b
        if n <= 0:
            t.payload = NULL
            return 0
        if self.pcontent == PC_RANDOM:
            t.payload = self.pbuf + rng_below(&self.rng, MAX_PAYLOAD)
        else:
            if self.pcontent == PC_PATTERN:
                for i in range(n):
                    self.pbuf[i] = <uint8_t>((rid + <uint64_t>i) % 251)
            t.payload = self.pbuf
        return n

    cdef void _send(self, int64_t intended, int64_t now, int ph) noexcept nogil:
        cdef WireTask t
        cdef MsgBuf* b
        cdef int s, tt
        cdef uint64_t slot
        cdef int64_t lag, left
        cdef int sg
        if self.next_id - self.oldest >= self.cap:
            # The window is full (should not happen with the default size): give up on the
            # oldest outstanding task rather than lose track of it.
            slot = self.oldest & self.mask
            if self.req_state[slot] == R_OUT:
                self.c.timed_out += 1
                self.c.window_full += 1
                sg = self._seg_of(self.req_t[slot])
                if sg >= 0:
                    self.seg[sg].timed_out += 1
            elif self.req_state[slot] == R_OUT_WARM:
                self.c.warm_timed_out += 1
                self.c.window_full += 1
            self.req_state[slot] = R_TIMED_OUT
            self.oldest += 1
        s = self._server_for(ph, now)
        if s < 0 or s >= self.n_servers:
            s = 0
        t.service_ns = <int64_t>wl_sample(&self.wl, &self.rng, &tt)
        t.client_id = self.client_id
        t.task_type = <uint16_t>tt
        t.payload_len = 0
        t.payload = NULL
        t.request_id = self.next_id
        if not self.use_app:
            t.payload_len = <uint16_t>self._payload(&t)
        if self.use_app:
            t.payload_len = self.app.fill(self.next_id, &tt)
            t.payload = self.app.pbuf
            t.task_type = <uint16_t>tt
            t.service_ns = 0            # the handler does real work: nothing to request
        t.request_id = self.next_id
        t.send_ns = intended
        # our deadline travels with the task (wire v3): what is left of the timeout, so that
        # a server refuses at once ('overloaded') a task it could not start in time
        left = (self.timeout_ns - (now - intended)) // 1000
        t.budget_us = <uint32_t>(1 if left < 1 else (left if left < UINT32_MAX else UINT32_MAX))
        slot = self.next_id & self.mask
        self.req_t[slot] = intended
        if self.check_echo:
            self.req_len[slot] = t.payload_len
        if intended < self.t0_ns + self.warm_ns:
            self.req_state[slot] = R_OUT_WARM
            self.c.sent_warm += 1
        else:
            self.req_state[slot] = R_OUT
            self.c.sent += 1
            lag = now - intended
            hist_add(self.lag, lag)
            self.c.svc_req_ns += <uint64_t>t.service_ns
            self.c.payload_bytes += t.payload_len
            sg = self._seg_of(intended)
            if sg >= 0:
                self.seg[sg].sent += 1
                if lag > self.lag_thr_ns:
                    self.seg[sg].late_sends += 1
        self.c.sent_to[s] += 1
        self.next_id += 1
        b = self.tr.tx_next(&self.servers[s])
        self.tx_seq[s] += 1
        b.len = wire_seal(b.data, wire_put_task(b.data, b.cap, &t), &self.key, self.epoch,
                          self.tx_seq[s])

    cdef void _on_msg(self, MsgBuf* m, int64_t now) noexcept nogil:
        cdef WireHdr h
        cdef WireResp r
        cdef int kind, rc
        cdef uint64_t slot, rid
        cdef uint8_t st
        cdef int64_t lat
        cdef uint64_t ep, aseq
        cdef int sg
        kind = wire_header(m.data, m.len, &h)
        if kind < 0:
            self.c.malformed += 1
            return
        rc = wire_open(m.data, m.len, &self.key, &ep, &aseq)
        if rc == E_MAC:
            self.c.forged += 1
            return
        if rc < 0:
            self.c.malformed += 1
            return
        if kind != K_RESPONSE:
            self.c.unexpected += 1
            return
        # Replays need no window here: a response completes its request id at most once.
        # A second response to it is a duplicate (two answers: a bug in the rack) unless it
        # is a copy of the one taken, the same sender epoch and sequence number: a datagram
        # the network delivered twice (netem duplicate) or a replay, counted apart.
        rc = wire_get_resp(m.data, <uint32_t>rc, &r)
        if rc < 0:
            self.c.malformed += 1
            return
        if r.client_id != self.client_id:
            self.c.foreign += 1
            return
        if self.use_pol:
            self.pol.on_response(now, r.server, r.load, <double>r.queue_len)
        rid = r.request_id
        if rid >= self.next_id or self.next_id - rid > self.cap:
            self.c.unknown += 1
            return
        slot = rid & self.mask
        st = self.req_state[slot]
        if st == R_TIMED_OUT:
            self.c.late += 1
            return
        if st != R_OUT and st != R_OUT_WARM:
            if st == R_DONE and self.resp_ep[slot] == ep and self.resp_seq[slot] == aseq:
                self.c.replayed += 1
            else:
                self.c.duplicates += 1
            return
        self.req_state[slot] = R_DONE
        self.resp_ep[slot] = ep
        self.resp_seq[slot] = aseq
        if self.use_app:
            self.app.on_response(rid, r.status, r.task_type, r.payload, r.payload_len,
                                 now - self.req_t[slot], st == R_OUT)
        if r.server < MAX_SERVERS:
            self.c.answered_by[r.server] += 1
        if st == R_OUT_WARM:
            self.c.warm_answered += 1
            return
        sg = self._seg_of(self.req_t[slot])
        if r.status == ST_OK:
            self.c.completed += 1
            lat = now - self.req_t[slot]
            hist_add(self.lat, lat)
            if sg >= 0:
                self.seg[sg].completed += 1
                hist_add(&self.seg_lat[sg], lat)
                if r.flags & F_MIGRATED:
                    self.seg[sg].migrated += 1
                if r.flags & F_STOLEN:
                    self.seg[sg].stolen += 1
            if self.n_raw < self.raw_cap:
                self.raw[self.n_raw] = lat
                self.n_raw += 1
            if r.service_ns > 0:
                self.c.svc_ns += <uint64_t>r.service_ns
            if self.check_echo:
                self.c.echo_checked += 1
                if (r.payload_len != self.req_len[slot]
                        or not _is_pattern(r.payload, r.payload_len, rid)):
                    self.c.echo_bad += 1
            if r.flags & F_MIGRATED:
                self.c.migrated += 1
            if r.flags & F_STOLEN:
                self.c.stolen += 1
        elif r.status < N_STATUS:
            self.c.rejected[r.status] += 1
            if sg >= 0:
                self.seg[sg].rejected[r.status] += 1
        else:
            self.c.malformed += 1

    cdef void _sweep(self, int64_t now) noexcept nogil:
        cdef uint64_t slot
        cdef uint8_t st
        cdef int sg
        while self.oldest < self.next_id:
            slot = self.oldest & self.mask
            st = self.req_state[slot]
            if st == R_OUT or st == R_OUT_WARM:
                if now - self.req_t[slot] < self.timeout_ns:
                    return
                self.req_state[slot] = R_TIMED_OUT
                if st == R_OUT:
                    self.c.timed_out += 1
                    sg = self._seg_of(self.req_t[slot])
                    if sg >= 0:
                        self.seg[sg].timed_out += 1
                else:
                    self.c.warm_timed_out += 1
            self.oldest += 1

    cdef void _loop(self) noexcept nogil:
        cdef int ph = 0, n, i, burst
        cdef int64_t now, next_t, send_end, wait
        cdef bint late_run = False, stopping = False
        cdef uint64_t sent0 = self.tr.n_send_failed
        send_end = self.t0_ns + self.warm_ns + self.dur_ns
        next_t = self._next_time(self.t0_ns, &ph) + self.first_off_ns
        while True:
            now = mc_now_ns()
            if not stopping and mc_load_acq(&self.stop_flag):
                stopping = True
                send_end = now
            burst = 0
            while next_t <= now and next_t < send_end and burst < BATCH:
                self._send(next_t, now, ph)
                if next_t >= self.t0_ns + self.warm_ns:     # measured sends only
                    if now - next_t > self.lag_thr_ns:
                        self.c.late_sends += 1
                        if not late_run:
                            self.c.late_episodes += 1
                            late_run = True
                    else:
                        late_run = False
                next_t = self._next_time(next_t, &ph)
                burst += 1
            if burst:
                self.tr.tx_flush()
            n = self.tr.rx_poll(BATCH)
            if n:
                now = mc_now_ns()
                # Expire first: a response that waited in the socket while this thread was
                # not running (descheduled, stopped) is seen only now, and one seen at or
                # past its task's timeout is late, as it would have been had the sweep run
                # in between; not a completion with a latency above --timeout.
                self._sweep(now)
                for i in range(n):
                    self._on_msg(&self.tr.rx[i], now)
                self.tr.rx_release(n)
            self._sweep(now)
            if next_t >= send_end and self.oldest >= self.next_id:
                break
            if n or burst:
                continue
            if self.busy:
                mc_cpu_relax()
                continue
            # Adaptive: block until a response arrives or the next send is near.
            wait = (next_t if next_t < send_end else now + 2_000_000) - now - self.spin_ns
            if self.oldest < self.next_id:
                wait = min(wait, self.req_t[self.oldest & self.mask] + self.timeout_ns - now)
            if wait < 20_000:
                mc_cpu_relax()
                continue
            if wait > 5_000_000:
                wait = 5_000_000
            self.tr.wait_prepare()
            self.tr.wait_idle(wait)
        self.finished_ns = mc_now_ns()
        self.end_ns = send_end
        self.c.send_failed = self.tr.n_send_failed - sent0

    def plan(self, unsigned long long seed, long long stream=-1):
        """What a run from ``seed`` and ``stream`` (as the constructor takes them) would
        send, drawn without sending: ``(measured sends, the sum of their requested service
        times in ns)``, the ``sent`` and ``svc_req_ns`` that run would count (unless it is
        stopped early). The draws are the run's, in its order: the server, the service time,
        the payload, the next gap. The client's own stream, and the random payload window
        drawn from it, are left as they were (call it before :meth:`run`); :meth:`reseed`
        adopts a planned one."""
        cdef uint8_t keep_buf[2 * MAX_PAYLOAD]
        cdef Rng keep = self.rng
        cdef uint64_t keep_pos = self.trace_pos
        cdef int64_t keep_t0 = self.t0_ns, t, end = self.warm_ns + self.dur_ns
        cdef int ph = 0, tt
        cdef uint64_t n = 0, work = 0, svc
        cdef WireTask scratch
        with nogil:
            memcpy(keep_buf, self.pbuf, 2 * MAX_PAYLOAD)
            self._seed(seed, stream)
            self.t0_ns = 0
            t = self._next_time(0, &ph) + self.first_off_ns
            while t < end:
                rng_uniform(&self.rng)      # the server: _server_for draws one, always
                svc = <uint64_t><int64_t>wl_sample(&self.wl, &self.rng, &tt)
                if self.use_app:
                    svc = 0                 # the application does real work (_send)
                else:
                    scratch.request_id = n
                    self._payload(&scratch)
                if t >= self.warm_ns:
                    n += 1
                    work += svc
                t = self._next_time(t, &ph)
            self.rng = keep
            memcpy(self.pbuf, keep_buf, 2 * MAX_PAYLOAD)
        self.trace_pos = keep_pos
        self.t0_ns = keep_t0
        return int(n), int(work)

    def reseed(self, unsigned long long seed, long long stream=-1):
        """Restart the client's random stream from ``seed`` and ``stream`` (before
        :meth:`run`): the run then sends what :meth:`plan` drew from them."""
        self._seed(seed, stream)

    def preview(self, int n):
        """The first ``n`` intended send times, ns after the start (tests and tools). It
        consumes the schedule's random streams: call it on a client that will not run."""
        cdef int ph = 0, i
        cdef int64_t t
        out = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] o = out
        self.t0_ns = 0
        t = self._next_time(0, &ph) + self.first_off_ns
        for i in range(n):
            o[i] = t
            t = self._next_time(t, &ph)
        return out

    # ------------------------------------------------------------ results
    def results(self):
        """Counters, histograms (numpy arrays of bucket counts) and raw samples."""
        cdef dict c = self.c
        n = self.n_servers
        c["sent_to"] = list(c["sent_to"][:n])
        c["answered_by"] = list(c["answered_by"][:n])
        c["rejected"] = list(c["rejected"])
        c["lat"] = hist_py(self.lat)
        c["lag"] = hist_py(self.lag)
        if self.raw_cap and self.n_raw:
            c["raw"] = np.array(<int64_t[:self.n_raw]>self.raw, dtype=np.int64)
        elif self.raw_cap:
            c["raw"] = np.zeros(0, dtype=np.int64)
        else:
            c["raw"] = None
        c["raw_truncated"] = bool(self.raw_cap and self.n_raw == self.raw_cap
                                  and c["completed"] > self.n_raw)
        c["outstanding"] = int(self.next_id - self.oldest)
        c["t0_ns"] = self.t0_ns
        c["end_ns"] = self.end_ns
        c["finished_ns"] = self.finished_ns
        c["segments"] = None
        if self.n_seg:
            c["segments"] = {"segment_s": self.seg_ns / 1e9,
                             "counts": [self.seg[i] for i in range(self.n_seg)],
                             "lat": [hist_py(&self.seg_lat[i]) for i in range(self.n_seg)]}
        return c


cdef inline bint _is_pattern(const uint8_t* p, uint32_t n, uint64_t rid) noexcept nogil:
    cdef uint32_t i
    for i in range(n):
        if p[i] != <uint8_t>((rid + i) % 251):
            return False
    return True
