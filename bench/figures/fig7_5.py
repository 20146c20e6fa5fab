"""Thesis Fig 7.5: load of the fast and of the slow servers over time.

Rack 2 fast servers x 14 workers + 6 slow x 4, Exp(50) at 85% load, for about a second.
The load of a server is its expected wait (tasks in it / its estimated service rate), as
the simulator records it at every window; the figure shows the mean over the fast and over
the slow servers, smoothed over 10 ms. Malcolm starts from its safe initial policy, so its
curve includes its learning.

Writes ``fig7_5.csv`` (t_ms, policy, fast_load_us, slow_load_us) and ``fig7_5.png``.

    python3 bench/figures/fig7_5.py [--outdir out/figures] [--quick] [--json FILE]
"""

import os
import sys

import numpy as np
from common import parse, parser, png, write_json, write_rows_csv

from malcolm.sim import simulate

RACK = "2x14,6x4"
FAST = [0, 1]
SLOW = list(range(2, 8))
POLICIES = [("Malcolm", "malcolm"), ("Malcolm frozen at init", "malcolm:learn=0"), ("JSQ", "jsq"),
            ("JBT", "jbt"), ("client po2", "po2")]


def smooth(t_us, y, bin_ms):
    b = (t_us // (bin_ms * 1000)).astype(int)
    nb = b.max() + 1
    s = np.bincount(b, y, nb)
    c = np.maximum(np.bincount(b, None, nb), 1)
    return (np.arange(nb) + 0.5) * bin_ms, s / c


def main():
    ap = parser(__doc__, tasks=800_000, name="fig7_5", examples="""
        python3 bench/figures/fig7_5.py --load 0.7 --plot fig7_5-70.png""")
    ap.add_argument("--load", type=float, default=0.85,
                    help="load, a fraction of the rack's capacity (default 0.85)")
    a = parse(ap)
    tasks = min(a.tasks, 150_000) if a.quick else a.tasks
    rows = []
    curves = {}
    for label, pol in POLICIES:
        r = simulate(rack=RACK, policy=pol, workload="exp:50", load=a.load, tasks=tasks,
                     seed=a.seed, warmup=0.0, record_loads=True)
        t = r.loads["t_us"]
        # the true expected wait when the simulator records it, else the servers' estimate
        L = r.loads.get("true_load_us", r.loads["load_us"])
        keep = t <= r.sim_time_s * 1e6
        t, L = t[keep], L[keep]
        tm, fast = smooth(t, L[:, FAST].mean(axis=1), 10)
        _, slow = smooth(t, L[:, SLOW].mean(axis=1), 10)
        curves[label] = (tm, fast, slow)
        for i in range(len(tm)):
            rows.append(dict(t_ms=tm[i], policy=label, fast_load_us=fast[i],
                             slow_load_us=slow[i]))
        half = len(tm) // 2
        print(f"{label:>12}: p99 {r.p99_us:9.1f} µs; 2nd half mean load fast "
              f"{fast[half:].mean():8.1f} µs, slow {slow[half:].mean():8.1f} µs",
              file=sys.stderr)
    os.makedirs(a.outdir, exist_ok=True)
    write_rows_csv(os.path.join(a.outdir, "fig7_5.csv"), rows)
    write_json(a, rack=RACK, rows=rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.4), sharey=True)
    for ax, (label, (tm, fast, slow)) in zip(axes, curves.items(), strict=True):
        ax.plot(tm, fast, label="fast servers (14 workers)")
        ax.plot(tm, slow, label="slow servers (4 workers)")
        ax.set_yscale("symlog", linthresh=10)
        ax.set_title(label)
        ax.set_xlabel("time (ms)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean load = expected wait (µs)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Fig 7.5: load of fast vs slow servers, rack {RACK}, Exp(50), "
                 f"{a.load:.0%} load")
    fig.tight_layout()
    fig.savefig(png(a, "fig7_5"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
