"""Thesis Figs 7.3 and 7.4, simulator side: p99 against load for the RocksDB GET(n) service.

Fig 7.3: homogeneous rack, 8 servers x 8 workers. Fig 7.4: heterogeneous rack, 2 x 14 + 9 x 4
workers. Workloads: ``rocksdb1-measured`` (90% GET(16), 10% GET(64)) and ``rocksdb2-measured``
(50/50), whose service times are the empirical distributions measured on this project's real
``rocksdb`` handler (``malcolm rocksdb calibrate``; ``malcolm.workloads``, docs/rocksdb.md).
Policies: Malcolm with its defaults (docs/policy.md: capacity-share start, guards, hop gate,
``load_scale`` from the measured service rates), Malcolm frozen at that start (the control),
JSQ and JBT (heartbeats every window), client power-of-2, and the ideal cFCFS as the
reference. Same simulator settings as Figs 7.1/7.2 (2 µs one-way
delay, 100 µs window, first ``--warmup`` of the tasks not measured).

Writes ``fig7_3.{csv,png}`` and ``fig7_4.{csv,png}``.

    python3 bench/figures/fig7_3_4.py [--outdir out/figures] [--quick] [--servers homo|hetero|SPEC]
"""

import os

from common import parse, parser, plot_panels, racks, run_grid, write_json, write_rows_csv

from malcolm import _argparse as g

WORKLOADS = ("rocksdb1-measured", "rocksdb2-measured")


def policies(wl):
    # The default Malcolm, as `malcolm sim` runs it: no parameter of the workload is passed in
    # (the policy derives its scale from the service rates it measures).
    return [("Malcolm", "malcolm"), ("Malcolm frozen", "malcolm:learn=0"), ("JSQ", "jsq"),
            ("JBT", "jbt"), ("client po2", "po2"), ("cFCFS (ideal)", "cfcfs")]


def main():
    ap = parser(__doc__, tasks=400_000, name="fig7_3_4", plot=False, grid=True, examples="""
        python3 bench/figures/fig7_3_4.py --servers hetero --seed 2""")
    ap.add_argument("--servers", action="append", type=g.servers, default=None,
                    metavar="SPEC", help="the rack: homo (8x8, Fig 7.3), hetero (2x14,9x4, "
                                         "Fig 7.4) or a spec; repeatable (default: both)")
    ap.add_argument("--warmup-fraction", dest="warmup", type=float, default=0.5,
                    metavar="F", help="fraction of the tasks not measured (default 0.5)")
    g.hidden_alias(ap, "--rack", "rack_old", choices=("homo", "hetero", "both"))
    g.hidden_alias(ap, "--warmup", "warmup", type=float)
    a = parse(ap)
    loads = [0.6, 0.8, 0.9] if a.quick else [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]
    loads = a.load or loads
    tasks = min(a.tasks, 100_000) if a.quick else a.tasks
    os.makedirs(a.outdir, exist_ok=True)
    runs = []
    for name, rack, title in racks(a, ("fig7_3", "fig7_4")):
        points = [(label, dict(rack=rack, policy=pol, workload=wl, load=ld, tasks=tasks,
                               seed=a.seed, warmup=a.warmup))
                  for wl in WORKLOADS for label, pol in policies(wl) for ld in loads]
        rows = run_grid(points)
        write_rows_csv(os.path.join(a.outdir, f"{name}.csv"), rows, rack=rack)
        runs.append(dict(figure=name, rack=rack, rows=rows))
        panels = [(wl, lambda r, wl=wl: r["workload"] == wl, None) for wl in WORKLOADS]
        plot_panels(rows, os.path.join(a.outdir, f"{name}.png"), panels,
                    title=f"{name.replace('fig', 'Fig ').replace('_', '.')} (simulator): p99 vs "
                          f"load, {title}, measured RocksDB service times ({tasks} tasks/point)")
    write_json(a, runs=runs)

if __name__ == "__main__":
    main()
