"""Thesis Fig 7.9: adaptivity to a traffic shift, a rate increase and a slowdown.

Rack of 12 servers: 4 fast (8 workers), 4 medium (6), 4 slow (4); Exp(50). Three runs, each
with one change at ``--t-change`` ms (Malcolm has been learning from its start
until then):

(a) shift: 540 KTPS throughout, evenly spread, then 60% of it sent to the fast servers;
(b) rate: 360 KTPS evenly spread, then 540 KTPS with the extra 180 KTPS sent to the fast
    servers;
(c) slowdown: 540 KTPS evenly spread, then the fast servers run at half speed.

The rack's capacity is 1440 KTPS, so these rates are light (37.5%); ``--rate-mult`` scales
all of them (1.6 gives 60% before the change).

The plot shows the mean load (expected wait) of each server type, 1 ms bins. "Time to
re-converge" is the time from the change until the 5 ms moving average of the spread between
the types' mean loads is back within 1.5x its pre-change mean (plus 1 µs) and stays there for
50 ms; ``inf`` if that never happens within the run. "Time to settle" is the same with the
policy's own new level (the spread's mean over the last quarter of the run) in place of the
pre-change mean (``settle_ms``; ``settle_1_2x_ms`` with a 1.2x band): after a slowdown the
fair equilibrium is not the old spread (docs/policy.md, "Fig 7.9"), so this is the time the
policy takes to get where it goes. The latency around the change: p99 of the tasks created
in the 50 ms before it (``p99_before50_us``), in the 50 ms after it (``p99_after50_us``) and
the largest p99 of a 10 ms bin of creation time after it (``peak_p99_10ms_after_us``) and,
as the baseline for a spike, before it (``peak_p99_10ms_before_us``), and the p99 of the
tasks created in the run's last quarter (``p99_last_quarter_us``, the level the change leads
to); a task's creation time is estimated from its index and the arrival rate (exact on average, off
by about sqrt(i)/rate, under 1 ms here).

Writes ``fig7_9.csv`` (curves), ``fig7_9_reconverge.csv`` and ``fig7_9.png``.

    python3 bench/figures/fig7_9.py [--outdir out/figures] [--quick] [--policy malcolm]
"""

import os
import sys

import numpy as np
from common import parse, parser, png, write_json, write_rows_csv

from malcolm import _argparse as g
from malcolm.sim import simulate
from malcolm.sim.run import RackChange

RACK = "4x8,4x6,4x4"
TYPES = {"fast": [0, 1, 2, 3], "medium": [4, 5, 6, 7], "slow": [8, 9, 10, 11]}


def scenarios(t_us, mult=1.0):
    even = [1.0] * 12
    lo, hi = 360e3 * mult, 540e3 * mult
    return {
        "(a) traffic shift": dict(rate_tps=hi, shares=even,
                                  changes=[RackChange(t_us, shares=tuple([0.6 / 4] * 4
                                                                     + [0.4 / 8] * 8))]),
        "(b) rate increase": dict(rate_tps=lo, shares=even,
                                  changes=[RackChange(t_us, rate_tps=hi),
                                           RackChange(t_us, shares=tuple([hi / 12 * 2 - lo / 12]
                                                                     * 4 + [lo / 12] * 8))]),
        "(c) fast servers slow down": dict(rate_tps=hi, shares=even,
                                           changes=[RackChange(t_us, server=s, speed=0.5)
                                                    for s in TYPES["fast"]]),
    }


def bins(t_us, y, ms):
    b = (t_us // (ms * 1000)).astype(int)
    nb = b.max() + 1
    return (np.arange(nb) + 0.5) * ms, np.bincount(b, y, nb) / np.maximum(
        np.bincount(b, None, nb), 1)


def reconverge_ms(tm, spread, t_change_ms, hold_ms=50, ref=None, factor=1.5):
    """Time from the change until the 5 ms moving average of the spread is back within
    ``factor`` (+1 µs) of its pre-change mean (or of ``ref``) and stays there for
    ``hold_ms``; inf if never."""
    before = spread[(tm < t_change_ms) & (tm > t_change_ms / 2)]
    if not len(before):
        return float("nan")
    thr = factor * (before.mean() if ref is None else ref) + 1.0
    ma = np.convolve(spread, np.ones(5) / 5, mode="same")
    ok = ma <= thr
    for i in np.nonzero(tm > t_change_ms)[0]:
        win = (tm >= tm[i]) & (tm < tm[i] + hold_ms)
        if tm[i] + hold_ms <= tm[-1] and ok[win].all():
            return float(tm[i] - t_change_ms)
    return float("inf")


def type_loads(r, duration_ms):
    """A run's mean load per server type in 1 ms bins up to ``duration_ms``, and their
    spread (the largest type's mean minus the smallest's): (bin centres, {type: loads},
    spread)."""
    t = r.loads["t_us"]
    L = r.loads.get("true_load_us", r.loads["load_us"])
    keep = t <= duration_ms * 1000
    t, L = t[keep], L[keep]
    per = {}
    for ty, idx in TYPES.items():
        tm, per[ty] = bins(t, L[:, idx].mean(axis=1), 1)
    stack = np.vstack(list(per.values()))
    return tm, per, stack.max(axis=0) - stack.min(axis=0)


def settle_times(tm, spread, t_change_ms, duration_ms):
    """Re-converge (1.5x of the spread before the change), settle (1.5x of the own new
    level: the mean of the run's last quarter) and settle within 1.2x, in ms."""
    last = spread[tm > duration_ms - (duration_ms - t_change_ms) / 4]
    ref = float(last.mean())
    return (reconverge_ms(tm, spread, t_change_ms),
            reconverge_ms(tm, spread, t_change_ms, ref=ref),
            reconverge_ms(tm, spread, t_change_ms, ref=ref, factor=1.2))


def run_case(sc, name, pol, seed, rate_mult, duration_ms):
    """One scenario's run for one policy and seed (arrivals for about ``duration_ms``)."""
    # tasks from the average rate over the run, so arrivals last about `duration`
    rate = sc["rate_tps"] if "rate" not in name else 450e3 * rate_mult
    tasks = int(rate * duration_ms / 1000)
    return simulate(rack=RACK, policy=pol, workload="exp:50", tasks=tasks, seed=seed,
                    warmup=0.0, record_loads=True, **sc)


def created_ms(n, rate0, rate1, t_change_ms):
    """Estimated creation time (ms) of the first ``n`` tasks: Poisson arrivals at ``rate0``
    tasks/s until the change and ``rate1`` after it, so the i-th comes at i / rate on
    average."""
    i = np.arange(n, dtype=float)
    n0 = rate0 * t_change_ms / 1000.0
    return np.where(i < n0, i / rate0 * 1000.0, t_change_ms + (i - n0) / rate1 * 1000.0)


def p99_around(lat, cm, t_change_ms, end_ms, bin_ms=10.0):
    """p99 (µs) of the tasks created in the 50 ms before and after the change, the largest
    p99 of a ``bin_ms`` bin after it and before it (bins of fewer than 100 tasks left out),
    and the p99 of the tasks created in the run's last quarter (the level after the change).
    The peak before is the baseline for a spike: a 10 ms bin's p99 is noisier than a 50 ms
    one's, so the peak after is compared with it, not with the run's p99."""
    def q(sel):
        return float(np.quantile(lat[sel], 0.99)) if np.count_nonzero(sel) >= 100 \
            else float("nan")

    def peak(t0, t1):
        ps = [q((cm >= t) & (cm < t + bin_ms)) for t in np.arange(t0, t1 - bin_ms / 2, bin_ms)]
        ps = [p for p in ps if p == p]
        return max(ps) if ps else float("nan")
    before = q((cm >= t_change_ms - 50) & (cm < t_change_ms))
    after = q((cm >= t_change_ms) & (cm < t_change_ms + 50))
    late = q(cm >= end_ms - (end_ms - t_change_ms) / 4)
    return before, after, peak(t_change_ms, end_ms), peak(0.0, t_change_ms), late


def main():
    ap = parser(__doc__, tasks=None, name="fig7_9", examples="""
        python3 bench/figures/fig7_9.py --quick --rate-mult 1.6 --seed 2
        python3 bench/figures/fig7_9.py --t-change 300ms --duration 600ms --policy malcolm""")
    ap.add_argument("--t-change", type=g.duration("ms"), default=500.0, metavar="DURATION",
                    help="time of the change (bare number: ms; default 500ms)")
    ap.add_argument("--duration", type=g.duration("ms", positive=True), default=1000.0,
                    metavar="DURATION",
                    help="time of arrivals (bare number: ms; default 1s)")
    ap.add_argument("--rate-mult", type=float, default=1.0,
                    help="scale the thesis rates (540/360 KTPS = 37.5%%/25%% of capacity)")
    ap.add_argument("--policy", action="append", default=None,
                    help="policies (repeatable; default malcolm, malcolm:learn=0, jsq, jbt)")
    a = parse(ap)
    pols = a.policy or ["malcolm", "malcolm:learn=0", "jsq", "jbt"]
    if a.quick:
        a.t_change, a.duration = 200.0, 400.0
    rows, recon, curves = [], [], {}
    for name, sc in scenarios(a.t_change * 1000, a.rate_mult).items():
        for pol in pols:
            r = run_case(sc, name, pol, a.seed, a.rate_mult, a.duration)
            tm, per, spread = type_loads(r, a.duration)
            rc, st, st12 = settle_times(tm, spread, a.t_change, a.duration)
            # the arrival rate after the change: the scenario's own, where it sets one
            rate1 = next((c.rate_tps for c in sc["changes"] if c.rate_tps), sc["rate_tps"])
            cm = created_ms(len(r.latencies_us), sc["rate_tps"], rate1, a.t_change)
            p99_b, p99_a, p99_pk, p99_pkb, p99_late = p99_around(r.latencies_us, cm,
                                                                  a.t_change, a.duration)
            recon.append(dict(scenario=name, policy=pol, reconverge_ms=rc, settle_ms=st,
                              settle_1_2x_ms=st12,
                              spread_before_us=float(spread[tm < a.t_change].mean()),
                              spread_after_us=float(spread[tm > a.t_change + 50].mean()),
                              peak_spread_after_us=float(spread[tm > a.t_change].max()),
                              p99_us=r.p99_us, p99_before50_us=p99_b,
                              p99_after50_us=p99_a, peak_p99_10ms_after_us=p99_pk,
                              peak_p99_10ms_before_us=p99_pkb, p99_last_quarter_us=p99_late))
            curves[(name, pol)] = (tm, per)
            for i in range(len(tm)):
                rows.append(dict(scenario=name, policy=pol, t_ms=tm[i],
                                 **{f"{k}_load_us": v[i] for k, v in per.items()}))
            print(f"{name:>28} {pol:>8}: re-converged after {rc:.0f} ms, settled at its new "
                  f"level after {st:.0f} ms ({st12:.0f} ms within 1.2x); p99 {r.p99_us:.0f} µs "
                  f"(50 ms before / after the change {p99_b:.0f} / {p99_a:.0f}, "
                  f"peak 10 ms before / after {p99_pkb:.0f} / {p99_pk:.0f}, "
                  f"last quarter {p99_late:.0f})",
                  file=sys.stderr)
    os.makedirs(a.outdir, exist_ok=True)
    for fname, data in (("fig7_9.csv", rows), ("fig7_9_reconverge.csv", recon)):
        write_rows_csv(os.path.join(a.outdir, fname), data)
    write_json(a, rack=RACK, reconverge=recon, rows=rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(scenarios(0))
    fig, axes = plt.subplots(len(pols), len(names), figsize=(5 * len(names), 2.8 * len(pols)),
                             squeeze=False, sharex=True)
    for i, pol in enumerate(pols):
        for j, name in enumerate(names):
            ax = axes[i][j]
            tm, per = curves[(name, pol)]
            for ty, y in per.items():
                ax.plot(tm, y, lw=1, label=ty)
            ax.axvline(a.t_change, color="k", lw=0.8, ls="--")
            ax.set_yscale("symlog", linthresh=10)
            ax.set_title(f"{pol}: {name}", fontsize=9)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("load (µs)")
            if i == len(pols) - 1:
                ax.set_xlabel("time (ms)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Fig 7.9: adaptivity, rack {RACK}, Exp(50), rates x{a.rate_mult:g} "
                 f"of the thesis's")
    fig.tight_layout()
    fig.savefig(png(a, "fig7_9"), dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
