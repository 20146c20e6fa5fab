"""The CLI's one grammar: shared parameter types, --json [FILE|-], help texts with examples and
no RST markup, and the run metadata in every JSON a command writes."""

import json
import math
import os

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from malcolm._metadata import run_metadata
from malcolm._units import parse_duration, parse_rate, split_items
from malcolm.cli import main
from malcolm.commands.types import Duration, Rate

# µs with the micro sign and with the Greek mu, which look the same
UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "\u03bcs": 1e3, "ms": 1e6, "s": 1e9}


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False),
       st.sampled_from(sorted(UNITS)), st.sampled_from(["s", "ms", "us"]))
def test_duration_units(x, unit, target):
    text = f"{x!r}{unit}"
    got = parse_duration(text, target)
    want = x * UNITS[unit] / UNITS[target]
    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-300)
    # a bare number is in the option's own unit
    assert parse_duration(repr(x), target) == x


@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False),
       st.sampled_from([("", 1.0), ("k", 1e3), ("K", 1e3), ("M", 1e6), ("m", 1e6)]),
       st.booleans())
def test_rate_suffixes(x, suffix, per_s):
    s, scale = suffix
    text = f"{x!r}{s}" + ("/s" if per_s else "")
    assert math.isclose(parse_rate(text), x * scale, rel_tol=1e-12)


@given(st.text(max_size=12))
def test_bad_text_is_one_clear_error(text):
    for parse in (parse_rate, lambda t: parse_duration(t, "s")):
        try:
            v = parse(text)
        except ValueError as e:
            msg = str(e)
            assert "\n" not in msg and msg
        else:
            assert math.isfinite(v) and v >= 0


@pytest.mark.parametrize("typ, bad", [
    (Duration("s"), "5 parsecs"), (Duration("s"), "-1s"), (Duration("s"), "nan"),
    (Duration("us", min=0, min_open=True), "0"), (Duration("s", max=10), "11s"),
    (Rate(), "0"), (Rate(), "lots"), (Rate(many=True), ","), (Rate(many=True), "1k,x"),
    (Rate(many=True), "1k,,2k"), (Rate(many=True), "1k,"), (Rate(many=True), ""),
])
def test_param_types_fail_in_one_line(typ, bad):
    @click.command()
    @click.option("--x", type=typ)
    def cmd(x):
        click.echo(repr(x))
    r = CliRunner().invoke(cmd, ["--x", bad])
    assert r.exit_code == 2, r.output
    assert "Invalid value for '--x'" in r.output and "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_list_items_are_never_empty():
    """Every comma-separated option reads its items here: some dropped an empty item
    (--load 0.5,,0.6 ran two loads) while others refused it."""
    assert split_items(" 0.5, 0.6 ") == ["0.5", "0.6"]
    assert split_items("1/2,3", ",/") == ["1", "2", "3"]
    for bad in ("0.5,,0.6", "0.5,", ",0.5", " , ", "1//2"):
        with pytest.raises(ValueError) as e:
            split_items(bad, ",/")
        assert str(e.value) == f"{bad!r} has an empty item"
    for bad in ("", "  "):
        with pytest.raises(ValueError, match="^is empty$"):
            split_items(bad)


def test_param_types_convert():
    @click.command()
    @click.option("--d", type=Duration("us"))
    @click.option("--r", type=Rate(many=True))
    def cmd(d, r):
        click.echo(json.dumps([d, r]))
    r = CliRunner().invoke(cmd, ["--d", "0.5ms", "--r", "5k,1.5M,200/s"])
    assert json.loads(r.output) == [500.0, [5000.0, 1.5e6, 200.0]]


def _all_commands(group=main, prefix=("malcolm",)):
    ctx = click.Context(group, info_name=prefix[-1])
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, prefix + (name,))


COMMANDS = list(_all_commands())


def test_the_walk_sees_every_subcommand():
    names = {" ".join(p[1:]) for p, _ in COMMANDS}
    for want in ("sim", "serve", "loadgen", "demo", "bench micro", "bench runtime", "rack up",
                 "rack check", "rack gen", "rack keygen", "rocksdb load", "rocksdb calibrate",
                 "list policies", "list workloads", "list handlers"):
        assert want in names


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p[1:]))
def test_help_has_examples_and_no_rst(path):
    r = CliRunner().invoke(main, list(path[1:]) + ["--help"])
    assert r.exit_code == 0, r.output
    assert "Examples:" in r.output
    assert "``" not in r.output


def _param(cmd, name):
    return next((p for p in cmd.params if name in getattr(p, "opts", ())), None)


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=lambda x: " ".join(x[1:])
                         if isinstance(x, tuple) else "")
def test_one_meaning_per_flag(path, cmd):
    """--json is [FILE|-] everywhere, --rack a rack file, --seed has help, --plot a file."""
    p = _param(cmd, "--json")
    if p is not None:
        assert not p.is_flag and p.flag_value == "-", path
    p = _param(cmd, "--rack")
    if p is not None and not p.hidden:
        assert p.metavar == "FILE", path
    for name in ("--seed", "--plot", "--duration", "--warmup", "--policy", "--servers"):
        p = _param(cmd, name)
        if p is not None and not p.hidden:
            assert p.help, (path, name)
    assert _param(cmd, "--policies") is None or _param(cmd, "--policies").hidden
    assert _param(cmd, "--out") is None or _param(cmd, "--out").hidden


NUMBER_OPTIONS = [(path, p.opts[0]) for path, cmd in COMMANDS for p in cmd.params
                  if isinstance(p, click.Option) and not p.is_flag
                  and isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))]


def test_the_number_options_are_found():
    found = {(" ".join(p[1:]), o) for p, o in NUMBER_OPTIONS}
    for want in (("demo", "--repeat"), ("loadgen", "--threads"), ("loadgen", "--seed"),
                 ("rocksdb load", "--keys"), ("rocksdb calibrate", "--samples"),
                 ("sim", "--tasks"), ("rack gen", "--port"), ("serve", "--id")):
        assert want in found, want


@pytest.mark.parametrize("path, opt", NUMBER_OPTIONS,
                         ids=lambda x: " ".join(x[1:]) if isinstance(x, tuple) else x)
def test_every_number_option_reads_ascii_digits_only(path, opt):
    """click's int and float types read other scripts' digits ("--threads ２" ran two
    threads, "--keys ８" built 8 keys); every number option of every command refuses them,
    in one line, before the command starts."""
    r = CliRunner().invoke(main, [*path[1:], opt, "８"])
    assert r.exit_code == 2, r.output
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert len(err) == 1 and opt in err[0] and "(ASCII digits only)" in err[0], r.output


def test_sim_json_file_stdout_and_metadata(tmp_path):
    args = ["sim", "--servers", "2x2", "--policy", "jsq", "--tasks", "2000", "--seed", "3",
            "--delay", "1us"]
    r = CliRunner().invoke(main, args + ["--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["runs"][0]["config"]["policy"] == "jsq"
    md = d["metadata"]
    assert md["config"]["seed"] == 3 and md["config"]["rack"] == "2x2"
    path = tmp_path / "sim.json"
    r = CliRunner().invoke(main, args + ["--json", str(path)])
    assert r.exit_code == 0 and "p99_us" in r.output       # the table is still printed
    assert json.loads(path.read_text())["runs"][0]["p99_us"] == d["runs"][0]["p99_us"]


def test_sim_rack_is_a_rack_file_too(tmp_path):
    r = CliRunner().invoke(main, ["sim", "--rack", "2x2"])
    assert r.exit_code == 2 and "--rack" in r.output and "Traceback" not in r.output
    path = tmp_path / "rack.toml"
    path.write_text('[rack]\nname = "t"\ntransport = "udp"\nworkers = 3\nwindow_us = 50\n'
                    '[policy]\nname = "jbt"\nthreshold = 2\n'
                    '[[server]]\naddress = "127.0.0.1:7001"\n'
                    '[[server]]\naddress = "127.0.0.1:7002"\n'
                    '[[server]]\naddress = "127.0.0.1:7003"\nworkers = 1\n')
    r = CliRunner().invoke(main, ["sim", "--rack", str(path), "--tasks", "2000", "--json"])
    assert r.exit_code == 0, r.output
    c = json.loads(r.output)["runs"][0]["config"]
    assert c["rack"] == "2x3,1x1" and c["policy"].startswith("jbt")
    assert c["window_us"] == 50 and c["window_tasks"] == 5.0
    # the rack file's window_tasks too, and --window-tasks over it
    path.write_text(path.read_text().replace("window_us = 50\n",
                                             "window_us = 50\nwindow_tasks = 0\n"))
    r = CliRunner().invoke(main, ["sim", "--rack", str(path), "--tasks", "2000", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["runs"][0]["config"]["window_tasks"] == 0
    r = CliRunner().invoke(main, ["sim", "--rack", str(path), "--tasks", "2000", "--json",
                                  "--window-tasks", "3"])
    assert r.exit_code == 0 and json.loads(r.output)["runs"][0]["config"]["window_tasks"] == 3
    r = CliRunner().invoke(main, ["sim", "--window-tasks", "-1"])
    assert r.exit_code == 2 and "--window-tasks" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["sim", "--rack", str(path), "--servers", "2x2"])
    assert r.exit_code == 2 and "not both" in r.output
    # the rack of other nodes: host names that resolve only there are simulated here
    path.write_text(path.read_text().replace("127.0.0.1:7001", "node-a.invalid:7001"))
    r = CliRunner().invoke(main, ["sim", "--rack", str(path), "--tasks", "2000", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["runs"][0]["config"]["rack"] == "2x3,1x1"


@pytest.mark.parametrize("args, msg", [
    (["--delay", "1e9"], "--delay must be within"),
    (["--delay", "200ms"], "1000 policy windows"),
    (["--window", "2", "--jitter", "3ms"], "1000 policy windows"),
    (["--window", "0.5"], "--window must be within"),
    (["--seed", str(2**70)], "--seed"),
    (["--servers", "1x4@1e-9"], "must be within 0.001-1000"),
    (["--servers", "1x4@1e9"], "must be within 0.001-1000"),
    (["--servers", "1" + "0" * 24 + "x1"], "at most 64"),
    (["--workload", "exp:1e300"], "at most 1e+06"),
    (["--workload", "exp:1e-300"], "at least 0.001"),
    (["--workload", "mix:1:lognormal:50:10"], "sigma must be at most 3"),
    (["--workload", "mix:1e300:exp:5"], "weight must be at most"),
    (["--load", "1e300"], "load must be at most 100"),
    (["--load", "1e-300"], "of simulated time"),
    (["--load", "0.1:0.9:1e-300"], "8e+299 points"),
    (["--policy", "po2:d=" + str(2**70)], "d must be within"),
    (["--policy", "malcolm:window_ns=" + str(2**70)], "window_ns out of range"),
    (["--capacity", str(2**70)], "--capacity must be within"),
    (["--clients", "100000000", "--policy", "po2"], "--clients must be within"),
    (["--sched", "ps", "--quantum", "1e-6"], "at least 0.001"),
    (["--policy", "racksched:quantum=1e-300"], "at least 0.001"),
    (["--policy", "racksched:quantum=-1"], "quantum must be within"),
    (["--policy", "racksched:quantum=nan"], "must be finite"),
    (["--policy", "cfcfs:delay=1e300"], "delay must be within"),
    (["--policy", "steal:min_victim=nan"], "must be finite"),
    (["--policy", "jsq", "--gateway-cost", "1e12"], "--gateway-cost must be within"),
    # a gateway that heartbeats alone keep busy: its backlog grew without end (2 GB in 20 s)
    (["--servers", "2x1", "--policy", "jsq", "--gateway-cost", "100ms"],
     "--gateway-cost: 1e+08 ns a message fills the gateways with heartbeats alone"),
    (["--servers", "64x1", "--policy", "malcolm", "--gateway-cost", "800ns"], "at most 794 ns"),
    # round robin's quanta, an event each: 10^9 a task never ended
    (["--sched", "ps", "--quantum", "1ns", "--workload", "const:1000000", "--tasks", "10"],
     "--quantum: a quantum of 0.001 µs cuts a mean task of 1e+06 µs into 1e+09 quanta"),
    (["--policy", "racksched:quantum=0.001", "--workload", "const:1000000", "--tasks", "10"],
     "racksched quantum: a quantum of 0.001 µs"),
    # a server policy's windows, heartbeats to every peer each: idle servers of long tasks
    # ran them for simulated hours (tens of minutes; a rack of them for days)
    (["--servers", "64x1", "--policy", "jsq", "--workload", "const:1000000", "--tasks",
      "100000"], "about 8e+10 window and heartbeat events, more than 1e+10"),
    (["--loss", "1"], "not in the range 0<=x<1"),
    # silently ignored under FCFS, and a list longer than a range may expand to
    (["--quantum", "5"], "a quantum applies to --sched ps only"),
    (["--load", ",".join(["0.5"] * 1001)], "1001 values; at most 1000"),
    # numpy's draw overflowed, and the message blamed an integer
    (["--policy", "malcolm:init=random,init_scale=1.7e308"], "init_scale=1.7e+308 must be <="),
    # an infinity is not told "must be > 0"
    (["--load", "1e309"], "load must be finite, got inf"),
    (["--workload", "exp:inf"], "mean must be finite, got inf"),
    (["--plot", "-"], "'-' (stdout) is not supported"),
    (["--policy", "malcolm", "--steal-timeout", "1e300"], "--steal-timeout must be within"),
    (["--policy", "malcolm", "--steal-timeout", "1e-300"], "--steal-timeout must be within"),
    # ASCII digits only, in every number (int(), float() and \d read '８'):
    # "８x８" was a rack of 8 servers, "--tasks ２０００" 2000 tasks, and "--delay ８" refused
    (["--servers", "８x８"], "bad group"),
    (["--tasks", "２０００"], "ASCII digits only"),
    (["--loss", "０.１"], "ASCII digits only"),
    (["--ewma", "０.５"], "ASCII digits only"),
    (["--load", "０.５"], "is not a number"),
    (["--load", "０.１:0.5:0.1"], "bad range"),
    # an empty item was dropped (--servers and --shares refused one already)
    (["--load", "0.5,,0.6"], "--load: '0.5,,0.6' has an empty item"),
    (["--load", "0.5,"], "--load: '0.5,' has an empty item"),
    (["--load", ""], "--load: is empty"),
    (["--shares", "１,1,1,1,1,1,1,1"], "comma-separated numbers"),
    (["--workload", "exp:５０"], "is not a number"),
    (["--workload", "mix:１:exp:5"], "is not a number"),
    (["--policy", "jbt:threshold=８"], "is not a valid float"),
    (["--policy", "po2:d=1_0"], "is not a valid int"),
    (["--delay", "８"], "is not a duration"),
    # a parameter's name is the user's: quoted, a newline in it cannot forge a line
    (["--policy", "jsq:x\nFAKE=1"], "unknown parameter 'x\\nFAKE'"),
    (["--policy", "jsq:\x1b[31mx=1"], "unknown parameter '\\x1b[31mx'"),
    # a parameter given twice: the last one won, silently
    (["--policy", "malcolm:learn=0,learn=1"], "parameter 'learn' given twice"),
    (["--policy", "jbt:threshold=2,threshold=3"], "parameter 'threshold' given twice"),
    (["--policy", "po2:d=1,d=2"], "parameter 'd' given twice"),
    # what the simulator sets itself ("make_policy() got multiple values for argument")
    (["--policy", "malcolm:seed=5"], "'seed' is not a parameter of malcolm"),
    (["--policy", "malcolm:name=jsq"], "'name' is not a parameter of malcolm"),
])
def test_sim_inputs_out_of_range_fail_in_one_line(args, msg):
    """Values the 64-bit ns clock cannot hold, or that would run for hours, are refused
    before the run (they ran out of memory, hung, or printed negative latencies); so are
    numbers in other scripts' digits, and a name that would print as more than one line."""
    r = CliRunner().invoke(main, ["sim", "--tasks", "2000", *args])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.exception is None or \
        isinstance(r.exception, SystemExit)
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert len(err) == 1 and msg in err[0], r.output


@pytest.mark.parametrize("cmd", [
    ["loadgen", "--server", "127.0.0.1:1", "--rate", "10", "--policy", "po2:d=2,d=1"],
    ["rack", "gen", "--hosts", "h1", "--policy", "malcolm:learn=0,learn=1"],
    ["rack", "gen", "--hosts", "h1", "--policy", "malcolm:seed=5"],
    ["rack", "gen", "--hosts", "h1", "--policy", "malcolm:x y=1"],
])
def test_every_command_refuses_a_bad_policy_parameter(cmd, tmp_path):
    """One parser: a parameter given twice, or a key no policy takes, is refused by each
    command in one line (rack gen wrote learn = 1, or said it wrote an unreadable rack)."""
    out = tmp_path / "rack.toml"
    args = cmd + (["-o", str(out)] if cmd[0] == "rack" else [])
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and not out.exists(), r.output
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert len(err) == 1 and f"policy '{cmd[-1]}': " in err[0], r.output
    assert "Traceback" not in r.output and "unreadable" not in r.output, r.output


def test_a_sweep_is_checked_before_its_first_run(tmp_path):
    """A bad point or plot format fails at once, not after the points before it ran."""
    r = CliRunner().invoke(main, ["sim", "--tasks", "2000", "--load", "0.5,0.6,1e300"])
    assert r.exit_code == 2 and "load must be at most 100" in r.output
    assert "p99_us" not in r.output and "simulating" not in r.output
    r = CliRunner().invoke(main, ["sim", "--tasks", "2000", "--plot", str(tmp_path / "p.xyz")])
    assert r.exit_code == 2 and "not a plot format" in r.output
    r = CliRunner().invoke(main, ["sim", "--tasks", "2000", "--plot", str(tmp_path / "p")])
    assert r.exit_code == 0 and (tmp_path / "p").read_bytes()[:4] == b"\x89PNG"


def test_unwritable_json_is_one_line(tmp_path):
    r = CliRunner().invoke(main, ["list", "workloads", "--json", str(tmp_path / "no" / "x")])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "--json" in r.output


def test_metadata_fields():
    md = run_metadata({"a": (1, 2), "b": object()}, argv=["malcolm", "x"])
    for k in ("utc", "host", "cpu_model", "cpus", "malcolm_version", "git_commit", "argv",
              "config", "python"):
        assert k in md
    assert md["config"]["a"] == [1, 2] and isinstance(md["config"]["b"], str)
    assert md["argv"] == ["malcolm", "x"] and md["cpus"] >= 1
    json.dumps(md)


def test_rack_file_option_and_its_deprecated_positional(tmp_path):
    path = str(tmp_path / "rack.toml")
    r = CliRunner().invoke(main, ["rack", "gen", "--hosts", "127.0.0.1", "--per-host", "2",
                                  "-o", path])
    assert r.exit_code == 0, r.output
    new = CliRunner().invoke(main, ["rack", "check", "--rack", path])
    old = CliRunner().invoke(main, ["rack", "check", path])
    assert new.exit_code == old.exit_code == 0, new.output + old.output
    assert "2 servers" in new.output and new.output == old.output
    r = CliRunner().invoke(main, ["rack", "check"])
    assert r.exit_code == 2 and "--rack FILE" in r.output
    r = CliRunner().invoke(main, ["rack", "up", "--rack", path, "--duration", "nan"])
    assert r.exit_code == 2 and "--duration" in r.output


_UNIT_SUFFIX = ("-ns", "-us", "-µs", "-ms", "-seconds", "-secs")


@pytest.mark.parametrize("path, cmd", COMMANDS, ids=lambda x: " ".join(x[1:])
                         if isinstance(x, tuple) else "")
def test_no_unit_in_a_visible_flag_name(path, cmd):
    """Units belong in the value (``--spin 50us``), not in the name; the first release's
    ``--spin-us``, ``--gateway-ns``, ``--window-us`` stay only as hidden aliases."""
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden:
            for o in p.opts:
                assert not o.endswith(_UNIT_SUFFIX), (path, o)
    # commands with positional arguments and --json use the unambiguous parser
    if _param(cmd, "--json") is not None and any(isinstance(p, click.Argument)
                                                  for p in cmd.params):
        from malcolm.commands.types import JsonArgsCommand
        assert isinstance(cmd, JsonArgsCommand), path


def test_renamed_duration_flags_and_their_hidden_aliases():
    base = ["sim", "--servers", "2x2", "--policy", "jsq", "--tasks", "2000", "--json"]
    new = CliRunner().invoke(main, base[:-1] + ["--gateway-cost", "0.3us", "--json"])
    old = CliRunner().invoke(main, base[:-1] + ["--gateway-ns", "300", "--json"])
    assert new.exit_code == old.exit_code == 0, new.output + old.output
    cfg = [json.loads(r.output)["runs"][0]["config"] for r in (new, old)]
    assert cfg[0]["gateway_ns"] == cfg[1]["gateway_ns"] == 300.0
    cmd = dict((" ".join(p[1:]), c) for p, c in COMMANDS)["loadgen"]
    assert _param(cmd, "--spin").type.unit == "us" and _param(cmd, "--spin-us").hidden
    r = CliRunner().invoke(main, ["loadgen", "--server", "127.0.0.1:1", "--spin", "1 parsec"])
    assert r.exit_code == 2 and "'--spin'" in r.output


def test_json_before_a_positional_argument(tmp_path, monkeypatch):
    """``--json WORD`` on a command with arguments: WORD is the FILE only when it looks like
    one (``-``, a ``/``, ``.json``); ``--json=WORD`` always is."""
    monkeypatch.chdir(tmp_path)
    run = lambda *a: CliRunner().invoke(main, ["list", "policies", *a])  # noqa: E731
    r = run("--json", "jbt")
    assert r.exit_code == 0, r.output
    assert [p["name"] for p in json.loads(r.output)] == ["jbt"]
    assert not (tmp_path / "jbt").exists()
    assert json.loads(run("--json", "-", "jbt").output)[0]["name"] == "jbt"
    assert run("--json", "out.json", "jbt").exit_code == 0
    assert [p["name"] for p in json.loads((tmp_path / "out.json").read_text())] == ["jbt"]
    assert run("--json", "./o2", "jsq").exit_code == 0 and (tmp_path / "o2").exists()
    assert run("--json=o3", "jsq").exit_code == 0 and (tmp_path / "o3").exists()
    assert run("jsq", "--", "--json").exit_code != 0        # after --, an argument
    # commands without arguments keep taking any word as the FILE
    r = CliRunner().invoke(main, ["list", "workloads", "--json", "wl"])
    assert r.exit_code == 0 and json.loads((tmp_path / "wl").read_text())


def test_serve_stats_json_carries_the_run_metadata(tmp_path):
    import subprocess
    import sys

    from malcolm.net.ports import free_udp_ports
    rack = tmp_path / "rack.toml"
    port = free_udp_ports(1)[0]
    r = CliRunner().invoke(main, ["rack", "gen", "--hosts", "127.0.0.1", "--per-host", "1",
                                  "--port", str(port), "--workers", "1", "-o", str(rack)])
    assert r.exit_code == 0, r.output
    stats = tmp_path / "stats.json"
    p = subprocess.run([sys.executable, "-m", "malcolm", "serve", "--rack", str(rack), "--id",
                        "0", "--duration", "300ms", "--interval", "100ms", "--stats-json",
                        str(stats)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(stats.read_text())
    assert "responses" in d and d["metadata"]["config"]["stats_json"] == str(stats)
    assert d["metadata"]["config"]["duration"] == 0.3 and d["metadata"]["host"]


def test_the_cli_keeps_blas_to_one_thread_unless_asked():
    """numpy's OpenBLAS threads spin at import: the CLI asks for one unless the user set it."""
    import subprocess
    import sys

    code = ("import os; import malcolm.cli; import numpy; "
            "print(os.environ['OPENBLAS_NUM_THREADS'])")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(env, OPENBLAS_NUM_THREADS="3"))
    assert r.stdout.strip() == "3", r.stderr


def test_a_path_in_a_success_line_cannot_forge_a_line(tmp_path):
    from malcolm._files import shown
    assert shown("out/x.json") == "out/x.json" and shown(tmp_path) == str(tmp_path)
    assert shown("a\nError: forged") == "'a\\nError: forged'"
    assert shown("\x1b[2Jx") == "'\\x1b[2Jx'"
    out = tmp_path / "r\nError: forged.toml"
    r = CliRunner().invoke(main, ["rack", "gen", "--hosts", "127.0.0.1", "--per-host", "1",
                                  "--port", "7400", "--workers", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.exists() and not any(ln.startswith("Error") for ln in r.output.splitlines())
    assert "wrote '" in r.output and "\\nError: forged.toml'" in r.output
    # and in the one-line refusal of an output file that could not be written
    r = CliRunner().invoke(main, ["sim", "--tasks", "100", "--json",
                                  str(tmp_path / "no\nError: forged" / "x.json")])
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    assert r.exit_code == 2 and len(err) == 1 and "\\nError: forged" in err[0], r.output


@pytest.mark.parametrize("args, msg", [
    (["loadgen", "--server", "127.0.0.1:0"], "--server address '127.0.0.1:0' has port 0"),
    (["loadgen", "--server", "127.0.0.1:9,127.0.0.1:9"], "'127.0.0.1:9' used twice"),
    (["loadgen", "--server", "127.0.0.1:9", "--rate", "1k,,2k"], "'1k,,2k' has an empty item"),
    (["loadgen", "--server", "127.0.0.1:9", "--change", "0.1s:rate=2x,rate=3x"],
     "rate is given twice"),
    (["sim", "--tasks", "2000", "--load", "0.5,"], "'0.5,' has an empty item"),
])
def test_refused_as_typed_in_one_line(args, msg):
    """As a shell runs them: each ran (a loadgen run that failed with exit 3 after sending,
    or a sim of another list of loads); now one line, exit 2, before anything runs."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "malcolm", *args, *(
        ["--duration", "0.2s", "--warmup", "0"] if args[0] == "loadgen" else [])],
        capture_output=True, text=True, timeout=60)
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("Error:")]
    assert p.returncode == 2 and len(err) == 1 and msg in err[0], p.stdout + p.stderr
    assert "Traceback" not in p.stderr and not p.stdout


def test_ctrl_c_while_the_cli_loads_is_one_line():
    """A SIGINT that lands while ``python -m malcolm`` imports click (``rack up`` stopping a
    server that has just started) ends it quietly, not with a KeyboardInterrupt traceback."""
    import subprocess
    import sys

    code = """if True:
        import os, runpy, signal, sys
        class InterruptAtClick:             # the signal arrives while click is imported
            def find_spec(self, name, path=None, target=None):
                if name == "click":
                    os.kill(os.getpid(), signal.SIGINT)
                return None
        sys.meta_path.insert(0, InterruptAtClick())
        sys.argv = ["malcolm", "--version"]
        runpy.run_module("malcolm", run_name="__main__")
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr
    assert r.stderr.strip() == "Aborted!" and r.returncode == 130, (r.returncode, r.stderr)
    # once the CLI is loaded, Python's handler is back: click reports the interrupt itself
    r = subprocess.run([sys.executable, "-m", "malcolm", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "malcolm" in r.stdout, r.stderr
    code = ("import signal, malcolm._entry as e; e.main.main = lambda *a, **k: None; e.run(); "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "True", r.stderr
    from malcolm.runtime.launcher import server_command  # the servers rack up starts
    assert "from malcolm._entry import run; run()" in server_command()[-1]
