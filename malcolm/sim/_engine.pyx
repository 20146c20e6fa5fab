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
(``observe_peer``). Steal requests in flight go through the driver's ``StealGate``. The
messages between servers (heartbeats, steals) are ``_network.pxd``'s, compiled into the loop.

The runtime's mechanics that shape results are parameters (all off by default except one
steal in flight): ``gateway_ns`` makes each server's gateway a FIFO single server of
messages, ``capacity`` bounds the tasks a server holds (the rest are dropped and answered at
once), and ``max_steals``/``steal_timeout_ns`` bound steal requests in flight.
"""
from libc.math cimport ceil
from libc.stdint cimport INT32_MAX, INT64_MAX, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memset

import time

from malcolm._shares import cumulative
from malcolm.policy.defaults import EST_ALPHA, STEAL_TIMEOUT_US, STEALS_IN_FLIGHT, WINDOW_TASKS

from malcolm._core cimport (
    est_init, est_load, est_note_arrival, est_observe, est_rate, rng_below,
    rng_exponential, rng_seed, rng_uniform,
)
from malcolm._workload cimport NativeWorkload, wl_sample
from malcolm.policy.base cimport ClientPolicy, Heartbeat, MAX_SERVERS, Policy
from malcolm.policy.driver cimport (
    WINDOW_SHRINK, drv_end_window, drv_migrated, drv_start, drv_window_ns, steal_gate_init)
from malcolm.sim._central cimport cfcfs_arrival, cfcfs_idle, cfcfs_start, pod_pick
from malcolm.sim._network cimport (
    hb_deliver, hb_deliver_all, hb_deliver_gw, hb_send, steal_ask, steal_reply, steal_request,
    via_gateway,
)
from malcolm.sim._queues cimport (
    Event, evq_init, evq_pop, evq_push, event_kind, ring_push,
)


cdef class Engine:
    """One simulation run. Built and driven by :func:`malcolm.sim.simulate`; not reusable."""

    def __init__(self, workers, speeds, NativeWorkload workload, *, int mode, int sched,
                 double quantum_ns, double rate_per_ns, shares, long long n_tasks,
                 long long n_warm, unsigned long long seed, double delay_ns,
                 double jitter_ns, double window_ns, double loss, phases_ns,
                 policies=None, clients=None, int n_clients=1, double central_delay_ns=0.0,
                 int pod_d=2, double ewma=EST_ALPHA, bint record=False, changes=(),
                 double prior_ns=0.0, double gateway_ns=0.0, long long capacity=0,
                 int max_steals=STEALS_IN_FLIGHT,
                 double steal_timeout_ns=STEAL_TIMEOUT_US * 1e3,
                 double window_tasks=WINDOW_TASKS):
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
        self.win_tasks = window_tasks if window_tasks > 0.0 else 0.0
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
        self.servers = <Server*>malloc(sizeof(Server) * self.n)
        self.w_slot = <int32_t*>malloc(sizeof(int32_t) * self.n_workers)
        self.w_slice = <double*>malloc(sizeof(double) * self.n_workers)
        self.w_server = <int32_t*>malloc(sizeof(int32_t) * self.n_workers)
        if (self.servers == NULL or self.w_slot == NULL or self.w_slice == NULL
                or self.w_server == NULL):
            raise MemoryError()
        memset(self.servers, 0, sizeof(Server) * self.n)
        k = 0
        for s in range(self.n):
            if server_init(&self.servers[s], workers[s], k, speeds[s]) != 0:
                raise MemoryError()
            for w in range(workers[s]):
                self.w_slot[k + w] = -1
                self.w_server[k + w] = s
            if est_init(&self.servers[s].est, workers[s], self.n_types, ewma,
                        self.prior_ns) != 0:
                raise ValueError(f"cannot set up the load estimator (ewma={ewma})")
            steal_gate_init(&self.servers[s].steal, max(1, max_steals), self.steal_timeout)
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

        if evq_init(&self.heap, 1024) != 0:
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
        # (the shortest window drv_window_ns gives: the most heartbeats in flight)
        self.hb_slots = <int>((self.delay + self.jitter)
                              // max(1, self.window // WINDOW_SHRINK
                                     if self.win_tasks > 0.0 else self.window)) + 2
        if self.gw_ns > 0:
            # Gateways can hold a heartbeat back for a while: more slots, and one overwritten
            # before its delivery is counted (hb_overrun) and not delivered.
            self.hb_slots += 8
        if self.has_policies:
            self.hbuf = <Heartbeat*>malloc(sizeof(Heartbeat) * self.n * self.hb_slots)
            if self.hbuf == NULL:
                raise MemoryError()

        self._set_changes(changes)

        self.phase = <int64_t*>malloc(sizeof(int64_t) * self.n)
        if self.phase == NULL:
            raise MemoryError()
        for s in range(self.n):
            self.phase[s] = <int64_t>phases_ns[s]
        if self.record and record_grow(&self.rec, self.n) != 0:
            raise MemoryError()

    def _set_shares(self, shares):
        cdef int s
        if len(shares) != self.n or not sum(shares) > 0 or any(x < 0 for x in shares):
            raise ValueError(f"shares must be {self.n} non-negative numbers with a positive sum")
        for s, acc in enumerate(cumulative(shares)):
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
                for s, acc in enumerate(cumulative(sh)):
                    self.ch_shares[i * self.n + s] = acc
                self.ch_shares[i * self.n + self.n - 1] = 1.0

    def __dealloc__(self):
        # A cdef class's C fields start zeroed: a half-built engine frees what it allocated.
        cdef int s
        if self.servers != NULL:
            for s in range(self.n):
                server_free(&self.servers[s])
            free(self.servers)
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
        free(self.heap.buf)
        free(self.hbuf)
        free(self.cpol)
        free(self.ch_t)
        free(self.ch_kind)
        free(self.ch_a)
        free(self.ch_x)
        free(self.ch_shares)
        record_free(&self.rec)
        free(self.phase)

    # ------------------------------------------------------------------ helpers
    cdef inline void push(self, int64_t t, int kind, int32_t a, int32_t b, double x) noexcept nogil:
        if evq_push(&self.heap, t, kind, a, b, x) != 0:
            self.err = ERR_NOMEM

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
        cdef Server* v = &self.servers[s]
        cdef int64_t t = v.gw_free if v.gw_free > self.now else self.now
        t += n_msgs * self.gw_ns
        v.gw_free = t
        v.gw_msgs += <uint64_t>n_msgs
        return t

    cdef inline void pop(self, Event* out) noexcept nogil:
        evq_pop(&self.heap, out)

    cdef inline void track_area(self) noexcept nogil:
        # integral over time of the tasks that clients have sent and not yet seen finish
        self.area += <double>(self.generated - self.completed) * <double>(self.now - self.area_t)
        self.area_t = self.now

    # ------------------------------------------------------------------ arrivals
    cdef void schedule_next_arrival(self) noexcept nogil:
        if self.rate > 0.0:
            self.arr_clock += rng_exponential(&self.r_arr, 1.0 / self.rate)
            self.next_arrival = <int64_t>self.arr_clock
        else:
            self.next_arrival = INT64_MAX

    cdef void do_arrival(self) noexcept nogil:
        cdef int32_t slot = self.alloc_task()
        cdef Task* t
        cdef int tt, s, c = 0, i
        cdef double u
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
            if t.idx >= self.n_warm:
                self.work_measured += t.work
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
            self.accept(pod_pick(self), slot)
            return
        if self.has_client_policies:
            s = (<ClientPolicy>self.cpol[c]).pick(self.now)
            if s < 0 or s >= self.n:
                s = 0
                self.servers[0].bad_decisions += 1
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
                    self.servers[s].migrations += 1
                    drv_migrated(<Policy>self.pol[s])
                    self.push(self.now + self.net(), EV_TASK, j, slot, 0.0)
                    return
                self.servers[s].bad_decisions += 1
        self.accept(s, slot)

    # ------------------------------------------------------------------ inside a server
    cdef void accept(self, int s, int32_t slot, bint stolen=False) noexcept nogil:
        """Server s keeps task ``slot``: a worker takes it, or it waits (a ``stolen`` one
        ahead of the others where its thief's policy puts it first, as the runtime's gateway
        does: it is the victim's oldest, and behind this server's own arrivals it would
        wait a second time)."""
        cdef Server* v = &self.servers[s]
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
        elif ring_push(&v.stolen if stolen and (<Policy>self.pol[s]).stolen_first
                       else &v.queue, slot) != 0:
            self.err = ERR_NOMEM

    cdef inline void start(self, int s, int lw, int32_t slot) noexcept nogil:
        cdef Server* v = &self.servers[s]
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
        cdef Server* v = &self.servers[s]
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
            self.start(s, lw, server_next(v))
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
        nxt = server_next(v)
        if nxt >= 0:
            self.start(s, lw, nxt)
        else:
            self.w_slot[gw] = -1
            v.idle[v.nidle] = lw
            v.nidle += 1
        if self.has_policies:
            steal_ask(self, s)

    cdef void drop(self, int s, int32_t slot) noexcept nogil:
        """Server s is at capacity: the task is answered "dropped" at once, as the runtime's
        gateway does when no task slot is free."""
        cdef Task* t = &self.tasks[slot]
        self.servers[s].dropped += 1
        self.n_dropped += 1
        if t.idx < self.n_tasks:
            self.dropped[t.idx] = 1
        self.finish(s, slot, False)

    cdef void finish(self, int s, int32_t slot, bint served) noexcept nogil:
        """Task done (or dropped) at server s: the response goes back to its client."""
        cdef Task* t = &self.tasks[slot]
        cdef int64_t back, t_out = self.now
        cdef Server* v = &self.servers[s]
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
            # The response tells the client its server's queue length (kept in the task,
            # whose slot stays taken until the response arrives) and load (in the event).
            t.resp_queue = <int32_t>(v.ntasks if v.ntasks < INT32_MAX else INT32_MAX)
            self.push(t_out + back, EV_RESP, slot, s, est_load(&v.est, <double>v.ntasks))
            return
        self.free_slots[self.n_free] = slot
        self.n_free += 1

    cdef void on_response(self, int32_t slot, int s, double load) noexcept nogil:
        """A response reaches its client, whose policy learns the server's state."""
        cdef Task* t = &self.tasks[slot]
        cdef double queue = <double>t.resp_queue
        (<ClientPolicy>self.cpol[t.client]).on_response(self.now, s, load, queue)
        self.free_slots[self.n_free] = slot
        self.n_free += 1

    # ------------------------------------------------------------------ ideal PS
    cdef inline void ps_advance(self, Server* v) noexcept nogil:
        cdef double dt = <double>(self.now - v.ps_vlast)
        cdef int busy
        if v.ps_n > 0 and dt > 0:
            busy = v.ps_n if v.ps_n < v.n_workers else v.n_workers
            v.ps_vtime += dt * v.speed * busy / v.ps_n
            v.busy_ns += dt * busy
        v.ps_vlast = self.now

    cdef void ps_reschedule(self, int s) noexcept nogil:
        cdef Server* v = &self.servers[s]
        cdef double r, dt
        v.epoch += 1
        if v.ps_n == 0:
            return
        r = v.speed * (v.n_workers if v.ps_n > v.n_workers else v.ps_n) / v.ps_n
        dt = (self.tasks[v.ps[0]].tag - v.ps_vtime) / r
        if dt < 0:
            dt = 0
        self.push(self.now + <int64_t>ceil(dt), EV_PSDONE, s, <int32_t>v.epoch, 0.0)

    cdef void ps_add(self, int s, int32_t slot) noexcept nogil:
        cdef Server* v = &self.servers[s]
        cdef double tag
        self.ps_advance(v)
        tag = v.ps_vtime + self.tasks[slot].work
        self.tasks[slot].tag = tag
        if ps_heap_push(v, self.tasks, slot, tag) != 0:
            self.err = ERR_NOMEM
            return
        self.ps_reschedule(s)

    cdef void on_psdone(self, int s, uint32_t epoch) noexcept nogil:
        cdef Server* v = &self.servers[s]
        cdef int32_t slot
        if epoch != v.epoch or v.ps_n == 0:
            return
        self.ps_advance(v)
        slot = ps_heap_pop(v, self.tasks)
        est_observe(&v.est, <int>(v.ps_rr % <uint32_t>v.n_workers), self.tasks[slot].type,
                    self.tasks[slot].total / v.speed)
        v.ps_rr += 1
        v.ntasks -= 1
        self.finish(s, slot, True)
        self.ps_reschedule(s)
        if self.has_policies:
            steal_ask(self, s)

    # ------------------------------------------------------------------ centralized FCFS
    # Methods around _central.pxd, so that the code of the references stays out of the loop.
    cdef void central_arrival(self, int32_t slot) noexcept nogil:
        cfcfs_arrival(self, slot)

    cdef void central_idle(self, int gw) noexcept nogil:
        cfcfs_idle(self, gw)

    cdef inline void central_start(self, int gw, int32_t slot) noexcept nogil:
        cfcfs_start(self, gw, slot)

    # ------------------------------------------------------------------ windows
    cdef void on_window(self, int s) noexcept nogil:
        cdef Server* v = &self.servers[s]
        cdef double q = <double>v.ntasks
        cdef double load
        cdef Heartbeat* hb = NULL
        cdef int idx = 0
        cdef int64_t row, nxt = self.window
        if self.has_policies:
            # The window protocol, as the runtime's policy thread runs it. The ring slot of
            # this heartbeat outlives its delivery (K slots per server).
            idx = s * self.hb_slots + <int>(v.win.hb_seq % <uint32_t>self.hb_slots)
            hb = &self.hbuf[idx]
            drv_end_window(&v.win, <Policy>self.pol[s], &v.est, self.now, q, hb)
            load = v.win.load
            nxt = drv_window_ns(&v.win, &v.est, self.window, self.win_tasks)
        else:
            load = q / est_rate(&v.est)
        v.load_sum += load
        v.q_sum += q
        # One row per configured window (a server whose windows are shorter records the
        # first of its windows from each boundary on), so that row r is every server's state
        # about r windows after its start whatever drv_window_ns gave.
        if self.record and self.now >= v.rec_next:
            v.rec_next += self.window
            row = v.rec_rows
            v.rec_rows += 1
            if row >= self.rec.cap and record_grow(&self.rec, self.n) != 0:
                self.err = ERR_NOMEM
                return
            self.rec.load[row * self.n + s] = load
            self.rec.queue[row * self.n + s] = q
            self.rec.true_load[row * self.n + s] = q * self.prior_ns / (v.n_workers * v.speed)
            if row + 1 > self.rec.rows:
                self.rec.rows = row + 1
        v.windows += 1
        if self.has_policies and self.n > 1:
            hb_send(self, s, idx, hb.seq)
        self.push(self.now + nxt, EV_WINDOW, s, 0, 0.0)

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
            v = &self.servers[self.ch_a[i]]
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
            if self.heap.count == 0 and self.next_arrival == INT64_MAX:
                break       # arrival rate 0 and nothing left to happen
            if self.gen_active and (self.heap.count == 0
                                    or self.next_arrival <= self.heap.buf[0].t):
                self.now = self.next_arrival
                self.events += 1
                self.do_arrival()
                continue
            if not self.gen_active and self.completed == self.generated:
                break
            if self.heap.count == 0:
                break
            self.pop(&e)
            self.now = e.t
            self.events += 1
            kind = event_kind(&e)
            if kind == EV_DONE:
                self.on_done(e.a, e.b)
            elif kind == EV_TASK:
                if not via_gateway(self, &e, EV_TASK_GW):
                    self.on_task(e.a, e.b)
            elif kind == EV_TASK_GW:
                self.on_task(e.a, e.b)
            elif kind == EV_HB:
                if not via_gateway(self, &e, EV_HB_GW):
                    hb_deliver(self, e.a, &self.hbuf[e.b])
            elif kind == EV_HBALL:
                hb_deliver_all(self, e.a, e.b, e.x)
            elif kind == EV_HB_GW:
                hb_deliver_gw(self, e.a, e.b, e.x)
            elif kind == EV_WINDOW:
                self.on_window(e.a)
            elif kind == EV_PSDONE:
                self.on_psdone(e.a, <uint32_t>e.b)
            elif kind == EV_RESP:
                self.on_response(e.a, e.b, e.x)
            elif kind == EV_STEAL_REQ:
                if not via_gateway(self, &e, EV_STEAL_REQ_GW):
                    steal_request(self, e.a, e.b, e.x)
            elif kind == EV_STEAL_REQ_GW:
                steal_request(self, e.a, e.b, e.x)
            elif kind == EV_STEAL_REP:
                if not via_gateway(self, &e, EV_STEAL_REP_GW):
                    steal_reply(self, e.a, e.b, e.x)
            elif kind == EV_STEAL_REP_GW:
                steal_reply(self, e.a, e.b, e.x)
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
                drv_start(&self.servers[s].win, <Policy>self.pol[s], &self.servers[s].est, 0, 0.0)
        if self.has_policies or self.record:
            for s in range(self.n):
                self.servers[s].rec_next = self.phase[s]
                self.servers[s].rec_rows = 0
                self.push(self.phase[s], EV_WINDOW, s, 0, 0.0)
        for i in range(self.n_changes):
            self.push(self.ch_t[i], EV_CHANGE, i, 0, 0.0)
        # CPU time of this thread: on a shared machine wall time also counts waiting for a core
        t0 = time.thread_time()
        with nogil:
            self.loop()
        self.loop_s = time.thread_time() - t0
        for s in range(self.n):
            if self.servers[s].gw_free > self.now:
                self.now = self.servers[s].gw_free   # the run ends when the last response leaves
        if self.err == ERR_NOMEM:
            raise MemoryError("simulator ran out of memory")
        from malcolm.sim._stats import collect

        return collect(self)
