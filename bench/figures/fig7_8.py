"""Thesis Fig 7.8: p99 latency against the load-broadcast interval.

Rack 8x8, Exp(50) at 85% load; heartbeat (and, for Malcolm, distribution-update) interval
from 100 µs to 1 ms, for Malcolm, JBT and JSQ. Malcolm keeps its policy-optimization
interval at 16 windows, so a longer window also means slower learning per second; the first
``--warmup`` fraction of tasks is not measured for any policy.

Writes ``fig7_8.csv`` and ``fig7_8.png``.

    python3 bench/figures/fig7_8.py [--outdir out/figures] [--quick] [--json FILE]
"""

import os
import sys

from common import parse, parser, png, write_json, write_rows_csv

from malcolm import _argparse as g
from malcolm.sim import simulate

POLICIES = [("Malcolm", "malcolm"), ("Malcolm frozen at init", "malcolm:learn=0"), ("JBT", "jbt"),
            ("JSQ", "jsq")]


def main():
    ap = parser(__doc__, tasks=400_000, name="fig7_8", examples="""
        python3 bench/figures/fig7_8.py --load 0.7 --warmup-fraction 0.3""")
    ap.add_argument("--load", type=float, default=0.85,
                    help="load, a fraction of the rack's capacity (default 0.85)")
    ap.add_argument("--warmup-fraction", dest="warmup", type=float, default=0.5,
                    metavar="F", help="fraction of the tasks not measured (default 0.5)")
    g.hidden_alias(ap, "--warmup", "warmup", type=float)
    a = parse(ap)
    windows = [100, 300, 1000] if a.quick else [100, 200, 300, 500, 700, 1000]
    tasks = min(a.tasks, 100_000) if a.quick else a.tasks
    rows = []
    for label, pol in POLICIES:
        for w in windows:
            r = simulate(rack="8x8", policy=pol, workload="exp:50", load=a.load, tasks=tasks,
                         seed=a.seed, window_us=float(w), warmup=a.warmup,
                         window_tasks=0)     # the interval itself, not 5 task times
            rows.append(dict(policy=label, window_us=w, p50_us=r.p50_us, p99_us=r.p99_us,
                             p999_us=r.p999_us, mean_us=r.mean_us,
                             migrations=r.migrations / max(r.generated, 1),
                             steals=r.steals / max(r.generated, 1)))
            print(f"{label:>8} window {w:5d} µs: p99 {r.p99_us:9.1f} µs", file=sys.stderr)
    os.makedirs(a.outdir, exist_ok=True)
    write_rows_csv(os.path.join(a.outdir, "fig7_8.csv"), rows)
    write_json(a, rows=rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, _ in POLICIES:
        pts = [(r["window_us"], r["p99_us"]) for r in rows if r["policy"] == label]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("load-broadcast interval (µs)")
    ax.set_ylabel("p99 latency (µs)")
    ax.set_title(f"Fig 7.8: rack 8x8, Exp(50), {a.load:.0%} load")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png(a, "fig7_8"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
