"""How far learning has moved Malcolm's actors at given times after a cold start.

A settle time says when the imbalance stops falling by more than its noise; this says what is
still moving. For each ``--at`` time T the rack is simulated from a cold start for T ms of
arrivals (the same seed, so each run extends the one before), and the actors' biases are
averaged over pairs of server classes: *big* servers (the most workers) and *small* ones (the
rest). Printed per time: p99 over the whole run, the mean migrate bias from small to big,
small to small and big to small servers, the mean steal bias of big servers towards small
victims and of small servers towards big ones, migrations and steals per task. Biases start at
0 (the capacity shares are in the prior, not in the biases); the trust region bounds them at
+-``trust``. Seconds per time on an idle core (a 1 200 ms run on 46 workers is ~900 000
tasks)::

    python3 bench/bias_drift.py --servers 2x16,14x1 --load 0.8 --seed 2
    python3 bench/bias_drift.py --servers 3x11,3x1 --workload rocksdb2 --load 0.891 \\
        --delay-us 6.85 --at 50,200 --malcolm steal_state=window
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402


def _classes(rack):
    """Per server: True for the servers with the most workers (a rack spec such as 2x16,14x1)."""
    from malcolm.sim.rack import parse_rack_spec

    r = parse_rack_spec(rack)
    w = np.array(r.workers, dtype=float) * np.array(r.speeds, dtype=float)
    return w == w.max(), w


def _pair_mean(B, rows, cols):
    """Mean of B[i][j] over i in rows, j in cols, j != i (each row one agent's biases)."""
    v = [B[i][j] for i in rows for j in cols if j != i]
    return float(np.mean(v)) if v else float("nan")


def drift(rack, workload, load, delay_us, seed, times_ms, params=""):
    """One row per time: (ms, p99, bias means, migrations / task, steals / task)."""
    import malcolm.policy.registry as reg
    from malcolm.sim import simulate

    big, w = _classes(rack)
    if big.all():
        raise SystemExit("bias_drift: the rack needs servers of two sizes (big and small)")
    B, S = np.nonzero(big)[0], np.nonzero(~big)[0]
    from malcolm.workloads import parse_workload

    per_ms = 1000.0 * load * w.sum() / parse_workload(workload).mean_us  # arrivals per ms
    made = []
    make = reg.make_policy

    def keep(name, n, s, sd, **kw):         # this process only: remember what the run built
        p = make(name, n, s, sd, **kw)
        made.append(p)
        return p

    reg.make_policy = keep
    spec = "malcolm" + (":" + params if params else "")
    rows = []
    try:
        for t in times_ms:
            del made[:]
            r = simulate(rack=rack, policy=spec, workload=workload, load=load,
                         tasks=int(per_ms * t), seed=seed, delay_us=delay_us, warmup=0.0)
            Bm = [np.asarray(p.B_migrate) for p in made]
            Bs = [np.asarray(p.B_steal) for p in made]
            rows.append((t, r.p99_us, _pair_mean(Bm, S, B), _pair_mean(Bm, S, S),
                         _pair_mean(Bm, B, S), _pair_mean(Bs, B, S), _pair_mean(Bs, S, B),
                         r.migrations / r.generated, r.steals / r.generated))
    finally:
        reg.make_policy = make
    return rows


def main(argv=None):
    ap = g.parser(__doc__, examples="""
  python3 bench/bias_drift.py --servers 2x16,14x1 --load 0.8 --seed 2
  python3 bench/bias_drift.py --servers 3x11,3x1 --workload rocksdb2 --load 0.891 --at 50,200""")
    ap.add_argument("--servers", type=g.servers, default="2x16,14x1", metavar="SPEC",
                    help="a rack of servers of two or more sizes (2x16,14x1)")
    ap.add_argument("--workload", default="exp:50", help="workload (exp:50)")
    ap.add_argument("--load", type=float, default=0.8, help="offered load (0.8)")
    ap.add_argument("--delay-us", type=float, default=2.0, help="one-way delay in µs (2)")
    ap.add_argument("--seed", type=int, default=2, help="simulation seed (2)")
    ap.add_argument("--at", default="20,50,100,200,400,1200", metavar="MS,...",
                    type=g.numbers(float, "times in ms"),
                    help="times after the cold start, in ms of arrivals")
    ap.add_argument("--malcolm", default="", metavar="KEY=VAL,...",
                    help="extra Malcolm parameters")
    a = ap.parse_args(argv)
    if min(a.at) <= 0:
        ap.error("argument --at: times must be > 0, got " + ",".join(f"{t:g}" for t in a.at))
    print(f"{a.servers} {a.workload} load {a.load} delay {a.delay_us} µs seed {a.seed}"
          f"{' malcolm:' + a.malcolm if a.malcolm else ''}: mean biases (small = fewer workers)")
    print(f"{'ms':>6} {'p99 µs':>8} {'Bm s->b':>8} {'s->s':>6} {'b->s':>6} "
          f"{'Bs b<-s':>8} {'s<-b':>6} {'migr':>6} {'steals':>6}")
    for row in drift(a.servers, a.workload, a.load, a.delay_us, a.seed, a.at, a.malcolm):
        print("{:6.0f} {:8.1f} {:8.2f} {:6.2f} {:6.2f} {:8.2f} {:6.2f} {:6.3f} {:6.3f}"
              .format(*row))


if __name__ == "__main__":
    main()
