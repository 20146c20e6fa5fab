"""How often the hop gate acts, and what it does to p99, from light to heavy load.

For each rack and load, the default Malcolm and ``malcolm:hop_gate=0``: p50, p99, the
migrated fraction and the fraction of tasks the gate accepted outright (the policies'
``gated`` counters summed over the servers). 100 000 tasks, seed 1, 2 µs one-way delay.
The figures are in docs/policy.md ("The default policy", item 7)::

    python3 bench/gate_activity.py
    python3 bench/gate_activity.py --load 0.3,0.85 --servers 8x8
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402

CASES = (("2x14,9x4", "exp:50"), ("8x8", "exp:50"), ("16x16", "exp:50"),
         ("4x16,12x2", "rocksdb2"))


def run(rack, workload, load, pol):
    """One simulation; returns (result, tasks the gate accepted outright)."""
    from malcolm.policy import registry
    from malcolm.sim import run as sim_run
    from malcolm.sim import simulate

    made = []
    make = sim_run.registry.make_policy

    def keep(*args, **kw):
        p = make(*args, **kw)
        made.append(p)
        return p

    sim_run.registry.make_policy = keep
    try:
        r = simulate(rack=rack, policy=pol, workload=workload, load=load, tasks=100_000,
                     seed=1, delay_us=2.0)
    finally:
        sim_run.registry.make_policy = registry.make_policy
    return r, sum(getattr(p, "gated", 0) for p in made)


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/gate_activity.py --load 0.6
        python3 bench/gate_activity.py --servers hetero --workload bimodal""")
    ap.add_argument("--servers", action="append", type=g.servers, default=None,
                    metavar="SPEC", help="a rack or preset; repeatable (default: four racks, "
                                         "4x16,12x2 with RocksDB-2, the others Exp(50))")
    ap.add_argument("--workload", default="exp:50",
                    help="workload of the --servers racks (default exp:50)")
    ap.add_argument("--load", type=g.loads, default=[0.3, 0.6, 0.85, 0.95],
                    help="loads: 0.3,0.9 or START:STOP:STEP (default 0.3,0.6,0.85,0.95)")
    a = ap.parse_args(argv)
    cases = [(r, a.workload) for r in a.servers] if a.servers else CASES
    for rack, wl in cases:
        for load in a.load:
            for pol in ("malcolm", "malcolm:hop_gate=0"):
                r, gated = run(rack, wl, load, pol)
                n = max(r.generated, 1)
                print(f"{rack:>10} {wl:>8} load {load:4.2f} {pol:>18}: p50 {r.p50_us:6.1f} "
                      f"p99 {r.p99_us:7.1f} µs migrated {r.migrations / n:.3f} "
                      f"gated {gated / n:.3f}", flush=True)


if __name__ == "__main__":
    main()
