"""``bench/conditions.py``, the held-out check under network and client conditions: its draws
are fixed by the seed and cover every condition, and its quick mode runs and reports."""

import json
import os
import sys

import pytest

pytest.importorskip("malcolm.policy.actor_critic")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import conditions  # noqa: E402


def test_draws_are_fixed_by_the_seed_and_cover_every_condition():
    a = conditions.draw_racks(150, 4444)
    assert a == conditions.draw_racks(150, 4444) and a != conditions.draw_racks(150, 1)
    assert conditions.draw_racks(20, 4444) == a[:20]          # a longer draw extends it
    assert {sc["condition"] for sc in a} == set(conditions.CONDITIONS)
    assert {sc["workload"] for sc in a} == set(conditions.WORKLOADS)
    for sc in a:
        n = len(sc["rack"].split(","))
        assert 2 <= n <= 16 and 0.3 <= sc["load"] <= 0.95 and 2 <= sc["delay_us"] <= 10
        if sc["condition"] == "uneven":
            assert len(sc["shares"]) == n and abs(sum(sc["shares"]) - 1) < 1e-9
    hi = conditions.draw_racks(30, 4444, loads=(0.8, 0.95))
    assert all(0.8 <= sc["load"] <= 0.95 for sc in hi)
    assert [sc["rack"] for sc in hi] == [sc["rack"] for sc in a[:30]]


def test_quick_run_reports_every_policy_and_condition(tmp_path, capsys):
    out = tmp_path / "c.json"
    conditions.main(["--quick", "--procs", "1", "--policy", "malcolm:learn=0",
                     "--json", str(out)])
    text = capsys.readouterr().out
    assert "| malcolm | all | 10 |" in text and "| malcolm:learn=0 | all | 10 |" in text
    assert "| jsq |" not in text                       # baselines are the reference
    d = json.loads(out.read_text())
    assert len(d["racks"]) == 10 and len(d["runs"]) == 10 * 5
    s = d["summary"]["malcolm"]["all"]
    assert s["racks"] == 10 and 0 <= s["within5"] <= 10 and s["worst"] > 0
    # learnt against frozen, counted from the same runs as the JSON's
    p99 = {(r["id"], r["policy"]): r["p99_us"] for r in d["runs"]}
    ratios = [p99[(sc["id"], "malcolm")] / p99[(sc["id"], "malcolm:learn=0")]
              for sc in d["racks"]]
    lo, eq, hi = (sum(r < 1 for r in ratios), sum(r == 1 for r in ratios),
                  sum(r > 1 for r in ratios))
    assert (f"Learnt against its frozen start (malcolm:learn=0): lower on {lo}, equal on {eq}, "
            f"higher on {hi} of 10 racks; worst {max(ratios):.3f}") in text


def test_learnt_vs_frozen_counts_each_rack_once():
    racks = [dict(id=i, rack="1x1,1x2", workload="exp:50", load=0.5, condition="loss")
             for i in range(3)]
    p99 = {(0, "malcolm"): 90.0, (0, conditions.FROZEN): 100.0,
           (1, "malcolm"): 100.0, (1, conditions.FROZEN): 100.0,
           (2, "malcolm"): 104.0, (2, conditions.FROZEN): 100.0}
    lo, eq, hi, worst, sc = conditions.learnt_vs_frozen(racks, p99)
    assert (lo, eq, hi, sc["id"]) == (1, 1, 1, 2) and abs(worst - 1.04) < 1e-12


def test_bad_arguments_are_one_line_errors(capsys):
    with pytest.raises(SystemExit) as e:
        conditions.main(["--load-range", "0.9,0.5"])
    assert e.value.code == 2 and "--load-range" in capsys.readouterr().err
