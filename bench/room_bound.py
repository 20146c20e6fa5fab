"""Is a learnt-vs-frozen tie structural? A lower bound of any policy's p99, per sweep rack.

For sweep scenarios (``bench/sweep.py``'s generator, ``--seed``, task counts x
``--tasks-mult``) this runs learnt Malcolm and its frozen start (``malcolm:learn=0``) over
``--seeds`` and prints, per seed, their p99, migrations and steals per task, and the share of
the tasks at or above p99 that waited less than one hop; then the seed-median ratio, the
geometric mean of the per-seed ratios with its standard error, and a lower bound that holds
for *every* server-side policy on that rack:

* every task's latency is at least its service time plus two one-way delays (client to
  server, response), so p99 >= the 99th percentile of (service + 2 d) over the same service
  draws (the draws are a function of the seed, not of the policy);
* clients spread the tasks evenly, and a server cannot keep more than its capacity, so at
  least f = sum_j max(0, 1/n - c_j / (C load)) of the tasks leave the server they reached
  (a migration or a steal: one more delay d). A decision does not see the task's service
  time, so the same share f of the tasks whose service is >= its 99th percentile S99 takes a
  hop (in expectation). Where those tasks are >= 1% of all (Bimodal: 10% are 500 µs), p99
  >= S99 + 3 d.

A rack whose frozen p99 equals the bound (to the rounding of the latencies) leaves no room:
no policy can be lower there. Not in CI::

    python3 bench/room_bound.py --ids 26,28,41,59 --seeds 1,2,3
    python3 bench/room_bound.py --ids 0,29 --seeds 1,2,3,4,5,6,7,8,9
"""
import os
import sys
from multiprocessing import Pool

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from sweep import draw_scenarios  # noqa: E402

from malcolm import _argparse as g  # noqa: E402


def forwarded_share(rack, load):
    """The least share of all tasks that must leave the server they reached."""
    from malcolm.sim.rack import parse_rack_spec

    rk = parse_rack_spec(rack)
    cap = np.array(rk.workers, dtype=float) * np.array(rk.speeds, dtype=float)
    n = len(cap)
    return float(np.maximum(0.0, 1.0 / n - cap / (cap.sum() * load)).sum())


def _run(job):
    from malcolm.sim import simulate

    sc, pol, seed = job
    d = sc["delay_us"]
    r = simulate(rack=sc["rack"], policy=pol, workload=sc["workload"], load=sc["load"],
                 tasks=sc["tasks"], seed=seed, delay_us=d, warmup=0.3)
    lat, svc = r.latencies_us, r.service_us
    s99 = float(np.quantile(svc, 0.99))
    bound = float(np.quantile(svc + 2 * d, 0.99))
    if np.mean(svc >= s99) * forwarded_share(sc["rack"], sc["load"]) >= 0.01:
        bound = max(bound, s99 + 3 * d)
    tail = lat >= r.p99_us
    quick = float(np.mean(lat[tail] - svc[tail] <= 3 * d + 1e-6))
    return (sc["id"], pol, seed, dict(p99=r.p99_us, bound=bound, mig=r.migrations / r.generated,
                                      steals=r.steals / r.generated, tail_no_wait=quick))


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/room_bound.py --ids 26,28,41,59
        python3 bench/room_bound.py --ids 0,29 --seeds 1,2,3,4,5,6,7,8,9""")
    ap.add_argument("--ids", required=True, type=g.numbers(int, "integers"),
                    help="sweep scenario ids, comma-separated")
    ap.add_argument("--seeds", default="1,2,3", type=g.numbers(int, "integers"),
                    help="simulation seeds (default 1,2,3: the sweep's --hetero-seeds 3)")
    ap.add_argument("--seed", type=int, default=2026, help="the sweep's draw (2026)")
    ap.add_argument("--tasks-mult", type=float, default=2.0, help="as the sweep's (2)")
    ap.add_argument("--malcolm", default="", help="extra Malcolm parameters, k=v,...")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    a = ap.parse_args(argv)
    if a.procs < 1 or not a.tasks_mult > 0:
        ap.error("--procs must be >= 1 and --tasks-mult > 0")
    if not a.ids or min(a.ids) < 0 or max(a.ids) > 999:
        ap.error("--ids: scenario ids are 0..999 (the sweep draws 0..59)")
    scen = {sc["id"]: sc for sc in draw_scenarios(max(60, max(a.ids) + 1), a.seed)}
    for sc in scen.values():
        sc["tasks"] = int(sc["tasks"] * a.tasks_mult)
    extra = a.malcolm.strip().strip(",")
    learnt = "malcolm" + (":" + extra if extra else "")
    frozen = "malcolm:learn=0" + ("," + extra if extra else "")
    jobs = [(scen[i], p, s) for i in a.ids for p in (learnt, frozen) for s in a.seeds]
    with Pool(a.procs) as pool:
        res = {(i, p, s): v for i, p, s, v in pool.map(_run, jobs, chunksize=1)}
    for i in a.ids:
        sc = scen[i]
        print(f"scenario {i}: {sc['rack'][:48]} {sc['workload']} load {sc['load']} "
              f"delay {sc['delay_us']} µs; least forwarded share "
              f"{forwarded_share(sc['rack'], sc['load']):.3f}")
        for s in a.seeds:
            lv, fv = res[(i, learnt, s)], res[(i, frozen, s)]
            print(f"  seed {s}: p99 learnt {lv['p99']:9.2f} frozen {fv['p99']:9.2f} "
                  f"bound {fv['bound']:9.2f}  ratio {lv['p99'] / fv['p99']:.5f}  mig/task "
                  f"{lv['mig']:.3f}/{fv['mig']:.3f} steals/task {lv['steals']:.3f}/"
                  f"{fv['steals']:.3f}  tail with no wait {lv['tail_no_wait']:.2f}/"
                  f"{fv['tail_no_wait']:.2f}")
        lp = np.array([res[(i, learnt, s)]["p99"] for s in a.seeds])
        fp = np.array([res[(i, frozen, s)]["p99"] for s in a.seeds])
        lr = np.log(lp / fp)
        se = lr.std(ddof=1) / np.sqrt(len(lr)) if len(lr) > 1 else float("nan")
        room = max(1.0 - res[(i, frozen, s)]["bound"] / res[(i, frozen, s)]["p99"]
                   for s in a.seeds)
        print(f"  median learnt/frozen {np.median(lp) / np.median(fp):.5f}; per-seed geometric "
              f"mean {np.exp(lr.mean()):.4f} (standard error of its log {se:.4f}); frozen "
              f"above the bound by at most {100 * room:.3f}%")


if __name__ == "__main__":
    main()
