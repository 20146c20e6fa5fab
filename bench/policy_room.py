"""Is there a better fixed policy than Malcolm's frozen start? Hand-set variants, no learning.

Learning can only beat its frozen start (``malcolm:learn=0``) if some policy the actors can
represent does. This runs the frozen start with parameters set by hand, on heterogeneous
scenarios drawn as ``bench/learn_vs_frozen.py --draw`` draws them, and prints each variant's
seed-median p99 over the start's. Variants (``+`` combines them):

* ``tilt:B``: every migrate bias += B log(workers_j / mean workers) (a state-independent
  split other than the capacity shares: B > 0 favours big servers);
* ``tgt:C``: W_jj = -C for the peers (prefer targets whose load is below the rack's mean: a
  soft join-the-shortest-queue on the actors' inputs);
* ``acc:C``: W_me,me = -C (accept less while the own load is above the mean);
* ``stl:B``: the no-steal bias += B (B < 0: steal more);
* ``sw:C``: steal weights W_jj = +C (steal from the busiest peer).

    python3 bench/policy_room.py --draw 4242 --count 8 --seeds 21,22,23 --tasks-mult 0.5 \\
        --variants tilt:-0.25,tilt:0.25,tgt:0.5,acc:0.5,stl:-1,sw:1
"""
import os
import sys
from multiprocessing import Pool

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from learn_vs_frozen import drawn  # noqa: E402

from malcolm import _argparse as g  # noqa: E402


def _apply(p, var, workers):
    n, me = p.n, p.me
    kind, v = var.split(":")
    v = float(v)
    Wm, Bm, Ws, Bs = p.W_migrate, p.B_migrate, p.W_steal, p.B_steal
    if kind == "tilt":
        Bm += v * np.log(workers / workers.mean())
    elif kind == "tgt":
        for j in range(n):
            if j != me:
                Wm[j, j] = -v
    elif kind == "acc":
        Wm[me, me] = -v
    elif kind == "stl":
        Bs[me] += v
    elif kind == "sw":
        for j in range(n):
            if j != me:
                Ws[j, j] = v
    else:
        raise ValueError(f"unknown variant {var!r}")
    p.set_params(W_migrate=Wm, B_migrate=Bm, W_steal=Ws, B_steal=Bs)


def _run(job):
    import malcolm.policy.registry as reg
    from malcolm.sim import simulate

    sc, i, var, seed = job
    rack, wl, load, delay, tasks = sc
    workers = np.array([float(x.split("x")[1]) for x in rack.split(",")])
    if not hasattr(reg, "_room_make"):
        reg._room_make = reg.make_policy

    def make(name, n, s, sd, **kw):
        p = reg._room_make(name, n, s, sd, **kw)
        for v in var.split("+"):
            if v != "start":
                _apply(p, v, workers)
        return p

    reg.make_policy = make      # this worker process only
    r = simulate(rack=rack, policy="malcolm:learn=0", workload=wl, load=load, tasks=tasks,
                 seed=seed, delay_us=delay, warmup=0.3)
    return i, var, seed, r.p99_us


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/policy_room.py --variants tgt:0.5,tilt:0.25
        python3 bench/policy_room.py --draw 9090 --count 16 --variants acc:0.5+stl:-1""")
    ap.add_argument("--draw", type=int, default=4242, help="scenario seed (default 4242)")
    ap.add_argument("--count", type=int, default=8, help="scenarios (default 8)")
    ap.add_argument("--max-servers", type=int, default=16, help="largest rack drawn")
    ap.add_argument("--tasks-mult", type=float, default=0.5, help="scale task counts")
    ap.add_argument("--seeds", default="21,22,23", type=g.numbers(int, "integers"),
                    help="simulation seeds")
    ap.add_argument("--variants", default="tilt:-0.25,tilt:0.25,tgt:0.5,acc:0.5,stl:-1,sw:1")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    a = ap.parse_args(argv)
    seeds = a.seeds
    if a.count < 1 or a.procs < 1 or a.max_servers < 2 or not a.tasks_mult > 0:
        ap.error("--count and --procs must be >= 1, --max-servers >= 2, --tasks-mult > 0")
    variants = ["start"] + [v for v in a.variants.split(",") if v]
    for v in variants[1:]:
        for part in v.split("+"):
            kind, _, val = part.partition(":")
            try:
                float(val)
            except ValueError:
                ap.error(f"variant {part!r}: expected KIND:NUMBER")
            if kind not in ("tilt", "tgt", "acc", "stl", "sw"):
                ap.error(f"variant {part!r}: unknown kind {kind!r}")
    scen = drawn(a.draw, a.count, a.max_servers, a.tasks_mult)
    jobs = [(sc, i, v, s) for i, sc in enumerate(scen) for v in variants for s in seeds]
    with Pool(a.procs) as pool:
        res = pool.map(_run, jobs)
    d = {(i, v, s): p for i, v, s, p in res}
    ratios = {v: [] for v in variants[1:]}
    for i, sc in enumerate(scen):
        base = float(np.median([d[(i, "start", s)] for s in seeds]))
        for v in variants[1:]:
            ratios[v].append(float(np.median([d[(i, v, s)] for s in seeds])) / base)
        row = " ".join(f"{v} {ratios[v][-1]:.3f}" for v in variants[1:])
        print(f"{sc[0][:32]:>32} {sc[1]:>9} {sc[2]:.2f} {sc[3]:5.2f} µs start p99 "
              f"{base:8.1f} | {row}")
    print("geometric mean | " + " ".join(
        f"{v} {np.exp(np.mean(np.log(r))):.4f}" for v, r in ratios.items()))
    print("best variant per scenario, over the start: " + " ".join(
        f"{min(r[i] for r in ratios.values()):.3f}" for i in range(len(scen))))


if __name__ == "__main__":
    main()
