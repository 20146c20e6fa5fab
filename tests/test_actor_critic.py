"""Tests of Malcolm's actor-critic policy (malcolm/policy/actor_critic.pyx).

The closed-form updates are checked against a plain numpy reference of one window and
against finite differences; AdamW against a numpy transcription of torch.optim.AdamW.
Everything about peers is fed as heartbeats, as the simulator and the runtime do.
"""

import threading

import numpy as np
import pytest

ac = pytest.importorskip("malcolm.policy.actor_critic")
hooks = pytest.importorskip("malcolm.policy._testing")
MalcolmPolicy = ac.MalcolmPolicy

S = 50_000.0          # the thesis-mode load_scale, ns

# Algorithm 1 as the thesis specifies it (the mechanics tests below check this arithmetic):
# TD-error actors with dense W, a fixed load_scale, random init, uniform entropy bonus, none
# of the guards. The defaults (difference advantage, sparse actors, guards) are tested in
# tests/test_policy_guards.py.
THESIS = ac.THESIS
assert THESIS["load_scale"] == S


# ---------------------------------------------------------------- numpy reference
def ref_features(u, known, kind="symmetric"):
    u = np.asarray(u, float)
    known = np.asarray(known, bool)
    k = known.sum()
    mean = u[known].mean()
    uk = u[known]
    imb = np.abs(uk[:, None] - uk[None, :]).sum() / (k - 1) if k > 1 else 0.0
    if kind == "symmetric":
        return np.array([1.0, imb, mean, uk.max() - mean, mean - uk.min()])
    dev = np.where(known, np.abs(u - mean), 0.0)
    return np.concatenate([[1.0, imb], np.where(known, u, 0.0), dev])


def softmax(f):
    e = np.exp(f - f.max())
    return e / e.sum()


def mean_logp(W, B, u, counts):
    """Mean log-probability of the window's decisions under softmax(W u + B)."""
    f = W @ u + B
    logp = f - f.max() - np.log(np.exp(f - f.max()).sum())
    return float((counts * logp).sum() / counts.sum())


def flat_params(theta, Wm, Bm, Ws, Bs):
    # the module's layout: [theta | Wm column-major | Bm | Ws column-major | Bs]
    return np.concatenate([theta, Wm.T.ravel(), Bm, Ws.T.ravel(), Bs])


def make(n=4, me=1, **kw):
    kw.setdefault("batch_windows", 10_000)      # keep gradients in the cache
    kw.setdefault("consensus_every", 0)
    return MalcolmPolicy(n, me, seed=kw.pop("seed", 3), **{**THESIS, **kw})


# ---------------------------------------------------------------- one window vs reference
@pytest.mark.parametrize("kind", ["symmetric", "per_server"])
def test_window_gradients_match_numpy_reference_and_finite_differences(kind):
    n, me = 4, 1
    mc, sc, gamma, beta = 0.05, 0.02, 0.9, 0.3
    p = make(n, me, migration_cost=mc, steal_cost=sc, gamma=gamma, init_scale=0.3,
             entropy=beta, features=kind)
    assert p.n_theta == (5 if kind == "symmetric" else 2 * n + 2)
    # window A: own load and three heartbeats with cumulative counts (baselines)
    loads_a = np.array([3.0, 5.0, 1.0, 2.5]) * S
    hooks.step(p, 0, loads_a[me], list(loads_a), peer_migrations=[7, 0, 2, 0],
              peer_steals=[1, 0, 0, 4])
    theta = p.theta
    Wm, Bm, Ws, Bs = p.W_migrate, p.B_migrate, p.W_steal, p.B_steal
    u_a = loads_a / S
    f_a = ref_features(u_a, [True] * n, kind)
    np.testing.assert_allclose(p.features(), f_a, rtol=1e-12)
    pim, pis = p.probs_migrate, p.probs_steal
    np.testing.assert_allclose(pim, softmax(Wm @ u_a + Bm), rtol=1e-9)
    np.testing.assert_allclose(pis, softmax(Ws @ u_a + Bs), rtol=1e-9)
    assert np.all(p.grad_cache == 0.0), "the first window has no transition to learn from"

    # the gateway decides during window B
    km = hooks.sample_many(p, "arrival", 60)
    ks = hooks.sample_many(p, "steal", 25)
    # the driver counts what actually moved (a steal request may find nothing)
    own_mig = km.sum() - km[me]
    own_stl = ks.sum() - ks[me] - 2
    p.migrations += own_mig
    p.steals += own_stl
    # window B: peer 2's heartbeat is lost; the others report new cumulative counts
    loads_b = np.array([2.0, 4.0, 1.0, 6.0]) * S
    hooks.step(p, 1, loads_b[me], [loads_b[0], None, None, loads_b[3]],
              peer_migrations=[10, 0, 0, 4], peer_steals=[1, 0, 0, 9])
    u_b = np.array([2.0, 4.0, 1.0, 6.0])
    u_b[2] = 1.0      # stale: the last load heard from peer 2 (same value here)
    f_b = ref_features(u_b, [True] * n, kind)
    cost = mc * (own_mig + 3 + 4) + sc * (own_stl + 0 + 5)
    payoff = -f_b[1] - cost
    delta = payoff + gamma * theta @ f_b - theta @ f_a
    assert p.last_payoff == pytest.approx(payoff, rel=1e-12)
    assert p.last_td_error == pytest.approx(delta, rel=1e-10)

    def ent_grad(pi):         # d(-beta H(softmax f))/df
        return beta * pi * (np.log(pi) - (pi * np.log(pi)).sum())

    g_theta = -delta * f_a
    g_bm = -delta * (km / km.sum() - pim) + ent_grad(pim)
    g_wm = np.outer(g_bm, u_a)
    g_bs = -delta * (ks / ks.sum() - pis) + ent_grad(pis)
    g_ws = np.outer(g_bs, u_a)
    ref = flat_params(g_theta, g_wm, g_bm, g_ws, g_bs)
    np.testing.assert_allclose(p.grad_cache, ref, rtol=1e-9, atol=1e-12)

    # finite differences of the losses the closed forms are gradients of
    h = 1e-6
    target = payoff + gamma * theta @ f_b          # TD target, held fixed (semi-gradient)

    def critic_loss(th):
        return 0.5 * (th @ f_a - target) ** 2

    fd = np.array([(critic_loss(theta + h * e) - critic_loss(theta - h * e)) / (2 * h)
                   for e in np.eye(len(theta))])
    np.testing.assert_allclose(fd, g_theta, rtol=1e-5, atol=1e-7)

    def actor_loss(W, B, k):
        pi = softmax(W @ u_a + B)
        return -delta * mean_logp(W, B, u_a, k) + beta * (pi * np.log(pi)).sum()

    fd_w = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            E = np.zeros((n, n))
            E[i, j] = h
            fd_w[i, j] = (actor_loss(Wm + E, Bm, km) - actor_loss(Wm - E, Bm, km)) / (2 * h)
    fd_b = np.array([(actor_loss(Wm, Bm + h * e, km) - actor_loss(Wm, Bm - h * e, km)) / (2 * h)
                     for e in np.eye(n)])
    np.testing.assert_allclose(fd_w, g_wm, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fd_b, g_bm, rtol=1e-5, atol=1e-7)


def test_gradients_are_cached_and_averaged_over_the_batch():
    n, me = 3, 0
    # plain AdamW (lr_boost=1): the boosted step has its own test (test_lr_boost.py)
    p = make(n, me, batch_windows=3, init="zero", critic_lr=0.1, actor_lr=0.1,
             weight_decay=0.0, lr_boost=1.0)
    rng = np.random.default_rng(0)
    hooks.step(p, 0, 1.0 * S, [None, 2.0 * S, 3.0 * S])
    for w in range(1, 3):
        hooks.sample_many(p, "arrival", 10)
        hooks.step(p, w, rng.uniform(0, 4) * S, [None, rng.uniform(0, 4) * S, 0.5 * S])
    assert p.batches == 0
    g = p.grad_cache
    assert np.any(g != 0)
    params0 = p.params
    hooks.sample_many(p, "arrival", 10)
    hooks.step(p, 3, 2.0 * S, [None, 1.0 * S, 0.5 * S])
    assert p.batches == 1 and p.adam_steps == 1
    assert np.all(p.grad_cache == 0)
    # the first Adam step moves every parameter with a non-zero gradient by ~lr
    moved = np.abs(p.params - params0)
    m, v = p.adam_moments
    nz = np.sqrt(v / (1 - 0.999)) > 1e-4       # |g| well above eps
    assert nz.sum() > n
    np.testing.assert_allclose(moved[nz], 0.1, rtol=1e-3)


def test_learn_every_samples_one_window_in_k_and_keeps_the_batch_interval():
    n, me = 3, 0
    p = make(n, me, batch_windows=6, learn_every=3, init="zero", critic_lr=0.1,
             actor_lr=0.1, weight_decay=0.0)
    rng = np.random.default_rng(0)
    hooks.step(p, 0, 1.0 * S, [None, 2.0 * S, 3.0 * S])   # no transition yet
    nonzero = []
    for w in range(1, 6):
        hooks.sample_many(p, "arrival", 10)
        hooks.step(p, w, rng.uniform(0, 4) * S, [None, rng.uniform(0, 4) * S, 0.5 * S])
        nonzero.append(bool(np.any(p.grad_cache != 0)))
    # windows 1, 2: skipped; 3: its gradient cached; 4, 5: skipped (cache kept)
    assert nonzero == [False, False, True, True, True]
    assert p.batches == 0
    hooks.sample_many(p, "arrival", 10)
    hooks.step(p, 6, 2.0 * S, [None, 1.0 * S, 0.5 * S])  # sampled, and the batch's end
    assert p.batches == 1 and np.all(p.grad_cache == 0)
    with pytest.raises(ValueError):
        make(n, me, learn_every=-1)
    assert make(n, me).learn_every == 1             # auto: every window below 32 servers
    assert make(64, 0).learn_every == 4
    assert make(64, 0, learn_every=1).learn_every == 1



def test_the_default_batch_is_four_learning_windows():
    """batch_windows=0 (the default): AdamW after every fourth learning window, so 4 windows
    below 32 servers and 16 (the thesis's 1.6 ms) on 64, where one window in 4 learns."""
    for n, k in ((2, 1), (16, 1), (32, 2), (48, 3), (64, 4)):
        p = MalcolmPolicy(n, 0, seed=1)
        assert (p.learn_every, p.batch_windows) == (k, 4 * k)
    assert MalcolmPolicy(8, 0, seed=1, learn_every=3).batch_windows == 12
    assert MalcolmPolicy(8, 0, seed=1, batch_windows=7).batch_windows == 7
    assert MalcolmPolicy(8, 0, seed=1, **THESIS).batch_windows == 16
    # the cadence: one AdamW step per 4 windows once a transition exists
    n, me = 3, 0
    p = MalcolmPolicy(n, me, seed=1)
    rng = np.random.default_rng(0)
    steps = []
    for w in range(13):
        hooks.sample_many(p, "arrival", 10)
        hooks.step(p, w, rng.uniform(0, 4) * S, [None, rng.uniform(0, 4) * S, 0.5 * S])
        steps.append(p.adam_steps)
    assert steps == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]

# ---------------------------------------------------------------- AdamW
def adamw_ref(p, g, m, v, t, lr, b1, b2, eps, wd):
    """torch.optim.AdamW (amsgrad=False, maximize=False), written out."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mhat = m / (1 - b1 ** t)
    vhat = v / (1 - b2 ** t)
    return p - lr * mhat / (np.sqrt(vhat) + eps), m, v


def _adamw_against_reference(kw, steps, actor_lr_at, seed):
    """``steps`` AdamW steps of random gradients through ``make(5, 2, **kw)`` against
    ``adamw_ref``, the actors at ``actor_lr_at(t)`` in step t; returns the policy."""
    p = make(5, 2, **kw)
    d = p.n_theta
    P = p.params
    m = np.zeros_like(P)
    v = np.zeros_like(P)
    rng = np.random.default_rng(seed)
    for t in range(1, steps + 1):
        g = rng.normal(size=P.shape) * 10.0 ** rng.uniform(-3, 1, size=P.shape)
        hooks.apply_adamw(p, g)
        Pc, mc, vc = adamw_ref(P[:d], g[:d], m[:d], v[:d], t, kw["critic_lr"], kw["beta1"],
                               kw["beta2"], kw["eps"], kw["weight_decay"])
        Pa, ma, va = adamw_ref(P[d:], g[d:], m[d:], v[d:], t, actor_lr_at(t), kw["beta1"],
                               kw["beta2"], kw["eps"], kw["weight_decay"])
        P, m, v = np.concatenate([Pc, Pa]), np.concatenate([mc, ma]), np.concatenate([vc, va])
        np.testing.assert_allclose(p.params, P, rtol=1e-12, atol=1e-14)
        pm, pv = p.adam_moments
        np.testing.assert_allclose(pm, m, rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(pv, v, rtol=1e-12, atol=1e-300)
    return p


def test_adamw_matches_reference_over_several_steps():
    kw = dict(critic_lr=0.03, actor_lr=0.007, weight_decay=0.05, beta1=0.8, beta2=0.99,
              eps=1e-6, lr_boost=1.0)
    p = _adamw_against_reference(kw, 5, lambda t: kw["actor_lr"], 1)
    # the new weights reach the published distribution
    u = p.loads / S
    np.testing.assert_allclose(p.probs_migrate, softmax(p.W_migrate @ u + p.B_migrate),
                               rtol=1e-9)


@pytest.mark.parametrize("steps", [0, 40])
def test_second_moment_rate_rises_as_adafactor_s_schedule(steps):
    """beta2_decay = c: step t's second-moment rate is min(beta2, 1 - t^-c) for t <= beta2_steps
    (0: every t), beta2 after. Step 1's rate is 0, so v is a weighted mean of the g^2 seen
    (weights summing to 1) and needs no bias correction; the rate reaches beta2 at t = (1 -
    beta2)^(-1/c) and stays there."""
    kw = dict(critic_lr=0.03, actor_lr=0.007, weight_decay=0.05, beta1=0.8, beta2=0.99,
              eps=1e-6, lr_boost=1.0, beta2_decay=0.8, beta2_steps=steps)
    p = make(5, 2, **kw)
    P = p.params
    m, v = np.zeros_like(P), np.zeros_like(P)
    rng = np.random.default_rng(2)
    lr = np.where(np.arange(P.size) < p.n_theta, kw["critic_lr"], kw["actor_lr"])
    rates = []
    for t in range(1, 400):
        g = rng.normal(size=P.shape) * 10.0 ** rng.uniform(-3, 1, size=P.shape)
        hooks.apply_adamw(p, g)
        b2 = kw["beta2"] if 0 < steps < t else min(kw["beta2"], 1.0 - t ** -kw["beta2_decay"])
        rates.append(b2)
        P = P * (1 - lr * kw["weight_decay"])
        m = kw["beta1"] * m + (1 - kw["beta1"]) * g
        v = b2 * v + (1 - b2) * g * g
        P = P - lr * (m / (1 - kw["beta1"] ** t)) / (np.sqrt(v) + kw["eps"])
        if t < 8 or t % 50 == 0:
            np.testing.assert_allclose(p.params, P, rtol=1e-10, atol=1e-13)
            np.testing.assert_allclose(p.adam_moments[1], v, rtol=1e-12, atol=1e-300)
    assert rates[0] == 0.0 and rates[9] < 0.85 and rates[-1] == kw["beta2"]
    assert rates[steps] == kw["beta2"] if steps else rates[100] < kw["beta2"]
    # 0 is plain AdamW (Algorithm 1's, which THESIS keeps; the reference test above)
    assert ac.DEFAULTS["beta2_decay"] == 0.8 and THESIS["beta2_decay"] == 0.0


@pytest.mark.parametrize("steps", [0, 30])
def test_cold_lr_steps_the_actors_through_the_cold_start(steps):
    """cold_lr > 0: the actors step at cold_lr through the first beta2_steps AdamW steps (0:
    every step), at actor_lr after them; the critic keeps critic_lr. cold_lr = 0 (THESIS's,
    and items 1-18) is actor_lr throughout: the reference test above."""
    kw = dict(critic_lr=0.03, actor_lr=0.007, cold_lr=0.05, weight_decay=0.05, beta1=0.8,
              beta2=0.99, eps=1e-6, lr_boost=1.0, beta2_steps=steps)
    _adamw_against_reference(
        kw, 60, lambda t: kw["actor_lr"] if 0 < steps < t else kw["cold_lr"], 4)
    assert ac.DEFAULTS["cold_lr"] == 0.015 and THESIS["cold_lr"] == 0.0
    assert ac.DEFAULTS["beta2_steps"] == 250 and ac.DEFAULTS["weight_lr"] == 0.001


# ---------------------------------------------------------------- consensus
def test_sampled_decisions_follow_published_probabilities():
    n = 5
    p = make(n, 2, learn=False)
    pm = np.array([0.1, 0.25, 0.3, 0.05, 0.3])
    ps = np.array([0.4, 0.1, 0.2, 0.2, 0.1])
    p.set_params(W_migrate=np.zeros((n, n)), B_migrate=np.log(pm),
                 W_steal=np.zeros((n, n)), B_steal=np.log(ps))
    np.testing.assert_allclose(p.probs_migrate, pm, rtol=1e-12)
    draws = 200_000
    km = hooks.sample_many(p, "arrival", draws)
    ks = hooks.sample_many(p, "steal", draws)
    # 5 sigma of a binomial proportion is < 0.0055 here
    np.testing.assert_allclose(km / draws, pm, atol=0.0055)
    np.testing.assert_allclose(ks / draws, ps, atol=0.0055)
    # with weights, the logits follow the loads incrementally (eq. 6.1) until published
    W = np.diag([-1.0] * n)
    p.set_params(W_migrate=W, B_migrate=np.zeros(n))
    loads = np.array([1.0, 2.0, 3.0, 0.5, 4.0])
    hooks.step(p, 0, loads[2] * S, list(loads * S))
    np.testing.assert_allclose(p.probs_migrate, softmax(-loads), rtol=1e-9)
    km = hooks.sample_many(p, "arrival", draws)
    np.testing.assert_allclose(km / draws, softmax(-loads), atol=0.0055)


def test_loads_are_scaled_and_clipped():
    p = make(2, 0, load_scale=1000.0, load_clip=4.0, init="zero")
    p.set_params(W_migrate=np.array([[0.0, 0.0], [1.0, 0.0]]))
    hooks.step(p, 0, 1e9, [None, 0.0])                 # runaway own queue: input clipped to 4
    np.testing.assert_allclose(p.probs_migrate, softmax(np.array([0.0, 4.0])), rtol=1e-12)
    hooks.step(p, 1, float("nan"), [None, 0.0])        # a NaN load cannot poison the logits
    np.testing.assert_allclose(p.probs_migrate, [0.5, 0.5])


# ---------------------------------------------------------------- it learns
def _migrate_prob(p, u):
    return softmax(p.W_migrate @ u + p.B_migrate)[1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learns_to_migrate_when_own_load_is_much_higher(seed):
    """Two servers; only server 0 receives tasks and both serve at the same rate. Episodes
    of 10 windows start from own load 8 vs peer load 1 (in units of load_scale) or the
    mirror image. Migrating shrinks the imbalance in the first and grows it in the second,
    so the learned migrate probability must go up in the first and stay low in the second:
    a state-dependent rule, learned from the payoff alone."""
    p = MalcolmPolicy(2, 0, seed=seed, batch_windows=4, consensus_every=0, actor_lr=0.01,
                      init_scale=0.1)
    state = np.array([8.0, 1.0])
    before = _migrate_prob(p, state)
    x = state.copy()
    for w in range(3000):
        if w % 10 == 0:
            x = state.copy() if w % 20 == 0 else state[::-1].copy()
        hooks.step(p, w * 100_000, x[0] * S, [None, x[1] * S])
        m = hooks.sample_many(p, "arrival", 20)[1]
        x[0] = max(0.0, x[0] + 0.1 * (20 - m) - 1.0)
        x[1] = max(0.0, x[1] + 0.1 * m - 1.0)
    after = _migrate_prob(p, state)
    assert after > before + 0.15 and after > 0.8, (before, after)
    # ... and it has not simply learned to always migrate: in the mirrored state it accepts
    assert _migrate_prob(p, state[::-1]) < 0.5


def test_frozen_policy_does_not_change():
    p = MalcolmPolicy(2, 0, seed=4, batch_windows=1, learn=False)
    before = p.params
    for w in range(50):
        hooks.step(p, w, 5.0 * S, [None, 0.0])
        hooks.sample_many(p, "arrival", 10)
    np.testing.assert_array_equal(p.params, before)
    assert p.batches == 0


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize("kw, exc, match", [
    (dict(bogus=1), TypeError, "unknown parameter"),
    (dict(gamma=1.0), ValueError, "gamma"),
    (dict(gamma=-0.1), ValueError, "gamma"),
    (dict(batch_windows=-1), ValueError, "batch_windows"),
    (dict(batch_windows=2.5), TypeError, "batch_windows"),
    (dict(window_ns=0), ValueError, "window_ns"),
    (dict(consensus_every=-1), ValueError, "consensus_every"),
    (dict(actor_lr=-1.0), ValueError, "actor_lr"),
    (dict(cold_lr=-0.01), ValueError, "cold_lr"),
    (dict(cold_lr=float("inf")), ValueError, "cold_lr"),
    (dict(weight_lr=-2.0), ValueError, "weight_lr"),
    (dict(tilt_lr=-0.1), ValueError, "tilt_lr"),
    (dict(tilt_max=-1.0), ValueError, "tilt_max"),
    (dict(critic_lr=float("nan")), ValueError, "critic_lr"),
    (dict(eps=0.0), ValueError, "eps"),
    (dict(beta2=1.0), ValueError, "beta2"),
    (dict(beta2_decay=1.5), ValueError, "beta2_decay"),
    (dict(beta2_decay=-0.1), ValueError, "beta2_decay"),
    (dict(beta2_steps=-1), ValueError, "beta2_steps"),
    (dict(load_scale=-1.0), ValueError, "load_scale"),
    (dict(consensus="mode"), ValueError, "consensus"),
    (dict(actor="deep"), ValueError, "actor"),
    (dict(theta_bound=0.0), ValueError, "theta_bound"),
    (dict(runaway_windows=-1), ValueError, "runaway_windows"),
    (dict(trust=float("inf")), ValueError, "trust"),
    (dict(capacity_prior="perhaps"), TypeError, "capacity_prior"),
    (dict(migration_cost="high"), TypeError, "migration_cost"),
    (dict(init="xavier"), ValueError, "init"),
    (dict(features="deep"), ValueError, "features"),
    (dict(learn="maybe"), TypeError, "learn"),
])
def test_bad_params_raise_clear_errors(kw, exc, match):
    with pytest.raises(exc, match=match):
        MalcolmPolicy(4, 0, **kw)


def test_bad_rack_and_seed():
    with pytest.raises(ValueError, match="rack size"):
        MalcolmPolicy(0, 0)
    with pytest.raises(ValueError, match="server index"):
        MalcolmPolicy(4, 4)
    with pytest.raises(ValueError, match="seed"):
        MalcolmPolicy(4, 0, seed=-1)


def test_init_zero_and_random_are_reproducible():
    z = MalcolmPolicy(4, 1, init="zero")
    assert np.all(z.params == 0)
    np.testing.assert_allclose(z.probs_migrate, 0.25)
    a = MalcolmPolicy(4, 1, seed=9, init="random", init_scale=0.5)
    b = MalcolmPolicy(4, 1, seed=9, init="random", init_scale=0.5)
    c = MalcolmPolicy(4, 2, seed=9, init="random", init_scale=0.5)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)
    assert np.all(np.abs(a.params) <= 0.5) and np.any(a.params != 0)
    assert a.config()["init_scale"] == 0.5


def test_registry_builds_malcolm():
    reg = pytest.importorskip("malcolm.policy.registry")
    name, params = reg.parse_policy("malcolm:batch_windows=8,actor_lr=0.02,init=zero")
    p = reg.make_policy(name, 8, 3, seed=1, **params)
    assert isinstance(p, MalcolmPolicy)
    assert p.batch_windows == 8 and p.actor_lr == 0.02 and p.init == "zero"
    with pytest.raises(ValueError, match="unknown parameter"):
        reg.make_policy("malcolm", 8, 3, nope=1)


# ---------------------------------------------------------------- concurrency
def test_decisions_never_see_a_torn_table_while_publishing():
    """One thread samples (nogil) while another publishes two alternating distributions:
    all mass on outcome 1, or all on outcome 3. A half-written CDF would yield 0 or 2."""
    n = 4
    p = make(n, 0, learn=False, init="zero")
    b_a = np.array([-60.0, 60.0, -60.0, -60.0])
    b_b = np.array([-60.0, -60.0, -60.0, 60.0])
    counts = {}
    hooks.publish_flip(p, b_b, b_b, 1)

    def sample():
        counts["k"] = hooks.sample_many(p, "arrival", 2_000_000)

    th = threading.Thread(target=sample)
    th.start()
    hooks.publish_flip(p, b_a, b_b, 200_000)
    th.join(timeout=60)
    assert not th.is_alive()
    k = counts["k"]
    assert k.sum() == 2_000_000
    assert k[0] == 0 and k[2] == 0, k


# ---------------------------------------------------------------- experimental options
def test_relative_actor_inputs_logits_and_gradients():
    """actor_input="relative": logits W z + B with z_j = u_j - u_me (0 for me and unknown
    peers), and the TD actor gradient with z in place of u."""
    n, me, beta = 4, 1, 0.2
    p = make(n, me, init_scale=0.3, entropy=beta, actor_input="relative")
    assert p.config()["actor_input"] == "relative"
    # window A: peer 3 is never heard of
    loads_a = np.array([3.0, 5.0, 1.0, 0.0]) * S
    hooks.step(p, 0, loads_a[me], [loads_a[0], None, loads_a[2], None])
    Wm, Bm, Ws, Bs = p.W_migrate, p.B_migrate, p.W_steal, p.B_steal
    theta = p.theta
    z_a = np.array([3.0 - 5.0, 0.0, 1.0 - 5.0, 0.0])
    pim, pis = p.probs_migrate, p.probs_steal
    np.testing.assert_allclose(pim, softmax(Wm @ z_a + Bm), rtol=1e-9)
    np.testing.assert_allclose(pis, softmax(Ws @ z_a + Bs), rtol=1e-9)
    km = hooks.sample_many(p, "arrival", 50)
    ks = hooks.sample_many(p, "steal", 20)
    # window B: own load moves (every relative input moves), peer 3 appears
    loads_b = np.array([2.0, 4.0, 1.0, 6.0]) * S
    hooks.step(p, 1, loads_b[me], list(loads_b))
    z_b = np.array([2.0 - 4.0, 0.0, 1.0 - 4.0, 6.0 - 4.0])
    np.testing.assert_allclose(p.probs_migrate, softmax(Wm @ z_b + Bm), rtol=1e-9)
    known_a = [True, True, True, False]
    f_a = ref_features(np.array([3.0, 5.0, 1.0, 0.0]), known_a)
    f_b = ref_features(loads_b / S, [True] * n)
    delta = -f_b[1] + 0.9 * theta @ f_b - theta @ f_a
    assert p.last_td_error == pytest.approx(delta, rel=1e-10)

    def ent_grad(pi):
        return beta * pi * (np.log(pi) - (pi * np.log(pi)).sum())

    g_bm = -delta * (km / km.sum() - pim) + ent_grad(pim)
    g_bs = -delta * (ks / ks.sum() - pis) + ent_grad(pis)
    ref = flat_params(-delta * f_a, np.outer(g_bm, z_a), g_bm, np.outer(g_bs, z_a), g_bs)
    np.testing.assert_allclose(p.grad_cache, ref, rtol=1e-9, atol=1e-12)


def ref_imbalance(v):
    v = np.asarray(v, float)
    return np.abs(v[:, None] - v[None, :]).sum() / (len(v) - 1)


def ref_marginal_advantages(v, s, me, mc, sc):
    """Brute force: the potential after one decision, per outcome (constant offsets drop
    out of the gradient)."""
    n = len(v)
    am, ast = np.zeros(n), np.zeros(n)
    for i in range(n):
        w = v.copy()
        w[i] += s[i]
        am[i] = -ref_imbalance(w) - (mc if i != me else 0.0)
        w = v.copy()
        if i != me:
            w[i] -= s[i]
            w[me] += s[me]
        ast[i] = -ref_imbalance(w) - (sc if i != me else 0.0)
    return am, ast


def ref_actor_grads(pim, pis, am, ast, u, beta):
    """The full actors' reference gradients for advantages ``am``, ``ast`` at inputs ``u``:
    per actor the descent gradient -pi_i (A_i - pi . A) plus the entropy term's, then
    (g_bm, g_bs, W_m, B_m, W_s, B_s flattened as ``grad_cache`` holds them)."""
    def closed(pi, A):
        return -pi * (A - pi @ A) + beta * pi * (np.log(pi) - (pi * np.log(pi)).sum())

    g_bm, g_bs = closed(pim, am), closed(pis, ast)
    return g_bm, g_bs, np.concatenate([np.outer(g_bm, u).T.ravel(), g_bm,
                                       np.outer(g_bs, u).T.ravel(), g_bs])


@pytest.mark.parametrize("kind", ["marginal", "difference"])
def test_marginal_advantage_gradient_matches_brute_force_and_finite_differences(kind):
    """advantage="marginal"/"difference": descent gradient -pi_i (A_i - pi . A) on the
    logits, A from the exact one-task change of the potential (at the published state, or
    at the end-of-window state for "difference"), one task = 1 / (rate * load_scale)."""
    n, me, mc, sc, beta = 5, 2, 0.05, 0.03, 0.1
    p = make(n, me, init_scale=0.3, entropy=beta, migration_cost=mc, steal_cost=sc,
             advantage=kind, load_clip=4.0)
    assert p.config()["advantage"] == kind
    cores = np.array([14.0, 14.0, 4.0, 4.0, 8.0])
    rates = cores / S                                   # tasks per ns at 50 µs a task
    s = 1.0 / (rates * S)                               # one task's load, in load_scale units
    loads_a = np.array([0.5, 2.0, 9.0, 1.0, 3.0]) * S   # 9 > load_clip: unclipped in A
    hooks.step(p, 0, loads_a[me], list(loads_a), rates=list(rates))
    Wm, Bm, Ws, Bs = p.W_migrate, p.B_migrate, p.W_steal, p.B_steal
    u_a = np.minimum(loads_a / S, 4.0)
    pim, pis = p.probs_migrate, p.probs_steal
    # Decisions in the window: the advantage must not depend on them (checked below).
    hooks.sample_many(p, "arrival", 40)
    hooks.sample_many(p, "steal", 40)
    loads_b = np.array([1.0, 1.5, 7.0, 2.0, 0.2]) * S
    hooks.step(p, 1, loads_b[me], list(loads_b), rates=list(rates))
    v = (loads_a if kind == "marginal" else loads_b) / S
    am, ast = ref_marginal_advantages(v, s, me, mc, sc)

    def actor_loss(W, B, A):       # -expected one-decision potential - beta H
        pi = softmax(W @ u_a + B)
        return -(pi * A).sum() + beta * (pi * np.log(pi)).sum()

    g_bm, g_bs, ref_actors = ref_actor_grads(pim, pis, am, ast, u_a, beta)
    g = p.grad_cache
    d = p.n_theta
    np.testing.assert_allclose(g[d:], ref_actors, rtol=1e-9, atol=1e-12)
    h = 1e-6
    for W, B, A, gb in ((Wm, Bm, am, g_bm), (Ws, Bs, ast, g_bs)):
        fd_b = np.array([(actor_loss(W, B + h * e, A) - actor_loss(W, B - h * e, A)) / (2 * h)
                         for e in np.eye(n)])
        np.testing.assert_allclose(fd_b, gb, rtol=1e-5, atol=1e-8)
        E = np.zeros((n, n))
        E[3, 2] = h
        fd_w = (actor_loss(W + E, B, A) - actor_loss(W - E, B, A)) / (2 * h)
        assert fd_w == pytest.approx(gb[3] * u_a[2], rel=1e-5, abs=1e-8)
    # the critic still learns by TD(0), whatever the actors' signal
    assert np.all(g[:d] != 0.0)
    # the decision counts do not enter: a window without decisions leaves the actors'
    # cached gradients exactly as they were (compared with the native values themselves,
    # so the check is bit-exact whatever rounding the build's FMA contraction gives)
    before = p.grad_cache[d:].copy()
    hooks.step(p, 2, loads_b[me], list(loads_b), rates=list(rates))
    assert np.array_equal(p.grad_cache[d:], before)


@pytest.mark.parametrize("herd,t_ns", [(0.7, None), (2.0, None), (8.0, 2 * S)])
def test_herd_term_matches_a_reference(herd, t_ns):
    """herd > 0: each migrate advantage is the one-task change of the potential after peer
    i's load has taken herd x rho^4 x M x (q_i - c_i) x s_i, M the rack's migrations in the
    window (the peers' heartbeat counts here), q_i this agent's share of its migrations to
    i, c_i i's share of the peers' rates, rho the peers' busy share of their workers (1
    while no task time ``t_ns`` is measured); the accept outcome and the steals as without."""
    n, me, mc, sc, beta = 5, 2, 0.05, 0.03, 0.1
    p = make(n, me, init_scale=0.3, entropy=beta, migration_cost=mc, steal_cost=sc,
             advantage="difference", load_clip=4.0, herd=herd, herd_busy=4.0)
    assert p.config()["herd"] == herd and p.config()["herd_busy"] == 4.0
    if t_ns is not None:        # the own task time, which the peers' workers are counted in
        p.py_completions(1000, 1000 * np.log(t_ns), 1000 * t_ns)
    rates = np.array([14.0, 14.0, 4.0, 4.0, 8.0]) / S
    s = 1.0 / (rates * S)
    loads_a = np.array([0.5, 2.0, 9.0, 1.0, 3.0]) * S
    hooks.step(p, 0, loads_a[me], list(loads_a), rates=list(rates),
               peer_migrations=[10, 20, 0, 5, 7])
    u_a = np.minimum(loads_a / S, 4.0)
    pim, pis = p.probs_migrate, p.probs_steal
    hooks.sample_many(p, "arrival", 40)
    hooks.sample_many(p, "steal", 40)
    # close loads and 40 migrations in the window: the herd's shifts cross other loads
    loads_b = np.array([1.0, 1.2, 1.6, 1.1, 0.9]) * S
    hooks.step(p, 1, loads_b[me], list(loads_b), rates=list(rates),
               peer_migrations=[25, 30, 0, 10, 12])      # 15 + 10 + 5 + 5 in the window
    v = loads_b / S
    q = pim / (1.0 - pim[me])
    c = rates / (rates.sum() - rates[me])
    rho = 1.0
    if t_ns is not None:        # workers r_j t, tasks x_j r_j (no speed codes: t everywhere)
        peers = np.arange(n) != me
        w, k = rates[peers] * t_ns, loads_b[peers] * rates[peers]
        rho = np.minimum(w, k).sum() / w.sum()
        assert 0.5 < rho < 0.6      # the term at 0.08 of its unscaled weight
    dh = herd * rho ** 4 * 35 * (q - c) * s
    am = np.empty(n)
    for i in range(n):
        w = v.copy()
        if i != me:
            w[i] += dh[i]
        base = ref_imbalance(w)
        w[i] += s[i]
        am[i] = -(ref_imbalance(w) - base) - (mc if i != me else 0.0)
    am0, ast = ref_marginal_advantages(v, s, me, mc, sc)
    am0 -= am0[me] - am[me]                    # the same constant as am's (it drops out)
    assert np.abs(am - am0).max() > 0.1        # the term changes the migrate advantages

    ref = ref_actor_grads(pim, pis, am, ast, u_a, beta)[2]
    np.testing.assert_allclose(p.grad_cache[p.n_theta:], ref, rtol=1e-9, atol=1e-12)


def test_herd_is_validated():
    for name, bads in (("herd", (-0.1, 11.0)), ("herd_busy", (-1.0, 17.0))):
        for bad in bads + (float("nan"),):
            with pytest.raises(ValueError, match=name):
                MalcolmPolicy(4, 0, **{name: bad})


@pytest.mark.parametrize("state", ["decision", "window"])
def test_steal_advantage_is_credited_at_the_own_load_where_the_steals_went_ahead(state):
    """steal_state="decision" (the default) with the live gate: a steal's one-task change of
    the potential puts our own load where the gateway stole, q + used - done (q the tasks at
    the publish) averaged over the steals that went ahead, not at the window's end; the
    migrate actor and the peers stay at the window's end."""
    n, me, mc, sc, beta = 5, 2, 0.05, 0.03, 0.1
    p = make(n, me, init_scale=0.3, entropy=beta, migration_cost=mc, steal_cost=sc,
             advantage="difference", load_clip=4.0, hop_gate=True, gate_live=True,
             steal_idle=False, steal_state=state)
    assert p.config()["steal_state"] == state
    rates = np.array([14.0, 14.0, 4.0, 4.0, 8.0]) / S
    s = 1.0 / (rates * S)
    loads_a = np.array([0.5, 9.0, 2.0, 1.0, 3.0]) * S       # q = 8 tasks here
    hooks.step(p, 0, loads_a[me], list(loads_a), rates=list(rates))
    u_a = np.minimum(loads_a / S, 4.0)
    pim, pis = p.probs_migrate, p.probs_steal
    kept = int(hooks.sample_many(p, "arrival", 6)[me])
    # one completion at a time, so that each steal's own queue is known: after the t-th
    # completion q + kept - t tasks are here
    went = [t for t in range(1, 9) if hooks.sample_many(p, "steal", 1)[me] == 0]
    assert len(went) >= 2
    loads_b = np.array([1.0, 1.5, 7.0, 2.0, 0.2]) * S
    hooks.step(p, 1, loads_b[me], list(loads_b), rates=list(rates))
    v = loads_b / S
    am, _ = ref_marginal_advantages(v, s, me, mc, sc)
    w = v.copy()
    if state == "decision":
        q = loads_a[me] * rates[me] + kept - np.mean(went)
        w[me] = max(q, 0.0) * s[me]
        # among the peers' loads, where the potential's change depends on it
        assert np.sort(np.delete(v, me))[0] < w[me] < np.sort(np.delete(v, me))[-1]
    _, ast = ref_marginal_advantages(w, s, me, mc, sc)

    ref_actors = ref_actor_grads(pim, pis, am, ast, u_a, beta)[2]
    np.testing.assert_allclose(p.grad_cache[p.n_theta:], ref_actors, rtol=1e-9, atol=1e-12)


def test_steal_state_is_checked():
    assert MalcolmPolicy(4, 0).config()["steal_state"] == "decision"
    with pytest.raises(ValueError, match="steal_state"):
        MalcolmPolicy(4, 0, steal_state="completion")


def test_marginal_advantage_without_rates_uses_unit_task():
    n, me = 3, 0
    p = make(n, me, init="zero", entropy=0.0, migration_cost=0.0, steal_cost=0.0,
             advantage="marginal")
    loads = np.array([1.0, 3.0, 0.0]) * S
    hooks.step(p, 0, loads[me], list(loads))
    hooks.sample_many(p, "arrival", 10)
    hooks.sample_many(p, "steal", 10)
    hooks.step(p, 1, loads[me], list(loads))
    am, ast = ref_marginal_advantages(loads / S, np.ones(n), me, 0.0, 0.0)
    pi = np.full(n, 1.0 / n)
    g = p.grad_cache[p.n_theta:]
    np.testing.assert_allclose(g[n * n:n * n + n], -pi * (am - pi @ am), rtol=1e-12, atol=1e-14)
    # migrating to the idle server 2 is best, so its logit's descent gradient is negative
    assert g[n * n + 2] < 0 < g[n * n + 1]


@pytest.mark.parametrize("kw, exc, match", [
    (dict(actor_input="centred"), ValueError, "actor_input"),
    (dict(advantage="gae"), ValueError, "advantage"),
])
def test_bad_experimental_params_raise(kw, exc, match):
    with pytest.raises(exc, match=match):
        MalcolmPolicy(4, 0, **kw)


def test_defaults_are_the_guarded_difference_policy():
    cfg = MalcolmPolicy(4, 0).config()
    assert cfg["actor_input"] == "absolute" and cfg["advantage"] == "difference"
    assert cfg["actor"] == "sparse" and cfg["init"] == "safe" and cfg["consensus"] == "median"
    assert cfg["load_scale"] == 0.0 and cfg["hop_ns"] == -1.0      # derived, measured


def test_a_stolen_task_goes_first_only_when_asked():
    from malcolm.policy.registry import make_policy
    assert MalcolmPolicy(4, 0).stolen_first is False                 # FIFO by default
    assert MalcolmPolicy(4, 0, **THESIS).stolen_first is False      # the thesis's FIFO
    assert MalcolmPolicy(4, 0, stolen_first="1").stolen_first is True
    assert make_policy("malcolm", 4, 0, 1, stolen_first=True).stolen_first is True
    assert make_policy("steal", 4, 0, 1).stolen_first is False       # baselines: FIFO
    with pytest.raises(TypeError, match="stolen_first"):
        MalcolmPolicy(4, 0, stolen_first=2)


def test_agent_state_is_not_constructed_alone():
    # AgentState holds MalcolmPolicy's memory but allocates nothing itself: constructing it
    # alone must fail cleanly, not leave an object whose decide_* would read NULL tables.
    from malcolm.policy.agent_state import AgentState
    with pytest.raises(TypeError, match="construct MalcolmPolicy"):
        AgentState(4, 0)


def test_observe_peer_hook_sequence_and_theta_bound():
    p = ac.MalcolmPolicy(3, 0, seed=1)
    p.py_observe_peer(0, 1, 1000.0, seq=7)
    p.py_observe_peer(0, 1, 5000.0, seq=6)        # older than 7: dropped
    assert p.loads[1] == 1000.0
    p.py_observe_peer(0, 1, 3000.0)               # no seq: newer than any before
    assert p.loads[1] == 3000.0
    with pytest.raises(ValueError, match="critic parameters"):
        p.py_observe_peer(0, 1, 0.0, theta=np.zeros(257))
    with pytest.raises(ValueError, match="out of range"):
        p.py_observe_peer(0, 3, 0.0)
