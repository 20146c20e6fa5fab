# cython: language_level=3
"""One malcolm server: a gateway thread, W worker threads and a policy thread (thesis §6.1).

* The **gateway** polls the transport in batches without the GIL. For each new task it asks
  ``Policy.decide_arrival`` and either enqueues it on the central FCFS queue (a lock-free
  ``Mpmc`` of task-slot indices) or forwards it to a peer. It turns completions into
  responses, asks ``decide_steal`` after each one, answers peers' steal requests with its
  oldest waiting task, and sends the policy thread's heartbeat to every peer once a window.
* **Workers** pop the central queue and run the handler, a C function pointer, without the
  GIL; they feed the measured service times to the load ``Estimator``. With ``workers=0``
  the gateway pops and runs them itself after each receive batch, for up to
  ``INLINE_BUDGET_NS`` before it polls again.
* The **policy thread** never spins: it sleeps until its window ends or the gateway rings
  it for a heartbeat.
  It calls ``observe_peer`` for each heartbeat as it arrives and, at each
  window boundary, ``observe_local`` (the load now), ``end_window`` and ``fill_heartbeat``
  (base.pxd): the window protocol of ``policy/driver.pxd``, the simulator's own code.

Only the gateway touches the transport (RDMA queue pairs are not thread-safe either); the
other threads talk to it through lock-free queues and wake it with ``Transport.wake``.

Every task ends in exactly one response from exactly one server: completed, or answered with
a reason (dropped: queue full, bad input, handler error, timed out in the queue, server
stopped). Tasks that were on their way to, or inside, a server that dies are not answered;
the client's accounting reports them lost.
"""
import logging
import threading

from libc.stdint cimport UINT32_MAX, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from malcolm._core cimport (
    Estimator, Mpmc, est_free, est_init, est_load, est_note_arrival, est_observe, est_rate,
    mc_aligned_alloc, mc_cpu_relax, mc_load_acq, mc_now_ns, mc_store_rel,
    mpmc_bytes, mpmc_init, mpmc_pop, mpmc_push, mpmc_size,
)
from malcolm._hist cimport N_BUCKETS, Hist, hist_add, hist_lower, hist_upper
from malcolm.net._wire cimport *
from malcolm.net.transport cimport BATCH, MsgBuf, Transport, addr_eq, addr_parse, addr_py
from malcolm.policy.base cimport MAX_SERVERS, Heartbeat, Policy
from malcolm.policy.driver cimport (
    WindowState, drv_end_window, drv_observe_peer, drv_start,
)
from malcolm.policy.defaults import EST_ALPHA, EST_PRIOR_SERVICE_US
from malcolm.workers.handlers cimport MALCOLM_BAD_INPUT, Handler, malcolm_task

log = logging.getLogger("malcolm.server")


cdef extern from "net/_netc.h" nogil:
    ctypedef struct mc_doorbell:
        uint32_t seq
        uint32_t sleepers
    void mc_bell_ring(mc_doorbell* d)
    void mc_bell_ring_n(mc_doorbell* d, int n)
    uint32_t mc_bell_prepare(mc_doorbell* d)
    void mc_bell_wait(mc_doorbell* d, uint32_t ticket, int64_t timeout_ns)
    void mc_bell_cancel(mc_doorbell* d)
    uint64_t mc_add64_relaxed(uint64_t* p, uint64_t v)


cdef extern from "<sys/prctl.h>" nogil:
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4,
              unsigned long arg5)
    enum:
        PR_SET_TIMERSLACK
        PR_SET_NAME


cdef enum:
    HB_RING = 64
    MAX_CLIENT_NETS = 16
    IDLE_WAIT_NS = 5_000_000     # longest block in adaptive mode: bounds the reaction to stop
    INLINE_BUDGET_NS = 5_000     # workers=0: the longest run of tasks between two polls
    CLIENT_SLOTS = 4096          # clients whose replay windows are kept (direct-mapped)
    SUSPECT_WINDOWS = 5          # windows without a message before a peer gets no more tasks


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


# Replay state of one client, by client id (authenticated, in the task). A direct-mapped
# table bounds the memory: a client whose slot another took starts afresh, so a replay of
# its messages is caught unless its slot was taken in between.
ctypedef struct ClientReplay:
    uint32_t client_id
    uint32_t _pad
    WireReplay w


ctypedef struct ClientNet:
    uint16_t family
    uint16_t prefix
    uint8_t addr[16]


# Counters: written by one thread each (the gateway unless noted), read racily by stats().
ctypedef struct Counters:
    uint64_t rx_msgs
    uint64_t tasks_in            # tasks received from clients
    uint64_t accepted            # client tasks this server kept
    uint64_t migrated_out
    uint64_t forwarded_in
    uint64_t stolen_in
    uint64_t stolen_out
    uint64_t steal_req_sent
    uint64_t steal_req_recv
    uint64_t steal_empty_sent
    uint64_t steal_empty_recv
    uint64_t steal_timeouts
    uint64_t steal_suppressed    # decide_steal said steal while one was in flight
    uint64_t kept_for_silent     # decide_arrival named a peer not heard from: kept here
    uint64_t steals_to_silent    # decide_steal named a peer not heard from: not sent
    uint64_t hb_sent             # heartbeat messages (one per peer)
    uint64_t hb_recv
    uint64_t hb_theta_recv       # critic parameters received in heartbeats (sum of n_theta)
    uint64_t hb_dropped          # the policy thread's inbox was full
    uint64_t hb_observed         # policy thread
    uint64_t hb_skipped          # policy thread: previous heartbeat not sent yet
    uint64_t windows             # policy thread
    uint64_t responses
    uint64_t completed           # workers: handler returned 0
    uint64_t handler_errors      # workers
    uint64_t timed_out           # workers
    uint64_t dropped_full
    uint64_t overloaded          # refused at arrival: expected wait over max_wait_ns
    uint64_t bad_input
    uint64_t stopped             # answered "server stopped"
    uint64_t malformed
    uint64_t unexpected
    uint64_t gateway_busy_ns     # gateway: time in loop passes that moved a message or task
    uint64_t peer_joins          # a peer heard from (authenticated) while presumed absent
    uint64_t peer_leaves         # a peer silent for peer_timeout_ms: presumed down
    uint64_t peer_restarts       # a peer came back with a new epoch (it restarted)
    uint64_t hb_stale            # heartbeats older than one already applied (reordered)
    uint64_t by_reason[E_NCODES]


cdef inline bint _prefix_match(const uint8_t* a, const uint8_t* net, int bits) noexcept nogil:
    cdef int i, full = bits // 8, rem = bits % 8
    for i in range(full):
        if a[i] != net[i]:
            return False
    if rem:
        return (a[full] >> (8 - rem)) == (net[full] >> (8 - rem))
    return True


cdef class Server:
    """A malcolm server on an open transport. Usually built from a rack file by
    :func:`malcolm.config.build_server`.

    Parameters
    ----------
    transport : Transport
        Bound to this server's address; the server owns it from now on.
    peers : list
        Addresses of all servers of the rack, by index (``peers[me]`` is this one).
    me : int
        This server's index.
    policy : malcolm.policy.base.Policy
        The server-side policy (``registry.make_policy(name, n, me, seed, **params)``).
    handler : Handler, str or callable
    workers : int
        Worker threads. 0 runs each task in the gateway itself, between polls (run to
        completion, as eRPC runs short handlers in its dispatch thread): for a server with
        one core, where a separate worker would only be time-sliced against the gateway.
    capacity : int
        Task slots: the most tasks this server holds (waiting + running).
    n_types : int
        Task types are 0..n_types-1; others are answered ``bad input``.
    window_us : float
        The policy window (heartbeat period).
    poll : {"adaptive", "busy"}
        How the gateway and the workers wait for work: ``busy`` spins without pause (one
        core each); ``adaptive`` spins ``spin_us`` then blocks. The policy thread always
        sleeps between heartbeats and window ends.
    task_timeout_ms : float
        A task that waited longer in the queue is answered ``timed out`` (0: never).
    steal_timeout_us : float
        A steal request not answered within this is given up (one is in flight at a time).
    max_service_ms : float
        Requested service times above this are ``bad input``.
    clients : list of str or None
        CIDR networks clients may send from (udp); ``None`` accepts any.
    cpus : list of int or None
        Pin threads: the gateway to ``cpus[0]``, the workers round-robin over the others
        (or over ``cpus[0]`` if there is only one); the policy thread, which mostly sleeps,
        shares ``cpus[1]`` (or ``cpus[0]``).
        Busy polling wants one core per gateway and worker thread.
    """
    # configuration
    cdef readonly int n, me, n_workers, n_types
    cdef readonly object handler_obj
    cdef readonly object policy_obj
    cdef readonly bint busy
    cdef Transport tr
    cdef Policy policy
    cdef Handler handler
    cdef NetAddr peers[MAX_SERVERS]
    cdef ClientNet nets[MAX_CLIENT_NETS]
    cdef int n_nets
    cdef uint32_t capacity
    cdef int64_t window_ns, spin_ns, timeout_ns, steal_timeout_ns, max_service_ns
    cdef int64_t peer_timeout_ns
    cdef int64_t suspect_ns         # silent this long: no migrations to it, no steals from it
    cdef uint64_t mig_to[MAX_SERVERS]       # tasks migrated to each peer
    cdef int64_t mig_last_ns[MAX_SERVERS]   # when the last one went (0: never)
    cdef int64_t max_wait_ns        # admission control: 0 off
    cdef double adm_rate            # service rate (tasks/ns) for admission, once per batch
    cdef int64_t peer_seen[MAX_SERVERS]    # last message from each peer (gateway clock)
    cdef bint peer_up[MAX_SERVERS]         # heard from within peer_timeout_ns
    cdef int64_t next_member_check
    # authentication (docs/runtime.md, "Wire format"): the rack key, this run's epoch, a
    # sequence number per destination server (so each receiver sees a dense sequence and a
    # 64-wide replay window suffices), one for everything sent to clients, and per peer what
    # its replay window and heartbeat order need
    cdef mc_sipkey key
    cdef readonly bint authenticated
    cdef readonly uint64_t epoch
    cdef uint64_t tx_seq[MAX_SERVERS]
    cdef uint64_t tx_seq_client
    cdef WireReplay rx_replay[MAX_SERVERS]
    cdef uint64_t hb_top[MAX_SERVERS]      # trailer seq of the last heartbeat applied
    cdef uint32_t hb_local_seq[MAX_SERVERS]
    cdef ClientReplay* cli_replay
    # state
    cdef TaskSlot* slots
    cdef Mpmc* runq
    cdef uint32_t* free_slots      # gateway only: a LIFO stack, so the hottest slot is reused
    cdef uint32_t n_free
    cdef Mpmc* doneq
    cdef Estimator est
    cdef bint est_ok
    cdef Hist* svc_hist             # one per worker (inline: one): measured handler times
    cdef int64_t in_server          # tasks held: waiting + running (gateway writes)
    cdef uint64_t stop_gateway, stop_workers, stop_policy
    cdef bint draining
    cdef int64_t drain_deadline
    cdef mc_doorbell work_bell
    cdef mc_doorbell hb_bell
    cdef Heartbeat* hb_in           # ring: gateway -> policy thread
    cdef uint64_t hb_head, hb_tail
    cdef Heartbeat* hb_out          # policy thread -> gateway, one at a time
    cdef uint64_t hb_out_pending
    cdef WindowState win            # policy thread: the window protocol (policy/driver.pxd)
    cdef uint32_t steal_seq
    cdef bint steal_pending
    cdef int64_t steal_deadline
    cdef Counters c
    cdef NetAddr last_bad_addr
    cdef int last_bad_code
    cdef int64_t started_ns
    cdef object threads
    cdef object cpus
    cdef readonly bint running
    cdef double grace_s

    def __init__(self, Transport transport not None, peers, int me, Policy policy not None,
                 handler="spin", int workers=2, int capacity=4096, int n_types=8,
                 double window_us=100.0, str poll="adaptive", double spin_us=50.0,
                 double task_timeout_ms=0.0, double steal_timeout_us=2000.0,
                 double max_service_ms=10_000.0, clients=None,
                 double est_alpha=EST_ALPHA, double prior_service_us=EST_PRIOR_SERVICE_US,
                 double grace_s=2.0,
                 double peer_timeout_ms=-1.0, cpus=None, key=None, double max_wait_ms=0.0):
        cdef int i
        cdef uint32_t cap2
        self.n = len(peers)
        if not 1 <= self.n <= MAX_SERVERS:
            raise ValueError(f"a rack has 1..{MAX_SERVERS} servers, got {self.n}")
        if not 0 <= me < self.n:
            raise ValueError(f"server index {me} out of range 0..{self.n - 1}")
        if policy.n != self.n or policy.me != me:
            raise ValueError(f"policy was built for n={policy.n}, me={policy.me}; "
                             f"this server is {me} of {self.n}")
        if workers < 0 or workers > 1024:
            raise ValueError(f"workers={workers} must be in 0..1024")
        if not 1 <= n_types <= 65535:
            raise ValueError(f"n_types={n_types} must be in 1..65535")
        if capacity < 1 or capacity > (1 << 22):
            raise ValueError(f"capacity={capacity} must be in 1..{1 << 22}")
        if window_us <= 0:
            raise ValueError(f"window_us={window_us} must be positive")
        if poll not in ("busy", "adaptive"):
            raise ValueError(f"poll={poll!r} must be 'busy' or 'adaptive'")
        self.tr = transport
        self.me = me
        self.policy = policy
        self.policy_obj = policy
        self.handler = handler if isinstance(handler, Handler) else Handler(handler)
        self.handler_obj = self.handler
        self.n_workers = workers
        self.n_types = n_types
        self.capacity = capacity
        self.window_ns = <int64_t>(window_us * 1000)
        self.busy = poll == "busy"
        self.spin_ns = <int64_t>(spin_us * 1000)
        self.timeout_ns = <int64_t>(task_timeout_ms * 1e6)
        self.steal_timeout_ns = <int64_t>(steal_timeout_us * 1000)
        self.max_service_ns = <int64_t>(max_service_ms * 1e6)
        # Admission control bounds the queued *work*, not slots: a task that would wait
        # longer than this (tasks waiting / service rate) is refused at once, with a reason,
        # rather than queued to time out at its client.
        if not max_wait_ms >= 0:
            raise ValueError(f"max_wait_ms={max_wait_ms} must be >= 0")
        self.max_wait_ns = <int64_t>(max_wait_ms * 1e6)
        self.grace_s = grace_s
        # A peer silent this long is presumed down: tasks are not migrated to it, nor steals
        # asked of it, until it is heard from again. Default: 20 windows, at least 100 ms.
        if peer_timeout_ms < 0:
            peer_timeout_ms = max(100.0, 20 * window_us / 1000.0)
        self.peer_timeout_ns = <int64_t>(peer_timeout_ms * 1e6)
        # Tasks and steal requests stop going to a peer after SUSPECT_WINDOWS windows
        # without a message from it (it sends a heartbeat every window), so the policy's
        # effective choices re-form within a few windows of a failure (issue 13: within 10);
        # leaving the membership (a counted event) still takes peer_timeout_ms, which keeps
        # a peer that is only slow for a moment from flapping in and out of the rack.
        self.suspect_ns = min(self.peer_timeout_ns, SUSPECT_WINDOWS * self.window_ns)
        for i, p in enumerate(peers):
            addr_parse(transport.kind, p, &self.peers[i])
        self._set_clients(clients)
        # task slots and the three queues
        cap2 = 1
        while cap2 < <uint32_t>capacity:
            cap2 <<= 1
        self.slots = <TaskSlot*>mc_aligned_alloc(64, sizeof(TaskSlot) * capacity)
        self.runq = <Mpmc*>mc_aligned_alloc(64, mpmc_bytes(cap2))
        self.free_slots = <uint32_t*>mc_aligned_alloc(64, sizeof(uint32_t) * capacity)
        self.doneq = <Mpmc*>mc_aligned_alloc(64, mpmc_bytes(cap2))
        self.hb_in = <Heartbeat*>mc_aligned_alloc(64, sizeof(Heartbeat) * HB_RING)
        self.hb_out = <Heartbeat*>mc_aligned_alloc(64, sizeof(Heartbeat))
        self.cli_replay = <ClientReplay*>mc_aligned_alloc(64, sizeof(ClientReplay) * CLIENT_SLOTS)
        if (self.slots == NULL or self.runq == NULL or self.free_slots == NULL
                or self.doneq == NULL or self.hb_in == NULL or self.hb_out == NULL
                or self.cli_replay == NULL):
            raise MemoryError("cannot allocate the server's queues")
        if (mpmc_init(self.runq, cap2) != 0
                or mpmc_init(self.doneq, cap2) != 0):
            raise MemoryError("cannot initialise the server's queues")
        for i in range(capacity):
            self.free_slots[i] = capacity - 1 - i
        self.n_free = capacity
        if est_init(&self.est, max(workers, 1), n_types, est_alpha, prior_service_us * 1000) != 0:
            raise ValueError("bad estimator parameters")
        self.est_ok = True
        self.svc_hist = <Hist*>mc_aligned_alloc(64, sizeof(Hist) * max(workers, 1))
        if self.svc_hist == NULL:
            raise MemoryError("cannot allocate the service-time histograms")
        memset(self.svc_hist, 0, sizeof(Hist) * max(workers, 1))
        memset(&self.c, 0, sizeof(Counters))
        memset(&self.work_bell, 0, sizeof(mc_doorbell))
        memset(&self.hb_bell, 0, sizeof(mc_doorbell))
        self.threads = []
        self.running = False
        self.cpus = self._check_cpus(cpus)
        self._set_key(key)

    @staticmethod
    def _check_cpus(cpus):
        import os
        if not cpus:
            return None
        have = os.sched_getaffinity(0)
        bad = [c for c in cpus if c not in have]
        if bad:
            raise ValueError(f"cpus {bad} are not available to this process "
                             f"(allowed: {sorted(have)})")
        return list(cpus)

    def _pin(self, str role, int w=0):
        import os
        if not self.cpus:
            return
        c = self.cpus
        if role == "gateway":
            cpu = c[0]
        elif role == "policy":
            cpu = c[1] if len(c) > 1 else c[0]
        else:
            rest = c[1:] if len(c) > 1 else c
            cpu = rest[w % len(rest)]
        os.sched_setaffinity(0, {cpu})      # 0: the calling thread on Linux

    def _set_key(self, key):
        # No key: the all-zero one, which catches corruption but authenticates nothing.
        cdef bytes k = bytes(16) if key is None else bytes(key)
        if len(k) != 16:
            raise ValueError(f"the rack MAC key is 16 bytes (malcolm.config.read_key), "
                             f"got {len(k)}")
        mc_sipkey_set(&self.key, <const uint8_t*>(<const char*>k))
        self.authenticated = key is not None
        memset(self.rx_replay, 0, sizeof(self.rx_replay))
        memset(self.tx_seq, 0, sizeof(self.tx_seq))
        memset(self.hb_top, 0, sizeof(self.hb_top))
        memset(self.hb_local_seq, 0, sizeof(self.hb_local_seq))
        memset(self.peer_up, 0, sizeof(self.peer_up))
        memset(self.cli_replay, 0, sizeof(ClientReplay) * CLIENT_SLOTS)

    def __dealloc__(self):
        free(self.slots)
        free(self.runq)
        free(self.free_slots)
        free(self.doneq)
        free(self.hb_in)
        free(self.hb_out)
        free(self.cli_replay)
        free(self.svc_hist)
        if self.est_ok:
            est_free(&self.est)

    def _set_clients(self, clients):
        import ipaddress
        import socket
        self.n_nets = -1            # -1: any client
        if clients is None:
            return
        if self.tr.kind == "shm":
            raise ValueError("a client allow-list (clients) applies to network transports; "
                             "shm endpoints are all on this host")
        if len(clients) > MAX_CLIENT_NETS:
            raise ValueError(f"at most {MAX_CLIENT_NETS} client networks")
        self.n_nets = 0
        for s in clients:
            net = ipaddress.ip_network(s, strict=False)
            raw = net.network_address.packed
            self.nets[self.n_nets].family = socket.AF_INET if net.version == 4 else socket.AF_INET6
            self.nets[self.n_nets].prefix = net.prefixlen
            memcpy(self.nets[self.n_nets].addr, <const char*>raw, len(raw))
            self.n_nets += 1

    # ------------------------------------------------------------ lifecycle
    def start(self):
        """Start the gateway, worker and policy threads."""
        if self.running:
            raise RuntimeError("server already started")
        self.started_ns = mc_now_ns()
        self.epoch = wire_new_epoch()
        self.tx_seq_client = 0
        for i in range(self.n):
            # Peers get one timeout from our start to be heard from.
            self.peer_seen[i] = self.started_ns
        self.next_member_check = self.started_ns
        if not self.authenticated:
            log.warning("server %d: no rack key: messages are not authenticated (any host "
                        "that reaches this one can act as a member); set [rack] key_file "
                        "(malcolm rack keygen PATH)", self.me)
        self.stop_gateway = self.stop_workers = self.stop_policy = 0
        self.running = True
        self._warn_oversubscribed()
        ts = [threading.Thread(target=self._worker_main, args=(w,), daemon=True,
                               name=f"malcolm-worker-{w}") for w in range(self.n_workers)]
        ts.append(threading.Thread(target=self._policy_main, daemon=True,
                                   name="malcolm-policy"))
        ts.append(threading.Thread(target=self._gateway_main, daemon=True,
                                   name="malcolm-gateway"))
        self.threads = ts
        for t in ts:
            t.start()
        return self

    def _warn_oversubscribed(self):
        # A spinning thread without a core of its own is time-sliced by the kernel, which
        # turns microsecond hand-offs into millisecond ones: say so rather than be slow.
        import os
        if not self.busy:
            return
        cores = len(self.cpus) if self.cpus else len(os.sched_getaffinity(0))
        spinners = 1 + self.n_workers
        if spinners > cores:
            log.warning("server %d: poll=busy spins %d threads (gateway + %d workers) on %d "
                        "CPUs; they will be time-sliced and round trips will take "
                        "milliseconds. Use poll='adaptive' or give each spinner a core.",
                        self.me, spinners, self.n_workers, cores)

    def stop(self, grace_s=None):
        """Stop cleanly and return the final statistics.

        Waiting tasks are answered ``server stopped``; running ones get up to ``grace_s``
        seconds to finish. The report's ``unfinished`` counts tasks still running after that
        (their responses are never sent) and ``unanswered`` those held when the gateway exited.
        """
        if not self.running:
            report = self.stats()
            report.update(unanswered=int(self.in_server), unfinished=int(self.in_server),
                          stuck_threads=[])
            return report
        grace = self.grace_s if grace_s is None else grace_s
        self.drain_deadline = mc_now_ns() + <int64_t>(grace * 1e9)
        mc_store_rel(&self.stop_gateway, 1)
        self.tr.wake()
        nt = len(self.threads)
        gw, pol, workers = self.threads[nt - 1], self.threads[nt - 2], self.threads[:nt - 2]
        gw.join(grace + 5.0)
        unanswered = self.in_server
        mc_store_rel(&self.stop_workers, 1)
        mc_store_rel(&self.stop_policy, 1)
        mc_bell_ring(&self.work_bell)
        mc_bell_ring(&self.hb_bell)
        stuck = []
        for t in workers + [pol]:
            t.join(max(0.1, grace))
            if t.is_alive():
                stuck.append(t.name)
        self.running = False
        report = self.stats()
        report["unanswered"] = int(unanswered)
        report["unfinished"] = int(unanswered)
        report["stuck_threads"] = stuck
        if gw.is_alive():
            report["stuck_threads"].append(gw.name)
        else:
            self.tr.close()
        return report

    # ------------------------------------------------------------ statistics
    def stats(self):
        """A snapshot of the counters, load and queue length (a dict)."""
        cdef dict d = self.c
        cdef int k
        by_reason = d.pop("by_reason")
        d["malformed_by_reason"] = {
            wire_error_name(-k).decode(): by_reason[k] for k in range(1, E_NCODES)
            if by_reason[k]}
        d["id"] = self.me
        d["authenticated"] = bool(self.authenticated)
        d["epoch"] = int(self.epoch)
        d["peers_up"] = [j for j in range(self.n) if j != self.me and self.peer_up[j]]
        d["queue_len"] = int(self.in_server)
        d["waiting"] = int(mpmc_size(self.runq))
        d["rate_per_us"] = est_rate(&self.est) * 1000.0
        d["load_us"] = est_load(&self.est, <double>self.in_server) / 1000.0
        d["send_failed"] = self.tr.n_send_failed
        # per peer: migrations to it and the last one's time (CLOCK_MONOTONIC ns, as
        # time.monotonic_ns()): how fast the survivors stop sending to a failed server
        d["migrated_to"] = [int(self.mig_to[j]) for j in range(self.n)]
        d["last_migrated_to_ns"] = [int(self.mig_last_ns[j]) for j in range(self.n)]
        d["suspect_ms"] = self.suspect_ns / 1e6
        d["mono_ns"] = mc_now_ns()                  # when this snapshot was taken
        d["started_ns"] = self.started_ns
        if hasattr(self.policy_obj, "probs_migrate"):
            d["probs_migrate"] = [float(x) for x in self.policy_obj.probs_migrate]
        emu = getattr(<object>self.tr, "stats", None)      # malcolm.net.delay, if emulated
        if emu is not None:
            d["net_emulation"] = emu()
        d["uptime_s"] = (mc_now_ns() - self.started_ns) / 1e9 if self.started_ns else 0.0
        d["last_bad"] = (wire_error_name(self.last_bad_code).decode(),
                         addr_py(&self.last_bad_addr)) if self.last_bad_code else None
        d["service"] = self.service_times()
        if hasattr(self.policy_obj, "stats"):
            try:
                d["policy"] = self.policy_obj.stats()
            except Exception as e:  # a policy's optional hook must not break monitoring
                d["policy"] = {"error": str(e)}
        return d

    def service_times(self, buckets=True):
        """The measured handler times of all workers, merged (read racily while running).

        Returns
        -------
        dict
            ``count``, ``mean_us``, ``p50_us``, ``p99_us``, ``min_us``, ``max_us``, and with
            ``buckets`` the non-empty histogram buckets ``[lower_ns, upper_ns, count]``
            (log-linear, each at most 1/16 of its values wide: eight of ``malcolm/_hist.pxd``'s
            buckets merged).
            Percentiles are bucket midpoints clamped to the exact min and max, as the load
            generator reports them (``malcolm.loadgen.hist``).
        """
        cdef int w, i
        cdef Hist* h
        cdef uint64_t n = 0, c
        cdef double total = 0.0
        cdef int64_t lo = 0, hi = 0
        counts = {}
        for w in range(max(self.n_workers, 1)):
            h = &self.svc_hist[w]
            if h.n == 0:
                continue
            if n == 0 or h.min < lo:
                lo = h.min
            if n == 0 or h.max > hi:
                hi = h.max
            total += h.sum
            for i in range(N_BUCKETS):
                c = h.counts[i]
                if c:
                    counts[i] = counts.get(i, 0) + c
                    n += c      # from the buckets: a racy read may see a count before its n
        nan = float("nan")
        out = {"count": int(n), "mean_us": total / n / 1e3 if n else nan,
               "p50_us": self._svc_pct(counts, n, 50.0, lo, hi),
               "p99_us": self._svc_pct(counts, n, 99.0, lo, hi),
               "min_us": lo / 1e3 if n else nan, "max_us": hi / 1e3 if n else nan}
        if buckets:
            # Eight buckets to one (each 1/16 of its values wide, about 200 for a workload
            # spanning 1 µs..10 ms): `--stats-json` writes these several times a second and
            # the fine ones cost a 2-core machine 0.1 core of JSON; percentiles above use
            # the fine ones.
            coarse = {}
            for i, c in counts.items():
                coarse[i >> 3] = coarse.get(i >> 3, 0) + c
            out["buckets"] = [[int(hist_lower(g << 3)), int(hist_upper((g << 3) + 7)),
                               int(coarse[g])] for g in sorted(coarse)]
        return out

    @staticmethod
    def _svc_pct(dict counts, uint64_t n, double q, int64_t lo, int64_t hi):
        import math
        cdef uint64_t rank, cum = 0
        cdef int i
        cdef double mid
        if n == 0:
            return float("nan")
        rank = max(1, <uint64_t>math.ceil(q / 100.0 * n))
        for i in sorted(counts):
            cum += counts[i]
            if cum >= rank:
                mid = (0.5 * (hist_lower(i) + hist_upper(i) - 1) if i >= 256
                       else <double>hist_lower(i))
                return min(max(mid, <double>lo), <double>hi) / 1e3
        return hi / 1e3

    # ------------------------------------------------------------ threads (Python side)
    @staticmethod
    def _name_thread(str name):
        # Visible in top -H and /proc/*/task/*/comm (at most 15 characters).
        cdef bytes b = name.encode()[:15]
        prctl(PR_SET_NAME, <unsigned long><const char*>b, 0, 0, 0)

    def _worker_main(self, int w):
        self._name_thread(f"mc{self.me}-worker{w}")
        self._pin("worker", w)
        with nogil:
            prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
            self._worker_loop(w)

    def _policy_main(self):
        self._name_thread(f"mc{self.me}-policy")
        self._pin("policy")
        with nogil:
            prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
            self._policy_loop()

    def _gateway_main(self):
        self._name_thread(f"mc{self.me}-gateway")
        self._pin("gateway")
        try:
            with nogil:
                self._gateway_loop()
        except BaseException:
            log.exception("gateway of server %d failed", self.me)
            raise

    # ------------------------------------------------------------ workers
    cdef int64_t _run_task(self, int w, uint64_t idx, int64_t t0) noexcept nogil:
        """Run the task in slot ``idx`` as worker ``w``, starting at ``t0`` (a clock read the
        caller just made), and queue it for its response. Returns the clock at the end."""
        cdef TaskSlot* s = &self.slots[idx]
        cdef malcolm_task t
        cdef int64_t t1 = t0
        cdef int rc
        if s.deadline_ns > 0 and t0 > s.deadline_ns:
            s.status = ST_TIMED_OUT
            s.out_len = 0
            s.measured_ns = 0
            mc_add64_relaxed(&self.c.timed_out, 1)
        else:
            t.client_id = s.client_id
            t.task_type = s.task_type
            t.flags = s.flags
            t.request_id = s.request_id
            t.service_ns = s.service_ns
            t.payload = s.payload
            t.payload_len = s.payload_len
            t.worker = w
            t.out = s.out
            t.out_cap = MAX_PAYLOAD
            t.out_len = 0
            rc = self.handler.fn(self.handler.ctx, &t)
            t1 = mc_now_ns()
            s.measured_ns = t1 - t0
            est_observe(&self.est, w, s.task_type, <double>(t1 - t0))
            # Every handler run, by the worker that ran it (no sharing): what the service
            # times really were, so a report can state the load the rack really carried.
            hist_add(&self.svc_hist[w], t1 - t0)
            if rc == 0:
                s.status = ST_OK
                s.out_len = t.out_len if t.out_len <= MAX_PAYLOAD else MAX_PAYLOAD
                mc_add64_relaxed(&self.c.completed, 1)
            elif rc == MALCOLM_BAD_INPUT:
                s.status = ST_BAD_INPUT     # the handler found the request malformed
                s.out_len = 0               # (counted in bad_input by the gateway)
            else:
                s.status = ST_HANDLER_ERROR
                s.out_len = 0
                mc_add64_relaxed(&self.c.handler_errors, 1)
        mpmc_push(self.doneq, idx)      # never full: it holds at most `capacity`
        return t1

    cdef void _worker_loop(self, int w) noexcept nogil:
        cdef uint64_t idx
        cdef int64_t t0, idle_since = 0
        cdef uint32_t ticket
        while not mc_load_acq(&self.stop_workers):
            if mpmc_pop(self.runq, &idx):
                idle_since = 0
                self._run_task(w, idx, mc_now_ns())
                self.tr.wake()
                continue
            if self.busy:
                mc_cpu_relax()
                continue
            t0 = mc_now_ns()
            if idle_since == 0:
                idle_since = t0
            if t0 - idle_since < self.spin_ns:
                mc_cpu_relax()
                continue
            ticket = mc_bell_prepare(&self.work_bell)
            if mpmc_size(self.runq) or mc_load_acq(&self.stop_workers):
                mc_bell_cancel(&self.work_bell)
                continue
            mc_bell_wait(&self.work_bell, ticket, IDLE_WAIT_NS)

    # ------------------------------------------------------------ policy thread
    cdef void _observe_heartbeats(self) noexcept nogil:
        cdef uint64_t head = self.hb_head
        while head != mc_load_acq(&self.hb_tail):
            drv_observe_peer(&self.win, self.policy, mc_now_ns(), &self.hb_in[head % HB_RING])
            head += 1
            mc_store_rel(&self.hb_head, head)
            self.c.hb_observed += 1

    cdef void _policy_loop(self) noexcept nogil:
        # The window protocol is policy/driver.pxd's, the simulator's own code: the own load
        # is observed at each boundary before end_window, and the driver stamps the heartbeat.
        cdef int64_t now = mc_now_ns()
        cdef int64_t end = now + self.window_ns
        cdef uint32_t ticket
        cdef Heartbeat* hb
        drv_start(&self.win, self.policy, &self.est, now, <double>self.in_server)
        while not mc_load_acq(&self.stop_policy):
            self._observe_heartbeats()
            now = mc_now_ns()
            if now >= end:
                # The gateway has not sent the last heartbeat yet: no new one this window.
                hb = NULL if mc_load_acq(&self.hb_out_pending) else self.hb_out
                if drv_end_window(&self.win, self.policy, &self.est, now,
                                  <double>self.in_server, hb):
                    mc_store_rel(&self.hb_out_pending, 1)
                    self.tr.wake()
                else:
                    self.c.hb_skipped += 1
                self.c.windows += 1
                now = mc_now_ns()
                end += self.window_ns
                if end <= now:          # we fell behind (descheduled): skip, do not burst
                    end = now + self.window_ns
                continue
            # Never spins, in either poll mode: its work comes at window ends and when
            # heartbeats arrive (the gateway rings for those), so a busy-polling server
            # spins only its gateway and its workers.
            ticket = mc_bell_prepare(&self.hb_bell)
            if self.hb_head != mc_load_acq(&self.hb_tail) or mc_load_acq(&self.stop_policy):
                mc_bell_cancel(&self.hb_bell)
                continue
            mc_bell_wait(&self.hb_bell, ticket, end - now)
        # The gateway has stopped: hand the policy what it received last.
        self._observe_heartbeats()

    # ------------------------------------------------------------ gateway
    cdef inline void _bad(self, MsgBuf* m, int code) noexcept nogil:
        self.c.malformed += 1
        if -code < E_NCODES:
            self.c.by_reason[-code] += 1
        self.last_bad_code = code
        self.last_bad_addr = m.peer

    cdef bint _client_ok(self, const NetAddr* a) noexcept nogil:
        cdef int i
        if self.n_nets < 0:
            return True
        for i in range(self.n_nets):
            if a.family == self.nets[i].family and _prefix_match(a.addr, self.nets[i].addr,
                                                                 self.nets[i].prefix):
                return True
        return False

    cdef void _respond_now(self, const WireTask* t, const NetAddr* to, uint8_t status,
                           uint16_t flags) noexcept nogil:
        cdef WireResp r
        cdef MsgBuf* b
        r.client_id = t.client_id
        r.task_type = t.task_type
        r.request_id = t.request_id
        r.send_ns = t.send_ns
        r.service_ns = 0
        r.load = est_load(&self.est, <double>self.in_server)
        r.queue_len = <uint32_t>self.in_server
        r.server = self.me
        r.status = status
        r.flags = <uint8_t>flags
        r.payload_len = 0
        r.payload = NULL
        b = self.tr.tx_next(to)
        b.len = self._seal(b, wire_put_resp(b.data, b.cap, self.me, &r), -1)
        self.c.responses += 1
        if status == ST_DROPPED:
            self.c.dropped_full += 1
        elif status == ST_BAD_INPUT:
            self.c.bad_input += 1
        elif status == ST_STOPPED:
            self.c.stopped += 1
        elif status == ST_OVERLOADED:
            self.c.overloaded += 1

    cdef inline void _free_slot(self, uint64_t idx) noexcept nogil:
        self.free_slots[self.n_free] = <uint32_t>idx
        self.n_free += 1

    cdef bint _enqueue(self, const WireTask* t, const NetAddr* reply, uint16_t flags,
                       uint16_t origin, int64_t now) noexcept nogil:
        """Keep a task: copy it into a slot and queue it. False when no slot is free or the
        queued work is over ``max_wait_ns`` or the client's own deadline (a stolen task is always
        kept: it was asked for)."""
        cdef uint64_t idx
        cdef TaskSlot* s
        cdef double waiting
        # The task's deadline: the client's own (budget_us, relative, on the wire) or the
        # rack's task_timeout_ms, whichever comes first. Admission allows a wait of at most
        # max_wait_ms and half the client's budget: the other half is for the service, the
        # way back and the error of the rate estimate, so an admitted task is answered in time.
        cdef int64_t deadline = 0, allowed = self.max_wait_ns
        cdef int64_t budget = <int64_t>t.budget_us * 1000
        if budget > 0:
            deadline = now + budget
            if allowed == 0 or budget // 2 < allowed:
                allowed = budget // 2
        if self.timeout_ns > 0 and (deadline == 0 or now + self.timeout_ns < deadline):
            deadline = now + self.timeout_ns
        if allowed > 0 and not (flags & F_STOLEN):
            waiting = <double>mpmc_size(self.runq)
            if waiting > 0 and waiting > self.adm_rate * <double>allowed:
                self._respond_now(t, reply, ST_OVERLOADED, flags)
                return False
        # A slot is 2 kB; reusing the one freed last keeps it in cache (a FIFO free list
        # walked every slot of the pool, a cache miss per touched line).
        if self.n_free == 0:
            self._respond_now(t, reply, ST_DROPPED, flags)
            return False
        self.n_free -= 1
        idx = self.free_slots[self.n_free]
        s = &self.slots[idx]
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
        self.in_server += 1
        est_note_arrival(&self.est, t.task_type)
        mpmc_push(self.runq, idx)
        return True

    cdef void _send_move(self, int dst, TaskSlot* s, uint8_t kind, uint16_t flags,
                         uint32_t seq) noexcept nogil:
        cdef WireTask t
        cdef MsgBuf* b
        cdef int64_t left
        t.client_id = s.client_id
        t.task_type = s.task_type
        t.payload_len = s.payload_len
        t.request_id = s.request_id
        t.service_ns = s.service_ns
        t.send_ns = s.send_ns
        t.reply = s.reply
        t.origin = s.origin
        t.flags = flags
        t.seq = seq
        t.budget_us = 0
        if s.deadline_ns > 0:       # what is left of the deadline travels with the task
            left = (s.deadline_ns - mc_now_ns()) // 1000
            t.budget_us = <uint32_t>(1 if left < 1 else (left if left < UINT32_MAX
                                                         else UINT32_MAX))
        t.payload = s.payload
        b = self.tr.tx_next(&self.peers[dst])
        b.len = self._seal(b, wire_put_move(b.data, b.cap, self.me, kind, &t), dst)

    cdef inline uint32_t _seal(self, MsgBuf* b, uint32_t n, int dst) noexcept nogil:
        """Append the trailer to a body of ``n`` bytes going to server ``dst`` (-1: a
        client), with the next sequence number of that destination."""
        cdef uint64_t seq
        if dst >= 0:
            self.tx_seq[dst] += 1
            seq = self.tx_seq[dst]
        else:
            self.tx_seq_client += 1
            seq = self.tx_seq_client
        return wire_seal(b.data, n, &self.key, self.epoch, seq)

    cdef bint _valid_task(self, WireTask* t) noexcept nogil:
        return t.task_type < self.n_types and t.service_ns <= self.max_service_ns

    cdef int _on_msg(self, MsgBuf* m, int64_t now) noexcept nogil:
        """Handle one message; return 1 if it carried a task (work that keeps us spinning)."""
        cdef WireHdr h
        cdef WireTask t
        cdef MsgBuf* b
        cdef int kind, rc, dst
        cdef uint64_t idx
        cdef uint32_t seq, blen
        cdef uint64_t ep, aseq
        cdef int64_t sent
        self.c.rx_msgs += 1
        kind = wire_header(m.data, m.len, &h)
        if kind < 0:
            self._bad(m, kind)
            return 0
        rc = wire_open(m.data, m.len, &self.key, &ep, &aseq)
        if rc < 0:
            self._bad(m, rc)
            return 0
        blen = <uint32_t>rc        # the body: the decoders never see the trailer
        if kind == K_TASK:
            if h.src != CLIENT_SRC:
                self._bad(m, E_SRC)
                return 0
            if not self._client_ok(&m.peer):
                self._bad(m, E_ADDR)
                return 0
            rc = wire_get_task(m.data, blen, &t)
            if blen >= TASK_LEN and not self._client_fresh(m, t.client_id, ep, aseq):
                return 0            # a replayed task must not run (or be answered) twice
            if rc == E_FIELD or (rc == E_PAYLOAD and blen >= TASK_LEN):
                self._bad(m, rc)
                self._respond_now(&t, &m.peer, ST_BAD_INPUT, 0)
                return 0
            if rc < 0:
                self._bad(m, rc)
                return 0
            self.c.tasks_in += 1
            if not self._valid_task(&t):
                self._respond_now(&t, &m.peer, ST_BAD_INPUT, 0)
                return 0
            if self.draining:
                self._respond_now(&t, &m.peer, ST_STOPPED, 0)
                return 0
            dst = self.policy.decide_arrival(now, t.task_type)
            if 0 <= dst < self.n and dst != self.me and now - self.peer_seen[dst] > \
                    self.suspect_ns:
                self.c.kept_for_silent += 1
                dst = self.me
            if 0 <= dst < self.n and dst != self.me:
                t.reply = m.peer
                t.origin = self.me
                t.flags = F_MIGRATED
                t.seq = 0
                b = self.tr.tx_next(&self.peers[dst])
                b.len = self._seal(b, wire_put_move(b.data, b.cap, self.me, K_FORWARD, &t), dst)
                self.c.migrated_out += 1
                self.mig_to[dst] += 1
                self.mig_last_ns[dst] = now
                self.policy.migrations += 1
                return 1
            if self._enqueue(&t, &m.peer, 0, self.me, now):
                self.c.accepted += 1
            return 1
        # Everything else must come from a server of this rack, from its own address.
        if h.src >= self.n or h.src == self.me:
            self._bad(m, E_SRC)
            return 0
        if not addr_eq(&m.peer, &self.peers[h.src]):
            self._bad(m, E_ADDR)
            return 0
        if not self._member_msg(m, h.src, ep, aseq, now):
            return 0
        if kind == K_FORWARD:
            rc = wire_get_move(m.data, blen, &t)
            if rc < 0:
                self._bad(m, rc)
                return 0
            if not self._valid_task(&t):
                self._respond_now(&t, &t.reply, ST_BAD_INPUT, t.flags)
                return 0
            if self.draining:
                self._respond_now(&t, &t.reply, ST_STOPPED, t.flags)
                return 0
            if self._enqueue(&t, &t.reply, t.flags | F_MIGRATED, t.origin, now):
                self.c.forwarded_in += 1
            return 1
        elif kind == K_STEAL_REQ:
            rc = wire_get_steal_req(m.data, blen, &seq, &sent)
            if rc < 0:
                self._bad(m, rc)
                return 0
            self.c.steal_req_recv += 1
            if not self.draining and mpmc_pop(self.runq, &idx):
                # The oldest waiting task: the central queue is FIFO.
                self._send_move(h.src, &self.slots[idx], K_STEAL_REPLY,
                                self.slots[idx].flags | F_STOLEN, seq)
                self.in_server -= 1
                self._free_slot(idx)
                self.c.stolen_out += 1
            else:
                b = self.tr.tx_next(&self.peers[h.src])
                b.len = self._seal(b, wire_put_steal_empty(b.data, b.cap, self.me, seq), h.src)
                self.c.steal_empty_sent += 1
        elif kind == K_STEAL_REPLY:
            rc = wire_get_steal_reply(m.data, blen, &t)
            if rc < 0:
                self._bad(m, rc)
                return 0
            if self.steal_pending and t.seq == self.steal_seq:
                self.steal_pending = False
            if rc == 0:
                self.c.steal_empty_recv += 1
                return 0
            # A task always counts, even if its reply came after we gave up waiting.
            if self.draining:
                self._respond_now(&t, &t.reply, ST_STOPPED, t.flags | F_STOLEN)
                return 0
            if self._enqueue(&t, &t.reply, t.flags | F_STOLEN, t.origin, now):
                self.c.stolen_in += 1
                self.policy.steals += 1
            return 1
        elif kind == K_HEARTBEAT:
            if self.hb_tail - mc_load_acq(&self.hb_head) >= HB_RING:
                self.c.hb_dropped += 1
                return 0
            if aseq <= self.hb_top[h.src]:
                # Reordered behind a newer one: the policy must not apply an old load.
                self.c.hb_stale += 1
                return 0
            rc = wire_get_heartbeat(m.data, blen, &self.hb_in[self.hb_tail % HB_RING])
            if rc < 0:
                self._bad(m, rc)
                return 0
            self.hb_top[h.src] = aseq
            # The policies drop a heartbeat whose seq is not newer than the last; the order
            # is ours to keep (above, across the sender's restarts too), so they get a count
            # of this peer's heartbeats, which a forged or restarted seq cannot freeze.
            self.hb_local_seq[h.src] += 1
            self.hb_in[self.hb_tail % HB_RING].seq = self.hb_local_seq[h.src]
            self.c.hb_theta_recv += self.hb_in[self.hb_tail % HB_RING].n_theta
            mc_store_rel(&self.hb_tail, self.hb_tail + 1)
            self.c.hb_recv += 1
        else:
            self.c.unexpected += 1
            self._bad(m, E_UNEXPECTED)
        return 0

    cdef bint _member_msg(self, MsgBuf* m, int src, uint64_t ep, uint64_t aseq,
                          int64_t now) noexcept nogil:
        """Replay check of an authenticated message from server ``src``, and membership:
        False (counted by reason) if it must be dropped."""
        cdef bint known = self.rx_replay[src].epoch != 0
        cdef int rc = wire_replay_check(&self.rx_replay[src], ep, aseq)
        if rc == E_EPOCH and not self.peer_up[src]:
            # An older epoch from a peer presumed down: it restarted with its clock set
            # back. (While it is up, an older epoch can only be a replay.)
            self.rx_replay[src].epoch = 0
            rc = wire_replay_check(&self.rx_replay[src], ep, aseq)
        if rc < 0:
            self._bad(m, rc)
            return False
        if rc == 1:
            # A new epoch: the peer (re)started. Its heartbeats are applied from the first.
            self.hb_top[src] = 0
            if known or self.peer_up[src]:
                self.c.peer_restarts += 1
        if not self.peer_up[src]:
            self.peer_up[src] = True
            self.c.peer_joins += 1
        self.peer_seen[src] = now
        return True

    cdef bint _client_fresh(self, MsgBuf* m, uint32_t client_id, uint64_t ep,
                            uint64_t aseq) noexcept nogil:
        """The replay check of a client's task (its epoch and sequence number): False, and
        counted, for a replay."""
        cdef ClientReplay* c = &self.cli_replay[(client_id * <uint32_t>2654435761) >> 20]
        cdef int rc
        if c.client_id != client_id or c.w.epoch == 0:
            c.client_id = client_id
            memset(&c.w, 0, sizeof(WireReplay))
        rc = wire_replay_check(&c.w, ep, aseq)
        if rc < 0:
            self._bad(m, rc)
            return False
        return True

    cdef void _check_members(self, int64_t now) noexcept nogil:
        """Every millisecond: a peer silent for peer_timeout_ns leaves (an event)."""
        cdef int j
        if now < self.next_member_check:
            return
        self.next_member_check = now + 1_000_000
        for j in range(self.n):
            if self.peer_up[j] and now - self.peer_seen[j] > self.peer_timeout_ns:
                self.peer_up[j] = False
                self.c.peer_leaves += 1

    cdef int _completions(self, int64_t now) noexcept nogil:
        cdef uint64_t idx
        cdef TaskSlot* s
        cdef WireResp r
        cdef MsgBuf* b
        cdef int k = 0, v
        cdef double rate = 0.0
        while k < BATCH and mpmc_pop(self.doneq, &idx):
            if k == 0:
                # Once per batch: the rate sums a division per worker and task type, and
                # its EWMAs move by a small fraction per completion anyway.
                rate = est_rate(&self.est)
            s = &self.slots[idx]
            self.in_server -= 1
            r.client_id = s.client_id
            r.task_type = s.task_type
            r.request_id = s.request_id
            r.send_ns = s.send_ns
            r.service_ns = s.measured_ns
            r.load = <double>self.in_server / rate
            r.queue_len = <uint32_t>self.in_server
            r.server = self.me
            r.status = s.status
            r.flags = <uint8_t>s.flags
            r.payload_len = s.out_len
            r.payload = s.out
            b = self.tr.tx_next(&s.reply)
            b.len = self._seal(b, wire_put_resp(b.data, b.cap, self.me, &r), -1)
            self._free_slot(idx)
            self.c.responses += 1
            if r.status == ST_BAD_INPUT:
                self.c.bad_input += 1
            k += 1
            if self.draining:
                continue
            v = self.policy.decide_steal(now)
            if 0 <= v < self.n and v != self.me:
                if now - self.peer_seen[v] > self.suspect_ns:
                    self.c.steals_to_silent += 1
                    continue
                if self.steal_pending and now < self.steal_deadline:
                    self.c.steal_suppressed += 1
                    continue
                if self.steal_pending:
                    self.c.steal_timeouts += 1
                self.steal_seq += 1
                self.steal_pending = True
                self.steal_deadline = now + self.steal_timeout_ns
                b = self.tr.tx_next(&self.peers[v])
                b.len = self._seal(b, wire_put_steal_req(b.data, b.cap, self.me, self.steal_seq,
                                                         now), v)
                self.c.steal_req_sent += 1
        return k

    cdef void _heartbeat_out(self) noexcept nogil:
        cdef int j
        cdef MsgBuf* b
        cdef uint32_t n
        if not mc_load_acq(&self.hb_out_pending):
            return
        for j in range(self.n):
            if j == self.me:
                continue
            b = self.tr.tx_next(&self.peers[j])
            n = self._seal(b, wire_put_heartbeat(b.data, b.cap, self.me, self.hb_out), j)
            b.len = n
            if n:
                self.c.hb_sent += 1
        mc_store_rel(&self.hb_out_pending, 0)

    cdef void _drain_waiting(self) noexcept nogil:
        """While stopping: answer every waiting task ``server stopped``."""
        cdef uint64_t idx
        cdef TaskSlot* s
        cdef WireTask t
        cdef int k = 0
        while k < BATCH and mpmc_pop(self.runq, &idx):
            s = &self.slots[idx]
            t.client_id = s.client_id
            t.task_type = s.task_type
            t.request_id = s.request_id
            t.send_ns = s.send_ns
            self._respond_now(&t, &s.reply, ST_STOPPED, s.flags)
            self.in_server -= 1
            self._free_slot(idx)
            k += 1

    cdef void _gateway_loop(self) noexcept nogil:
        cdef int n, i, k, tasks
        cdef int64_t now, idle_since = 0, timeout, prev = 0, t
        cdef uint64_t hb_tail, idx
        cdef bint worked = False
        while True:
            now = mc_now_ns()
            # Utilisation: a pass that did work is charged up to the next clock read, which
            # each pass makes anyway; idle polling and sleeping are not charged.
            if worked:
                self.c.gateway_busy_ns += <uint64_t>(now - prev)
            prev = now
            if not self.draining and mc_load_acq(&self.stop_gateway):
                self.draining = True
            n = self.tr.rx_poll(BATCH)
            if n:       # admission (max_wait_ms, or a client's deadline) needs the rate
                self.adm_rate = est_rate(&self.est)     # once per batch: a division per
            tasks = 0                                   # worker and task type
            hb_tail = self.hb_tail
            for i in range(n):
                tasks += self._on_msg(&self.tr.rx[i], now)
            self.tr.rx_release(n)
            if tasks:
                mc_bell_ring_n(&self.work_bell, tasks)    # one sleeping worker per task
            if self.n_workers == 0 and not self.draining:
                # Inline mode (no worker threads): tasks run back to back, each timed from
                # the end of the one before, until INLINE_BUDGET_NS have passed, so that the
                # network is polled between long tasks; responses go out in this pass.
                t = now
                while t - now < INLINE_BUDGET_NS and mpmc_pop(self.runq, &idx):
                    t = self._run_task(0, idx, t)
            if self.hb_tail != hb_tail:
                # eq. 6.1 applies each load as it arrives, so the policy thread is woken for
                # its inbox; one ring per batch, and a syscall only if it sleeps.
                mc_bell_ring(&self.hb_bell)
            k = self._completions(now)
            self._check_members(now)
            worked = n > 0 or k > 0
            self._heartbeat_out()
            if self.steal_pending and now >= self.steal_deadline:
                self.steal_pending = False
                self.c.steal_timeouts += 1
            if self.draining:
                self._drain_waiting()
                if self.in_server <= 0 or now >= self.drain_deadline:
                    self.tr.tx_flush()
                    break
            self.tr.tx_flush()
            if tasks or k:
                idle_since = 0
                continue
            if n:
                continue        # heartbeats and steal traffic: poll again, but keep the clock
            if self.busy:
                mc_cpu_relax()
                continue
            if idle_since == 0:
                idle_since = now
            if now - idle_since < self.spin_ns:
                mc_cpu_relax()
                continue
            self.tr.wait_prepare()
            if (mpmc_size(self.doneq) or mc_load_acq(&self.hb_out_pending)
                    or mc_load_acq(&self.stop_gateway) != self.draining):
                self.tr.wait_cancel()
                continue
            timeout = IDLE_WAIT_NS
            if self.draining:
                timeout = 1_000_000
            if self.steal_pending and self.steal_deadline - now < timeout:
                timeout = max(self.steal_deadline - now, 0)
            self.tr.wait_idle(timeout)
