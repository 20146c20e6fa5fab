"""``malcolm demo --quick``: the README's main job runs end to end and cleans up after itself."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest


def _demo_servers(wd, parent=None):
    """PIDs of `malcolm serve` processes started from a demo rack file by a demo run in ``wd``
    (their working directory): each test runs its demo in a folder of its own, so that a demo
    run by hand in this checkout, or another checkout's, is neither counted nor killed.

    ``parent``: only the demo's own children. A server forks once as it starts (``git
    rev-parse`` for its metadata), and until that child execs it has the server's command line
    and folder: CI once counted five servers of four."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if b"serve" in cmd and b"malcolm-demo-" in cmd and cwd == str(wd):
            if parent is None or _ppid(pid) == parent:
                out.append(int(pid))
    return out


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().split(")")[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0]
    except OSError:
        return None


def test_demo_quick(tmp_path):
    png, js = tmp_path / "demo.png", tmp_path / "demo.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "malcolm", "demo", "--quick", "--plot", str(png),
                        "--json", str(js)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "dilation K=50" in out and "per-hop delay:" in out and "layout:" in out
    pols = ("malcolm", "jsq", "po2", "malcolm:learn=0")
    for pol in pols:        # a line per run as it finishes, then a row per load
        assert sum(1 for ln in out.splitlines() if ln.split()[:3] == ["run", "1", pol]) == 2
        assert sum(1 for ln in out.splitlines()
                   if ln.split()[:2] in ([pol, "0.50"], [pol, "0.80"])) == 2, out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(js.read_text())
    assert data["dilate"] == 50
    assert data["metadata"]["config"]["quick"] is True and data["metadata"]["cpus"] >= 1
    assert {row["policy"] for row in data["rows"]} == set(pols)
    for row in data["rows"]:
        for key in ("policy", "load", "p99_us", "p99_ci_us", "late_fraction",
                    "effective_load"):
            assert key in row, row
        assert "sim_p99_us" not in row                 # only with --compare-sim
        lo, hi = row["p99_ci_us"]
        assert lo <= row["p99_us"] <= hi
        assert 0 < row["effective_load"] < 1.5
    for run in data["runs"]:
        assert run["accounted"] and run["completed"] > 0
        # each run's draw offered its load within 1%, the same draw for every policy
        assert run["draw"]["within"] and abs(run["draw"]["work_ratio"] - 1) <= 0.01
        assert run["draw"] == next(x for x in data["runs"] if x["load"] == run["load"]
                                   and x["repeat"] == run["repeat"]
                                   and x["attempt"] == run["attempt"])["draw"]
        # the policy's guards that fired on its servers (none of the baselines has any)
        assert isinstance(run["guards"], dict)
        assert run["guards"] == {} or run["policy"].startswith("malcolm")
        if run["policy"] == "po2":        # gateways accept everything
            assert run["migrations_per_task"] == 0 and run["steals_per_task"] == 0
    # jsq migrates: the slow servers get tasks they pass on
    assert sum(r["migrations_per_task"] for r in data["runs"] if r["policy"] == "jsq") > 0
    assert data["lowest_at_top"] in ("malcolm", "jsq", "po2", None)    # None: all flagged
    assert took < 60
    assert not _demo_servers(tmp_path)


def test_demo_po2_takes_its_d(tmp_path):
    """po2's d is its clients' (the gateways' jbt refused it, naming jbt)."""
    r = subprocess.run([sys.executable, "-m", "malcolm", "demo", "--quick", "--policy",
                        "po2:d=2", "--load", "0.5", "--json", "-", "--plot", os.devnull],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = json.loads(r.stdout)["rows"]
    assert row["policy"] == "po2:d=2" and row["migrations_per_task"] == 0


def test_demo_compare_sim_and_json_to_stdout(tmp_path):
    """One policy, one load, against its simulator twin; JSON on stdout, text on stderr."""
    r = subprocess.run([sys.executable, "-m", "malcolm", "demo", "--quick", "--policy",
                        "jsq", "--load", "0.6", "--compare-sim", "--json", "-", "--plot",
                        str(tmp_path / "p.png")], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    (row,) = data["rows"]
    assert row["sim_p99_us"] > 0 and row["sim_ratio"] > 0
    assert row["sim_saturated"] is (max(row["server_util"]) >= 0.99)
    assert row["sim"]["costs"]["service_samples"] > 0
    # the twin's seeds offered their load as the runs' draws did
    assert len(row["sim"]["seeds"]) >= 9 and row["sim"]["seeds_tried"] >= 9
    assert all(abs(x - 1) <= 0.01 for x in row["sim"]["work_ratios"])
    assert "sim p99" in r.stderr
    # the stated bound is checked, the row counted in exactly one of the check's lists
    tc = data["twin_check"]
    assert tc["bound"] == [0.77, 1.3]
    assert sum(len(tc[k]) for k in ("within", "outside", "saturated", "flagged")) == 1
    assert "simulator twin: real / twin p99 within [0.77, 1.3]" in r.stderr
    assert not _demo_servers(tmp_path)


def test_demo_interrupted_tears_down(tmp_path):
    # --out and --policies: the first release's spellings, kept as hidden aliases
    p = subprocess.Popen([sys.executable, "-m", "malcolm", "demo", "--quick", "--out",
                          os.devnull, "--policies", "jsq", "--duration", "5"], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        t_end = time.monotonic() + 40
        while not _demo_servers(tmp_path) and time.monotonic() < t_end and p.poll() is None:
            time.sleep(0.2)
        servers = _demo_servers(tmp_path)
        assert servers, "the demo never started its rack"
        time.sleep(2.0)                   # the rack is up and under load
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, out
    assert "interrupted" in out
    assert not _demo_servers(tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL])
def test_demo_killed_leaves_no_servers(sig, tmp_path):
    """A closed terminal (SIGHUP) stops the demo like Ctrl-C; a SIGKILL leaves the servers to
    stop themselves, the paused rack's (SIGSTOP) too: none outlives the demo."""
    p = subprocess.Popen([sys.executable, "-m", "malcolm", "demo", "--quick", "--plot",
                          os.devnull, "--policy", "jsq", "--policy", "po2", "--workers", "1,1",
                          "--duration", "5"], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         # a SIGKILL leaves the demo's temporary folder: in pytest's
                         env=dict(os.environ, TMPDIR=str(tmp_path)))
    servers = []
    try:
        t_end = time.monotonic() + 40
        while len(servers) < 4 and time.monotonic() < t_end and p.poll() is None:
            time.sleep(0.2)
            servers = _demo_servers(tmp_path, parent=p.pid)
        assert len(servers) == 4, "the demo never started its two racks"
        # until a rack is paused (SIGSTOP) while the other one runs: the hard case
        while not any(_state(s) == "T" for s in servers) and time.monotonic() < t_end:
            time.sleep(0.05)
        assert any(_state(s) == "T" for s in servers), "no rack was ever paused"
        p.send_signal(sig)
        out, _ = p.communicate(timeout=30)
        t_end = time.monotonic() + 20
        while _demo_servers(tmp_path) and time.monotonic() < t_end:
            time.sleep(0.2)
        left = _demo_servers(tmp_path)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in _demo_servers(tmp_path):     # a failure must not leave them to the next test
            os.kill(pid, signal.SIGKILL)
    assert not left, "servers outlived the demo"
    if sig == signal.SIGHUP:
        assert p.returncode == 130 and "interrupted" in out and "Traceback" not in out, out


@pytest.mark.parametrize("args, msg", [
    (["--duration", "1e300"], "--duration must be > 0, --warmup >= 0, and the two at most"),
    (["--warmup", "1e300"], "--duration must be > 0, --warmup >= 0, and the two at most"),
    # dilated x50 (--quick), the mean is beyond the workloads' 1 s
    (["--workload", "exp:1e6"], "--workload exp:1e6 at dilation K=50: workload"),
    # 1 ns tasks: a rate no load generator sends (was a misleading "--threads must be ...")
    (["--workload", "mix:1:const:1e-3"], "more than the load generator's 64 client threads"),
    (["--workload", "mix:1:const:1e-3", "--dilate", "auto"], "--dilate auto: no K in 1..200"),
    (["--repeat", str(2 ** 70)], "Invalid value for '--repeat'"),
    (["--retries", "101"], "Invalid value for '--retries'"),
    (["--plot", "d.xyz"], "a .xyz file is not a plot format"),
    (["--workers", ",".join(["64"] * 64)], "4160 server threads"),
    # the racks' files at this dilation: a server refused its (temporary) file after the
    # banner, in words of a file the user never named
    (["--dilate", "10000", "--window", "1s"],
     "--window 1e+06 µs at dilation K=10000 is 1e+10 µs in real time, outside a rack's"),
    (["--window", "0.001"], "give a longer --window or a larger --dilate"),
    (["--dilate", "10000", "--hop-delay", "10000"], "--hop-delay 10000 µs at dilation K=10000"),
    (["--policy", "malcolm:bogus=1"], "--policy malcolm:bogus=1: unknown parameter 'bogus' "
                                      "for malcolm"),
    # a policy's parameters, checked before they become lines of a rack file: these failed
    # in words of that file ("Invalid statement (at line 17, column 2)"), ran the random
    # policy as jsq, named the gateways' jbt for po2's d, or let the last one win
    (["--policy", "malcolm:=1"], "--policy malcolm:=1: parameter '=1' must be key=value"),
    (["--policy", "malcolm:x y=1"], "--policy malcolm:x y=1: 'x y' is not a parameter name"),
    (["--policy", "malcolm:[rack]=1"], "'[rack]' is not a parameter name"),
    (["--policy", "jsq:name=random"], "--policy jsq:name=random: unknown parameter 'name' "
                                      "for jsq"),
    (["--policy", "po2:e=2"], "--policy po2:e=2: unknown parameter 'e' for po2 "
                              "(accepted: d)"),
    (["--policy", "po2:d=5", "--workers", "1,1"], "--policy po2:d=5: po2: d must be in 1..2"),
    (["--policy", "malcolm:learn=0,learn=1"], "--policy malcolm:learn=0,learn=1: parameter "
                                              "'learn' given twice"),
    # ASCII digits only, in every number: int() and float() read '８' ("--workers ８,８" was a
    # rack of two 8-worker servers)
    (["--workers", "８,８"], "--workers '８,８' must be integers like 3,3,1,1"),
    # an empty item was dropped: "--workers 1,,1" ran two servers
    (["--workers", "1,,1"], "--workers '1,,1' has an empty item"),
    (["--workers", "1,1,"], "--workers '1,1,' has an empty item"),
    (["--load", "0.5,,0.6"], "'0.5,,0.6' has an empty item"),
    (["--repeat", "２"], "'２' is not a valid integer (ASCII digits only)"),
    (["--retries", "１"], "'１' is not a valid integer (ASCII digits only)"),
    (["--dilate", "５０"], "--dilate '５０' must be 'auto' or a number >= 1"),
    (["--window-us", "１００"], "'１００' is not a valid number (ASCII digits only)"),
    (["--hop-delay-us", "２"], "'２' is not a valid number (ASCII digits only)"),
])
def test_demo_refuses_bad_runs_before_starting(args, msg, tmp_path, monkeypatch):
    """One line and status 2 before any rack starts, not a traceback after it did."""
    from click.testing import CliRunner

    from malcolm.cli import main
    if "--plot" in args:
        pytest.importorskip("matplotlib")       # without it the plot is skipped, not checked
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["demo", "--quick", "--plot", "d.png", "--policy", "jsq",
                                  "--load", "0.5"] + args)
    assert r.exit_code == 2 and msg in r.output, r.output
    assert "Traceback" not in r.output and "malcolm demo:" not in r.output, r.output
    assert "malcolm-demo-" not in r.output and ".toml" not in r.output, r.output
    assert not _demo_servers(tmp_path)


def test_a_run_too_short_to_draw_a_p99_is_refused_before_any_rack_starts(tmp_path,
                                                                        monkeypatch):
    """--duration 1ns ran every run, flagged each "no completed task", and exited 0."""
    from click.testing import CliRunner

    from malcolm.cli import main
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["demo", "--quick", "--dilate", "50", "--policy", "jsq",
                                  "--load", "0.5", "--duration", "1ns"])
    assert r.exit_code != 0 and "a p99 needs at least 100" in r.output, r.output
    assert "Traceback" not in r.output and not _demo_servers(tmp_path)


def test_experiment_bounds_and_the_auto_ladder():
    from malcolm.loadgen.experiment import Experiment, ExperimentError
    with pytest.raises(ExperimentError, match="--repeat must be in 1..1000"):
        Experiment([1], policies=["jsq"], repeat=1001, echo=lambda s: None)
    with pytest.raises(ExperimentError, match="--retries in 0..100"):
        Experiment([1], policies=["jsq"], retries=101, echo=lambda s: None)
    with pytest.raises(ExperimentError, match="--duration must be > 0"):
        Experiment([1], policies=["jsq"], duration_s=float("nan"), echo=lambda s: None)
    # 10 ms tasks: K=200 would make them 2 s, beyond the workloads' 1 s; auto leaves it out
    exp = Experiment([1], workload="exp:10000", policies=["jsq"], echo=lambda s: None)
    assert exp.ladder == (1, 2, 5, 10, 20, 50, 100)
    assert Experiment([1], policies=["jsq"], dilate=50, echo=lambda s: None).ladder == (50.0,)


def test_a_load_generator_error_in_a_run_is_one_line(monkeypatch):
    """Whatever LoadgenError still escapes a run ends the experiment as an ExperimentError
    (the demo prints it as one line), not a traceback."""
    from malcolm.loadgen.experiment import Experiment, ExperimentError
    from malcolm.loadgen.run import LoadgenError
    exp = Experiment([1], policies=["jsq"], loads=[0.5], dilate=50, echo=lambda s: None)

    def refused(r, tmp):
        raise LoadgenError("--threads must be in 1..64")
    monkeypatch.setattr(exp, "_repeat", refused)
    with pytest.raises(ExperimentError, match="load generator: --threads must be in 1..64"):
        exp.run()
