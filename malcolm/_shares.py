"""Traffic shares: per-server weights as the cumulative fractions that a client's draw (the
simulator's and the load generator's) compares a uniform number with."""

from __future__ import annotations

import math


def cumulative(weights) -> list[float]:
    """The running sums of ``weights`` over their total (non-negative, positive sum; the
    caller checked them). The caller pins the last entry, which rounding may leave below 1.

    Where each weight is finite but their sum is not (``1e308, 1e308, 1``), every weight over
    the infinite total was 0 and the last server took all the traffic: the weights are then
    divided by the largest first, which bounds the sum by their count. A finite sum keeps the
    arithmetic it always had, so every result of ordinary weights keeps its bits.
    """
    tot = float(sum(weights))
    if not math.isfinite(tot):
        top = max(weights)
        weights = [x / top for x in weights]
        tot = float(sum(weights))
    out, acc = [], 0.0
    for x in weights:
        acc += x / tot
        out.append(acc)
    return out
