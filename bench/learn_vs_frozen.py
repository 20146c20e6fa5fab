"""Learnt Malcolm against its own frozen start on six heterogeneous racks, fresh seeds.

Held apart from ``bench/sweep.py`` (other racks, simulation seeds 11-15, 150 000 tasks), so
that a change judged by the sweep can be checked where nobody looked: for each scenario the
median p99 over the seeds of the default Malcolm (plus ``--malcolm`` parameters) and of
``malcolm:learn=0`` (plus the same), their ratio, and the ratio per seed. About 15 s with two
processes on an idle 2-core machine.
"""
import os
import sys
from multiprocessing import Pool

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402

# rack, workload, load, one-way delay (µs)
SCENARIOS = [("1x1,1x8,1x12,1x15", "exp:50", 0.9, 9.0), ("1x9,1x10,1x8", "rocksdb2", 0.87, 7.0),
             ("1x7,1x7,1x1", "bimodal", 0.9, 9.5), ("2x12,6x3", "exp:50", 0.9, 5.0),
             ("1x16,7x2", "rocksdb1", 0.85, 4.0), ("3x10,3x4", "exp:50", 0.6, 5.0)]
SEEDS = (11, 12, 13, 14, 15)
TASKS = 150_000


def _run(job):
    from malcolm.sim import simulate

    i, pol, seed = job
    rack, wl, load, delay = SCENARIOS[i]
    r = simulate(rack=rack, policy=pol, workload=wl, load=load, tasks=TASKS, seed=seed,
                 delay_us=delay, warmup=0.3)
    return i, pol, seed, r.p99_us


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/learn_vs_frozen.py
        python3 bench/learn_vs_frozen.py --malcolm accept_lr=0.003
        python3 bench/learn_vs_frozen.py --json -""")
    ap.add_argument("--malcolm", default="",
                    help="extra parameters for Malcolm and its frozen copy, k=v,...")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    g.add_json(ap, "every scenario's p99s")
    a = ap.parse_args(argv)
    g.json_stdout(a)
    if a.procs < 1:
        ap.error("--procs must be >= 1")
    extra = a.malcolm.strip().strip(",")
    learnt = "malcolm" + (":" + extra if extra else "")
    frozen = "malcolm:learn=0" + ("," + extra if extra else "")
    jobs = [(i, p, s) for i in range(len(SCENARIOS)) for p in (learnt, frozen) for s in SEEDS]
    with Pool(a.procs) as pool:
        res = pool.map(_run, jobs)
    p99 = {}
    for i, pol, seed, v in res:
        p99[(i, pol, seed)] = v
    out = []
    for i, (rack, wl, load, delay) in enumerate(SCENARIOS):
        lv = np.array([p99[(i, learnt, s)] for s in SEEDS])
        fv = np.array([p99[(i, frozen, s)] for s in SEEDS])
        m, f = float(np.median(lv)), float(np.median(fv))
        out.append(dict(rack=rack, workload=wl, load=load, delay_us=delay, p99_learnt_us=m,
                        p99_frozen_us=f, ratio=m / f, per_seed=(lv / fv).round(4).tolist()))
        print(f"{rack:>18} {wl:>8} {load:4.2f} {delay:4.1f} µs: p99 learnt {m:7.1f} "
              f"frozen {f:7.1f}  learnt/frozen {m / f:.4f}  per seed "
              f"{(lv / fv).round(3).tolist()}")
    if a.json:
        g.write_json(a, dict(seeds=list(SEEDS), tasks=TASKS, learnt=learnt, frozen=frozen,
                             scenarios=out))


if __name__ == "__main__":
    main()
