"""Tiny racks: Malcolm variants against JSQ, JBT and po2 on small racks of small servers.

Draws ``--scenarios`` racks from ``--seed``, one family at a time:

* ``homogeneous`` (the default): 2-8 servers of 1 or 2 workers each, all alike, every sweep
  workload, loads 0.5-0.95, one-way delays 2-10 µs; the issue's ranges, but the corner of
  them that ``bench/sweep.py`` rarely draws;
* ``small-among-big``: one 1- or 2-worker server among 3-15-worker ones, the same draws;
* ``regular``: 4-32 servers of 1-4 workers, all alike, under regular or low-variance
  service (constant 10 or 30 µs, uniform 20-60 µs, RocksDB-1/2, fig2.1a/b; Exp(50) and
  HyperExp-1 as controls), loads 0.6-0.95, one-way delays 2-10 µs: where a steal that two
  hops justify costs the thief a whole task (docs/policy.md, item 16);
* ``short``: 2-8 servers of 1-4 workers, all alike, under 5-10 µs tasks (constant or
  exponential), loads 0.6-0.95, one-way delays 1-5 µs: a 100 µs window is 10-20 task times
  there ("Open problems", short tasks);
* ``saturated``: 2-4 servers of 2-16 workers, all alike, every sweep workload, loads
  0.95-0.99 (above the issue's), one-way delays 2-10 µs: where the actors' biases drift
  from the start (docs/policy.md, "Open problems", small homogeneous racks);
* ``heavy``: 2-4 servers of 1 or 2 workers at speeds drawn log-uniformly from 0.5-2, under
  HyperExp-2, loads 0.85-0.95, one-way delays 2-10 µs: where learning trades the p99 for
  the mean (docs/policy.md, "Open problems", heavy tails near saturation).

Each ``--policies`` entry runs ``--seeds`` simulation seeds; JSQ, JBT and po2 run
``--base-seeds`` (seed 1 by default; near saturation one seed's p99 moves by 2x, so give them
the policies' seeds there).
Prints, per policy: the fraction of racks where its seed-median p99 is within 5% of the
best baseline or below it, its worst ratio to the best baseline, and its geometric-mean p99
against the first policy: of the seed medians, and paired (each seed's p99 over the first
policy's with the same seed, whose arrivals and service times are the same: near
saturation the seed-median of three moves by more than the policies differ).
docs/policy-log.md, "Tiny racks: the shed rule and idle-only steals"::

    python3 bench/tiny_racks.py
    python3 bench/tiny_racks.py --family small-among-big --scenarios 60 --seed 11
    python3 bench/tiny_racks.py --family regular --scenarios 24 --seed 61206 \
        --policies "malcolm;malcolm:grant_tasks=0"
    python3 bench/tiny_racks.py --family saturated --scenarios 16 --seed 1207994 \
        --tasks-mult 3 --base-seeds 1,2,3 --policies "malcolm;malcolm:learn=0"
    python3 bench/tiny_racks.py --family heavy --scenarios 16 --seed 1208301 \
        --seeds 1,2,3,4,5,6,7,8,9,10 --policies "malcolm:learn=0;malcolm"
"""
import os
import sys
from multiprocessing import Pool

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402

WORKLOADS = ("bimodal", "hyperexp2", "hyperexp1", "exp:50", "rocksdb1", "rocksdb2")
REGULAR = ("mix:1:const:30", "mix:1:const:10", "mix:1:uniform:20:60", "rocksdb1", "rocksdb2",
           "fig2.1a", "fig2.1b", "exp:50", "hyperexp1")
SHORT = ("mix:1:const:5", "mix:1:const:10", "exp:5", "exp:10")
FAMILIES = ("homogeneous", "small-among-big", "regular", "short", "saturated", "heavy")
BASES = ("jsq", "jbt", "po2")
POLICIES = ("malcolm;malcolm:shed=1,steal_idle=1;malcolm:learn=0;"
            "malcolm:learn=0,shed=1,steal_idle=1")


def draw(family, count, seed):
    """``count`` scenarios: (rack, workload, load, one-way delay in µs)."""
    rng = np.random.default_rng([seed, 0x7151])
    out = []
    if family in ("regular", "short"):
        # racks, workloads, loads and delays of their own ranges (module docstring)
        sizes, wls, delays = (((4, 6, 8, 12, 16, 24, 32), REGULAR, (2.0, 10.0))
                              if family == "regular" else ((2, 3, 4, 6, 8), SHORT, (1.0, 5.0)))
        for _ in range(count):
            n, c = int(rng.choice(sizes)), int(rng.integers(1, 5))
            out.append((f"{n}x{c}", str(rng.choice(wls)), round(float(rng.uniform(0.6, 0.95)), 3),
                        round(float(rng.uniform(*delays)), 2)))
        return out
    if family == "saturated":
        for _ in range(count):
            n, c = int(rng.integers(2, 5)), int(rng.integers(2, 17))
            out.append((f"{n}x{c}", str(rng.choice(WORKLOADS)),
                        round(float(rng.uniform(0.95, 0.99)), 3),
                        round(float(rng.uniform(2.0, 10.0)), 2)))
        return out
    if family == "heavy":
        for _ in range(count):
            n = int(rng.integers(2, 5))
            out.append((",".join(f"1x{int(rng.choice([1, 1, 2]))}@{2.0 ** rng.uniform(-1, 1):.2f}"
                                 for _ in range(n)), "hyperexp2",
                        round(float(rng.uniform(0.85, 0.95)), 3),
                        round(float(rng.uniform(2.0, 10.0)), 2)))
        return out
    for _ in range(count):
        if family == "homogeneous":
            n = int(rng.choice([2, 3, 4, 6, 8]))
            workers = [int(rng.choice([1, 2]))] * n
        else:
            n = int(rng.integers(2, 6))
            workers = [int(rng.integers(1, 3))] + [int(rng.integers(3, 16))
                                                   for _ in range(n - 1)]
        out.append((",".join(f"1x{w}" for w in workers), str(rng.choice(WORKLOADS)),
                    round(float(rng.uniform(0.5, 0.95)), 3),
                    round(float(rng.uniform(2.0, 10.0)), 2)))
    return out


def _run(job):
    from malcolm.sim import simulate

    (rack, wl, load, delay), pol, seed, mult = job
    workers = sum(int(s.split("x")[0]) * int(s.split("x")[1].split("@")[0])
                  for s in rack.split(","))
    tasks = int(mult * max(40_000, 1500 * workers) * (3 if wl == "hyperexp2" else 1))
    r = simulate(rack=rack, policy=pol, workload=wl, load=load, tasks=tasks, seed=seed,
                 delay_us=delay, warmup=0.3)
    return job[:3], r.p99_us


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/tiny_racks.py --tasks-mult 3
        python3 bench/tiny_racks.py --policies "malcolm;malcolm:shed=0,steal_idle=1" """)
    ap.add_argument("--family", choices=FAMILIES,
                    default="homogeneous", help="which racks to draw (default homogeneous)")
    ap.add_argument("--scenarios", type=int, default=40, help="racks drawn (default 40)")
    ap.add_argument("--seed", type=int, default=5, help="draws the racks (default 5)")
    ap.add_argument("--seeds", default="1,2,3", type=g.numbers(int, "integers"),
                    help="simulation seeds of the --policies (default 1,2,3)")
    ap.add_argument("--base-seeds", default="1", type=g.numbers(int, "integers"),
                    help="simulation seeds of JSQ, JBT and po2 (default 1)")
    ap.add_argument("--policies", default=POLICIES,
                    help="';'-separated; the first is the reference of the geometric mean")
    ap.add_argument("--tasks-mult", type=float, default=1.0, help="scale every task count")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    a = ap.parse_args(argv)
    from malcolm.sim import check_policies

    pols = g.checked(ap, "--policies", check_policies, a.policies)
    if a.scenarios < 1 or a.procs < 1 or not pols or not a.tasks_mult > 0:
        ap.error("--scenarios and --procs must be >= 1, --policies non-empty, "
                 "--tasks-mult > 0")
    scen = draw(a.family, a.scenarios, a.seed)
    jobs = ([(sc, p, s, a.tasks_mult) for sc in scen for p in pols for s in a.seeds]
            + [(sc, b, s, a.tasks_mult) for sc in scen for b in BASES for s in a.base_seeds])
    try:
        with Pool(a.procs) as pool:
            res = pool.map(_run, jobs)
    except ValueError as exc:             # a spec that builds but fails on a rack: one line
        sys.exit(f"tiny_racks: {exc}")
    p99 = {}
    for key, v in res:
        p99.setdefault(key[:2], []).append(v)
    med = {k: float(np.median(v)) for k, v in p99.items()}
    for sc in scen:
        best = min(med[(sc, b)] for b in BASES)
        row = " ".join(f"{med[(sc, p)] / best:6.3f}" for p in pols)
        print(f"{sc[0]:>24} {sc[1]:>9} {sc[2]:.3f} {sc[3]:5.2f} µs  best baseline "
              f"{best:9.1f} µs  / best: {row}")
    for p in pols:
        vs = np.array([med[(sc, p)] / min(med[(sc, b)] for b in BASES) for sc in scen])
        ref = np.array([med[(sc, p)] / med[(sc, pols[0])] for sc in scen])
        # paired: the same seed's runs share their arrivals and service times
        pr = np.array([np.exp(np.log(np.array(p99[(sc, p)]) / np.array(p99[(sc, pols[0])])).mean())
                       for sc in scen])
        print(f"{p:>40}: within 5% of the best baseline {np.mean(vs <= 1.05):4.0%}, worst "
              f"{vs.max():.3f}; p99 / {pols[0]} geometric mean {np.exp(np.log(ref).mean()):.4f}"
              f", paired {np.exp(np.log(pr).mean()):.4f} ({pr.min():.3f}-{pr.max():.3f})")


if __name__ == "__main__":
    main()
