"""Thesis Fig 3.2: FCFS versus processor sharing for high-dispersion workloads.

One server with 16 workers and a central queue (no network), FCFS or ideal PS (zero
context-switch cost, which favours PS as in the thesis). Workloads: HyperExp-1 = 50% Exp(10)
+ 50% Exp(1000) (``fig3.2a``) and HyperExp-2 = 99.9% Exp(25) + 0.1% Exp(25025)
(``fig3.2b``). Panels: p99 and p99.99 for each.
"""

import os

from common import parse, parser, plot_panels, png, run_grid, write_csv, write_json

RACK = "1x16"


def main():
    ap = parser(__doc__, tasks=1_000_000, name="fig3_2", grid=True,
                examples="python3 bench/figures/fig3_2.py --load 0.5:0.9:0.1 --tasks 100000")
    a = parse(ap)
    loads = [0.5, 0.7, 0.8, 0.9] if a.quick else [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]
    loads = a.load or loads
    tasks = min(a.tasks, 200_000) if a.quick else a.tasks
    points = []
    for wl in ("fig3.2a", "fig3.2b"):
        for ld in loads:
            base = dict(rack=RACK, workload=wl, load=ld, tasks=tasks, seed=a.seed,
                        delay_us=0.0)
            points.append(("FCFS", dict(base, policy="cfcfs")))
            points.append(("PS", dict(base, policy="random", sched="ps", quantum_us=0.0)))
    rows = run_grid(points)
    write_csv(rows, os.path.join(a.outdir, "fig3_2.csv"))
    write_json(a, figure="fig3_2", rows=rows)
    plot_panels(rows, png(a, "fig3_2"),
                [("(a) HyperExp-1 p99", lambda r: r["workload"] == "fig3.2a", "p99_us"),
                 ("(b) HyperExp-1 p99.99", lambda r: r["workload"] == "fig3.2a", "p9999_us"),
                 ("(c) HyperExp-2 p99", lambda r: r["workload"] == "fig3.2b", "p99_us"),
                 ("(d) HyperExp-2 p99.99", lambda r: r["workload"] == "fig3.2b",
                  "p9999_us")],
                title="Fig 3.2: FCFS vs PS, one server with 16 workers")
    for wl in ("fig3.2a", "fig3.2b"):
        for ld in loads:
            f = [r for r in rows if r["workload"] == wl and r["load"] == ld]
            d = {r["series"]: r for r in f}
            print(f"{wl} load {ld:.2f}: p99 FCFS {d['FCFS']['p99_us']:9.1f} PS "
                  f"{d['PS']['p99_us']:9.1f} | p99.99 FCFS {d['FCFS']['p9999_us']:9.1f} "
                  f"PS {d['PS']['p9999_us']:9.1f}")


if __name__ == "__main__":
    main()
