"""The text parsers of user and file input against generated input: a bad value is one clear
ValueError (or the module's error class), never another exception, a hang, or garbage taken
for a value. Regression tests hold the minimized inputs a fuzzing session found; one seeded
fuzz test per parser keeps the property checked (a few hundred cases each)."""

import time

import pytest

from malcolm import _units as U


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
