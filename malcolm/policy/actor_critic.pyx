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

Threads: ``decide_*`` run on the gateway thread and touch only the published tables, the
gateway's ``Rng`` and the gateway-owned per-outcome decision counters; all other methods run
on the policy thread. The driver (simulator or runtime) owns ``Policy.migrations`` and
``Policy.steals``: the tasks that actually moved, which the heartbeats report and the payoff
charges for.
The design and the reasons for the feature vector are in ``docs/policy.md``.
"""
import math

import numpy as np

from libc.math cimport fabs, log, sqrt
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from malcolm._core cimport (
    cat_free, cat_init, cat_publish_probs, cat_sample, cat_set_inputs, cat_set_params,
    cat_update,
    mc_aligned_alloc, mc_load_relaxed, mc_now_ns, mc_store_relaxed, softmax,
)
from malcolm.policy.base cimport MAX_THETA, Heartbeat, Policy

cdef extern from *:
    """
    /* The per-parameter kernels, with `restrict` so that they vectorize; on x86-64 GCC also
       builds an AVX2+FMA clone picked at load time, so the wheel stays portable. */
    #include <math.h>
    #if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MALCOLM_DEBUG)
    #define MC_AC_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
    #else
    #define MC_AC_CLONES
    #endif
    static MC_AC_CLONES void mc_ac_adamw(double *restrict p, double *restrict g,
            double *restrict m, double *restrict v, int n, double lr, double decay,
            double b1, double b2, double c1, double c2, double eps, double inv_b) {
        for (int i = 0; i < n; i++) {
            double gi = g[i] * inv_b;
            double mi = b1 * m[i] + (1.0 - b1) * gi;
            double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            p[i] = p[i] * decay - lr * (mi * c1) / (sqrt(vi) * c2 + eps);
            g[i] = 0.0;
        }
    }
    /* gw (column-major n x n) += coef u^T */
    static MC_AC_CLONES void mc_ac_rank1(double *restrict gw, const double *restrict u,
            const double *restrict coef, int n) {
        for (int j = 0; j < n; j++) {
            double uj = u[j];
            double *restrict col = gw + (long)j * n;
            for (int i = 0; i < n; i++) col[i] += uj * coef[i];
        }
    }
    """
    void mc_ac_adamw(double* p, double* g, double* m, double* v, int n, double lr,
                     double decay, double b1, double b2, double c1, double c2, double eps,
                     double inv_b) noexcept nogil
    void mc_ac_rank1(double* gw, const double* u, const double* coef, int n) noexcept nogil


DEFAULTS = dict(
    window_ns=100_000,
    batch_windows=16,
    consensus_every=16,
    gamma=0.9,
    critic_lr=0.05,
    actor_lr=0.003,
    accept_lr=0.03,             # sparse actors: the own outcome's bias and weight
    weight_decay=1e-4,
    beta1=0.9,
    beta2=0.999,
    eps=1e-8,
    migration_cost=0.01,
    steal_cost=0.01,
    entropy=0.3,
    features="symmetric",
    init="safe",
    init_scale=0.02,
    load_scale=0.0,             # 0: derived from the service rates heartbeats report
    load_clip=32.0,
    learn=True,
    actor="sparse",             # "full": the thesis's dense n x n actor weights
    actor_input="absolute",     # "full" only; "relative": inputs u_j - u_me (experimental)
    # The per-agent difference advantage is the default; "td" is Algorithm 1's TD-error
    # actor, kept for fidelity (see docs/policy.md, "Deviations").
    advantage="difference",
    hop_ns=-1.0,                # < 0: one-way delay measured from heartbeats
    capacity_prior=True,        # migrate logits += log(rate_j / mean rate)
    mask_factor=2.0,            # 0 disables the overload mask
    trust=8.0,                  # 0 disables the trust region around the initial actors
    runaway_windows=20,         # 0 disables the runaway reset
    theta_bound=1000.0,         # peers' critics with a larger norm are refused
    consensus="median",         # "mean": the thesis's average (one bad peer moves it)
)


# Algorithm 1 as the thesis specifies it: TD-error actors with dense W, a fixed load_scale
# (the workload's 50 µs mean), random start, entropy bonus, the mean for consensus, none of the
# guards. ``MalcolmPolicy(n, me, **THESIS)``; the defaults differ for the reasons in
# docs/policy.md ("The default policy").
THESIS = dict(advantage="td", actor="full", entropy=0.1, init="random", load_scale=50_000.0,
              load_clip=8.0, actor_lr=0.001, capacity_prior=False, mask_factor=0.0, trust=0.0,
              runaway_windows=0, hop_ns=0.0, consensus="mean")


def _as_bool(name, v):
    truthy, falsy = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
    if isinstance(v, str) and v.strip().lower() in truthy + falsy:
        return v.strip().lower() in truthy
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v in (0, 1):
        return bool(v)      # what `malcolm:learn=0` on the command line gives
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"MalcolmPolicy: {name} must be a bool (or 0/1), got {v!r}")
    return bool(v)


def _check_params(params):
    """Validate ``params`` against ``DEFAULTS``; return the full, typed configuration."""
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"MalcolmPolicy: unknown parameter(s) {unknown}; "
                        f"known: {sorted(DEFAULTS)}")
    cfg = dict(DEFAULTS)
    cfg.update(params)

    def num(name, lo=None, hi=None, lo_open=False, hi_open=False):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"MalcolmPolicy: {name} must be a number, got {v!r}")
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"MalcolmPolicy: {name} must be finite, got {v}")
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise ValueError(f"MalcolmPolicy: {name}={v} must be {'>' if lo_open else '>='} {lo}")
        if hi is not None and (v >= hi if hi_open else v > hi):
            raise ValueError(f"MalcolmPolicy: {name}={v} must be {'<' if hi_open else '<='} {hi}")
        cfg[name] = v

    def integer(name, lo):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise TypeError(f"MalcolmPolicy: {name} must be an integer, got {v!r}")
        if v < lo:
            raise ValueError(f"MalcolmPolicy: {name}={v} must be >= {lo}")
        cfg[name] = int(v)

    integer("window_ns", 1)
    integer("batch_windows", 1)
    integer("consensus_every", 0)
    num("gamma", 0.0, 1.0, hi_open=True)
    num("critic_lr", 0.0)
    num("actor_lr", 0.0)
    num("accept_lr", 0.0)
    num("weight_decay", 0.0)
    num("beta1", 0.0, 1.0, hi_open=True)
    num("beta2", 0.0, 1.0, hi_open=True)
    num("eps", 0.0, lo_open=True)
    num("migration_cost", 0.0)
    num("steal_cost", 0.0)
    num("entropy", 0.0)
    num("init_scale", 0.0)
    num("load_scale", 0.0)
    num("load_clip", 0.0, lo_open=True)
    num("hop_ns", -1.0)
    num("mask_factor", 0.0)
    num("trust", 0.0)
    num("theta_bound", 0.0, lo_open=True)
    integer("runaway_windows", 0)
    if cfg["features"] not in ("symmetric", "per_server"):
        raise ValueError("MalcolmPolicy: features must be 'symmetric' or 'per_server', "
                         f"got {cfg['features']!r}")
    if cfg["actor"] not in ("sparse", "full"):
        raise ValueError(f"MalcolmPolicy: actor must be 'sparse' or 'full', got {cfg['actor']!r}")
    if cfg["actor_input"] not in ("absolute", "relative"):
        raise ValueError("MalcolmPolicy: actor_input must be 'absolute' or 'relative', "
                         f"got {cfg['actor_input']!r}")
    if cfg["advantage"] not in ("td", "marginal", "difference"):
        raise ValueError("MalcolmPolicy: advantage must be 'td', 'marginal' or 'difference', "
                         f"got {cfg['advantage']!r}")
    if cfg["consensus"] not in ("median", "mean"):
        raise ValueError("MalcolmPolicy: consensus must be 'median' or 'mean', "
                         f"got {cfg['consensus']!r}")
    if cfg["init"] not in ("safe", "random", "zero"):
        raise ValueError("MalcolmPolicy: init must be 'safe', 'random' or 'zero', "
                         f"got {cfg['init']!r}")
    cfg["learn"] = _as_bool("learn", cfg["learn"])
    cfg["capacity_prior"] = _as_bool("capacity_prior", cfg["capacity_prior"])
    return cfg


# Sane bounds on heartbeat-derived inputs (issue 13): 1000 s of queued work, 1e9 tasks in a
# server, 1e9 tasks per second of service rate, 1e6 tasks moved between two heartbeats.
cdef double LOAD_MAX_NS = 1e12
cdef double QUEUE_MAX = 1e9
cdef double RATE_MAX = 1.0
cdef uint64_t COUNT_JUMP_MAX = 1000000
# The sparse actors' inputs (deviations from the rack's mean load) are clipped to +-ZCLIP.
cdef double ZCLIP = 4.0


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


cdef object _copy(const double* p, int count):
    out = np.empty(count, dtype=np.float64)
    cdef double[::1] o = out
    cdef int i
    for i in range(count):
        o[i] = p[i]
    return out


cdef class MalcolmPolicy(Policy):
    """Malcolm's decentralized actor-critic agent for server ``me`` of an ``n``-server rack.

    The defaults are the guarded policy of docs/policy.md ("The default policy");
    ``MalcolmPolicy(n, me, **THESIS)`` is Algorithm 1 as the thesis specifies it.

    Parameters
    ----------
    n : int
        Servers in the rack (1..64).
    me : int
        This server's index.
    seed : int
        Seeds the gateway's generator and, with ``init="random"``, the initial parameters.
    window_ns : int
        Distribution-update interval (a window), default 100 µs. The driver calls
        ``end_window`` every ``window_ns``; the policy only records it.
    batch_windows : int
        Policy-optimization interval in windows (default 16, i.e. 1.6 ms): cached gradients
        are applied by AdamW once per batch.
    consensus_every : int
        Combine the critic with the peers' latest copies every C windows (0 disables).
    consensus : {"median", "mean"}
        Coordinate-wise median of own and peers' critics (default, robust to one bad peer),
        or their mean (the thesis).
    theta_bound : float
        A peer's critic is used only if finite with norm <= this (else counted in
        ``consensus_rejected``); the own critic is kept within it.
    gamma : float
        Discount per window, in [0, 1).
    critic_lr, actor_lr, accept_lr : float
        AdamW learning rates of the critic, the actors, and (sparse actors) the own
        outcome's bias and weight (accept / do not steal).
    weight_decay, beta1, beta2, eps : float
        AdamW's decoupled weight decay and moment parameters.
    migration_cost, steal_cost : float
        Cost C(a) of one migration / one steal, in units of ``load_scale``, on top of one
        hop (``hop_ns``).
    hop_ns : float
        One hop's latency in ns, charged per migration and steal; < 0 (default): the EWMA of
        the heartbeats' one-way delays (values outside [0, 10 windows] are ignored).
    entropy : float
        Weight of the actors' regulariser (payoff units per window): KL(pi || the safe start)
        for the sparse actors or with the capacity prior or the mask, else the entropy bonus
        (the same thing for a uniform start). 0 disables it.
    features : {"symmetric", "per_server"}
        Critic features: permutation-symmetric summaries of the loads (default), or one
        load and one deviation feature per server (see docs/policy.md for why the default).
    init : {"safe", "random", "zero"}
        ``"safe"`` (default): all parameters 0 but the accept bias, log n (see
        ``capacity_prior``); ``"random"``: uniform in ``[-init_scale, init_scale]``.
    init_scale : float
        Half-width of the random initialisation.
    capacity_prior : bool
        Add log(rate_j / mean rate) to the migrate logits (rates from heartbeats).
    mask_factor : float
        Never migrate to a peer whose load is above ours and above ``mask_factor`` times the
        rack's mean plus one task; never steal from a peer not busier than us. 0 disables.
    trust : float
        Actor parameters stay within ``trust`` (biases; the accept bias may exceed its start
        by ``trust + log n`` but never fall below it, the no-steal bias never rises above
        it) or ``trust / 4`` (weights) of their initial values. 0 disables.
    runaway_windows : int
        An own load above 4x the peers' mean + 16 tasks and not falling for this many
        windows resets the actors to the start (``resets``). 0 disables.
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
        cdef int d, npar, i
        cfg = _check_params(params)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"MalcolmPolicy: seed must be a non-negative integer, got {seed!r}")
        Policy.__init__(self, n, me, seed)
        self.symmetric = cfg["features"] == "symmetric"
        d = 5 if self.symmetric else 2 * n + 2
        if d > MAX_THETA:
            raise ValueError(f"MalcolmPolicy: {d} critic features exceed MAX_THETA={MAX_THETA}")
        self.window_ns = cfg["window_ns"]
        self.batch_windows = cfg["batch_windows"]
        self.consensus_every = cfg["consensus_every"]
        self.gamma = cfg["gamma"]
        self.critic_lr = cfg["critic_lr"]
        self.actor_lr = cfg["actor_lr"]
        self.accept_lr = cfg["accept_lr"]
        self.weight_decay = cfg["weight_decay"]
        self.beta1 = cfg["beta1"]
        self.beta2 = cfg["beta2"]
        self.eps = cfg["eps"]
        self.migration_cost = cfg["migration_cost"]
        self.steal_cost = cfg["steal_cost"]
        self.entropy = cfg["entropy"]
        # load_scale=0: a fallback (the old default, 50 µs) until the first rates arrive,
        # then the rack's mean task interval (see _rescale)
        self.auto_scale = cfg["load_scale"] == 0.0
        self.load_scale = 50_000.0 if self.auto_scale else cfg["load_scale"]
        self.load_clip = cfg["load_clip"]
        self.auto_hop = cfg["hop_ns"] < 0.0
        self.hop_ns = 0.0 if self.auto_hop else cfg["hop_ns"]
        self.capacity_prior = cfg["capacity_prior"]
        self.mask_factor = cfg["mask_factor"]
        self.trust = cfg["trust"]
        self.runaway_windows = cfg["runaway_windows"]
        self.theta_bound = cfg["theta_bound"]
        self.consensus = cfg["consensus"]
        self.cons_median = self.consensus == "median"
        self.init_scale = cfg["init_scale"]
        self.init = cfg["init"]
        self.features_kind = cfg["features"]
        self.actor_input = cfg["actor_input"]
        self.actor = cfg["actor"]
        self.sparse = self.actor == "sparse"
        self.rel_input = self.actor_input == "relative" and not self.sparse
        self.advantage = cfg["advantage"]
        self.marginal = self.advantage != "td"
        self.adv_next = self.advantage == "difference"
        self.learn = cfg["learn"]

        self._release()
        self.n_theta = d
        self.off_wm = d
        self.off_bm = d + n * n
        self.off_ws = d + n * n + n
        self.off_bs = d + 2 * n * n + n
        npar = d + 2 * (n * n + n)
        self.n_params = npar
        self.P = _dalloc(npar)
        self.P0 = _dalloc(npar)
        self.logit = _dalloc(n)
        self.med = _dalloc(n)
        self.g_pub = _dalloc(2 * n)
        self.srt = _dalloc(n)
        self.pre = _dalloc(n + 1)
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
        self.peer_theta = _dalloc(n * d)
        self.known = <uint8_t*>_zalloc(n)
        self.peer_theta_ok = <uint8_t*>_zalloc(n)
        self.peer_seen = <uint8_t*>_zalloc(n)
        self.peer_seq = <uint32_t*>_zalloc(4 * n)
        self.cnt_mig = <uint64_t*>_zalloc(8 * n)
        self.cnt_stl = <uint64_t*>_zalloc(8 * n)
        self.seen_mig = <uint64_t*>_zalloc(8 * n)
        self.seen_stl = <uint64_t*>_zalloc(8 * n)
        self.peer_mig = <uint64_t*>_zalloc(8 * n)
        self.peer_stl = <uint64_t*>_zalloc(8 * n)
        if (self.P == NULL or self.P0 == NULL or self.logit == NULL or self.med == NULL
                or self.srt == NULL or self.g_pub == NULL or self.pre == NULL
                or self.ord == NULL or self.pos == NULL
                or self.G == NULL or self.M == NULL or self.V == NULL
                or self.x == NULL or self.u == NULL or self.u_pub == NULL
                or self.feat_prev == NULL or self.feat_cur == NULL or self.pm_pub == NULL
                or self.ps_pub == NULL or self.coef == NULL or self.adv == NULL
                or self.peer_theta == NULL or self.known == NULL
                or self.peer_theta_ok == NULL or self.peer_seen == NULL or self.peer_seq == NULL
                or self.cnt_mig == NULL or self.cnt_stl == NULL or self.seen_mig == NULL
                or self.seen_stl == NULL or self.peer_mig == NULL or self.peer_stl == NULL):
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
        for i in range(n):
            self.ord[i] = i

        if self.init == "random" and self.init_scale > 0:
            # A generator separate from the gateway's, so that init does not shift decisions.
            init_rng = np.random.default_rng([int(seed), me, 0x6D616C63])
            vals = init_rng.uniform(-self.init_scale, self.init_scale, npar)
            for i in range(npar):
                self.P[i] = vals[i]
        # init="safe": every parameter 0 but the accept bias, log(n). With the capacity prior
        # the migrate actor then accepts a share r_me n / (r_me n + sum_{j != me} r_j) of its
        # arrivals and sends the rest in proportion to the peers' service rates; with arrivals
        # spread evenly over the servers, what a server accepts, r_me / (R + (n - 1) r_me) of
        # the rack's traffic (R = sum of all rates), never exceeds its capacity share r_me / R,
        # while a homogeneous rack keeps about half its tasks local (no hop). The steal actor
        # is uniform over the peers the mask allows.
        if self.init == "safe":
            self.P[self.off_bm + me] = log(<double>n)
        memcpy(self.P0, self.P, sizeof(double) * npar)
        self._push_params()
        self._publish()

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
        free(self.srt)
        free(self.pre)
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
        free(self.peer_theta)
        free(self.known)
        free(self.peer_theta_ok)
        free(self.peer_seen)
        free(self.peer_seq)
        free(self.cnt_mig)
        free(self.cnt_stl)
        free(self.seen_mig)
        free(self.seen_stl)
        free(self.peer_mig)
        free(self.peer_stl)
        self.P = self.P0 = self.logit = self.med = self.G = self.M = self.V = NULL
        self.srt = self.pre = self.g_pub = NULL
        self.ord = self.pos = NULL
        self.x = self.u = self.u_pub = self.feat_prev = self.feat_cur = NULL
        self.pm_pub = self.ps_pub = self.coef = self.adv = self.peer_theta = NULL
        self.known = self.peer_theta_ok = self.peer_seen = NULL
        self.peer_seq = NULL
        self.cnt_mig = self.cnt_stl = self.seen_mig = self.seen_stl = NULL
        self.peer_mig = self.peer_stl = NULL

    # ------------------------------------------------------------ gateway thread (hot path)
    cdef int decide_arrival(self, int64_t now, int task_type) noexcept nogil:
        cdef int a = cat_sample(&self.mig, &self.rng)
        mc_store_relaxed(&self.cnt_mig[a], self.cnt_mig[a] + 1)
        return a

    cdef int decide_steal(self, int64_t now) noexcept nogil:
        cdef int a = cat_sample(&self.stl, &self.rng)
        mc_store_relaxed(&self.cnt_stl[a], self.cnt_stl[a] + 1)
        return -1 if a == self.me else a

    # ------------------------------------------------------------ policy thread
    cdef void _actor_inputs(self, double* z) noexcept nogil:
        """The actors' current input vector.

        sparse: z_j = u_j - mean of the known u (0 for unknown servers): deviations from the
        rack's mean, so that a busy rack does not scale every logit with its load level.
        full: u, or u_j - u_me for known peers (0 elsewhere) with actor_input="relative".
        """
        cdef int j, n = self.n, k = 0
        cdef double ub = 0.0
        if self.sparse:
            for j in range(n):
                if self.known[j]:
                    ub += self.u[j]
                    k += 1
            ub /= k if k > 0 else 1
            for j in range(n):
                z[j] = self.u[j] - ub if self.known[j] else 0.0
                # deviations beyond ZCLIP tasks carry no more information (the mask
                # handles overloaded servers), and bounded inputs keep logits bounded
                z[j] = ZCLIP if z[j] > ZCLIP else (-ZCLIP if z[j] < -ZCLIP else z[j])
            return
        if not self.rel_input:
            memcpy(z, self.u, sizeof(double) * n)
            return
        for j in range(n):
            z[j] = self.u[j] - self.u[self.me] if (j != self.me and self.known[j]) else 0.0

    cdef void _sort_loads(self) noexcept nogil:
        """srt <- the known loads v = x / load_scale (unclipped), sorted; pre <- prefix sums.

        O(n log n); with it the imbalance and every one-decision change of it cost
        O(log n) instead of O(n) (a 64-server rack was dominated by the O(n^2) loops).
        """
        cdef int j, k = 0, a, t, n = self.n
        cdef double inv = 1.0 / self.load_scale, v
        cdef int* o = self.ord
        if self.sorted_ok:
            return
        # Insertion sort of the indices in last window's order: loads move little between
        # windows, so this is close to O(n) (no comparison callbacks either).
        for j in range(n):
            if self.known[o[j]]:
                t = o[j]
                v = self.x[t]
                a = k
                while a > 0 and self.x[o[a - 1]] > v:
                    o[a] = o[a - 1]
                    a -= 1
                o[a] = t
                k += 1
            else:
                pass
        # unknown servers keep their places after the known ones
        a = k
        for j in range(n):
            if not self.known[j]:
                o[a] = j
                a += 1
        for j in range(k):
            self.srt[j] = self.x[o[j]] * inv
            self.pos[o[j]] = j
        self.pre[0] = 0.0
        for j in range(k):
            self.pre[j + 1] = self.pre[j] + self.srt[j]
        self.nsrt = k
        self.sorted_ok = True

    cdef double _absdev(self, double a, int start) noexcept nogil:
        """sum_k |a - v_k| over the known loads (needs _sort_loads).

        ``start``: a guess of the number of v_k < a (a server's own sorted position): the
        search walks from there, so a point near a known load costs O(1) steps, at worst
        O(n); -1 for a binary search.
        """
        cdef int lo = 0, hi = self.nsrt, mid, k = self.nsrt
        cdef const double* v = self.srt
        if start < 0:
            while lo < hi:              # lo <- the number of v_k < a
                mid = (lo + hi) >> 1
                if v[mid] < a:
                    lo = mid + 1
                else:
                    hi = mid
        else:
            lo = start if start <= k else k
            while lo > 0 and v[lo - 1] >= a:
                lo -= 1
            while lo < k and v[lo] < a:
                lo += 1
        return (a * lo - self.pre[lo]) + (self.pre[k] - self.pre[lo] - a * (k - lo))

    cdef void _marginal_advantages(self, bint do_mig, bint do_stl) noexcept nogil:
        """Per-outcome one-decision changes of the potential at the current state (adv).

        With v = x / load_scale (known servers, unclipped) and s_j one task's load on j,
        I(v + d) - I(v) for a d touching one or two servers, through
        F(a) = sum_k |a - v_k| over the sorted loads: O(log n) per outcome. Outcomes the
        published distribution gives probability 0 (masked) get no gradient and are skipped,
        and so is an actor that took no decision in the window (``do_mig``, ``do_stl``).
        """
        cdef int n = self.n, me = self.me, i
        cdef double* am = self.adv
        cdef double* st = self.adv + n
        cdef const double* rate = self.adv + 2 * n
        cdef double sme, si, vi, vme, di, norm, inv = 1.0 / self.load_scale
        cdef double hop = self._hop_units()
        cdef double cmig = self.migration_cost + hop, cstl = self.steal_cost + hop
        cdef double fme, fme_up
        self._sort_loads()
        norm = 2.0 / (self.nsrt - 1) if self.nsrt > 1 else 0.0
        sme = 1.0 / (rate[me] * self.load_scale) if rate[me] > 0.0 else 1.0
        vme = self.x[me] * inv
        fme = self._absdev(vme, self.pos[me])
        fme_up = self._absdev(vme + sme, self.pos[me])
        # migrate: the task goes to i (i = me: accepted here).
        # sum_{k != i} |vi + si - vk| - |vi - vk| = F(vi + si) - si - F(vi)
        for i in range(n):
            if not self.known[i] or (i != me and not (do_mig and self.pm_pub[i] > 0.0)):
                am[i] = 0.0
                continue          # never heard of: set below
            si = 1.0 / (rate[i] * self.load_scale) if rate[i] > 0.0 else 1.0
            vi = self.x[i] * inv
            if i == me:
                di = fme_up - si - fme
            else:
                di = (self._absdev(vi + si, self.pos[i]) - si
                      - self._absdev(vi, self.pos[i]))
            am[i] = -norm * di - (cmig if i != me else 0.0)
        for i in range(n):
            if not self.known[i]:
                am[i] = am[me] - cmig      # no information: accepting, plus the cost
        # steal: one task moves from i to me (i = me: nothing moves). Over k != i, me:
        # sum |a - vk| = F(a) - |a - vi| - |a - vme|.
        st[me] = 0.0
        for i in range(n):
            if i == me:
                continue
            if not do_stl or self.ps_pub[i] <= 0.0:
                st[i] = 0.0
                continue
            if not self.known[i]:
                st[i] = -cstl              # no information: nothing moves
                continue
            si = 1.0 / (rate[i] * self.load_scale) if rate[i] > 0.0 else 1.0
            vi = self.x[i] * inv
            di = ((self._absdev(vi - si, self.pos[i]) - si - fabs(vi - si - vme))
                  - (self._absdev(vi, self.pos[i]) - fabs(vi - vme)))
            di += ((fme_up - fabs(vme + sme - vi) - sme)
                   - (fme - fabs(vme - vi)))
            # the pair (i, me) itself
            di += fabs((vi - si) - (vme + sme)) - fabs(vi - vme)
            st[i] = -norm * di - cstl

    cdef void _set_load(self, int j, double load) noexcept nogil:
        cdef double v
        cdef int k
        if not (load >= 0.0):       # NaN or negative: an estimator glitch, not a load
            load = 0.0
        v = load / self.load_scale
        if v > self.load_clip:
            v = self.load_clip
        self.x[j] = load
        self.u[j] = v
        self.known[j] = 1
        self.sorted_ok = False
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

    cdef void observe_peer(self, int64_t now, const Heartbeat* hb) noexcept nogil:
        cdef int src = hb.src
        cdef int d = self.n_theta, i
        cdef double rate = hb.rate, load = hb.load, nrm = 0.0, t, dly
        cdef uint64_t dm, ds
        cdef bint ok
        if src < 0 or src >= self.n or src == self.me:
            return
        if self.peer_seen[src]:
            # A reordered (older) heartbeat carries nothing newer: drop it.
            if <int32_t>(hb.seq - self.peer_seq[src]) <= 0:
                return
            # Counts are cumulative, so a lost heartbeat's actions show up in the next one.
            # A jump beyond what a server can move in a heartbeat interval is a lie: clamp it.
            dm = hb.migrations - self.peer_mig[src] if hb.migrations > self.peer_mig[src] else 0
            ds = hb.steals - self.peer_stl[src] if hb.steals > self.peer_stl[src] else 0
            if dm > COUNT_JUMP_MAX or ds > COUNT_JUMP_MAX:
                self.hb_clamped += 1
                dm = COUNT_JUMP_MAX if dm > COUNT_JUMP_MAX else dm
                ds = COUNT_JUMP_MAX if ds > COUNT_JUMP_MAX else ds
            self.win_peer_mig += dm
            self.win_peer_stl += ds
        self.peer_seen[src] = 1
        self.peer_seq[src] = hb.seq
        self.peer_mig[src] = hb.migrations
        self.peer_stl[src] = hb.steals
        # Every heartbeat-derived input within sane bounds: a NaN or absurd rate or load from
        # one peer must not reach the logits, the advantages or the capacity prior.
        if not (rate > 0.0) or rate > RATE_MAX:
            if rate != 0.0:
                self.hb_clamped += 1
            rate = RATE_MAX if rate > RATE_MAX else 0.0
        if not (load >= 0.0) or load > LOAD_MAX_NS:
            self.hb_clamped += 1
            load = LOAD_MAX_NS if load > LOAD_MAX_NS else 0.0
        self.adv[2 * self.n + src] = rate
        # One-way delay: what a hop costs. Same clock on one host and in the simulator; a
        # value outside [0, 10 windows] is a clock offset, not a delay, and is ignored.
        dly = <double>(now - hb.sent_ns)
        if self.auto_hop and dly >= 0.0 and dly <= 10.0 * <double>self.window_ns:
            self.hop_est = dly if not self.hop_seen else self.hop_est + 0.05 * (dly - self.hop_est)
            self.hop_seen = True
        if hb.n_theta == d:
            # Bounded consensus: a peer's critic must be finite and within theta_bound.
            ok = True
            for i in range(d):
                t = hb.theta[i]
                if not (t == t) or t > 1e300 or t < -1e300:
                    ok = False
                    break
                nrm += t * t
            if ok and sqrt(nrm) <= self.theta_bound:
                memcpy(&self.peer_theta[<Py_ssize_t>src * d], hb.theta, sizeof(double) * d)
                self.peer_theta_ok[src] = 1
            else:
                self.consensus_rejected += 1
                self.peer_theta_ok[src] = 0
        self._set_load(src, load)

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
        hb.n_theta = self.n_theta
        memcpy(hb.theta, self.P, sizeof(double) * self.n_theta)
        # the unused tail too: whatever the transport copies must not be stale memory
        memset(&hb.theta[self.n_theta], 0, sizeof(double) * (MAX_THETA - self.n_theta))

    cdef void end_window(self, int64_t now) noexcept nogil:
        self.last_now = now
        if self.auto_scale:
            self._rescale()
        self._learn_window()
        self.windows += 1
        if self.learn and self.runaway_windows > 0:
            self._check_runaway()
        if self.learn and self.consensus_every > 0 and self.windows % self.consensus_every == 0:
            self._consensus()
        self._publish()
        # Only a published end-of-window state starts a transition the next window can learn
        # from (not the construction-time state, nor a test's set_params).
        self.has_prev = True

    # ------------------------------------------------------------ learning
    cdef void _features(self, double* out) noexcept nogil:
        """Critic features of the current known loads (see docs/policy.md).

        symmetric:  [1, I(u), mean, max - mean, mean - min]
        per_server: [1, I(u), u_0 .. u_{n-1}, |u_0 - mean| .. |u_{n-1} - mean|]

        u = min(v, load_clip) is monotone in v, so the sorted loads give I(u) in O(n):
        sum over pairs |u_j - u_k| = sum_k u_(k) (2k - K + 1).
        """
        cdef int n = self.n, j, cnt
        cdef double mean = 0.0, hi = 0.0, lo = 0.0, s = 0.0, uk, clip = self.load_clip
        self._sort_loads()
        cnt = self.nsrt
        for j in range(cnt):
            uk = self.srt[j]
            uk = 0.0 if uk < 0.0 else (clip if uk > clip else uk)
            mean += uk
            s += uk * (2 * j - cnt + 1)
            if j == 0:
                lo = uk
            hi = uk
        mean /= cnt if cnt > 0 else 1
        out[0] = 1.0
        out[1] = 2.0 * s / (cnt - 1) if cnt > 1 else 0.0
        if self.symmetric:
            out[2] = mean
            out[3] = hi - mean
            out[4] = mean - lo
            return
        for j in range(n):
            out[2 + j] = self.u[j]
            out[2 + n + j] = fabs(self.u[j] - mean) if self.known[j] else 0.0

    cdef void _learn_window(self) noexcept nogil:
        """One TD(0) actor-critic step for the window that just ended; gradients are cached."""
        cdef int n = self.n, d = self.n_theta, i, j
        cdef double vprev = 0.0, vcur = 0.0, delta, payoff, cost, tot, ts, h
        cdef double own_mig, own_stl, c, abar
        cdef const double* a
        cdef uint64_t now_mig, now_stl
        cdef double* G = self.G
        cdef double* th = self.P
        cdef double* gw
        cdef double* gb
        cdef double* p
        cdef uint64_t* cnt
        cdef uint64_t* seen
        cdef double* coef = self.coef
        cdef const double* z
        cdef const double* gl
        cdef int actor

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
        cost = (self.migration_cost * (own_mig + <double>self.win_peer_mig)
                + self.steal_cost * (own_stl + <double>self.win_peer_stl))
        self.win_peer_mig = 0
        self.win_peer_stl = 0
        payoff = -self.feat_cur[1] - cost
        self.last_cost = cost
        self.last_payoff = payoff

        if self.learn and self.has_prev:
            if self.adv_next:
                # at the window's realised outcome, for the actors that took decisions
                tot = 0.0
                ts = 0.0
                for i in range(n):
                    tot += <double>(mc_load_relaxed(&self.cnt_mig[i]) - self.seen_mig[i])
                    ts += <double>(mc_load_relaxed(&self.cnt_stl[i]) - self.seen_stl[i])
                self._marginal_advantages(tot > 0.0, ts > 0.0)
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
                tot = 0.0
                for i in range(n):
                    tot += <double>(mc_load_relaxed(&cnt[i]) - seen[i])
                if tot <= 0.0:
                    continue
                if self.marginal:
                    # coef_i = -pi_i (A_i - pi . A): descent gradient of -sum_i pi_i A_i
                    a = self.adv + (0 if actor == 0 else n)
                    abar = 0.0
                    for i in range(n):
                        abar += p[i] * a[i]
                    for i in range(n):
                        coef[i] = -p[i] * (a[i] - abar)
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
                    gl = self.g_pub + (0 if actor == 0 else n)
                    h = 0.0
                    for i in range(n):
                        h += p[i] * gl[i]
                    for i in range(n):
                        coef[i] += self.entropy * p[i] * (gl[i] - h)
                elif self.entropy > 0.0:
                    # - entropy * H(pi): d/df_i = entropy * pi_i (log pi_i + H)
                    h = 0.0
                    for i in range(n):
                        if p[i] > 1e-300:
                            h -= p[i] * log(p[i])
                    for i in range(n):
                        if p[i] > 1e-300:
                            coef[i] += self.entropy * p[i] * (log(p[i]) + h)
                for i in range(n):
                    gb[i] += coef[i]
                if self.sparse:
                    # logit_i = B_i + W_ii z_i + W_i,me z_me: two weights per outcome
                    z = self.u_pub
                    for i in range(n):
                        gw[<Py_ssize_t>i * n + i] += coef[i] * z[i]
                        if i != self.me:
                            gw[<Py_ssize_t>self.me * n + i] += coef[i] * z[self.me]
                else:
                    mc_ac_rank1(gw, self.u_pub, coef, n)
            self.win_in_batch += 1
            if self.win_in_batch >= self.batch_windows:
                self._apply_adamw()
                self._guard_actors()
                self._push_params()

        # The next window's decisions are counted from here.
        for j in range(n):
            self.seen_mig[j] = mc_load_relaxed(&self.cnt_mig[j])
            self.seen_stl[j] = mc_load_relaxed(&self.cnt_stl[j])

    cdef void _apply_adamw(self) noexcept nogil:
        """AdamW on the batch-mean of the cached gradients, then clear the cache.

        Same arithmetic as ``torch.optim.AdamW``: decay, moments, bias-corrected step.
        """
        cdef int npar = self.n_params, d = self.n_theta, n = self.n, a, j, k, w, t
        cdef double b1 = self.beta1, b2 = self.beta2, eps = self.eps
        cdef double inv_b = 1.0 / (self.win_in_batch if self.win_in_batch > 0 else 1)
        cdef double c1, c2, lr
        self.adam_steps += 1
        self.b1t *= b1
        self.b2t *= b2
        c1 = 1.0 / (1.0 - self.b1t)
        c2 = 1.0 / sqrt(1.0 - self.b2t)
        lr = self.critic_lr
        mc_ac_adamw(self.P, self.G, self.M, self.V, d, lr, 1.0 - lr * self.weight_decay,
                    b1, b2, c1, c2, eps, inv_b)
        lr = self.actor_lr
        if not self.sparse:
            mc_ac_adamw(self.P + d, self.G + d, self.M + d, self.V + d, npar - d, lr,
                        1.0 - lr * self.weight_decay, b1, b2, c1, c2, eps, inv_b)
        else:
            # only the weights the sparse actors use: each W's diagonal and column me, and
            # the biases (the other entries stay 0). O(n) instead of O(n^2). The own
            # outcome's bias and weight (accept / do not steal) learn at accept_lr: how much
            # to keep local is the one decision whose payoff (a hop saved) every window shows.
            for a in range(2):
                w = self.off_wm if a == 0 else self.off_ws
                for j in range(n):
                    lr = self.accept_lr if j == self.me else self.actor_lr
                    for t in range(3):
                        if t == 0:
                            k = w + self.me * n + j         # W[j, me]: our own load's weight
                        elif t == 1:
                            k = w + n * n + j               # B[j] (the biases follow their W)
                        elif j != self.me:
                            k = w + j * n + j               # W[j, j]: the target's load
                        else:
                            continue                        # W[me, me]: in column me already
                        mc_ac_adamw(self.P + k, self.G + k, self.M + k, self.V + k, 1, lr,
                                    1.0 - lr * self.weight_decay, b1, b2, c1, c2, eps, inv_b)
        self.win_in_batch = 0
        self.batches += 1

    cdef void _push_params(self) noexcept nogil:
        """Hand the actors' new weights to their distributions (logits recomputed).

        The sparse actors compute their logits at publish (O(n)); nothing to hand over.
        """
        if self.sparse:
            return
        cat_set_params(&self.mig, self.P + self.off_wm, self.P + self.off_bm)
        cat_set_params(&self.stl, self.P + self.off_ws, self.P + self.off_bs)

    cdef void _consensus(self) noexcept nogil:
        """theta <- coordinate-wise median of our theta and the peers' latest (§5.2.3), or
        their mean with ``consensus="mean"``.

        The thesis averages; a median keeps one bad peer (whose theta passed the finiteness
        and norm checks in observe_peer) from moving anyone's theta by more than the spread
        of the honest ones. With two values it is their mean. O(d K^2), K <= n, every C
        windows.
        """
        cdef int n = self.n, d = self.n_theta, i, j, k, a
        cdef double* th = self.P
        cdef double* m = self.med
        cdef double t
        if not self.cons_median:
            k = 1
            for j in range(n):
                if j != self.me and self.peer_theta_ok[j]:
                    for i in range(d):
                        th[i] += self.peer_theta[<Py_ssize_t>j * d + i]
                    k += 1
            if k > 1:
                for i in range(d):
                    th[i] /= k
            self.consensus_rounds += 1
            return
        for i in range(d):
            m[0] = th[i]
            k = 1
            for j in range(n):
                if j != self.me and self.peer_theta_ok[j]:
                    t = self.peer_theta[<Py_ssize_t>j * d + i]
                    a = k               # insertion sort as we go
                    while a > 0 and m[a - 1] > t:
                        m[a] = m[a - 1]
                        a -= 1
                    m[a] = t
                    k += 1
            th[i] = m[k // 2] if k % 2 == 1 else 0.5 * (m[k // 2 - 1] + m[k // 2])
        self.consensus_rounds += 1

    cdef void _rescale(self) noexcept nogil:
        """load_scale <- the rack's mean task interval 1 / mean(rate) over the known rates.

        Loads are then in "tasks of an average server", so the defaults fit any service time
        and rack. Applied only when it moves by more than 5% (it costs an O(n^2) recompute of
        both actors' logits).
        """
        cdef int n = self.n, j, k = 0
        cdef double sr = 0.0, ls, v
        cdef const double* rate = self.adv + 2 * n
        for j in range(n):
            if self.known[j] and rate[j] > 0.0:
                sr += rate[j]
                k += 1
        if k == 0 or not (sr > 0.0):
            return
        ls = k / sr
        if fabs(ls - self.load_scale) <= 0.05 * self.load_scale:
            return
        self.load_scale = ls
        self.sorted_ok = False
        for j in range(n):
            if self.known[j]:
                v = self.x[j] / ls
                self.u[j] = v if v < self.load_clip else self.load_clip
        if not self.sparse:
            self._actor_inputs(self.logit)
            cat_set_inputs(&self.mig, self.logit)
            cat_set_inputs(&self.stl, self.logit)

    cdef void _reset_actors(self) noexcept nogil:
        """Back to the safe initial actors, with fresh AdamW moments (the critic is kept)."""
        cdef int d = self.n_theta, cnt = self.n_params - self.n_theta
        memcpy(self.P + d, self.P0 + d, sizeof(double) * cnt)
        memset(self.M + d, 0, sizeof(double) * cnt)
        memset(self.V + d, 0, sizeof(double) * cnt)
        memset(self.G + d, 0, sizeof(double) * cnt)
        self._push_params()
        self.resets += 1

    cdef void _check_runaway(self) noexcept nogil:
        """A runaway own queue: far above the peers' mean and not falling for
        ``runaway_windows`` windows. Whatever the actors learnt, reset them to the safe start.
        """
        cdef int n = self.n, j, k = 0
        cdef double vm = 0.0, vme, sme
        cdef double r = self.adv[2 * n + self.me]
        for j in range(n):
            if j != self.me and self.known[j]:
                vm += self.x[j]
                k += 1
        if k == 0:
            return
        vm /= k * self.load_scale
        vme = self.x[self.me] / self.load_scale
        sme = 1.0 / (r * self.load_scale) if r > 0.0 else 1.0
        if vme > 4.0 * vm + 16.0 * sme and vme >= self.runaway_last:
            self.runaway_run += 1
        else:
            self.runaway_run = 0
        self.runaway_last = vme
        if self.runaway_run >= self.runaway_windows:
            self._reset_actors()
            self.runaway_run = 0

    cdef void _guard_actors(self) noexcept nogil:
        """After each AdamW step: a trust region around the initial actors (|dB| <= trust,
        |dW| <= trust / load_clip, so no single input moves a logit by more than ``trust``);
        a non-finite parameter resets the actors; the critic's norm stays within theta_bound.
        """
        cdef int d = self.n_theta, npar = self.n_params, i, j, k, nn = self.n * self.n
        cdef double r, nrm = 0.0, t
        cdef double* P = self.P
        # Adam's step is finite for finite gradients; a NaN can only come from a bug or an
        # absurd input that got past the clamps, and then the safe start is the answer.
        t = 0.0
        for j in range(self.n):
            t += (P[self.off_bm + j] + P[self.off_bs + j] + P[self.off_wm + self.me * self.n + j]
                  + P[self.off_ws + self.me * self.n + j])
        if self.sparse:
            for j in range(self.n):
                t += P[self.off_wm + j * self.n + j] + P[self.off_ws + j * self.n + j]
        else:
            for i in range(d, npar):
                t += P[i]
        if not (t == t) or t > 1e300 or t < -1e300:
            self._reset_actors()
        for i in range(d):
            t = P[i]
            if not (t == t) or t > 1e300 or t < -1e300:
                memset(P, 0, sizeof(double) * d)
                memset(self.M, 0, sizeof(double) * d)
                memset(self.V, 0, sizeof(double) * d)
                nrm = 0.0
                break
            nrm += t * t
        nrm = sqrt(nrm)
        if nrm > self.theta_bound:
            for i in range(d):
                P[i] *= 0.99 * self.theta_bound / nrm
        if self.trust <= 0.0:
            return
        if not self.sparse:
            for i in range(d, npar):
                # [Wm | Bm | Ws | Bs]: W blocks are n*n long, B blocks n
                r = self.trust
                if (i - d) < nn or (self.off_ws <= i < self.off_bs):
                    r = self.trust * 0.125
                elif i == self.off_bm + self.me:
                    r = self.trust + log(<double>self.n)
                self._clip_param(i, r)
            return
        # sparse: only the used entries (the others stay 0), O(n)
        for j in range(self.n):
            for i in range(2):
                k = self.off_wm if i == 0 else self.off_ws
                self._clip_param(k + j * self.n + j, self.trust / ZCLIP)
                self._clip_param(k + self.me * self.n + j, self.trust / ZCLIP)
            self._clip_param(self.off_bs + j, self.trust)
            if j == self.me and self.P[self.off_bs + j] > self.P0[self.off_bs + j]:
                # "do not steal": never more reluctant than the safe start (a steal request
                # that finds nothing costs a message, a missed one an idle worker)
                self.P[self.off_bs + j] = self.P0[self.off_bs + j]
                self.trust_clips += 1
            # accepting competes with n - 1 capacity shares: a wider range for its bias
            if j != self.me:
                self._clip_param(self.off_bm + j, self.trust)
            else:
                # accepting: never below the safe start (which keeps at most a server's
                # capacity share); above it by up to trust + log n, so that a lightly loaded
                # rack learns to keep its tasks local and save the hop
                self._clip_param(self.off_bm + j, self.trust + log(<double>self.n))
                if self.P[self.off_bm + j] < self.P0[self.off_bm + j]:
                    self.P[self.off_bm + j] = self.P0[self.off_bm + j]
                    self.trust_clips += 1

    cdef inline void _clip_param(self, int i, double r) noexcept nogil:
        cdef double lo = self.P0[i] - r, hi = self.P0[i] + r
        if self.P[i] < lo:
            self.P[i] = lo
            self.trust_clips += 1
        elif self.P[i] > hi:
            self.P[i] = hi
            self.trust_clips += 1

    cdef void _publish(self) noexcept nogil:
        """Softmax of the incrementally maintained logits -> live CDFs; remember the state.

        Migrate: logits + log(rate_j / mean rate) (the capacity prior), and outcomes j != me
        whose load is far above the rack's mean *and* above our own are masked (probability
        0): a server that every agent overloads stops receiving migrations at once, whatever
        the actors learnt. Steal: peers whose load is not above ours are masked (a steal from
        them could only make things worse). If nothing is left, accept / do not steal.
        """
        cdef int n = self.n, me = self.me, j, k = 0, nm = 0
        cdef double* lg = self.logit
        cdef const double* rate = self.adv + 2 * n
        cdef double rbar = 0.0, vbar = 0.0, vme, vj, sj, ls = self.load_scale
        cdef const double* z = self.u_pub
        cdef const double* P = self.P
        self._actor_inputs(self.u_pub)     # the inputs the published logits are computed from
        for j in range(n):
            if self.known[j]:
                vbar += self.x[j]
                k += 1
        vbar /= (k if k > 0 else 1) * ls
        vme = self.x[me] / ls
        k = 0
        for j in range(n):
            if rate[j] > 0.0:
                rbar += rate[j]
                k += 1
        rbar = rbar / k if k > 0 else 0.0
        for j in range(n):
            if self.sparse:
                lg[j] = (P[self.off_bm + j] + P[self.off_wm + j * n + j] * z[j]
                         + (P[self.off_wm + me * n + j] * z[me] if j != me else 0.0))
            else:
                lg[j] = self.mig.f[j]
            self.g_pub[j] = lg[j]
            if self.capacity_prior and rbar > 0.0 and rate[j] > 0.0:
                lg[j] += log(rate[j] / rbar)
            if j != me and self.mask_factor > 0.0 and self.known[j]:
                vj = self.x[j] / ls
                sj = 1.0 / (rate[j] * ls) if rate[j] > 0.0 else 1.0
                if vj > vme and vj > self.mask_factor * vbar + sj:
                    lg[j] = -1e300
                    nm += 1
        self.masked += nm
        softmax(lg, self.pm_pub, n)
        for j in range(n):
            if self.sparse:
                lg[j] = (P[self.off_bs + j] + P[self.off_ws + j * n + j] * z[j]
                         + (P[self.off_ws + me * n + j] * z[me] if j != me else 0.0))
            else:
                lg[j] = self.stl.f[j]
            self.g_pub[n + j] = lg[j]
            if j != me and self.mask_factor > 0.0 and self.known[j] and self.x[j] <= self.x[me]:
                lg[j] = -1e300
        softmax(lg, self.ps_pub, n)
        cat_publish_probs(&self.mig, self.pm_pub)
        cat_publish_probs(&self.stl, self.ps_pub)
        self._features(self.feat_prev)
        if self.marginal and not self.adv_next:
            self._marginal_advantages(True, True)

    # ------------------------------------------------------------ Python inspection and driving
    def _vec(self, int off, int count):
        return _copy(self.P + off, count)

    def _mat(self, int off):
        # column-major n_out x n_in in C memory -> numpy (n_out, n_in)
        return self._vec(off, self.n * self.n).reshape(self.n, self.n).T.copy()

    @property
    def theta(self):
        """Critic parameters (copy), length ``n_theta``."""
        return self._vec(0, self.n_theta)

    @property
    def W_migrate(self):
        """Migrate actor weights (copy), shape (n outcomes, n inputs)."""
        return self._mat(self.off_wm)

    @property
    def B_migrate(self):
        """Migrate actor biases (copy), length n."""
        return self._vec(self.off_bm, self.n)

    @property
    def W_steal(self):
        """Steal actor weights (copy), shape (n outcomes, n inputs)."""
        return self._mat(self.off_ws)

    @property
    def B_steal(self):
        """Steal actor biases (copy), length n."""
        return self._vec(self.off_bs, self.n)

    @property
    def params(self):
        """All parameters as one flat copy: [theta | Wm (col-major) | Bm | Ws | Bs]."""
        return self._vec(0, self.n_params)

    @property
    def grad_cache(self):
        """The descent gradients cached in the current batch (sum over its windows)."""
        return _copy(self.G, self.n_params)

    @property
    def adam_moments(self):
        """(m, v) of AdamW, flat like ``params``."""
        return _copy(self.M, self.n_params), _copy(self.V, self.n_params)

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
        """Overwrite parameters (numpy, shapes as the properties return) and republish."""
        cdef int i, n = self.n
        parts = [(theta, 0, (self.n_theta,)), (W_migrate, self.off_wm, (n, n)),
                 (B_migrate, self.off_bm, (n,)), (W_steal, self.off_ws, (n, n)),
                 (B_steal, self.off_bs, (n,))]
        for arr, off, shape in parts:
            if arr is None:
                continue
            a = np.asarray(arr, dtype=np.float64)
            if a.shape != shape:
                raise ValueError(f"expected shape {shape}, got {a.shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError("parameters must be finite")
            flat = a.T.ravel() if len(shape) == 2 else a.ravel()   # to column-major
            for i in range(flat.shape[0]):
                self.P[off + i] = flat[i]
        self._push_params()
        self._publish()

    def py_heartbeat_in(self, int64_t now, int src, double load, migrations=0, steals=0,
                        theta=None, seq=None, double queue_len=0.0, double rate=0.0,
                        sent_ns=None):
        """Deliver a heartbeat from peer ``src`` (what the transport would do); it was sent
        at ``sent_ns`` (default ``now``)."""
        cdef Heartbeat hb
        cdef int k
        if not 0 <= src < self.n:
            raise ValueError(f"peer index {src} out of range 0..{self.n - 1}")
        memset(&hb, 0, sizeof(Heartbeat))
        hb.src = src
        hb.seq = (self.peer_seq[src] + 1) if seq is None else int(seq)
        hb.sent_ns = now if sent_ns is None else int(sent_ns)
        hb.load = load
        hb.queue_len = queue_len
        hb.rate = rate
        hb.migrations = int(migrations)
        hb.steals = int(steals)
        if theta is not None:
            th = np.asarray(theta, dtype=np.float64).ravel()
            if th.shape[0] > MAX_THETA:
                raise ValueError(f"at most {MAX_THETA} critic parameters")
            hb.n_theta = th.shape[0]
            for k in range(hb.n_theta):
                hb.theta[k] = th[k]
        self.observe_peer(now, &hb)

    def py_step(self, int64_t now, double own_load, peer_loads=None, peer_migrations=None,
                peer_steals=None, peer_thetas=None, rates=None):
        """Drive one window from Python: own load, one heartbeat per peer, end of window.

        ``peer_loads`` etc. are sequences of length ``n`` (the entry at ``me`` is ignored;
        ``None`` entries mean the peer's heartbeat was lost). ``rates`` (length ``n``, tasks
        per ns, own entry included) are the service rates reported with the loads (0 if
        omitted).
        """
        cdef int j
        if rates is not None and len(rates) != self.n:
            raise ValueError(f"rates must have length n={self.n}")
        self.observe_local(now, own_load, 0.0, 0.0 if rates is None else float(rates[self.me]))
        if peer_loads is not None:
            if len(peer_loads) != self.n:
                raise ValueError(f"peer_loads must have length n={self.n}")
            for j in range(self.n):
                if j == self.me or peer_loads[j] is None:
                    continue
                self.py_heartbeat_in(
                    now, j, float(peer_loads[j]),
                    0 if peer_migrations is None else peer_migrations[j],
                    0 if peer_steals is None else peer_steals[j],
                    None if peer_thetas is None else peer_thetas[j],
                    rate=0.0 if rates is None else float(rates[j]))
        self.end_window(now)

    def py_sample_many(self, str kind, Py_ssize_t count):
        """Make ``count`` gateway decisions in a native loop; return counts per outcome.

        ``kind`` is "arrival" or "steal" (for steal, index ``me`` counts "no steal").
        The GIL is released, so another thread may publish meanwhile.
        """
        out = np.zeros(self.n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t _k
        cdef int a
        cdef bint arr
        if kind not in ("arrival", "steal"):
            raise ValueError("kind must be 'arrival' or 'steal'")
        if count < 0:
            raise ValueError("count must be >= 0")
        arr = kind == "arrival"
        with nogil:
            for _k in range(count):
                if arr:
                    a = self.decide_arrival(0, 0)
                else:
                    a = self.decide_steal(0)
                    if a < 0:
                        a = self.me
                o[a] += 1
        return out

    def py_publish_flip(self, B_a, B_b, Py_ssize_t rounds):
        """Publish migrate biases ``B_a`` and ``B_b`` alternately, ``rounds`` times, nogil.

        For concurrency tests: readers must only ever see one of the two distributions.
        """
        a = np.ascontiguousarray(B_a, dtype=np.float64)
        b = np.ascontiguousarray(B_b, dtype=np.float64)
        if a.shape != (self.n,) or b.shape != (self.n,):
            raise ValueError(f"biases must have shape ({self.n},)")
        cdef double[::1] av = a
        cdef double[::1] bv = b
        cdef Py_ssize_t r
        with nogil:
            for r in range(rounds):
                cat_set_params(&self.mig, self.P + self.off_wm, &av[0] if r % 2 == 0 else &bv[0])
                softmax(self.mig.f, self.pm_pub, self.n)
                cat_publish_probs(&self.mig, self.pm_pub)
        # The logits go back to the parameters; the last flipped table stays live until the
        # next publish.
        self._push_params()

    def py_apply_adamw(self, grad):
        """Apply one AdamW step with the given (descent) gradient, flat like ``params``.

        Any gradient cached by windows is replaced. For checking against a reference.
        """
        g = np.ascontiguousarray(grad, dtype=np.float64)
        if g.shape != (self.n_params,):
            raise ValueError(f"gradient must have shape ({self.n_params},)")
        cdef int i
        for i in range(self.n_params):
            self.G[i] = g[i]
        self.win_in_batch = 1
        self._apply_adamw()
        self._push_params()
        self._publish()

    def py_consensus(self):
        """Run the consensus step now (normally every ``consensus_every`` windows)."""
        self._consensus()

    def config(self):
        """The configuration as a dict (the keyword parameters of the constructor)."""
        out = {k: getattr(self, "features_kind" if k == "features" else k) for k in DEFAULTS}
        if self.auto_scale:
            out["load_scale"] = 0.0     # derived: see ``load_scale`` for the current value
        if self.auto_hop:
            out["hop_ns"] = -1.0        # measured: see ``hop_estimate_ns``
        return out

    @property
    def hop_estimate_ns(self):
        """The one-way hop cost in ns the agent charges (measured, or ``hop_ns``)."""
        return self.hop_est if self.auto_hop else self.hop_ns


# ---------------------------------------------------------------- microbenchmarks

cdef inline void _bench_window(MalcolmPolicy p, const double[:, ::1] L,
                               Py_ssize_t it) noexcept nogil:
    # what a window's observe_* calls leave behind: new scaled loads, a few decisions
    cdef int n = p.n, j
    cdef int k = <int>(it & 63)
    for j in range(n):
        p.u[j] = L[k, j]
    p.cnt_mig[k % n] += 3
    p.cnt_mig[p.me] += 5
    p.cnt_stl[(k + 1) % n] += 1
    p.cnt_stl[p.me] += 7


def bench_policy(int n, Py_ssize_t iters=100_000):
    """Time the policy's native steps at rack size ``n`` (loops in C, one clock read per loop).

    Returns a dict (ns per operation):

    ``dist_update_ns.N``
        one window's distribution work for both actors: ``n`` incremental logit updates
        (eq. 6.1) per actor plus a softmax and atomic publish per actor.
    ``param_update_ns.N``
        a full parameter update, counted per *batch-ending* window: features, payoff, TD
        error, critic and both actors' gradients into the cache, and the AdamW step over all
        parameters with the new weights handed to the distributions.
    ``param_grad_ns.N`` / ``adamw_ns.N``
        the two parts: the per-window cached-gradient step (what the other
        ``batch_windows - 1`` windows of a batch cost), and AdamW + handing the weights to the
        distributions (the difference of the two loops).
    ``decide_ns.N``
        one ``decide_arrival`` (sample from the published CDF).
    ``window_ns.N``
        the *default* policy's whole window: ``n - 1`` heartbeats, the own load and
        ``end_window`` (rescale check, learning step with AdamW every 16 windows, consensus
        every 16, publish); the keys above time Algorithm 1 (``THESIS``), whose steps the
        thesis's Table 6.1 reports.
    """
    if iters < 1:
        raise ValueError("iters must be >= 1")
    cdef MalcolmPolicy p = MalcolmPolicy(n, 0, seed=1, batch_windows=1 << 30,
                                         consensus_every=0, **THESIS)
    cdef int j, k
    cdef Py_ssize_t it, _it
    cdef int64_t t0, t1
    # scaled loads (what the distributions see), a new random state every window
    loads_np = np.random.default_rng(7).uniform(0.0, 4.0, (64, n))
    cdef double[:, ::1] L = loads_np
    cdef double sink = 0.0
    out = {}
    # prime: every load known, a previous state exists
    for j in range(n):
        p._set_load(j, L[0, j] * p.load_scale)
    p._publish()
    with nogil:
        t0 = mc_now_ns()
        for it in range(iters):
            k = <int>(it & 63)
            for j in range(n):
                cat_update(&p.mig, j, L[k, j])
                cat_update(&p.stl, j, L[k, j])
            softmax(p.mig.f, p.pm_pub, n)
            cat_publish_probs(&p.mig, p.pm_pub)
            softmax(p.stl.f, p.ps_pub, n)
            cat_publish_probs(&p.stl, p.ps_pub)
        t1 = mc_now_ns()
    out[f"dist_update_ns.{n}"] = (t1 - t0) / <double>iters

    # Each window: new loads and some decisions, so every gradient is non-zero (an all-zero
    # gradient would decay the Adam moments into denormals and time the wrong thing).
    with nogil:
        t0 = mc_now_ns()
        for it in range(iters):
            _bench_window(p, L, it)
            p._learn_window()
            memcpy(p.feat_prev, p.feat_cur, sizeof(double) * p.n_theta)
            memcpy(p.u_pub, p.u, sizeof(double) * n)
        t1 = mc_now_ns()
    out[f"param_grad_ns.{n}"] = (t1 - t0) / <double>iters

    with nogil:
        t0 = mc_now_ns()
        for it in range(iters):
            _bench_window(p, L, it)
            p._learn_window()
            memcpy(p.feat_prev, p.feat_cur, sizeof(double) * p.n_theta)
            memcpy(p.u_pub, p.u, sizeof(double) * n)
            p._apply_adamw()
            p._push_params()
        t1 = mc_now_ns()
    out[f"param_update_ns.{n}"] = (t1 - t0) / <double>iters
    out[f"adamw_ns.{n}"] = out[f"param_update_ns.{n}"] - out[f"param_grad_ns.{n}"]

    p._publish()
    with nogil:
        t0 = mc_now_ns()
        for _it in range(iters):
            sink += p.decide_arrival(0, 0)
        t1 = mc_now_ns()
    out[f"decide_ns.{n}"] = (t1 - t0) / <double>iters
    if sink < 0:
        print(sink)
    out[f"window_ns.{n}"] = _bench_default_window(n, iters, loads_np)
    return out


def _bench_default_window(int n, Py_ssize_t iters, loads_np):
    cdef MalcolmPolicy p = MalcolmPolicy(n, 0, seed=1)
    cdef double[:, ::1] L = loads_np
    cdef Heartbeat hb
    cdef Py_ssize_t it
    cdef int j, k
    cdef int64_t t0, t1, now = 0
    cdef double rate = 8.0 / 50_000.0
    memset(&hb, 0, sizeof(Heartbeat))
    p.fill_heartbeat(&hb)           # a valid critic of the right length
    with nogil:
        t0 = mc_now_ns()
        for it in range(iters):
            k = <int>(it & 63)
            now += 100_000
            for j in range(1, n):
                hb.src = j
                hb.seq = <uint32_t>(it + 1)
                hb.sent_ns = now - 2000
                hb.load = L[k, j] * 50_000.0
                hb.rate = rate
                p.observe_peer(now, &hb)
            p.observe_local(now, L[k, 0] * 50_000.0, L[k, 0] * 8.0, rate)
            p.cnt_mig[k % n] += 3
            p.cnt_mig[0] += 5
            p.cnt_stl[(k + 1) % n] += 1
            p.end_window(now)
        t1 = mc_now_ns()
    return (t1 - t0) / <double>iters
