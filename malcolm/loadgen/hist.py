"""Reading the native log-linear histogram (``malcolm/_hist.pxd``): bucket bounds, merging,
percentiles.

A histogram here is a dict ``{"n", "min", "max", "sum", "counts"}`` with ``counts`` a numpy
array of ``N_BUCKETS`` bucket counts, as :meth:`LoadClient.results` returns it. Values are
integer nanoseconds. A bucket is at most 1/128 of its values wide; a percentile is reported as
the midpoint of the bucket that holds it (clamped to the exact min and max), so it is within
0.4% of the true sample quantile (within 0.5 ns below 256 ns).
"""

from __future__ import annotations

import numpy as np

from malcolm.loadgen._hist_py import n_buckets

SUB_BITS = 8
N_BUCKETS = n_buckets()


def _bounds():
    idx = np.arange(N_BUCKETS, dtype=np.int64)
    lo = idx.copy()
    hi = idx + 1
    big = idx >= (1 << SUB_BITS)
    k = idx[big] - (1 << SUB_BITS)
    h = k // (1 << (SUB_BITS - 1)) + SUB_BITS
    sub = k % (1 << (SUB_BITS - 1)) + (1 << (SUB_BITS - 1))
    shift = h - SUB_BITS + 1
    lo[big] = sub << shift
    hi[big] = (sub + 1) << shift
    return lo, hi


LOWER, UPPER = _bounds()


def empty():
    return {"n": 0, "min": 0, "max": 0, "sum": 0.0,
            "counts": np.zeros(N_BUCKETS, dtype=np.uint64)}


def merge(hists):
    """Sum histograms (of several client threads)."""
    out = empty()
    for h in hists:
        if not h["n"]:
            continue
        out["min"] = h["min"] if not out["n"] else min(out["min"], h["min"])
        out["max"] = h["max"] if not out["n"] else max(out["max"], h["max"])
        out["n"] += int(h["n"])
        out["sum"] += float(h["sum"])
        out["counts"] = out["counts"] + h["counts"]
    return out


def percentile(h, q):
    """The ``q``-th percentile (0..100) in ns, or ``nan`` for an empty histogram."""
    n = int(h["n"])
    if n == 0:
        return float("nan")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} must be in 0..100")
    rank = max(1, int(np.ceil(q / 100.0 * n)))
    cum = np.cumsum(h["counts"], dtype=np.uint64)
    i = int(np.searchsorted(cum, rank))
    mid = 0.5 * (LOWER[i] + UPPER[i] - 1) if i >= (1 << SUB_BITS) else float(LOWER[i])
    return float(min(max(mid, h["min"]), h["max"]))


def percentile_ci(h, q, z=1.96):
    """A confidence interval (ns) for the ``q``-th percentile: the values at the ranks
    ``n p -/+ z sqrt(n p (1 - p))`` (the normal approximation of the binomial
    order-statistic interval; 95% for ``z = 1.96``), each read as :func:`percentile` reads
    its rank. ``(nan, nan)`` when empty."""
    n = int(h["n"])
    if n == 0:
        return float("nan"), float("nan")
    p = q / 100.0
    half = z * np.sqrt(n * p * (1.0 - p))
    lo_q = 100.0 * max(0.0, (n * p - half) / n)
    hi_q = 100.0 * min(1.0, (n * p + half + 1.0) / n)
    return percentile(h, lo_q), percentile(h, hi_q)


def mean(h):
    return h["sum"] / h["n"] if h["n"] else float("nan")


def nonzero(h):
    """Indices of the non-empty buckets."""
    return np.flatnonzero(h["counts"])


def buckets(h):
    """Non-empty buckets as ``[lower_ns, upper_ns_exclusive, count]`` rows (for JSON)."""
    nz = np.flatnonzero(h["counts"])
    return [[int(LOWER[i]), int(UPPER[i]), int(h["counts"][i])] for i in nz]


def exact_percentile(samples, q):
    """Percentile of raw samples with the same rank rule as :func:`percentile`."""
    a = np.sort(np.asarray(samples, dtype=np.int64))
    if a.size == 0:
        return float("nan")
    rank = max(1, int(np.ceil(q / 100.0 * a.size)))
    return float(a[rank - 1])
