"""What the load generator sends, beside the service times: when (the arrival process) and
with which payload (size and content).

Arrivals (``--arrivals``):

``poisson``          exponential gaps (the default; an open-loop Poisson process);
``fixed``            every gap exactly 1/rate: deterministic arrivals (threads interleave);
``trace:FILE``       the inter-arrival gaps in FILE, in turn and in a loop;
``trace-ts:FILE``    the same from timestamps (the gaps are their differences).

A trace file holds numbers separated by white space, commas or new lines; ``#`` starts a
comment. Its values are read as µs, but only their *shape* is kept: the gaps are scaled so
their mean is the target rate's (``--rate``, and ``--change rate=...``), so one trace serves a
sweep. Without ``--rate`` the trace is replayed at its own rate (its values read as µs).

Payloads (``--payload-size``, ``--payload``): a size of ``N`` bytes, ``uniform:MIN:MAX`` or
``exp:MEAN[:MAX]`` (an exponential size, capped at MAX, default the wire limit), each at most
the wire's :data:`malcolm.net.wire.MAX_PAYLOAD` bytes; the content ``zeros``, ``random`` or
``pattern`` (``byte[i] = (request_id + i) % 251``, which the client can check in echoed
responses with ``--check-echo`` against servers running the ``echo`` handler).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np

from malcolm._units import ascii_number
from malcolm.net.wire import MAX_PAYLOAD

ARRIVALS = {"poisson": 0, "fixed": 1, "trace": 2}
SIZES = {"fixed": 0, "uniform": 1, "exp": 2}
CONTENTS = {"zeros": 0, "random": 1, "pattern": 2}
MAX_TRACE = 10_000_000


class TrafficError(ValueError):
    """A bad arrival or payload description; the message is one line."""


@dataclass
class Arrivals:
    """An arrival process: ``kind`` in :data:`ARRIVALS`, the trace's gaps (µs) if any."""

    kind: str = "poisson"
    gaps_us: np.ndarray | None = None
    source: str | None = None

    @property
    def code(self) -> int:
        return ARRIVALS[self.kind]

    def describe(self) -> str:
        if self.kind != "trace":
            return self.kind
        return (f"trace {os.path.basename(self.source)!r} ({self.gaps_us.size} gaps, "
                f"recorded rate {self.trace_rate():.6g}/s)")

    def trace_rate(self) -> float | None:
        """The trace's own rate per second, reading its values as µs."""
        if self.gaps_us is None:
            return None
        m = float(self.gaps_us.mean())
        return 1e6 / m if m > 0 else None

    def for_thread(self, i: int, threads: int, rate: float) -> dict:
        """The schedule of client thread ``i`` of ``threads`` at total ``rate`` (per s):
        ``arrival`` (the native code), ``trace`` (its gaps, mean 1) and ``first_offset_s``.

        The threads' streams merge into the process asked for. Poisson streams add up to a
        Poisson stream. Fixed: thread ``i`` starts ``i / rate`` later, so the sends
        interleave evenly. A trace: thread ``i`` sends arrivals ``i, i + T, i + 2T, ...`` of
        it (its gaps are sums of ``T`` consecutive gaps, its start the first ``i`` gaps), so
        the threads together replay the trace itself; the trace is cut to a multiple of
        ``T`` gaps for that.
        """
        out = {"arrival": self.code, "trace": None, "first_offset_s": 0.0}
        if self.kind == "fixed":
            out["first_offset_s"] = i / rate
        elif self.kind == "trace":
            g = self.gaps_us
            m = g.size - g.size % threads
            if m == 0:
                raise TrafficError(f"trace {self.source!r}: {g.size} gap(s) for {threads} "
                                   "threads; give at least one per thread")
            mean = float(g[:m].mean())
            if not mean > 0:
                raise TrafficError(f"trace {self.source!r}: its first {m} gaps are all zero")
            blocks = np.roll(g[:m], -i).reshape(-1, threads).sum(axis=1)
            out["trace"] = blocks / blocks.mean()
            # the thread's gaps are in units of its own mean gap (threads / rate)
            out["first_offset_s"] = float(g[:i].sum()) / mean / rate
        return out


def parse_arrivals(text: str) -> Arrivals:
    """``poisson``, ``fixed``, ``trace:FILE`` or ``trace-ts:FILE``."""
    t = str(text).strip()
    kind, _, path = t.partition(":")
    kind = kind.lower()
    if kind in ("poisson", "fixed") and not path:
        return Arrivals(kind)
    if kind in ("trace", "trace-ts"):
        if not path:
            raise TrafficError(f"--arrivals {text!r} needs a file: {kind}:FILE")
        vals = read_numbers(path)
        if kind == "trace-ts":
            if vals.size < 2:
                raise TrafficError(f"trace {path!r}: needs at least two timestamps")
            gaps = np.diff(vals)
            if (gaps < 0).any():
                i = int(np.flatnonzero(gaps < 0)[0])
                raise TrafficError(f"trace {path!r}: timestamp {i + 2} ({vals[i + 1]:g}) is "
                                   f"before the one above it ({vals[i]:g})")
        else:
            gaps = vals
            if (gaps < 0).any():
                i = int(np.flatnonzero(gaps < 0)[0])
                raise TrafficError(f"trace {path!r}: value {i + 1} ({gaps[i]:g}) is a "
                                   "negative gap")
        if not gaps.sum() > 0:
            raise TrafficError(f"trace {path!r}: the gaps add up to zero")
        return Arrivals("trace", gaps, path)
    raise TrafficError(f"--arrivals {text!r}: use poisson, fixed, trace:FILE (gaps) or "
                       "trace-ts:FILE (timestamps)")


_SPLIT = re.compile(r"[\s,;]+")


def read_numbers(path: str) -> np.ndarray:
    """The numbers of a trace file (white space, commas or lines apart; ``#`` comments)."""
    from malcolm._files import read_text
    try:
        text = read_text(path, 64 << 20)    # a FIFO or /dev/zero: refused, not read
    except OSError as e:
        raise TrafficError(f"trace {path!r}: {e.strerror}") from None
    except ValueError as e:
        raise TrafficError(f"trace {e}") from None
    vals = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        for tok in _SPLIT.split(line):
            if not tok:
                continue
            try:        # ASCII digits only: float() read "８" or "1_000" in a trace
                v = ascii_number(tok)
            except ValueError:
                raise TrafficError(f"trace {path!r}, line {lineno}: {tok[:40]!r} is not a "
                                   "number") from None
            if not math.isfinite(v):
                raise TrafficError(f"trace {path!r}, line {lineno}: {tok!r} is not finite")
            vals.append(v)
            if len(vals) > MAX_TRACE:
                raise TrafficError(f"trace {path!r}: more than {MAX_TRACE} values")
    if not vals:
        raise TrafficError(f"trace {path!r}: no numbers in it")
    return np.asarray(vals, dtype=np.float64)


@dataclass
class Payload:
    """Payload sizes (``kind`` in :data:`SIZES`, bounds ``a``, ``b``) and ``content``."""

    kind: str = "fixed"
    a: int = 0
    b: int = 0
    content: str = "zeros"
    check_echo: bool = False

    @property
    def native(self):
        return (SIZES[self.kind], self.a, self.b)

    @property
    def empty(self) -> bool:
        return self.kind == "fixed" and self.a == 0

    def mean(self) -> float:
        if self.kind == "fixed":
            return float(self.a)
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        # the capped exponential: E[min(floor(X), b)] for X ~ Exp(mean a)
        q = math.exp(-1.0 / self.a)
        return q * (1 - q ** self.b) / (1 - q)

    def describe(self) -> str:
        if self.empty:
            return "none"
        size = {"fixed": f"{self.a} B", "uniform": f"uniform {self.a}..{self.b} B",
                "exp": f"exponential mean {self.a} B (max {self.b})"}[self.kind]
        return f"{size}, {self.content}" + (", echo checked" if self.check_echo else "")


def _size(text: str, what: str) -> int:
    try:        # ASCII digits only, as every number of the CLI (int() read "８")
        v = ascii_number(text, int)
    except ValueError:
        raise TrafficError(f"--payload-size {what!r}: {text!r} is not a whole number of "
                           "bytes") from None
    if not 0 <= v <= MAX_PAYLOAD:
        raise TrafficError(f"--payload-size {what!r}: {v} bytes is outside 0..{MAX_PAYLOAD} "
                           "(the wire's limit)")
    return v


def parse_payload(size: str, content: str = "zeros", check_echo: bool = False) -> Payload:
    """``N``, ``uniform:MIN:MAX`` or ``exp:MEAN[:MAX]`` bytes; ``content`` zeros, random or
    pattern."""
    s = str(size).strip().lower()
    parts = s.split(":")
    if parts[0] == "uniform" and len(parts) == 3:
        p = Payload("uniform", _size(parts[1], s), _size(parts[2], s))
        if p.b < p.a:
            raise TrafficError(f"--payload-size {s!r}: MAX is below MIN")
    elif parts[0] == "exp" and len(parts) in (2, 3):
        p = Payload("exp", _size(parts[1], s),
                    _size(parts[2], s) if len(parts) == 3 else MAX_PAYLOAD)
        if p.a < 1:
            raise TrafficError(f"--payload-size {s!r}: the mean must be >= 1 byte")
    elif len(parts) == 1:
        p = Payload("fixed", _size(parts[0], s))
    else:
        raise TrafficError(f"--payload-size {size!r}: use N, uniform:MIN:MAX or "
                           "exp:MEAN[:MAX] (bytes)")
    if content not in CONTENTS:
        raise TrafficError(f"--payload {content!r}: zeros, random or pattern")
    p.content = content
    if check_echo and content != "pattern":
        raise TrafficError("--check-echo needs --payload pattern")
    if check_echo and p.empty:
        raise TrafficError("--check-echo needs a payload: give --payload-size")
    p.check_echo = check_echo
    return p
