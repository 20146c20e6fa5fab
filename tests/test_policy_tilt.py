"""The capacity tilt (``tilt_lr``): a learnt preference keyed to what a server is.

migrate logit_j += t * (log r_j - the peers' mean log rate) for the peers j, with one scalar t
per agent learnt by the same difference-advantage gradient as the biases (chain rule:
d logit_j / dt = the centred log rate).
Checked: the gradient against a finite difference of the loss it descends, the trust bound
and the runaway reset, that a rate change moves every logit at once, and a skewed rack at
high load that the thesis's default ran away on.
"""

import numpy as np
import pytest

ac = pytest.importorskip("malcolm.policy.actor_critic")
hooks = pytest.importorskip("malcolm.policy._testing")
from test_policy_guards import T, capacity_prior, feed, imbalance, rates_of, softmax  # noqa: E402

MalcolmPolicy = ac.MalcolmPolicy


def tilt_inputs(rates, me):
    """log r_j minus the peers' mean log rate, 0 for accepting."""
    lr = np.log(np.asarray(rates, float))
    out = lr - np.delete(lr, me).mean()
    out[me] = 0.0
    return out


def test_tilt_off_by_default_and_frozen_copy_is_the_default_start():
    p = MalcolmPolicy(4, 1, seed=1)
    q = MalcolmPolicy(4, 1, seed=1, tilt_lr=0.01, learn=False)
    rates = rates_of([8, 4, 2, 1])
    loads = np.array([1.0, 2.0, 0.5, 3.0]) * T
    for w in range(40):
        feed(p, w, loads, rates)
        feed(q, w, loads, rates)
    assert p.tilt_lr == 0.0 and p.config()["tilt_lr"] == 0.0
    assert q.tilt == 0.0
    np.testing.assert_array_equal(p.probs_migrate, q.probs_migrate)


@pytest.mark.parametrize("t0", [0.0, 0.3, -0.2])
def test_tilt_gradient_matches_finite_difference(t0):
    n, me, beta, mc, hop = 4, 2, 0.3, 0.01, 4000.0
    p = MalcolmPolicy(n, me, seed=1, batch_windows=10_000, consensus_every=0, hop_ns=hop,
                      entropy=beta, migration_cost=mc, steal_cost=mc, mask_factor=0.0,
                      tilt_lr=0.01, hop_weight=1.0)     # the reference charges the whole hop
    rng = np.random.default_rng(5)
    W = rng.normal(scale=0.3, size=(n, n))
    B = rng.normal(scale=0.3, size=n)
    p.set_params(W_migrate=W, B_migrate=B, W_steal=W.T.copy(), B_steal=B[::-1].copy())
    rates = rates_of([4.0, 2.0, 1.0, 8.0])
    ls = 1.0 / rates.mean()
    loads_a = np.array([3.0, 1.0, 2.0, 0.5]) * ls
    feed(p, 0, loads_a, rates)
    hooks.set_tilt(p, t0)
    ell = tilt_inputs(rates, me)
    np.testing.assert_allclose(p.tilt_inputs, ell, rtol=1e-12, atol=1e-15)
    u = loads_a / ls
    z = np.clip(u - u.mean(), -4, 4)
    g_m = B + np.diag(W) * z + np.where(np.arange(n) != me, W[:, me] * z[me], 0.0)
    prior = capacity_prior(rates, me)
    np.testing.assert_allclose(p.probs_migrate, softmax(g_m + t0 * ell + prior), rtol=1e-9)
    hooks.sample_many(p, "arrival", 30)
    loads_b = np.array([2.0, 2.0, 3.0, 1.0]) * ls
    feed(p, 1, loads_b, rates)
    v = loads_b / ls
    s = 1.0 / (rates * ls)
    am = np.zeros(n)
    for i in range(n):
        x = v.copy()
        x[i] += s[i]
        am[i] = -imbalance(x) - (mc + hop / ls if i != me else 0.0)
    pi0 = softmax(prior)

    def loss(t):      # what the migrate actor descends: -E_pi[A] + beta KL(pi || start)
        pi = softmax(g_m + t * ell + prior)
        return -pi @ am + beta * (pi * np.log(pi / pi0)).sum()

    eps = 1e-6
    fd = (loss(t0 + eps) - loss(t0 - eps)) / (2 * eps)
    assert p.tilt_grad == pytest.approx(fd, rel=1e-6, abs=1e-10)
    # the chain rule through the biases' gradient (the same per-outcome coefficients)
    gb = p.grad_cache[p.n_theta + n * n:p.n_theta + n * n + n]
    assert p.tilt_grad == pytest.approx(gb @ ell, rel=1e-12, abs=1e-15)


def test_a_rate_change_moves_every_tilted_logit_at_once():
    """The learnt preference belongs to capacities: after a rate change the published
    distribution is the tilt on the new rates, with nothing to unlearn."""
    n, me, t = 4, 0, 0.4
    p = MalcolmPolicy(n, me, seed=1, tilt_lr=0.01, learn=False)
    loads = np.array([1.0, 1.0, 1.0, 1.0]) * T
    for rates in (rates_of([8, 8, 4, 4]), rates_of([8, 4, 4, 4])):   # server 1 slowed
        feed(p, 0, loads, rates)
        hooks.set_tilt(p, t)
        ell = tilt_inputs(rates, me)
        g = np.zeros(n)
        g[me] = np.log(n)
        ref = softmax(g + t * ell + capacity_prior(rates, me))
        np.testing.assert_allclose(p.probs_migrate, ref, rtol=1e-9)


def test_tilt_stays_within_the_trust_region_and_resets():
    n, me = 6, 0
    p = MalcolmPolicy(n, me, seed=1, batch_windows=1, actor_lr=1.0, tilt_lr=1.0, tilt_max=0.2,
                      runaway_windows=10, cold_lr=0.0, weight_lr=-1)
    rates = rates_of([16, 16, 1, 1, 1, 1])
    rng = np.random.default_rng(2)
    seen = []
    for w in range(300):
        loads = rng.uniform(0, 20, n) * T / 2
        p.py_observe_local(w, loads[me], 0.0, rates[me])
        for j in range(1, n):
            p.py_observe_peer(w, j, loads[j], rate=rates[j])
        hooks.sample_many(p, "arrival", 20)
        p.py_end_window(w)
        seen.append(p.tilt)
    assert np.abs(seen).max() <= 0.2 + 1e-12
    assert np.abs(seen).max() > 0.0
    assert np.all(np.isfinite(p.probs_migrate))
    for w in range(300, 320):     # own queue runs away: the reset clears the tilt too
        feed(p, w, np.array([100.0 + 10 * w, 1, 1, 1, 1, 1]) * T, rates)
    assert p.resets >= 1


def test_skewed_rack_at_high_load_does_not_run_away_with_the_tilt():
    """The runaway rack of issue 12 (few big servers, many small ones, 90% load), learning
    the tilt fast and nothing else per identity."""
    from malcolm.sim import simulate

    r = simulate(rack="2x16,10x1",
                 policy="malcolm:tilt_lr=0.03,actor_lr=0,cold_lr=0,weight_lr=0",
                 workload="exp:50", load=0.9, tasks=60_000, seed=7, warmup=0.3)
    mq = np.asarray(r.mean_queue, float)
    assert mq.max() < 64, mq
    assert r.p99_us < 5_000
