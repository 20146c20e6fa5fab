# cython: language_level=3
"""One malcolm server: a gateway thread, W worker threads and a policy thread (thesis §6.1).

This module builds a server and runs its lifecycle and statistics; each thread role is its
own module:

* the **gateway** (``malcolm/runtime/gateway.pyx``) owns the transport: it polls in batches
  without the GIL, keeps or migrates each new task (``Policy.decide_arrival``), turns
  completions into responses, steals after them (``decide_steal``, through the driver's
  ``StealGate``), answers peers' steal requests and sends the heartbeats;
* the **workers** (``malcolm/workers/pool.pyx``) pop the central FCFS queue and run the
  handler without the GIL, feeding the measured service times to the load ``Estimator``;
  with ``workers=0`` the gateway runs the tasks itself between polls;
* the **policy thread** (``malcolm/runtime/policy_thread.pyx``) runs the window protocol of
  ``policy/driver.pxd``, the simulator's own code.

Only the gateway touches the transport (RDMA queue pairs are not thread-safe either); the
other threads talk to it through lock-free queues and wake it with ``Transport.wake``.

Every task ends in exactly one response from exactly one server: completed, or answered with
a reason (dropped: queue full, bad input, handler error, timed out in the queue, server
stopped). Tasks that were on their way to, or inside, a server that dies are not answered;
the client's accounting reports them lost.
"""
import logging

from libc.stdint cimport int64_t

from malcolm._core cimport est_load, est_rate, mc_now_ns
from malcolm.net.transport cimport Transport
from malcolm.policy.base cimport MAX_SERVERS, Policy
from malcolm.runtime.gateway cimport Gateway
from malcolm.runtime.policy_thread cimport PolicyThread
from malcolm.workers.handlers cimport Handler
from malcolm.workers.pool cimport WorkerPool, pool_waiting

from malcolm.policy.defaults import EST_ALPHA, EST_PRIOR_SERVICE_US, WINDOW_TASKS
from malcolm.runtime import cpus as _cpus
from malcolm.runtime.config import GATEWAY_JOIN_EXTRA_S, THREAD_JOIN_MIN_S, range_error

log = logging.getLogger("malcolm.server")


cdef class Server:
    """A malcolm server on an open transport. Usually built from a rack file by
    :func:`malcolm.runtime.config.build_server`.

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
        The policy window (heartbeat period), the longest: each is ``window_tasks`` of the
        server's measured task times within [window_us / 5, window_us] (``drv_window_ns`` in
        ``policy/driver.pxd``, the simulator's rule; ``window_tasks=0``: fixed).
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
    idle_window_us : float
        The longest window of a quiet rack, whose windows lengthen while no task is in it
        (``policy_thread.pyx``): -1 (default) 32 windows, at most 5 ms; 0 never; at most a
        quarter of the peer timeout either way.
    """
    cdef readonly int n, me, n_workers, n_types
    cdef readonly object handler_obj
    cdef readonly object policy_obj
    cdef readonly bint busy
    cdef readonly bint running
    cdef readonly bint stopped      # stop() ran: the threads exited, start() is refused
    cdef Transport tr
    cdef readonly WorkerPool pool
    cdef readonly PolicyThread policy_thread
    cdef readonly Gateway gateway
    cdef double grace_s
    cdef object cpus
    cdef object peers
    cdef int64_t started_ns

    def __init__(self, Transport transport not None, peers, int me, Policy policy not None,
                 handler="spin", int workers=2, int capacity=4096, int n_types=8,
                 double window_us=100.0, str poll="adaptive", double spin_us=50.0,
                 double task_timeout_ms=0.0, double steal_timeout_us=2000.0,
                 double max_service_ms=10_000.0, clients=None,
                 double est_alpha=EST_ALPHA, double prior_service_us=EST_PRIOR_SERVICE_US,
                 double grace_s=2.0,
                 double peer_timeout_ms=-1.0, cpus=None, key=None, double max_wait_ms=0.0,
                 double window_tasks=WINDOW_TASKS, double idle_window_us=-1.0):
        cdef Handler h
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
        # a rack file's ranges for the same settings: NaN, infinite or negative ones ran
        # (a NaN window, a negative spin) or failed only at stop (grace_s)
        for name, v in (("window_us", window_us), ("window_tasks", window_tasks),
                        ("spin_us", spin_us), ("task_timeout_ms", task_timeout_ms),
                        ("steal_timeout_us", steal_timeout_us),
                        ("max_service_ms", max_service_ms), ("est_alpha", est_alpha),
                        ("prior_service_us", prior_service_us), ("grace_s", grace_s),
                        ("max_wait_ms", max_wait_ms),
                        ("peer_timeout_ms", peer_timeout_ms),
                        ("idle_window_us", idle_window_us)):
            why = range_error(name, v)
            if why:
                raise ValueError(f"{name}={v} {why}")
        if poll not in ("busy", "adaptive"):
            raise ValueError(f"poll={poll!r} must be 'busy' or 'adaptive'")
        self.tr = transport
        self.peers = [p for i, p in enumerate(peers) if i != me]
        self.me = me
        self.policy_obj = policy
        h = handler if isinstance(handler, Handler) else Handler(handler)
        self.handler_obj = h
        self.n_workers = workers
        self.n_types = n_types
        self.busy = poll == "busy"
        self.grace_s = grace_s
        # A peer silent this long is presumed down: tasks are not migrated to it, nor steals
        # asked of it, until it is heard from again. Default: 20 windows, at least 100 ms.
        if peer_timeout_ms < 0:
            peer_timeout_ms = max(100.0, 20 * window_us / 1000.0)
        self.pool = WorkerPool(transport, h, workers, capacity, n_types, self.busy, spin_us,
                               est_alpha, prior_service_us)
        # A quiet rack's windows lengthen up to this (policy_thread.pyx), to 32 windows or
        # 5 ms, whichever is shorter: 300 windows a second where 100 µs windows gave 10 000.
        # At most a quarter of the peer timeout, so that a sleeping peer never leaves.
        if idle_window_us < 0:
            idle_window_us = min(32 * window_us, 5000.0)
        idle_window_us = min(idle_window_us, peer_timeout_ms * 250.0)
        self.policy_thread = PolicyThread(policy, self.pool, transport, window_us,
                                          window_tasks, idle_window_us)
        # Admission control (max_wait_ms) bounds the queued *work*, not slots: a task that
        # would wait longer than this (tasks waiting / service rate) is refused at once, with
        # a reason, rather than queued to time out at its client.
        self.gateway = Gateway(transport, peers, me, policy, self.pool, self.policy_thread,
                               n_types, window_us, task_timeout_ms, max_service_ms,
                               peer_timeout_ms, max_wait_ms, steal_timeout_us, clients)
        self.running = False
        self.stopped = False
        self.cpus = _cpus.check_cpus(cpus)
        self.gateway.set_key(key)

    @property
    def authenticated(self):
        """Whether messages are authenticated (a rack key was given)."""
        return bool(self.gateway.authenticated)

    @property
    def epoch(self):
        """This run's epoch (set by :meth:`start`)."""
        return int(self.gateway.epoch)

    # ------------------------------------------------------------ lifecycle
    def start(self):
        """Start the gateway, worker and policy threads."""
        if self.running:
            raise RuntimeError("server already started")
        if self.stopped:
            # Its threads have exited and its transport is closed: restarting it failed
            # inside (transport is closed) after logging as a start, and left it marked
            # running. A restarted server is a new Server (a new epoch: its peers see it so).
            raise RuntimeError("server was stopped: a stopped server cannot be started "
                               "again; create a new Server")
        self.started_ns = mc_now_ns()
        if not self.gateway.authenticated:
            log.warning("server %d: no rack key: messages are not authenticated (any host "
                        "that reaches this one can act as a member); set [rack] key_file "
                        "(malcolm rack keygen PATH)", self.me)
        self.running = True
        _cpus.warn_oversubscribed(self.me, self.busy, self.n_workers, self.cpus)
        prefix = f"mc{self.me}"
        cpus = self.cpus
        # Before the gateway polls (announce is the polling thread's): a restarted server's
        # peers learn where it is now (verbs: its new queue pair) before its first message.
        self.tr.announce(self.peers)
        self.pool.start(prefix, lambda w: _cpus.pin(cpus, "worker", w))
        self.policy_thread.start(prefix, lambda: _cpus.pin(cpus, "policy"))
        self.gateway.start(self.started_ns, prefix, lambda: _cpus.pin(cpus, "gateway"))
        return self

    def stop(self, grace_s=None):
        """Stop cleanly and return the final statistics.

        Waiting tasks are answered ``server stopped``; running ones get up to ``grace_s``
        seconds to finish. The report's ``unfinished`` counts tasks still running after that
        (their responses are never sent) and ``unanswered`` those held when the gateway exited.
        """
        if not self.running:
            report = self.stats()
            report.update(unanswered=int(self.pool.held), unfinished=int(self.pool.held),
                          stuck_threads=[])
            if not self.stopped:
                # never started: no thread to stop, but the server owns its transport (its
                # socket, shm rings or queue pair) and is done with it, as after a run
                self.stopped = True
                self.tr.close()
            return report
        grace = self.grace_s if grace_s is None else grace_s
        self.gateway.signal_stop(grace)
        gw = self.gateway.thread
        gw.join(grace + GATEWAY_JOIN_EXTRA_S)       # config.stop_bound_s adds these up
        unanswered = self.pool.held
        self.pool.signal_stop()
        self.policy_thread.signal_stop()
        stuck = []
        for t in self.pool.threads + [self.policy_thread.thread]:
            t.join(max(THREAD_JOIN_MIN_S, grace))
            if t.is_alive():
                stuck.append(t.name)
        self.running = False
        self.stopped = True
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
        cdef WorkerPool pool = self.pool
        d = self.gateway.counters()
        d.update(pool.counters())
        d.update(self.policy_thread.counters())
        d["id"] = self.me
        d["authenticated"] = bool(self.gateway.authenticated)
        d["epoch"] = int(self.gateway.epoch)
        d["queue_len"] = int(pool.held)
        d["waiting"] = int(pool_waiting(pool))
        d["rate_per_us"] = est_rate(&pool.est) * 1000.0
        d["load_us"] = est_load(&pool.est, <double>pool.held) / 1000.0
        d["send_failed"] = self.tr.n_send_failed
        d["mono_ns"] = mc_now_ns()                  # when this snapshot was taken
        d["started_ns"] = self.started_ns
        if hasattr(self.policy_obj, "probs_migrate"):
            d["probs_migrate"] = [float(x) for x in self.policy_obj.probs_migrate]
        tr = <object>self.tr
        inner = getattr(tr, "inner", None)      # malcolm.net.delay, if the network is emulated
        if inner is not None:
            d["net_emulation"] = tr.stats()
            tr = inner
        ts = getattr(tr, "stats", None)         # verbs: its queue and its address thread
        if ts is not None:
            d["transport"] = ts()
        d["uptime_s"] = (mc_now_ns() - self.started_ns) / 1e9 if self.started_ns else 0.0
        d["service"] = pool.service_times()
        hs = self.handler_obj.handler_stats() if self.handler_obj is not None else None
        if hs is not None:
            d["handler"] = hs
        if hasattr(self.policy_obj, "stats"):
            try:
                d["policy"] = self.policy_obj.stats()
            except Exception as e:  # a policy's optional hook must not break monitoring
                d["policy"] = {"error": str(e)}
        return d

    def service_times(self, buckets=True):
        """The measured handler times of all workers, merged: see
        :meth:`malcolm.workers.pool.WorkerPool.service_times`."""
        return self.pool.service_times(buckets)
