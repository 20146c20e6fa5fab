"""Rack specifications: ``8x8``, ``2x16,14x2``, ``2x14@2.0,9x4``.

Each comma-separated group is ``COUNTxWORKERS`` with an optional ``@SPEED`` factor (default
1.0): COUNT servers, each with WORKERS workers running at SPEED times the nominal rate (a
task of nominal service time S takes S / SPEED). Servers are numbered in spec order. SPEED is
within 0.001-1000.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from malcolm._units import RACK_MAX_SPEED, RACK_MAX_WORKERS, RACK_MIN_SPEED, rack_groups

# the limits of malcolm._units, where rack_groups applies them to every spec
MAX_WORKERS = RACK_MAX_WORKERS
MIN_SPEED, MAX_SPEED = RACK_MIN_SPEED, RACK_MAX_SPEED

@dataclass(frozen=True)
class Rack:
    """Workers and speed factor of every server."""

    workers: tuple[int, ...]
    speeds: tuple[float, ...]
    spec: str = ""

    def __post_init__(self):
        # here, not in the parser alone: a Rack built by hand reaches the engine too (one
        # with fewer speeds than servers crashed it, a billion workers hung it)
        from malcolm.policy.base import MAX_SERVERS as max_servers
        what = f"rack spec {self.spec or '(built by hand)'!r}"
        if not isinstance(self.spec, str):
            raise TypeError(f"rack spec must be a string, got {self.spec!r}")
        try:
            w, s = tuple(self.workers), tuple(self.speeds)
        except TypeError:
            raise TypeError(f"{what}: workers and speeds must be sequences") from None
        if not 1 <= len(w) <= max_servers or len(s) != len(w):
            raise ValueError(f"{what}: {len(w)} servers' workers and {len(s)} speeds; one of "
                             f"each per server, 1-{max_servers} servers")
        for v in w:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"{what}: workers must be whole numbers, got {v!r}")
            if not 1 <= v <= MAX_WORKERS:
                raise ValueError(f"{what}: workers {v} must be within 1-{MAX_WORKERS}")
        for v in s:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"{what}: speeds must be numbers, got {v!r}")
            if not (math.isfinite(v) and MIN_SPEED <= v <= MAX_SPEED):
                raise ValueError(f"{what}: speed {v:g} must be within {MIN_SPEED:g}-"
                                 f"{MAX_SPEED:g}")
        object.__setattr__(self, "workers", tuple(int(v) for v in w))
        object.__setattr__(self, "speeds", tuple(float(v) for v in s))

    @property
    def n(self) -> int:
        return len(self.workers)

    @property
    def capacity(self) -> float:
        """Sum of workers x speed: the rack's rate in units of nominal workers."""
        return float(sum(w * s for w, s in zip(self.workers, self.speeds, strict=False)))

    def __str__(self):
        pairs = zip(self.workers, self.speeds, strict=True)
        return self.spec or ",".join(f"1x{w}@{s:g}" for w, s in pairs)


def parse_rack_spec(spec) -> Rack:
    """Parse a rack spec (or pass a :class:`Rack` through).

    Raises
    ------
    ValueError
        Naming the bad group and showing the accepted form.
    """
    if isinstance(spec, Rack):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"rack spec must be a non-empty string like 8x8, got {spec!r}")
    workers, speeds = [], []
    for _, count, w, speed in rack_groups(spec):       # within the limits, or one line
        workers += [w] * count
        speeds += [speed] * count
    return Rack(tuple(workers), tuple(speeds), spec.strip())
