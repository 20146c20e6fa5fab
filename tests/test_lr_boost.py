"""``lr_boost``: the actors' AdamW step scaled by how consistent their recent gradients are.

The step of each actor parameter is multiplied by 1 + (lr_boost - 1) min(1, d^2)^2, d =
m^ / (sqrt(v^) + eps) Adam's own direction (``_ac_kernels.h``); the critic and the tilt keep
plain AdamW. Checked against a numpy reference, and for what it is for: a consistent
gradient moves up to lr_boost times faster, zero-mean noise about as fast as without.
"""
import numpy as np
import pytest

ac = pytest.importorskip("malcolm.policy.actor_critic")
hooks = pytest.importorskip("malcolm.policy._testing")
MalcolmPolicy = ac.MalcolmPolicy


def boosted_ref(p, g, m, v, t, lr, b1, b2, eps, wd, boost):
    """AdamW (as tests/test_actor_critic.py's reference) with the consistency boost."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    d = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    q = np.minimum(1.0, d * d)
    return p - lr * d * (1.0 + (boost - 1.0) * q * q), m, v


def test_boosted_step_matches_reference_on_full_actors():
    kw = dict(critic_lr=0.03, actor_lr=0.007, weight_decay=0.05, beta1=0.8, beta2=0.99,
              eps=1e-6, lr_boost=7.0)
    p = MalcolmPolicy(5, 2, seed=3, consensus_every=0,
                      **{**ac.THESIS, **kw, "batch_windows": 10_000})
    d = p.n_theta
    P = p.params
    m, v = np.zeros_like(P), np.zeros_like(P)
    rng = np.random.default_rng(1)
    for t in range(1, 8):
        # half the coordinates keep their sign (d near 1: boosted), half are noise
        g = rng.normal(size=P.shape) * 10.0 ** rng.uniform(-3, 1, size=P.shape)
        g[::2] = np.abs(g[::2]) + 0.5
        hooks.apply_adamw(p, g)
        Pc, mc, vc = boosted_ref(P[:d], g[:d], m[:d], v[:d], t, kw["critic_lr"], kw["beta1"],
                                 kw["beta2"], kw["eps"], kw["weight_decay"], 1.0)
        Pa, ma, va = boosted_ref(P[d:], g[d:], m[d:], v[d:], t, kw["actor_lr"], kw["beta1"],
                                 kw["beta2"], kw["eps"], kw["weight_decay"], kw["lr_boost"])
        P, m, v = np.concatenate([Pc, Pa]), np.concatenate([mc, ma]), np.concatenate([vc, va])
        np.testing.assert_allclose(p.params, P, rtol=1e-12, atol=1e-14)


def _run(boost, grads, n=6, me=2):
    # beta1 0.9: the noise figures below (|d| ~ 0.23, mean step 1 + (boost - 1) / 45) are
    # for it; the default 0.95 boosts noise less
    p = MalcolmPolicy(n, me, seed=1, batch_windows=10_000, consensus_every=0,
                      weight_decay=0.0, trust=0.0, lr_boost=boost, beta1=0.9)
    trace = [np.array(p.B_migrate)]
    for g in grads:
        hooks.apply_adamw(p, g)
        trace.append(np.array(p.B_migrate))
    return p, np.array(trace)


def test_consistent_gradient_moves_boost_times_faster_noise_does_not():
    n, me, steps, boost = 6, 2, 400, 30.0
    npar = MalcolmPolicy(n, me, seed=1).n_params
    off_bm = npar - 2 * n - n * n     # layout: [theta | Wm | Bm | Ws | Bs]
    rng = np.random.default_rng(7)
    grads = np.zeros((steps, npar))
    peer, noisy = (me + 1) % n, (me + 2) % n
    grads[:, off_bm + peer] = 1.0 + 0.3 * rng.normal(size=steps)     # consistent: descend
    grads[:, off_bm + noisy] = rng.normal(size=steps)                # zero-mean noise
    p1, t1 = _run(1.0, grads, n, me)
    pb, tb = _run(boost, grads, n, me)
    # consistent: every step is boosted by 1 + (boost - 1) q^2 with d near 1
    d1, db = t1[-1, peer] - t1[0, peer], tb[-1, peer] - tb[0, peer]
    assert d1 < 0 and db < 0
    assert db / d1 > 0.8 * boost, db / d1
    # steady noise (after Adam's bias correction has faded): the mean step grows by about
    # 1 + (boost - 1) / 45 = 1.64, not boost times
    s1 = np.abs(np.diff(t1[50:, noisy])).mean()
    sb = np.abs(np.diff(tb[50:, noisy])).mean()
    assert 1.2 < sb / s1 < 2.5, sb / s1
    # the critic keeps plain AdamW: the same bits
    np.testing.assert_array_equal(pb.theta, p1.theta)


def test_lr_boost_is_on_by_default_and_config_round_trips():
    # lr_boost=1 against the plain numpy AdamW: test_actor_critic's reference test
    p1 = MalcolmPolicy(4, 1, seed=2, batch_windows=10_000, consensus_every=0, lr_boost=1.0)
    pd = MalcolmPolicy(4, 1, seed=2, batch_windows=10_000, consensus_every=0)
    g = np.random.default_rng(3).normal(size=p1.n_params)
    for _ in range(5):
        hooks.apply_adamw(p1, g)
        hooks.apply_adamw(pd, g)
    assert pd.lr_boost == 30.0 and p1.lr_boost == 1.0
    d = p1.n_theta
    np.testing.assert_array_equal(pd.params[:d], p1.params[:d])     # the critic: plain
    assert np.any(pd.params[d:] != p1.params[d:])                    # the actors: boosted
    q = MalcolmPolicy(4, 1, lr_boost=12)
    assert q.lr_boost == 12.0 and q.config()["lr_boost"] == 12.0
    with pytest.raises(ValueError, match="lr_boost"):
        MalcolmPolicy(4, 1, lr_boost=0.5)


def test_weight_boost_separates_the_sparse_load_weights():
    """weight_boost=1 keeps the load weights on plain AdamW while the biases are boosted;
    weight_boost alone (lr_boost=1) boosts only the weights."""
    n, me = 5, 1
    kw = dict(seed=4, batch_windows=10_000, consensus_every=0, trust=0.0)
    plain = MalcolmPolicy(n, me, lr_boost=1.0, **kw)
    both = MalcolmPolicy(n, me, lr_boost=30.0, **kw)
    biases = MalcolmPolicy(n, me, lr_boost=30.0, weight_boost=1.0, **kw)
    weights = MalcolmPolicy(n, me, lr_boost=1.0, weight_boost=30.0, **kw)
    g = 0.5 + np.random.default_rng(5).random(plain.n_params)     # consistent: boosted
    for _ in range(6):
        for p in (plain, both, biases, weights):
            hooks.apply_adamw(p, g)
    B = [np.array(p.B_migrate) for p in (plain, both, biases, weights)]
    W = [np.diag(np.array(p.W_migrate)) for p in (plain, both, biases, weights)]
    peers = [j for j in range(n) if j != me]
    np.testing.assert_array_equal(B[2], B[1])
    np.testing.assert_array_equal(W[2], W[0])
    np.testing.assert_array_equal(B[3], B[0])
    np.testing.assert_array_equal(W[3], W[1])
    assert np.all(np.abs(B[1] - B[0])[peers] > 1e-3)
    assert np.all(np.abs(W[1] - W[0])[peers] > 1e-3)
