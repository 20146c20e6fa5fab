# cython: language_level=3
"""Data layout of the discrete-event rack simulator (see ``_engine.pyx``).

The enums below are the one definition of the engine's event kinds, modes, schedulers and
change kinds; the last three are ``cpdef``, so that :mod:`malcolm.sim.run` imports them from
``malcolm.sim._engine`` instead of copying their values.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc

from malcolm._core cimport Estimator, Rng, est_free
from malcolm._workload cimport WorkloadC
from malcolm.policy.base cimport Heartbeat, MAX_SERVERS
from malcolm.policy.driver cimport StealGate, WindowState
from malcolm.sim._queues cimport Event, EventQueue, Ring, ring_init, ring_pop


cdef enum:
    # Event kinds, and what an event's a, b and x carry.
    EV_TASK = 1         # a: server, b: slot. A task message reaches a server.
    EV_DONE = 2         # a: server, b: global worker. A worker ends a task or a quantum.
    EV_PSDONE = 3       # a: server, b: epoch. Ideal PS: the smallest tag is reached.
    EV_WINDOW = 4       # a: server. Start of a load-broadcast window.
    EV_HB = 5           # a: destination, b: heartbeat buffer index.
    EV_STEAL_REQ = 6    # a: victim, b: thief, x: request seq.
    EV_STEAL_REP = 7    # a: thief, b: slot or -1, x: request seq.
    EV_RESP = 8         # a: slot (its client, its queue length), b: server, x: server's load.
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

    ERR_NOMEM = 1


# Python-visible too (cpdef): malcolm.sim.run passes them to the engine.
cpdef enum:
    MODE_DIST = 0       # servers run policies; clients send by shares or a client policy
    MODE_CFCFS = 1      # one rack-wide FCFS queue
    MODE_CENTRAL_POD = 2  # centralized power-of-d on true queue lengths, zero delay

    SCHED_FCFS = 0
    SCHED_RR = 1        # processor sharing with a quantum (round robin)
    SCHED_PS = 2        # ideal processor sharing

    CH_RATE = 0
    CH_SHARES = 1
    CH_SPEED = 2


ctypedef struct Task:
    int64_t sent            # client send time
    int64_t idx             # creation index
    double work             # remaining work, ns at speed 1
    double total            # total work, ns at speed 1
    double tag              # ideal PS: virtual finish time
    int32_t type
    int32_t client
    int32_t moved           # migrated or stolen: never offered to decide_arrival again
    int32_t resp_queue      # tasks in its server when it finished (client policies)


ctypedef struct Server:
    int32_t n_workers
    int32_t first           # global index of worker 0
    double speed
    Ring queue              # waiting tasks, oldest first
    Ring stolen             # stolen tasks waiting, served before ``queue`` (stolen_first)
    int32_t* idle           # stack of idle local worker indices
    int32_t nidle
    uint32_t epoch          # ideal PS: completion events of older epochs are stale
    int64_t ntasks          # tasks in the server: waiting + in service
    # ideal PS: tasks in a binary min-heap on their virtual finish tag
    int32_t* ps
    int32_t ps_n
    int32_t ps_cap
    double ps_vtime         # virtual time: work each task has received
    int64_t ps_vlast        # when ps_vtime was last advanced
    uint32_t ps_rr          # which worker "observes" the next PS completion
    int64_t windows
    int64_t rec_next        # record_loads: the next row from this time on
    int64_t rec_rows        # record_loads: rows written
    int64_t gw_free         # the gateway is busy with earlier messages until then
    Estimator est
    # statistics
    double busy_ns          # worker-ns of service
    double load_sum
    double q_sum
    uint64_t accepted
    uint64_t completed
    uint64_t migrations
    uint64_t steals
    uint64_t steal_requests
    uint64_t steal_empty
    uint64_t bad_decisions
    uint64_t dropped        # tasks refused at capacity, answered at once
    uint64_t gw_msgs        # messages the gateway handled
    # cold: once per window or per steal decision
    WindowState win         # the policy thread's window protocol (policy/driver.pxd)
    StealGate steal         # steal requests in flight


ctypedef struct LoadRecord:
    # Every server's state once per configured window (record_loads): row r, column s is
    # server s's first window end at or after its r-th configured window.
    double* load            # the estimator's load (what the policy saw)
    double* queue           # tasks in the server
    double* true_load       # tasks x nominal mean service time / (workers x speed)
    int64_t rows
    int64_t cap             # rows allocated


cdef class Engine:
    # configuration
    cdef int n, mode, sched, n_clients, n_types, err, has_policies, has_client_policies
    cdef int record, pod_d, n_workers, max_steals
    cdef int hb_slots           # heartbeat ring slots per server
    cdef int64_t now, delay, jitter, window, quantum, cdelay, next_arrival
    cdef int64_t gw_ns, cap, steal_timeout
    cdef double arr_clock, rate, loss, prior_ns, alpha
    cdef double win_tasks       # drv_window_ns's task times per window; 0: window fixed
    cdef double shares_cdf[MAX_SERVERS]
    cdef int32_t speed_order[MAX_SERVERS]
    cdef Rng r_arr, r_svc, r_net, r_misc
    cdef WorkloadC wl
    # servers and their workers (w_*: per global worker index)
    cdef Server* servers
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
    cdef double work_measured   # the measured tasks' drawn service times, summed (ns)
    cdef double area
    cdef int64_t area_t
    # events
    cdef EventQueue heap
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
    cdef LoadRecord rec
    cdef int64_t* phase

    cdef inline void push(self, int64_t t, int kind, int32_t a, int32_t b, double x) noexcept nogil
    cdef inline int64_t net(self) noexcept nogil
    cdef int32_t alloc_task(self) noexcept nogil
    cdef inline int64_t gw_take(self, int s, int64_t n_msgs) noexcept nogil
    cdef inline void pop(self, Event* out) noexcept nogil
    cdef inline void track_area(self) noexcept nogil
    cdef void schedule_next_arrival(self) noexcept nogil
    cdef void do_arrival(self) noexcept nogil
    cdef void on_task(self, int s, int32_t slot) noexcept nogil
    cdef void accept(self, int s, int32_t slot, bint stolen=*) noexcept nogil
    cdef inline void start(self, int s, int lw, int32_t slot) noexcept nogil
    cdef void on_done(self, int s, int gw) noexcept nogil
    cdef void drop(self, int s, int32_t slot) noexcept nogil
    cdef void finish(self, int s, int32_t slot, bint served) noexcept nogil
    cdef void on_response(self, int32_t slot, int s, double load) noexcept nogil
    cdef inline void ps_advance(self, Server* v) noexcept nogil
    cdef void ps_reschedule(self, int s) noexcept nogil
    cdef void ps_add(self, int s, int32_t slot) noexcept nogil
    cdef void on_psdone(self, int s, uint32_t epoch) noexcept nogil
    cdef void central_arrival(self, int32_t slot) noexcept nogil
    cdef void central_idle(self, int gw) noexcept nogil
    cdef inline void central_start(self, int gw, int32_t slot) noexcept nogil
    cdef void on_window(self, int s) noexcept nogil
    cdef void on_change(self, int i) noexcept nogil
    cdef void loop(self) noexcept nogil


cdef inline int ps_heap_push(Server* v, Task* tasks, int32_t slot, double tag) noexcept nogil:
    """Ideal PS: add ``slot``, whose virtual finish tag is ``tag``, to the server's min-heap
    on tags; -1 when out of memory."""
    cdef int32_t* nb
    cdef int i, p
    if v.ps_n == v.ps_cap:
        nb = <int32_t*>realloc(v.ps, sizeof(int32_t) * v.ps_cap * 2)
        if nb == NULL:
            return -1
        v.ps = nb
        v.ps_cap *= 2
    i = v.ps_n
    v.ps_n += 1
    while i > 0:
        p = (i - 1) >> 1
        if tasks[v.ps[p]].tag <= tag:
            break
        v.ps[i] = v.ps[p]
        i = p
    v.ps[i] = slot
    return 0


cdef inline int32_t ps_heap_pop(Server* v, Task* tasks) noexcept nogil:
    """Ideal PS: remove and return the task with the smallest tag; the heap must not be
    empty."""
    cdef int32_t slot = v.ps[0], last
    cdef int i, c, n
    cdef double lt
    v.ps_n -= 1
    n = v.ps_n
    if n > 0:
        last = v.ps[n]
        lt = tasks[last].tag
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and tasks[v.ps[c + 1]].tag < tasks[v.ps[c]].tag:
                c += 1
            if tasks[v.ps[c]].tag >= lt:
                break
            v.ps[i] = v.ps[c]
            i = c
        v.ps[i] = last
    return slot


cdef inline int server_init(Server* v, int n_workers, int first, double speed) noexcept nogil:
    """Allocate a zeroed server's queues and make all its workers idle (its estimator and
    steal gate are the caller's); -1 when out of memory."""
    cdef int w
    v.n_workers = n_workers
    v.first = first
    v.speed = speed
    v.idle = <int32_t*>malloc(sizeof(int32_t) * n_workers)
    v.ps_cap = 64
    v.ps = <int32_t*>malloc(sizeof(int32_t) * v.ps_cap)
    if (ring_init(&v.queue, 64) != 0 or ring_init(&v.stolen, 4) != 0 or v.idle == NULL
            or v.ps == NULL):
        return -1
    for w in range(n_workers):
        v.idle[w] = n_workers - 1 - w   # a stack with worker 0 on top: lowest index first
    v.nidle = n_workers
    return 0


cdef inline int32_t server_next(Server* v) noexcept nogil:
    """The task a free worker takes: a stolen one first (``Server.stolen``), else the oldest
    waiting; -1 if none waits."""
    if v.stolen.count > 0:
        return ring_pop(&v.stolen)
    return ring_pop(&v.queue)


cdef inline void server_free(Server* v) noexcept nogil:
    free(v.queue.buf)
    free(v.stolen.buf)
    free(v.idle)
    free(v.ps)
    est_free(&v.est)


cdef inline int record_grow(LoadRecord* r, int n) noexcept nogil:
    """Room for twice the rows (or the first 1024) of ``n`` servers; -1 when out of
    memory (what was recorded stays)."""
    cdef int64_t cap = r.cap * 2 if r.cap > 0 else 1024
    cdef double* a = <double*>realloc(r.load, sizeof(double) * cap * n)
    if a == NULL:
        return -1
    r.load = a
    a = <double*>realloc(r.queue, sizeof(double) * cap * n)
    if a == NULL:
        return -1
    r.queue = a
    a = <double*>realloc(r.true_load, sizeof(double) * cap * n)
    if a == NULL:
        return -1
    r.true_load = a
    r.cap = cap
    return 0


cdef inline void record_free(LoadRecord* r) noexcept nogil:
    free(r.load)
    free(r.queue)
    free(r.true_load)
