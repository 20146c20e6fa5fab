# cython: language_level=3
"""The gateway's rules from state the agents do not share: the hop gate, the shed rule and
idle-only steals (the class between ``AgentState`` and ``MalcolmPolicy``).

The gateway thread runs ``decide_arrival`` and ``decide_steal``: it follows the published
tables, except where its own queue *now* decides. The policy thread publishes, with the
tables, what those rules need (``_gate_accept``: the budget K, the shed threshold T and the
steal bars, each a relaxed 64-bit store); the gateway counts what it kept and saw complete
since. Nothing here is learnt, so the frozen control (``learn=0``) has the same rules.
docs/policy.md, "The default policy" items 7, 8 and 10; docs/policy-log.md, "Tiny racks: the shed
rule and idle-only steals" and "Twelfth session".
"""
from libc.math cimport exp2, floor, log2
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t

from malcolm._core cimport cat_sample, cat_sample_except, mc_load_relaxed, mc_store_relaxed
from malcolm.policy.agent_state cimport AgentState
from malcolm.policy._pub_kernels cimport (
    mc_pub_code_min, mc_pub_count_known, mc_pub_grant_share, mc_pub_steal_bars, mc_speed_ratio,
    mc_speed_tab_init,
)

mc_speed_tab_init()     # this module's copy of mc_speed_ratio's table, before any policy
cdef uint64_t LOW32 = (<uint64_t>1 << 32) - 1      # the hop gate's budget field
# the shed threshold that no live budget reaches (the budget is clamped to >= -1e9)
cdef double SHED_NEVER = -2147483648.0
# the budget a server slower than its peers by more than a hop publishes (_gate_accept): far
# below any budget completions can raise within a window, above the clamp (-1e9) plus it
cdef int64_t SPEED_CLOSED = 100000000
# _gate_accept: the speeds close a gate, and a closed one reopens, only past this many own
# task times beyond the point where keeping and migrating finish alike (hysteresis)
cdef double SPEED_HYST = 0.2
# the steal bar no budget reaches
cdef double STEAL_NEVER = 2147483647.0

# The budget, the shed threshold and the steal bars are published as signed 32-bit numbers
# in the low half of a 64-bit word (the budget's high half is the publish's sequence).
cdef inline uint64_t _low32_of(double t) noexcept nogil:
    """The word that carries ``t`` (an integer in int32's range) in its low half."""
    return <uint64_t>(<uint32_t>(<int32_t>t))


cdef inline int64_t _low32(uint64_t v) noexcept nogil:
    """The signed number in a published word's low half."""
    return <int64_t>(<int32_t>(v & LOW32))


cdef class GatewayRules(AgentState):
    """``AgentState`` plus the gateway's decisions (``MalcolmPolicy`` is the only subclass)."""

    # ------------------------------------------------------------ gateway thread (hot path)
    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        cdef uint64_t g = mc_load_relaxed(&self.gate_pub)
        cdef uint32_t k = <uint32_t>g       # the low half: the budget; 0 while closed
        cdef int a
        if self.live:
            return self._decide_live(g)
        if k:
            # the hop gate's budget for this window (see _gate_accept): gateway-owned counts
            if g >> 32 != self.gate_epoch:
                self.gate_epoch = g >> 32
                self.gate_used = 0
            if self.gate_used < k:
                self.gate_used += 1
                mc_store_relaxed(&self.gated, self.gated + 1)
                return self.me
        a = cat_sample(&self.mig, &self.rng)
        mc_store_relaxed(&self.cnt_mig[a], self.cnt_mig[a] + 1)
        return a

    cdef int _decide_live(self, uint64_t g) noexcept nogil:
        """``gate_live``: the gate's budget from the own queue now, not at the publish.

        The publish carries K = c - q + h r as a signed 32-bit number (q the tasks here at the
        publish); since then this gateway kept ``gate_used`` arrivals and saw ``gate_done``
        completions (``decide_steal`` is called after each), so the next arrival finds
        q' = q + used - done tasks and waits no longer than a hop while K + done - used >= 1.
        Migrations in and steals are still not counted (no gateway call sees them). With
        ``shed`` >= 0 an arrival that is not kept outright goes to a peer, drawn from the
        published table without the accept outcome, while K + done - used <= T
        (``_shed_threshold``); otherwise it follows the table.
        """
        cdef int a
        cdef int64_t k = _low32(g)
        if g >> 32 != self.gate_epoch:
            self.gate_epoch = g >> 32
            self.gate_used = 0
            self.gate_done = 0
        k += self.gate_done - <int64_t>self.gate_used
        if k >= 1:
            self.gate_used += 1
            mc_store_relaxed(&self.gated, self.gated + 1)
            return self.me
        if k <= _low32(mc_load_relaxed(&self.shed_pub)):
            # the shed rule (see _gate_accept): kept, this arrival would wait longer than a
            # hop plus the peers' wait plus the margin; it goes to a peer drawn from the
            # published distribution without the accept outcome
            a = cat_sample_except(&self.mig, &self.rng, self.me)
            mc_store_relaxed(&self.cnt_mig[a], self.cnt_mig[a] + 1)
            mc_store_relaxed(&self.shed_count, self.shed_count + (a != self.me))
            self.gate_used += a == self.me
            return a
        a = cat_sample(&self.mig, &self.rng)
        mc_store_relaxed(&self.cnt_mig[a], self.cnt_mig[a] + 1)
        self.gate_used += a == self.me      # branch-free: the outcome is random
        return a

    cdef int decide_steal(self, int64_t now) noexcept nogil:
        """After a completion: a peer to steal from, or -1. With ``steal_idle`` (and the live
        gate) a drawn steal from j is dropped unless K + done - used after this completion
        reaches j's bar (``_steal_thresholds``): 1, the open gate, for a victim at or below
        the rack's mean load. A stolen task arrives after a round trip and is put behind the
        tasks here, so taken from the head of such a peer's queue into a queue of its own
        it would wait longer than where it was. A dropped steal counts as "no steal"."""
        cdef int a = cat_sample(&self.stl, &self.rng)
        cdef uint64_t g
        if self.live:
            # a completion: one task fewer here (see _decide_live)
            g = mc_load_relaxed(&self.gate_pub)
            if g >> 32 != self.gate_epoch:
                self.gate_epoch = g >> 32
                self.gate_used = 0
                self.gate_done = 0
            self.gate_done += 1
            if self.steal_idle and a != self.me and (
                    _low32(g) + self.gate_done - <int64_t>self.gate_used
                    < _low32(mc_load_relaxed(&self.steal_pub[a]))):
                a = self.me
            if a != self.me:
                # the own queue here, for this steal's advantage (steal_state="decision"):
                # q + used - done, q the tasks at the publish
                mc_store_relaxed(&self.stl_dq, self.stl_dq
                                 + <uint64_t>(<int64_t>self.gate_used - self.gate_done))
                mc_store_relaxed(&self.stl_dn, self.stl_dn + 1)
        mc_store_relaxed(&self.cnt_stl[a], self.cnt_stl[a] + 1)
        return -1 if a == self.me else a

    # ------------------------------------------------------------ policy thread: publish
    cdef void _gate_accept(self) noexcept nogil:
        """The hop gate: publish K, the arrivals to accept outright until the next publish.

        A migrated task pays at least one hop h (``hop_est``) before it can start anywhere.
        Here, with c workers (``n_workers``, set by the driver), q tasks in the server and
        service rate r (the sum over the workers), the j-th arrival after the publish finds
        q + j - 1 tasks ahead: it starts at once while a worker is idle (q + j <= c), and
        otherwise waits for q + j - c departures, (q + j - c) / r. That is the expected wait
        of M/M/c (exponential service: each departure from a full server takes 1 / r on
        average, whatever the elapsed service), and it ignores the departures during the
        window, which only shorten the later waits; so it is an upper bound of the expected
        wait for exponential service, and an estimate for others (the tasks in service have
        their own residual times). With one worker it is x_me = q / r for the first arrival,
        the rule before workers were counted. So the first K = c - q + h r arrivals are no
        worse off accepted, whatever the peers' state, and the gate opens while the first
        one's wait is within a hop (K >= 1). ``decide_arrival`` accepts them without
        sampling (K rounded down, the fraction carried to the next window while the gate
        stays open, so that the budget is K on average), and the rest follow the published
        distribution (whose probabilities, and so the actors' gradients, the gate leaves
        alone). A budget of arrivals rather than a raised accept probability: with a
        probability, two arrivals close together in one window would both stay, and the
        second waits a whole service time, which costs the tail under heavy-tailed service.
        At light load this keeps the tasks the capacity shares would send a hop for
        nothing; above it every worker is busy with a queue nearly always and K = 0, and
        when a worker is idle K is at most the idle workers + h r (a few of the window's
        arrivals on a busy server).
        """
        cdef double h = self._hop_units() * self.load_scale, r = self.adv[2 * self.n + self.me]
        cdef double c = <double>(self.n_workers if self.n_workers > 1 else 1)
        cdef double k = 0.0, kf, d = 0.0, e
        cdef int64_t off = 0, shed_off = 0
        cdef uint64_t kb = 0
        self._grant_bar(h)
        if h > 0.0 and r > 0.0:
            # q = x_me r: the driver observes load = queue / rate with one read of the rate
            d = self._speed_shift()
            if d < 0.0:
                # The closure below turns a gate that keeps while a worker is idle into one
                # that keeps nothing, so D near -h flips it with every window's reports, and
                # the peers' loads with it (Fig 7.9 (c): the spread's 5 ms mean left a 1.2x
                # band for 67-107 ms after the change in 4 of 10 seeds, and for good in one).
                # Past the point by SPEED_HYST own task times each way, or the state stays.
                e = SPEED_HYST * self.svc_mean_ns
                if self.sp_closed and h + d < e:
                    d = d if h + d < 0.0 else -h - 1.0
                elif not self.sp_closed and -e < h + d < 0.0:
                    d = -h
            self.sp_closed = h + d < 0.0
            self.speed_slower += d < 0.0
            k = c - self.x[self.me] * r + (h + d) * r
            if self.gate_residual and self.svc_lg > 0 and self.svc_mean_ns > 0.0:
                # The first waiting arrival waits for the first departure, and M/M/c's 1 / r
                # for it holds for exponential service only: a task in service has a mean
                # residual of f t, f = (1 + SCV) / 2 (0.5 for constant tasks). With SCV read
                # as (AM / GM)^2 - 1 from the own mean and geometric-mean service times (exact
                # for lognormal, 2.2 for exponential), f = (AM / GM)^2 / 2, taken only below 1
                # (regular service: heavier tails keep M/M/c's bound), and spread over the c
                # workers, the arrivals no worse off kept are (1 - f) / c more. Where a hop
                # is about a task time (10 µs tasks, 9 µs hops) the gate then keeps the
                # arrival that finds one task in service, which then waits half a task, not
                # a hop and the peer's queue (docs/policy.md, item 17).
                e = self.svc_mean_ns / exp2(<double>self.svc_lg / 256.0)
                e = e * e * 0.5
                k += (1.0 - e) / c if e < 1.0 else 0.0
        elif self.gate_live:
            k = -1e9        # no hop or rate known yet: closed, whatever completes
            if r > 0.0:
                # The shed still counts the own queue (a hop unknown counts 0: where clocks
                # differ it never is known): its threshold moves with the closed budget, as
                # it does with the speed rule's. Without this the shed sent every arrival on.
                shed_off = <int64_t>floor(c - self.x[self.me] * r) + 1000000000
        if self.gate_live:
            # signed: a queue beyond the hop closes the gate until enough tasks complete
            k = k if k > -1e9 else -1e9
            k = k if k < 65536.0 else 65536.0
            kf = floor(k)
            if h + d < 0.0:
                # slower than where a migrated task goes, by more than a hop plus the wait
                # there: even an idle worker here finishes later, so no arrival is kept
                # outright; each follows the published table. The budget moves down by
                # SPEED_CLOSED and the shed threshold and steal bars with it, so that they
                # still fire at the same own queue. (Sending every arrival on, the shed
                # rule's path, was worse when measured: four slow one-worker servers' work
                # went to a fifth, faster one-worker server, whose queue then set the p99.
                # The overload mask had taken the big server out of the tables; with item
                # 15's mask the two were within 0.3% there, not run over the sweeps;
                # docs/policy.md, items 14 and 15)
                off = <int64_t>kf + SPEED_CLOSED
                kf = -<double>SPEED_CLOSED
            self._shed_threshold(r, off + shed_off)
            if self.steal_idle:
                self._steal_thresholds(r, off, h + d)
            self.gate_seq += 1
            self.q_gate = self.x[self.me] * r      # q, what used - done counts from
            mc_store_relaxed(&self.gate_pub, ((self.gate_seq & LOW32) << 32) | _low32_of(kf))
            return
        if k >= 1.0 and h + d >= 0.0:
            k += self.gate_carry
            k = 65536.0 if k > 65536.0 else k
            kb = <uint64_t>k
            self.gate_carry = k - <double>kb
        else:
            self.gate_carry = 0.0
        self.gate_seq += 1
        mc_store_relaxed(&self.gate_pub, ((self.gate_seq & LOW32) << 32) | kb)

    cdef double _speed_shift(self) noexcept nogil:
        """D <= 0 (ns), what the hop gate adds to the hop when this server is slower than
        the peers its migrated tasks go to (``speed_band``; docs/policy.md, item 14).

        A kept task runs here in t (``svc_mean_ns``); a migrated one waits the hop, then
        w_j = max(0, x_j + 1 / r_j - t_j) at peer j (the M/M/c wait of one more task, from
        its reported load and rate), then runs in t_j = t g_j / g_me (g the geometric-mean
        service times the heartbeats carry, ``observe_completions``). With rho and w the means of
        g_j / g_me and w_j weighted by the published probabilities, the j-th arrival is no
        worse off kept while its wait is at most h + D, D = t (rho b - 1) + w, b =
        ``speed_band`` (ratios within b of 1 are taken as noise, and the shrink keeps D
        continuous at the band's edge). So a slow server sends work on even with idle
        workers. Only D < 0 is applied, scaled by 1 - u, u the peers' busy fraction (their
        tasks per worker, each at most 1, weighted alike): a faster server that keeps more,
        or a slow one that closes its gate outright on busy peers, herds the rack's work
        onto them on reports a window old (on 60 random racks of mixed speeds that cost up
        to 1.6x the p99). The fade, not a cut at u = 0.5 (the nineteenth session's rule),
        keeps what a slow server gains beside half-busy peers without a step in D that the
        peers' reports cross from one window to the next (docs/policy.md, item 14). 0 with
        b = 0 or no speed known. While no known code is below the own by more than the band
        (their least, one pass the compiler vectorizes), no weighted mean of the ratios is
        below 1 / b: no exp2.
        """
        cdef int j, n = self.n, me = self.me, lg = self.svc_lg, bl = self.speed_band_lg
        cdef const uint16_t* pc = self.pcode
        cdef double b = self.speed_band, pw = 0.0, rw = 0.0, ww = 0.0, uw = 0.0, p, rho, rj, wj
        cdef double t = self.svc_mean_ns
        cdef const double* rate = self.adv + 2 * n
        if bl < 0 or lg == 0:
            return 0.0
        # the least known code (0, not known, as pc[me] is, never is the least)
        if lg - mc_pub_code_min(pc, n) <= bl:
            return 0.0
        for j in range(n):
            p = self.pm_pub[j]
            if j != me and pc[j] != 0 and p > 0.0:
                rj = mc_speed_ratio(<int>pc[j], lg)
                pw += p
                rw += p * rj
                # the wait there: (q_j + 1 - c_j) / r_j = x_j + 1 / r_j - t_j, t_j = t rj
                wj = self.x[j] + (1.0 / rate[j] if rate[j] > 0.0 else 0.0) - t * rj
                ww += p * (wj if wj > 0.0 else 0.0)
                wj = self.x[j] / (t * rj)
                uw += p * (wj if wj < 1.0 else 1.0)
        if not (pw > 0.0):
            return 0.0      # the codes beyond the band are of peers the table never picks
        rho = rw / pw
        if rho * b < 1.0 and uw < pw:
            rho = (t * (rho * b - 1.0) + ww / pw) * (1.0 - uw / pw)
            return rho if rho < 0.0 else 0.0
        return 0.0

    cdef void _shed_threshold(self, double r, int64_t off) noexcept nogil:
        """The shed rule's threshold T (published in ``shed_pub``): the gateway sends an
        arrival to a peer, whatever the draw, while the live budget is <= T.

        The live budget is K' = c - q' + h r (q' the tasks here now), so the next arrival kept
        would wait (q' + 1 - c) / r = (h r - K' + 1) / r. A migrated one waits the hop h and
        then, at a peer drawn from the published distribution, about that peer's load x_j
        (tasks / rate, an upper bound: it counts the tasks in service). Keeping is worse by
        more than ``shed`` own task times when K' < -r w - shed + 1, w = the peers' mean x
        weighted by the published probabilities. The margin is the lesser of ``shed`` and
        ``shed_runaway`` per worker (16, the runaway reset's bar: a guard, where the table
        keeps an arrival into a queue it cannot serve; a hot entry server, most clients
        sending to it, kept about half at the start and ran away, and each reset of its
        actors put it back there). No peer outcome, no rate, or neither margin: never.
        Stored before the budget (``gate_pub``), each in its own relaxed store: a gateway
        between the two reads one arrival's T with the previous window's budget, inputs a
        window apart, as every rule here has.
        """
        cdef int j, n = self.n, me = self.me
        cdef double pw = 0.0, xw = 0.0, t = SHED_NEVER, m = self.shed, mr
        if self.shed_runaway > 0.0:
            mr = self.shed_runaway * (self.n_workers if self.n_workers > 1 else 1)
            m = mr if m < 0.0 or mr < m else m
        if m >= 0.0 and r > 0.0:
            for j in range(n):
                if j != me:
                    pw += self.pm_pub[j]
                    xw += self.pm_pub[j] * self.x[j]
            if pw > 1e-12:
                t = floor(1.0 - r * xw / pw - m)
                t = t - <double>off if t > -1e9 else SHED_NEVER
                t = t if t > -2e9 else SHED_NEVER       # (int32's range, with the offsets)
        mc_store_relaxed(&self.shed_pub, _low32_of(t))

    cdef void _steal_thresholds(self, double r, int64_t off, double hd) noexcept nogil:
        """``steal_idle``'s bar per victim j (``steal_pub``): a drawn steal goes ahead while
        the live budget K' >= 1 - r e_j, e_j = max(0, x_j - the rack's mean x), x the loads
        the heartbeats reported (tasks / rate, ns).

        K' >= 1 is the open gate: a task stolen now would wait here no longer than a hop.
        A victim loaded above the mean by e_j lowers the bar by what e_j is in own tasks:
        the stolen task may wait here up to a hop plus e_j. Only the gate, and a server
        whose queue runs away (an overloaded share of the arrivals, a slowed server) keeps
        it while every peer is busy: at 0.91 load under uneven client shares the frozen
        start ran away (p99 424 ms) where these bars keep it at the default's. Unknown
        peers and no rate: the gate's bar, 1.
        """
        cdef int j, n = self.n, k = mc_pub_count_known(self.known, n)
        cdef double xm = 0.0
        # x_j is 0 while j is unknown (nothing writes it before known_j), so this is the mean
        # of the known loads summed as mc_pub_migrate_weights sums the mask's, and an unknown
        # peer is never above it
        for j in range(n):
            xm += self.x[j]
        xm /= <double>(k if k > 0 else 1)
        # closed for speed (off > 0): the same own queue, unless even an idle worker here
        # finishes the stolen task later than j would (hop + speed + e_j < 0): never
        mc_pub_steal_bars(self.x, n, xm, r, <double>off, hd, STEAL_NEVER, self.steal_pub)

    cdef bint grant_steal(self, int64_t now, double waiting, double rate) noexcept nogil:
        """The victim's side of a steal: give the oldest waiting task only if the waiting
        work, ``waiting / rate``, is at least ``steal_grant`` one-way hops plus
        ``grant_tasks`` own mean task times x the peers' fraction with no worker idle
        (``_grant_bar``). Below the hops the task would start here before it could reach
        the thief, so the move saves less than its transfer costs. The task times are the
        thief's side: a server that has just gone idle takes on a whole task, and its own
        next arrivals then queue behind it or move on (docs/policy.md, items 13 and 16).
        Refusals are counted in ``grant_refused``."""
        cdef uint64_t bar = mc_load_relaxed(&self.grant_pub)
        if bar == 0 or waiting >= <double>bar * rate:
            return True
        mc_store_relaxed(&self.grant_refused, self.grant_refused + 1)
        return False

    cdef void _grant_bar(self, double h) noexcept nogil:
        """Publish the bar of ``grant_steal``: ``steal_grant`` hops of ``h`` ns plus
        ``grant_tasks`` own mean task times t times u, the peers' fraction with no worker
        idle (once completions have measured t); 0 (every steal granted) while no hop is
        known.

        The stolen task keeps a worker of the thief, a server that has just gone idle, busy
        for about t. Its own next arrivals pay for that only where it has no other worker
        idle, and then wait behind the task or move on: as often as that, so u t. u is the
        share of the peers, weighted by their rates, whose tasks (x_j r_j) fill their
        workers (r_j t_j, t_j = t at j's speed code, which rate and code measure with noise:
        half a task of slack). On one-worker racks that is a peer with a task; a peer with an
        idle worker among busy ones is not counted (its tasks per worker were, until the
        thirtieth session: many-worker victims then refused steals until a task time of
        queue had built up). With two hops alone a two-worker victim with one waiting task
        grants, and on a homogeneous rack of regular tasks most steals then cost the thief
        more than they save (32x2, constant 30 µs tasks at 0.9: p99 151 µs against JBT's
        118, 124 with the bar)."""
        cdef double b = 0.0, t = self.svc_mean_ns
        cdef double s[2]
        if h > 0.0:
            b = self.steal_grant * h
            if t > 0.0 and self.grant_tasks > 0.0:
                # sum_j r_j [tasks_j + 1/2 >= workers_j] / sum_j r_j, in own task times: its
                # workers at its speed (ours where a code is not known: the ratio at d = 0
                # is 1, exactly), a table read (mc_speed_ratio_d); s = the two sums
                mc_pub_grant_share(self.x, self.adv + 2 * self.n, self.pcode, self.n, self.me,
                                   t, self.svc_lg, s)
                if s[0] > 0.0:
                    b += self.grant_tasks * t * s[1] / s[0]
        mc_store_relaxed(&self.grant_pub, <uint64_t>(b if b < 1e15 else 1e15))

    cdef int _unshared_config(self, dict cfg) except -1:
        """The parameters of the decisions from state the agents do not share (``__init__``)."""
        cdef int j
        self.gate_live = cfg["gate_live"]
        self.shed = cfg["shed"]
        self.shed_runaway = cfg["shed_runaway"]
        self.steal_idle = cfg["steal_idle"]
        self.steal_state = cfg["steal_state"]
        self.stl_at_decision = self.steal_state == "decision"
        self.steal_grant = cfg["steal_grant"]
        self.grant_tasks = cfg["grant_tasks"]
        self.speed_band = cfg["speed_band"]
        self.gate_residual = cfg["gate_residual"]
        self.stolen_first = cfg["stolen_first"]
        self.speed_band_lg = -1         # off: _speed_shift returns 0 at once
        if self.speed_band >= 1.0:
            self.speed_band_lg = <int>floor(256.0 * log2(self.speed_band))
        mc_store_relaxed(&self.grant_pub, 0)        # no hop known yet: every steal granted
        mc_store_relaxed(&self.shed_pub, _low32_of(SHED_NEVER))
        for j in range(self.n):
            mc_store_relaxed(&self.steal_pub[j], _low32_of(1.0))     # the open gate's bar
        # only the gate's publish (hop_gate, set before) renews the budget the live gateway
        # counts from
        self.live = self.gate_live and self.hop_gate
        return 0
