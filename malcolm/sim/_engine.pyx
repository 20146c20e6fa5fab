# cython: language_level=3
"""Discrete-event rack simulator: the native engine behind :func:`malcolm.sim.simulate`.

Everything per event runs without the GIL on C memory. Time is an integer number of
nanoseconds. The event queue is a 4-ary min-heap of 32-byte events ordered by (time,
sequence number), so ties resolve in scheduling order and a run is a pure function of its
configuration and seed. Client arrivals are not heap events: the next arrival time is kept
aside and compared with the heap's top.

Random streams are separate (arrivals, service times, network, central scheduler, each
policy and client its own), so runs of different policies with the same seed see exactly the
same sequence of tasks (common random numbers).

Policies are called exactly as the real gateway calls them (``malcolm/policy/base.pxd``):
``decide_arrival`` for each task from a client, ``decide_steal`` after each completion, and
per window the window protocol of ``malcolm/policy/driver.pxd`` (the same code the runtime's
policy thread runs), with the heartbeat delivered to each peer after a network delay
(``observe_peer``). Steal requests in flight go through the driver's ``StealGate``.

The runtime's mechanics that shape results are parameters (all off by default except one
steal in flight): ``gateway_ns`` makes each server's gateway a FIFO single server of
messages, ``capacity`` bounds the tasks a server holds (the rest are dropped and answered at
once), and ``max_steals``/``steal_timeout_ns`` bound steal requests in flight.
"""
from libc.math cimport ceil, log
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memset

import time

import numpy as np

from malcolm.policy.defaults import EST_ALPHA, STEAL_TIMEOUT_US, STEALS_IN_FLIGHT

from malcolm._core cimport (
    Rng, est_free, est_init, est_load, est_note_arrival, est_observe, est_rate,
    rng_below, rng_seed, rng_uniform,
)
from malcolm._workload cimport NativeWorkload, WorkloadC, wl_sample
from malcolm.policy.base cimport ClientPolicy, Heartbeat, MAX_SERVERS, Policy
from malcolm.policy.driver cimport (
    drv_end_window, drv_migrated, drv_observe_peer, drv_start, drv_stole,
    steal_gate_init, steal_gate_open, steal_gate_reply,
)


cdef enum:
    EV_TASK = 1         # a: server, b: slot. A task message reaches a server.
    EV_DONE = 2         # a: server, b: global worker. A worker ends a task or a quantum.
    EV_PSDONE = 3       # a: server, b: epoch. Ideal PS: the smallest tag is reached.
    EV_WINDOW = 4       # a: server. Start of a load-broadcast window.
    EV_HB = 5           # a: destination, b: heartbeat buffer index.
    EV_STEAL_REQ = 6    # a: victim, b: thief, x: request seq.
    EV_STEAL_REP = 7    # a: thief, b: slot or -1, x: request seq.
    EV_RESP = 8         # a: client, b: server + 64 * queue length, x: load.
    EV_CHANGE = 9       # a: change index.
    EV_CDISPATCH = 10   # a: global worker, b: slot. cFCFS: a task reaches its worker.
    EV_CNOTIFY = 11     # a: global worker. cFCFS: the scheduler learns a worker is idle.
    # a: source, b: heartbeat buffer index. Without jitter every peer receives a heartbeat
    # at the same time, so one event delivers it to all of them.
    EV_HBALL = 12
    # With a gateway cost (gateway_ns > 0) a message first waits for its server's gateway;
    # these are the same messages once the gateway has handled them.
    EV_TASK_GW = 13
    EV_HB_GW = 14       # a: destination, b: heartbeat buffer index, x: its seq
    EV_STEAL_REQ_GW = 15
    EV_STEAL_REP_GW = 16

    MODE_DIST = 0       # servers run policies; clients send by shares or a client policy
    MODE_CFCFS = 1      # one rack-wide FCFS queue
    MODE_CENTRAL_POD = 2  # centralized power-of-d on true queue lengths, zero delay

    SCHED_FCFS = 0
    SCHED_RR = 1        # processor sharing with a quantum (round robin)
    SCHED_PS = 2        # ideal processor sharing

    CH_RATE = 0
    CH_SHARES = 1
    CH_SPEED = 2

    ERR_NOMEM = 1


cdef inline double exp_draw(Rng* r, double mean) noexcept nogil:
    # Same formula as _core.rng_exponential, inlined: cross-module cdef calls are indirect.
    return -mean * log(1.0 - rng_uniform(r))


cdef inline bint ev_less(const Event* x, const Event* y) noexcept nogil:
    return x.t < y.t or (x.t == y.t and x.sk < y.sk)


cdef inline int ring_push(Ring* r, int32_t v) noexcept nogil:
    cdef int32_t* nb
    cdef int64_t i, n
    if r.count == r.cap:
        n = r.cap * 2
        nb = <int32_t*>malloc(sizeof(int32_t) * n)
        if nb == NULL:
            return -1
        for i in range(r.count):
            nb[i] = r.buf[(r.head + i) & (r.cap - 1)]
        free(r.buf)
        r.buf = nb
        r.head = 0
        r.cap = n
    r.buf[(r.head + r.count) & (r.cap - 1)] = v
    r.count += 1
    return 0


cdef inline int32_t ring_pop(Ring* r) noexcept nogil:
    cdef int32_t v
    if r.count == 0:
        return -1
    v = r.buf[r.head]
    r.head = (r.head + 1) & (r.cap - 1)
    r.count -= 1
    return v


cdef int ring_init(Ring* r, int64_t cap) noexcept nogil:
    r.buf = <int32_t*>malloc(sizeof(int32_t) * cap)
    r.head = 0
    r.count = 0
    r.cap = cap
    return 0 if r.buf != NULL else -1


cdef class Engine:
    """One simulation run. Built and driven by :func:`malcolm.sim.simulate`; not reusable."""

    cdef int n, mode, sched, n_clients, n_types, err, has_policies, has_client_policies
    cdef int record, K, pod_d, n_workers, max_steals
    cdef int64_t now, delay, jitter, window, quantum, cdelay, next_arrival
    cdef int64_t gw_ns, cap, steal_timeout
    cdef double arr_clock, rate, loss, prior_ns, alpha
    cdef double shares_cdf[MAX_SERVERS]
    cdef int32_t speed_order[MAX_SERVERS]
    cdef Rng r_arr, r_svc, r_net, r_misc
    cdef WorkloadC wl
    cdef Server* sv
    cdef int32_t* w_slot
    cdef double* w_slice
    cdef int32_t* w_server
    # tasks
    cdef Task* tasks
    cdef int32_t* free_slots
    cdef int64_t n_free, pool_cap
    cdef int64_t n_tasks, n_warm, gen_cap
    cdef int64_t generated, completed, completed_measured, n_measured
    cdef bint gen_active
    cdef int64_t* lat
    cdef int64_t* sent
    cdef int32_t* ttype
    cdef double* svc
    cdef uint8_t* dropped       # per task: answered "dropped" (capacity), not served
    cdef uint64_t n_dropped
    cdef double area
    cdef int64_t area_t
    # events
    cdef Event* heap
    cdef int64_t hn, hcap
    cdef uint64_t seq
    cdef uint64_t events
    cdef double loop_s
    # heartbeats
    cdef Heartbeat* hbuf
    cdef uint64_t hb_sent, hb_lost, hb_overrun
    # policies (owned by the Python lists below; the C arrays hold borrowed pointers)
    cdef void* pol[MAX_SERVERS]
    cdef void** cpol
    cdef list _policies, _clients
    # changes over time
    cdef int n_changes
    cdef int64_t* ch_t
    cdef int32_t* ch_kind
    cdef int32_t* ch_a
    cdef double* ch_x
    cdef double* ch_shares
    # load recording
    cdef double* rec_load
    cdef double* rec_q
    cdef double* rec_true
    cdef int64_t rec_rows, rec_cap
    cdef int64_t* phase

    def __cinit__(self):
        self.sv = NULL
        self.tasks = NULL
        self.heap = NULL
        self.cpol = NULL

    def __init__(self, workers, speeds, NativeWorkload workload, *, int mode, int sched,
                 double quantum_ns, double rate_per_ns, shares, long long n_tasks,
                 long long n_warm, unsigned long long seed, double delay_ns,
                 double jitter_ns, double window_ns, double loss, phases_ns,
                 policies=None, clients=None, int n_clients=1, double central_delay_ns=0.0,
                 int pod_d=2, double ewma=EST_ALPHA, bint record=False, changes=(),
                 double prior_ns=0.0, double gateway_ns=0.0, long long capacity=0,
                 int max_steals=STEALS_IN_FLIGHT,
                 double steal_timeout_ns=STEAL_TIMEOUT_US * 1e3):
        cdef int s, w, i, k
        self.n = len(workers)
        if not 1 <= self.n <= MAX_SERVERS:
            raise ValueError(f"rack must have 1..{MAX_SERVERS} servers")
        self.mode = mode
        self.sched = sched
        self.quantum = <int64_t>quantum_ns
        self.rate = rate_per_ns
        self.n_tasks = n_tasks
        self.n_warm = n_warm
        self.n_measured = n_tasks - n_warm
        self.gen_cap = 2 * n_tasks
        self.delay = <int64_t>delay_ns
        self.jitter = <int64_t>jitter_ns
        self.window = <int64_t>window_ns
        self.loss = loss
        self.cdelay = <int64_t>central_delay_ns
        self.pod_d = min(pod_d, self.n)
        self.record = record
        self.alpha = ewma
        self.wl = workload.c
        self.n_types = workload.c.n
        # The estimator's prior: the workload's nominal mean unless told (the runtime's
        # rack file gives one, by default defaults.EST_PRIOR_SERVICE_US).
        self.prior_ns = prior_ns if prior_ns > 0 else workload.c.mean_ns
        if gateway_ns < 0 or capacity < 0 or max_steals < 0 or steal_timeout_ns <= 0:
            raise ValueError("gateway_ns, capacity and max_steals must be >= 0, "
                             "steal_timeout_ns > 0")
        self.gw_ns = <int64_t>(gateway_ns + 0.5)
        if self.gw_ns > 0 and mode != MODE_DIST:
            raise ValueError("a gateway cost applies to server and client policies; cfcfs and "
                             "racksched are ideal references without gateways")
        self.cap = capacity
        self.max_steals = max_steals
        self.steal_timeout = <int64_t>steal_timeout_ns
        self.n_clients = max(1, n_clients)
        if self.window <= 0:
            raise ValueError("window must be > 0")
        rng_seed(&self.r_arr, seed, 0x5EED0001)
        rng_seed(&self.r_svc, seed, 0x5EED0002)
        rng_seed(&self.r_net, seed, 0x5EED0003)
        rng_seed(&self.r_misc, seed, 0x5EED0004)
        self._set_shares(shares)

        # servers and workers
        self.n_workers = int(sum(workers))
        self.sv = <Server*>malloc(sizeof(Server) * self.n)
        self.w_slot = <int32_t*>malloc(sizeof(int32_t) * self.n_workers)
        self.w_slice = <double*>malloc(sizeof(double) * self.n_workers)
        self.w_server = <int32_t*>malloc(sizeof(int32_t) * self.n_workers)
        if self.sv == NULL or self.w_slot == NULL or self.w_slice == NULL or self.w_server == NULL:
            raise MemoryError()
        memset(self.sv, 0, sizeof(Server) * self.n)
        k = 0
        for s in range(self.n):
            self.sv[s].W = workers[s]
            self.sv[s].first = k
            self.sv[s].speed = speeds[s]
            if ring_init(&self.sv[s].queue, 64) != 0:
                raise MemoryError()
            self.sv[s].idle = <int32_t*>malloc(sizeof(int32_t) * workers[s])
            self.sv[s].ps_cap = 64
            self.sv[s].ps = <int32_t*>malloc(sizeof(int32_t) * 64)
            if self.sv[s].idle == NULL or self.sv[s].ps == NULL:
                raise MemoryError()
            for w in range(workers[s]):
                # stack order: worker 0 on top, so the lowest index is taken first
                self.sv[s].idle[w] = workers[s] - 1 - w
                self.w_slot[k + w] = -1
                self.w_server[k + w] = s
            self.sv[s].nidle = workers[s]
            if est_init(&self.sv[s].est, workers[s], self.n_types, ewma, self.prior_ns) != 0:
                raise ValueError(f"cannot set up the load estimator (ewma={ewma})")
            steal_gate_init(&self.sv[s].steal, max(1, max_steals), self.steal_timeout)
            k += workers[s]
        # cFCFS hands work to the fastest idle server first (ties: lowest index)
        order = sorted(range(self.n), key=lambda j: (-speeds[j], j))
        for i in range(self.n):
            self.speed_order[i] = order[i]

        # task pool and per-task results
        self.pool_cap = min(max(1024, n_tasks // 4), 1 << 20)
        self.tasks = <Task*>malloc(sizeof(Task) * self.pool_cap)
        self.free_slots = <int32_t*>malloc(sizeof(int32_t) * self.pool_cap)
        self.lat = <int64_t*>malloc(sizeof(int64_t) * max(1, n_tasks))
        self.sent = <int64_t*>malloc(sizeof(int64_t) * max(1, n_tasks))
        self.ttype = <int32_t*>malloc(sizeof(int32_t) * max(1, n_tasks))
        self.svc = <double*>malloc(sizeof(double) * max(1, n_tasks))
        self.dropped = <uint8_t*>malloc(max(1, n_tasks))
        if (self.tasks == NULL or self.free_slots == NULL or self.lat == NULL
                or self.sent == NULL or self.ttype == NULL or self.svc == NULL
                or self.dropped == NULL):
            raise MemoryError()
        memset(self.dropped, 0, max(1, n_tasks))
        for i in range(self.pool_cap):
            self.free_slots[i] = <int32_t>(self.pool_cap - 1 - i)
        self.n_free = self.pool_cap

        self.hcap = 1024
        self.heap = <Event*>malloc(sizeof(Event) * self.hcap)
        if self.heap == NULL:
            raise MemoryError()

        # policies
        self._policies = list(policies) if policies else []
        self.has_policies = len(self._policies) > 0
        if self.has_policies:
            if len(self._policies) != self.n:
                raise ValueError("need one policy per server")
            for s in range(self.n):
                if not isinstance(self._policies[s], Policy):
                    raise TypeError("server policies must be malcolm.policy.base.Policy")
                self.pol[s] = <void*>self._policies[s]
        self._clients = list(clients) if clients else []
        self.has_client_policies = len(self._clients) > 0
        if self.has_client_policies:
            self.n_clients = len(self._clients)
            self.cpol = <void**>malloc(sizeof(void*) * self.n_clients)
            if self.cpol == NULL:
                raise MemoryError()
            for i in range(self.n_clients):
                if not isinstance(self._clients[i], ClientPolicy):
                    raise TypeError("client policies must be malcolm.policy.base.ClientPolicy")
                self.cpol[i] = <void*>self._clients[i]

        # heartbeat ring: K slots per server outlive the longest possible delivery delay
        self.K = <int>((self.delay + self.jitter) // self.window) + 2
        if self.gw_ns > 0:
            # Gateways can hold a heartbeat back for a while: more slots, and one overwritten
            # before its delivery is counted (hb_overrun) and not delivered.
            self.K += 8
        if self.has_policies:
            self.hbuf = <Heartbeat*>malloc(sizeof(Heartbeat) * self.n * self.K)
            if self.hbuf == NULL:
                raise MemoryError()

        self._set_changes(changes)

        self.phase = <int64_t*>malloc(sizeof(int64_t) * self.n)
        if self.phase == NULL:
            raise MemoryError()
        for s in range(self.n):
            self.phase[s] = <int64_t>phases_ns[s]
        if self.record:
            self.rec_cap = 1024
            self.rec_load = <double*>malloc(sizeof(double) * self.rec_cap * self.n)
            self.rec_q = <double*>malloc(sizeof(double) * self.rec_cap * self.n)
            self.rec_true = <double*>malloc(sizeof(double) * self.rec_cap * self.n)
            if self.rec_load == NULL or self.rec_q == NULL or self.rec_true == NULL:
                raise MemoryError()

    def _set_shares(self, shares):
        cdef int s
        tot = float(sum(shares))
        if len(shares) != self.n or tot <= 0 or any(x < 0 for x in shares):
            raise ValueError(f"shares must be {self.n} non-negative numbers with a positive sum")
        acc = 0.0
        for s in range(self.n):
            acc += shares[s] / tot
            self.shares_cdf[s] = acc
        self.shares_cdf[self.n - 1] = 1.0

    def _set_changes(self, changes):
        cdef int i, s
        self.n_changes = len(changes)
        if self.n_changes == 0:
            return
        m = self.n_changes
        self.ch_t = <int64_t*>malloc(sizeof(int64_t) * m)
        self.ch_kind = <int32_t*>malloc(sizeof(int32_t) * m)
        self.ch_a = <int32_t*>malloc(sizeof(int32_t) * m)
        self.ch_x = <double*>malloc(sizeof(double) * m)
        self.ch_shares = <double*>malloc(sizeof(double) * m * self.n)
        if (self.ch_t == NULL or self.ch_kind == NULL or self.ch_a == NULL
                or self.ch_x == NULL or self.ch_shares == NULL):
            raise MemoryError()
        for i, (t, kind, a, x, sh) in enumerate(changes):
            self.ch_t[i] = <int64_t>t
            self.ch_kind[i] = kind
            self.ch_a[i] = a
            self.ch_x[i] = x
            if kind == CH_SHARES:
                tot = float(sum(sh))
                acc = 0.0
                for s in range(self.n):
                    acc += sh[s] / tot
                    self.ch_shares[i * self.n + s] = acc
                self.ch_shares[i * self.n + self.n - 1] = 1.0

    def __dealloc__(self):
        cdef int s
        if self.sv != NULL:
            for s in range(self.n):
                free(self.sv[s].queue.buf)
                free(self.sv[s].idle)
                free(self.sv[s].ps)
                est_free(&self.sv[s].est)
            free(self.sv)
        free(self.w_slot)
        free(self.w_slice)
        free(self.w_server)
        free(self.tasks)
        free(self.free_slots)
        free(self.lat)
        free(self.sent)
        free(self.ttype)
        free(self.svc)
        free(self.dropped)
        free(self.heap)
        free(self.hbuf)
        free(self.cpol)
        free(self.ch_t)
        free(self.ch_kind)
        free(self.ch_a)
        free(self.ch_x)
        free(self.ch_shares)
        free(self.rec_load)
        free(self.rec_q)
        free(self.rec_true)
        free(self.phase)

    # ------------------------------------------------------------------ event queue
    cdef inline void push(self, int64_t t, int kind, int32_t a, int32_t b, double x) noexcept nogil:
        cdef Event e
        cdef Event* h
        cdef int64_t i, p
        if self.hn == self.hcap:
            h = <Event*>realloc(self.heap, sizeof(Event) * self.hcap * 2)
            if h == NULL:
                self.err = ERR_NOMEM
                return
            self.heap = h
            self.hcap *= 2
        e.t = t
        e.sk = (self.seq << 8) | <uint64_t>kind
        self.seq += 1
        e.a = a
        e.b = b
        e.x = x
        h = self.heap
        i = self.hn
        self.hn += 1
        while i > 0:
            p = (i - 1) >> 2
            if not ev_less(&e, &h[p]):
                break
            h[i] = h[p]
            i = p
        h[i] = e

    cdef inline void pop(self, Event* out) noexcept nogil:
        cdef Event* h = self.heap
        cdef Event last
        cdef int64_t i = 0, c, m, end, n
        out[0] = h[0]
        self.hn -= 1
        n = self.hn
        if n == 0:
            return
        last = h[n]
        while True:
            c = 4 * i + 1
            if c >= n:
                break
            m = c
            end = c + 4
            if end > n:
                end = n
            c += 1
            while c < end:
                if ev_less(&h[c], &h[m]):
                    m = c
                c += 1
            if not ev_less(&h[m], &last):
                break
            h[i] = h[m]
            i = m
        h[i] = last

    # ------------------------------------------------------------------ helpers
    cdef inline int64_t net(self) noexcept nogil:
        if self.jitter > 0:
            return self.delay + <int64_t>(rng_uniform(&self.r_net) * self.jitter)
        return self.delay

    cdef int32_t alloc_task(self) noexcept nogil:
        cdef int64_t i, ncap
        cdef Task* t
        cdef int32_t* f
        if self.n_free == 0:
            ncap = self.pool_cap * 2
            if ncap > 2147483647:
                self.err = ERR_NOMEM
                return -1
            t = <Task*>realloc(self.tasks, sizeof(Task) * ncap)
            if t == NULL:
                self.err = ERR_NOMEM
                return -1
            self.tasks = t
            f = <int32_t*>realloc(self.free_slots, sizeof(int32_t) * ncap)
            if f == NULL:
                self.err = ERR_NOMEM
                return -1
            self.free_slots = f
            for i in range(ncap - self.pool_cap):
                self.free_slots[i] = <int32_t>(ncap - 1 - i)
            self.n_free = ncap - self.pool_cap
            self.pool_cap = ncap
        self.n_free -= 1
        return self.free_slots[self.n_free]

    cdef inline int64_t gw_take(self, int s, int64_t n_msgs) noexcept nogil:
        """Server s's gateway handles ``n_msgs`` messages that reach it now, after those
        already waiting (one FIFO server): returns when it is done with them."""
        cdef Server* v = &self.sv[s]
        cdef int64_t t = v.gw_free if v.gw_free > self.now else self.now
        t += n_msgs * self.gw_ns
        v.gw_free = t
        v.gw_msgs += <uint64_t>n_msgs
        return t

    cdef inline void track_area(self) noexcept nogil:
        # integral over time of the tasks that clients have sent and not yet seen finish
        self.area += <double>(self.generated - self.completed) * <double>(self.now - self.area_t)
        self.area_t = self.now

    # ------------------------------------------------------------------ arrivals
    cdef void schedule_next_arrival(self) noexcept nogil:
        if self.rate > 0.0:
            self.arr_clock += exp_draw(&self.r_arr, 1.0 / self.rate)
            self.next_arrival = <int64_t>self.arr_clock
        else:
            self.next_arrival = INT64_MAX

    cdef void do_arrival(self) noexcept nogil:
        cdef int32_t slot = self.alloc_task()
        cdef Task* t
        cdef int tt, s, c = 0, i, j, k, best
        cdef double u
        cdef int32_t picked[MAX_SERVERS]
        if slot < 0:
            return
        self.track_area()
        t = &self.tasks[slot]
        t.sent = self.now
        t.idx = self.generated
        t.work = wl_sample(&self.wl, &self.r_svc, &tt)
        t.total = t.work
        t.type = tt
        t.moved = 0
        if self.n_clients > 1:
            c = <int>rng_below(&self.r_arr, self.n_clients)
        t.client = c
        if t.idx < self.n_tasks:
            self.sent[t.idx] = self.now
            self.ttype[t.idx] = tt
        self.generated += 1
        if self.generated >= self.n_tasks and (
                self.completed_measured >= self.n_measured or self.generated >= self.gen_cap):
            self.gen_active = False
        else:
            self.schedule_next_arrival()

        if self.mode == MODE_CFCFS:
            self.central_arrival(slot)
            return
        if self.mode == MODE_CENTRAL_POD:
            best = -1
            k = 0
            while k < self.pod_d:
                j = <int>rng_below(&self.r_misc, self.n)
                for i in range(k):
                    if picked[i] == j:
                        j = -1
                        break
                if j < 0:
                    continue
                picked[k] = j
                k += 1
                if best < 0 or self.sv[j].ntasks < self.sv[best].ntasks:
                    best = j
            self.accept(best, slot)
            return
        if self.has_client_policies:
            s = (<ClientPolicy>self.cpol[c]).pick(self.now)
            if s < 0 or s >= self.n:
                s = 0
                self.sv[0].bad_decisions += 1
        else:
            u = rng_uniform(&self.r_arr)
            s = 0
            for i in range(self.n - 1):
                s += u >= self.shares_cdf[i]
        self.push(self.now + self.net(), EV_TASK, s, slot, 0.0)

    cdef void on_task(self, int s, int32_t slot) noexcept nogil:
        cdef Task* t = &self.tasks[slot]
        cdef int j
        if not t.moved and self.has_policies:
            j = (<Policy>self.pol[s]).decide_arrival(self.now, t.type)
            if j != s:
                if 0 <= j < self.n:
                    t.moved = 1
                    self.sv[s].migrations += 1
                    drv_migrated(<Policy>self.pol[s])
                    self.push(self.now + self.net(), EV_TASK, j, slot, 0.0)
                    return
                self.sv[s].bad_decisions += 1
        self.accept(s, slot)

    # ------------------------------------------------------------------ inside a server
    cdef void accept(self, int s, int32_t slot) noexcept nogil:
        cdef Server* v = &self.sv[s]
        cdef int lw
        if self.cap > 0 and v.ntasks >= self.cap:
            self.drop(s, slot)
            return
        est_note_arrival(&v.est, self.tasks[slot].type)
        v.accepted += 1
        v.ntasks += 1
        if self.sched == SCHED_PS:
            self.ps_add(s, slot)
            return
        if v.nidle > 0:
            v.nidle -= 1
            lw = v.idle[v.nidle]
            self.start(s, lw, slot)
        elif ring_push(&v.queue, slot) != 0:
            self.err = ERR_NOMEM

    cdef inline void start(self, int s, int lw, int32_t slot) noexcept nogil:
        cdef Server* v = &self.sv[s]
        cdef int gw = v.first + lw
        cdef Task* t = &self.tasks[slot]
        cdef double work = t.work
        cdef int64_t dur
        if self.sched == SCHED_RR and work > self.quantum * v.speed:
            work = self.quantum * v.speed
        dur = <int64_t>(work / v.speed + 0.5)
        self.w_slot[gw] = slot
        self.w_slice[gw] = work
        v.busy_ns += <double>dur
        self.push(self.now + dur, EV_DONE, s, gw, 0.0)

    cdef void on_done(self, int s, int gw) noexcept nogil:
        cdef Server* v = &self.sv[s]
        cdef int32_t slot = self.w_slot[gw]
        cdef Task* t = &self.tasks[slot]
        cdef int lw = gw - v.first
        cdef int32_t nxt
        t.work -= self.w_slice[gw]
        if t.work > 1e-6:
            # quantum expired: back to the tail, and the worker takes the head
            if ring_push(&v.queue, slot) != 0:
                self.err = ERR_NOMEM
                return
            self.start(s, lw, ring_pop(&v.queue))
            return
        est_observe(&v.est, lw, t.type, t.total / v.speed)
        v.ntasks -= 1
        self.finish(s, slot, True)
        if self.mode == MODE_CFCFS:
            self.w_slot[gw] = -1
            if self.cdelay == 0:
                self.central_idle(gw)
            else:
                self.push(self.now + self.cdelay, EV_CNOTIFY, gw, 0, 0.0)
            return
        nxt = ring_pop(&v.queue)
        if nxt >= 0:
            self.start(s, lw, nxt)
        else:
            self.w_slot[gw] = -1
            v.idle[v.nidle] = lw
            v.nidle += 1
        if self.has_policies:
            self.ask_steal(s)

    cdef void ask_steal(self, int s) noexcept nogil:
        """After a completion at server s: the policy may send a steal request."""
        cdef int victim = (<Policy>self.pol[s]).decide_steal(self.now)
        cdef uint32_t seq = 0
        cdef int64_t t = self.now
        if victim >= 0:
            if victim < self.n and victim != s:
                if self.max_steals > 0:
                    seq = steal_gate_open(&self.sv[s].steal, self.now)
                    if seq == 0:
                        return
                if self.sv[s].gw_free > t:
                    t = self.sv[s].gw_free      # after the response the gateway is sending
                self.sv[s].steal_requests += 1
                self.push(t + self.net(), EV_STEAL_REQ, victim, s, <double>seq)
            else:
                self.sv[s].bad_decisions += 1

    cdef void drop(self, int s, int32_t slot) noexcept nogil:
        """Server s is at capacity: the task is answered "dropped" at once, as the runtime's
        gateway does when no task slot is free."""
        cdef Task* t = &self.tasks[slot]
        self.sv[s].dropped += 1
        self.n_dropped += 1
        if t.idx < self.n_tasks:
            self.dropped[t.idx] = 1
        self.finish(s, slot, False)

    cdef void finish(self, int s, int32_t slot, bint served) noexcept nogil:
        """Task done (or dropped) at server s: the response goes back to its client."""
        cdef Task* t = &self.tasks[slot]
        cdef int64_t back, t_out = self.now
        cdef Server* v = &self.sv[s]
        if self.mode == MODE_CFCFS:
            back = self.cdelay
        elif self.mode == MODE_CENTRAL_POD:
            back = 0
        else:
            back = self.net()
        if self.gw_ns > 0:
            t_out = self.gw_take(s, 1)      # the response leaves when the gateway sends it
        self.track_area()
        if served:
            v.completed += 1
        self.completed += 1                 # answered: served or dropped
        if t.idx < self.n_tasks:
            self.lat[t.idx] = t_out + back - t.sent
            self.svc[t.idx] = t.total / v.speed if served else 0.0
            if t.idx >= self.n_warm:
                self.completed_measured += 1
        if self.has_client_policies:
            self.push(t_out + back, EV_RESP, t.client,
                      s + 64 * <int32_t>(v.ntasks if v.ntasks < 16777215 else 16777215),
                      est_load(&v.est, <double>v.ntasks))
        self.free_slots[self.n_free] = slot
        self.n_free += 1

    # ------------------------------------------------------------------ ideal PS
    cdef inline void ps_advance(self, Server* v) noexcept nogil:
        cdef double dt = <double>(self.now - v.vlast)
        cdef int busy
        if v.ps_n > 0 and dt > 0:
            busy = v.ps_n if v.ps_n < v.W else v.W
            v.V += dt * v.speed * busy / v.ps_n
            v.busy_ns += dt * busy
        v.vlast = self.now

    cdef void ps_reschedule(self, int s) noexcept nogil:
        cdef Server* v = &self.sv[s]
        cdef double r, dt
        v.epoch += 1
        if v.ps_n == 0:
            return
        r = v.speed * (v.W if v.ps_n > v.W else v.ps_n) / v.ps_n
        dt = (self.tasks[v.ps[0]].tag - v.V) / r
        if dt < 0:
            dt = 0
        self.push(self.now + <int64_t>ceil(dt), EV_PSDONE, s, <int32_t>v.epoch, 0.0)

    cdef void ps_add(self, int s, int32_t slot) noexcept nogil:
        cdef Server* v = &self.sv[s]
        cdef int32_t* nb
        cdef int i, p
        cdef double tag
        self.ps_advance(v)
        if v.ps_n == v.ps_cap:
            nb = <int32_t*>realloc(v.ps, sizeof(int32_t) * v.ps_cap * 2)
            if nb == NULL:
                self.err = ERR_NOMEM
                return
            v.ps = nb
            v.ps_cap *= 2
        tag = v.V + self.tasks[slot].work
        self.tasks[slot].tag = tag
        i = v.ps_n
        v.ps_n += 1
        while i > 0:
            p = (i - 1) >> 1
            if self.tasks[v.ps[p]].tag <= tag:
                break
            v.ps[i] = v.ps[p]
            i = p
        v.ps[i] = slot
        self.ps_reschedule(s)

    cdef void on_psdone(self, int s, uint32_t epoch) noexcept nogil:
        cdef Server* v = &self.sv[s]
        cdef int32_t slot, last
        cdef int i, c, n
        cdef double lt
        if epoch != v.epoch or v.ps_n == 0:
            return
        self.ps_advance(v)
        slot = v.ps[0]
        v.ps_n -= 1
        n = v.ps_n
        if n > 0:
            last = v.ps[n]
            lt = self.tasks[last].tag
            i = 0
            while True:
                c = 2 * i + 1
                if c >= n:
                    break
                if c + 1 < n and self.tasks[v.ps[c + 1]].tag < self.tasks[v.ps[c]].tag:
                    c += 1
                if self.tasks[v.ps[c]].tag >= lt:
                    break
                v.ps[i] = v.ps[c]
                i = c
            v.ps[i] = last
        est_observe(&v.est, <int>(v.ps_rr % <uint32_t>v.W), self.tasks[slot].type,
                    self.tasks[slot].total / v.speed)
        v.ps_rr += 1
        v.ntasks -= 1
        self.finish(s, slot, True)
        self.ps_reschedule(s)
        if self.has_policies:
            self.ask_steal(s)

    # ------------------------------------------------------------------ centralized FCFS
    cdef void central_arrival(self, int32_t slot) noexcept nogil:
        cdef int i, s, lw
        cdef Server* v
        for i in range(self.n):
            s = self.speed_order[i]
            v = &self.sv[s]
            if v.nidle > 0:
                v.nidle -= 1
                lw = v.idle[v.nidle]
                self.central_dispatch(s, lw, slot)
                return
        if ring_push(&self.sv[0].queue, slot) != 0:    # server 0's ring is the rack queue
            self.err = ERR_NOMEM

    cdef inline void central_dispatch(self, int s, int lw, int32_t slot) noexcept nogil:
        cdef int gw = self.sv[s].first + lw
        self.w_slot[gw] = slot       # reserved while the task travels
        if self.cdelay == 0:
            self.central_start(gw, slot)
        else:
            self.push(self.now + self.cdelay, EV_CDISPATCH, gw, slot, 0.0)

    cdef inline void central_start(self, int gw, int32_t slot) noexcept nogil:
        cdef int s = self.w_server[gw]
        cdef Server* v = &self.sv[s]
        est_note_arrival(&v.est, self.tasks[slot].type)
        v.accepted += 1
        v.ntasks += 1
        self.start(s, gw - v.first, slot)

    cdef void central_idle(self, int gw) noexcept nogil:
        cdef int s = self.w_server[gw]
        cdef Server* v = &self.sv[s]
        cdef int32_t nxt = ring_pop(&self.sv[0].queue)
        if nxt >= 0:
            self.central_dispatch(s, gw - v.first, nxt)
        else:
            v.idle[v.nidle] = gw - v.first
            v.nidle += 1

    # ------------------------------------------------------------------ windows, heartbeats
    cdef void on_window(self, int s) noexcept nogil:
        cdef Server* v = &self.sv[s]
        cdef double q = <double>v.ntasks
        cdef double load
        cdef Heartbeat* hb = NULL
        cdef int j, idx = 0
        cdef int64_t row, t
        if self.has_policies:
            # The window protocol, as the runtime's policy thread runs it. The ring slot of
            # this heartbeat outlives its delivery (K slots per server).
            idx = s * self.K + <int>(v.win.hb_seq % <uint32_t>self.K)
            hb = &self.hbuf[idx]
            drv_end_window(&v.win, <Policy>self.pol[s], &v.est, self.now, q, hb)
            load = v.win.load
        else:
            load = q / est_rate(&v.est)
        v.load_sum += load
        v.q_sum += q
        if self.record:
            row = v.windows
            if row >= self.rec_cap:
                if not self.grow_record():
                    return
            self.rec_load[row * self.n + s] = load
            self.rec_q[row * self.n + s] = q
            self.rec_true[row * self.n + s] = q * self.prior_ns / (v.W * v.speed)
            if row + 1 > self.rec_rows:
                self.rec_rows = row + 1
        v.windows += 1
        if self.has_policies and self.n > 1:
            t = self.now
            if self.gw_ns > 0:
                t = self.gw_take(s, self.n - 1)     # one copy per peer, sent together
            if self.jitter == 0:
                self.push(t + self.delay, EV_HBALL, s, idx, <double>hb.seq)
            else:
                for j in range(self.n):
                    if j == s:
                        continue
                    self.hb_sent += 1
                    if self.loss > 0.0 and rng_uniform(&self.r_net) < self.loss:
                        self.hb_lost += 1
                        continue
                    self.push(t + self.net(), EV_HB, j, idx, <double>hb.seq)
        self.push(self.now + self.window, EV_WINDOW, s, 0, 0.0)

    cdef bint grow_record(self) noexcept nogil:
        cdef int64_t ncap = self.rec_cap * 2
        cdef double* a = <double*>realloc(self.rec_load, sizeof(double) * ncap * self.n)
        if a == NULL:
            self.err = ERR_NOMEM
            return False
        self.rec_load = a
        a = <double*>realloc(self.rec_q, sizeof(double) * ncap * self.n)
        if a == NULL:
            self.err = ERR_NOMEM
            return False
        self.rec_q = a
        a = <double*>realloc(self.rec_true, sizeof(double) * ncap * self.n)
        if a == NULL:
            self.err = ERR_NOMEM
            return False
        self.rec_true = a
        self.rec_cap = ncap
        return True

    cdef void on_hb_all(self, int src, int idx, double seq) noexcept nogil:
        cdef int j
        cdef const Heartbeat* hb = &self.hbuf[idx]
        for j in range(self.n):
            if j == src:
                continue
            self.hb_sent += 1
            if self.loss > 0.0 and rng_uniform(&self.r_net) < self.loss:
                self.hb_lost += 1
                continue
            if self.gw_ns > 0:      # each peer's gateway takes it in its own time
                self.push(self.gw_take(j, 1), EV_HB_GW, j, idx, seq)
                continue
            self.events += 1        # each reception counts as one simulated event
            drv_observe_peer(&self.sv[j].win, <Policy>self.pol[j], self.now, hb)
        if self.gw_ns == 0:
            self.events -= 1        # the loop counted this event already

    cdef void on_hb_gw(self, int dst, int idx, double seq) noexcept nogil:
        """A heartbeat that waited for dst's gateway; its ring slot may have been reused."""
        if self.hbuf[idx].seq != <uint32_t>seq:
            self.hb_overrun += 1
            return
        drv_observe_peer(&self.sv[dst].win, <Policy>self.pol[dst], self.now, &self.hbuf[idx])

    # ------------------------------------------------------------------ steals
    cdef void on_steal_req(self, int victim, int thief, double seq) noexcept nogil:
        cdef Server* v = &self.sv[victim]
        cdef int32_t slot = -1
        if self.sched != SCHED_PS:      # under ideal PS no task is waiting
            slot = ring_pop(&v.queue)
        if slot >= 0:
            v.ntasks -= 1
            self.tasks[slot].moved = 1
        else:
            self.sv[thief].steal_empty += 1
        self.push(self.now + self.net(), EV_STEAL_REP, thief, slot, seq)

    cdef void on_steal_rep(self, int thief, int32_t slot, double seq) noexcept nogil:
        cdef Server* v = &self.sv[thief]
        if self.max_steals > 0:
            steal_gate_reply(&v.steal, <uint32_t>seq, self.now)
        if slot < 0:
            return
        # A task always counts, even if its request was given up (as in the runtime).
        if self.cap > 0 and v.ntasks >= self.cap:
            self.drop(thief, slot)
            return
        v.steals += 1
        drv_stole(<Policy>self.pol[thief])
        self.accept(thief, slot)

    # ------------------------------------------------------------------ changes
    cdef void on_change(self, int i) noexcept nogil:
        cdef int k = self.ch_kind[i], s
        cdef Server* v
        if k == CH_RATE:
            self.rate = self.ch_x[i]
            if self.gen_active:
                # memoryless: redraw the next arrival from now at the new rate
                self.arr_clock = <double>self.now
                self.schedule_next_arrival()
        elif k == CH_SHARES:
            for s in range(self.n):
                self.shares_cdf[s] = self.ch_shares[i * self.n + s]
        elif k == CH_SPEED:
            v = &self.sv[self.ch_a[i]]
            if self.sched == SCHED_PS:
                self.ps_advance(v)
                v.speed = self.ch_x[i]
                self.ps_reschedule(self.ch_a[i])
            else:
                v.speed = self.ch_x[i]      # tasks already in service keep their end time

    # ------------------------------------------------------------------ main loop
    cdef void loop(self) noexcept nogil:
        cdef Event e
        cdef int kind
        while self.err == 0:
            if self.hn == 0 and self.next_arrival == INT64_MAX:
                break       # arrival rate 0 and nothing left to happen
            if self.gen_active and (self.hn == 0 or self.next_arrival <= self.heap[0].t):
                self.now = self.next_arrival
                self.events += 1
                self.do_arrival()
                continue
            if not self.gen_active and self.completed == self.generated:
                break
            if self.hn == 0:
                break
            self.pop(&e)
            self.now = e.t
            self.events += 1
            kind = <int>(e.sk & 0xFF)
            if kind == EV_DONE:
                self.on_done(e.a, e.b)
            elif kind == EV_TASK:
                if self.gw_ns > 0:
                    self.push(self.gw_take(e.a, 1), EV_TASK_GW, e.a, e.b, e.x)
                else:
                    self.on_task(e.a, e.b)
            elif kind == EV_TASK_GW:
                self.on_task(e.a, e.b)
            elif kind == EV_HB:
                if self.gw_ns > 0:
                    self.push(self.gw_take(e.a, 1), EV_HB_GW, e.a, e.b, e.x)
                else:
                    drv_observe_peer(&self.sv[e.a].win, <Policy>self.pol[e.a], self.now,
                                     &self.hbuf[e.b])
            elif kind == EV_HBALL:
                self.on_hb_all(e.a, e.b, e.x)
            elif kind == EV_HB_GW:
                self.on_hb_gw(e.a, e.b, e.x)
            elif kind == EV_WINDOW:
                self.on_window(e.a)
            elif kind == EV_PSDONE:
                self.on_psdone(e.a, <uint32_t>e.b)
            elif kind == EV_RESP:
                (<ClientPolicy>self.cpol[e.a]).on_response(
                    self.now, e.b % 64, e.x, <double>(e.b // 64))
            elif kind == EV_STEAL_REQ:
                if self.gw_ns > 0:
                    self.push(self.gw_take(e.a, 1), EV_STEAL_REQ_GW, e.a, e.b, e.x)
                else:
                    self.on_steal_req(e.a, e.b, e.x)
            elif kind == EV_STEAL_REQ_GW:
                self.on_steal_req(e.a, e.b, e.x)
            elif kind == EV_STEAL_REP:
                if self.gw_ns > 0:
                    self.push(self.gw_take(e.a, 1), EV_STEAL_REP_GW, e.a, e.b, e.x)
                else:
                    self.on_steal_rep(e.a, e.b, e.x)
            elif kind == EV_STEAL_REP_GW:
                self.on_steal_rep(e.a, e.b, e.x)
            elif kind == EV_CDISPATCH:
                self.central_start(e.a, e.b)
            elif kind == EV_CNOTIFY:
                self.central_idle(e.a)
            elif kind == EV_CHANGE:
                self.on_change(e.a)

    def run(self):
        """Run to completion; return the raw results as a dict of numpy arrays and counters."""
        cdef int s, i
        if self.n_tasks < 1:
            raise ValueError("need at least one task")
        self.gen_active = True
        self.arr_clock = 0.0
        self.schedule_next_arrival()
        if self.rate <= 0.0 and self.n_changes == 0:
            raise ValueError("arrival rate must be > 0")
        if self.has_policies:
            for s in range(self.n):
                drv_start(&self.sv[s].win, <Policy>self.pol[s], &self.sv[s].est, 0, 0.0)
        if self.has_policies or self.record:
            for s in range(self.n):
                self.push(self.phase[s], EV_WINDOW, s, 0, 0.0)
        for i in range(self.n_changes):
            self.push(self.ch_t[i], EV_CHANGE, i, 0, 0.0)
        # CPU time of this thread: on a shared machine wall time also counts waiting for a core
        t0 = time.thread_time()
        with nogil:
            self.loop()
        self.loop_s = time.thread_time() - t0
        for s in range(self.n):
            if self.sv[s].gw_free > self.now:
                self.now = self.sv[s].gw_free   # the run ends when the last response leaves
        if self.err == ERR_NOMEM:
            raise MemoryError("simulator ran out of memory")
        return self._results()

    def _results(self):
        cdef int s
        cdef Server* v
        n = self.n_tasks
        out = dict(
            latency_ns=np.array(<int64_t[:n]>self.lat, copy=True),
            sent_ns=np.array(<int64_t[:n]>self.sent, copy=True),
            types=np.array(<int32_t[:n]>self.ttype, copy=True),
            service_ns=np.array(<double[:n]>self.svc, copy=True),
            dropped=np.array(<uint8_t[:n]>self.dropped, copy=True).astype(bool),
            generated=self.generated, completed=self.completed - self.n_dropped,
            n_dropped=self.n_dropped,
            events=self.events, end_ns=self.now, area=self.area, loop_s=self.loop_s,
            hb_sent=self.hb_sent, hb_lost=self.hb_lost, hb_overrun=self.hb_overrun,
        )
        fields = ("accepted", "completed", "migrations", "steals", "steal_requests",
                  "steal_empty", "bad_decisions", "busy_ns", "load_sum", "q_sum", "windows",
                  "dropped", "gateway_msgs", "steal_suppressed", "steal_timeouts",
                  "steals_in_flight_max", "ntasks_end", "queue_end")
        per = {f: [] for f in fields}
        for s in range(self.n):
            v = &self.sv[s]
            per["accepted"].append(v.accepted)
            per["completed"].append(v.completed)
            per["migrations"].append(v.migrations)
            per["steals"].append(v.steals)
            per["steal_requests"].append(v.steal_requests)
            per["steal_empty"].append(v.steal_empty)
            per["bad_decisions"].append(v.bad_decisions)
            per["busy_ns"].append(v.busy_ns)
            per["load_sum"].append(v.load_sum)
            per["q_sum"].append(v.q_sum)
            per["windows"].append(v.windows)
            per["dropped"].append(v.dropped)
            per["gateway_msgs"].append(v.gw_msgs)
            per["steal_suppressed"].append(v.steal.suppressed)
            per["steal_timeouts"].append(v.steal.timeouts)
            per["steals_in_flight_max"].append(v.steal.max_seen)
            per["ntasks_end"].append(v.ntasks)
            per["queue_end"].append(v.queue.count)
        out["server"] = {k: np.array(x) for k, x in per.items()}
        if self.record and self.rec_rows == 0:
            out["rec_load_ns"] = np.zeros((0, self.n))
            out["rec_queue"] = np.zeros((0, self.n))
            out["rec_true_ns"] = np.zeros((0, self.n))
        elif self.record:
            rows = self.rec_rows
            out["rec_load_ns"] = np.array(<double[:rows * self.n]>self.rec_load,
                                          copy=True).reshape(rows, self.n)
            out["rec_queue"] = np.array(<double[:rows * self.n]>self.rec_q,
                                        copy=True).reshape(rows, self.n)
            out["rec_true_ns"] = np.array(<double[:rows * self.n]>self.rec_true,
                                          copy=True).reshape(rows, self.n)
        return out
