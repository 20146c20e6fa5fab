"""The text parsers of user and file input against generated input: a bad value is one clear
ValueError (or the module's error class), never another exception, a hang, or garbage taken
for a value. Regression tests hold the minimized inputs a fuzzing session found; one seeded
fuzz test per parser keeps the property checked (a few hundred cases each)."""

import argparse
import copy
import math
import random
import time

import pytest

from malcolm import _argparse as G
from malcolm import _units as U
from malcolm import workloads as W
from malcolm.policy import registry as R
from malcolm.runtime import config as C


def _timed(fn, *args, limit=0.5):
    t = time.perf_counter()
    try:
        fn(*args)
    except ValueError:
        pass
    assert time.perf_counter() - t < limit, (fn.__name__, len(args[0]))


def _refused_in_time(fn, arg, exc, limit=0.5):
    """``fn(arg)`` raises ``exc`` within ``limit`` seconds; returns pytest's ExceptionInfo."""
    t = time.perf_counter()
    with pytest.raises(exc) as e:
        fn(arg)
    assert time.perf_counter() - t < limit
    return e


# ---------------------------------------------------------------- regressions: _units

@pytest.mark.parametrize("text", ["9" * 20000 + "x", "1." + "1" * 20000 + "e",
                                  "1" + " " * 20000 + "z",
                                  "1" + " " * 9000 + "k" + " " * 9000 + "z"])
def test_duration_and_rate_refuse_long_text_in_linear_time(text):
    # the patterns backtracked through every split: 20000 digits and an 'x' took 26 s
    _timed(U.parse_duration, text)
    _timed(U.parse_rate, text)


def test_duration_and_rate_spellings_kept():
    assert U.parse_duration(" 0.5 ms ", "us") == 500.0
    assert U.parse_duration(".5s", "ms") == 500.0
    assert U.parse_rate(" 20 k /s ") == 20000.0
    assert U.parse_rate("20 /s") == 20.0
    for bad in ("5.", "1..2", "20ks", "20k/ s", "1 e3"):
        with pytest.raises(ValueError):
            U.parse_rate(bad)
        with pytest.raises(ValueError):
            U.parse_duration(bad)


# ---------------------------------------------------------------- regressions: _argparse

@pytest.mark.parametrize("text", ["+1:1e308:1", "0.1:1e9:0.001", "1:2:1e-300", "-inf:-1:1",
                                  "1:inf:1", "nan:1:0.1", "0.5:0.9:0", "1:1e308:1e-308"])
def test_loads_refuses_huge_and_nonfinite_ranges(text):
    # 1:1e308:1 built its list forever; -inf:-1:1 was an OverflowError
    _refused_in_time(G.loads, text, argparse.ArgumentTypeError)


def test_loads_ranges_kept():
    assert G.loads("0.5:0.9:0.1") == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert len(G.loads(f"0.0001:{G.MAX_LOADS / 10000 - 0.0001}:0.0001")) == G.MAX_LOADS - 1


@pytest.mark.parametrize("text", ["1-99999999999999999999999999999999999999999999999999",
                                  "0-1000000000000", f"{2**64}", f"{2**64 - 1}-{2**64}",
                                  "1-60000,70000-130000"])
def test_seeds_refuses_huge_ranges(text):
    # 1-10**50 was an OverflowError, 0-10**12 built its list for minutes
    _refused_in_time(G.seeds, text, argparse.ArgumentTypeError)


def test_seeds_kept():
    assert G.seeds("1-3,7") == [1, 2, 3, 7]
    assert G.seeds(f"{2**64 - 1}") == [2**64 - 1]


@pytest.mark.parametrize("text", ["nan", "1,inf", "-inf,2", "1e999"])
def test_numbers_refuses_nonfinite(text):
    # float() read them: --delays nan ran
    with pytest.raises(argparse.ArgumentTypeError):
        G.numbers(float)(text)
    assert G.numbers(float)("2,10") == [2.0, 10.0]


@pytest.mark.parametrize("text", ["0x10", "8x0", "00x00", "1x1@..", "2x2@1.2.3", "1x1@0",
                                  "1x1@0.0", "9" * 5000 + "x1", "1x1@" + "9" * 400])
def test_servers_refuses_what_no_rack_can_be(text):
    # the grammar alone took them; the simulator refused them later, with a traceback
    with pytest.raises(argparse.ArgumentTypeError):
        G.servers(text)


@pytest.mark.parametrize("text, msg", [("100x1", "100 servers, at most 64"),
                                       ("32x1,33x2", "65 servers, at most 64"),
                                       ("1x5000", "at most 4096 workers per server"),
                                       ("2x4@0.0001", "must be within 0.001-1000"),
                                       ("2x4@2000", "must be within 0.001-1000")])
def test_servers_refuses_what_the_simulator_refuses_with_its_line(text, msg):
    # within the grammar but beyond the simulator's limits: fig7_1_2.py --servers 100x1
    # was a traceback from inside simulate()
    from malcolm.sim.rack import parse_rack_spec
    with pytest.raises(argparse.ArgumentTypeError, match=msg):
        G.servers(text)
    with pytest.raises(ValueError, match=msg):
        parse_rack_spec(text)


def test_the_rack_limit_is_the_native_layouts():
    from malcolm.policy.base import MAX_SERVERS
    assert U.RACK_MAX_SERVERS == MAX_SERVERS
    assert G.servers("60x1,4x2") == "60x1,4x2"


def test_rack_spec_long_count_is_named():
    from malcolm.sim.rack import parse_rack_spec
    with pytest.raises(ValueError, match="bad number"):
        parse_rack_spec("9" * 5000 + "x1")


# ---------------------------------------------------------------- regressions: rack files

@pytest.mark.parametrize("text", ["a = " + "[" * 5000, "a = " + "{b = " * 5000,
                                  "a" + ".a" * 100_000 + " = 1",
                                  '[[server]]\naddress = "1:7001"\n' * 40_000])
def test_rack_file_nesting_depth_and_size(tmp_path, text):
    # deep arrays were a RecursionError traceback; a 200 kB dotted key took minutes and all
    # the memory (tomllib is quadratic in its depth); 1.2 MB of servers seconds
    p = tmp_path / "rack.toml"
    p.write_text(text)
    e = _refused_in_time(lambda path: C.load_rack(path, resolve=False), str(p), C.ConfigError,
                         limit=1.5)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- seeded fuzz, per parser

NUMS = ["0", "1", "5", "50", "0.5", ".5", "5.", "1e3", "1e-3", "1e6", "1e308", "1e309",
        "1e-400", "-1", "+1", "nan", "inf", "-inf", "1_000", "\uff18", "0x10", "9" * 60,
        "9" * 5000, " 2 ", "1e", "..", "1.2.3", "4", "1e9"]
GOOD = ["1", "2", "4", "8", "16", "50", "0.5", "0.9", "1.5", "100", "1e2"]
JUNK = ["", "\u00e9", "\x00", "abc", "\U0001f4a5", "\n", ":", ",", "::", ",,", " ", "@", "x",
        "-", "k", "ms", "us", "/s", "min"]


def _num(rng):
    return rng.choice(GOOD if rng.random() < .6 else NUMS)


def _soup(rng, toks, k=8):
    return "".join(rng.choice(toks) for _ in range(rng.randint(1, k)))


def _fuzz(gen, parse, allowed, check, n=400, seed=0, limit=3.0):
    """``parse`` every ``gen(rng)``: it returns a value ``check`` finds sane (None) or raises
    one of ``allowed`` with a one-line message; the whole batch within ``limit`` seconds."""
    rng = random.Random(seed)
    t = time.perf_counter()
    for _ in range(n):
        text = gen(rng)
        try:
            out = parse(text)
        except allowed as e:
            assert str(e).strip() and "\n" not in str(e), (text, e)
            continue
        assert check(out) is None, (text, out, check(out))
    assert time.perf_counter() - t < limit


def test_fuzz_units():
    toks = NUMS + JUNK + ["s", "h", "M", "G"]

    def gen(r):
        return _num(r) + r.choice(JUNK + ["s", "h", "M", "G", "k"]) if r.random() < .5 else (
            _soup(r, toks))
    _fuzz(gen, lambda t: U.parse_duration(t, "us"), ValueError,
          lambda v: None if math.isfinite(v) and v >= 0 else v, seed=1)
    _fuzz(gen, U.parse_rate, ValueError,
          lambda v: None if math.isfinite(v) and v > 0 else v, seed=2)


def test_fuzz_argparse_types():
    toks = NUMS + JUNK

    def gen(r):
        return ":".join(_num(r) for _ in range(3)) if r.random() < .5 else _soup(r, toks)

    def sane(vals):
        return None if 0 < len(vals) <= G.MAX_LOADS and all(
            math.isfinite(x) and x > 0 for x in vals) else len(vals)

    err = (argparse.ArgumentTypeError, ValueError)
    _fuzz(gen, G.loads, err, sane, seed=3)
    _fuzz(lambda r: _soup(r, toks, 5), G.seeds, err,
          lambda v: None if 0 < len(v) <= G.MAX_SEEDS and min(v) >= 0 else v, seed=4)
    _fuzz(lambda r: _soup(r, toks, 5), G.numbers(float), err,
          lambda v: None if all(math.isfinite(x) for x in v) else v, seed=5)

    def servers(r):
        return ",".join(_num(r) + "x" + _num(r) + r.choice(["", "@" + _num(r)])
                        for _ in range(r.randint(1, 3))) if r.random() < .7 else _soup(r, toks)

    def sane_spec(spec):
        from malcolm.sim.rack import parse_rack_spec
        try:
            parse_rack_spec(spec)
        except ValueError as e:     # only the simulator's own ranges are left to it
            return None if "at most" in str(e) or "within" in str(e) else str(e)
    _fuzz(servers, G.servers, err, sane_spec, seed=6)


def test_fuzz_workloads():
    dists = list(W.DIST_PARAMS) + ["bogus", "mix", "empirical"]

    def dist(r):
        k = r.choice(dists)
        return ":".join([k] + [_num(r) for _ in range(W.DIST_PARAMS.get(k, 1)
                                                            + r.choice([0, 0, -1, 1]))])

    def gen(r):
        x = r.random()
        if x < .35:
            return dist(r)
        if x < .7:
            return "mix:" + ",".join(_num(r) + ":" + dist(r)
                                     for _ in range(r.choice([1, 2, 3, 17])))
        return _soup(r, NUMS + JUNK + dists + list(W.NAMED))

    def sane(w):
        m, scv = w.mean_us, w.scv
        ok = (math.isfinite(m) and W.MIN_TIME_US * 0.999 <= m <= W.MAX_TIME_US
              and math.isfinite(scv) and scv >= -1e-9)
        return None if ok else (m, scv)
    _fuzz(gen, W.parse_workload, (ValueError, TypeError), sane, seed=7)


def test_fuzz_policy_specs():
    names = list(R.POLICIES) + ["JSQ", " jbt ", "nope", ""]
    vals = NUMS + ["true", "off", "-5", "ps", "fcfs", "", "=", "2147483648"]

    def gen(r):
        name = r.choice(names)
        info = R.POLICIES.get(name.strip().lower())
        keys = [*(info.params or {"learn": 0, "gamma": 0})] if info else []
        keys += ["seed", "name", "bogus", ""]
        items = [r.choice(keys) + r.choice(["=", "=", ""]) + r.choice(vals)
                 for _ in range(r.choice([0, 1, 2]))]
        return name + (":" + ",".join(items) if items else "")

    def parse(spec):
        name, params = R.parse_policy(spec)
        if R.POLICIES[name].kind == "server":
            R.make_policy(name, 4, 3, 1, **params)
        elif R.POLICIES[name].kind == "client":
            R.make_client_policy(name, 4, 1, 0, **params)
        return params

    def sane(params):
        bad = [k for k, v in params.items() if isinstance(v, float) and not math.isfinite(v)]
        return bad or None
    _fuzz(gen, parse, (ValueError, TypeError), sane, seed=8)


_RACK = {"rack": {"name": "rack", "transport": "udp"},
         "policy": {"name": "jbt", "seed": 1, "threshold": 4.0},
         "server": [{"address": "127.0.0.1:7001"}, {"address": "127.0.0.1:7002"}]}
_WEIRD = [None, True, 0, -1, 3, 1 << 70, 1e308, -0.0, float("nan"), float("inf"), "", "x",
          "\x00", "a" * 300, "127.0.0.1:7001", "127.0.0.1:0", "[::1]:7001", "shm", "verbs",
          "busy", [], [1], ["127.0.0.0/8"], {}, {"a": 1}, "malcolm", "jsq"]


def test_fuzz_rack_files():
    rkeys = [*C.RACK_KEYS, "bogus"]
    skeys = [*C.SERVER_KEYS, "bogus"]

    def gen(r):
        d = copy.deepcopy(_RACK)
        for _ in range(r.randint(0, 3)):
            x, v = r.random(), copy.deepcopy(r.choice(_WEIRD))
            if x < .35:
                d["rack"][r.choice(rkeys)] = v
            elif x < .55:
                d["policy"][r.choice(["name", "seed", "threshold", "count_own", "bogus"])] = v
            elif x < .8:
                r.choice(d["server"])[r.choice(skeys)] = v
            elif x < .9:
                d["server"].append(copy.deepcopy(r.choice(d["server"])))
            else:
                d[r.choice(["rack", "policy", "server", "extra"])] = v
                break
        return {k: {a: b for a, b in v.items() if b is not None} if isinstance(v, dict)
                else v for k, v in d.items() if v is not None}

    def sane(cfg):
        for k, (lo, hi) in C.RACK_RANGES.items():
            v = getattr(cfg, k, lo)
            if not (lo <= v <= hi or (k in C.AUTO_DEFAULTS and v == -1)):
                return k
        if not all(s.address and 0 <= s.workers <= 1024 for s in cfg.servers):
            return "server"
        return None
    _fuzz(gen, lambda d: C.parse_rack(d, "<fuzz>", resolve=False), C.ConfigError, sane,
          seed=9)
