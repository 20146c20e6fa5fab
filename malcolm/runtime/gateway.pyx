# cython: language_level=3
"""The gateway thread of a server: the only thread that touches the transport.

It polls the transport in batches without the GIL and handles each message by kind:

* a **task** from a client: ``Policy.decide_arrival`` keeps it (a slot on the worker pool's
  central FCFS queue) or migrates it to a peer (``K_FORWARD``);
* a **forwarded** task from a peer: kept;
* a **steal request**: answered with the oldest waiting task, or empty;
* a **steal reply**: its task is kept; the ``StealGate`` of ``policy/driver.pxd`` (the
  simulator's rule too) closes the request;
* a **heartbeat**: handed to the policy thread's inbox, in order.

After each batch it turns the workers' completions into responses, asks ``decide_steal``
after each one, and sends the policy thread's heartbeat to every peer once a window. With
``workers=0`` it runs the tasks itself, for up to ``INLINE_BUDGET_NS`` between polls.

Every task ends in exactly one response from exactly one server: completed, or answered with
a reason (dropped: queue full, bad input, handler error, timed out in the queue, server
stopped).
"""
import logging
import threading

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memset

from malcolm._core cimport (
    est_load, est_note_arrival, est_rate, mc_aligned_alloc, mc_cpu_relax, mc_load_acq,
    mc_load_relaxed, mc_now_ns, mc_store_rel, mpmc_pop, mpmc_push, mpmc_size,
)
from malcolm.net._wire cimport *
from malcolm.net.transport cimport BATCH, addr_eq, addr_parse, addr_py
from malcolm.policy.driver cimport (
    steal_gate_expire, steal_gate_init, steal_gate_open, steal_gate_reply,
)
from malcolm.runtime.clients cimport clients_allow, clients_set
from malcolm.runtime.policy_thread cimport HB_RING, hb_reports_tasks
from malcolm._native cimport mc_bell_ring, mc_bell_ring_n
from malcolm.workers.pool cimport (
    IDLE_WAIT_NS, budget_left_us, pool_pop, pool_waiting, slot_from_task, slot_to_task,
)

from malcolm.policy.defaults import STEALS_IN_FLIGHT
from malcolm.workers.pool import name_thread

log = logging.getLogger("malcolm.server")


cdef enum:
    INLINE_BUDGET_NS = 5_000     # workers=0: the longest run of tasks between two polls
    CLIENT_SLOTS = 4096          # clients whose replay windows are kept (direct-mapped)
    SUSPECT_WINDOWS = 5          # windows without a message before a peer gets no more tasks


cdef class Gateway:
    """The gateway of server ``me`` of a rack of ``len(peers)``: built by
    :class:`malcolm.runtime.server.Server`, which validated the parameters."""

    def __init__(self, Transport transport not None, peers, int me, Policy policy not None,
                 WorkerPool pool not None, PolicyThread pt not None, int n_types,
                 double window_us, double task_timeout_ms, double max_service_ms,
                 double peer_timeout_ms, double max_wait_ms, double steal_timeout_us, clients):
        cdef int i
        self.tr = transport
        self.n = len(peers)
        self.me = me
        self.policy = policy
        self.pool = pool
        self.pt = pt
        self.n_types = n_types
        self.max_service_ns = <int64_t>(max_service_ms * 1e6)
        self.peer_timeout_ns = <int64_t>(peer_timeout_ms * 1e6)
        self.timeout_ns = <int64_t>(task_timeout_ms * 1e6)
        self.max_wait_ns = <int64_t>(max_wait_ms * 1e6)
        # Tasks and steal requests stop going to a peer after SUSPECT_WINDOWS windows
        # without a message from it (it sends a heartbeat every window), so the policy's
        # effective choices re-form within a few windows of a failure (issue 13: within 10);
        # leaving the membership (a counted event) still takes peer_timeout_ms, which keeps
        # a peer that is only slow for a moment from flapping in and out of the rack.
        self.suspect_ns = min(self.peer_timeout_ns,
                              SUSPECT_WINDOWS * <int64_t>(window_us * 1000))
        for i in range(MAX_SERVERS):
            self.peer_suspect[i] = self.suspect_ns
        memset(self.mig_to, 0, sizeof(self.mig_to))
        memset(self.mig_last_ns, 0, sizeof(self.mig_last_ns))
        steal_gate_init(&self.steals, STEALS_IN_FLIGHT, <int64_t>(steal_timeout_us * 1000))
        for i, p in enumerate(peers):
            addr_parse(transport.kind, p, &self.peers[i])
        clients_set(&self.clients, clients, transport.kind)
        self.free_slots = <uint32_t*>mc_aligned_alloc(64, sizeof(uint32_t) * pool.capacity)
        self.cli_replay = <ClientReplay*>mc_aligned_alloc(64, sizeof(ClientReplay) * CLIENT_SLOTS)
        if self.free_slots == NULL or self.cli_replay == NULL:
            raise MemoryError("cannot allocate the gateway's tables")
        for i in range(pool.capacity):
            self.free_slots[i] = pool.capacity - 1 - i
        self.n_free = pool.capacity
        memset(&self.count, 0, sizeof(GatewayCounters))
        self.thread = None

    def __dealloc__(self):
        free(self.free_slots)
        free(self.cli_replay)

    def set_key(self, key):
        """The rack's 16-byte MAC key; None: the all-zero one, which catches corruption but
        authenticates nothing."""
        cdef bytes k = bytes(16) if key is None else bytes(key)
        cdef int j
        if len(k) != 16:
            raise ValueError(f"the rack MAC key is 16 bytes (malcolm.runtime.config.read_key), "
                             f"got {len(k)}")
        mc_sipkey_set(&self.key, <const uint8_t*>(<const char*>k))
        self.authenticated = key is not None
        for j in range(MAX_SERVERS):
            if self.authenticated:
                wire_dst_key(&self.key, <uint16_t>j, &self.peer_keys[j])
            else:
                self.peer_keys[j] = self.key
        memset(self.rx_replay, 0, sizeof(self.rx_replay))
        memset(self.tx_seq, 0, sizeof(self.tx_seq))
        memset(self.hb_top, 0, sizeof(self.hb_top))
        memset(self.hb_local_seq, 0, sizeof(self.hb_local_seq))
        memset(self.hb_wire_seq, 0, sizeof(self.hb_wire_seq))
        memset(self.hb_delay_in, 0, sizeof(self.hb_delay_in))
        memset(self.peer_up, 0, sizeof(self.peer_up))
        memset(self.cli_replay, 0, sizeof(ClientReplay) * CLIENT_SLOTS)

    # ------------------------------------------------------------ lifecycle
    def start(self, int64_t now, str prefix, pin):
        """Start the thread (named ``PREFIX-gateway``) with a new epoch; ``pin()`` pins it."""
        cdef int i
        self.epoch = wire_new_epoch()
        self.tx_seq_client = 0
        for i in range(self.n):
            # Peers get one timeout from our start to be heard from.
            self.peer_seen[i] = now
        self.next_member_check = now
        self.stop_flag = 0
        self.draining = False
        self.thread = threading.Thread(target=self._main, args=(prefix, pin), daemon=True,
                                       name="malcolm-gateway")
        self.thread.start()

    def signal_stop(self, double grace_s):
        """Stop taking tasks: answer the waiting ones ``server stopped`` and give the running
        ones ``grace_s`` seconds, then exit."""
        self.drain_deadline = mc_now_ns() + <int64_t>(grace_s * 1e9)
        mc_store_rel(&self.stop_flag, 1)
        self.tr.wake()

    def _main(self, str prefix, pin):
        name_thread(f"{prefix}-gateway")
        pin()
        try:
            with nogil:
                self.loop()
        except BaseException:
            log.exception("gateway of server %d failed", self.me)
            raise

    # ------------------------------------------------------------ statistics
    def counters(self):
        """The gateway's counters, its steal gate's and its membership view (a dict)."""
        cdef dict d = self.count
        cdef int k
        by_reason = d.pop("by_reason")
        d["malformed_by_reason"] = {
            wire_error_name(-k).decode(): by_reason[k] for k in range(1, E_NCODES)
            if by_reason[k]}
        d["steal_req_sent"] = self.steals.sent
        d["steal_suppressed"] = self.steals.suppressed    # decide_steal said steal while
        d["steal_timeouts"] = self.steals.timeouts        # the gate was full
        d["steal_late_replies"] = self.steals.late_replies
        d["peers_up"] = [j for j in range(self.n) if j != self.me and self.peer_up[j]]
        # per peer, what serve's log names: how often it left, and its epoch (a new one is
        # a restart; 0: never heard)
        d["peer_left"] = [int(self.peer_left[j]) for j in range(self.n)]
        d["peer_epoch"] = [int(self.rx_replay[j].epoch) for j in range(self.n)]
        # per peer: migrations to it and the last one's time (CLOCK_MONOTONIC ns, as
        # time.monotonic_ns()): how fast the survivors stop sending to a failed server
        d["migrated_to"] = [int(self.mig_to[j]) for j in range(self.n)]
        d["last_migrated_to_ns"] = [int(self.mig_last_ns[j]) for j in range(self.n)]
        d["suspect_ms"] = self.suspect_ns / 1e6
        # per peer: the silence after which it is suspected now (more for a sleeping one)
        d["peer_suspect_ms"] = [self.peer_suspect[j] / 1e6 for j in range(self.n)]
        d["peer_timeout_ms"] = self.peer_timeout_ns / 1e6
        d["last_bad"] = (wire_error_name(self.last_bad_code).decode(),
                         addr_py(&self.last_bad_addr)) if self.last_bad_code else None
        return d

    # ------------------------------------------------------------ sending
    cdef void bad(self, MsgBuf* m, int code) noexcept nogil:
        self.count.malformed += 1
        if -code < E_NCODES:
            self.count.by_reason[-code] += 1
        self.last_bad_code = code
        self.last_bad_addr = m.peer

    cdef uint32_t seal(self, MsgBuf* b, uint32_t n, int dst) noexcept nogil:
        """Append the trailer to a body of ``n`` bytes going to server ``dst`` (-1: a
        client), with the next sequence number of that destination."""
        cdef uint64_t seq
        if dst >= 0:
            self.tx_seq[dst] += 1
            seq = self.tx_seq[dst]
        else:
            self.tx_seq_client += 1
            seq = self.tx_seq_client
        return wire_seal(b.data, n, &self.peer_keys[dst] if dst >= 0 else &self.key,
                         self.epoch, seq)

    cdef void respond(self, const WireTask* t, const NetAddr* to, uint8_t status,
                      uint16_t flags, int64_t service_ns, const uint8_t* out,
                      uint32_t out_len, double load) noexcept nogil:
        """Answer task ``t`` at ``to``: the one place a response is built."""
        cdef WireResp r
        cdef MsgBuf* b
        r.client_id = t.client_id
        r.task_type = t.task_type
        r.request_id = t.request_id
        r.send_ns = t.send_ns
        r.service_ns = service_ns
        r.load = load
        r.queue_len = <uint32_t>self.pool.held
        r.server = self.me
        r.status = status
        r.flags = <uint8_t>flags
        r.payload_len = <uint16_t>out_len
        r.payload = out
        b = self.tr.tx_next(to)
        b.len = self.seal(b, wire_put_resp(b.data, b.cap, self.me, &r), -1)
        self.count.responses += 1
        if status == ST_DROPPED:
            self.count.dropped_full += 1
        elif status == ST_BAD_INPUT:
            self.count.bad_input += 1
        elif status == ST_STOPPED:
            self.count.stopped += 1
        elif status == ST_OVERLOADED:
            self.count.overloaded += 1

    cdef void respond_now(self, const WireTask* t, const NetAddr* to, uint8_t status,
                          uint16_t flags) noexcept nogil:
        """Answer a task that did not run (a reason in ``status``)."""
        self.respond(t, to, status, flags, 0, NULL, 0,
                     est_load(&self.pool.est, <double>self.pool.held))

    cdef void send_move(self, int dst, uint8_t kind, const WireTask* t) noexcept nogil:
        cdef MsgBuf* b = self.tr.tx_next(&self.peers[dst])
        b.len = self.seal(b, wire_put_move(b.data, b.cap, self.me, kind, t), dst)

    # ------------------------------------------------------------ keeping a task
    cdef bint enqueue(self, const WireTask* t, const NetAddr* reply, uint16_t flags,
                      uint16_t origin, int64_t now) noexcept nogil:
        """Keep a task: copy it into a slot and queue it. False when no slot is free or the
        queued work is over ``max_wait_ns`` or the client's own deadline (a stolen task is
        always kept: it was asked for)."""
        cdef uint64_t idx
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
            waiting = <double>pool_waiting(self.pool)
            # With every worker busy the task also waits for one to free: M/M/c's mean wait
            # is (waiting + 1) / rate, not waiting / rate. Only a task time over the workers,
            # but where that is longer than the client's budget allows (long tasks, short
            # timeouts) the task behind a running one was admitted with nothing queued and
            # then timed out; now it is refused at once. (held counts the running tasks, and
            # the finished ones not yet answered: a worker may have just freed.)
            if (self.pool.n_workers > 0
                    and self.pool.held - <int64_t>waiting >= self.pool.n_workers):
                waiting += 1.0
            if waiting > 0 and waiting > self.adm_rate * <double>allowed:
                self.respond_now(t, reply, ST_OVERLOADED, flags)
                return False
        # A slot is 2 kB; reusing the one freed last keeps it in cache (a FIFO free list
        # walked every slot of the pool, a cache miss per touched line).
        if self.n_free == 0:
            self.respond_now(t, reply, ST_DROPPED, flags)
            return False
        self.n_free -= 1
        idx = self.free_slots[self.n_free]
        slot_from_task(&self.pool.slots[idx], t, reply, flags, origin, now, deadline)
        self.pool.held += 1
        est_note_arrival(&self.pool.est, t.task_type)
        # never full: runq and stealq each hold at most `capacity`
        if (flags & F_STOLEN) and self.policy.stolen_first:
            mpmc_push(self.pool.stealq, idx)
            self.count.stolen_ahead += 1
        else:
            mpmc_push(self.pool.runq, idx)
        return True

    cdef void free_slot(self, uint64_t idx) noexcept nogil:
        self.free_slots[self.n_free] = <uint32_t>idx
        self.n_free += 1

    cdef bint valid_task(self, const WireTask* t) noexcept nogil:
        return t.task_type < self.n_types and t.service_ns <= self.max_service_ns

    # ------------------------------------------------------------ receiving
    cdef int on_msg(self, MsgBuf* m, int64_t now) noexcept nogil:
        """Handle one message; return 1 if it carried a task (work that keeps us spinning)."""
        cdef WireHdr h
        cdef int kind, rc
        cdef uint64_t ep, aseq
        cdef uint32_t blen
        self.count.rx_msgs += 1
        kind = wire_header(m.data, m.len, &h)
        if kind < 0:
            self.bad(m, kind)
            return 0
        # a client's task under the rack key, everything else (from a server) under ours
        rc = wire_open(m.data, m.len, &self.key if kind == K_TASK else &self.peer_keys[self.me],
                       &ep, &aseq)
        if rc < 0:
            self.bad(m, rc)
            return 0
        blen = <uint32_t>rc        # the body: the decoders never see the trailer
        if kind == K_TASK:
            return self.on_task(m, h.src, blen, ep, aseq, now)
        # Everything else must come from a server of this rack, from its own address.
        if not self.from_member(m, h.src, ep, aseq, now):
            return 0
        if kind == K_FORWARD:
            return self.on_forward(m, blen, now)
        elif kind == K_STEAL_REQ:
            self.on_steal_req(m, h.src, blen, now)
        elif kind == K_STEAL_REPLY:
            return self.on_steal_reply(m, blen, now)
        elif kind == K_HEARTBEAT:
            self.on_heartbeat(m, h.src, blen, aseq)
        else:
            self.count.unexpected += 1
            self.bad(m, E_UNEXPECTED)
        return 0

    cdef int on_task(self, MsgBuf* m, int src, uint32_t blen, uint64_t ep, uint64_t aseq,
                     int64_t now) noexcept nogil:
        """A client's task: keep it or migrate it, as ``decide_arrival`` says."""
        cdef WireTask t
        cdef int rc, dst
        if src != CLIENT_SRC:
            self.bad(m, E_SRC)
            return 0
        if not clients_allow(&self.clients, &m.peer):
            self.bad(m, E_ADDR)
            return 0
        rc = wire_get_task(m.data, blen, &t)
        if blen >= TASK_LEN and not self.client_fresh(m, t.client_id, ep, aseq):
            return 0            # a replayed task must not run (or be answered) twice
        if rc == E_FIELD or (rc == E_PAYLOAD and blen >= TASK_LEN):
            self.bad(m, rc)
            self.respond_now(&t, &m.peer, ST_BAD_INPUT, 0)
            return 0
        if rc < 0:
            self.bad(m, rc)
            return 0
        self.count.tasks_in += 1
        if not self.valid_task(&t):
            self.respond_now(&t, &m.peer, ST_BAD_INPUT, 0)
            return 0
        if self.draining:
            self.respond_now(&t, &m.peer, ST_STOPPED, 0)
            return 0
        dst = self.policy.decide_arrival(now, t.task_type)
        if 0 <= dst < self.n and dst != self.me and now - self.peer_seen[dst] > \
                self.peer_suspect[dst]:
            self.count.kept_for_silent += 1
            dst = self.me
        if 0 <= dst < self.n and dst != self.me:
            # Migrate: the peer answers the client itself (t.reply).
            t.reply = m.peer
            t.origin = self.me
            t.flags = F_MIGRATED
            t.seq = 0
            self.send_move(dst, K_FORWARD, &t)
            self.count.migrated_out += 1
            self.mig_to[dst] += 1
            self.mig_last_ns[dst] = now
            self.policy.migrations += 1
            return 1
        if self.enqueue(&t, &m.peer, 0, self.me, now):
            self.count.accepted += 1
        return 1

    cdef bint from_member(self, MsgBuf* m, int src, uint64_t ep, uint64_t aseq,
                          int64_t now) noexcept nogil:
        """A message from server ``src``: from its own address, not a replay. Membership:
        a peer heard from is up. False (counted by reason) if it must be dropped."""
        cdef bint known
        cdef int rc
        if src >= self.n or src == self.me:
            self.bad(m, E_SRC)
            return False
        if not addr_eq(&m.peer, &self.peers[src]):
            self.bad(m, E_ADDR)
            return False
        known = self.rx_replay[src].epoch != 0
        rc = wire_replay_check(&self.rx_replay[src], ep, aseq)
        if rc == E_EPOCH and not self.peer_up[src] and not self.epoch_seen(src, ep):
            # An older epoch, new to us, from a peer presumed down: it restarted with its
            # clock set back. (While it is up, an older epoch can only be a replay; so is
            # one it started before: a recording of its earlier run, replayed after it
            # died, brought it back, and the tasks sent to it were lost.)
            self.rx_replay[src].epoch = 0
            rc = wire_replay_check(&self.rx_replay[src], ep, aseq)
        if rc < 0:
            self.bad(m, rc)
            return False
        if rc == 1:
            # A new epoch: the peer (re)started. Its heartbeats are applied from the first.
            self.hb_top[src] = 0
            self.hb_wire_seq[src] = 0
            self.peer_suspect[src] = self.suspect_ns
            self.ep_seen[src][self.ep_next[src] & 7] = ep
            self.ep_next[src] += 1
            if known or self.peer_up[src]:
                self.count.peer_restarts += 1
        if not self.peer_up[src]:
            self.peer_up[src] = True
            self.count.peer_joins += 1
        self.peer_seen[src] = now
        return True

    cdef bint epoch_seen(self, int src, uint64_t ep) noexcept nogil:
        """Whether peer ``src`` started epoch ``ep`` among the last 8 it started here."""
        cdef int i
        for i in range(8):
            if self.ep_seen[src][i] == ep:
                return True
        return False

    cdef int on_forward(self, MsgBuf* m, uint32_t blen, int64_t now) noexcept nogil:
        """A task a peer migrated here: kept (it answers its client from here)."""
        cdef WireTask t
        cdef int rc = wire_get_move(m.data, blen, &t)
        if rc < 0:
            self.bad(m, rc)
            return 0
        if not self.valid_task(&t):
            self.respond_now(&t, &t.reply, ST_BAD_INPUT, t.flags)
            return 0
        if self.draining:
            self.respond_now(&t, &t.reply, ST_STOPPED, t.flags)
            return 0
        if self.enqueue(&t, &t.reply, t.flags | F_MIGRATED, t.origin, now):
            self.count.forwarded_in += 1
        return 1

    cdef void on_steal_req(self, MsgBuf* m, int src, uint32_t blen, int64_t now) noexcept nogil:
        """A peer asks for work: the oldest waiting task (the central queue is FIFO)."""
        cdef WireTask t
        cdef MsgBuf* b
        cdef uint64_t idx
        cdef uint32_t seq
        cdef int64_t sent
        cdef int rc = wire_get_steal_req(m.data, blen, &seq, &sent)
        if rc < 0:
            self.bad(m, rc)
            return
        self.count.steal_req_recv += 1
        # The waiting work counts the tasks this server stole itself, but those are not
        # given away again (runq only); the rate is the batch's (adm_rate, read once per
        # batch before its messages are handled).
        cdef double waiting = <double>pool_waiting(self.pool)
        if (not self.draining and mpmc_size(self.pool.runq) > 0
                and self.policy.grant_steal(now, waiting, self.adm_rate)
                and mpmc_pop(self.pool.runq, &idx)):
            slot_to_task(&self.pool.slots[idx], &t, self.pool.slots[idx].flags | F_STOLEN, seq)
            # what is left of the deadline travels with the task
            t.budget_us = budget_left_us(self.pool.slots[idx].deadline_ns, mc_now_ns())
            self.send_move(src, K_STEAL_REPLY, &t)
            self.pool.held -= 1
            self.free_slot(idx)
            self.count.stolen_out += 1
        else:
            b = self.tr.tx_next(&self.peers[src])
            b.len = self.seal(b, wire_put_steal_empty(b.data, b.cap, self.me, seq), src)
            self.count.steal_empty_sent += 1

    cdef int on_steal_reply(self, MsgBuf* m, uint32_t blen, int64_t now) noexcept nogil:
        """The answer to our steal request: a task to keep, or empty."""
        cdef WireTask t
        cdef int rc = wire_get_steal_reply(m.data, blen, &t)
        if rc < 0:
            self.bad(m, rc)
            return 0
        steal_gate_reply(&self.steals, t.seq, now)
        if rc == 0:
            self.count.steal_empty_recv += 1
            return 0
        # A task always counts, even if its reply came after we gave up waiting.
        if self.draining:
            self.respond_now(&t, &t.reply, ST_STOPPED, t.flags | F_STOLEN)
            return 0
        if self.enqueue(&t, &t.reply, t.flags | F_STOLEN, t.origin, now):
            self.count.stolen_in += 1
            self.policy.steals += 1
        return 1

    cdef void on_heartbeat(self, MsgBuf* m, int src, uint32_t blen,
                           uint64_t aseq) noexcept nogil:
        """A peer's heartbeat, into the policy thread's inbox in the order it was sent, with
        the time it was taken in: read here, after the receive (the pass's clock is read
        before it, and may precede the sender's stamp).

        The one-way delay the policy measures (``now - sent_ns``: Malcolm's hop estimate)
        must not depend on the hosts' clocks agreeing, and CLOCK_MONOTONIC on two hosts
        differs by their boot times. As NTP does with a two-way exchange: our d = rx -
        sent_ns is the hop plus our clock's offset from the peer's, and the peer's echo of the
        same for our heartbeats (``echo_ns``) the hop less it, so their mean is the hop
        whatever the offset. The policy is handed sent_ns = rx - that mean (on one host the
        mean of the two directions' delays). Before the peer's first echo, its own stamp."""
        cdef Heartbeat* hb
        cdef int rc
        cdef uint32_t d
        cdef int64_t rx = mc_now_ns() + self.clock_offset_ns, echo = 0, din
        cdef uint32_t win_us = 0
        if self.pt.hb_tail - mc_load_acq(&self.pt.hb_head) >= HB_RING:
            self.count.hb_dropped += 1
            return
        if aseq <= self.hb_top[src]:
            # Reordered behind a newer one: the policy must not apply an old load.
            self.count.hb_stale += 1
            return
        hb = &self.pt.hb_in[self.pt.hb_tail % HB_RING]
        rc = wire_get_heartbeat(m.data, blen, hb, &echo, &win_us)
        if rc < 0:
            self.bad(m, rc)
            return
        self.hb_top[src] = aseq
        # A quiet rack's servers send a heartbeat every few ms (policy_thread.pyx), each
        # saying its window: such a peer is suspected only after 3 of those (the next may
        # be twice it), at most peer_timeout_ms. One that beats every window keeps the 5
        # windows (issue 13).
        self.peer_suspect[src] = min(max(3000 * <int64_t>win_us, self.suspect_ns),
                                     self.peer_timeout_ns)
        din = <int64_t>(<uint64_t>rx - <uint64_t>hb.sent_ns)     # wraps, never overflows
        self.hb_delay_in[src] = din if din != 0 else 1           # 0 means none
        if echo != 0:
            hb.sent_ns = <int64_t>(<uint64_t>rx - <uint64_t>((din >> 1) + (echo >> 1)))
        # The policies drop a heartbeat whose seq is not newer than the last; the order
        # is ours to keep (above, across the sender's restarts too), so they get a count
        # of this peer's heartbeats, which a forged or restarted seq cannot freeze. It
        # steps by the sender's own gap where that is 1-1024 (heartbeats lost on the way:
        # the policy's hb_lost and stale reports, docs/policy.md item 22), else by 1.
        d = hb.seq - self.hb_wire_seq[src]
        self.hb_local_seq[src] += d if self.hb_wire_seq[src] != 0 and d - 1 < 1024 else 1
        self.hb_wire_seq[src] = hb.seq
        hb.seq = self.hb_local_seq[src]
        self.count.hb_theta_recv += hb.n_theta
        self.hb_busy |= hb_reports_tasks(hb)
        self.pt.hb_rx_ns[self.pt.hb_tail % HB_RING] = rx
        mc_store_rel(&self.pt.hb_tail, self.pt.hb_tail + 1)
        self.count.hb_recv += 1

    cdef bint client_fresh(self, MsgBuf* m, uint32_t client_id, uint64_t ep,
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
            self.bad(m, rc)
            return False
        return True

    cdef void check_members(self, int64_t now) noexcept nogil:
        """Every millisecond: a peer silent for peer_timeout_ns leaves (an event)."""
        cdef int j
        if now < self.next_member_check:
            return
        self.next_member_check = now + 1_000_000
        for j in range(self.n):
            if self.peer_up[j] and now - self.peer_seen[j] > self.peer_timeout_ns:
                self.peer_up[j] = False
                self.peer_left[j] += 1
                self.count.peer_leaves += 1

    # ------------------------------------------------------------ completions and steals
    cdef void maybe_steal(self, int64_t now) noexcept nogil:
        """After a completion: ask ``decide_steal``, and send the request if the gate
        (one in flight, policy/defaults.py) lets it through."""
        cdef MsgBuf* b
        cdef uint32_t seq
        cdef int v = self.policy.decide_steal(now)
        if not (0 <= v < self.n and v != self.me):
            return
        if now - self.peer_seen[v] > self.peer_suspect[v]:
            self.count.steals_to_silent += 1
            return
        seq = steal_gate_open(&self.steals, now)
        if seq == 0:
            return                  # counted by the gate (suppressed)
        b = self.tr.tx_next(&self.peers[v])
        b.len = self.seal(b, wire_put_steal_req(b.data, b.cap, self.me, seq, now), v)

    cdef int completions(self, int64_t now) noexcept nogil:
        """Answer the tasks the workers finished (up to a batch)."""
        cdef uint64_t idx
        cdef TaskSlot* s
        cdef WireTask t
        cdef int k = 0
        cdef double rate = 0.0
        while k < BATCH and mpmc_pop(self.pool.doneq, &idx):
            if k == 0:
                # Once per batch: the rate sums a division per worker and task type, and
                # its EWMAs move by a small fraction per completion anyway.
                rate = est_rate(&self.pool.est)
            s = &self.pool.slots[idx]
            self.pool.held -= 1
            slot_to_task(s, &t, s.flags, 0)
            self.respond(&t, &s.reply, s.status, s.flags, s.measured_ns, s.out, s.out_len,
                         <double>self.pool.held / rate)
            self.free_slot(idx)
            k += 1
            if not self.draining:
                self.maybe_steal(now)
        return k

    cdef void heartbeat_out(self) noexcept nogil:
        """The policy thread filled a heartbeat: send it to every peer, stamped now.

        The policy stamped it at its window's end; it leaves when this thread next runs, so
        the receivers' one-way delay (their hop estimate: what a migration costs) is counted
        from here, as a migrated task's is from the pass that forwards it. The clock is read
        only when a heartbeat is pending, not on every pass."""
        cdef int j
        cdef MsgBuf* b
        cdef uint32_t n
        cdef uint32_t win_us
        if not mc_load_acq(&self.pt.hb_out_pending):
            return
        self.pt.hb_out.sent_ns = mc_now_ns() + self.clock_offset_ns
        # the window that follows it (published with it): when the next one is due
        win_us = <uint32_t>min(self.pt.window_now // 1000, MAX_HB_WINDOW_US)
        for j in range(self.n):
            if j == self.me:
                continue
            b = self.tr.tx_next(&self.peers[j])
            n = self.seal(b, wire_put_heartbeat(b.data, b.cap, self.me, self.pt.hb_out,
                                                self.hb_delay_in[j], win_us), j)
            b.len = n
            if n:
                self.count.hb_sent += 1
        mc_store_rel(&self.pt.hb_out_pending, 0)

    cdef void drain_waiting(self) noexcept nogil:
        """While stopping: answer every waiting task ``server stopped``."""
        cdef uint64_t idx
        cdef TaskSlot* s
        cdef WireTask t
        cdef int k = 0
        while k < BATCH and pool_pop(self.pool, &idx):
            s = &self.pool.slots[idx]
            slot_to_task(s, &t, s.flags, 0)
            self.respond_now(&t, &s.reply, ST_STOPPED, s.flags)
            self.pool.held -= 1
            self.free_slot(idx)
            k += 1

    # ------------------------------------------------------------ the loop
    cdef int64_t idle_timeout(self, int64_t now) noexcept nogil:
        """How long the gateway may block: until the earliest steal request expires."""
        cdef int64_t timeout = 1_000_000 if self.draining else IDLE_WAIT_NS
        cdef int i
        for i in range(self.steals.n):
            if self.steals.pend_deadline[i] - now < timeout:
                timeout = max(self.steals.pend_deadline[i] - now, 0)
        return timeout

    cdef void loop(self) noexcept nogil:
        cdef int n, i, k, tasks
        cdef int64_t now, idle_since = 0, prev = 0, t
        cdef uint64_t hb_tail, idx
        cdef bint worked = False
        while True:
            now = mc_now_ns()
            # Utilisation: a pass that did work is charged up to the next clock read, which
            # each pass makes anyway; idle polling and sleeping are not charged.
            if worked:
                self.count.gateway_busy_ns += <uint64_t>(now - prev)
            prev = now
            if not self.draining and mc_load_acq(&self.stop_flag):
                self.draining = True
            n = self.tr.rx_poll(BATCH)
            if n:       # admission (max_wait_ms, or a client's deadline) needs the rate
                self.adm_rate = est_rate(&self.pool.est)     # once per batch: a division per
            tasks = 0                                        # worker and task type
            hb_tail = self.pt.hb_tail
            for i in range(n):
                tasks += self.on_msg(&self.tr.rx[i], now)
            self.tr.rx_release(n)
            if tasks:
                mc_bell_ring_n(&self.pool.bell, tasks)    # one sleeping worker per task
                self.pt.wake()          # after the ring's fence: a quiet rack's long window
            if self.pool.n_workers == 0 and not self.draining:
                # Inline mode (no worker threads): tasks run back to back, each timed from
                # the end of the one before, until INLINE_BUDGET_NS have passed, so that the
                # network is polled between long tasks; responses go out in this pass.
                t = now
                while t - now < INLINE_BUDGET_NS and pool_pop(self.pool, &idx):
                    t = self.pool.run_task(0, idx, t)
            if self.pt.hb_tail != hb_tail:
                # eq. 6.1 applies each load as it arrives, so the policy thread is woken for
                # its inbox; one ring per batch, and a syscall only if it sleeps. In a quiet
                # rack's long window it takes idle peers' heartbeats at the window's end
                # instead (each is stamped when it came in, here): a ring for each was most
                # of its wake-ups while idle. A busy peer's heartbeat (it ends the window)
                # and an inbox half full are rung for at once.
                if (self.hb_busy or not mc_load_relaxed(&self.pt.sleeping)
                        or self.pt.hb_tail - mc_load_acq(&self.pt.hb_head) >= HB_RING // 2):
                    mc_bell_ring(&self.pt.bell)
                self.hb_busy = False
            k = self.completions(now)
            self.check_members(now)
            worked = n > 0 or k > 0
            self.heartbeat_out()
            steal_gate_expire(&self.steals, now)
            if self.draining:
                self.drain_waiting()
                if self.pool.held <= 0 or now >= self.drain_deadline:
                    self.tr.tx_flush()
                    break
            self.tr.tx_flush()
            if tasks or k:
                idle_since = 0
                continue
            if n:
                continue        # heartbeats and steal traffic: poll again, but keep the clock
            if self.pool.busy:
                mc_cpu_relax()
                continue
            if idle_since == 0:
                idle_since = now
            if now - idle_since < self.pool.spin_ns:
                mc_cpu_relax()
                continue
            self.tr.wait_prepare()
            if (mpmc_size(self.pool.doneq) or mc_load_acq(&self.pt.hb_out_pending)
                    or mc_load_acq(&self.stop_flag) != self.draining):
                self.tr.wait_cancel()
                continue
            self.tr.wait_idle(self.idle_timeout(now))
