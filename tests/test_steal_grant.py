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
    assert make_policy("malcolm", 4, 0, 1, steal_grant=0).steal_grant == 0.0
    for bad, err in ((-1.0, ValueError), (1e4, ValueError), (float("nan"), ValueError),
                     ("2", ValueError)):      # the registry reports a TypeError as a bad parameter
        with pytest.raises(err):
            make_policy("malcolm", 4, 0, 1, steal_grant=bad)


def test_every_steal_is_granted_before_a_hop_is_known():
    p = make_policy("malcolm", 4, 0, 1, steal_grant=1000.0)
    assert p.py_grant_steal(1.0, 1e-3) and p.grant_refused == 0
    assert make_policy("jsq", 4, 0, 1).py_grant_steal(0.5, 1.0)     # other policies: always


def test_two_hops_is_the_default_bit_for_bit():
    a = simulate(policy="malcolm", **RACK)
    b = simulate(policy="malcolm:steal_grant=2", **RACK)
    c = simulate(policy="malcolm:steal_grant=0", **RACK)
    assert (a.p99_us, a.steals, a.migrations) == (b.p99_us, b.steals, b.migrations)
    assert c.steals > a.steals          # 0 turns the bar off: every steal granted


def test_the_bar_refuses_steals_that_would_not_pay_for_their_hop():
    base = simulate(policy="malcolm:steal_grant=0", **RACK)
    some = simulate(policy="malcolm:steal_grant=2", **RACK)
    none = simulate(policy="malcolm:steal_grant=1000", **RACK)
    assert base.steals > 0 and none.steal_requests > 0
    assert none.steals == 0                 # no queue here holds 1000 hops of work
    assert 0 < some.steals < base.steals
    # with a bar of 2 hops (13.7 us) an 11-worker victim grants less often than a one-worker
    # one: its waiting work is 1/11 of a task time per waiting task
    assert some.steal_empty > base.steal_empty


def test_frozen_start_has_the_rule_too():
    base = simulate(policy="malcolm:learn=0,steal_grant=0", **RACK)
    some = simulate(policy="malcolm:learn=0,steal_grant=2", **RACK)
    assert some.steals < base.steals
