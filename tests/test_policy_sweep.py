"""The robustness sweep's smoke mode (``bench/sweep.py --quick``): it runs, and writes a table,
a CSV with one row per scenario and a plot. The full sweep is a benchmark, not a test."""

import json
import os
import sys

import pytest

pytest.importorskip("malcolm.policy.actor_critic")
pytest.importorskip("matplotlib")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import sweep  # noqa: E402


def test_quick_sweep_writes_table_csv_and_plot(tmp_path):
    sweep.main(["--quick", "--procs", "1", "--outdir", str(tmp_path), "--json",
                str(tmp_path / "sweep.json")])
    md = (tmp_path / "sweep.txt").read_text()
    for label in ("malcolm", "frozen", "jsq", "jbt", "po2"):
        assert f"| {label} |" in md
    rows = (tmp_path / "sweep.csv").read_text().splitlines()
    assert len(rows) == 1 + 6 and rows[0].startswith("id,rack")
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = json.loads((tmp_path / "sweep.json").read_text())
    assert len(d["scenarios"]) == 6 and len(d["runs"]) == 6 * 6
    assert d["metadata"]["config"]["quick"] is True


def test_scenarios_are_fixed_by_the_seed_and_cover_the_ranges():
    a = sweep.draw_scenarios(60, 2026)
    assert a == sweep.draw_scenarios(60, 2026)
    assert a != sweep.draw_scenarios(60, 7)
    assert min(s["n"] for s in a) >= 2 and max(s["n"] for s in a) <= 64
    assert max(s["skew"] for s in a) <= 16 and any(s["skew"] > 1 for s in a)
    assert {s["workload"] for s in a} == set(sweep.WORKLOADS)
    assert all(0.3 <= s["load"] <= 0.95 and 2 <= s["delay_us"] <= 10 for s in a)


def test_draw_ranges_keep_racks_and_workloads():
    """--load-range/--delay-range redraw only those two: the same racks and workloads, in range."""
    a = sweep.draw_scenarios(20, 2026)
    b = sweep.draw_scenarios(20, 2026, loads=(0.8, 0.95), delays=(20.0, 150.0))
    assert [(s["rack"], s["workload"]) for s in a] == [(s["rack"], s["workload"]) for s in b]
    assert all(0.8 <= s["load"] <= 0.95 and 20.0 <= s["delay_us"] <= 150.0 for s in b)
    assert a == sweep.draw_scenarios(20, 2026, loads=(0.3, 0.95), delays=(2.0, 10.0))


def test_learnt_vs_frozen_counts_exact_ties_apart():
    """An exact tie of the seed-medians is neither lower nor higher: reported on its own, and
    in the share of racks where learning is not higher (the reading of ties as not lost)."""
    scen = [dict(id=i, skew=2.0) for i in range(4)]
    p99 = {0: (90.0, 100.0), 1: (100.0, 100.0), 2: (100.05, 100.0), 3: (110.0, 100.0)}
    res = {}
    for i, (learnt, frozen) in p99.items():
        for label, _ in sweep.POLICIES:
            v = learnt if label == "malcolm" else frozen if label == "frozen" else 200.0
            res[(i, label)] = {"p99_us": v}
    lf = sweep.summarize(scen, res)["learn_vs_frozen"]
    assert lf["wins"] == 0.25 and lf["exact"] == 1 and lf["ties"] == 2
    assert lf["not_higher"] == 0.5 and lf["worst_ratio"] == 1.1


def test_window_reaches_every_simulation(monkeypatch):
    """--window and --phase reach every run (the defaults: the runtime's 100 µs, random)."""
    import malcolm.sim

    seen = []

    class R:
        p50_us = p99_us = mean_us = 1.0
        migrations = generated = 1

    def fake(**kw):
        seen.append((kw["window_us"], kw["phase"]))
        return R()

    monkeypatch.setattr(malcolm.sim, "simulate", fake)
    sc = sweep.draw_scenarios(1, 2026)[0]
    sweep._run((sc, "malcolm", "malcolm", 1))
    sweep._run((dict(sc, window_us=500.0, phase="aligned"), "malcolm", "malcolm", 1))
    assert seen == [(100.0, "random"), (500.0, "aligned")] and sweep.g.SIM_WINDOW_US == 100.0


def test_window_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        sweep.main(["--window", "0"])
    assert e.value.code == 2 and "--window" in capsys.readouterr().err
