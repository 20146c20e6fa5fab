"""Random racks under conditions the robustness sweep does not draw (a held-out check).

``bench/sweep.py`` draws racks, workloads, loads and hops on a clean network, every client
sending the same share, with the default 100 µs window. This script draws small racks (2-16
servers of 1-16 workers, every thesis workload, loads in ``--load-range``, one-way delays 2-10
µs), each with one of five conditions:

* ``jitter``: 0-10 µs of jitter on every hop;
* ``loss``: 0-30% of the heartbeats lost;
* ``gateway``: 50-400 ns of a server's gateway per message, heartbeats included;
* ``window``: a fixed policy window of 25, 50, 200 or 400 µs instead of 100;
* ``uneven``: client shares drawn from a Dirichlet(2) over the servers.

Every policy runs on every rack (default Malcolm, JSQ, JBT, client po2, and each
``--policy``). For every policy that is not a baseline it reports the fraction of racks where
its p99 is within 5% of the best of JSQ, JBT and po2, its worst ratio to that best, and the
geometric mean of the ratio, overall and per condition; with ``--policy malcolm:learn=0``
also how often learning is below, equal to or above its frozen start, and the worst ratio.
Not part of CI: 150 racks take about
30 s on 2 cores (60 000 tasks each). ``--quick`` runs 10 racks of 10 000 tasks::

    python3 bench/conditions.py --policy malcolm:steal_idle=0
    python3 bench/conditions.py --seed 4445 --load-range 0.8,0.95 --policy malcolm:learn=0
    python3 bench/conditions.py --quick --procs 1 --json -
"""

from __future__ import annotations

import math
import os
import sys
from multiprocessing import Pool

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from malcolm import _argparse as g  # noqa: E402

if HERE not in sys.path:
    sys.path.insert(0, HERE)
# every thesis workload and the baselines, as the robustness sweep names them
from sweep import BASELINES, WORKLOADS  # noqa: E402

CONDITIONS = ("jitter", "loss", "gateway", "window", "uneven")


def draw_racks(count, seed, loads=(0.3, 0.95), tasks=60_000):
    """``count`` racks drawn from ``seed``: dicts of ``simulate`` arguments plus ``id`` and
    ``condition``. Rack k depends only on (seed, k), so a longer draw extends a shorter one."""
    out = []
    for k in range(count):
        r = np.random.default_rng([seed, k])
        n = int(r.integers(2, 17))
        big = int(r.integers(1, 17))
        rack = ",".join(f"1x{int(r.integers(1, big + 1))}" for _ in range(n))
        sc = dict(rack=rack, workload=str(r.choice(WORKLOADS)),
                  load=float(round(r.uniform(*loads), 3)),
                  delay_us=float(round(r.uniform(2, 10), 2)), tasks=tasks)
        cond = CONDITIONS[int(r.integers(0, len(CONDITIONS)))]
        if cond == "jitter":
            sc["jitter_us"] = float(round(r.uniform(0, 10), 2))
        elif cond == "loss":
            sc["loss"] = float(round(r.uniform(0, 0.3), 3))
        elif cond == "gateway":
            sc["gateway_ns"] = float(round(r.uniform(50, 400)))
        elif cond == "window":
            sc["window_us"] = float(r.choice([25, 50, 200, 400]))
            sc["window_tasks"] = 0.0        # that window, fixed (not 5 task times)
        else:
            sc["shares"] = [float(x) for x in r.dirichlet(np.full(n, 2.0))]
        out.append(dict(id=k, condition=cond, **sc))
    return out


FROZEN = "malcolm:learn=0"


def _run(job):
    from malcolm.sim import simulate
    sc, policy, seed = job
    kw = {k: v for k, v in sc.items() if k not in ("id", "condition")}
    r = simulate(policy=policy, seed=seed, **kw)
    return sc["id"], policy, r.p99_us


def summarize(racks, p99, policies):
    """{policy: {"all": (racks, within 5%, worst, gmean), condition: (...)}} of the ratio of
    each policy's p99 to the best baseline's, for the policies that are not baselines."""
    out = {}
    for pol in policies:
        if pol in BASELINES:
            continue
        groups = {"all": []}
        for sc in racks:
            ratio = p99[(sc["id"], pol)] / min(p99[(sc["id"], b)] for b in BASELINES)
            groups["all"].append(ratio)
            groups.setdefault(sc["condition"], []).append(ratio)
        out[pol] = {c: (len(v), sum(x <= 1.05 for x in v), max(v),
                        math.exp(sum(math.log(x) for x in v) / len(v)))
                    for c, v in groups.items()}
    return out


def learnt_vs_frozen(racks, p99):
    """Malcolm's p99 over its frozen start's (``malcolm:learn=0``), rack by rack: (lower,
    equal, higher, the worst ratio and its rack)."""
    rows = [(p99[(sc["id"], "malcolm")] / p99[(sc["id"], FROZEN)], sc) for sc in racks]
    worst = max(rows, key=lambda r: r[0])
    return (sum(r < 1 for r, _ in rows), sum(r == 1 for r, _ in rows),
            sum(r > 1 for r, _ in rows), worst[0], worst[1])


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/conditions.py --policy malcolm:steal_idle=0
        python3 bench/conditions.py --seed 4445 --load-range 0.8,0.95
        python3 bench/conditions.py --seed 7121236 --policy malcolm:learn=0
        python3 bench/conditions.py --quick --procs 1 --json -""")
    ap.add_argument("--racks", type=int, default=150, help="racks to draw (default 150)")
    ap.add_argument("--seed", type=int, default=4444, help="draws the racks (default 4444)")
    ap.add_argument("--sim-seed", type=int, default=1, help="seed of every simulation")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--tasks", type=int, default=60_000, help="tasks per run (default 60 000)")
    ap.add_argument("--quick", action="store_true", help="10 racks of 10 000 tasks")
    ap.add_argument("--load-range", dest="loads", type=g.numbers(float), metavar="LO,HI",
                    default="0.3,0.95", help="range of the drawn loads (default 0.3,0.95)")
    ap.add_argument("--policy", action="append", default=[], metavar="SPEC",
                    help="a policy to run beside malcolm and the baselines (repeatable)")
    g.add_json(ap, "every rack and run")
    a = ap.parse_args(argv)
    g.json_stdout(a)
    if a.racks < 1 or a.procs < 1 or a.tasks < 1:
        ap.error("--racks, --procs and --tasks must be >= 1")
    if len(a.loads) != 2 or not 0.0 < a.loads[0] <= a.loads[1] <= 2.0:
        ap.error("--load-range needs LO,HI with 0 < LO <= HI <= 2")
    racks = draw_racks(10 if a.quick else a.racks, a.seed, a.loads,
                       10_000 if a.quick else a.tasks)
    policies = ["malcolm", *BASELINES, *[p for p in a.policy if p not in BASELINES
                                         and p != "malcolm"]]
    jobs = [(sc, p, a.sim_seed) for sc in racks for p in policies]
    with Pool(a.procs) as pool:
        p99 = {(i, p): v for i, p, v in pool.imap_unordered(_run, jobs)}
    summ = summarize(racks, p99, policies)
    lines = [f"{len(racks)} racks from seed {a.seed}, loads {a.loads[0]:g}-{a.loads[1]:g}, "
             f"simulation seed {a.sim_seed}: p99 against the best of JSQ, JBT and po2",
             "", "| policy | condition | racks | within 5% | worst | geometric mean |",
             "|---|---|---|---|---|---|"]
    for pol, groups in summ.items():
        for c in ("all", *CONDITIONS):
            if c in groups:
                n, w5, worst, gm = groups[c]
                lines.append(f"| {pol} | {c} | {n} | {100 * w5 / n:.1f}% | {worst:.2f} | "
                             f"{gm:.3f} |")
    if FROZEN in policies:
        lo, eq, hi, worst, sc = learnt_vs_frozen(racks, p99)
        lines += ["", f"Learnt against its frozen start ({FROZEN}): lower on {lo}, equal on "
                  f"{eq}, higher on {hi} of {len(racks)} racks; worst {worst:.3f} "
                  f"({sc['rack']}, {sc['workload']} at {sc['load']:g}, {sc['condition']})"]
    print("\n".join(lines))
    keys = ("racks", "within5", "worst", "gmean")
    g.write_json(a, {"racks": racks, "runs": [dict(id=i, policy=p, p99_us=v)
                                              for (i, p), v in sorted(p99.items())],
                     "summary": {p: {c: dict(zip(keys, v, strict=True)) for c, v in grp.items()}
                                 for p, grp in summ.items()}})


if __name__ == "__main__":
    main()
