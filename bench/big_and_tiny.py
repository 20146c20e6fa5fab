"""Learnt Malcolm against its frozen start on racks of big servers and one- or two-worker ones.

The family where learning lost to its start in the seventh session's analysis (sweep
scenario 29 is one of it; docs/policy-log.md, "State the agents do not share"): k = 1-4 servers
of 4-16 workers and 1-3 servers of 1-2 workers, Exp(50), Bimodal, HyperExp-2, RocksDB-1 or -2,
load 0.8-0.95, one-way delay 2-10 µs, 4 000 tasks per worker (50 000-150 000), the first 30%
unmeasured. Drawn from ``--draw`` (its own generator: no sweep scenario is drawn on purpose).
For each ``--variants`` policy after the first, the seed-median p99 over the first's (the
frozen start by default), per rack and summed up. Under a minute for 40 racks, 5 seeds and
three variants with two processes on an idle 2-core machine::

    python3 bench/big_and_tiny.py --draw 31337 --count 40 --seeds 1,2,3,4,5
    python3 bench/big_and_tiny.py --variants "malcolm:learn=0;malcolm;malcolm:entropy=1"
"""
import os
import sys
from multiprocessing import Pool

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402

WORKLOADS = ("exp:50", "bimodal", "hyperexp2", "rocksdb1", "rocksdb2")


def draw(count, seed):
    """``count`` racks of the family from ``seed``: dicts of simulate() arguments."""
    rng = np.random.default_rng([seed, 0xB16])
    out = []
    for _ in range(count):
        k, big = int(rng.integers(1, 5)), int(rng.integers(4, 17))
        t, small = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        workers = [big] * k + [small] * t
        out.append(dict(rack=",".join(f"1x{w}" for w in workers),
                        workload=WORKLOADS[int(rng.integers(0, len(WORKLOADS)))],
                        load=float(round(rng.uniform(0.8, 0.95), 3)),
                        delay_us=float(round(rng.uniform(2, 10), 2)),
                        tasks=int(min(150_000, max(50_000, 4000 * sum(workers))))))
    return out


def _run(job):
    from malcolm.sim import simulate

    i, sc, pol, seed = job
    return i, pol, seed, simulate(policy=pol, seed=seed, warmup=0.3, **sc).p99_us


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/big_and_tiny.py
        python3 bench/big_and_tiny.py --draw 4711 --count 30 --seeds 1,2,3""")
    ap.add_argument("--draw", type=int, default=31337, help="the family's seed (31337)")
    ap.add_argument("--count", type=int, default=40, help="racks (default 40)")
    ap.add_argument("--seeds", default="1,2,3,4,5", type=g.numbers(int, "integers"),
                    help="simulation seeds, comma-separated (default 1-5)")
    ap.add_argument("--variants", default="malcolm:learn=0;malcolm",
                    help="policies separated by ';', the first the reference")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    a = ap.parse_args(argv)
    from malcolm.sim import check_policies

    pols = g.checked(ap, "--variants", check_policies, a.variants)
    if a.count < 1 or a.procs < 1 or len(pols) < 2:
        ap.error("--count and --procs must be >= 1, and --variants must name two policies")
    scen = draw(a.count, a.draw)
    jobs = [(i, sc, p, s) for i, sc in enumerate(scen) for p in pols for s in a.seeds]
    with Pool(a.procs) as pool:
        res = {(i, p, s): v for i, p, s, v in pool.map(_run, jobs, chunksize=1)}
    ratios = {p: [] for p in pols[1:]}
    print(f"seed-median p99 of each variant over {pols[0]}'s")
    for i, sc in enumerate(scen):
        med = {p: float(np.median([res[(i, p, s)] for s in a.seeds])) for p in pols}
        row = f"{i:3d} {sc['rack']:>28} {sc['workload']:>9} {sc['load']:.3f} {sc['delay_us']:5.2f}"
        row += f" {med[pols[0]]:8.1f} µs"
        for p in pols[1:]:
            ratios[p].append(med[p] / med[pols[0]])
            row += f" {ratios[p][-1]:.3f}"
        print(row)
    for p, r in ratios.items():
        r = np.array(r)
        print(f"{p}: lower on {int((r < 1).sum())} of {len(r)}, within 0.1% on "
              f"{int((abs(r - 1) <= 0.001).sum())}; geometric mean {np.exp(np.log(r).mean()):.4f},"
              f" range {r.min():.3f}-{r.max():.3f}")


if __name__ == "__main__":
    main()
