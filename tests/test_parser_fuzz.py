"""The text parsers of user and file input against generated input: a bad value is one clear
ValueError (or the module's error class), never another exception, a hang, or garbage taken
for a value. Regression tests hold the minimized inputs a fuzzing session found; one seeded
fuzz test per parser keeps the property checked (a few hundred cases each)."""

import argparse
import time

import pytest

from malcolm import _argparse as G
from malcolm import _units as U
from malcolm.runtime import config as C


def _timed(fn, *args, limit=0.5):
    t = time.perf_counter()
    try:
        fn(*args)
    except ValueError:
        pass
    assert time.perf_counter() - t < limit, (fn.__name__, len(args[0]))


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
    t = time.perf_counter()
    with pytest.raises(argparse.ArgumentTypeError):
        G.loads(text)
    assert time.perf_counter() - t < 0.5


def test_loads_ranges_kept():
    assert G.loads("0.5:0.9:0.1") == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert len(G.loads(f"0.0001:{G.MAX_LOADS / 10000 - 0.0001}:0.0001")) == G.MAX_LOADS - 1


@pytest.mark.parametrize("text", ["1-99999999999999999999999999999999999999999999999999",
                                  "0-1000000000000", f"{2**64}", f"{2**64 - 1}-{2**64}",
                                  "1-60000,70000-130000"])
def test_seeds_refuses_huge_ranges(text):
    # 1-10**50 was an OverflowError, 0-10**12 built its list for minutes
    t = time.perf_counter()
    with pytest.raises(argparse.ArgumentTypeError):
        G.seeds(text)
    assert time.perf_counter() - t < 0.5


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
    t = time.perf_counter()
    with pytest.raises(C.ConfigError) as e:
        C.load_rack(str(p), resolve=False)
    assert time.perf_counter() - t < 1.5
    assert "\n" not in str(e.value)

