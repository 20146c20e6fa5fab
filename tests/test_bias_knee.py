"""``bias_knee``: the sparse migrate actor's peer biases take the consistency boost's full
factor from |d| = bias_knee instead of 1 (``_ac_kernels.h``, docs/policy.md "Learning curve
and settle time", eighth session). Every other parameter keeps the ``lr_boost`` rule, and
``bias_knee=1`` computes the same bits as before the parameter existed.
"""
import numpy as np
import pytest

ac = pytest.importorskip("malcolm.policy.actor_critic")
hooks = pytest.importorskip("malcolm.policy._testing")
MalcolmPolicy = ac.MalcolmPolicy


def knee_ref(p, g, m, v, t, lr, b1, b2, eps, wd, boost, knee):
    """AdamW with the consistency boost, full from |d| = knee (tests/test_lr_boost.py's
    reference with min(1, d^2) -> min(1, (d / knee)^2))."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    d = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    q = np.minimum(1.0, d * d / (knee * knee))
    return p - lr * d * (1.0 + (boost - 1.0) * q * q), m, v


def _layout(p):
    n, npar = p.n, p.n_params
    off_bm = npar - 2 * n - n * n          # [theta | Wm | Bm | Ws | Bs]
    return [off_bm + j for j in range(n) if j != p.me]


def test_migrate_peer_biases_follow_the_reference_and_nothing_else_changes():
    n, me, knee = 6, 2, 0.5
    kw = dict(seed=3, batch_windows=10_000, consensus_every=0, trust=0.0)
    pk = MalcolmPolicy(n, me, bias_knee=knee, **kw)
    p1 = MalcolmPolicy(n, me, **kw)
    idx = _layout(pk)
    P = pk.params[idx]
    m, v = np.zeros(len(idx)), np.zeros(len(idx))
    rng = np.random.default_rng(11)
    mean = rng.normal(size=pk.n_params)
    for t in range(1, 40):
        # a consistent part and noise of about its size: |d| mostly between 0.3 and 1,
        # where the knee matters
        g = mean + rng.normal(size=pk.n_params)
        hooks.apply_adamw(pk, g)
        hooks.apply_adamw(p1, g)
        P, m, v = knee_ref(P, g[idx], m, v, t, pk.actor_lr, pk.beta1, pk.beta2, pk.eps,
                           pk.weight_decay, pk.lr_boost, knee)
        np.testing.assert_allclose(pk.params[idx], P, rtol=1e-12, atol=1e-14)
    rest = np.ones(pk.n_params, bool)
    rest[idx] = False
    np.testing.assert_array_equal(pk.params[rest], p1.params[rest])
    assert np.any(pk.params[idx] != p1.params[idx])


def test_a_half_consistent_gradient_moves_the_bias_faster():
    """|d| about 0.5 (mean gradient 0.58 of its noise): the lr_boost rule gives about
    1 + 29 * 0.5^4 = 2.8x, the knee at 0.5 the full 30x on most steps."""
    n, me, steps = 6, 2, 300
    kw = dict(seed=1, batch_windows=10_000, consensus_every=0, trust=0.0, weight_decay=0.0)
    p1 = MalcolmPolicy(n, me, **kw)
    pk = MalcolmPolicy(n, me, bias_knee=0.5, **kw)
    j = _layout(p1)[0]
    rng = np.random.default_rng(5)
    for _ in range(steps):
        g = np.zeros(p1.n_params)
        g[j] = 0.58 + rng.normal()
        hooks.apply_adamw(p1, g)
        hooks.apply_adamw(pk, g)
    P0 = MalcolmPolicy(n, me, **kw).params[j]
    d1, dk = p1.params[j] - P0, pk.params[j] - P0
    assert d1 < 0 and dk < 0
    assert dk / d1 > 3.0, dk / d1


def test_default_is_one_and_config_round_trips():
    kw = dict(seed=2, batch_windows=10_000, consensus_every=0)
    pd = MalcolmPolicy(4, 1, **kw)
    p1 = MalcolmPolicy(4, 1, bias_knee=1.0, **kw)
    g = np.random.default_rng(3).normal(size=pd.n_params)
    for _ in range(5):
        hooks.apply_adamw(pd, g)
        hooks.apply_adamw(p1, g)
    assert pd.bias_knee == 1.0 and pd.config()["bias_knee"] == 1.0
    np.testing.assert_array_equal(pd.params, p1.params)
    assert MalcolmPolicy(4, 1, bias_knee=0.5).config()["bias_knee"] == 0.5
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="bias_knee"):
            MalcolmPolicy(4, 1, bias_knee=bad)
