"""The experiment runner's text: a line per run as it finishes, and a row per point
(policy and load) under :data:`HEADER`. :mod:`malcolm.loadgen.experiment` re-exports them."""

from __future__ import annotations

import math

# A server whose measured utilisation reaches this is saturated: its workers never idle, its
# queue grows for as long as the run lasts, and so does a p99, and a percent more or less
# utilisation moves it several times over. Against the simulator's twin the ratio then
# tests nothing.
SATURATED = 0.99


# The simulator's twin predicts a run's p99 within this ratio, real / twin (the runtime
# issue's acceptance, docs/performance.md): outside it, the twin misses something the
# rack does (or the run was too short to estimate its p99), and the table says so.
TWIN_BOUND = (0.77, 1.3)


def saturated(row):
    """Whether some server of the row ran saturated (``server_util`` >= :data:`SATURATED`)."""
    return max((u for u in row["server_util"] if u is not None), default=0.0) >= SATURATED


def _f(v, w, d=0):
    return f"{v:{w}.{d}f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>{w}}"


def format_run(x):
    """One line per run, as it finishes."""
    flag = "  FLAGGED: " + "; ".join(x["flags"]) if x["flags"] else ""
    if x.get("guards"):         # the policy's guards that fired (method.guards_fired)
        from malcolm.policy.guards import guards_text
        flag = ", guards fired: " + guards_text(x["guards"]) + flag
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
    elif twin_outside(row):
        mark += f"  (outside the twin's bound {TWIN_BOUND[0]:g}-{TWIN_BOUND[1]:g})"
    return (f"{row['policy']:<16} {row['load']:4.2f} {row['effective_load']:5.3f} "
            f"{_f(row['p99_us'], 7)} {cis:>15} {_cov(row.get('ci_coverage'))} {row['used']:>3} "
            f"{100 * row['late_fraction']:5.2f}% {row['migrations_per_task']:5.2f} "
            f"{row['steals_per_task']:5.2f} {_f(row.get('sim_p99_us'), 7)} "
            f"{_f(row.get('sim_ratio'), 5, 2)}  {util}{mark}")


def twin_outside(row):
    """Whether the row's real / twin p99 ratio is a test (finite, no server saturated) and
    falls outside :data:`TWIN_BOUND`."""
    r = row.get("sim_ratio")
    if row.get("sim_saturated") or not isinstance(r, (int, float)) or not math.isfinite(r):
        return False
    return not TWIN_BOUND[0] <= r <= TWIN_BOUND[1]


def twin_check(rows):
    """The twin's prediction over the rows with a ratio: a dict of ``bound``, ``within`` and
    ``outside`` (lists of ``[policy, load, ratio]`` over the rows with a clean run),
    ``saturated`` (rows whose ratio is no test) and ``flagged`` (rows with no clean run, left
    out); None if no row has a twin."""
    had = [r for r in rows if isinstance(r.get("sim_ratio"), (int, float))
           and math.isfinite(r["sim_ratio"])]
    if not had:
        return None
    out = {"bound": list(TWIN_BOUND), "within": [], "outside": [], "saturated": [],
           "flagged": []}
    for r in had:
        key = ("flagged" if not r["valid"] else "saturated" if r.get("sim_saturated")
               else "outside" if twin_outside(r) else "within")
        out[key].append([r["policy"], r["load"], round(r["sim_ratio"], 3)])
    return out


def format_twin_check(c):
    """One line: how many clean points the twin predicted within its bound, and which not."""
    lo, hi = c["bound"]
    tested = len(c["within"]) + len(c["outside"])
    text = (f"simulator twin: real / twin p99 within [{lo:g}, {hi:g}] at {len(c['within'])} "
            f"of {tested} clean point(s)")
    if c["outside"]:
        text += "; outside: " + ", ".join(f"{p} at {x:g} ({q:.2f})" for p, x, q in c["outside"])
    left = []
    if c["saturated"]:
        left.append(f"{len(c['saturated'])} with a saturated server")
    if c["flagged"]:
        left.append(f"{len(c['flagged'])} with no clean run")
    return text + (f" ({' and '.join(left)}: no test)" if left else "")
