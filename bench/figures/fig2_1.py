"""Thesis Fig 2.1: power-of-d versus ideal cFCFS on a heterogeneous rack.

Rack 2x16 + 14x2 (two fast servers with 16 workers, fourteen slow ones with 2), FCFS inside
servers, zero network delay; workloads Exp(20) (``fig2.1a``) and 95% Exp(20) + 5% Exp(400)
(``fig2.1b``). Power-of-d is the ideal centralized version (true queue lengths, no delay):
``racksched:sched=fcfs,d=D``. The thesis finds power-of-2 unstable by about 65% load.
"""

import os

from common import parse, parser, plot_panels, png, run_grid, summary, write_csv, write_json

RACK = "2x16,14x2"


def main():
    ap = parser(__doc__, tasks=200_000, name="fig2_1", grid=True,
                examples="python3 bench/figures/fig2_1.py --load 0.5:0.9:0.1 --tasks 100000")
    a = parse(ap)
    loads = [0.3, 0.5, 0.6, 0.65, 0.7, 0.8, 0.9] if a.quick else \
        [0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    loads = a.load or loads
    tasks = min(a.tasks, 50_000) if a.quick else a.tasks
    series = [("cFCFS", "cfcfs")] + [(f"power-of-{d}", f"racksched:sched=fcfs,d={d}")
                                     for d in (2, 4, 8)]
    points = [(label, dict(rack=RACK, policy=pol, workload=wl, load=ld, tasks=tasks,
                           seed=a.seed, delay_us=0.0))
              for wl in ("fig2.1a", "fig2.1b") for label, pol in series for ld in loads]
    rows = run_grid(points)
    write_csv(rows, os.path.join(a.outdir, "fig2_1.csv"))
    write_json(a, figure="fig2_1", rows=rows)
    plot_panels(rows, png(a, "fig2_1"),
                [("(a) Exp(20)", lambda r: r["workload"] == "fig2.1a", None),
                 ("(b) 95% Exp(20), 5% Exp(400)", lambda r: r["workload"] == "fig2.1b", None)],
                title="Fig 2.1: power-of-d vs cFCFS, rack 2x16 + 14x2")
    summary(rows)


if __name__ == "__main__":
    main()
