# cython: language_level=3
"""What one Malcolm agent holds and observes (the state under ``MalcolmPolicy``).

``AgentState`` owns the agent's memory (parameter blocks, AdamW moments, the published
distributions) and everything the agent learns about its rack: its own load, the heartbeats'
loads, rates, counts and critics (with their sanity clamps), the sorted loads and what is
derived from them in O(n) or O(log n): the critic's features and the one-decision
advantages. The gateway's decisions (``decide_*``: the gate and the other rules from the own
queue) are in ``gateway_rules.pyx``; how the agent learns, agrees with its peers, guards
itself and publishes is in ``actor_critic.pyx``. ``GatewayRules`` is the only subclass.

Threads: everything here runs on the policy thread, except the fields the gateway owns
(``gateway_rules.pyx`` says which).
"""
from libc.math cimport INFINITY, exp, fabs, log, pow, sqrt
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from malcolm._core cimport (
    cat_free, cat_init, cat_set_inputs, cat_set_params, cat_update, mc_aligned_alloc,
    mc_load_relaxed,
)
from malcolm.policy.base cimport MAX_SVC_LG, MAX_THETA, Heartbeat, Policy
from malcolm.policy._adv_kernels cimport mc_adv_in, mc_adv_outcomes, mc_adv_set_scalar
from malcolm.policy._pub_kernels cimport (
    mc_busy_share, mc_pub_actor_inputs, mc_pub_count_known, mc_pub_count_pos,
    mc_peer_moves, mc_pub_scaled_loads,
    mc_pub_learned_logits, mc_pub_migrate_weights, mc_pub_steal_weights, mc_speed_tab_init,
)


cdef extern from "policy/_sort_kernels.h" nogil:
    enum: MC_SORT_MAX                   # srt's slots (mc_absdev64 searches all of them)
    void mc_sort_pairs(double* key, int* idx, int k) noexcept nogil
    double mc_absdev64(const double* v, const double* pre, int k, double a) noexcept nogil
    double mc_absdev_at(const double* pre, int k, double a, int lo) noexcept nogil
    void mc_herd_scales(const double*, const double*, int, int, double, double*, double*)


# Sane bounds on heartbeat-derived inputs (issue 13): 1000 s of queued work, 1e9 tasks in a
# server, 1e9 tasks per second of service rate, 1e6 tasks moved between two heartbeats.
cdef double LOAD_MAX_NS = 1e12
cdef double QUEUE_MAX = 1e9
cdef double RATE_MAX = 1.0
# the own speed (observe_completions): completions its sums weigh (1/e decay), and the least sent
cdef double SPEED_TASKS = 512.0
cdef double SPEED_MIN = 64.0
cdef double LN2 = 0.6931471805599453
mc_speed_tab_init()     # this module's copy of mc_speed_ratio's table, before any policy
cdef enum:
    COUNT_JUMP_MAX = 1000000    # the most one peer's count may move in a window (_peer_moves)


cdef inline double _store_load(AgentState s, int j, double load) noexcept nogil:
    """Server j's load (ns, >= 0) and its scaled, clipped input, which mc_pub_scaled_loads
    computes alike; returns the input (_set_load: the own load, and the dense actors')."""
    cdef double v = load / s.load_scale
    if v > s.load_clip:
        v = s.load_clip
    s.x[j] = load
    s.u[j] = v
    s.known[j] = 1
    s.sorted_ok = False
    return v


cdef inline double* _dalloc(Py_ssize_t n) noexcept nogil:
    cdef double* p = <double*>mc_aligned_alloc(64, sizeof(double) * (n if n > 0 else 1))
    if p != NULL:
        memset(p, 0, sizeof(double) * (n if n > 0 else 1))
    return p


cdef inline void* _zalloc(Py_ssize_t nbytes) noexcept nogil:
    cdef void* p = mc_aligned_alloc(64, nbytes if nbytes > 0 else 8)
    if p != NULL:
        memset(p, 0, nbytes if nbytes > 0 else 8)
    return p


def _scalar_advantages(bint on):
    """Tests: ``_marginal_advantages``' outcomes on the scalar path (``_adv_kernels.h``)."""
    mc_adv_set_scalar(on)


cdef class AgentState(Policy):
    """The state of a Malcolm agent; construct ``MalcolmPolicy``, its only subclass."""

    def __init__(self, *args, **kwargs):
        raise TypeError("AgentState is the state of MalcolmPolicy: construct MalcolmPolicy")

    cdef int _alloc(self, int d) except -1:
        """Allocate every array for ``n`` servers and ``d`` critic features (all zero)."""
        cdef int n = self.n, me = self.me, npar, i, wsz
        self._release()
        self.n_theta = d
        # the sparse actors hold only what they use (see the .pxd): 6n weights and biases
        # instead of 2 (n^2 + n), so their AdamW steps and guards read contiguous runs, not a
        # diagonal one cache line per element (a third of those steps' time on 64 servers)
        wsz = 2 * n if self.sparse else n * n
        self.wcol = n if self.sparse else me * n
        self.wdiag = 1 if self.sparse else n + 1
        self.off_wm = d
        self.off_bm = d + wsz
        self.off_ws = d + wsz + n
        self.off_bs = d + 2 * wsz + n
        npar = d + 2 * (wsz + n)
        self.n_mem = npar
        self.n_params = d + 2 * (n * n + n)
        self.P = _dalloc(npar)
        self.P0 = _dalloc(npar)
        self.logit = _dalloc(n)
        self.med = _dalloc(MAX_SERVERS * 8)     # MC_MED_ROWS rows of MC_MED_W (_select.h)
        self.g_pub = _dalloc(2 * n)
        self.act = _dalloc(6 * n)
        self.tl = _dalloc(n)
        self.srt = _dalloc(MC_SORT_MAX)     # >= n slots
        self.pre = _dalloc(n + 1)
        self.fv = _dalloc(n)
        self.gdiag = _dalloc(2 * n)
        self.ord = <int*>_zalloc(sizeof(int) * n)
        self.pos = <int*>_zalloc(sizeof(int) * n)
        self.G = _dalloc(npar)
        self.M = _dalloc(npar)
        self.V = _dalloc(npar)
        self.x = _dalloc(n)
        self.u = _dalloc(n)
        self.u_pub = _dalloc(n)
        self.feat_prev = _dalloc(d)
        self.feat_cur = _dalloc(d)
        self.pm_pub = _dalloc(n)
        self.ps_pub = _dalloc(n)
        self.coef = _dalloc(n)
        self.adv = _dalloc(3 * n)
        self.peer_row = (sizeof(PeerRec) // 8 + d + 7) // 8 * 8    # whole 64-byte lines
        self.peer_rows = _dalloc(<Py_ssize_t>n * self.peer_row)
        self.pseq = <uint32_t*>_zalloc(sizeof(uint32_t) * 2 * n)
        self.pcnt = <uint64_t*>_zalloc(sizeof(uint64_t) * 2 * n)
        self.pbase = <uint64_t*>_zalloc(sizeof(uint64_t) * 2 * n)
        self.known = <uint8_t*>_zalloc(n)
        self.pcode = <uint16_t*>_zalloc(sizeof(uint16_t) * n)
        self.pbeat = _dalloc(2 * n)
        self.cnt_mig = <uint64_t*>_zalloc(8 * n)
        self.cnt_stl = <uint64_t*>_zalloc(8 * n)
        self.seen_mig = <uint64_t*>_zalloc(8 * n)
        self.seen_stl = <uint64_t*>_zalloc(8 * n)
        if (self.P == NULL or self.P0 == NULL or self.logit == NULL or self.med == NULL
                or self.srt == NULL or self.g_pub == NULL or self.pre == NULL
                or self.act == NULL or self.tl == NULL or self.fv == NULL
                or self.gdiag == NULL
                or self.ord == NULL or self.pos == NULL
                or self.G == NULL or self.M == NULL or self.V == NULL
                or self.x == NULL or self.u == NULL or self.u_pub == NULL
                or self.feat_prev == NULL or self.feat_cur == NULL or self.pm_pub == NULL
                or self.ps_pub == NULL or self.coef == NULL or self.adv == NULL
                or self.peer_rows == NULL or self.known == NULL or self.pcode == NULL
                or self.pseq == NULL or self.pcnt == NULL or self.pbase == NULL
                or self.pbeat == NULL
                or self.cnt_mig == NULL or self.cnt_stl == NULL or self.seen_mig == NULL
                or self.seen_stl == NULL):
            self._release()
            raise MemoryError("MalcolmPolicy: out of memory")
        if cat_init(&self.mig, n, n) != 0 or cat_init(&self.stl, n, n) != 0:
            self._release()
            raise MemoryError("MalcolmPolicy: cannot allocate the actors' distributions")
        self.cats_ready = True
        self.b1t = 1.0
        self.b2t = 1.0
        self.adam_steps = 0
        self.known[me] = 1        # our own load is always known (0 until observe_local)
        for i in range(MC_SORT_MAX):
            self.srt[i] = INFINITY                # see _sort_loads
        for i in range(n):
            self.ord[i] = i
        return 0

    def __dealloc__(self):
        self._release()

    cdef void _release(self) noexcept:
        if self.cats_ready:
            cat_free(&self.mig)
            cat_free(&self.stl)
            self.cats_ready = False
        free(self.P)
        free(self.P0)
        free(self.logit)
        free(self.med)
        free(self.g_pub)
        free(self.act)
        free(self.tl)
        free(self.srt)
        free(self.pre)
        free(self.fv)
        free(self.gdiag)
        free(self.ord)
        free(self.pos)
        free(self.G)
        free(self.M)
        free(self.V)
        free(self.x)
        free(self.u)
        free(self.u_pub)
        free(self.feat_prev)
        free(self.feat_cur)
        free(self.pm_pub)
        free(self.ps_pub)
        free(self.coef)
        free(self.adv)
        free(self.peer_rows)
        free(self.pseq)
        free(self.pcnt)
        free(self.pbase)
        free(self.known)
        free(self.pcode)
        free(self.pbeat)
        free(self.cnt_mig)
        free(self.cnt_stl)
        free(self.seen_mig)
        free(self.seen_stl)
        self.P = self.P0 = self.logit = self.med = self.G = self.M = self.V = NULL
        self.srt = self.pre = self.g_pub = self.act = self.tl = self.fv = self.gdiag = NULL
        self.ord = self.pos = NULL
        self.x = self.u = self.u_pub = self.feat_prev = self.feat_cur = NULL
        self.pm_pub = self.ps_pub = self.coef = self.adv = self.peer_rows = NULL
        self.known = NULL
        self.pseq = NULL
        self.pcode = NULL
        self.pbeat = NULL
        self.n_stale = 0
        self.cnt_mig = self.cnt_stl = self.seen_mig = self.seen_stl = self.pcnt = self.pbase = NULL

    # ------------------------------------------------------------ policy thread
    cdef void _actor_inputs(self, double* z) noexcept nogil:
        """The actors' current input vector.

        sparse: z_j = u_j - mean of the known u (0 for unknown servers): deviations from the
        rack's mean, so that a busy rack does not scale every logit with its load level.
        full: u, or u_j - u_me for known peers (0 elsewhere) with actor_input="relative".
        """
        cdef int j, n = self.n
        if self.sparse:
            # in C (_pub_kernels.h), the same operations. Deviations beyond ZCLIP tasks carry
            # no more information (the mask handles overloaded servers), and bounded inputs
            # keep logits bounded
            mc_pub_scaled_loads(self.x, self.u, n, self.load_scale, self.load_clip)
            if self.n_stale > 0 and self.n_stale >= mc_pub_count_known(self.known, n) - 1:
                memset(z, 0, sizeof(double) * n)    # every report stale: none steers (item 22)
                return
            mc_pub_actor_inputs(self.u, self.known, z, n, ZCLIP)
            return
        if not self.rel_input:
            memcpy(z, self.u, sizeof(double) * n)
            return
        for j in range(n):
            z[j] = self.u[j] - self.u[self.me] if (j != self.me and self.known[j]) else 0.0

    cdef void _sort_loads(self) noexcept nogil:
        """srt <- the known loads v = x / load_scale (unclipped), sorted, +inf after them in
        its 64 slots; pre <- prefix sums: each one-decision change costs O(log n), not O(n)."""
        cdef int j, k = 0, a, t, n = self.n
        cdef bint all_known
        cdef double inv = 1.0 / self.load_scale
        cdef int* o = self.ord
        cdef double* key = self.srt
        if self.sorted_ok:
            return
        # The known servers are first compacted into o[:k] with their loads in srt[:k]
        # (in last sort's order, so that unknown servers keep their places after them),
        # then sorted in one vectorized rank sort (_sort_kernels.h). All known: no tests.
        all_known = mc_pub_count_known(self.known, n) == n
        for j in range(n):
            t = o[j]
            if all_known or self.known[t]:
                o[k] = t
                key[k] = self.x[t]
                k += 1
        mc_sort_pairs(key, o, k)
        # unknown servers keep their places after the known ones
        a = k
        for j in range(0 if k < n else n, n):
            if not self.known[j]:
                o[a] = j
                a += 1
        for j in range(k):
            key[j] = key[j] * inv
            self.pos[o[j]] = j
        for j in range(k, self.nsrt):   # slots that held loads (_alloc set all to +inf)
            key[j] = INFINITY           # for mc_absdev64: never below a load
        self.pre[0] = 0.0
        for j in range(k):
            self.pre[j + 1] = self.pre[j] + self.srt[j]
        self.nsrt = k
        self.sorted_ok = True

    cdef void _marginal_advantages(self, bint do_mig, bint do_stl) noexcept nogil:
        """Per-outcome one-decision changes of the potential at the current state (adv).

        With v = x / load_scale (known servers, unclipped) and s_j one task's load on j,
        I(v + d) - I(v) for a d touching one or two servers, through
        F(a) = sum_k |a - v_k| over the sorted loads: O(log n) per outcome. Outcomes the
        published distribution gives probability 0 (masked) get no gradient and are skipped,
        and so is an actor that took no decision in the window (``do_mig``, ``do_stl``).
        With ``herd`` > 0 a peer's load first takes what the rack would send it if every
        agent migrated as this one does (``mc_herd_scales``), scaled by ``mc_busy_share``.
        """
        cdef int n = self.n, me = self.me, i, p, lo, k
        cdef double* am = self.adv
        cdef double* st = self.adv + n
        cdef const double* rate = self.adv + 2 * n
        cdef double sme, vme, vs, norm, inv = 1.0 / self.load_scale, fme, fme_up
        cdef double hop = self._hop_units() * self.hop_weight
        cdef double hc = self.hop_cap if self.hop_cap > 0.0 else INFINITY
        cdef double cmig = self.migration_cost + hop, cstl = self.steal_cost + hop
        cdef double* fv = self.fv
        cdef const double* srt = self.srt
        cdef const double* pre = self.pre
        cdef double hq = 0.0, hcs = 0.0          # the herd term's scales (herd > 0)
        cdef mc_adv_in a
        self._sort_loads()
        k = self.nsrt
        norm = 2.0 / (self.nsrt - 1) if self.nsrt > 1 else 0.0
        # F(v_i) at every known load in one O(n) pass, instead of two binary searches per
        # outcome (the migrate and the steal loop each needed it): v_i = srt[pos[i]] (the
        # same product x_i * inv), and the loads below it are those before its run of
        # equal loads in srt, which is what mc_count_below would return, so every F(v_i)
        # has the bits mc_absdev(v_i) gives
        lo = 0
        for p in range(k):
            lo = p if p == 0 or srt[p - 1] < srt[p] else lo
            fv[p] = mc_absdev_at(pre, k, srt[p], lo)
        sme = 1.0 / (rate[me] * self.load_scale) if rate[me] > 0.0 else 1.0
        vme = self.x[me] * inv
        fme = fv[self.pos[me]]
        fme_up = mc_absdev64(srt, pre, k, vme + sme)
        if self.herd > 0.0 and do_mig:      # hq: first the term's weight (mc_herd_scales' hm)
            hq = self.herd * self.rack_mig * pow(mc_busy_share(
                self.x, rate, self.pcode, n, me, self.svc_mean_ns, self.svc_lg), self.herd_busy)
            mc_herd_scales(self.pm_pub, rate, n, me, hq, &hq, &hcs)
        # migrate: the task goes to i (i = me: accepted here), over k != i
        # sum |vi + si - vk| - |vi - vk| = F(vi + si) - si - F(vi).
        # steal: one task moves from i to me (i = me: nothing moves). Over k != i, me:
        # sum |a - vk| = F(a) - |a - vi| - |a - vme|. Our own terms at vs, our load where the
        # steals went ahead (steal_state="decision"; vme otherwise): with steal_idle a steal
        # goes ahead after a completion that left a worker idle, a state the window's end
        # does not sample. Credited at the end, a many-worker server's steals from one-worker
        # servers looked like adding to a queue, and its actor learnt to stop stealing
        # (docs/policy.md, "The default policy", item 12).
        a.fme, a.fme_up = fme, fme_up
        vs = self._steal_load(vme, sme)
        if vs != vme:
            # F at vs and vs + sme with the sorted loads' own term |a - vme| swapped for the
            # |a - vs| (= sme at a = vs + sme) that the loop takes off as k = me's
            a.fme = mc_absdev64(srt, pre, k, vs) - fabs(vs - vme)
            a.fme_up = mc_absdev64(srt, pre, k, vs + sme) - fabs(vs + sme - vme) + sme
        # every peer's two outcomes in C, four at a time (_adv_kernels.h)
        a.srt, a.pre, a.fv, a.x, a.rate, a.pos = srt, pre, fv, self.x, rate, self.pos
        a.known, a.pm, a.ps, a.n, a.me, a.k = self.known, self.pm_pub, self.ps_pub, n, me, k
        a.herd, a.do_mig, a.do_stl = self.herd > 0.0, do_mig, do_stl
        a.inv, a.ls, a.norm, a.hq, a.hcs = inv, self.load_scale, norm, hq, hcs
        a.mcost, a.scost, a.cstl, a.hop, a.hc = self.migration_cost, self.steal_cost, cstl, hop, hc
        a.sme, a.vme, a.vs = sme, vme, vs
        mc_adv_outcomes(&a, am, st)
        am[me] = -norm * (fme_up - sme - fme)
        for i in range(n if k < n else 0):     # k < n: some server is unknown
            if not self.known[i]:
                am[i] = am[me] - cmig      # no information: accepting, plus the cost

    cdef void _fold_gdiag(self, double* g, bint clear) noexcept nogil:
        """g (flat like ``G``) += the sparse actors' diagonal gradients held in ``gdiag``,
        which ``clear`` then zeroes (G's diagonal is 0 until the fold: the same sums)."""
        cdef int j, n = self.n
        if not self.sparse:
            return
        for j in range(n):
            g[self._wd(self.off_wm, j)] += self.gdiag[j]
            g[self._wd(self.off_ws, j)] += self.gdiag[n + j]
        if clear:
            memset(self.gdiag, 0, sizeof(double) * 2 * n)

    cdef void _decisions_counted(self) noexcept nogil:
        """The snapshot the next window's decisions are counted from: taken only before a
        window that reads it (a learning step's, with ``learn_every`` > 1 one window in
        learn_every; every window while frozen or with advantage="marginal" or "td")."""
        cdef int j
        for j in range(self.n):
            self.seen_mig[j] = mc_load_relaxed(&self.cnt_mig[j])
            self.seen_stl[j] = mc_load_relaxed(&self.cnt_stl[j])
        self.stl_dq_seen = mc_load_relaxed(&self.stl_dq)
        self.stl_dn_seen = mc_load_relaxed(&self.stl_dn)

    cdef void _peer_moves(self, uint64_t* mig, uint64_t* stl) noexcept nogil:
        """The migrations and steals the peers reported since the last call (a window): per
        peer, its latest cumulative count less the one at the last call, 0 where it went
        down, at most COUNT_JUMP_MAX (a jump beyond what a server can move in a window is a
        lie: clamped, and counted in ``hb_clamped``)."""
        cdef uint64_t big = 0
        mc_peer_moves(self.pcnt, self.pbase, self.n, COUNT_JUMP_MAX, mig, stl, &big)
        self.hb_clamped += big

    cdef double _steal_load(self, double vme, double sme) noexcept nogil:
        """The own load the window's steals are credited at: vme, the window's end, or with
        ``steal_state="decision"`` and the live gate the mean own queue where the steals
        went ahead (the tasks at the publish + the mean of used - done), in tasks of sme."""
        cdef uint64_t m = mc_load_relaxed(&self.stl_dn) - self.stl_dn_seen
        cdef double q
        if m == 0 or not (self.stl_at_decision and self.live):
            return vme
        q = self.q_gate + (<double>(<int64_t>(mc_load_relaxed(&self.stl_dq) - self.stl_dq_seen))
                           / <double>m)
        return (q if q > 0.0 else 0.0) * sme

    cdef void _set_load(self, int j, double load) noexcept nogil:
        cdef double v
        cdef int k
        if not (load >= 0.0):       # NaN or negative: an estimator glitch, not a load
            load = 0.0
        v = _store_load(self, j, load)
        if self.sparse:
            return              # logits are computed at publish, O(n)
        if not self.rel_input:
            cat_update(&self.mig, j, v)
            cat_update(&self.stl, j, v)
        elif j != self.me:
            cat_update(&self.mig, j, v - self.u[self.me])
            cat_update(&self.stl, j, v - self.u[self.me])
        else:
            # our own load moved every relative input: O(n^2), once per window
            for k in range(self.n):
                if k != self.me and self.known[k]:
                    cat_update(&self.mig, k, self.u[k] - v)
                    cat_update(&self.stl, k, self.u[k] - v)

    # ------------------------------------------------------------ what _publish weighs
    cdef void _learned_logits(self) noexcept nogil:
        """g_pub <- the learned logit parts (what the actors add to the safe start) of both
        actors at the inputs u_pub: sparse, B_j + W_jj z_j + W_j,me z_me from the gathered
        block ``act`` (W_me,me counted once: its column-me entry there is 0)."""
        cdef int n = self.n, j
        cdef double* g = self.g_pub
        if self.sparse:
            mc_pub_learned_logits(self.act, self.u_pub, g, n, self.me)    # in C, the same
        else:
            for j in range(n):
                g[j] = self.mig.f[j]
                g[n + j] = self.stl.f[j]

    cdef void _tilt_logits(self) noexcept nogil:
        """tl_j <- log r_j - the peers' mean log rate, for the peers j with a rate (0 for
        the others and for accepting); the migrate actor's learnt logits g_pub += tilt * tl.

        The learnt preference is then a function of what a peer is (its rate relative to
        the other peers'), not of which peer it is: one scalar, learnt from the gradient of
        every outcome of every decision, and a rate change moves every logit at once.
        Accepting is left out (and the peers' logs centred) so that the tilt only shares the
        migrated tasks out differently; how many to keep is the accept bias's job (a tilt
        that also moved accepting learnt "keep more", opposite signs on big and small
        servers). n logs per window, only with ``tilt_lr`` > 0.
        """
        cdef int n = self.n, me = self.me, j, k = 0
        cdef double sl = 0.0
        cdef const double* rate = self.adv + 2 * n
        for j in range(n):
            if j != me and self.known[j] and rate[j] > 0.0:
                self.tl[j] = log(rate[j])
                sl += self.tl[j]
                k += 1
            else:
                self.tl[j] = 0.0
        sl = sl / k if k > 0 else 0.0
        for j in range(n):
            if j != me and self.known[j] and rate[j] > 0.0:
                self.tl[j] -= sl
                self.g_pub[j] += self.tilt * self.tl[j]

    @property
    def tilt_grad(self):
        """The capacity tilt's descent gradient cached in the current batch."""
        return self.tilt_g

    @property
    def tilt_inputs(self):
        """What the tilt multiplies at the last publish: log r_j - the peers' mean log
        rate (0 for accepting, for peers without a rate, and with ``tilt_lr=0``)."""
        return [self.tl[j] for j in range(self.n)]

    def stats(self):
        """The agent's counters and what it derived, as one JSON-ready dict: what
        ``malcolm serve --stats-json`` reports under ``policy`` and ``malcolm sim --json``
        per server under ``policy_stats``, so that the guards are seen where they fire.

        ``windows``, ``batches`` (learning steps), ``consensus_rounds``; the guards:
        ``resets`` (runaway resets of the actors), ``consensus_rejected`` (peers' critics
        refused), ``hb_clamped`` (heartbeat fields clamped), ``trust_clips``, ``masked``
        (migrate outcomes masked at publish), ``gated`` (arrivals the hop gate kept),
        ``shed_count`` (arrivals sent away by the overload rule), ``speed_slower``; and
        ``load_scale_ns``, ``hop_ns`` (the one-way hop cost charged), ``svc_mean_ns``,
        ``learn``, ``hb_lost`` (peers' heartbeats lost, by their sequence numbers),
        ``stale_peers`` (stale reports now, item 22). Read while the policy thread runs,
        each value is whole but the set is not one instant."""
        return {"windows": self.windows, "batches": self.batches,
                "consensus_rounds": self.consensus_rounds, "resets": self.resets,
                "consensus_rejected": self.consensus_rejected, "hb_clamped": self.hb_clamped,
                "trust_clips": self.trust_clips, "masked": self.masked, "gated": self.gated,
                "shed_count": self.shed_count, "speed_slower": self.speed_slower,
                "load_scale_ns": self.load_scale,
                "hop_ns": self.hop_est if self.auto_hop else self.hop_ns,
                "svc_mean_ns": self.svc_mean_ns, "learn": bool(self.learn),
                "hb_lost": self.hb_lost, "stale_peers": self.n_stale}

    cdef void _migrate_weights(self, double* w) noexcept nogil:
        """w <- the migrate outcomes' weights: the capacity prior (the softmax of g + log w is
        w exp(g) / sum(w exp(g))), 0 where the overload mask applies (counted in ``masked``).

        Accepting weighs r_me / mean rate (with the start's accept bias log n: n r_me), the
        peers together sum_{j != me} r_j, shared in proportion to the capacity each has left
        after keeping its own accepted arrivals, s_j ~ r_j^2 / (R + (k-1) r_j) (see
        ``MalcolmPolicy.__init__``). With the speed codes known (the own ``svc_lg`` and
        j's), the mask spares a peer with a worker idle (x_j at most its task time, ``t_j``
        = ``svc_mean_ns`` scaled by the codes) and one whose next task would finish no later
        than one kept here (x_j + t_j <= x_me + t_me): tasks in service count in x, so a
        many-worker server with no queue stood far above peers left empty (docs/policy.md,
        "The default policy", item 15).
        """
        # in C (_pub_kernels.h): the same operations, branch-free so that they vectorize
        self.masked += mc_pub_migrate_weights(self.x, self.adv + 2 * self.n, self.known, w,
                                              self.n, self.me, self.load_scale,
                                              self.capacity_prior, self.mask_factor,
                                              self.pcode, self.svc_lg, self.svc_mean_ns)

    cdef void _steal_weights(self, double* w) noexcept nogil:
        """w <- 1 for the steal outcomes, 0 for the peers not busier than us (the mask)."""
        mc_pub_steal_weights(self.x, self.known, w, self.n, self.me, self.mask_factor > 0.0)

    cdef void _publish_only(self, double* p) noexcept nogil:
        """p <- all mass on the own outcome (accept / do not steal): what a softmax with
        nothing else left gives."""
        memset(p, 0, sizeof(double) * self.n)
        p[self.me] = 1.0

    cdef double _hop_units(self) noexcept nogil:
        """One hop's latency in units of ``load_scale``: what a migration or steal costs."""
        return (self.hop_est if self.auto_hop else self.hop_ns) / self.load_scale

    cdef void observe_local(self, int64_t now, double load, double queue_len,
                            double rate) noexcept nogil:
        if not (queue_len >= 0.0):
            queue_len = 0.0
        if not (rate > 0.0) or rate > RATE_MAX:
            rate = 0.0 if not (rate > 0.0) else RATE_MAX
        self.queue_len = queue_len if queue_len < QUEUE_MAX else QUEUE_MAX
        self.rate = rate
        self.adv[2 * self.n + self.me] = rate
        self.last_now = now
        self._set_load(self.me, load)

    cdef void observe_completions(self, uint64_t n, double log_sum,
                                  double sum_ns) noexcept nogil:
        """The own speed from the driver's completion totals (``n`` completions so far, the
        sums of their ln service ns and ns): ``svc_lg`` = 256 log2 of the geometric-mean
        service time (ns) over the last SPEED_TASKS or so completions, and ``svc_mean_ns``
        their mean.

        The geometric mean, not the rate: a server's speed factor moves every task's log
        time by its log, so two servers of one workload compare by their mean logs whatever
        the distribution, and one long task moves the mean log by its log over a few hundred
        (under HyperExp-2 the rate's EWMA halves after one 5 ms task, and on a homogeneous
        rack half the windows saw a peer 1.5x faster or slower). Sent once SPEED_MIN
        completions are in (0 before: not known).
        """
        cdef uint64_t dn
        cdef double f, g
        if n < self.sp_n_seen:              # new totals (a driver restarted): start again
            self.sp_n_seen = 0
            self.sp_l_seen = self.sp_s_seen = 0.0
            self.sp_w = self.sp_l = self.sp_s = 0.0
        dn = n - self.sp_n_seen
        if dn == 0:
            return
        f = exp(-<double>dn / SPEED_TASKS)
        self.sp_w = f * self.sp_w + <double>dn
        self.sp_l = f * self.sp_l + (log_sum - self.sp_l_seen)
        self.sp_s = f * self.sp_s + (sum_ns - self.sp_s_seen)
        self.sp_n_seen = n
        self.sp_l_seen = log_sum
        self.sp_s_seen = sum_ns
        if self.sp_w >= SPEED_MIN and self.sp_l >= 0.0 and self.sp_s > 0.0:
            g = 256.0 * self.sp_l / (self.sp_w * LN2) + 0.5
            g = g if g >= 1.0 else 1.0
            self.svc_lg = <int>(g if g <= <double>MAX_SVC_LG else <double>MAX_SVC_LG)
            self.svc_mean_ns = self.sp_s / self.sp_w

    cdef void observe_peer(self, int64_t now, const Heartbeat* hb) noexcept nogil:
        cdef int src = hb.src
        cdef int d, i
        cdef double rate, load, dly
        cdef int64_t dl
        cdef double* pt
        if <unsigned int>src >= <unsigned int>self.n or src == self.me:
            return
        if self.known[src]:
            # A reordered (older) heartbeat carries nothing newer: drop it.
            if <int32_t>(hb.seq - self.pseq[src]) <= 0:
                return
            self.hb_lost += <uint32_t>(hb.seq - self.pseq[src]) - 1     # the gap (item 22)
        else:
            # the first: the moves it reports were made before we knew of it
            self.pbase[2 * src] = hb.migrations
            self.pbase[2 * src + 1] = hb.steals
        self.pseq[src] = hb.seq
        # Counts are cumulative, so a lost heartbeat's moves show up in the next one: the
        # latest is kept, and _peer_moves takes what each peer moved in the window.
        self.pcnt[2 * src] = hb.migrations
        self.pcnt[2 * src + 1] = hb.steals
        # its speed, for the hop gate (_speed_shift); 0: not known
        self.pcode[src] = <uint16_t>(hb.svc_lg if <uint32_t>hb.svc_lg <= MAX_SVC_LG else 0)
        # Every heartbeat-derived input within sane bounds: a NaN or absurd rate or load from
        # one peer must not reach the logits, the advantages or the capacity prior.
        rate = hb.rate
        load = hb.load
        if not (rate > 0.0) or rate > RATE_MAX:
            if rate != 0.0:
                self.hb_clamped += 1
            rate = RATE_MAX if rate > RATE_MAX else 0.0
        if not (load >= 0.0) or load > LOAD_MAX_NS:
            self.hb_clamped += 1
            load = LOAD_MAX_NS if load > LOAD_MAX_NS else 0.0
        self.adv[2 * self.n + src] = rate
        # One-way delay: what a hop costs. Same clock on one host and in the simulator; a
        # value outside [0, 10 windows] is a clock offset, not a delay, and is ignored (both
        # bounds in one unsigned test: the same as in doubles while 10 windows < 2^53 ns).
        dl = now - hb.sent_ns
        if self.auto_hop and <uint64_t>dl <= <uint64_t>(10 * self.window_ns):
            dly = <double>dl
            self.hop_est = dly if not self.hop_seen else self.hop_est + 0.05 * (dly - self.hop_est)
            self.hop_seen = True
        d = self.n_theta
        if hb.n_theta == d:
            # Only copied here; checked by _peer_critics_checked at the consensus round that
            # reads it (one in consensus_every windows): checking every heartbeat was a third
            # of this method, n - 1 times per window, on a 64-server rack (docs/policy-log.md
            # "Scale: earlier sessions"). 1: received, not yet checked. d = 5 (symmetric): a
            # few moves.
            pt = self._peer_theta(src)
            self._peer(src).theta_ok = 1
            if d == 5:
                memcpy(pt, hb.theta, sizeof(double) * 5)
            else:
                for i in range(d):      # no call: the method saves no registers
                    pt[i] = hb.theta[i]
        if not self.sparse:
            self._set_load(src, load)
            return
        # _set_load's sparse path without its vtable call (load is in [0, LOAD_MAX_NS]), and
        # without u[src]: the sparse actors' readers compute u from x (_actor_inputs)
        self.x[src] = load
        self.known[src] = 1
        self.sorted_ok = False

    cdef void _peer_critics_checked(self) noexcept nogil:
        """Bounded consensus: the peers' critics received since the last check are used
        only if finite with norm <= theta_bound (``PeerRec.theta_ok`` 2), else refused (0,
        counted in ``consensus_rejected``). Run before the consensus reads them: the same
        critics pass as when each heartbeat was checked on arrival (a refused one may
        overwrite the last accepted copy, as it did then)."""
        cdef int j, i, d = self.n_theta
        cdef double t, nrm, tb = self.theta_bound
        cdef bint ok
        cdef const double* pt
        cdef PeerRec* pr
        for j in range(self.n):
            pr = self._peer(j)
            if pr.theta_ok != 1:
                continue
            pt = self._peer_theta(j)
            ok = True
            nrm = 0.0
            for i in range(d):
                t = pt[i]
                ok = ok & (t == t) & (t <= 1e300) & (t >= -1e300)
                nrm += t * t
            # nrm <= (tb / 2)^2 decides without the square root; the boundary cases take it
            if ok and ((tb < 1e150 and nrm <= 0.25 * tb * tb) or sqrt(nrm) <= tb):
                pr.theta_ok = 2
            else:
                self.consensus_rejected += 1
                pr.theta_ok = 0

    cdef void fill_heartbeat(self, Heartbeat* hb) noexcept nogil:
        memset(hb, 0, sizeof(Heartbeat) - sizeof(double) * MAX_THETA)
        self.hb_seq += 1
        hb.src = self.me
        hb.seq = self.hb_seq
        hb.sent_ns = self.last_now
        hb.load = self.x[self.me]
        hb.queue_len = self.queue_len
        hb.rate = self.rate
        hb.migrations = mc_load_relaxed(&self.migrations)
        hb.steals = mc_load_relaxed(&self.steals)
        hb.svc_lg = self.svc_lg
        hb.n_theta = self.n_theta
        memcpy(hb.theta, self.P, sizeof(double) * self.n_theta)
        # the unused tail too: whatever the transport copies must not be stale memory
        memset(&hb.theta[self.n_theta], 0, sizeof(double) * (MAX_THETA - self.n_theta))

    # ------------------------------------------------------------ learning
    cdef void _features(self, double* out) noexcept nogil:
        """Critic features of the current known loads (see docs/policy.md).

        symmetric:  [1, I(u), mean, max - mean, mean - min]
        per_server: [1, I(u), u_0 .. u_{n-1}, |u_0 - mean| .. |u_{n-1} - mean|]

        u = min(v, load_clip) is monotone in v, so the sorted loads give I(u) in O(n):
        sum over pairs |u_j - u_k| = sum_k u_(k) (2k - K + 1).
        """
        cdef int n = self.n, j, cnt
        cdef double mean = 0.0, hi = 0.0, lo = 0.0, s = 0.0, uk, clip = self.load_clip, wk
        self._sort_loads()
        cnt = self.nsrt
        wk = <double>(1 - cnt)          # 2j - cnt + 1, exact in a double: + 2 per step
        for j in range(cnt):
            uk = self.srt[j]
            uk = 0.0 if uk < 0.0 else (clip if uk > clip else uk)
            mean += uk
            s += uk * wk
            wk += 2.0
        if cnt > 0:                     # the clamp is monotone: the ends of the sorted loads
            lo = self.srt[0]
            lo = 0.0 if lo < 0.0 else (clip if lo > clip else lo)
            hi = self.srt[cnt - 1]
            hi = 0.0 if hi < 0.0 else (clip if hi > clip else hi)
        mean /= cnt if cnt > 0 else 1
        out[0] = 1.0
        out[1] = 2.0 * s / (cnt - 1) if cnt > 1 else 0.0
        if self.symmetric:
            out[2] = mean
            out[3] = hi - mean
            out[4] = mean - lo
            return
        if self.sparse:     # observe_peer left u to its readers
            mc_pub_scaled_loads(self.x, self.u, n, self.load_scale, self.load_clip)
        for j in range(n):
            out[2 + j] = self.u[j]
            out[2 + n + j] = fabs(self.u[j] - mean) if self.known[j] else 0.0

    cdef void _push_params(self) noexcept nogil:
        """Hand the actors' new weights to their distributions (logits recomputed).

        Every change of the actors' parameters in ``P`` must be followed by this call. The
        sparse actors compute their logits at publish (O(n)) from contiguous copies of
        their diagonal weights, gathered here (once per batch instead of every window).
        """
        cdef int a, j, n = self.n, me = self.me, w, b
        cdef double* o
        if self.sparse:
            for a in range(2):
                o = self.act + 3 * n * a
                w = self.off_wm if a == 0 else self.off_ws
                b = self.off_bm if a == 0 else self.off_bs
                for j in range(n):
                    o[j] = self.P[b + j]
                    o[n + j] = self.P[self._wd(w, j)]
                    o[2 * n + j] = self.P[w + self.wcol + j] if j != me else 0.0
            return
        cat_set_params(&self.mig, self.P + self.off_wm, self.P + self.off_bm)
        cat_set_params(&self.stl, self.P + self.off_ws, self.P + self.off_bs)

    cdef void _rescale(self) noexcept nogil:
        """load_scale <- the rack's mean task interval 1 / mean(rate) over the known rates.

        Loads are then in "tasks of an average server", so the defaults fit any service time
        and rack. Applied only when it moves by more than 5% (it costs an O(n^2) recompute of
        both actors' logits).
        """
        cdef int n = self.n, j, k = 0
        cdef double sr = 0.0, ls
        cdef const double* rate = self.adv + 2 * n
        for j in range(n):
            # rate_j >= 0, and 0 while j is unknown: the terms left out added +0.0
            sr += rate[j]
        k = mc_pub_count_pos(rate, n)       # the count apart: it vectorizes
        if k == 0 or not (sr > 0.0):
            return
        ls = k / sr
        if fabs(ls - self.load_scale) <= 0.05 * self.load_scale:
            return
        self.load_scale = ls
        self.sorted_ok = False
        # the one expression of u (x of a server never heard of is 0, its u stays 0)
        mc_pub_scaled_loads(self.x, self.u, n, ls, self.load_clip)
        if not self.sparse:
            self._actor_inputs(self.logit)
            cat_set_inputs(&self.mig, self.logit)
            cat_set_inputs(&self.stl, self.logit)
