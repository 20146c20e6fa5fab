"""``bench/settle_sweep.py``: its draw stays in the family it names, and a short run reports
every rack's settle time with the learning curve's rule."""

import json
import os
import subprocess
import sys

import bench_scripts

ROOT = bench_scripts.ROOT
SCRIPT = os.path.join(ROOT, "bench/settle_sweep.py")
SWEEP = bench_scripts.load("bench/settle_sweep.py")      # its functions, without running main


def test_the_draw_is_the_family_it_names_and_repeats():
    racks = SWEEP.draw(50, 7)
    assert racks == SWEEP.draw(50, 7) and racks != SWEEP.draw(50, 8)
    for spec, load in racks:
        groups = [tuple(int(v) for v in grp.split("x")) for grp in spec.split(",")]
        sizes = [s for _, s in groups]
        assert 2 <= len(groups) <= 4 and len(set(sizes)) == len(sizes)
        assert set(sizes) <= set(SWEEP.SIZES) and all(1 <= c <= 10 for c, _ in groups)
        assert 3 <= sum(c for c, _ in groups) <= 24 and 0.7 <= load <= 0.9


def test_a_short_run_reports_each_rack_and_policy(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, SCRIPT, "--count", "2", "--ms", "30", "--ref-ms", "60",
                        "--policies", "malcolm;malcolm:learn=0", "--procs", "1", "--json",
                        str(out)], capture_output=True, text=True, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert set(d["summary"]) == {"malcolm", "malcolm:learn=0"} and len(d["racks"]) == 2
    for row in d["racks"]:
        for pol in d["summary"]:
            st = row[pol]["settle_ms"]
            assert st is None or 0 <= st <= 30        # a bin start within the run, or never
            assert row[pol]["ref_imbalance_us"] > 0 and row[pol]["p99_us"] > 0
    assert "within 50 ms" in r.stdout
    # a bad policy is one line, before any run
    bad = subprocess.run([sys.executable, SCRIPT, "--policies", "malcolm:nope=1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "nope" in bad.stderr.strip().splitlines()[-1]


def test_the_bins_are_whole_bins():
    """The learning curve's bins (which the settle sweep reads) stop at the last whole one:
    a run ends a sliver into its next bin, and that sliver, read alone as the last bin by
    settle_ms, could call a settled run never settled."""
    sys.path.insert(0, os.path.join(ROOT, "bench", "figures"))
    try:
        from learning_curve import run_binned
    finally:
        sys.path.pop(0)
    from types import SimpleNamespace
    a = SimpleNamespace(rack="2x4,2x1", load=0.8, seed=3, bin_ms=2.0)
    r, imb, nb = run_binned(a, "jsq", 5000)
    span_ms = r.sim_time_s * 1000.0
    assert nb == int(span_ms // 2.0) and len(imb) == nb and span_ms % 2.0 > 0
    assert (imb > 0).all()            # every bin has the loads of a whole 2 ms


def test_several_seeds_report_each_and_the_mean_curve(tmp_path):
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, SCRIPT, "--racks", "2x4,2x1@0.8", "--ms", "30",
                        "--ref-ms", "60", "--seeds", "1,2", "--procs", "1", "--json", str(out)],
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["seeds"] == [1, 2]
    assert [(x["rack"], x["load"]) for x in d["racks"]] == [("2x4,2x1", 0.8)]
    row = d["racks"][0]["malcolm"]
    assert set(row["seeds"]) == {"1", "2"}
    for v in row["seeds"].values():
        assert v["settle_ms"] is None or 0 <= v["settle_ms"] <= 30
        assert v["ref_imbalance_us"] > 0
    m = row["mean_curve_settle_ms"]
    assert m is None or 0 <= m <= 30
    assert "the mean curve within 50 ms on" in r.stdout and "of 2 runs" in r.stdout
    for args, word in ((["--seeds", "1,1"], "distinct seeds"),
                       (["--racks", "2x4,2y1@0.8"], "SPEC@LOAD"),
                       (["--racks", "2x4@1.5"], "SPEC@LOAD"), (["--racks", "2x4"], "SPEC@LOAD")):
        bad = subprocess.run([sys.executable, SCRIPT, *args],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and word in bad.stderr.strip().splitlines()[-1], args


def test_the_mean_curve_rule_reads_the_mean_of_the_seeds():
    """A run whose noise crosses the bar late settles late alone, while the mean with a
    run that is low then settles at once; the curves are cut to the shorter."""
    import numpy as np
    a = np.full(20, 100.0)
    b = np.full(21, 100.0)
    a[10] = a[11] = a[12] = 130.0         # one run's bump above 1.1x + 1
    b[10] = b[11] = b[12] = 80.0          # the other's dip below, at the same time
    runs = [(None, 100.0, 0.0, a), (None, 100.0, 0.0, b)]
    bar = 1.1 * 100.0 + 1.0
    assert np.convolve(a, np.ones(3) / 3, "same")[11] > bar
    assert SWEEP.mean_curve_settle(runs) == 0.0
    assert SWEEP.settle_ms((np.arange(20) + 0.5) * 10, a, 10.0, 100.0) == 130.0
