"""The policy's native kernels at rack scale (issue 12, item 5) against numpy references.

The sort of the known loads (a rank sort), the consensus median (quickselect) and the
publish step's softmax with the capacity prior as weights replaced simpler code for speed
on 64-server racks; these tests check them where that code matters: 63-64 servers, ties,
servers not heard from, skewed rates.
"""

import numpy as np
import pytest

ac = pytest.importorskip("malcolm.policy.actor_critic")
hooks = pytest.importorskip("malcolm.policy._testing")
MalcolmPolicy = ac.MalcolmPolicy

T = 50_000.0        # one task's service time, ns


def ref_imbalance(u):
    u = np.asarray(u, float)
    return np.abs(u[:, None] - u[None, :]).sum() / (len(u) - 1) if len(u) > 1 else 0.0


def test_features_at_64_servers_with_ties_and_silent_peers_match_numpy():
    """Integer loads (many ties), some peers never heard from, the order changing every
    window: the critic's features (I(u), mean, max, min through the sorted loads) are the
    numpy values."""
    n, me = 64, 5
    rng = np.random.default_rng(11)
    p = MalcolmPolicy(n, me, seed=1, load_scale=T, learn=False)
    silent = {3, 17, 40}
    heard = np.array([j not in silent for j in range(n)])
    for w in range(12):
        loads = rng.integers(0, 6, n).astype(float) * T
        if w % 3 == 0:
            loads[:] = rng.uniform(0, 40, n) * T      # some beyond load_clip (32)
        peers = [None if j in silent else loads[j] for j in range(n)]
        hooks.step(p, w * 100_000, loads[me], peer_loads=peers)
        u = np.clip(loads / T, 0.0, p.load_clip)[heard]
        f = p.features()
        mean = u.mean()
        np.testing.assert_allclose(f, [1.0, ref_imbalance(u), mean, u.max() - mean,
                                       mean - u.min()], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [63, 64])
def test_consensus_median_at_scale_matches_numpy(n):
    """The coordinate-wise median of own and n - 1 peers' critics (odd and even counts,
    ties) is numpy's median."""
    me = 0
    p = MalcolmPolicy(n, me, seed=2, consensus_every=0)
    d = p.n_theta
    rng = np.random.default_rng(n)
    thetas = np.round(rng.normal(size=(n, d)), 1)          # rounded: many ties
    for j in range(1, n):
        p.py_observe_peer(0, j, 0.0, theta=thetas[j])
    own = p.theta
    hooks.consensus(p)
    allv = np.vstack([own, thetas[1:]])
    np.testing.assert_array_equal(p.theta, np.median(allv, axis=0))


def test_migrate_probs_at_64_servers_match_the_log_prior():
    """Rates skewed 16:1 over 64 servers, equal loads (no mask): the published migrate
    distribution is softmax(start + log capacity prior), the prior's logs computed by numpy
    (the policy multiplies by the weights instead)."""
    n, me = 64, 7
    workers = np.array([16.0 if j % 8 == 0 else 1.0 + (j % 3) for j in range(n)])
    rates = workers / T
    p = MalcolmPolicy(n, me, seed=3, learn=False)
    loads = np.full(n, 2.0 * T)
    hooks.step(p, 0, loads[me], peer_loads=list(loads), rates=rates)
    R, rbar = rates.sum(), rates.mean()
    spare = rates ** 2 / (R + (n - 1) * rates)
    c = (R - rates[me]) / ((spare.sum() - spare[me]) * rbar)
    logits = np.log(c * spare)
    logits[me] = np.log(rates[me] / rbar) + np.log(n)      # the safe start's accept bias
    ref = np.exp(logits - logits.max())
    np.testing.assert_allclose(p.probs_migrate, ref / ref.sum(), rtol=1e-12)
    assert p.probs_migrate.sum() == pytest.approx(1.0, abs=1e-12)


def test_masked_outcomes_get_exactly_zero_at_64_servers():
    """Overloaded peers (migrate) and peers not busier than us (steal) get probability 0
    exactly, the rest sums to 1."""
    n, me = 64, 0
    p = MalcolmPolicy(n, me, seed=4, learn=False, load_scale=T)
    loads = np.full(n, 1.0 * T)
    loads[10:14] = 40.0 * T         # far above 2x the mean: masked for migration
    loads[me] = 3.0 * T
    hooks.step(p, 0, loads[me], peer_loads=list(loads), rates=np.full(n, 1.0 / T))
    pm, ps = p.probs_migrate, p.probs_steal
    assert np.all(pm[10:14] == 0.0) and np.all(pm[14:] > 0.0)
    assert np.all(ps[np.r_[1:10, 14:n]] == 0.0) and np.all(ps[10:14] > 0.0)
    assert pm.sum() == pytest.approx(1.0, abs=1e-12)
    assert ps.sum() == pytest.approx(1.0, abs=1e-12)
