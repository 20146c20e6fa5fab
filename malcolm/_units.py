"""Durations, rates and lists as people write them (``500ms``, ``20k``, ``1,1,2,2``): the one
parser that the CLI's parameter types (:mod:`malcolm.commands.types`) and the tools below the
CLI both use."""

from __future__ import annotations

import math
import re

__all__ = ["RACK_MAX_SERVERS", "RACK_MAX_SPEED", "RACK_MAX_WORKERS", "RACK_MIN_SPEED",
           "ascii_digits", "ascii_number", "parse_duration", "parse_rate", "rack_groups",
           "split_items"]

#: A rack's limits, wherever a rack spec is read (the simulator's racks, the bench scripts'
#: ``--servers``). Servers: the native layout's ``malcolm.policy.base.MAX_SERVERS``, written
#: here so that the parsers work without a build (tests/test_parser_fuzz.py checks they
#: agree). A server's speed factor: beyond 1000x either way a task's time leaves the range
#: the workloads allow (1 ns - 1 s, :data:`malcolm.workloads.MAX_TIME_US`) by as much, and a
#: speed of 1e-9 made ``malcolm sim`` run for hours.
RACK_MAX_SERVERS = 64
RACK_MAX_WORKERS = 4096
RACK_MIN_SPEED, RACK_MAX_SPEED = 1e-3, 1e3

# nanoseconds per unit (whole numbers, so that 0.5ms -> 500.0 µs exactly)
# µs with the micro sign (U+00B5) or the Greek mu (U+03BC): they look the same, and
# keyboards and editors give either
_DURATION_UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "\u03bcs": 1e3, "ms": 1e6, "s": 1e9,
                   "m": 60e9, "min": 60e9, "h": 3600e9}
# Each pattern can split its text one way only, and is matched against the stripped text:
# "[0-9]*\.?[0-9]+" and runs of optional "\s*" side by side backtracked through every split,
# so that 5000 digits and an 'x' took 1.6 s to refuse, 20000 took 26 s (quadratic).
_NUMBER = r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_DURATION_RE = re.compile(rf"({_NUMBER})\s*(ns|us|µs|\u03bcs|ms|s|min|m|h)?")
_RATE_RE = re.compile(rf"({_NUMBER})\s*(?:([kKmMgG])\s*)?(?:/s)?")
_RATE_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: ``str.isdigit`` alone is true of ``²``
    and ``８`` too, which ``int()`` then refuses or reads as 8."""
    return text.isascii() and text.isdigit()


def ascii_number(text, typ=float):
    """``typ(text)`` (``int`` or ``float``) of a string of ASCII digits. ``int()`` and
    ``float()`` also read other scripts' digits (``８x８`` was a rack of 8 servers while
    ``--delay ８`` was refused) and ``1_000``, which the patterns here and the rack-spec
    grammar refuse: every number of the CLI, a file or a spec reads alike.

    Raises
    ------
    ValueError
        Where ``typ`` would, and for any character beyond ASCII or an underscore.
    """
    text = str(text)
    if not text.isascii() or "_" in text:
        raise ValueError(f"{text!r} is not a number (ASCII digits only)")
    return typ(text)


def parse_duration(text, unit: str = "s") -> float:
    """``text`` as a duration in ``unit`` (a bare number is already in ``unit``).

    Raises
    ------
    ValueError
        With a one-line message, when ``text`` is not a non-negative finite duration.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        v = float(text)
    else:
        m = _DURATION_RE.fullmatch(str(text).strip())
        if not m:
            raise ValueError(f"{text!r} is not a duration (examples: 5s, 500ms, 50us; "
                             f"a bare number is in {unit})")
        scale = _DURATION_UNITS[m.group(2)] / _DURATION_UNITS[unit] if m.group(2) else 1.0
        v = float(m.group(1)) * scale
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{text!r} must be a finite duration >= 0")
    return v


def parse_rate(text) -> float:
    """``text`` as a rate per second (> 0): ``20000``, ``20k``, ``1.5M``, ``20k/s``.

    Raises
    ------
    ValueError
        With a one-line message.
    """
    m = _RATE_RE.fullmatch(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a rate (examples: 20000, 20k, 1.5M, 20k/s)")
    v = float(m.group(1)) * _RATE_SUFFIX[(m.group(2) or "").lower()]
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{text!r} must be a {'' if math.isfinite(v) else 'finite '}rate > 0")
    return v


def split_items(text, seps: str = ",") -> list[str]:
    """The items of a list such as ``0.5,0.7`` (separated by any character of ``seps``),
    stripped of spaces.

    Raises
    ------
    ValueError
        With a one-line message, where an item is empty (``0.5,,0.7``, or a comma at either
        end) or ``text`` is: left out, the run was of another list than the one written, and
        some options dropped such items while others refused them.
    """
    items = [p.strip() for p in re.split(f"[{re.escape(seps)}]", str(text))]
    if "" in items:
        raise ValueError(f"{text!r} has an empty item" if len(items) > 1 else "is empty")
    return items


# [0-9], not \d: \d (and int()) read other scripts' digits, so "８x８" was 8 servers while
# every other number of the CLI refused them (ascii_number)
_GROUP = re.compile(r"^([0-9]+)\s*[xX*]\s*([0-9]+)(?:\s*@\s*([0-9.eE+-]+))?$")


def rack_groups(spec: str) -> list[tuple[str, int, int, float]]:
    """The groups of a rack spec ``COUNTxWORKERS[@SPEED],...`` (``2x14@2.0,9x4``) as
    ``(group, count, workers, speed)``, speed 1.0 where none is given: each a count and
    workers >= 1 and a speed > 0, within the rack's limits (``RACK_MAX_WORKERS``,
    ``RACK_MIN_SPEED``-``RACK_MAX_SPEED``, ``RACK_MAX_SERVERS`` in all). The simulator's
    rack parser (:func:`malcolm.sim.rack.parse_rack_spec`) and the bench scripts'
    ``--servers`` (:func:`malcolm._argparse.servers`) both read specs with it, so that both
    refuse the same specs with the same line.

    Raises
    ------
    ValueError
        One line naming the spec and the bad group.
    """
    out = []
    total = 0
    for group in spec.split(","):
        g = group.strip()
        m = _GROUP.match(g)
        if not m:
            raise ValueError(f"rack spec {spec!r}: bad group {g!r}; expected COUNTxWORKERS "
                             "with optional @SPEED, e.g. 8x8 or 2x14@2.0,9x4")
        try:
            # int() refuses over 4300 digits with a message about sys.set_int_max_str_digits
            count, w = int(m.group(1)), int(m.group(2))
            speed = float(m.group(3)) if m.group(3) else 1.0
        except ValueError:
            raise ValueError(f"rack spec {spec!r}: bad number in {g!r}") from None
        if count < 1 or w < 1:
            raise ValueError(f"rack spec {spec!r}: group {g!r} needs at least 1 server "
                             "and 1 worker")
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"rack spec {spec!r}: speed in {g!r} must be "
                             f"{'> 0' if math.isfinite(speed) else 'finite'}")
        if w > RACK_MAX_WORKERS:
            raise ValueError(f"rack spec {spec!r}: at most {RACK_MAX_WORKERS} workers per "
                             "server")
        total += count          # checked before anything builds a list of COUNT items
        if total > RACK_MAX_SERVERS:
            raise ValueError(f"rack spec {spec!r}: {total} servers, at most "
                             f"{RACK_MAX_SERVERS}")
        if not RACK_MIN_SPEED <= speed <= RACK_MAX_SPEED:
            raise ValueError(f"rack spec {spec!r}: speed {speed:g} must be within "
                             f"{RACK_MIN_SPEED:g}-{RACK_MAX_SPEED:g}")
        out.append((g, count, w, speed))
    return out
