"""Light load: p50 of Malcolm against po2 and JBT at loads 0.1 and 0.3 (issue 12, item 3).

Four racks (8x8, 2x14,9x4, 4x16,12x2, 64x1), Exp(50), 100 000 tasks, seed 1, one-way delays
``--delays`` (µs); ``--racks``, ``--workloads``, ``--tasks`` and ``--seed`` change them (the
held-out check of docs/policy.md runs other racks and every workload family). Prints p50,
p99 and the migrated fraction of each run, and for each policy but po2 and JBT its p50
against the best of them. Runs in ``--procs`` processes; a
minute or two on an idle 2-core machine. The table is in docs/policy.md ("Light load")::

    python3 bench/light_load.py
    python3 bench/light_load.py --policies "malcolm;malcolm:hop_gate=0;malcolm:learn=0"
    python3 bench/light_load.py --delays 10 --seed 7 --tasks 60000 --policies \
        "malcolm;malcolm:hop_gate=0" --racks "4x16,12x2;2x14,9x4;8x8;64x1;3x8,5x1" \
        --workloads "rocksdb2-measured;hyperexp2;bimodal;exp:50"
"""
import os
import sys
from multiprocessing import Pool

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402

RACKS = ("8x8", "2x14,9x4", "4x16,12x2", "64x1")
LOADS = (0.1, 0.3)
BASES = ("po2", "jbt")


def _run(job):
    from malcolm.sim import simulate

    rack, wl, delay, load, pol, tasks, seed = job
    r = simulate(rack=rack, policy=pol, load=load, tasks=tasks, seed=seed, delay_us=delay,
                 workload=wl)
    return job, r.p50_us, r.p99_us, r.migrations / max(r.generated, 1)


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/light_load.py --delays 10
        python3 bench/light_load.py --policies "malcolm;malcolm:hop_gate=0" """)
    ap.add_argument("--policies", default="malcolm;malcolm:hop_gate=0;malcolm:learn=0",
                    help="policies to compare, ';'-separated (po2 and JBT are always run)")
    ap.add_argument("--delays", default="2,10", type=g.numbers(float),
                    help="one-way delays in µs, comma-separated")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--racks", default=";".join(RACKS), help="racks, ';'-separated")
    ap.add_argument("--workloads", default="exp:50", help="workloads, ';'-separated")
    ap.add_argument("--tasks", type=int, default=100_000, help="tasks per run")
    ap.add_argument("--seed", type=int, default=1, help="simulation seed")
    a = ap.parse_args(argv)
    delays = a.delays
    if a.procs < 1 or a.tasks < 1000:
        ap.error("--procs must be >= 1 and --tasks >= 1000")
    racks = [r for r in a.racks.split(";") if r]
    wls = [w for w in a.workloads.split(";") if w]
    from malcolm.sim import check_policies

    pols = g.checked(ap, "--policies", check_policies, a.policies) + list(BASES)
    jobs = [(r, w, d, ld, p, a.tasks, a.seed) for r in racks for w in wls for d in delays
            for ld in LOADS for p in pols]
    try:
        with Pool(a.procs) as pool:
            res = {job[:5]: (p50, p99, mig) for job, p50, p99, mig in pool.map(_run, jobs)}
    except ValueError as exc:             # a bad rack or workload spec: one line
        sys.exit(f"light_load: {exc}")
    worst = {}
    for r in racks:
        for w in wls:
            for d in delays:
                for ld in LOADS:
                    best = min(res[(r, w, d, ld, b)][0] for b in BASES)
                    for p in pols:
                        p50, p99, mig = res[(r, w, d, ld, p)]
                        vs = ""
                        if p not in BASES:
                            worst[p] = max(worst.get(p, -1.0), p50 / best - 1)
                            vs = f"  vs best of po2/JBT {p50 / best - 1:+.1%}"
                        print(f"{r:>10} {w} {d:4.1f} µs load {ld}: {p:>22} p50 {p50:6.1f} "
                              f"p99 {p99:7.1f} migrated {mig:.3f}{vs}")
    for p, v in worst.items():
        print(f"{p}: worst p50 against the best of po2/JBT {v:+.1%}")


if __name__ == "__main__":
    main()
