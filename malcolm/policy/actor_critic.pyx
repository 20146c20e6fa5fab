# cython: language_level=3
"""Malcolm's learning policy (thesis Ch. 4-6): a decentralized linear actor-critic.

One agent runs on each server. It has

* a linear critic ``V(x) = theta . feat(x)`` trained by TD(0) on the stage potential
  ``phi = -I(x) - sum C(a)`` (eq. 4.1), with ``theta`` averaged with the peers' copies every
  ``consensus_every`` windows (§5.2.3, consensus over the parameters heartbeats carry);
* two linear softmax actors, *migrate* (consulted on each arrival; outcome ``me`` = accept)
  and *steal* (consulted after each completion; outcome ``me`` = no steal), each with logits
  ``W u + B`` over the N servers, where ``u`` are the scaled loads;
* gradients cached per window and applied once per batch of ``batch_windows`` windows by
  AdamW (§6.2.2), all in closed form on contiguous C arrays;
* logits updated incrementally (eq. 6.1) as each load arrives, softmax + atomic publish at the
  end of the window (§6.2.3), via ``Categorical`` from ``malcolm._core``.

Everything an agent knows about its peers arrives in heartbeats: their loads, cumulative
migration/steal counts and critic parameters. A lost heartbeat only leaves a stale value.

Threads: everything here runs on the policy thread; the gateway thread's ``decide_*`` are in
``gateway_rules.pyx``. The driver (simulator or runtime) owns ``Policy.migrations`` and
``Policy.steals``: the tasks that actually moved, which the heartbeats report and the payoff
charges for. This module holds how the agent learns, agrees and publishes; its guards
(the trust region, the runaway reset) are ``actor_guards.pyx``, its memory and observations
(loads, heartbeats, sorted loads, features, advantages) ``AgentState`` (``agent_state.pyx``),
its parameters ``ac_params.py``; the design, with the reasons for the feature vector, is in
``docs/policy.md``.
"""
import numpy as np

from libc.math cimport log, pow, sqrt
from libc.stdint cimport UINT64_MAX, int64_t, uint64_t
from libc.string cimport memcpy

from malcolm._core cimport cat_publish_probs, mc_load_relaxed
from malcolm.policy.actor_guards cimport check_runaway, guard_actors
from malcolm.policy.gateway_rules cimport GatewayRules
from malcolm.policy.base cimport MAX_THETA, Policy
from malcolm.policy._pub_kernels cimport mc_pub_peer_ages, mc_pub_softmax_w
from malcolm.policy._select cimport mc_med_init, mc_median_rows
from malcolm.policy.param_layout cimport dense_of, from_dense

cdef extern from "policy/_ac_kernels.h" nogil:
    void mc_ac_adamw(double* p, double* g, double* m, double* v, int n, double lr,
                     double decay, double b1, double b2, double c1, double c2, double eps,
                     double inv_b, double kb) noexcept nogil
    void mc_ac_rank1(double* gw, const double* u, const double* coef, int n) noexcept nogil
    void mc_ac_adv_coef(const double* p, const double* a, double* coef, int n) noexcept nogil
    void mc_ac_kl_coef(const double* p, const double* g, double* coef, int n,
                       double ent) noexcept nogil
    void mc_ac_ent_coef(const double* p, double* coef, int n, double ent) noexcept nogil
    void mc_ac_sparse_grad(const double* coef, const double* z, double* gb, double* gd,
                           double* gw, int n, int me) noexcept nogil


from malcolm.policy.ac_params import DEFAULTS, THESIS, check_params

mc_med_init()       # this module's copy of the consensus's sorting networks (_select.h)

__all__ = ["DEFAULTS", "THESIS", "MalcolmPolicy"]


cdef object _copy(const double* p, int count):
    return np.array(<double[:count]><double*>p) if count > 0 else np.empty(0)


cdef class MalcolmPolicy(GatewayRules):
    """Malcolm's decentralized actor-critic agent for server ``me`` of an ``n``-server rack.

    The defaults are the guarded policy of docs/policy.md ("The default policy");
    ``MalcolmPolicy(n, me, **THESIS)`` is Algorithm 1 as the thesis specifies it.

    Parameters
    ----------
    n, me : int
        Servers in the rack (1..64), and this server's index.
    seed : int
        Seeds the gateway's generator and, with ``init="random"``, the initial parameters.
    window_ns : int
        The window (default 100 µs): the driver calls ``end_window`` this often; only recorded.
    batch_windows : int
        Policy-optimization interval in windows: AdamW applies the cached gradients once a
        batch. Default 0: ``4 * learn_every`` (0.4 ms below 32 servers, 1.6 ms on 64).
    learn_every : int
        Compute the learning step (advantages, gradients) on one window in ``learn_every``;
        the batch's mean is then over those windows. Cuts the learning cost per window by
        that factor at the price of fewer samples. Default 0: ``max(1, n // 16)`` (every
        window below 32 servers, one in 4 on 64).
    consensus_every : int
        Combine the critic with the peers' latest copies every C windows (0 disables).
    consensus : {"median", "mean"}
        Coordinate-wise median of own and peers' critics (default, robust to one bad peer),
        or their mean (the thesis).
    theta_bound : float
        A peer's critic is used only if finite with norm <= this (else counted in
        ``consensus_rejected`` when checked); the own critic is kept within it.
    gamma : float
        Discount per window, in [0, 1).
    critic_lr, actor_lr, cold_lr, accept_lr : float
        AdamW learning rates of the critic, the actors (``cold_lr`` > 0 through the first
        ``beta2_steps`` steps), and (sparse actors) the own outcome's bias and weight
        (accept / do not steal; 0 by default, see ``gate_live``).
    weight_lr : float
        Sparse actors: the AdamW rate of the load weights (W_jj, W_j,me, j != me), their only
        state-dependent part (0.001); < 0: ``actor_lr``, which the full actors always use.
    lr_boost, weight_boost : float
        The actors' AdamW step times 1 + (lr_boost - 1) min(1, d^2)^2, d Adam's per-parameter
        direction m^ / sqrt(v^): up to lr_boost times where recent gradients agree, 1 +
        (lr_boost - 1) / 45 on steady noise (``_ac_kernels.h``). Default 30; 1: off.
        ``weight_boost``: the same for the sparse actors' load weights; < 1 (default): lr_boost.
    tilt_lr, tilt_max : float
        > 0: learn the capacity tilt t (|t| <= ``tilt_max`` with the trust region), the peers'
        migrate logits += t (log r_j - their mean log rate), at this AdamW rate; 0: off.
    weight_decay, beta1, beta2, eps, beta2_decay, beta2_steps : float, int
        AdamW's decoupled weight decay and moment parameters; with ``beta2_decay`` c > 0 the
        second moment's rate at step t is min(beta2, 1 - t^-c), Adafactor's schedule, for
        the first ``beta2_steps`` steps (0: all) and beta2 after them.
    migration_cost, steal_cost : float
        Cost C(a) of one migration / one steal in ``load_scale`` units, on top of one hop.
    herd, herd_busy : float
        > 0: a peer's load in a migrate advantage first takes ``herd`` x ``mc_busy_share`` **
        ``herd_busy`` x what the rack would send it if every agent migrated as this one does.
    hop_ns : float
        One hop's latency in ns, charged per migration and steal; < 0 (default): the EWMA of
        the heartbeats' one-way delays (values outside [0, 10 windows] are ignored).
    hop_weight : float
        Weight of that hop in the actors' one-decision advantages (the hop gate uses the
        full hop). A hop delays one task once; a one-task change of the imbalance lasts
        until the queues drain, so the myopic advantage weighs the hop against it too much.
    hop_cap : float
        The weighted hop in an advantage is at most this x (s_i + s_me), one task's load on
        each end: a longer hop would outweigh any one decision's imbalance change, and the
        actors would stop migrating whatever the queues. 0: no cap.
    entropy : float
        Weight of the actors' regulariser (payoff units per window): KL(pi || the safe start)
        for the sparse actors or with the capacity prior or the mask, else the entropy bonus
        (the same thing for a uniform start). 0 disables it.
    features : {"symmetric", "per_server"}
        Critic features: permutation-symmetric summaries of the loads (default), or one
        load and one deviation feature per server (see docs/policy.md for why the default).
    init, init_scale : {"safe", "random", "zero"}, float
        ``"safe"`` (default): all parameters 0 but the accept bias, log n (see
        ``capacity_prior``); ``"random"``: uniform in ``[-init_scale, init_scale]``.
    capacity_prior : bool
        Add the capacity prior to the migrate logits (rates from heartbeats): accepting
        log(r_me / mean rate), a peer the log of its share of the spare capacity, so that
        the start routes every server its capacity share (see ``__init__``).
    hop_gate, gate_live, gate_residual : bool
        Accept outright the arrivals that would wait here no longer than one hop (``GatewayRules.
        _gate_accept``), a budget that follows the own queue between publishes (``_decide_live``),
        counting a busy worker's residual service where tasks are regular. All True.
    shed, shed_runaway : float
        Live gate: send an arrival away while keeping it waits ``shed`` (< 0, the default: off)
        or ``shed_runaway`` x workers (16; 0: off) task times more than a hop + peers' load.
    steal_idle, steal_state : bool, str
        Live gate: steal into an open gate or from a peer above the mean (default on); a
        steal's own load where it went ahead (``"decision"``) or at the window end.
    steal_grant, grant_tasks, stolen_first : float, float, bool
        Hop gate: as a victim, answer a steal only while waiting work >= ``steal_grant`` hops
        (2) + ``grant_tasks`` (1; 0: off) own task times x the peers' share with none idle.
        A stolen task waits ahead of the own arrivals where ``stolen_first`` (False: behind).
    speed_band : float
        Live gate: slower than its idle migration targets beyond this factor (heartbeats'
        speeds), keep no arrival outright (1.5; 0: off; ``GatewayRules._speed_shift``).
    mask_factor : float
        Never migrate to a peer above ours and above ``mask_factor`` x the rack's mean + one
        task; never steal from a peer not busier than us. 0 disables.
    stale_after : float
        Sparse actors: while every peer was silent for (1 + this) x its period, z = 0 (1).
    trust : float
        Actor parameters stay within ``trust`` (biases; the accept bias may exceed its start
        by ``trust + log n`` but never fall below it, the no-steal bias never rises above
        it) or ``trust / 4`` (weights) of their initial values. 0 disables.
    runaway_windows : int
        An own load above 4x the least loaded known peer's + 16 own task times (16 tasks a
        worker) for this many windows, and higher at their end than at their start, resets
        the actors to the start (``resets``). 0 disables.
    load_scale : float
        ns per unit of load. 0 (default): derived, 1 / mean of the reported service rates
        (the rack's mean task interval), re-derived when it moves by more than 5%.
    load_clip : float
        Scaled loads are clipped to ``[0, load_clip]`` in features and inputs.
    learn : bool
        False freezes all parameters (the agent still tracks loads and publishes).
    actor : {"sparse", "full"}
        ``"sparse"`` (default): logit_i = B_i + W_ii z_i + W_i,me z_me with z the loads'
        deviations from the rack's mean, clipped to +-4, computed at publish, O(n).
        ``"full"``: the thesis's dense W u + B, updated per heartbeat (eq. 6.1), O(n^2).
    actor_input : {"absolute", "relative"}
        ``actor="full"`` only: the scaled loads ``u`` (default), or ``z_j = u_j - u_me``
        for known peers and 0 elsewhere (experimental, no gain).
    advantage : {"difference", "td", "marginal"}
        The actors' learning signal. ``"difference"`` (default): for each outcome ``i`` the
        exact change of the potential if one decision's task were put on ``i``, with
        unscaled, unclipped loads ``v = x / load_scale`` at the end of the window (the
        outcome of everyone's decisions): migrate ``A_i = -I(v + s_i e_i) - cost`` (no cost
        for ``i = me``), steal ``A_j = -I(v + s_me e_me - s_j e_j) - cost`` and
        ``A_me = -I(v)``, where ``s_j = 1 / (rate_j load_scale)`` is one task's load on
        server ``j``; the actor follows the exact gradient of ``sum_i pi_i A_i``,
        ``-pi_i (A_i - pi . A)`` on the logits, in each window with a decision of that
        actor. O(log n) per outcome from the sorted loads. ``"td"`` (Algorithm 1): every
        decision of the window is credited with the window's TD error, ``-delta (k/K -
        pi)``. ``"marginal"``: as ``"difference"`` at the state the decisions were drawn in
        (experimental; drifts). The critic is trained by TD(0) in every case.
    """

    def __init__(self, int n, int me, seed=0, **params):
        cdef int d, npar
        cfg = check_params(params)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"MalcolmPolicy: seed must be a non-negative integer, got {seed!r}")
        Policy.__init__(self, n, me, seed)
        self.symmetric = cfg["features"] == "symmetric"
        d = 5 if self.symmetric else 2 * n + 2
        if d > MAX_THETA:
            raise ValueError(f"MalcolmPolicy: {d} critic features exceed MAX_THETA={MAX_THETA}")
        self.window_ns = cfg["window_ns"]
        # 0: one window in n // 16 (1 below 32 servers): the learning step is O(n) per window
        # while its evidence grows with n (docs/policy-log.md, "Scale: earlier sessions")
        self.learn_every = cfg["learn_every"] if cfg["learn_every"] > 0 else max(1, n // 16)
        # 0: four learning windows a step, so a cold start settles sooner (docs/policy.md,
        # the default's item 11) and 64 servers keep the thesis's 1.6 ms (and its cost)
        self.batch_windows = cfg["batch_windows"] or 4 * self.learn_every
        self.consensus_every = cfg["consensus_every"]
        self.gamma, self.critic_lr, self.actor_lr = cfg["gamma"], cfg["critic_lr"], cfg["actor_lr"]
        self.lr_boost, self.weight_boost = cfg["lr_boost"], cfg["weight_boost"]
        self.accept_lr, self.tilt_lr = cfg["accept_lr"], cfg["tilt_lr"]
        self.cold_lr, self.herd, self.herd_busy = cfg["cold_lr"], cfg["herd"], cfg["herd_busy"]
        self.use_tilt, self.tilt_max = self.tilt_lr > 0.0, cfg["tilt_max"]
        self.weight_lr_auto = cfg["weight_lr"] < 0.0
        self.weight_lr = cfg["actor_lr"] if self.weight_lr_auto else cfg["weight_lr"]
        self.weight_decay, self.beta1 = cfg["weight_decay"], cfg["beta1"]
        self.beta2, self.beta2_decay = cfg["beta2"], cfg["beta2_decay"]
        self.beta2_steps = cfg["beta2_steps"] if cfg["beta2_steps"] > 0 else UINT64_MAX
        self.migration_cost, self.steal_cost = cfg["migration_cost"], cfg["steal_cost"]
        self.eps, self.entropy = cfg["eps"], cfg["entropy"]
        # load_scale=0: a fallback (the old default, 50 µs) until the first rates arrive,
        # then the rack's mean task interval (see _rescale)
        self.auto_scale = cfg["load_scale"] == 0.0
        self.load_scale = 50_000.0 if self.auto_scale else cfg["load_scale"]
        self.load_clip = cfg["load_clip"]
        self.auto_hop = cfg["hop_ns"] < 0.0
        self.hop_ns = 0.0 if self.auto_hop else cfg["hop_ns"]
        self.hop_weight, self.hop_cap = cfg["hop_weight"], cfg["hop_cap"]
        self.capacity_prior, self.hop_gate = cfg["capacity_prior"], cfg["hop_gate"]
        self._unshared_config(cfg)
        self.mask_factor, self.stale_after = cfg["mask_factor"], cfg["stale_after"]
        self.trust, self.runaway_windows = cfg["trust"], cfg["runaway_windows"]
        self.theta_bound, self.consensus = cfg["theta_bound"], cfg["consensus"]
        self.cons_median = self.consensus == "median"
        self.init_scale, self.init = cfg["init_scale"], cfg["init"]
        self.features_kind, self.actor_input = cfg["features"], cfg["actor_input"]
        self.actor = cfg["actor"]
        self.sparse = self.actor == "sparse"
        self.rel_input = self.actor_input == "relative" and not self.sparse
        self.advantage = cfg["advantage"]
        self.marginal = self.advantage != "td"
        self.adv_next = self.advantage == "difference"
        self.learn = cfg["learn"]
        self._alloc(d)
        npar = self.n_params

        if self.init == "random" and self.init_scale > 0:
            # A generator separate from the gateway's, so that init does not shift decisions.
            # Drawn for the dense layout, whatever the actors hold: the same values as ever.
            init_rng = np.random.default_rng([int(seed), me, 0x6D616C63])
            from_dense(self, init_rng.uniform(-self.init_scale, self.init_scale, npar),
                       self.P)
        # init="safe": every parameter 0 but the accept bias, log(n). With the capacity prior
        # (see _publish) an agent accepts a_me = n r_me / (R + (n - 1) r_me) of its arrivals
        # (R: the sum of the reported rates), at most its capacity share n r_me / R, and sends
        # the rest to the peers in proportion to the capacity each has left after keeping its
        # own: s_j = r_j / R - a_j / n ~ r_j^2 / (R + (n - 1) r_j). With arrivals spread evenly
        # over the servers, what a server receives, kept plus migrated to it, is then its
        # capacity share to within about 1% (tests/test_policy_guards.py checks skews up to
        # 16:1). Sending the rest in proportion to r_j, as this start first did, bounded only
        # what a server keeps: migrations in took a small server among big ones to up to
        # 2 - 1/n times its share (1.36x on a 16,1,1,1,1,1,1,1-worker rack, 1.31x measured in
        # the simulator), so that at rack loads above ~0.75 only the overload mask and
        # stealing kept it stable. A homogeneous rack keeps about half its tasks local
        # (n / (2n - 1)) and spreads the rest evenly, as before.
        if self.init == "safe":
            self.P[self.off_bm + me] = log(<double>n)
        memcpy(self.P0, self.P, sizeof(double) * self.n_mem)
        self._push_params()
        self._publish()

    cdef void end_window(self, int64_t now) noexcept nogil:
        self.last_now = now
        if self.auto_scale:
            self._rescale()
        self._learn_window()
        self.windows += 1
        if self.learn and self.runaway_windows > 0:
            check_runaway(self)
        if self.learn and self.consensus_every > 0 and self.windows % self.consensus_every == 0:
            self._consensus()
        if self.sparse and self.stale_after >= 0.0 and self.hb_lost:     # item 22
            self.n_stale = mc_pub_peer_ages(self.pseq, self.known, self.pbeat, self.n,
                                            self.me, <double>now, self.stale_after)
        self._publish()
        # Only a published end-of-window state starts a transition the next window can learn
        # from (not the construction-time state, nor a test's set_params).
        self.has_prev = True

    cdef void _learn_window(self) noexcept nogil:
        """One TD(0) actor-critic step for the window that just ended; gradients are cached."""
        cdef int n = self.n, d = self.n_theta, i
        cdef double vprev = 0.0, vcur = 0.0, delta, payoff, cost, tot, ts = 0.0, tm = 0.0
        cdef double own_mig, own_stl, c
        cdef uint64_t now_mig, now_stl, peer_mig, peer_stl
        cdef double* G = self.G
        cdef double* th = self.P
        cdef double* gw
        cdef double* gb
        cdef double* p
        cdef uint64_t* cnt
        cdef uint64_t* seen
        cdef double* coef = self.coef
        cdef int actor
        cdef bint sampled

        sampled = False
        if self.learn and self.has_prev:
            # learn_every > 1: the gradient of one window in learn_every (an unbiased
            # subsample of the batch's windows, at 1 / learn_every of the cost)
            self.learn_clock += 1
            self.batch_clock += 1
            sampled = self.learn_clock >= self.learn_every
            if sampled:
                self.learn_clock = 0
        # The features (a sort of the loads) only where a learning step reads them; a frozen
        # policy keeps them every window for its diagnostics (last_imbalance, last_payoff).
        if sampled or not self.learn:
            self._features(self.feat_cur)
            self.last_imbalance = self.feat_cur[1]
            for i in range(d):
                vprev += th[i] * self.feat_prev[i]
                vcur += th[i] * self.feat_cur[i]

        # Own migrations and steals: the driver keeps `migrations`/`steals` (what actually
        # moved, the same numbers our heartbeats report), so the cost counts alike for all.
        now_mig = mc_load_relaxed(&self.migrations)
        now_stl = mc_load_relaxed(&self.steals)
        own_mig = <double>(now_mig - self.own_mig_seen) if now_mig >= self.own_mig_seen else 0.0
        own_stl = <double>(now_stl - self.own_stl_seen) if now_stl >= self.own_stl_seen else 0.0
        self.own_mig_seen = now_mig
        self.own_stl_seen = now_stl
        self._peer_moves(&peer_mig, &peer_stl)
        self.rack_mig = own_mig + <double>peer_mig      # for the herd term
        cost = (self.migration_cost * self.rack_mig
                + self.steal_cost * (own_stl + <double>peer_stl))
        payoff = -self.feat_cur[1] - cost
        self.last_cost = cost
        self.last_payoff = payoff

        if sampled:
            if self.adv_next:
                # at the window's realised outcome, for the actors that took decisions
                for i in range(n):
                    tm += <double>(mc_load_relaxed(&self.cnt_mig[i]) - self.seen_mig[i])
                    ts += <double>(mc_load_relaxed(&self.cnt_stl[i]) - self.seen_stl[i])
                self._marginal_advantages(tm > 0.0, ts > 0.0)
            delta = payoff + self.gamma * vcur - vprev
            self.last_td_error = delta
            # Critic, semi-gradient of 1/2 (V(x_r) - target)^2: -delta * feat(x_r).
            for i in range(d):
                G[i] -= delta * self.feat_prev[i]
            # Actors: -delta * grad of the mean log-probability of the window's decisions,
            # (freq - pi) u^T for a linear softmax, freq = counts / total.
            for actor in range(2):
                if actor == 0:
                    cnt, seen, p = self.cnt_mig, self.seen_mig, self.pm_pub
                    gw, gb = G + self.off_wm, G + self.off_bm
                else:
                    cnt, seen, p = self.cnt_stl, self.seen_stl, self.ps_pub
                    gw, gb = G + self.off_ws, G + self.off_bs
                tot = tm if actor == 0 else ts         # adv_next: counted above
                if not self.adv_next:
                    tot = 0.0
                    for i in range(n):
                        tot += <double>(mc_load_relaxed(&cnt[i]) - seen[i])
                if tot <= 0.0:
                    continue
                if self.marginal:
                    # coef_i = -pi_i (A_i - pi . A): descent gradient of -sum_i pi_i A_i
                    mc_ac_adv_coef(p, self.adv + (0 if actor == 0 else n), coef, n)
                else:
                    c = delta / tot
                    # coef_i = -delta * (k_i / tot - p_i): the logits' descent gradient
                    for i in range(n):
                        coef[i] = delta * p[i] - c * <double>(mc_load_relaxed(&cnt[i]) - seen[i])
                if self.entropy > 0.0 and (self.sparse or self.capacity_prior
                                           or self.mask_factor > 0.0):
                    # entropy * KL(pi || pi_safe), pi_safe the initial policy (capacity prior,
                    # mask): d/dg_i = entropy * pi_i (g_i - pi . g), g the learned logit part
                    # (what the actor adds to the safe start). With a uniform prior and no
                    # mask this is exactly the entropy bonus below.
                    mc_ac_kl_coef(p, self.g_pub + (0 if actor == 0 else n), coef, n, self.entropy)
                elif self.entropy > 0.0:
                    # - entropy * H(pi): d/df_i = entropy * pi_i (log pi_i + H)
                    mc_ac_ent_coef(p, coef, n, self.entropy)
                if not self.sparse:
                    for i in range(n):
                        gb[i] += coef[i]
                if actor == 0 and self.use_tilt:
                    # chain rule: d logit_i / d tilt = tl_i (at the publish the decisions
                    # were drawn from), one scalar summing every outcome's gradient
                    for i in range(n):
                        self.tilt_g += coef[i] * self.tl[i]
                if self.sparse:
                    # logit_i = B_i + W_ii z_i + W_i,me z_me (the W_ii in gdiag, see .pxd)
                    mc_ac_sparse_grad(coef, self.u_pub, gb, self.gdiag + (0 if actor == 0 else n),
                                      gw + self.wcol, n, self.me)
                else:
                    mc_ac_rank1(gw, self.u_pub, coef, n)
            self.win_in_batch += 1
        if self.learn and self.has_prev and self.batch_clock >= self.batch_windows:
            self.batch_clock = 0
            if self.win_in_batch > 0:
                self._apply_adamw()
                guard_actors(self)
                self._push_params()

        if not self.learn or self.learn_clock + 1 >= self.learn_every or not self.adv_next:
            self._decisions_counted()   # the next window's decisions, where it learns from them

    cdef void _apply_adamw(self) noexcept nogil:
        """AdamW on the batch-mean of the cached gradients, then clear the cache.

        Same arithmetic as ``torch.optim.AdamW``: decay, moments, bias-corrected step.
        """
        cdef int npar = self.n_mem, d = self.n_theta, n = self.n, a, k, w, t, me
        cdef double b1 = self.beta1, b2 = self.beta2, eps = self.eps, decay, da, wl, dw
        cdef double inv_b = 1.0 / (self.win_in_batch if self.win_in_batch > 0 else 1)
        cdef double c1, c2, lr, kb = self.lr_boost - 1.0     # the actors' consistency boost
        cdef double kw = (self.weight_boost if self.weight_boost >= 1.0 else self.lr_boost) - 1.0
        self.adam_steps += 1
        lr, wl = self.actor_lr, self.weight_lr
        if self.adam_steps <= self.beta2_steps:
            # a cold start: v follows the recent gradients' scale (item 18) and the biases
            # step at cold_lr, where item 18's short memory boosts a gradient spike little
            # (item 19: at cold_lr throughout, heavy-tailed racks lost to the frozen start)
            if self.beta2_decay > 0.0:
                b2 = min(b2, 1.0 - pow(<double>self.adam_steps, -self.beta2_decay))
            lr = self.cold_lr if self.cold_lr > 0.0 else lr
        self.b1t *= b1
        self.b2t *= b2
        c1 = 1.0 / (1.0 - self.b1t)
        c2 = 1.0 / sqrt(1.0 - self.b2t)
        self._fold_gdiag(self.G, True)     # the batch's sparse diagonal gradients into G
        mc_ac_adamw(self.P, self.G, self.M, self.V, d, self.critic_lr,
                    1.0 - self.critic_lr * self.weight_decay, b1, b2, c1, c2, eps, inv_b, 0.0)
        if not self.sparse:
            mc_ac_adamw(self.P + d, self.G + d, self.M + d, self.V + d, npar - d, lr,
                        1.0 - lr * self.weight_decay, b1, b2, c1, c2, eps, inv_b, kb)
        else:
            # only the weights the sparse actors use: each W's diagonal and column me, and
            # the biases (the other entries stay 0). O(n) instead of O(n^2). The own
            # outcome's bias and weight (accept / do not steal) learn at accept_lr: how much
            # to keep local is the one decision whose payoff (a hop saved) every window shows.
            # Contiguous runs in a few calls instead of 3n one-element ones (the same
            # arithmetic, per element): column me, the biases and the diagonal.
            da = 1.0 - self.accept_lr * self.weight_decay
            decay = 1.0 - lr * self.weight_decay
            dw = 1.0 - wl * self.weight_decay
            me = self.me
            for a in range(2):
                w = self.off_wm if a == 0 else self.off_ws
                for t in range(2):
                    # t = 0: W[j, me] (our own load's weight, at weight_lr); t = 1: B[j]
                    k = w + self.wcol if t == 0 else (self.off_bm if a == 0 else self.off_bs)
                    mc_ac_adamw(self.P + k, self.G + k, self.M + k, self.V + k, me,
                                wl if t == 0 else lr, dw if t == 0 else decay, b1, b2, c1,
                                c2, eps, inv_b, kw if t == 0 else kb)
                    k += me
                    mc_ac_adamw(self.P + k, self.G + k, self.M + k, self.V + k, 1,
                                self.accept_lr, da, b1, b2, c1, c2, eps, inv_b, kb)
                    k += 1
                    mc_ac_adamw(self.P + k, self.G + k, self.M + k, self.V + k, n - me - 1,
                                wl if t == 0 else lr, dw if t == 0 else decay, b1, b2, c1,
                                c2, eps, inv_b, kw if t == 0 else kb)
                # W[j, j], j != me: the target's load (W[me, me] is in column me already)
                k = w
                mc_ac_adamw(self.P + k, self.G + k, self.M + k, self.V + k, me,
                            wl, dw, b1, b2, c1, c2, eps, inv_b, kw)
                k = w + me + 1
                mc_ac_adamw(self.P + k, self.G + k, self.M + k, self.V + k, n - me - 1,
                            wl, dw, b1, b2, c1, c2, eps, inv_b, kw)
        if self.use_tilt:
            mc_ac_adamw(&self.tilt, &self.tilt_g, &self.tilt_m, &self.tilt_v, 1, self.tilt_lr,
                        1.0 - self.tilt_lr * self.weight_decay, b1, b2, c1, c2, eps, inv_b, 0.0)
        self.win_in_batch = 0
        self.batches += 1

    cdef void _consensus(self) noexcept nogil:
        """theta <- coordinate-wise median of our theta and the peers' latest (§5.2.3), or
        their mean with ``consensus="mean"``.

        The thesis averages; a median keeps one bad peer (whose theta passed the finiteness
        and norm checks) from moving anyone's theta by more than the spread of the honest
        ones. With two values it is their mean. O(d K log^2 K), K <= n, every C windows, in
        a sorting network (``_select.h``) with no branch on the values."""
        cdef int n = self.n, d = self.n_theta, i, j, k, c, w
        cdef double* th = self.P
        cdef double* m = self.med
        self._peer_critics_checked()
        if not self.cons_median:
            k = 1
            for j in range(n):
                if j != self.me and self._peer(j).theta_ok:
                    for i in range(d):
                        th[i] += self._peer_theta(j)[i]
                    k += 1
            for i in range(d):
                th[i] /= k          # k = 1: x / 1 is x, bit for bit
            self.consensus_rounds += 1
            return
        for c in range(0, d, 8):
            # 8 coordinates (MC_MED_W) in one sorting network: a row per critic, own first
            w = d - c if d - c < 8 else 8
            memcpy(m, th + c, sizeof(double) * w)
            k = 1
            for j in range(n):
                if j != self.me and self._peer(j).theta_ok:
                    memcpy(m + k * 8, self._peer_theta(j) + c, sizeof(double) * w)
                    k += 1
            mc_median_rows(m, k, w, th + c)
        self.consensus_rounds += 1

    cdef void _publish(self) noexcept nogil:
        """Softmax of the actors' logits -> live CDFs; remember the state.

        Migrate: logits + the capacity prior (accepting: log(r_me / mean rate); peer j: the
        log of its share of the capacity left after the servers keep their own arrivals, see
        ``__init__``), and outcomes j != me
        whose load is far above the rack's mean *and* above our own are masked (probability
        0): a server that every agent overloads stops receiving migrations at once, whatever
        the actors learnt. Steal: peers whose load is not above ours are masked (a steal from
        them could only make things worse). If nothing is left, accept / do not steal.

        The prior enters as a weight, softmax(g + log w) = w exp(g) / sum(w exp(g)), and a
        mask as w = 0 (``AgentState._migrate_weights``, ``_steal_weights``): no logs per
        window (the n logs of the prior were a quarter of the publish step on a 64-server
        rack; docs/policy-log.md "Scale: earlier sessions").
        """
        cdef int n = self.n
        self._actor_inputs(self.u_pub)     # the inputs the published logits are computed from
        self._learned_logits()
        if self.use_tilt:
            self._tilt_logits()
        self._migrate_weights(self.logit)
        if mc_pub_softmax_w(self.g_pub, self.logit, self.pm_pub, n) != 0:
            self._publish_only(self.pm_pub)
        self._steal_weights(self.logit)
        if mc_pub_softmax_w(self.g_pub + n, self.logit, self.ps_pub, n) != 0:
            self._publish_only(self.ps_pub)
        cat_publish_probs(&self.mig, self.pm_pub)
        cat_publish_probs(&self.stl, self.ps_pub)
        if self.hop_gate:
            self._gate_accept()         # with the new tables: its budget counts from here
        # feat_prev only before a window whose learning step reads it (see _learn_window)
        if not self.learn or self.learn_clock + 1 >= self.learn_every:
            self._features(self.feat_prev)
        if self.marginal and not self.adv_next:
            self._marginal_advantages(True, True)

    def _vec(self, int off, int count):
        return _copy(self.P + off, count)

    def _mat(self, int a):
        # actor a's W, column-major n_out x n_in in the dense layout -> numpy (n_out, n_in)
        cdef int n = self.n, off = self.n_theta + a * (n * n + n)
        return dense_of(self, self.P)[off:off + n * n].reshape(n, n).T.copy()

    @property
    def theta(self):
        """Critic parameters (copy), length ``n_theta``."""
        return self._vec(0, self.n_theta)

    @property
    def W_migrate(self):
        """Migrate actor weights (copy), shape (n outcomes, n inputs)."""
        return self._mat(0)

    @property
    def B_migrate(self):
        """Migrate actor biases (copy), length n."""
        return self._vec(self.off_bm, self.n)

    @property
    def W_steal(self):
        """Steal actor weights (copy), shape (n outcomes, n inputs)."""
        return self._mat(1)

    @property
    def B_steal(self):
        """Steal actor biases (copy), length n."""
        return self._vec(self.off_bs, self.n)

    @property
    def params(self):
        """All parameters as one flat copy: [theta | Wm (col-major) | Bm | Ws | Bs] (the
        sparse actors' unused weights read 0; ``malcolm.policy.param_layout``)."""
        return dense_of(self, self.P)

    @property
    def grad_cache(self):
        """The descent gradients cached in the current batch (sum over its windows)."""
        cdef double[::1] o = _copy(self.G, self.n_mem)
        self._fold_gdiag(&o[0], False)
        return dense_of(self, &o[0])

    @property
    def adam_moments(self):
        """(m, v) of AdamW, flat like ``params``."""
        return dense_of(self, self.M), dense_of(self, self.V)

    @property
    def probs_migrate(self):
        """Published migrate probabilities (index ``me`` = accept)."""
        return _copy(self.pm_pub, self.n)

    @property
    def probs_steal(self):
        """Published steal probabilities (index ``me`` = do not steal)."""
        return _copy(self.ps_pub, self.n)

    @property
    def loads(self):
        """Last known loads (ns) of every server; 0 where none was heard yet."""
        return _copy(self.x, self.n)

    def features(self):
        """Critic features of the current known loads."""
        out = np.empty(self.n_theta, dtype=np.float64)
        cdef double[::1] o = out
        self._features(&o[0])
        return out

    def set_params(self, theta=None, W_migrate=None, B_migrate=None, W_steal=None,
                   B_steal=None):
        """Overwrite parameters (numpy, shapes as the properties return) and republish (the
        sparse actors take each W's diagonal and column ``me``, and leave out the rest)."""
        cdef int n = self.n, d = self.n_theta
        dense = dense_of(self, self.P)
        parts = [(theta, 0, (d,)), (W_migrate, d, (n, n)), (B_migrate, d + n * n, (n,)),
                 (W_steal, d + n * n + n, (n, n)), (B_steal, d + 2 * n * n + n, (n,))]
        for arr, off, shape in parts:
            if arr is None:
                continue
            a = np.asarray(arr, dtype=np.float64)
            if a.shape != shape:
                raise ValueError(f"expected shape {shape}, got {a.shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError("parameters must be finite")
            flat = a.T.ravel() if len(shape) == 2 else a.ravel()   # to column-major
            dense[off:off + flat.shape[0]] = flat
        from_dense(self, dense, self.P)
        self._push_params()
        self._publish()

    def config(self):
        """The configuration as a dict (the keyword parameters of the constructor)."""
        out = {k: getattr(self, "features_kind" if k == "features" else k) for k in DEFAULTS}
        if self.auto_scale:
            out["load_scale"] = 0.0     # derived: see ``load_scale`` for the current value
        if self.auto_hop:
            out["hop_ns"] = -1.0        # measured: see ``hop_estimate_ns``
        if self.weight_lr_auto:
            out["weight_lr"] = -1.0     # follows actor_lr
        return out

    @property
    def hop_estimate_ns(self):
        """The one-way hop cost in ns the agent charges (measured, or ``hop_ns``)."""
        return self.hop_est if self.auto_hop else self.hop_ns
