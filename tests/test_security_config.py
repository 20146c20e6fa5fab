"""One validation for configuration (issue 13, item 5): ``rack check`` runs exactly the checks
``serve`` runs, every numeric key is range-checked (NaN and infinities refused), and every bad
file or flag gets one line naming the problem, never a traceback; ``loadgen`` fails when
nothing completes or too many tasks time out; ``rack up --keep-going``."""

import os
import shutil
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from malcolm.cli import main
from malcolm.net.ports import free_udp_ports

GOOD = """
[rack]
transport = "udp"
window_us = 1000
[policy]
name = "random"
[[server]]
address = "127.0.0.1:{p0}"
[[server]]
address = "127.0.0.1:{p1}"
"""

# (what is wrong, the [rack] or [[server]] text that makes it so, a word the error must name)
BAD = [
    ("window nan", "window_us = nan", "window_us"),
    ("window inf", "window_us = inf", "window_us"),
    ("window tiny", "window_us = 1e-9", "window_us"),
    ("negative max service", "max_service_ms = -1", "max_service_ms"),
    ("zero peer timeout", "peer_timeout_ms = 0", "peer_timeout_ms"),
    ("grace nan", "grace_s = nan", "grace_s"),
    ("grace negative", "grace_s = -1", "grace_s"),
    ("spin negative", "spin_us = -5", "spin_us"),
    ("capacity huge", "capacity = 100000000", "capacity"),
    ("task types huge", "task_types = 70000", "task_types"),
    ("workers huge", "workers = 5000", "workers"),
    ("est_alpha zero", "est_alpha = 0", "est_alpha"),
    ("est_alpha over 1", "est_alpha = 2.0", "est_alpha"),
    ("prior nan", "prior_service_us = nan", "prior_service_us"),
    ("steal timeout zero", "steal_timeout_us = 0", "steal_timeout_us"),
    ("task timeout negative", "task_timeout_ms = -1", "task_timeout_ms"),
    ("shm capacity not a power of two", 'transport = "shm"\nshm_capacity = 1000',
     "shm_capacity"),
    ("clients not networks", 'clients = ["not-a-net"]', "clients"),
    ("clients not strings", "clients = [1, 2]", "clients"),
    ("too many client nets", "clients = [" + ", ".join(f'"10.{i}.0.0/16"' for i in range(17))
     + "]", "clients"),
    ("bad handler", 'handler = "warp"', "handler"),
    ("handler so missing", 'handler = "so:/nonexistent.so:f"', "no such file"),
    ("handler python missing", 'handler = "python:os:nothing_here"', "nothing_here"),
    ("missing key file", 'key_file = "/nonexistent/rack.key"', "rack key"),
    ("name with slash", 'name = "a/b"', "name"),
    # printed in banners and messages, a newline or an escape in the name forged lines
    ("name with a newline", 'name = "a\\nError: forged"', "name 'a\\nError: forged'"),
    ("name with an escape", 'name = "a\\u001b[2Jb"', "name 'a\\x1b[2Jb'"),
    ("bool where number", "window_us = true", "window_us"),
    ("string where number", 'capacity = "big"', "capacity"),
]

BAD_SERVER = [
    ("integer address", "address = 17201", "address"),
    ("unavailable cpus", "address = \"127.0.0.1:{p0}\"\ncpus = [9999]", "cpus"),
    ("no such port", 'address = "127.0.0.1:99999"', "port"),
]

BAD_POLICY = [
    ("unknown policy parameter", 'name = "jbt"\nbogus = 3', "bogus"),
    ("negative seed", 'name = "random"\nseed = -1', "seed"),
]


def _rack(tmp_path, rack_extra="", server0=None, policy=None):
    p0, p1 = free_udp_ports(2)
    text = GOOD.format(p0=p0, p1=p1)
    if rack_extra:
        if "window_us" in rack_extra:
            text = text.replace("window_us = 1000\n", "", 1)
        text = text.replace("[rack]\n", "[rack]\n" + rack_extra + "\n", 1)
    if server0 is not None:
        text = text.replace(f'address = "127.0.0.1:{p0}"', server0.format(p0=p0), 1)
    if policy is not None:
        text = text.replace('name = "random"', policy, 1)
    if 'transport = "shm"' in rack_extra:
        text = text.replace('transport = "udp"\n', "", 1)
        text = text.replace(f'address = "127.0.0.1:{p0}"', "", 1)
        text = text.replace(f'address = "127.0.0.1:{p1}"', "", 1)
    path = tmp_path / "rack.toml"
    path.write_text(text)
    return str(path)


def _one_line_error(res, word):
    out = res.output
    assert res.exit_code not in (0, None), out
    assert "Traceback" not in out and res.exception is None or isinstance(
        res.exception, SystemExit), (out, res.exception)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    err = [ln for ln in lines if ln.startswith("Error")]
    assert len(err) == 1 and word in err[0], out


def _all_bad():
    for why, text, word in BAD:
        yield pytest.param({"rack_extra": text}, word, id=why)
    for why, text, word in BAD_SERVER:
        yield pytest.param({"server0": text}, word, id=why)
    for why, text, word in BAD_POLICY:
        yield pytest.param({"policy": text}, word, id=why)


@pytest.mark.parametrize("where,word", list(_all_bad()))
def test_check_and_serve_refuse_the_same_files(tmp_path, where, word):
    path = _rack(tmp_path, **where)
    r = CliRunner()
    _one_line_error(r.invoke(main, ["rack", "check", path]), word)
    _one_line_error(r.invoke(main, ["serve", "--rack", path, "--id", "0"]), word)


def test_a_good_file_passes_check(tmp_path, monkeypatch):
    monkeypatch.delenv("MALCOLM_RACK_KEY_FILE", raising=False)
    res = CliRunner().invoke(main, ["rack", "check", _rack(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "UNAUTHENTICATED" in res.output
    key = tmp_path / "k"
    assert CliRunner().invoke(main, ["rack", "keygen", str(key)]).exit_code == 0
    res = CliRunner().invoke(main, ["rack", "check", _rack(tmp_path, f'key_file = "{key}"')])
    assert res.exit_code == 0 and "authenticated (key" in res.output, res.output
    os.chmod(key, 0o644)
    _one_line_error(CliRunner().invoke(main, ["rack", "check",
                                              _rack(tmp_path, f'key_file = "{key}"')]),
                    "group or others")
    _one_line_error(CliRunner().invoke(main, ["rack", "keygen", str(key)]), "exists")


@pytest.mark.parametrize("args,word", [
    (["serve", "--rack", "{rack}", "--id", "0", "--duration", "nan"], "--duration"),
    (["serve", "--rack", "{rack}", "--id", "0", "--duration", "-1"], "--duration"),
    (["serve", "--rack", "{rack}", "--id", "0", "--interval", "0"], "--interval"),
    (["serve", "--rack", "{rack}", "--id", "0", "--stats-json", "/nonexistent/x.json"],
     "--stats-json"),
    (["serve", "--rack", "{rack}", "--id", "7"], "out of range"),
    (["serve", "--rack", "{rack}", "--id", "0", "--handler", "warp"], "handler"),
    (["rack", "up", "{rack}", "--duration", "nan"], "--duration"),
    (["loadgen", "--server", "127.0.0.1:1", "--seed", "-1"], "--seed"),
    (["loadgen", "--server", ""], "--server"),
    (["loadgen", "--server", ",,"], "--server"),
    (["loadgen", "--server", "127.0.0.1:1", "--spin", "nan"], "--spin"),
    (["loadgen", "--server", "127.0.0.1:1", "--spin-us", "nan"], "--spin-us"),
    (["loadgen", "--server", "127.0.0.1:1", "--max-timeouts", "200%"], "--max-timeouts"),
    (["loadgen", "--server", "127.0.0.1:1", "--key-file", "/nonexistent"], "rack key"),
    # a new user's odd input (empty strings, huge numbers, files that are not text)
    (["rack", "check", "--rack", "{bin}"], "not UTF-8"),
    (["rack", "up", "--rack", "{bin}"], "not UTF-8"),
    (["serve", "--rack", "", "--id", "0"], "--rack"),
    (["serve", "--rack", "{rack}", "--id", "0", "--stats-json", ""], "--stats-json"),
    (["serve", "--rack", "{rack}", "--id", "0", "--handler", ""], "--handler"),
    (["rack", "up", "--rack", "{rack}", "--logdir", ""], "--logdir"),
    (["rack", "gen", "--hosts", "a", "-o", "/nonexistent/x.toml"], "--output"),
    (["rack", "gen", "--hostfile", "{bin}"], "not UTF-8"),
    (["rack", "gen", "--hosts", "a", "--handler", ""], "--handler"),
    (["rack", "gen", "--hosts", "a b"], "white space"),
    (["loadgen", "--server", "127.0.0.1:1", "--rate", "1e30"], "rate"),
    (["loadgen", "--server", "127.0.0.1:1", "--rate", "2e8"], "request window"),
    (["loadgen", "--server", "127.0.0.1:1", "--key-file", ""], "--key-file"),
    (["loadgen", "--server", "127.0.0.1:1", "--policy", ""], "--policy"),
    (["loadgen", "--server", "127.0.0.1:1", "--duration", "1e300"], "--duration"),
    (["loadgen", "--rack", "{bin}"], "not UTF-8"),
    (["sim", "--rack", "{bin}"], "not UTF-8"),
    (["sim", "--tasks", "99999999999999999999"], "--tasks"),
    (["sim", "--load", "0.1:0.9:1e-9"], "at most 1000"),
    (["sim", "--workload", "empirical:{bin}"], "not UTF-8"),
    # output that could not be written is refused before the run, not after it
    (["demo", "--quick", "--json", "{dir}"], "is a directory"),
    (["demo", "--quick", "--plot", "/nonexistent/p.png"], "no directory"),
    (["demo", "--quick", "--logdir", "/proc/nope"], "--logdir"),
    (["demo", "--quick", "--dilate", ""], "--dilate"),
    (["sim", "--json", "{dir}"], "is a directory"),
    (["loadgen", "--server", "127.0.0.1:1", "--csv", "/nonexistent/x.csv"], "no directory"),
    # ignored (the header named the application), or sent to a flag --app then refused
    (["loadgen", "--server", "127.0.0.1:1", "--app", "rocksdb1", "--workload", "bimodal"],
     "--workload has no effect with --app"),
    (["loadgen", "--server", "127.0.0.1:1", "--app", "rocksdb1", "--check-echo", "--payload",
      "pattern"], "--payload, --check-echo have no effect with --app"),
    (["loadgen", "--server", "127.0.0.1:1", "--json", "-", "--csv", "-"],
     "would both write to stdout"),
    (["bench", "micro", "--json", "/nonexistent/x.json"], "no directory"),
    # a folder os.access passes for root where no file can be made (a user is told it is
    # not writable): found only at the run's end
    (["sim", "--tasks", "100", "--servers", "2x2", "--plot", "/proc/x.png"],
     "Invalid value for --plot: /proc/x.png: "),
    (["loadgen", "--server", "127.0.0.1:1", "--hdr", "/proc/x"],
     "Invalid value for --hdr: /proc/x: "),
    (["demo", "--quick", "--plot", "/proc/x.png"], "Invalid value for --plot: /proc/x.png: "),
    # ASCII digits only, in every number (int() read '８': "--keys ８" built 8 keys)
    (["rocksdb", "load", "{dir}/db", "--keys", "８"], "'８' is not a valid integer (ASCII"),
    (["rocksdb", "get", "{dir}/db", "８"], "'８' is not a valid integer (ASCII"),
    (["rocksdb", "calibrate", "{dir}/db", "--sizes", "１６"], "'１６' must be GET sizes"),
    (["rocksdb", "calibrate", "{dir}/db", "--seed", "１"], "'１' is not a valid integer"),
])
def test_bad_flags_give_one_line(tmp_path, args, word):
    rack = _rack(tmp_path)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(bytes(range(128, 256)))
    res = CliRunner().invoke(main, [a.format(rack=rack, bin=binary, dir=tmp_path)
                                    for a in args])
    _one_line_error(res, word)


# a user's name with a newline and an escape: printed raw, it forged an "Error:" line
FORGED = "x\nError: forged \x1b[2J"


@pytest.mark.parametrize("args,word", [
    (["loadgen", "--server", "127.0.0.1:1", "--key-file", "{tmp}/" + FORGED], "rack key '"),
    (["rack", "keygen", "/nonexistent/" + FORGED], "cannot create '"),
    (["rack", "keygen", "{key}"], "' exists"),
    (["loadgen", "--server", "127.0.0.1:1", "--payload-size", "uniform:x:1\nError y"],
     "--payload-size 'uniform:x:1\\nerror y': 'x' is not"),
    (["loadgen", "--server", "127.0.0.1:1", "--arrivals", "trace:{trace}"], "line 1"),
    (["rocksdb", "get", "{tmp}/" + FORGED, "1"], "Error: "),
])
def test_user_names_are_quoted_not_printed_raw(tmp_path, args, word):
    key = tmp_path / FORGED
    key.write_bytes(b"k" * 32)
    trace = tmp_path / ("t" + FORGED)
    trace.write_text("1 2 x\n")
    res = CliRunner().invoke(main, [a.format(tmp=tmp_path, key=key, trace=trace)
                                    for a in args])
    _one_line_error(res, word)
    assert "\x1b" not in res.output


def test_rack_up_refuses_more_server_threads_than_the_demo(tmp_path, monkeypatch):
    """64 servers of 1024 workers pass rack check (a rack of many hosts), but rack up runs
    them all here: 65 000 polling threads on 2 cores. Refused like the demo's --workers."""
    from malcolm.runtime.launcher import THREADS_PER_CPU, LocalRack

    def no_start(*a, **k):
        raise AssertionError("rack up started a server")
    monkeypatch.setattr(LocalRack, "start", no_start)
    monkeypatch.setattr(LocalRack, "up", no_start)
    monkeypatch.delenv("MALCOLM_RACK_KEY_FILE", raising=False)
    path = tmp_path / "big.toml"
    path.write_text('[rack]\nworkers = 1024\n[policy]\nname = "random"\n' + "".join(
        f'[[server]]\naddress = "127.0.0.1:{20000 + i}"\n' for i in range(64)))
    assert CliRunner().invoke(main, ["rack", "check", "--rack", str(path)]).exit_code == 0
    res = CliRunner().invoke(main, ["rack", "up", "--rack", str(path), "--logdir",
                                    str(tmp_path / "logs")])
    _one_line_error(res, f"65600 server threads (a gateway per server, one per worker) on "
                         f"{len(os.sched_getaffinity(0))} CPU(s); at most {THREADS_PER_CPU}")
    assert "rack up runs every server on this host" in res.output


@pytest.mark.parametrize("cc,word", [
    ("/nonexistent", "cannot run '/nonexistent': No such file or directory"),
    ("gcc -mno-such-option", "compiling floor.c with CC='gcc -mno-such-option' failed"),
    ("'gcc", "CC=\"'gcc\" is not a command line"),
])
def test_a_missing_or_failing_compiler_is_one_line(monkeypatch, cc, word):
    if cc.startswith("gcc") and shutil.which("gcc") is None:
        pytest.skip("no gcc")
    monkeypatch.setenv("CC", cc)
    _one_line_error(CliRunner().invoke(main, ["bench", "micro", "--quick"]), word)


def test_cc_with_arguments_is_a_command_line(monkeypatch):
    """CC="gcc -DX" is make's spelling of a compiler and its flags (it was run as one file
    name, a traceback)."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    from malcolm.commands.bench import run_floor
    monkeypatch.setenv("CC", "gcc -DMALCOLM_FLOOR_TEST")
    assert run_floor()["sample_ns.8"] > 0


@pytest.mark.parametrize("seed", [None, 2 ** 63 - 1])
def test_loadgen_fails_when_nothing_listens(seed):
    (port,) = free_udp_ports(1)
    res = CliRunner().invoke(main, ["loadgen", "--server", f"127.0.0.1:{port}", "--rate",
                                    "200", "--duration", "0.3s", "--warmup", "0",
                                    "--timeout", "0.2s"]
                             + ([] if seed is None else ["--seed", str(seed)]))
    assert res.exit_code == 3, res.output
    assert "no task completed" in res.output


def test_rack_up_keep_going_leaves_the_others_running(tmp_path):
    path = _rack(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    env.pop("MALCOLM_RACK_KEY_FILE", None)
    p = subprocess.Popen([sys.executable, "-m", "malcolm", "rack", "up", path, "--keep-going",
                          "--duration", "8", "--logdir", str(tmp_path / "logs")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        for line in p.stdout:                # until the rack says it is up
            lines.append(line)
            if " up: " in line:
                break
        pid = None
        for cand in subprocess.run(["pgrep", "-f", f"serve --rack {path} --id 1"],
                                   capture_output=True, text=True).stdout.split():
            pid = int(cand)
        assert pid is not None, lines
        os.kill(pid, 9)
        rest, _ = p.communicate(timeout=40)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out = "".join(lines) + rest
    assert "still running (--keep-going)" in out, out
    # server 0 served on until the rack's --duration, then stopped cleanly
    assert "server 0 stopped (SIGTERM)" in out and "exit codes {0: 0, 1: -9}" in out, out
    assert p.returncode == 1            # a server died: the rack reports failure


@pytest.mark.parametrize("what", ["policies", "workloads", "handlers"])
def test_json_into_a_directory_leaves_no_temporary_file(tmp_path, what):
    d = tmp_path / "out"
    d.mkdir()
    _one_line_error(CliRunner().invoke(main, ["list", what, "--json", str(d)]), "--json")
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("args", [
    ["rack", "check", "--rack", "{f}"], ["sim", "--rack", "{f}"],
    ["sim", "--tasks", "2000", "--workload", "empirical:{f}"],
    ["rack", "gen", "--hostfile", "{f}"],
    ["loadgen", "--server", "127.0.0.1:1", "--arrivals", "trace:{f}"],
])
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_input_files_that_are_not_files_are_refused_unread(tmp_path, args, kind):
    """A FIFO waited forever for a writer and /dev/zero filled the memory (a second fuzzing
    pass): an input file must be a regular one, of a bounded size, before it is read."""
    if kind == "fifo":
        f = tmp_path / "fifo"
        os.mkfifo(f)
    else:
        f = "/dev/zero"
    res = CliRunner().invoke(main, [a.format(f=f) for a in args])
    _one_line_error(res, "not a regular file")


def test_output_to_a_fifo_or_a_device_is_written_in_place(tmp_path):
    """--json onto a FIFO (``>(jq .)``) or a device wrote F.tmp and renamed it onto F: the
    pipe or, as root, the device (/dev/full) was replaced by a file."""
    import threading

    from malcolm._files import write_file
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    t = threading.Thread(target=lambda: got.append(open(fifo).read()))
    t.start()
    write_file(str(fifo), "hello\n")
    t.join(10)
    assert got == ["hello\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert not (tmp_path / "fifo.tmp").exists()
    write_file("/dev/null", "x")                    # a device stays a device
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    reg = tmp_path / "r.json"
    write_file(str(reg), "1")
    write_file(str(reg), "2")                       # a regular file: replaced whole
    assert reg.read_text() == "2" and not (tmp_path / "r.json.tmp").exists()


def test_an_empty_key_file_variable_is_refused_not_unauthenticated(tmp_path, monkeypatch):
    """MALCOLM_RACK_KEY_FILE set but empty ran the rack unauthenticated, as key_file = ""
    did: both are refused; unset, the rack file decides."""
    from malcolm.runtime import config
    cfg = config.load_rack(_rack(tmp_path))
    monkeypatch.setenv(config.KEY_ENV, "")
    with pytest.raises(config.ConfigError, match="set but empty"):
        config.key_path(cfg)
    monkeypatch.delenv(config.KEY_ENV)
    assert config.key_path(cfg) is None


def test_a_launcher_pid_that_is_not_ascii_digits_is_ignored(monkeypatch):
    from malcolm.runtime.launcher import die_with_launcher
    monkeypatch.setenv("MALCOLM_LAUNCHER_PID", "²")     # str.isdigit says yes, int() no
    assert die_with_launcher() is None
