"""Scale (issue 12, item 5): a many-server Malcolm simulation against JSQ's, the same command.

Runs ``python3 -m malcolm sim --servers RACK --load 0.9 --tasks T --policy P --json`` once
per policy and round, the policies interleaved within each round (JSQ, Malcolm, ...), so
that a drift of the machine touches every policy alike. Each run is a fresh process and
yields three times:

* ``loop``: the simulator's event loop, CPU time of its thread (the JSON's ``loop_s``);
* ``cpu``: the whole command's CPU time, user + system (interpreter start, imports, the
  rack's setup, the loop, the summary), from the child's resource usage;
* ``wall``: the whole command's wall time.

It prints, per policy, the median of each and, per round, its ratio to JSQ's run of the same
round: the median ratio with an order-statistic interval (``[min, max]`` below six rounds,
with its coverage; ``malcolm.loadgen.method.median_ci``). The issue's target is 3x JSQ's
time for 64 one-worker servers and 400 000 tasks. Not part of CI: about 4 s a round on this
2-core VM at the defaults::

    python3 bench/scale.py
    python3 bench/scale.py --rounds 7 --policies "jsq;malcolm;malcolm:learn=0" --json -
    python3 bench/scale.py --servers 32x1 --tasks 200000
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402
from malcolm.loadgen.method import median_ci  # noqa: E402

TARGET = 3.0
MEASURES = ("loop", "cpu", "wall")


def run_once(servers, tasks, load, policy, seed):
    """One ``malcolm sim`` process: ``dict(loop, cpu, wall, p99_us)`` (seconds, µs)."""
    cmd = [sys.executable, "-m", "malcolm", "sim", "--servers", servers, "--load", str(load),
           "--tasks", str(tasks), "--seed", str(seed), "--policy", policy, "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): "
                           f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    run = json.loads(p.stdout)["runs"][0]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(loop=float(run["loop_s"]), cpu=cpu, wall=wall, p99_us=float(run["p99_us"]))


def summarize(policies, runs):
    """Per policy and measure: the median time and the median ratio to the first policy's run
    of the same round, with its interval. ``runs[i][policy]`` is round i's ``run_once``."""
    ref = policies[0]
    out = {}
    for pol in policies:
        row = {}
        for m in MEASURES:
            med, _, _, _ = median_ci([r[pol][m] for r in runs])
            rmed, lo, hi, cov = median_ci([r[pol][m] / r[ref][m] for r in runs])
            row[m] = dict(median_s=med, ratio=rmed, ratio_lo=lo, ratio_hi=hi, coverage=cov)
        row["p99_us"] = median_ci([r[pol]["p99_us"] for r in runs])[0]
        out[pol] = row
    return out


def verdict(ratio, lo, hi, target=TARGET):
    """``met`` / ``not met`` where the whole interval is on one side of the target, else
    ``undecided``."""
    if hi <= target:
        return "met"
    if lo > target:
        return "not met"
    return "undecided"


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/scale.py
        python3 bench/scale.py --rounds 7 --json -
        python3 bench/scale.py --servers 32x1 --tasks 200000""")
    ap.add_argument("--servers", default="64x1", type=g.servers,
                    help="the rack (default 64x1, the issue's)")
    ap.add_argument("--tasks", type=int, default=400_000, help="tasks a run (default 400 000)")
    ap.add_argument("--load", type=float, default=0.9, help="offered load (default 0.9)")
    ap.add_argument("--seed", type=int, default=1, help="simulation seed (default 1)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--policies", default="jsq;malcolm;malcolm:learn=0",
                    help="';'-separated, the first is the reference (default "
                         "\"jsq;malcolm;malcolm:learn=0\")")
    g.add_json(ap, "every run and the summary")
    a = ap.parse_args(argv)
    g.json_stdout(a)
    pols = [p.strip() for p in a.policies.split(";") if p.strip()]
    if len(pols) < 2:
        ap.error("--policies needs a reference and at least one more policy")
    if a.rounds < 1 or a.tasks < 1 or not 0.0 < a.load <= 2.0:
        ap.error("--rounds and --tasks must be >= 1, and --load in (0, 2]")
    runs = []
    for i in range(a.rounds):
        row = {}
        for pol in pols:
            try:
                row[pol] = run_once(a.servers, a.tasks, a.load, pol, a.seed)
            except RuntimeError as e:
                ap.exit(1, f"bench/scale.py: {e}\n")
            print(f"[round {i + 1}/{a.rounds}] {pol:>18}: loop {row[pol]['loop']:.3f} s, "
                  f"cpu {row[pol]['cpu']:.3f} s, wall {row[pol]['wall']:.3f} s", file=sys.stderr)
        runs.append(row)
    summ = summarize(pols, runs)
    ref = pols[0]
    print(f"{a.servers}, load {a.load:g}, {a.tasks} tasks, seed {a.seed}; {a.rounds} "
          f"interleaved rounds; median seconds and median ratio to {ref} per round "
          f"[interval, coverage]")
    print(f"{'policy':>18} | " + " | ".join(f"{m:>28}" for m in MEASURES) + " | p99 µs")
    for pol in pols:
        cells = []
        for m in MEASURES:
            c = summ[pol][m]
            cells.append(f"{c['median_s']:6.3f} s {c['ratio']:4.2f}x [{c['ratio_lo']:4.2f}, "
                         f"{c['ratio_hi']:4.2f}] {100 * c['coverage']:3.0f}%")
        print(f"{pol:>18} | " + " | ".join(cells) + f" | {summ[pol]['p99_us']:.1f}")
    for pol in pols[1:]:
        v = {m: verdict(summ[pol][m]["ratio"], summ[pol][m]["ratio_lo"],
                        summ[pol][m]["ratio_hi"]) for m in MEASURES}
        print(f"{pol} at most {TARGET:g}x {ref}: loop {v['loop']}, whole command (cpu) "
              f"{v['cpu']}, (wall) {v['wall']}")
    g.write_json(a, {"runs": runs, "summary": summ, "target": TARGET})


if __name__ == "__main__":
    main()
