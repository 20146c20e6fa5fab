"""Thesis Fig 2.3: centralized FCFS with network delay.

The central scheduler sits on the path of every task (in the switch). A task reaches its
worker one one-way delay after being dispatched; a worker's "I am idle" notice takes one
one-way delay back, so a busy worker idles for one RTT between tasks. Same rack and
workloads as Fig 2.1. Series are RTTs (2 x one-way delay).
"""

import os

from common import parse, parser, plot_panels, png, run_grid, summary, write_csv, write_json

RACK = "2x16,14x2"


def main():
    ap = parser(__doc__, tasks=200_000, name="fig2_3", grid=True,
                examples="python3 bench/figures/fig2_3.py --load 0.5:0.9:0.1 --tasks 100000")
    a = parse(ap)
    loads = [0.3, 0.5, 0.6, 0.7, 0.8, 0.9] if a.quick else \
        [0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    loads = a.load or loads
    tasks = min(a.tasks, 50_000) if a.quick else a.tasks
    rtts = (0, 2, 4, 8, 16)
    points = [(f"RTT {rtt} µs", dict(rack=RACK, policy=f"cfcfs:delay={rtt / 2}", workload=wl,
                                     load=ld, tasks=tasks, seed=a.seed))
              for wl in ("fig2.1a", "fig2.1b") for rtt in rtts for ld in loads]
    rows = run_grid(points)
    write_csv(rows, os.path.join(a.outdir, "fig2_3.csv"))
    write_json(a, figure="fig2_3", rows=rows)
    plot_panels(rows, png(a, "fig2_3"),
                [("(a) Exp(20)", lambda r: r["workload"] == "fig2.1a", None),
                 ("(b) 95% Exp(20), 5% Exp(400)", lambda r: r["workload"] == "fig2.1b", None)],
                title="Fig 2.3: cFCFS with network delay, rack 2x16 + 14x2")
    summary(rows)


if __name__ == "__main__":
    main()
