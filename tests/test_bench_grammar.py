"""The ``bench/`` scripts speak the CLI's grammar (``malcolm._argparse``, docs/cli.md):
``--servers SPEC`` or a preset, ``--load LOADS``, durations, ``--json [FILE|-]`` with the run
metadata, ``--outdir``/``--plot``, help with examples, and one-line errors."""

import argparse
import glob
import json
import os
import subprocess
import sys

import pytest

from malcolm import _argparse as g

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(
    [p for p in glob.glob(os.path.join(ROOT, "bench", "figures", "*.py"))
     if not p.endswith("common.py")]
    + [os.path.join(ROOT, "bench", n) for n in ("sweep.py", "faults.py", "torch_compare.py",
                                               "handler_accuracy.py", "fuzz_wire.py",
                                               "learn_vs_frozen.py", "longrun.py",
                                               "gate_activity.py", "room_bound.py",
                                               "tiny_racks.py", "big_and_tiny.py",
                                               "bias_drift.py", "conditions.py",
                                               "light_load.py", "policy_room.py",
                                               "rocksdb_pad.py", "verbs_first_batch.py",
                                               "scale.py", "window_cpu.py", "hop_estimate.py",
                                               "quiet_wake.py", "settle_sweep.py",
                                               "reconverge_sweep.py")])


def _run(*args, cwd=ROOT, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_help_has_examples_and_the_grammar(script):
    r = _run(script, "--help")
    if r.returncode != 0 and "ModuleNotFoundError" in r.stderr:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr
    assert "\nExamples:\n" in r.stdout and "``" not in r.stdout
    opts = r.stdout.split("options:")[1].split("Examples:")[0]
    for old in ("--out ", "--loads", "--rack ", "--window-us", "--bin-ms", "--seconds",
                "--spin-us"):
        assert old not in opts, (script, old)
    if "--json" in opts:
        assert "--json [FILE|-]" in opts, script


def test_types_convert_and_fail_in_one_line(capsys):
    assert g.duration("ms")("2s") == 2000.0 and g.duration("us")("3") == 3.0
    assert g.loads("0.5:0.7:0.1") == [0.5, 0.6, 0.7] and g.loads("0.3,0.9") == [0.3, 0.9]
    assert g.servers("homo") == "8x8" and g.servers("hetero") == "2x14,9x4"
    assert g.servers("2x14@2.0,9x4") == "2x14@2.0,9x4"
    assert g.rate("20k/s") == 20e3
    ap = argparse.ArgumentParser(prog="x")
    ap.add_argument("--servers", type=g.servers)
    ap.add_argument("--load", type=g.loads)
    ap.add_argument("--duration", type=g.duration("s", positive=True))
    ap.add_argument("--seeds", type=g.numbers(int, "integers"))
    for args, word in ((["--servers", "8y8"], "--servers"), (["--load", "0.9:0.5:0.1"], "--load"),
                       (["--load", "-1"], "--load"), (["--duration", "0"], "--duration"),
                       (["--duration", "5 parsecs"], "--duration"),
                       (["--load", "０.５"], "--load"), (["--servers", "８x８"], "--servers"),
                       (["--seeds", "１,2"], "--seeds"), (["--load", "0.5,,0.6"], "--load"),
                       (["--load", "0.5,"], "--load")):
        with pytest.raises(SystemExit) as e:
            ap.parse_args(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and err[-1].startswith("x: error: argument " + word)


def test_seed_lists_and_ranges():
    assert g.seeds("1-3,7") == [1, 2, 3, 7] and g.seeds("5") == [5] and g.seeds("0") == [0]
    for bad in ("3-1", "1,1", "1-2,2", "x", "-1", "", "１"):
        with pytest.raises(argparse.ArgumentTypeError):
            g.seeds(bad)


def test_checked_turns_a_checks_value_error_into_one_line(capsys):
    from malcolm.sim import check_policies

    ap = argparse.ArgumentParser(prog="x")
    assert g.checked(ap, "--policies", check_policies, " jsq;;malcolm ") == ["jsq", "malcolm"]
    with pytest.raises(SystemExit) as e:
        g.checked(ap, "--variants", check_policies, "malcolm:nope=1")
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].startswith("x: error: --variants ") and "nope" in err[-1]


def test_int_and_float_options_read_ascii_digits_only(capsys):
    # every script's parser comes from g.parser, whose type=int / type=float refuse what
    # int() and float() would read: other scripts' digits and underscores
    ap = g.parser("d", "python3 x.py", prog="x")
    ap.add_argument("--seed", type=int)
    grp = ap.add_argument_group("g")
    grp.add_argument("--load", type=float)
    assert ap.parse_args(["--seed", "12", "--load", "0.5"]) == argparse.Namespace(seed=12,
                                                                                  load=0.5)
    for args in (["--seed", "１２"], ["--seed", "1_2"], ["--load", "０.５"], ["--load", "1_0"]):
        with pytest.raises(SystemExit) as e:
            ap.parse_args(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and err[-1].startswith(f"x: error: argument {args[0]}: invalid")
    for script, opt in (("scale.py", "--rounds"), ("sweep.py", "--scenarios"),
                        (os.path.join("figures", "fig7_8.py"), "--seed")):
        r = _run(os.path.join(ROOT, "bench", script), opt, "８")
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
            f"argument {opt}: invalid int value: '８'"), r.stderr


def test_hidden_aliases_still_parse():
    ap = g.parser("d", "python3 x.py")
    ap.add_argument("--outdir", default="o")
    g.hidden_alias(ap, "--out", "outdir")
    assert ap.parse_args([]).outdir == "o" and ap.parse_args(["--out", "p"]).outdir == "p"
    assert "--out " not in ap.format_help()


def test_json_to_stdout_with_metadata_and_text_to_stderr(tmp_path):
    pytest.importorskip("matplotlib")
    r = _run(os.path.join(ROOT, "bench", "figures", "fig2_1.py"), "--load", "0.5",
             "--tasks", "2000", "--outdir", str(tmp_path), "--json", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)                     # stdout holds only the JSON
    assert {row["load"] for row in d["rows"]} == {0.5} and len(d["rows"]) == 8
    assert d["metadata"]["config"]["tasks"] == 2000 and d["metadata"]["git_commit"] != ""
    assert "max load" in r.stderr
    assert (tmp_path / "fig2_1.csv").exists() and (tmp_path / "fig2_1.png").exists()
    r = _run(os.path.join(ROOT, "bench", "figures", "fig7_1_2.py"), "--servers", "homo",
             "--servers", "2x2", "--workload", "exp:50", "--load", "0.5", "--tasks", "1000",
             "--outdir", str(tmp_path), "--json", str(tmp_path / "f.json"), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "f.json").read_text())
    assert [x["figure"] for x in d["runs"]] == ["fig7_1", "fig7_1_2_2x2"]
    assert d["metadata"]["config"]["servers"] == ["8x8", "2x2"]


def test_the_real_rack_scripts_servers_presets_and_specs():
    import bench_scripts
    mod = bench_scripts.load("bench/figures/fig7_3_4_rack.py")
    assert mod.servers("homo")[1] == [1, 1, 1] and mod.servers("hetero")[1] == [2, 1, 1]
    assert mod.servers("2x2,1x1") == ("fig7_3_4_rack_2x2+1x1", [2, 2, 1], "2x2,1x1")
    with pytest.raises(argparse.ArgumentTypeError):
        mod.servers("2x2@2.0")


def test_bench_micro_quick_runs_every_policy_benchmark(tmp_path):
    """`malcolm bench micro --quick` end to end: it builds the policies the way the thesis
    configures them (``THESIS`` plus the benchmark's own overrides), which a change to
    ``THESIS`` once broke without any other test noticing."""
    out = tmp_path / "micro.json"
    r = _run("-m", "malcolm", "bench", "micro", "--quick", "--no-floor", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    for n in (4, 8, 16, 32):
        for key in ("window_ns", "param_update_ns", "param_grad_ns"):
            assert res[f"{key}.{n}"] > 0, (key, n)
    assert res["window_ns.64"] > 0
