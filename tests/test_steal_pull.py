"""``steal_pull``: after each AdamW step the steal actor's parameters move towards their safe
start by steal_pull (1 - min(1, d^2)), d Adam's per-parameter direction (``_ac_kernels.h``).

Checked against a numpy reference, for what it is for (a parameter that follows zero-mean noise
stays near the start, one with a consistent gradient still learns), and for its neutral value
(0 computes the same bits as without it)."""
import numpy as np
import pytest

ac = pytest.importorskip("malcolm.policy.actor_critic")
hooks = pytest.importorskip("malcolm.policy._testing")
MalcolmPolicy = ac.MalcolmPolicy


def ref(p, g, m, v, t, lr, b1, b2, eps, wd, boost, p0=None, pull=0.0):
    """AdamW with the consistency boost (tests/test_lr_boost.py), then the pull."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    d = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    q = np.minimum(1.0, d * d)
    p = p - lr * d * (1.0 + (boost - 1.0) * q * q)
    if pull > 0.0:
        p = p - pull * (1.0 - q) * (p - p0)
    return p, m, v


def test_pull_matches_reference_on_full_actors():
    kw = dict(critic_lr=0.03, actor_lr=0.007, weight_decay=0.05, beta1=0.8, beta2=0.99,
              eps=1e-6, lr_boost=7.0, steal_pull=0.4)
    p = MalcolmPolicy(5, 2, seed=3, batch_windows=10_000, consensus_every=0,
                      **{**ac.THESIS, **kw})
    d, n = p.n_theta, 5
    ws = p.n_params - n * n - n             # layout: [theta | Wm | Bm | Ws | Bs]
    P = p.params
    P0 = P.copy()
    m, v = np.zeros_like(P), np.zeros_like(P)
    rng = np.random.default_rng(1)
    for t in range(1, 8):
        g = rng.normal(size=P.shape) * 10.0 ** rng.uniform(-3, 1, size=P.shape)
        g[::2] = np.abs(g[::2]) + 0.5       # half keep their sign, half are noise
        hooks.apply_adamw(p, g)
        Pc, mc, vc = ref(P[:d], g[:d], m[:d], v[:d], t, kw["critic_lr"], kw["beta1"],
                         kw["beta2"], kw["eps"], kw["weight_decay"], 1.0)
        Pm, mm, vm = ref(P[d:ws], g[d:ws], m[d:ws], v[d:ws], t, kw["actor_lr"], kw["beta1"],
                         kw["beta2"], kw["eps"], kw["weight_decay"], kw["lr_boost"])
        Ps, ms, vs = ref(P[ws:], g[ws:], m[ws:], v[ws:], t, kw["actor_lr"], kw["beta1"],
                         kw["beta2"], kw["eps"], kw["weight_decay"], kw["lr_boost"], P0[ws:],
                         kw["steal_pull"])
        P = np.concatenate([Pc, Pm, Ps])
        m, v = np.concatenate([mc, mm, ms]), np.concatenate([vc, vm, vs])
        np.testing.assert_allclose(p.params, P, rtol=1e-12, atol=1e-14)


def _run(pull, grads, n=6, me=2):
    p = MalcolmPolicy(n, me, seed=1, batch_windows=10_000, consensus_every=0,
                      weight_decay=0.0, trust=0.0, steal_pull=pull)
    for g in grads:
        hooks.apply_adamw(p, g)
    return p


def test_noise_stays_near_the_start_and_a_consistent_gradient_still_learns():
    n, me, steps = 6, 2, 400
    npar = MalcolmPolicy(n, me, seed=1).n_params
    off_bs, off_bm = npar - n, npar - 2 * n - n * n
    rng = np.random.default_rng(5)
    grads = np.zeros((steps, npar))
    peer, noisy = (me + 1) % n, (me + 2) % n
    for off in (off_bs, off_bm):
        grads[:, off + peer] = 1.0 + 0.3 * rng.normal(size=steps)    # consistent: descend
        grads[:, off + noisy] = rng.normal(size=steps)               # zero-mean noise
    p0, p1 = _run(0.0, grads), _run(0.3, grads)
    b0, b1 = p0.B_steal, p1.B_steal
    # the steal actor: noise wanders less far from the start (0); a consistent gradient still
    # moves its parameter by logits, though less far: the pull, pull (1 - q) (p - p0) with q
    # near 0.9 here, balances the boosted step at about step / (pull (1 - q)) from the start
    assert abs(b1[noisy]) < 0.5 * abs(b0[noisy]), (b1[noisy], b0[noisy])
    assert b0[peer] < b1[peer] < -1.0, (b1[peer], b0[peer])
    # the migrate actor and the critic are untouched: the same bits
    np.testing.assert_array_equal(p1.B_migrate, p0.B_migrate)
    np.testing.assert_array_equal(p1.theta, p0.theta)


def test_zero_is_the_default_and_computes_the_same_bits():
    assert ac.DEFAULTS["steal_pull"] == 0.0
    rng = np.random.default_rng(3)
    a = MalcolmPolicy(5, 1, seed=2, batch_windows=10_000, consensus_every=0)
    b = MalcolmPolicy(5, 1, seed=2, batch_windows=10_000, consensus_every=0, steal_pull=0.0)
    for _ in range(20):
        g = rng.normal(size=a.n_params)
        hooks.apply_adamw(a, g)
        hooks.apply_adamw(b, g)
    np.testing.assert_array_equal(a.params, b.params)
    assert b.config()["steal_pull"] == 0.0
    with pytest.raises(ValueError, match="steal_pull"):
        MalcolmPolicy(4, 1, steal_pull=1.5)
