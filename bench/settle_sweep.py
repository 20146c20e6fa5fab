"""Cold-start settle times over randomly drawn heterogeneous racks (issue 12, item 4).

``bench/figures/learning_curve.py`` measures one rack; this draws ``--count`` racks from
``--draw`` (its own generator: no doc's rack is drawn on purpose): 2-4 sizes of server from 1,
2, 3, 4, 6, 8, 12 and 16 workers, 1-10 servers of each, 3-24 servers in all, loads 0.7-0.9,
Exp(50) and the 2 µs one-way delay, as the learning curve. For each rack and ``--policies``
entry it runs the learning curve's pair of runs: ``--ms`` of arrivals from a cold start,
binned by 10 ms, and a ``--ref-ms`` run of the same seed whose mean imbalance over its last
three quarters is the level to settle to. The settle time is the learning curve's reference
rule (``learning_curve.settle_ms``): the start of the first bin after which the 3-bin moving
average of the imbalance stays within 1.1x (+1 µs) of that level; "never" where only the
last bins do. Printed: per rack the settle time of each policy, then per policy the share of
racks settled within 50 and 100 ms, the median and the racks never settled. About a minute
for 30 racks and one policy with two processes on an idle 2-core machine::

    python3 bench/settle_sweep.py --draw 1206 --count 30
    python3 bench/settle_sweep.py --policies "malcolm;malcolm:beta2_decay=0.8" --json out.json

With ``--seeds 1,2,3`` every rack runs each seed, and the rule is also applied to the
seed-mean curve (the mean imbalance per bin over the seeds, against the mean of their
levels): the settle of the expected curve, which one run's noise cannot push past 50 ms.
A small rack's 3-bin average crosses 1.1x on its own noise. A policy that learns nothing
(``malcolm:learn=0``, whose curve has nothing to settle) is the control: its per-seed misses
are the rule's, not learning's::

    python3 bench/settle_sweep.py --draw 71207 --seeds 1,2,3 --policies "malcolm;malcolm:learn=0"

``--racks "2x16,14x1@0.8;2x14,9x4@0.85"`` runs the racks named (``SPEC@LOAD``, Exp(50) at
that load) instead of a draw.
"""
import argparse
import os
import sys
from multiprocessing import Pool
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "figures"))
from learning_curve import run_binned, settle_ms  # noqa: E402

from malcolm import _argparse as g  # noqa: E402
from malcolm.sim.rack import parse_rack_spec  # noqa: E402

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
BIN_MS = 10.0


def draw(count, seed):
    """``count`` (rack spec, load) pairs from ``seed``."""
    rng = np.random.default_rng([seed, 0x5E77])
    out = []
    while len(out) < count:
        kinds = int(rng.integers(2, 5))
        sizes = rng.choice(SIZES, size=kinds, replace=False)
        counts = rng.integers(1, 11, size=kinds)
        if not 3 <= counts.sum() <= 24:
            continue
        out.append((",".join(f"{c}x{s}" for c, s in zip(counts, sizes, strict=True)),
                    float(round(rng.uniform(0.7, 0.9), 3))))
    return out


def rack_list(text):
    """An argparse ``type``: ``SPEC@LOAD`` racks, ';'-separated (loads in (0, 1])."""
    out = []
    for part in (p.strip() for p in str(text).split(";")):
        spec, at, load = part.rpartition("@")
        try:
            load_f = g.ascii_number(load)
            if not at or not 0 < load_f <= 1:
                raise ValueError
            parse_rack_spec(spec)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not SPEC@LOAD (a rack spec such as 2x16,14x1, and a load in "
                f"(0, 1])") from None
        out.append((spec, load_f))
    return out


def _settle(job):
    """One rack, policy and seed: (settle ms, reference imbalance µs, p99 µs of the short
    run, imbalance per bin of the short run)."""
    rack, load, pol, seed, ms, ref_ms = job
    workers = sum(parse_rack_spec(rack).workers)
    per_ms = workers * load * 1000.0 / 50.0          # arrivals a ms of Exp(50) at this load
    a = SimpleNamespace(rack=rack, load=load, seed=seed, bin_ms=BIN_MS)
    r, imb, nb = run_binned(a, pol, max(1000, int(ms * per_ms)))
    _, ref_imb, nr = run_binned(a, pol, max(1000, int(ref_ms * per_ms)))
    ref = float(np.mean(ref_imb[nr // 4:]))
    tm = (np.arange(nb) + 0.5) * BIN_MS
    return job, (settle_ms(tm, imb, BIN_MS, ref), ref, float(r.p99_us), imb)


def mean_curve_settle(runs):
    """The rule on the seeds' mean curve: ``runs`` are ``_settle`` results of one rack and
    policy; the curves are cut to the shortest (a fixed task count ends at slightly
    different times)."""
    nb = min(len(v[3]) for v in runs)
    imb = np.mean([v[3][:nb] for v in runs], axis=0)
    ref = float(np.mean([v[1] for v in runs]))
    return settle_ms((np.arange(nb) + 0.5) * BIN_MS, imb, BIN_MS, ref)


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/settle_sweep.py
        python3 bench/settle_sweep.py --draw 7 --count 20 --policies "malcolm;malcolm:learn=0"
        python3 bench/settle_sweep.py --draw 71207 --seeds 1,2,3
        python3 bench/settle_sweep.py --racks "2x16,14x1@0.8" --seeds 1,2,3,4,5 --ms 400
        """)
    ap.add_argument("--draw", type=int, default=1206, help="the racks' seed (1206)")
    ap.add_argument("--count", type=int, default=30, help="racks (default 30)")
    ap.add_argument("--racks", type=rack_list, default=None, metavar="SPEC@LOAD;...",
                    help="these racks instead of a draw: ';'-separated, e.g. 2x16,14x1@0.8")
    ap.add_argument("--seed", type=int, default=1, help="simulation seed (1)")
    ap.add_argument("--seeds", type=g.seeds, default=None, metavar="S,S,... or LO-HI",
                    help="several simulation seeds (instead of --seed), and the rule on "
                         "their mean curve")
    ap.add_argument("--policies", default="malcolm", help="';'-separated (default malcolm)")
    ap.add_argument("--ms", type=float, default=300.0,
                    help="ms of arrivals from the cold start (300)")
    ap.add_argument("--ref-ms", type=float, default=1200.0,
                    help="ms of arrivals of the reference run (1200)")
    ap.add_argument("--procs", type=int, default=2, help="processes (default 2)")
    g.add_json(ap, "the racks and settle times (never: null)")
    a = ap.parse_args(argv)
    g.json_stdout(a)
    from malcolm.sim import check_policies

    pols = g.checked(ap, "--policies", check_policies, a.policies)
    seeds = a.seeds if a.seeds is not None else [a.seed]
    if a.count < 1 or a.procs < 1 or not pols or not 0 < a.ms < a.ref_ms:
        ap.error("--count, --procs >= 1, a policy, and 0 < --ms < --ref-ms")
    racks = a.racks if a.racks is not None else draw(a.count, a.draw)
    origin = (f"{len(racks)} rack{'s' if len(racks) > 1 else ''}" if a.racks is not None
              else f"{a.count} racks from draw {a.draw}")
    jobs = [(rk, ld, p, s, a.ms, a.ref_ms) for rk, ld in racks for p in pols for s in seeds]
    with Pool(a.procs) as pool:
        res = {j[:4]: v for j, v in pool.map(_settle, jobs, chunksize=1)}
    several = len(seeds) > 1
    print(f"{origin}, seed{'s' if several else ''} "
          f"{','.join(map(str, seeds))}: cold-start settle (ms) by the reference rule"
          f"{' (per seed, then m: the mean curve)' if several else ''}; {' | '.join(pols)}")
    mean_st = {(rk, ld, p): mean_curve_settle([res[(rk, ld, p, s)] for s in seeds])
               for rk, ld in racks for p in pols}
    for rk, ld in racks:
        cells = (" ".join(f"{res[(rk, ld, p, s)][0]:4.0f}" for s in seeds)
                 + (f" m{mean_st[(rk, ld, p)]:4.0f}" if several else "") for p in pols)
        print(f"{rk:>30} {ld:.3f} " + " | ".join(cells))
    summary = {}
    for p in pols:
        st = np.array([res[(rk, ld, p, s)][0] for rk, ld in racks for s in seeds])
        summary[p] = s = dict(within_50ms=float(np.mean(st <= 50)),
                              within_100ms=float(np.mean(st <= 100)),
                              median_ms=float(np.median(st)), never=int(np.sum(~np.isfinite(st))))
        runs = f"{len(st)} runs" if several else f"{len(st)}"
        line = (f"{p}: within 50 ms {s['within_50ms']:.0%}, within 100 ms "
                f"{s['within_100ms']:.0%}, median {s['median_ms']:.0f} ms, never settled "
                f"{s['never']} of {runs}")
        if several:
            mt = np.array([mean_st[(rk, ld, p)] for rk, ld in racks])
            s.update(mean_curve_within_50ms=float(np.mean(mt <= 50)),
                     mean_curve_median_ms=float(np.median(mt)))
            line += (f"; the mean curve within 50 ms on {int(np.sum(mt <= 50))} of {len(mt)} "
                     f"racks, median {s['mean_curve_median_ms']:.0f} ms")
        print(line)
    if a.json:
        def row(rk, ld, p):
            per = {s: dict(zip(("settle_ms", "ref_imbalance_us", "p99_us"),
                               res[(rk, ld, p, s)][:3], strict=True)) for s in seeds}
            if not several:
                return per[seeds[0]]
            return dict(seeds=per, mean_curve_settle_ms=mean_st[(rk, ld, p)])
        g.write_json(a, dict(summary=summary, seeds=seeds, racks=[
            dict(rack=rk, load=ld, **{p: row(rk, ld, p) for p in pols}) for rk, ld in racks]))


if __name__ == "__main__":
    main()
