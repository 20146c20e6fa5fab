"""A Malcolm agent and its peers: what the heartbeats carry and what the agent keeps of them
(sequence numbers, cumulative counts, the window's moves), the critics' consensus and its
sorting network (``policy/_select.h``), and the per-peer advantages' two paths
(``policy/_adv_kernels.h``), each against a reference or bit for bit. Split from
``test_actor_critic.py``, whose helpers it uses.
"""

import numpy as np
import pytest

ac = pytest.importorskip("malcolm.policy.actor_critic")
hooks = pytest.importorskip("malcolm.policy._testing")
from test_actor_critic import S, make  # noqa: E402

MalcolmPolicy = ac.MalcolmPolicy


def test_consensus_averages_own_and_latest_peer_thetas():
    n, me = 4, 2
    p = make(n, me, consensus_every=3, learn=True)
    d = p.n_theta
    rng = np.random.default_rng(5)
    own = p.theta
    t0, t1 = rng.normal(size=d), rng.normal(size=d)
    stale = rng.normal(size=d)
    p.py_observe_peer(0, 0, 1.0 * S, theta=stale)
    p.py_observe_peer(0, 0, 1.0 * S, theta=t0)           # newer one replaces it
    p.py_observe_peer(0, 1, 1.0 * S, theta=t1)
    p.py_observe_peer(0, 3, 1.0 * S, theta=np.ones(d - 1))  # wrong length: ignored
    p.py_observe_peer(0, 1, 1.0 * S, theta=stale, seq=0)   # reordered, older: dropped
    hooks.consensus(p)
    np.testing.assert_allclose(p.theta, (own + t0 + t1) / 3, rtol=1e-12)
    assert p.consensus_rounds == 1
    # peer 3 never sent a usable theta: still excluded; the rest keep their latest
    p.py_observe_peer(0, 3, 1.0 * S, theta=np.full(d, 4.0))
    before = p.theta
    hooks.consensus(p)
    np.testing.assert_allclose(p.theta, (before + t0 + t1 + 4.0) / 4, rtol=1e-12)


def test_consensus_runs_every_c_windows():
    p = make(3, 0, consensus_every=2, learn=False)
    for w in range(5):
        hooks.step(p, w, 1.0 * S, [None, 1.0 * S, 1.0 * S])
    assert p.consensus_rounds == 0, "a frozen policy does not average"
    p = make(3, 0, consensus_every=2, critic_lr=0.0, actor_lr=0.0, weight_decay=0.0)
    d = p.n_theta
    peer = [None, np.zeros(d), np.zeros(d)]
    own = p.theta
    hooks.step(p, 0, 1.0 * S, [None, 1.0 * S, 1.0 * S], peer_thetas=peer)
    np.testing.assert_allclose(p.theta, own)
    hooks.step(p, 1, 1.0 * S, [None, 1.0 * S, 1.0 * S], peer_thetas=peer)
    assert p.consensus_rounds == 1
    np.testing.assert_allclose(p.theta, own / 3, rtol=1e-12)


# ---------------------------------------------------------------- heartbeats and decisions
def test_heartbeat_carries_load_counts_and_theta():
    p = make(3, 1)
    p.py_observe_local(5, 2.5 * S, 7.0, 1e-4)
    p.migrations = 17          # the driver's counts of tasks that actually moved
    p.steals = 5
    hb = p.py_heartbeat()
    assert hb["src"] == 1
    assert hb["load"] == 2.5 * S and hb["queue_len"] == 7.0 and hb["rate"] == 1e-4
    assert hb["migrations"] == 17 and hb["steals"] == 5
    np.testing.assert_allclose(hb["theta"], p.theta)
    # decide_steal says -1 for "no steal"
    p.set_params(B_steal=np.array([-50.0, 50.0, -50.0]), W_steal=np.zeros((3, 3)))
    assert all(p.py_decide_steal() == -1 for _ in range(100))


@pytest.mark.parametrize("seed", range(4))
def test_consensus_sorting_network_gives_numpys_medians(seed):
    """The consensus's medians (a sorting network of rows, _select.h) are numpy's, bit for
    bit, for every row count 1..64: ties, signs and a column of one repeated value."""
    rng = np.random.default_rng(seed)
    for k in range(1, 65):
        d = int(rng.integers(1, 9))
        v = rng.normal(0.0, 10.0, (k, d))
        v[:, 0] = np.round(v[:, 0])                 # ties
        if d > 1:
            v[:, -1] = 3.5
        got = hooks.median_rows(v)
        assert np.array_equal(got, np.median(v, axis=0)), (k, d)


@pytest.mark.parametrize("n, herd", [(64, 0.5), (13, 0.5), (7, 0.0)])
def test_advantages_scalar_and_vector_paths_give_the_same_bits(n, herd):
    """_marginal_advantages' outcomes (_adv_kernels.h) on the scalar path and on AVX2's
    (where the CPU has it): the same gradients and parameters, bit for bit, over windows
    of random loads and speeds with unknown and masked peers, steals credited where they
    went ahead (the steal load apart from the window's end)."""
    import malcolm.policy.agent_state as st

    def run(scalar):
        st._scalar_advantages(scalar)
        try:
            rng = np.random.default_rng(n)
            p = MalcolmPolicy(n, 3, seed=5, herd=herd, batch_windows=10_000, learn_every=1,
                              steal_state="decision")
            rates = rng.choice([1.0, 4.0, 16.0], n) / S
            for w in range(12):
                loads = list(rng.exponential(2.0, n) * S)
                loads[5] = None if w < 6 else loads[5]           # unknown, then known
                hooks.sample_many(p, "arrival", 30)
                hooks.sample_many(p, "steal", 30)
                hooks.step(p, w * 100_000, loads[3], loads, rates=list(rates),
                           peer_migrations=[10 * w] * n)
            return p.grad_cache.copy(), p.params.copy(), p.probs_migrate.copy()
        finally:
            st._scalar_advantages(False)

    for a, b in zip(run(True), run(False), strict=True):
        assert np.array_equal(a, b)
    assert np.any(run(False)[0] != 0.0)


def test_peer_costs_use_cumulative_counts_across_lost_heartbeats():
    p = make(3, 0, migration_cost=1.0, steal_cost=10.0, init="zero")
    hooks.step(p, 0, 1.0 * S, [None, 1.0 * S, 1.0 * S], peer_migrations=[0, 5, 5],
              peer_steals=[0, 1, 1])
    hooks.step(p, 1, 1.0 * S, [None, 1.0 * S, None], peer_migrations=[0, 6, 0],
              peer_steals=[0, 1, 0])                       # peer 2 lost
    assert p.last_cost == pytest.approx(1.0)
    hooks.step(p, 2, 1.0 * S, [None, 1.0 * S, 1.0 * S], peer_migrations=[0, 6, 9],
              peer_steals=[0, 1, 2])
    assert p.last_cost == pytest.approx(4.0 + 10.0)        # both windows of peer 2
    assert p.last_imbalance == 0.0
    p.migrations += 3                                      # own, as the driver counts them
    p.steals += 1
    hooks.step(p, 3, 1.0 * S, [None, 1.0 * S, 1.0 * S], peer_migrations=[0, 6, 9],
              peer_steals=[0, 1, 2])
    assert p.last_cost == pytest.approx(3.0 + 10.0)


def test_peer_moves_are_counted_per_window_from_the_latest_count():
    """A peer's moves in a window are its latest count less the one at the last window's
    end: a reordered (older) heartbeat changes nothing, a count that went down counts 0 and
    is the new base, and a window's move beyond 10^6 is clamped and counted once."""
    p = make(3, 0, migration_cost=1.0, steal_cost=0.0, init="zero")
    p.py_observe_local(0, 1.0 * S, 1.0, 1.0 / S)
    p.py_observe_peer(0, 1, 1.0 * S, rate=1.0 / S, migrations=100, seq=10)
    p.py_end_window(1)
    assert p.last_cost == 0.0                        # moves before we knew of it
    p.py_observe_peer(2, 1, 1.0 * S, rate=1.0 / S, migrations=103, seq=11)
    p.py_observe_peer(3, 1, 1.0 * S, rate=1.0 / S, migrations=101, seq=9)    # older: dropped
    p.py_observe_peer(4, 1, 1.0 * S, rate=1.0 / S, migrations=107, seq=12)
    p.py_end_window(5)
    assert p.last_cost == 7.0
    p.py_observe_peer(6, 1, 1.0 * S, rate=1.0 / S, migrations=50, seq=13)     # went down
    p.py_end_window(7)
    assert p.last_cost == 0.0
    p.py_observe_peer(8, 1, 1.0 * S, rate=1.0 / S, migrations=52, seq=14)
    p.py_end_window(9)
    assert p.last_cost == 2.0 and p.hb_clamped == 0
    for k in range(3):                               # 1.8 M in one window, 0.6 M a beat
        p.py_observe_peer(10 + k, 1, 1.0 * S, rate=1.0 / S,
                          migrations=52 + 600_000 * (k + 1), seq=15 + k)
    p.py_end_window(20)
    assert p.last_cost == 1_000_000.0 and p.hb_clamped == 1
