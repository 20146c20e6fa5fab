"""Learnt Malcolm against its frozen start on six heterogeneous scenarios, fresh seeds.

Held apart from bench/sweep.py (other racks, simulation seeds 11-15, 150 000 tasks): the
median p99 over the seeds of the default and of ``malcolm:learn=0``, their ratio, and the
ratio per seed. An optional argument adds parameters to the learnt policy, ``k=v,...``::

    python3 bench/learn_vs_frozen.py
    python3 bench/learn_vs_frozen.py accept_lr=0.003
"""
import os
import sys
from multiprocessing import Pool

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm.sim import simulate  # noqa: E402

SCEN = [("1x1,1x8,1x12,1x15", "exp:50", 0.9, 9.0), ("1x9,1x10,1x8", "rocksdb2", 0.87, 7.0),
        ("1x7,1x7,1x1", "bimodal", 0.9, 9.5), ("2x12,6x3", "exp:50", 0.9, 5.0),
        ("1x16,7x2", "rocksdb1", 0.85, 4.0), ("3x10,3x4", "exp:50", 0.6, 5.0)]
EXTRA = sys.argv[1] if len(sys.argv) > 1 else ""
SEEDS = (11, 12, 13, 14, 15)


def run(job):
    i, pol, seed = job
    rack, wl, load, d = SCEN[i]
    r = simulate(rack=rack, policy=pol, workload=wl, load=load, tasks=150000, seed=seed,
                 delay_us=d, warmup=0.3)
    return i, pol, seed, r.p99_us


if __name__ == "__main__":
    pols = ["malcolm" + (":" + EXTRA if EXTRA else ""), "malcolm:learn=0"]
    jobs = [(i, p, s) for i in range(len(SCEN)) for p in pols for s in SEEDS]
    with Pool(2) as pool:
        res = pool.map(run, jobs)
    d = {}
    for i, p, _seed, v in res:
        d.setdefault((i, p), []).append(v)
    for i in range(len(SCEN)):
        m = np.median(d[(i, pols[0])])
        f = np.median(d[(i, pols[1])])
        ratios = np.array(d[(i, pols[0])]) / np.array(d[(i, pols[1])])
        print(SCEN[i], f"p99 learnt {m:.1f} frozen {f:.1f}", f"learnt/frozen median {m / f:.4f}",
              "per seed", np.round(ratios, 3).tolist())
