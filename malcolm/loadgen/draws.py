"""A run's random draw whose offered work is its load, picked before the run.

A run's effective load is the count of its measured arrivals times the mean of their service
times, over the workers. In a short run both vary by chance, by sqrt((1 + SCV) / tasks)
relative: +/-2.6% (one standard deviation) for Exp(50) over 3 000 tasks, +/-7.9% for
HyperExp-2 (SCV 16.3) over 2 800. The experiment runner flags a run whose effective load is
more than :data:`malcolm.loadgen.method.LOAD_TOL` off its target and runs it again with a
fresh draw. That is a selection on the draw's load made *after* the run: on a held-out
HyperExp-2 rack most runs were flagged, every retry ran a whole load's policies again, and
the rows at 0.9 were left with one clean run each.

This module makes the same selection *before* the run, where it costs no rack time. The
native client draws a candidate stream without sending (:meth:`LoadClient.plan
<malcolm.loadgen._client.LoadClient.plan>`: the measured sends and their requested service
times, in the run's order of draws), and the runner takes the first candidate whose offered
work is within :data:`DRAW_TOL` of what its rate asks. The candidates are a fixed sequence
of seeds, so every policy of a repeat (common random numbers) gets the same one. The
simulator's twin makes the same choice among its seeds
(:func:`malcolm.sim.twin.runs_twin`'s ``draw_tol``), so both sides measure runs of the
same load.

What stays random is what a load means: the arrivals' times and order, the service times'
order and which tasks are the long ones. Only the total work of the measured window is held
to the load.
"""

from __future__ import annotations

import time

#: A run's offered work (the sum of the requested service times of its measured sends) is
#: held within this fraction of what its rate asks (rate x duration x mean service time).
DRAW_TOL = 0.01
#: Candidate draws tried at most, and the time their planning may take (s): beyond, the
#: nearest one runs, and the report says so. A plan costs about 15 ns a task, so a long run
#: (millions of tasks, whose own draw is within a tight tolerance anyway) tries fewer.
MAX_CANDIDATES = 1000
PLAN_BUDGET_S = 2.0

_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def candidate_seed(seed: int, c: int) -> int:
    """The seed of candidate ``c`` (0: ``seed`` itself, so that a run whose first draw is
    within the tolerance sends what it sent before the selection existed)."""
    return seed if c == 0 else (seed + c * _GOLDEN) & _MASK


def expected_work_ns(phases, warmup_s, duration_s, mean_ns):
    """The requested service time (ns) the measured window asks for on average: each
    phase's rate over its overlap with [warm-up, warm-up + duration], times the mean
    service time. ``phases`` as :meth:`LoadSpec.phases <malcolm.loadgen.run.LoadSpec.phases>`
    gives them (total rates)."""
    lo, hi = warmup_s, warmup_s + duration_s
    total = 0.0
    for k, (start, rate, _) in enumerate(phases):
        end = phases[k + 1][0] if k + 1 < len(phases) else hi
        total += rate * max(0.0, min(end, hi) - max(start, lo))
    return total * mean_ns


def lines(rep):
    """The load generator's note on a run whose draw was picked (``rep["draw"]``)."""
    d = rep.get("draw")
    if not d:
        return []
    tol = f"{100 * d['tol']:g}%"
    if d["within"]:
        return [f"  draw: candidate {d['candidate']} of {d['tried']} tried offers "
                f"{d['work_ratio']:.4f} x the work its rate asks (within {tol})"]
    return [f"  draw: none of {d['tried']} candidates offers the work its rate asks within "
            f"{tol}; the nearest ran ({d['work_ratio']:.4f} x)"]


def choose(clients, seeds, streams, expected_ns, tol=DRAW_TOL, limit=MAX_CANDIDATES,
           budget_s=PLAN_BUDGET_S):
    """Reseed ``clients`` (one per thread, not yet run) with the first candidate draw whose
    offered work is within ``tol`` of ``expected_ns``, or the nearest of those tried within
    ``limit`` candidates and ``budget_s`` seconds (at least one).

    Parameters
    ----------
    clients : list of LoadClient
    seeds, streams : list of int
        Each client's seed and stream, as it was built with them.
    expected_ns : float
        :func:`expected_work_ns` of the run.

    Returns
    -------
    dict
        ``candidate`` (0: the draw the clients were built with), ``work_ratio`` (its offered
        work over ``expected_ns``), ``tol``, ``tried``, and ``within`` (False where no
        candidate was within ``tol``: the nearest runs).
    """
    if not (expected_ns > 0 and 0 < tol < 1 and limit >= 1):
        raise ValueError(f"expected work {expected_ns!r} must be > 0, tol {tol!r} in (0, 1) "
                         f"and limit {limit!r} >= 1")
    best_c, best_r, tried = 0, None, 0
    t_end = time.monotonic() + budget_s
    for c in range(limit):
        if c and time.monotonic() > t_end:
            break
        tried += 1
        work = sum(cl.plan(candidate_seed(s, c), st)[1]
                   for cl, s, st in zip(clients, seeds, streams, strict=True))
        ratio = work / expected_ns
        if best_r is None or abs(ratio - 1.0) < abs(best_r - 1.0):
            best_c, best_r = c, ratio
        if abs(ratio - 1.0) <= tol:
            break
    if best_c:
        for cl, s, st in zip(clients, seeds, streams, strict=True):
            cl.reseed(candidate_seed(s, best_c), st)
    return {"candidate": best_c, "work_ratio": best_r, "tol": tol, "tried": tried,
            "within": abs(best_r - 1.0) <= tol}
