"""``bench/scale.py`` (issue 12, item 5): each policy's time against the reference's of the same
round, and a verdict only where the interval is on one side of the target."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import scale  # noqa: E402


def _run(loop, cpu, wall):
    return dict(loop=loop, cpu=cpu, wall=wall, p99_us=1.0)


def test_ratios_are_paired_by_round():
    """A machine that slows down in round 2 slows both policies: the per-round ratio stays 3,
    where the ratio of the medians would not."""
    runs = [{"a": _run(1.0, 2.0, 2.0), "b": _run(3.0, 4.0, 5.0)},
            {"a": _run(10.0, 20.0, 20.0), "b": _run(30.0, 40.0, 50.0)},
            {"a": _run(1.0, 2.0, 2.0), "b": _run(3.0, 4.0, 5.0)}]
    s = scale.summarize(["a", "b"], runs)
    assert s["b"]["loop"]["ratio"] == 3.0 and s["b"]["loop"]["ratio_lo"] == 3.0
    assert s["b"]["cpu"]["ratio"] == 2.0 and s["b"]["wall"]["ratio"] == 2.5
    assert s["a"]["loop"]["ratio"] == 1.0 and s["b"]["loop"]["median_s"] == 3.0


@pytest.mark.parametrize("lo, hi, want", [(2.5, 2.9, "met"), (2.5, 3.0, "met"),
                                          (2.9, 3.1, "undecided"), (3.01, 3.5, "not met")])
def test_verdict_needs_the_whole_interval(lo, hi, want):
    assert scale.verdict((lo + hi) / 2, lo, hi) == want


def test_a_small_rack_end_to_end(tmp_path, capsys):
    out = tmp_path / "scale.json"
    scale.main(["--servers", "4x1", "--tasks", "3000", "--rounds", "1", "--policies",
                "jsq;malcolm", "--json", str(out)])
    d = json.loads(out.read_text())
    assert set(d["runs"][0]) == {"jsq", "malcolm"}
    assert all(v["loop"] > 0 and v["cpu"] >= v["loop"] * 0.5 and v["wall"] > 0
               for v in d["runs"][0].values())
    assert "malcolm at most 3x jsq" in capsys.readouterr().out


@pytest.mark.parametrize("argv, word", [(["--policies", "jsq"], "--policies"),
                                        (["--rounds", "0"], "--rounds"),
                                        (["--servers", "64y1"], "--servers")])
def test_bad_options_are_one_line(argv, word, capsys):
    with pytest.raises(SystemExit) as e:
        scale.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and word in err and "Traceback" not in err


def test_a_failing_simulation_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        scale.main(["--servers", "2x1", "--tasks", "100", "--rounds", "1", "--policies",
                    "jsq;nosuchpolicy"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "nosuchpolicy" in err and "Traceback" not in err
