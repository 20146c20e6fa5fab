"""Packaging, ``malcolm list`` and ``malcolm rack gen`` (issue 14 items 2, 4, 6).

The full sdist -> wheel -> fresh venv round trip takes minutes of compiling; it runs in CI as
``scripts/check-sdist`` (see ``.ci/run``), not here.
"""

import json
import os
import subprocess
import sys
import tarfile

import pytest
from click.testing import CliRunner

import malcolm
from malcolm.cli import main
from malcolm.commands.rackgen import check_local_address, expand_nodelist, read_hostfile
from malcolm.runtime.config import ConfigError, load_rack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args):
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


# ------------------------------------------------------------------------------ packaging

def test_get_include_has_the_headers_a_cython_user_needs():
    inc = malcolm.get_include()
    for h in ("_native.h", "_core.pxd", os.path.join("workers", "malcolm_handler.h")):
        assert os.path.isfile(os.path.join(inc, h)), h


def test_sdist_ships_cython_sources_not_build_products(tmp_path):
    r = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (sdist,) = tmp_path.glob("malcolm-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
    pyx = {n for n in names if n.endswith(".pyx")}
    tracked = subprocess.run(["git", "ls-files", "malcolm/*.pyx", "malcolm/*.pxd",
                              "malcolm/*.h"], cwd=ROOT, capture_output=True, text=True).stdout
    for f in tracked.split():
        assert f in names, f"{f} missing from the sdist"
    assert "malcolm/_core.pyx" in pyx and "LICENSE" in names and "MANIFEST.in" in names
    bad = [n for n in names if n.endswith((".so", ".o")) or n.startswith("build/")
           or (n.endswith(".c") and n != "malcolm/bench/floor.c")]
    assert not bad, f"build products in the sdist: {bad}"


def test_build_without_sources_fails_loudly(tmp_path):
    for f in ("setup.py", "pyproject.toml"):
        (tmp_path / f).write_text(open(os.path.join(ROOT, f)).read())
    r = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "no Cython sources" in r.stderr


PLAN = r"""
import os, runpy, sys
import Cython.Build, setuptools
Cython.Build.cythonize = lambda exts, **kw: exts            # list the plan, compile nothing
setuptools.setup = lambda **kw: print("\n".join(sorted(e.name for e in kw["ext_modules"])))
hide = os.environ.get("HIDE_HEADER")
if hide:
    real = os.path.exists
    os.path.exists = lambda p: False if str(p).endswith(hide) else real(p)
sys.argv = ["setup.py", "build_ext"]
runpy.run_path("setup.py", run_name="__main__")
"""
VERBS_MODS = {"malcolm.net._ud_queue", "malcolm.net._verbs", "malcolm.bench.verbs"}


def _planned(**env):
    r = subprocess.run([sys.executable, "-c", PLAN], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, **env))
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split()), r.stderr


def test_extensions_that_need_libibverbs_are_skipped_without_it():
    """Without infiniband/verbs.h the three verbs modules are skipped, each with one line
    naming the Debian package, and everything else (the transport benchmarks included, which
    need no libibverbs) is still built."""
    names, err = _planned(HIDE_HEADER="infiniband/verbs.h")
    assert not names & VERBS_MODS
    assert {"malcolm.net.transport", "malcolm.bench.transport", "malcolm._core"} <= names
    for mod in VERBS_MODS:
        assert f"skipping {mod}: infiniband/verbs.h not found (install the Debian package " \
               "libibverbs-dev" in err
    if os.path.exists("/usr/include/infiniband/verbs.h"):
        with_lib, _ = _planned()
        assert with_lib - names == VERBS_MODS


def test_server_command_never_imports_the_working_directory(tmp_path):
    from malcolm.runtime.launcher import server_command
    fake = tmp_path / "malcolm"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('imported the source tree')\n")
    (fake / "__main__.py").write_text("raise SystemExit('imported the source tree')\n")
    r = subprocess.run(server_command() + ["--version"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert malcolm.__version__ in r.stdout


# -------------------------------------------------------------------------- malcolm list

def test_list_policies_shows_every_policy_and_parameter():
    from malcolm.policy.actor_critic import DEFAULTS

    from malcolm.policy import registry
    code, out = run("list", "policies", "--json")
    assert code == 0, out
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) == set(registry.POLICIES)
    for name, info in registry.POLICIES.items():
        got = {p["name"]: p for p in rows[name]["params"]}
        want = DEFAULTS if info.params is None else info.params
        assert set(got) == set(want), name
        for k, p in got.items():
            assert p["help"], f"{name}.{k} has no help text"
    assert rows["malcolm"]["params"][0]["default"] == DEFAULTS["window_ns"]
    code, text = run("list", "policies")
    assert code == 0 and "threshold = 8.0" in text and "critic_lr = 0.05" in text
    assert "``" not in text


def test_list_policies_unknown_name_is_one_line():
    code, out = run("list", "policies", "nope")
    assert code != 0 and "unknown policy 'nope'" in out and "Traceback" not in out


def test_list_workloads_every_named_workload_parses():
    from malcolm.workloads import NAMED, parse_workload
    code, out = run("list", "workloads", "--json")
    assert code == 0
    data = json.loads(out)
    assert [r["name"] for r in data["named"]] == list(NAMED)
    for r in data["named"]:
        assert parse_workload(r["name"]).mean_us == pytest.approx(r["mean_us"])
    code, text = run("list", "workloads")
    assert code == 0 and "bimodal" in text and "mix:W:DIST" in text


def test_list_handlers_builtins_are_accepted_by_the_runtime():
    from malcolm.workers.handlers import Handler
    code, out = run("list", "handlers", "--json")
    assert code == 0
    rows = json.loads(out)
    builtin = [r["spec"] for r in rows if not r["user"]]
    assert {"spin", "sleep", "echo"} <= set(builtin)
    for spec in builtin:
        if spec.islower() and "[" not in spec:      # a concrete spec, not a PATH template
            Handler(spec)           # raises if the listing names a spec the parser refuses
    assert any(r["spec"].startswith("so:") for r in rows if r["user"])


@pytest.mark.parametrize("cmd", [[], ["list"], ["list", "policies"], ["list", "workloads"],
                                 ["list", "handlers"], ["rack", "gen"]])
def test_help_has_examples(cmd):
    code, out = run(*cmd, "--help")
    assert code == 0 and "Examples:" in out


# --------------------------------------------------------------------------- rack gen

@pytest.mark.parametrize("spec,want", [
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a1,b[8-10]", ["a1", "b8", "b9", "b10"]),
    ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("10.0.0.1,10.0.0.2", ["10.0.0.1", "10.0.0.2"]),
])
def test_expand_nodelist(spec, want):
    assert expand_nodelist(spec) == want


@pytest.mark.parametrize("spec", ["n[1-2", "n[3-1]", "n[a-b]", "a,,b", "n[[1]]"])
def test_expand_nodelist_rejects(spec):
    with pytest.raises(ValueError):
        expand_nodelist(spec)


@pytest.mark.parametrize("spec", ["n[１-３]", "n[²]", "n[1-²]"])
def test_expand_nodelist_refuses_digits_other_than_ascii(spec):
    # str.isdigit() is true of '²' and '１': "n[²]" was a host "n²", "n[１-３]" n1..n3
    with pytest.raises(ValueError, match="is not N or N-M"):
        expand_nodelist(spec)


def test_read_hostfile_both_dialects(tmp_path):
    p = tmp_path / "hosts"
    p.write_text("# Open MPI\nn1 slots=2 max_slots=4\nn2\n\n# MPICH\nn3:3  # three\n")
    assert read_hostfile(str(p)) == [("n1", 2), ("n2", None), ("n3", 3)]
    p.write_bytes(b"\xef\xbb\xbfn1:2\n")          # a byte-order mark: not part of the name
    assert read_hostfile(str(p)) == [("n1", 2)]
    p.write_text("n1 cores=2\n")
    with pytest.raises(ValueError, match="line 1"):
        read_hostfile(str(p))
    for slots in ("n1:²", "n1 slots=²"):
        p.write_text(slots + "\n")
        with pytest.raises(ValueError, match="line 1: slot count"):
            read_hostfile(str(p))


def test_rack_gen_writes_a_valid_rack_in_rank_order(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("127.0.0.1 slots=2\n127.0.0.2\n")
    out = tmp_path / "rack.toml"
    code, text = run("rack", "gen", "--hostfile", str(hf), "--port", "7400", "--workers", "1",
                     "--policy", "jbt:threshold=3", "-o", str(out))
    assert code == 0, text
    cfg = load_rack(str(out))
    assert cfg.addresses == ["127.0.0.1:7400", "127.0.0.1:7401", "127.0.0.2:7400"]
    assert cfg.policy == "jbt" and cfg.policy_params["threshold"] == 3.0
    assert all(s.workers == 1 for s in cfg.servers)


def test_rack_gen_keys_the_rack_with_a_new_or_an_existing_key(tmp_path):
    """--key-file writes key_file into [rack] and creates the key beside the rack file
    (where every server resolves a relative one), mode 0600; a second run keeps it; a key
    that serve would refuse is refused here in one line. Without it, gen says the rack is
    unauthenticated."""
    import stat

    from malcolm.runtime.config import check_rack, rack_key
    out = tmp_path / "rack.toml"
    code, text = run("rack", "gen", "--hosts", "127.0.0.1", "--key-file", "rack.key",
                     "-o", str(out))
    assert code == 0 and "keyed with a new 32-byte key" in text, text
    key = tmp_path / "rack.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
    cfg = load_rack(str(out))
    assert cfg.key_file == "rack.key" and check_rack(cfg)["key"] == rack_key(cfg) is not None
    before = key.read_bytes()
    code, text = run("rack", "gen", "--hosts", "127.0.0.1", "--key-file", "rack.key",
                     "-o", str(out))
    assert code == 0 and "keyed with the existing" in text and key.read_bytes() == before
    key.chmod(0o644)
    code, text = run("rack", "gen", "--hosts", "127.0.0.1", "--key-file", "rack.key",
                     "-o", str(out))
    assert code != 0 and "--key-file" in text and "chmod 600" in text, text
    assert "Traceback" not in text
    code, text = run("rack", "gen", "--hosts", "127.0.0.1", "-o", str(tmp_path / "open.toml"))
    assert code == 0 and "unauthenticated" in text, text
    assert load_rack(str(tmp_path / "open.toml")).key_file is None


def test_rack_gen_from_slurm_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2(x2)")
    monkeypatch.setenv("PATH", "/nonexistent")         # no scontrol: our own expansion
    code, out = run("rack", "gen", "--transport", "verbs")
    assert code == 0, out
    assert out.count("[[server]]") == 4 and '"node2:7002"' in out
    assert 'transport = "verbs"' in out


def test_rack_gen_bad_input_is_one_line(tmp_path):
    code, out = run("rack", "gen", "--hosts", "n[1-2")
    assert code != 0 and "unbalanced" in out and "Traceback" not in out
    code, out = run("rack", "gen", "--hosts", "n[1-65]")
    assert code != 0 and "at most 64" in out
    code, out = run("rack", "gen", "--hosts", "a", "--policy", "nope")
    assert code != 0 and "unknown policy" in out


def test_check_local_address(tmp_path):
    p = tmp_path / "rack.toml"
    # 203.0.113.0/24 is TEST-NET-3: never an address of this host.
    p.write_text('[rack]\ntransport = "udp"\n[[server]]\naddress = "127.0.0.1:7001"\n'
                 '[[server]]\naddress = "203.0.113.7:7001"\n')
    cfg = load_rack(str(p))
    check_local_address(cfg, 0)
    with pytest.raises(ConfigError, match="not an address of this host"):
        check_local_address(cfg, 1)


@pytest.mark.slow
def test_generated_rack_runs(tmp_path):
    import socket

    from malcolm.runtime.launcher import LocalRack
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))            # a free port (127.0.0.2 is loopback too)
        port = s.getsockname()[1]
    path = tmp_path / "rack.toml"
    code, out = run("rack", "gen", "--hosts", "127.0.0.1,127.0.0.2", "--port", str(port),
                    "--workers", "1", "--handler", "sleep", "--policy", "jsq", "-o", str(path))
    assert code == 0, out
    with LocalRack(str(path), logdir=str(tmp_path)) as lr:
        for k in range(2):
            check_local_address(lr.cfg, k)
        assert all(p.poll() is None for p in lr.procs.values())
    assert all(c == 0 for c in lr.down().values())
