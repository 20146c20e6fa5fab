"""The experiment runner's text: a line per run as it finishes, and a row per point
(policy and load) under :data:`HEADER`. :mod:`malcolm.loadgen.experiment` re-exports them."""

from __future__ import annotations

import math

# A server whose measured utilisation reaches this is saturated: its workers never idle, its
# queue grows for as long as the run lasts, and so does a p99. Against the simulator's twin
# (sim_tasks, far more tasks than a run measures) the ratio then tests nothing.
SATURATED = 0.99


def saturated(row):
    """Whether some server of the row ran saturated (``server_util`` >= :data:`SATURATED`)."""
    return max((u for u in row["server_util"] if u is not None), default=0.0) >= SATURATED


def _f(v, w, d=0):
    return f"{v:{w}.{d}f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>{w}}"


def format_run(x):
    """One line per run, as it finishes."""
    flag = "  FLAGGED: " + "; ".join(x["flags"]) if x["flags"] else ""
    return (f"  run {x['repeat'] + 1} {x['policy']:<16} load {x['load']:4.2f}: p99 "
            f"{_f(x['p99_us'], 7)} µs, eff. load {x['effective_load']:.3f}, late "
            f"{100 * x['late_fraction']:.2f}%, migr {x['migrations_per_task']:.2f}/task, "
            f"steals {x['steals_per_task']:.2f}/task"
            + (f", GET cpu {x['pad_us']['cpu']:.0f} µs real, target/wall "
               f"{x['pad_us']['target']:.0f}/{x['pad_us']['wall']:.0f} µs, overran "
               f"{x['overruns']}/{x['padded']}"
               if x.get("padded") else "") + flag)


# "CI" is the median's order-statistic interval over the runs used; its coverage ("cov") is
# 95% from 6 runs on and lower below (50% for 2, 93.75% for 5): printed, never assumed.
HEADER = (f"{'policy':<16} {'load':>4} {'eff':>5} {'p99 µs':>7} {'CI':>15} {'cov':>4} {'n':>3} "
          f"{'late':>6} {'migr':>5} {'steal':>5} {'sim p99':>7} {'ratio':>5}  util per server")


def _cov(c):
    """The interval's coverage as a percentage, 4 wide ("   -" when there is none)."""
    return f"{100 * c:3.0f}%" if isinstance(c, (int, float)) and c > 0 else f"{'-':>4}"


def format_row(row):
    ci = row["p99_ci_us"]
    cis = f"[{_f(ci[0], 6)},{_f(ci[1], 6)}]"
    util = " ".join(_f(u, 4, 2) if u is not None else "   -" for u in row["server_util"])
    mark = "" if row["valid"] else "  (no clean run: median of flagged runs)"
    if row.get("sim_saturated"):
        mark += "  (a server saturated: p99 grows with run length, the ratio is no test)"
    return (f"{row['policy']:<16} {row['load']:4.2f} {row['effective_load']:5.3f} "
            f"{_f(row['p99_us'], 7)} {cis:>15} {_cov(row.get('ci_coverage'))} {row['used']:>3} "
            f"{100 * row['late_fraction']:5.2f}% {row['migrations_per_task']:5.2f} "
            f"{row['steals_per_task']:5.2f} {_f(row.get('sim_p99_us'), 7)} "
            f"{_f(row.get('sim_ratio'), 5, 2)}  {util}{mark}")
