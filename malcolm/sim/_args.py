"""The simulator's checks of single arguments (numbers, whole numbers, traffic shares) and
the plain-JSON form of its results; :mod:`malcolm.sim.run` uses them."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from malcolm._units import ascii_number


def _json_safe(v):
    """``v`` with plain Python values only, for ``json.dumps``: numpy scalars and arrays as
    Python numbers and lists (an argument given as ``np.int64`` reached the config as itself
    and ``json.dumps`` refused it), and NaN and infinities as null (they are not JSON)."""
    if isinstance(v, np.ndarray):
        v = v.tolist()
    elif isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, Mapping):
        return {_json_safe(k): _json_safe(x) for k, x in v.items()}
    return v


def _shares(shares, n):
    if shares is None:
        return [1.0] * n
    if isinstance(shares, str):
        try:
            shares = [ascii_number(x) for x in shares.split(",")]
        except ValueError:
            raise ValueError(f"shares {shares!r} must be comma-separated numbers") from None
    if not isinstance(shares, (Sequence, np.ndarray)):
        raise TypeError(f"shares must be a sequence of numbers, got {shares!r}")
    shares = [_number("each share", x) for x in shares]
    if len(shares) != n:
        raise ValueError(f"shares: need one per server ({n}), got {len(shares)}")
    if any(not math.isfinite(x) or x < 0 for x in shares) or sum(shares) <= 0:
        raise ValueError("shares must be non-negative with a positive sum")
    return shares


def _number(label, v, optional=False):
    """``v`` as a float, or None where ``optional``. A bool or a string is no number: True
    ran as a load of 1 and "0.1" failed deep inside the run (the CLI converts its strings
    itself, reading ASCII digits only)."""
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{label} must be a number, got {v!r} ({type(v).__name__})")
    try:
        return float(v)
    except OverflowError:           # an int beyond a float: beyond every range as well
        return math.inf if v > 0 else -math.inf


def _whole(label, v, lo, hi, optional=False, unit=""):
    """``v`` as an int within ``lo``-``hi`` (``unit`` ends the message), or None where
    ``optional``: a whole number (2.0 is 2; 1.5 ran one task and "100" a hundred)."""
    if v is None and optional:
        return None
    x = _number(label, v)
    if not isinstance(v, numbers.Integral) and not x.is_integer():
        raise ValueError(f"{label} must be a whole number, got {v!r}")
    n = int(v) if isinstance(v, numbers.Integral) else int(x)
    if not lo <= n <= hi:
        raise ValueError(f"{label} must be within {lo}-{hi}{unit}, got {n}")
    return n
