"""Robustness sweep of the learning policy (issue 12, item 6): random racks, workloads, loads.

Draws ``--scenarios`` scenarios from a fixed ``--seed`` (2-64 servers, 1-16 workers each,
capacity skew up to 16:1, every thesis workload, loads 0.3-0.95, one-way delays 2-10 µs;
``--load-range`` and ``--delay-range`` change those two ranges; ``--speeds LO,HI`` gives
each server a speed factor drawn log-uniformly from LO-HI, from a stream of its own, so the
same racks, workloads, loads and delays are drawn as without it; ``--window`` sets every
server's policy window, default the runtime's 100 µs (which shortens to 5 task times where
tasks are shorter than 20 µs, as in ``malcolm sim``; another ``--window`` is fixed), and
``--phase`` the windows' phases, default random; ``--loss L`` loses each heartbeat with
probability L (default 0); ``--sched ps`` serves the tasks inside each
server by processor sharing, round robin with ``--quantum`` or ideal at 0) and
simulates each with every policy of ``POLICIES``: default Malcolm, the same Malcolm frozen at
its initial policy (``learn=0``), JSQ, JBT, client power-of-2, and the ideal centralized FCFS
(a reference, not deployable). It reports, per policy,

* ``best5``: the fraction of scenarios where its p99 is the best of the deployable policies
  or within 5% of it;
* ``cfcfs2``: the fraction (of the scenarios where *some* deployable policy has p99 within 2x
  the ideal cFCFS) where its own p99 is within 2x cFCFS;
* ``worst_vs_base``: its worst p99 ratio to the best of JSQ, JBT and po2;

and, for the learnt policy against its frozen start on heterogeneous racks, the fraction of
scenarios where learning wins and the worst loss.

``--reference POLICY`` (repeatable) runs one more policy, ``sed`` say, with the same figures
and a line against Malcolm; it enters neither the best of the deployable policies nor the
baselines, so the sweep's own figures stay as they were.

Not part of CI (the full sweep takes 7-14 minutes on 2 shared cores); ``--quick`` runs a
handful of small scenarios as a smoke test (< 60 s). Writes ``DIR/sweep.csv``,
``DIR/sweep.txt`` (the markdown table; not ``.md``, which the docs site would take for a page)
and ``DIR/sweep.png`` (``--outdir DIR``; ``--name STEM`` for other names), and with ``--json
[FILE|-]`` every run and the run metadata::

    python3 bench/sweep.py --tasks-mult 2 --hetero-seeds 3 --reference sed \
        --outdir docs/figures                                                  # committed
    python3 bench/sweep.py --tasks-mult 2 --hetero-seeds 3 --speeds 0.25,4 --reference sed \
        --outdir docs/figures --name sweep_speeds                              # committed
    python3 bench/sweep.py --quick --outdir /tmp/sweep       # smoke test
"""

from __future__ import annotations

import csv
import math
import os
import sys
import time
from multiprocessing import Pool

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from malcolm import _argparse as g  # noqa: E402
from malcolm.policy.defaults import WINDOW_TASKS  # noqa: E402

WORKLOADS = ("exp:50", "bimodal", "hyperexp1", "hyperexp2", "rocksdb1", "rocksdb2")
POLICIES = (("malcolm", "malcolm"), ("frozen", "malcolm:learn=0"), ("jsq", "jsq"),
            ("jbt", "jbt"), ("po2", "po2"), ("cfcfs", "cfcfs"))
DEPLOYABLE = ("malcolm", "frozen", "jsq", "jbt", "po2")
BASELINES = ("jsq", "jbt", "po2")
# The ranges of the drawn loads and one-way delays (µs): the defaults of
# draw_scenarios and of --load-range / --delay-range
LOAD_RANGE = (0.3, 0.95)
DELAY_RANGE = (2.0, 10.0)


def draw_scenarios(count, seed, quick=False, loads=LOAD_RANGE, delays=DELAY_RANGE, speeds=None):
    """``count`` scenarios drawn from ``seed``: a list of dicts (simulate() arguments + id).

    ``loads`` and ``delays`` (one-way, µs) are the uniform draws' ranges; the defaults are the
    issue's, and other ranges reuse the same racks and workloads (the same draws in order).
    ``speeds`` (LO, HI) gives every server a speed factor, log-uniform in LO-HI to two
    significant digits, from a second stream: the other draws are the same with or without
    it. ``skew`` is then the capacity skew, workers x speed."""
    rng = np.random.default_rng([seed, 0x5EE9])
    # a stream of its own, so that --speeds leaves every other draw as it was
    rng_speed = np.random.default_rng([seed, 0x5BEED])
    out = []
    for i in range(count):
        hi_n = 8 if quick else 64
        n = int(round(math.exp(rng.uniform(math.log(2), math.log(hi_n)))))
        kind = rng.choice(["homogeneous", "two-class", "random"], p=[0.3, 0.4, 0.3])
        if kind == "homogeneous":
            workers = [int(rng.integers(1, 17))] * n
        elif kind == "two-class":
            skew = math.exp(rng.uniform(0, math.log(16)))
            small = int(rng.integers(1, max(2, int(16 / skew)) + 1))
            big = min(16, max(small + 1, int(round(small * skew))))
            n_big = int(rng.integers(1, n)) if n > 1 else 1
            workers = [big] * n_big + [small] * (n - n_big)
        else:
            workers = [int(w) for w in rng.integers(1, 17, n)]
        if quick:
            workers = [min(w, 4) for w in workers]
        spd = [1.0] * n
        if speeds is not None:
            spd = [float(f"{v:.2g}") for v in
                   np.exp(rng_speed.uniform(math.log(speeds[0]), math.log(speeds[1]), n))]
        rack = ",".join(f"1x{w}" if v == 1.0 else f"1x{w}@{v:g}"
                        for w, v in zip(workers, spd, strict=True))
        wl = WORKLOADS[int(rng.integers(0, len(WORKLOADS)))] if not quick else \
            WORKLOADS[i % len(WORKLOADS)]
        load = float(round(rng.uniform(loads[0], loads[1]), 3))
        delay = float(round(rng.uniform(delays[0], delays[1]), 2))
        # enough tasks for a stable p99 and ~0.2 s or more of learning at the heavier workloads
        caps = [w * v for w, v in zip(workers, spd, strict=True)]
        cap_w = sum(caps)
        tasks = int(min(400_000, max(80_000, 6_000 * cap_w))) if not quick else 20_000
        out.append(dict(id=i, rack=rack, n=n, kind=str(kind), skew=max(caps) / min(caps),
                        workers=sum(workers), workload=wl, load=load, delay_us=delay,
                        tasks=tasks))
    return out


def _run(job):
    from malcolm.sim import simulate

    sc, label, spec, seed = job
    t0 = time.time()
    r = simulate(rack=sc["rack"], policy=spec, workload=sc["workload"], load=sc["load"],
                 tasks=sc["tasks"], seed=seed, delay_us=sc["delay_us"], warmup=0.3,
                 window_us=sc.get("window_us", g.SIM_WINDOW_US), phase=sc.get("phase", "random"),
                 window_tasks=sc.get("window_tasks", WINDOW_TASKS),
                 sched=sc.get("sched", "fcfs"), quantum_us=sc.get("quantum_us", 0.0),
                 loss=sc.get("loss", 0.0))
    return dict(id=sc["id"], policy=label, p50_us=r.p50_us, p99_us=r.p99_us,
                mean_us=r.mean_us, migrations=r.migrations, generated=r.generated,
                wall_s=time.time() - t0)


def summarize(scen, res, labels=tuple(lab for lab, _ in POLICIES)):
    """Per-policy acceptance figures from ``res[(id, label)] = row``. ``labels`` may add
    references (``--reference``) to those of ``POLICIES``: they get the same figures,
    measured against the same best (of ``DEPLOYABLE``) and baselines, which they do not
    enter."""
    summ = {}
    for label in labels:
        if label == "cfcfs":
            continue
        best5 = c2 = c2_den = 0
        worst = 0.0
        for sc in scen:
            p = {k: res[(sc["id"], k)]["p99_us"] for k in labels}
            best = min(p[k] for k in DEPLOYABLE)
            if p[label] <= 1.05 * best:
                best5 += 1
            if any(p[k] <= 2 * p["cfcfs"] for k in DEPLOYABLE):
                c2_den += 1
                c2 += p[label] <= 2 * p["cfcfs"]
            worst = max(worst, p[label] / min(p[k] for k in BASELINES))
        summ[label] = dict(best5=best5 / len(scen), cfcfs2=c2 / c2_den if c2_den else float("nan"),
                           worst_vs_base=worst)
    het = [sc for sc in scen if sc["skew"] > 1]

    def med(sid, label, key="p99_us"):
        vals = [v[key] for (i, lab), v in res.items()
                if i == sid and (lab == label or lab.startswith(label + "@"))]
        return float(np.median(vals))

    wins = [med(sc["id"], "malcolm") / med(sc["id"], "frozen") for sc in het]
    # The mean latency beside the p99: where the p99 is the workload's own tail (a Bimodal
    # rack's 500 µs tasks plus their hops, a HyperExp-2 rack's 5 ms mode), the two p99s tie
    # whatever the queues do, and the mean says whether learning changed anything there.
    means = [med(sc["id"], "malcolm", "mean_us") / med(sc["id"], "frozen", "mean_us")
             for sc in het]
    nseeds = 1 + sum(1 for (i, lab) in res if het and i == het[0]["id"] and
                     lab.startswith("malcolm@"))
    summ["learn_vs_frozen"] = dict(
        het=len(het), wins=sum(w < 1 for w in wins) / len(het) if het else float("nan"),
        ties=sum(abs(w - 1) <= 0.001 for w in wins), exact=sum(w == 1.0 for w in wins),
        not_higher=sum(w <= 1 for w in wins) / len(het) if het else float("nan"), seeds=nseeds,
        worst_ratio=max(wins) if wins else float("nan"),
        best_ratio=min(wins) if wins else float("nan"),
        mean_lower=sum(m < 1 for m in means),
        ties_mean_lower=sum(m < 1 for w, m in zip(wins, means, strict=True)
                            if abs(w - 1) <= 0.001))
    return summ


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/sweep.py --quick
        python3 bench/sweep.py --tasks-mult 2 --hetero-seeds 3 --outdir docs/figures
        python3 bench/sweep.py --quick --procs 1 --json -
        python3 bench/sweep.py --sched ps --quantum 5us --tasks-mult 0.25""")
    ap.add_argument("--scenarios", type=int, default=60, help="scenarios to draw (default 60)")
    ap.add_argument("--seed", type=int, default=2026, help="draws the scenarios (fixed)")
    ap.add_argument("--sim-seed", type=int, default=1, help="seed of every simulation")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--quick", action="store_true", help="6 small scenarios, 20 000 tasks")
    ap.add_argument("--outdir", default=os.path.join("out", "sweep"), metavar="DIR",
                    help="directory of sweep.txt, sweep.csv and sweep.png (default out/sweep)")
    g.hidden_alias(ap, "--out", "outdir")
    ap.add_argument("--name", default="sweep", metavar="STEM",
                    help="file names STEM.txt, STEM.csv and STEM.png (default sweep)")
    g.add_json(ap, "every scenario and run")
    ap.add_argument("--malcolm", default="",
                    help="extra parameters for Malcolm (and its frozen copy), k=v,...")
    ap.add_argument("--tasks-mult", type=float, default=1.0, help="scale every task count")
    ap.add_argument("--load-range", dest="loads", type=g.numbers(float), metavar="LO,HI",
                    default=",".join(map(str, LOAD_RANGE)),
                    help="range of the drawn loads (default 0.3,0.95)")
    ap.add_argument("--delay-range", dest="delays", type=g.numbers(float), metavar="LO,HI",
                    default=",".join(map(str, DELAY_RANGE)),
                    help="range of the drawn one-way delays, µs (default 2,10): beyond the "
                         "issue's range with the same racks and workloads")
    ap.add_argument("--reference", action="append", default=[], metavar="POLICY",
                    help="also run POLICY (repeatable, e.g. sed): reported beside the others "
                         "and against Malcolm, but not in the best of the deployable policies "
                         "or the baselines")
    ap.add_argument("--speeds", type=g.numbers(float), metavar="LO,HI", default=None,
                    help="give each server a speed factor drawn log-uniformly from LO-HI "
                         "(e.g. 0.25,4; default: every server at speed 1)")
    g.add_window_phase(ap)
    ap.add_argument("--sched", choices=("fcfs", "ps"), default="fcfs",
                    help="scheduling inside every server (default fcfs; ps: processor "
                         "sharing, the ideal cFCFS reference staying FCFS)")
    ap.add_argument("--quantum", type=g.duration("us"), default=0.0, metavar="DURATION",
                    help="with --sched ps: the round-robin quantum (bare number: µs; default "
                         "0, ideal processor sharing)")
    ap.add_argument("--loss", type=float, default=0.0, metavar="L",
                    help="probability that each heartbeat is lost, 0 <= L < 1 (default 0; "
                         "tasks and steal messages are never lost)")
    ap.add_argument("--hetero-seeds", type=int, default=1,
                    help="simulation seeds for Malcolm and frozen on heterogeneous racks; the "
                         "learnt-vs-frozen comparison uses the median p99 over them")
    a = ap.parse_args(argv)
    g.json_stdout(a)
    if a.scenarios < 1 or a.procs < 1:
        ap.error("--scenarios and --procs must be >= 1")
    if len(a.loads) != 2 or len(a.delays) != 2 or not (0.0 < a.loads[0] <= a.loads[1] <= 2.0) \
            or not (0.0 <= a.delays[0] <= a.delays[1]):
        ap.error("--load-range needs LO,HI with 0 < LO <= HI <= 2, and --delay-range LO,HI "
                 "with 0 <= LO <= HI")
    if not a.name or os.sep in a.name or a.name.startswith("."):
        ap.error(f"--name must be a plain file stem, got {a.name!r}")
    if a.quantum and a.sched != "ps":
        ap.error("--quantum needs --sched ps")
    if not 0.0 <= a.loss < 1.0:
        ap.error(f"--loss must be at least 0 and below 1, got {a.loss:g}")
    if a.speeds is not None and (len(a.speeds) != 2 or not 0.01 <= a.speeds[0] <= a.speeds[1]
                                 <= 100):
        ap.error("--speeds needs LO,HI with 0.01 <= LO <= HI <= 100")
    scen = draw_scenarios(6 if a.quick else a.scenarios, a.seed, a.quick, a.loads, a.delays,
                          a.speeds)
    for sc in scen:
        sc["tasks"] = int(sc["tasks"] * a.tasks_mult)
        sc["window_us"] = a.window
        # --window W fixes every window at W (a study of the interval); at the default the
        # windows follow the task times as in `malcolm sim` (drv_window_ns)
        sc["window_tasks"] = WINDOW_TASKS if a.window == g.SIM_WINDOW_US else 0.0
        sc["phase"] = a.phase
        sc["sched"], sc["quantum_us"] = a.sched, a.quantum
        sc["loss"] = a.loss
    extra = a.malcolm.strip().strip(",")
    pols = [(label, (spec + ("," if ":" in spec else ":") + extra)
             if extra and spec.startswith("malcolm") else spec) for label, spec in POLICIES]
    refs = [(_label(spec), spec) for spec in a.reference]
    if len({lab for lab, _ in pols + refs}) != len(pols) + len(refs):
        ap.error("--reference: each policy once, and none of the sweep's own")
    pols += refs
    a.policies = [lab for lab, _ in pols]
    jobs = [(sc, label, spec, a.sim_seed) for sc in scen for label, spec in pols]
    if a.hetero_seeds < 1:
        ap.error("--hetero-seeds must be >= 1")
    for k in range(1, a.hetero_seeds):
        jobs += [(sc, label + f"@{k}", spec, a.sim_seed + k) for sc in scen if sc["skew"] > 1
                 for label, spec in pols if label in ("malcolm", "frozen")]
    # the slow ones first so that the pool ends together
    jobs.sort(key=lambda j: -(j[0]["tasks"] * (j[0]["n"] if j[1].startswith(("malcolm",
                                                                               "frozen")) else 1)))
    t0 = time.time()
    res = {}
    with Pool(a.procs) as pool:
        for k, row in enumerate(pool.imap_unordered(_run, jobs)):
            res[(row["id"], row["policy"])] = row
            print(f"[{k + 1}/{len(jobs)} {time.time() - t0:6.0f}s] scenario {row['id']:3d} "
                  f"{row['policy']:>8} p99 {row['p99_us']:10.1f} µs", file=sys.stderr)
    os.makedirs(a.outdir, exist_ok=True)
    write_outputs(a, scen, res, time.time() - t0)
    g.write_json(a, {"scenarios": scen, "runs": list(res.values())})


def _label(spec):
    """A column name for a policy spec: ``sed`` -> ``sed``, ``jbt:threshold=4`` ->
    ``jbt_threshold_4``."""
    return "".join(ch if ch.isalnum() else "_" for ch in spec.strip())


def write_outputs(a, scen, res, wall):
    labels = a.policies
    refs = labels[len(POLICIES):]
    summ = summarize(scen, res, labels)
    with open(os.path.join(a.outdir, a.name + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "rack", "n", "kind", "skew", "workload", "load", "delay_us", "tasks",
                    *[f"p99_{k}" for k in labels], *[f"p50_{k}" for k in labels],
                    "mig_frac_malcolm"])
        for sc in scen:
            r = {k: res[(sc["id"], k)] for k in labels}
            w.writerow([sc["id"], sc["rack"], sc["n"], sc["kind"], f"{sc['skew']:.2f}",
                        sc["workload"], sc["load"], sc["delay_us"], sc["tasks"],
                        *[f"{r[k]['p99_us']:.1f}" for k in labels],
                        *[f"{r[k]['p50_us']:.1f}" for k in labels],
                        f"{r['malcolm']['migrations'] / max(1, r['malcolm']['generated']):.3f}"])
    ranges = "" if (tuple(a.loads), tuple(a.delays)) == (LOAD_RANGE, DELAY_RANGE) else \
        f", loads {a.loads[0]:g}-{a.loads[1]:g}, delays {a.delays[0]:g}-{a.delays[1]:g} µs"
    if a.window != g.SIM_WINDOW_US:
        ranges += f", window {a.window:g} µs"
    if a.phase != "random":
        ranges += f", {a.phase} window phases"
    if a.sched == "ps":
        ranges += (f", processor sharing (quantum {a.quantum:g} µs)" if a.quantum else
                   ", ideal processor sharing")
    if a.loss:
        ranges += f", {a.loss:g} of the heartbeats lost"
    if a.speeds is not None:
        ranges += f", server speeds {a.speeds[0]:g}-{a.speeds[1]:g}"
    lines = [f"Sweep: {len(scen)} scenarios from seed {a.seed}{ranges}, simulation seed "
             f"{a.sim_seed}{' (--quick)' if a.quick else ''}; {wall:.0f} s wall with "
             f"{a.procs} processes.",
             "",
             "| policy | best or within 5% | p99 within 2x cFCFS | worst p99 / best of "
             "JSQ, JBT, po2 |",
             "|---|---|---|---|"]
    for label in labels:
        if label == "cfcfs":
            continue
        s = summ[label]
        name = f"{label} (reference)" if label in refs else label
        lines.append(f"| {name} | {100 * s['best5']:.0f}% | {100 * s['cfcfs2']:.0f}% | "
                     f"{s['worst_vs_base']:.2f} |")
    lf = summ["learn_vs_frozen"]
    lines += ["", f"Learnt vs frozen initial policy on the {lf['het']} heterogeneous racks "
              f"(median p99 over {lf['seeds']} simulation seed(s)): learnt lower in "
              f"{100 * lf['wins']:.0f}%, equal within 0.1% in {lf['ties']}; learnt/frozen "
              f"from {lf['best_ratio']:.3f} to {lf['worst_ratio']:.3f}. Exactly equal in "
              f"{lf['exact']}: not higher in {100 * lf['not_higher']:.0f}%. Mean latency: "
              f"learnt lower on {lf['mean_lower']} of {lf['het']}, and on {lf['ties_mean_lower']}"
              f" of the {lf['ties']} whose p99s are within 0.1%."]
    for ref in refs:
        q = [res[(sc["id"], "malcolm")]["p99_us"] / res[(sc["id"], ref)]["p99_us"]
             for sc in scen]
        lines += ["", f"Malcolm against {ref} (a reference): p99 lower by more than 5% in "
                  f"{sum(x < 1 / 1.05 for x in q)} of {len(q)}, higher by more than 5% in "
                  f"{sum(x > 1.05 for x in q)}; malcolm / {ref} from {min(q):.2f} to "
                  f"{max(q):.2f}, geometric mean {math.exp(np.mean(np.log(q))):.3f}."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.outdir, a.name + ".txt"), "w") as f:
        f.write(text)
    print(text)
    _plot(scen, res, os.path.join(a.outdir, a.name + ".png"),
          "" if a.speeds is None else f", server speeds {a.speeds[0]:g}-{a.speeds[1]:g}", refs)


def _plot(scen, res, path, what="", refs=()):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = np.arange(len(scen))
    order = sorted(range(len(scen)), key=lambda i: scen[i]["load"])
    marks = {"malcolm": "o", "frozen": "x", "jsq": "s", "jbt": "^", "po2": "v"}
    marks.update({ref: m for ref, m in zip(refs, "+d*Ph", strict=False)})
    for label, m in marks.items():
        y = [res[(scen[i]["id"], label)]["p99_us"] / res[(scen[i]["id"], "cfcfs")]["p99_us"]
             for i in order]
        ax.scatter(x, y, marker=m, s=18 if label != "malcolm" else 26, label=label,
                   alpha=0.85 if label == "malcolm" else 0.6)
    ax.axhline(2.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("scenario (sorted by load)")
    ax.set_ylabel("p99 / ideal cFCFS p99")
    ax.set_title("Robustness sweep" + what + ": p99 relative to the ideal centralized FCFS",
                 fontsize=10 if what else None)
    ax.legend(ncol=5, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
