"""Rack files and ``rack gen`` under odd input (a fuzzing pass): every section of the wrong
shape, every number too large for its field and every empty key file gives one line that
names it, never a traceback, and ``rack gen`` never writes a rack that ``rack check`` refuses
(docs/rack-file.md)."""

import pytest
from click.testing import CliRunner

from malcolm.cli import main
from malcolm.commands.rackgen import tomllib
from malcolm.runtime.config import ConfigError, key_path, load_rack, parse_rack

SERVER = '[[server]]\naddress = "127.0.0.1:20001"\n'


def _load(tmp_path, text):
    p = tmp_path / "rack.toml"
    p.write_text(text)
    return load_rack(str(p))


def _refused(tmp_path, text, *words):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def _one_line(res, *words):
    assert res.exit_code not in (0, None), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    err = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert len(err) == 1 and all(w in err[0] for w in words), res.output


# ------------------------------------------------------------------------ the sections

@pytest.mark.parametrize("policy", ["policy = 5", 'policy = "malcolm"', "policy = [1, 2]",
                                    '[[policy]]\nname = "random"'])
def test_a_policy_that_is_not_a_table_is_one_line(tmp_path, policy):
    _refused(tmp_path, policy + "\n" + SERVER, "[policy] must be a table")
    p = tmp_path / "rack.toml"
    _one_line(CliRunner().invoke(main, ["rack", "check", "--rack", str(p)]), "[policy]")
    _one_line(CliRunner().invoke(main, ["serve", "--rack", str(p), "--id", "0"]), "[policy]")


@pytest.mark.parametrize("param,word", [
    ("threshold = 9223372036854775808", "threshold is out of range"),
    ("threshold = -9223372036854775809", "threshold is out of range"),
    ("count_own = [1]", "count_own must be a number"),
    ("threshold = { a = 1 }", "threshold must be a number"),
    ("threshold = 1979-05-27", "not a date or time"),
    ("threshold = nan", "threshold = nan must be a finite"),
])
def test_policy_parameters_of_no_policy_name_their_key(tmp_path, param, word):
    _refused(tmp_path, f'[policy]\nname = "jbt"\n{param}\n' + SERVER, "[policy]", word)


def test_a_self_checking_policy_parameter_too_large_is_named(tmp_path):
    # malcolm checks its own parameters (registry params=None): 2^63 failed in a C long
    _refused(tmp_path, '[policy]\nname = "malcolm"\nwindow_ns = 9223372036854775808\n'
             + SERVER, "[policy] window_ns is out of range")


def test_an_integer_of_thousands_of_digits_is_not_a_traceback(tmp_path):
    _refused(tmp_path, f'[policy]\nname = "jbt"\nthreshold = {"1" * 5000}\n' + SERVER,
             "not valid TOML")


@pytest.mark.parametrize("servers", ["server = 5", 'server = "x"',
                                     '[server]\naddress = "127.0.0.1:20001"'])
def test_servers_that_are_not_an_array_of_tables(tmp_path, servers):
    _refused(tmp_path, servers + "\n", "[[server]] tables")


# --------------------------------------------------------------------------- the key

@pytest.mark.parametrize("kf,word", [('""', "is empty"), ('"   "', "is empty"),
                                     ('"a\\u0000b"', "holds NUL")])
def test_an_empty_key_file_is_refused_not_unauthenticated(tmp_path, monkeypatch, kf, word):
    monkeypatch.delenv("MALCOLM_RACK_KEY_FILE", raising=False)
    _refused(tmp_path, f"[rack]\nkey_file = {kf}\n" + SERVER, "key_file", word)
    p = str(tmp_path / "rack.toml")
    for args in (["rack", "check", "--rack", p], ["serve", "--rack", p, "--id", "0"],
                 ["loadgen", "--rack", p, "--duration", "0.2s"]):
        _one_line(CliRunner().invoke(main, args), "key_file")


def test_a_rack_without_key_file_is_still_unauthenticated(tmp_path, monkeypatch):
    # docs/runtime.md: a rack without a key runs with the all-zero key (and says so)
    monkeypatch.delenv("MALCOLM_RACK_KEY_FILE", raising=False)
    cfg = _load(tmp_path, SERVER)
    assert cfg.key_file is None and key_path(cfg) is None


# ----------------------------------------------------------------------- the addresses

def test_a_long_shm_rack_name_is_refused_not_truncated(tmp_path):
    msg = _refused(tmp_path, f'[rack]\ntransport = "shm"\nname = "{"a" * 300}"\n'
                   "[[server]]\n[[server]]\n", "over 16", "at most 13")
    assert "used twice" not in msg and len(msg) < 300
    cfg = _load(tmp_path, '[rack]\ntransport = "shm"\nname = "abcdefghijklm"\n'
                "[[server]]\n[[server]]\n")
    assert cfg.addresses == ["abcdefghijklm-s0", "abcdefghijklm-s1"]


@pytest.mark.parametrize("name", ["a\\nError: forged", "\\u001b[31mred", "a\\rb", "a\\tb",
                                  "a\\u0085b", "a\\u2028b", "a\\u202eb", "\\u0007"])
def test_a_rack_name_with_control_characters_is_one_line(tmp_path, name):
    """The name is printed in banners and messages (``rack up``, ``rack check``): a newline
    or an escape sequence in it forged lines and recoloured the terminal."""
    msg = _refused(tmp_path, f'[rack]\nname = "{name}"\n' + SERVER, "[rack] name",
                   "control character")
    assert not any(c in msg for c in "\x1b\r\t\x85\u2028\u202e\x07"), msg
    # rack gen writes the name it is given; its own check refuses it the same way
    _one_line(_gen("--hosts", "a", "--name", tomllib.loads(f'n = "{name}"')["n"]),
              "[rack] name")


def test_a_rack_name_may_hold_spaces_and_letters_of_any_script(tmp_path):
    assert _load(tmp_path, '[rack]\nname = "rack é 1"\n' + SERVER).name == "rack é 1"


@pytest.mark.parametrize("transport,addr,word", [
    ("udp", "127.0.0.1:0", "port 0"), ("udp", "[::1]:0", "port 0"),
    ("verbs", "10.0.0.1:0", "port 0"), ("udp", "127.0.0.1\\u0000:20001", "NUL"),
    ("verbs", "10.0.0.1", "host:port"),
    # ASCII digits only: int() read port "８０００" as 8000, isdigit() scope "８" as index 8
    ("udp", "127.0.0.1:２０００１", "is not a number"),
    ("verbs", "10.0.0.1:２０００１", "is not a number"),
    ("udp", "[fe80::1%８]:20001", "no network interface '８'"),
    ("udp", "[fe80::1%99999999999]:20001", "over 4294967295")])
def test_port_zero_and_nul_addresses_are_refused(tmp_path, transport, addr, word):
    _refused(tmp_path, f'[rack]\ntransport = "{transport}"\n[[server]]\naddress = "{addr}"\n',
             word)


def test_parse_rack_refuses_a_policy_list_directly():
    with pytest.raises(ConfigError, match=r"\[policy\] must be a table"):
        parse_rack({"policy": [{"name": "random"}],
                    "server": [{"address": "127.0.0.1:20001"}]})


# ---------------------------------------------------------------------------- rack gen

def _gen(*args):
    return CliRunner().invoke(main, ["rack", "gen", *args])


@pytest.mark.parametrize("policy", ["jbt:threshold=nan", "jbt:threshold=inf",
                                    "steal:min_victim=nan", "malcolm:gamma=nan",
                                    "malcolm:gamma=1e400"])
def test_gen_refuses_non_finite_policy_parameters(policy):
    _one_line(_gen("--hosts", "127.0.0.1", "--policy", policy), "finite")


def test_gen_checks_the_policy_as_serve_builds_it():
    _one_line(_gen("--hosts", "127.0.0.1", "--policy", "malcolm:gamma=5"), "gamma")


@pytest.mark.parametrize("handler,word", [("zzz", "unknown handler"),
                                          ("sleep:spin_us=nan", "spin_us"),
                                          ("so:/x.so", "so:PATH:SYMBOL"),
                                          ("python:mod", "python:MODULE:FUNCTION")])
def test_gen_refuses_a_handler_every_server_would(handler, word):
    _one_line(_gen("--hosts", "127.0.0.1", "--handler", handler), word)


def test_gen_accepts_a_handler_this_host_lacks():
    # a database or library on the servers' nodes only: its form is all gen can check
    res = _gen("--hosts", "127.0.0.1", "--handler", "rocksdb:path=/nonexistent/db")
    assert res.exit_code == 0, res.output


def _written(tmp_path, *args):
    out = tmp_path / "g.toml"
    res = _gen(*args, "-o", str(out))
    assert res.exit_code == 0, res.output
    return load_rack(str(out))


def test_gen_gives_a_repeated_host_its_next_ports(tmp_path):
    cfg = _written(tmp_path, "--hosts", "127.0.0.1,127.0.0.1", "--port", "20100")
    assert cfg.addresses == ["127.0.0.1:20100", "127.0.0.1:20101"]
    hf = tmp_path / "hosts"
    hf.write_text("127.0.0.1\n127.0.0.2 slots=2\n127.0.0.1 slots=2\n")
    cfg = _written(tmp_path, "--hostfile", str(hf), "--port", "20100")
    assert cfg.addresses == ["127.0.0.1:20100", "127.0.0.2:20100", "127.0.0.2:20101",
                             "127.0.0.1:20101", "127.0.0.1:20102"]
    res = _gen("--hosts", "node1,node1", "--port", "65535")
    _one_line(res, "past port 65535")


def test_gen_hostfile_repeating_a_name_passes_check(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("node1\nnode1\n")
    out = tmp_path / "g.toml"
    res = _gen("--hostfile", str(hf), "-o", str(out))
    assert res.exit_code == 0, res.output
    addrs = [s["address"] for s in tomllib.loads(out.read_text())["server"]]
    assert addrs == ["node1:7001", "node1:7002"]


def test_gen_writes_toml_for_any_name_and_refuses_odd_hosts(tmp_path):
    cfg = _written(tmp_path, "--hosts", "127.0.0.1", "--name", 'a"b\\c é')
    assert cfg.name == 'a"b\\c é'
    # a control character (DEL here) is refused as the rack file's own check refuses it
    _one_line(_gen("--hosts", "127.0.0.1", "--name", "a\x7fb"), "[rack] name 'a\\x7fb'")
    _one_line(_gen("--hosts", "node1:2"), "IPv6")
    hf = tmp_path / "hosts"
    hf.write_bytes(b"no\x01de\n")
    _one_line(_gen("--hostfile", str(hf)), "control characters")
    # written before, and no server could resolve its own name
    _one_line(_gen("--hosts", 'h"1'), "a host name is at most 253 ASCII letters")
    _one_line(_gen("--hosts", "h1", "--host-suffix", '"x'), "host 'h1\"x'")
    hf.write_text("node[01-99999999]\n")         # a hostfile's names are not expanded
    _one_line(_gen("--hostfile", str(hf)), "node[01-99999999]")
    _one_line(_gen("--hosts", "h" * 254), "at most 253")


def test_rack_check_warns_of_host_names_that_do_not_resolve_here(tmp_path):
    """rack gen writes the compute nodes' names as they are (each server resolves its own),
    but rack check refused such a rack on a login node that does not know them ('cannot
    resolve'). Now a warning line, exit status 0; a malformed name, a name used twice on one
    port and port 0 stay errors; serve, which must resolve its name, still refuses it."""
    out = tmp_path / "g.toml"
    res = _gen("--hosts", "node-a.invalid,node-b.invalid,node-a.invalid", "-o", str(out))
    assert res.exit_code == 0 and "do(es) not resolve here" in res.stderr, res.output
    res = CliRunner().invoke(main, ["rack", "check", "--rack", str(out)])
    assert res.exit_code == 0, res.output
    assert "server 2: node-a.invalid:7002" in res.stdout
    warn = res.stderr.splitlines()
    assert warn == ["rack check: warning: node-a.invalid, node-b.invalid do not resolve here; "
                    "each server resolves its own name at start (serve stops if its node "
                    "cannot)"], res.stderr
    assert load_rack(str(out), resolve=False).unresolved == ["node-a.invalid", "node-b.invalid"]
    with pytest.raises(ConfigError, match="cannot resolve 'node-a.invalid'"):
        load_rack(str(out))                     # serve's, loadgen's, rack up's: resolved
    for addrs, word in ((["bad host!:7001"], "a host name is at most 253 ASCII letters"),
                        (["node1:2:7001"], "only allowed in an IPv6 address"),
                        (["n.invalid:7001", "N.INVALID:7001"], "used twice"),
                        (["n.invalid:0"], "port 0")):
        p = tmp_path / "bad.toml"
        p.write_text("".join(f'[[server]]\naddress = "{a}"\n' for a in addrs))
        _one_line(CliRunner().invoke(main, ["rack", "check", "--rack", str(p)]), word)
    # a rack whose names all resolve prints no warning
    res = CliRunner().invoke(main, ["rack", "check", "--rack", str(_written(tmp_path, "--hosts",
                                                                           "localhost").path)])
    assert res.exit_code == 0 and res.stderr == "", res.output


@pytest.mark.parametrize("value", ["0", "-1", "abc", "²", "1000"])
def test_a_broken_slurm_tasks_per_node_is_one_line(value, monkeypatch):
    """SLURM_NTASKS_PER_NODE=0 gave a KeyError traceback (a rack of no servers), and -1 or
    abc were silently taken for 1."""
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", value)
    _one_line(CliRunner().invoke(main, ["rack", "gen", "--hosts", "node1"]),
              "SLURM_NTASKS_PER_NODE")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2(x3)")
    res = CliRunner().invoke(main, ["rack", "gen", "--hosts", "node1"])
    assert res.exit_code == 0 and res.output.count("[[server]]") == 2, res.output
