"""``steal_grant``: the victim's bar on a steal (docs/policy.md, "Where the steal actor's gains
went"). A steal request is answered with a task only if the victim's waiting work (waiting
tasks / its rate) is at least ``steal_grant`` one-way hops; the same policy method decides in
the simulator and in the runtime's gateway."""

import pytest

from malcolm.policy.registry import make_policy
from malcolm.sim import simulate

RACK = dict(rack="3x11,3x1", workload="rocksdb2", load=0.891, tasks=40_000, seed=1,
            delay_us=6.85)


def test_the_parameter_is_checked():
    assert make_policy("malcolm", 4, 0, 1).steal_grant == 2.0       # the default
    assert make_policy("malcolm", 4, 0, 1).grant_tasks == 1.0       # the default
    assert make_policy("malcolm", 4, 0, 1, steal_grant=0).steal_grant == 0.0
    for bad, err in ((-1.0, ValueError), (1e4, ValueError), (float("nan"), ValueError),
                     ("2", ValueError)):      # the registry reports a TypeError as a bad parameter
        with pytest.raises(err):
            make_policy("malcolm", 4, 0, 1, steal_grant=bad)


def test_every_steal_is_granted_before_a_hop_is_known():
    p = make_policy("malcolm", 4, 0, 1, steal_grant=1000.0)
    assert p.py_grant_steal(1.0, 1e-3) and p.grant_refused == 0
    assert make_policy("jsq", 4, 0, 1).py_grant_steal(0.5, 1.0)     # other policies: always


def test_two_hops_and_one_task_time_are_the_default_bit_for_bit():
    a = simulate(policy="malcolm", **RACK)
    b = simulate(policy="malcolm:steal_grant=2,grant_tasks=1", **RACK)
    c = simulate(policy="malcolm:steal_grant=0,grant_tasks=0", **RACK)
    d = simulate(policy="malcolm:grant_tasks=0", **RACK)
    assert (a.p99_us, a.steals, a.migrations) == (b.p99_us, b.steals, b.migrations)
    assert c.steals > d.steals > a.steals   # each part of the bar refuses steals; 0, 0: none


def test_the_bar_refuses_steals_that_would_not_pay_for_their_hop():
    base = simulate(policy="malcolm:steal_grant=0,grant_tasks=0", **RACK)
    some = simulate(policy="malcolm:steal_grant=2,grant_tasks=0", **RACK)
    none = simulate(policy="malcolm:steal_grant=1000,grant_tasks=0", **RACK)
    assert base.steals > 0 and none.steal_requests > 0
    assert none.steals == 0                 # no queue here holds 1000 hops of work
    assert 0 < some.steals < base.steals
    # with a bar of 2 hops (13.7 us) an 11-worker victim grants less often than a one-worker
    # one: its waiting work is 1/11 of a task time per waiting task
    assert some.steal_empty > base.steal_empty


def test_frozen_start_has_the_rule_too():
    base = simulate(policy="malcolm:learn=0,steal_grant=0,grant_tasks=0", **RACK)
    some = simulate(policy="malcolm:learn=0,steal_grant=2,grant_tasks=0", **RACK)
    assert some.steals < base.steals


def _one_worker_victim(peer_tasks=2.0, peer_workers=1, peer_speed=1.0, codes=True, **kw):
    """Server 0 of four servers after one window, a 10 µs hop, 50 µs tasks measured by 1000
    completions, the three peers (``peer_workers`` workers each, ``peer_speed`` times as
    fast, their speed codes in the heartbeats unless ``codes`` is False) reporting
    ``peer_tasks`` tasks (one number, or one each): the bar is published."""
    import math
    T, hop = 50_000.0, 10_000.0
    tasks = peer_tasks if isinstance(peer_tasks, (list, tuple)) else [peer_tasks] * 3
    p = make_policy("malcolm", 4, 0, 1, hop_ns=hop, learn=False, **kw)
    p.py_completions(1000, 1000 * math.log(T), 1000 * T)
    p.py_observe_local(0, 0.0, 0.0, 1.0 / T)
    for j in range(1, 4):
        r = peer_workers * peer_speed / T
        code = round(256 * math.log2(T / peer_speed)) if codes else 0
        p.py_observe_peer(0, j, tasks[j - 1] / r, rate=r, svc_lg=code)
    p.py_end_window(0)
    assert p.svc_lg == round(256 * math.log2(T))
    return p, 1.0 / T


def test_the_bar_adds_a_task_time_as_often_as_the_peers_have_no_worker_idle():
    # busy peers, grant_tasks=1: two hops (20 µs) + one task time (50 µs); one waiting task
    # is 50 µs of waiting work, two are 100
    p, r = _one_worker_victim(grant_tasks=1.0)
    assert p.grant_tasks == 1.0
    assert not p.py_grant_steal(1.0, r) and p.grant_refused == 1
    assert p.py_grant_steal(2.0, r)
    # a thief's next arrivals cost only where it has no other worker idle: idle peers add
    # nothing, and one busy peer of three (rates alike) a third of a task time
    q, r = _one_worker_victim(peer_tasks=0.0, grant_tasks=1.0)
    assert q.py_grant_steal(1.0, r) and q.grant_refused == 0
    assert q.py_grant_steal(0.41, r) and not q.py_grant_steal(0.39, r)    # 20 µs: 0.4 tasks
    h, r = _one_worker_victim(peer_tasks=[1.0, 0.0, 0.0], grant_tasks=1.0)
    assert h.py_grant_steal(0.74, r) and not h.py_grant_steal(0.72, r)    # 20 + 16.7 µs
    # four-worker peers with a worker idle each count for nothing; with all four busy, a
    # whole task time (their tasks per worker, 3/4, counted until the thirtieth session)
    f, r = _one_worker_victim(peer_tasks=3.0, peer_workers=4, grant_tasks=1.0)
    assert f.py_grant_steal(0.41, r) and not f.py_grant_steal(0.39, r)
    f, r = _one_worker_victim(peer_tasks=4.0, peer_workers=4, grant_tasks=1.0)
    assert f.py_grant_steal(1.41, r) and not f.py_grant_steal(1.39, r)
    # a peer's workers are its rate times its own task time, which its speed code gives:
    # an idle one-worker peer at half speed (0.5 / T, no worker filled) counts for nothing,
    # a one-worker peer four times as fast with a task (4 / T) for a whole task time
    f, r = _one_worker_victim(peer_tasks=0.0, peer_speed=0.5, grant_tasks=1.0)
    assert f.py_grant_steal(0.41, r) and not f.py_grant_steal(0.39, r)
    f, r = _one_worker_victim(peer_tasks=1.0, peer_speed=4.0, grant_tasks=1.0)
    assert f.py_grant_steal(1.41, r) and not f.py_grant_steal(1.39, r)
    # without the codes, both taken at the own speed: 0.5 and 4 workers
    f, r = _one_worker_victim(peer_tasks=0.0, peer_speed=0.5, codes=False, grant_tasks=1.0)
    assert not f.py_grant_steal(1.39, r)
    f, r = _one_worker_victim(peer_tasks=1.0, peer_speed=4.0, codes=False, grant_tasks=1.0)
    assert f.py_grant_steal(0.41, r)
    # hops alone: one waiting task is worth the 20 µs
    q, r = _one_worker_victim(grant_tasks=0.0)
    assert q.py_grant_steal(1.0, r) and q.grant_refused == 0
    # both 0: every steal granted
    z, r = _one_worker_victim(steal_grant=0.0, grant_tasks=0.0)
    assert z.py_grant_steal(1e-9, r)


def test_grant_tasks_is_checked_and_waits_for_a_measured_task_time():
    for bad in (-1.0, 1e4, float("nan")):
        with pytest.raises(ValueError):
            make_policy("malcolm", 4, 0, 1, grant_tasks=bad)
    # no completion measured yet: the bar is the hops alone
    p = make_policy("malcolm", 4, 0, 1, hop_ns=10_000.0, learn=False, grant_tasks=1000.0)
    p.py_observe_local(0, 0.0, 0.0, 1.0 / 50_000)
    p.py_observe_peer(0, 1, 0.0, rate=1.0 / 50_000)
    p.py_end_window(0)
    assert p.svc_mean_ns == 0.0
    assert p.py_grant_steal(1.0, 1.0 / 50_000)


def test_task_times_in_the_bar_refuse_the_steals_that_cost_the_thief_more():
    # a homogeneous rack of two-worker servers with constant 30 µs tasks at 0.9 and a 3 µs
    # hop, where two hops (6 µs) grant nearly every steal: the stolen task keeps the thief's
    # worker for a whole task time, and its own next arrivals queue behind it or move on
    rack = dict(rack="16x2", workload="mix:1:const:30", load=0.9, tasks=60_000, seed=1,
                delay_us=3.0)
    hops = simulate(policy="malcolm:grant_tasks=0", **rack)
    tasks = simulate(policy="malcolm:grant_tasks=1", **rack)
    assert tasks.steals < 0.6 * hops.steals
    assert tasks.p99_us < 0.95 * hops.p99_us
