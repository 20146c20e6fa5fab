"""Learnt Malcolm against its own frozen start on six heterogeneous racks, fresh seeds.

Held apart from ``bench/sweep.py`` (other racks, simulation seeds 11-15, 150 000 tasks), so
that a change judged by the sweep can be checked where nobody looked: for each scenario the
median p99 over the seeds of the default Malcolm (plus ``--malcolm`` parameters) and of
``malcolm:learn=0`` (plus the same), their ratio, and the ratio per seed. About 15 s with two
processes on an idle 2-core machine.

``--draw SEED --count K`` replaces the six racks by the first K heterogeneous scenarios that
``bench/sweep.py``'s generator draws from SEED (use a seed the sweep does not: it uses 2026;
its tuning runs 7 and 777), each with its own task count scaled by ``--tasks-mult``;
``--seeds`` sets the simulation seeds. ``--max-servers`` skips larger racks (they are slow).
``--scenario RACK/WORKLOAD/LOAD/DELAY`` (repeatable) runs the racks given instead, each with
``--tasks`` tasks. ``--window`` sets every server's policy window (default 100 µs, the
runtime's, which shortens on tasks under 20 µs; another is fixed) and ``--phase`` the
windows' phases (default random, as servers started one by one have; ``aligned``: every
server's window ends at the same instant).
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

    sc, i, pol, seed, window, phase = job
    rack, wl, load, delay, tasks = sc
    # another --window than the default is fixed (a study of the interval; bench/sweep.py)
    r = simulate(rack=rack, policy=pol, workload=wl, load=load, tasks=tasks, seed=seed,
                 delay_us=delay, warmup=0.3, window_us=window, phase=phase,
                 **({} if window == g.SIM_WINDOW_US else {"window_tasks": 0}))
    return i, pol, seed, r.p99_us


def drawn(seed, count, max_servers, tasks_mult):
    """The first ``count`` heterogeneous scenarios of ``bench/sweep.py``'s generator."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sweep import draw_scenarios

    out = []
    for sc in draw_scenarios(100 * count, seed):
        if sc["skew"] > 1 and sc["n"] <= max_servers:
            out.append((sc["rack"], sc["workload"], sc["load"], sc["delay_us"],
                        int(sc["tasks"] * tasks_mult)))
        if len(out) == count:
            break
    return out


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/learn_vs_frozen.py
        python3 bench/learn_vs_frozen.py --malcolm accept_lr=0.003
        python3 bench/learn_vs_frozen.py --json -
        python3 bench/learn_vs_frozen.py --scenario 1x15,1x3/hyperexp2/0.95/4.7 --seeds 1,2,3""")
    ap.add_argument("--malcolm", default="",
                    help="extra parameters for Malcolm and its frozen copy, k=v,...")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), type=g.numbers(int, "integers"),
                    help="simulation seeds, comma-separated (default 11-15)")
    ap.add_argument("--draw", type=int, default=None, metavar="SEED",
                    help="draw heterogeneous scenarios from SEED instead of the six racks")
    ap.add_argument("--count", type=int, default=8, help="scenarios to draw (default 8)")
    ap.add_argument("--max-servers", type=int, default=16, help="largest rack drawn")
    ap.add_argument("--tasks-mult", type=float, default=1.0, help="scale drawn task counts")
    ap.add_argument("--room", action="store_true",
                    help="also run JSQ, JBT, po2 and the ideal cFCFS: the room the frozen "
                         "start leaves (its p99 over the best of them, and over cFCFS)")
    ap.add_argument("--scenario", action="append", default=[], metavar="RACK/WORKLOAD/LOAD/DELAY",
                    help="a rack to run instead of the six (repeatable), e.g. "
                         "1x12,1x4/hyperexp2/0.95/4.7 (delay in µs)")
    ap.add_argument("--tasks", type=int, default=TASKS,
                    help=f"tasks per run of the six racks or --scenario (default {TASKS})")
    g.add_window_phase(ap)
    g.add_json(ap, "every scenario's p99s")
    a = ap.parse_args(argv)
    g.json_stdout(a)
    if a.procs < 1:
        ap.error("--procs must be >= 1")
    seeds = tuple(a.seeds)
    if a.count < 1 or a.max_servers < 2 or not a.tasks_mult > 0:
        ap.error("--count must be >= 1, --max-servers >= 2 and --tasks-mult > 0")
    if a.tasks < 1000:
        ap.error("--tasks must be >= 1000")
    if a.scenario and a.draw is not None:
        ap.error("--scenario and --draw exclude each other")
    if a.scenario:
        scen = []
        for text in a.scenario:
            parts = text.split("/")
            try:
                rack, wl, load, delay = parts
                scen.append((rack, wl, float(load), float(delay), a.tasks))
            except ValueError:
                ap.error(f"--scenario {text!r}: expected RACK/WORKLOAD/LOAD/DELAY, "
                         "e.g. 1x12,1x4/hyperexp2/0.95/4.7")
    elif a.draw is None:
        scen = [(*sc, a.tasks) for sc in SCENARIOS]
    else:
        scen = drawn(a.draw, a.count, a.max_servers, a.tasks_mult)
    extra = a.malcolm.strip().strip(",")
    learnt = "malcolm" + (":" + extra if extra else "")
    frozen = "malcolm:learn=0" + ("," + extra if extra else "")
    others = ("jsq", "jbt", "po2", "cfcfs") if a.room else ()
    jobs = [(sc, i, p, s, a.window, a.phase) for i, sc in enumerate(scen)
            for p in (learnt, frozen, *others) for s in seeds]
    with Pool(a.procs) as pool:
        res = pool.map(_run, jobs)
    p99 = {}
    for i, pol, seed, v in res:
        p99[(i, pol, seed)] = v
    out = []
    for i, (rack, wl, load, delay, _) in enumerate(scen):
        lv = np.array([p99[(i, learnt, s)] for s in seeds])
        fv = np.array([p99[(i, frozen, s)] for s in seeds])
        m, f = float(np.median(lv)), float(np.median(fv))
        row = dict(rack=rack, workload=wl, load=load, delay_us=delay, p99_learnt_us=m,
                   p99_frozen_us=f, ratio=m / f, per_seed=(lv / fv).round(4).tolist())
        room = ""
        if a.room:
            med = {o: float(np.median([p99[(i, o, s)] for s in seeds])) for o in others}
            best = min(med[o] for o in ("jsq", "jbt", "po2"))
            row.update({f"p99_{o}_us": v for o, v in med.items()})
            room = f"  best-base/frozen {best / f:.3f} cfcfs/frozen {med['cfcfs'] / f:.3f}"
        out.append(row)
        print(f"{rack[:40]:>40} {wl:>9} {load:4.2f} {delay:4.1f} µs: p99 learnt {m:7.1f} "
              f"frozen {f:7.1f}  learnt/frozen {m / f:.4f}  per seed "
              f"{(lv / fv).round(3).tolist()}{room}")
    r = np.array([o["ratio"] for o in out])
    print(f"learnt lower in {int((r < 1).sum())} of {len(r)}, equal within 0.1% in "
          f"{int((abs(r - 1) <= 0.001).sum())}; learnt/frozen {r.min():.3f} to {r.max():.3f}, "
          f"median {np.median(r):.4f}")
    if a.json:
        g.write_json(a, dict(seeds=list(seeds), draw=a.draw, learnt=learnt, frozen=frozen,
                             window_us=a.window, phase=a.phase, scenarios=out))


if __name__ == "__main__":
    main()
