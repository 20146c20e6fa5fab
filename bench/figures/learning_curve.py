"""Learning curve: imbalance and p99 per 10 ms window, Malcolm from its initial policy.

Shows whether learning produces the result rather than a fixed rule: the same initial
parameters are run twice, learning (``malcolm``) and frozen (``malcolm:learn=0``),
next to JSQ as a fixed-rule reference. Imbalance is I(x) = 1/(N-1) sum_{j,k} |x_j - x_k|
over the loads the simulator records at each window (µs), averaged per 10 ms. p99 per
10 ms groups tasks by their creation time, estimated from their creation index and the
arrival rate (exact on average; off by about sqrt(i)/rate, under 1 ms here).

"Settled" (printed, and in ``learning_curve_settle.csv``) is the start of the first bin from
which the imbalance's 3-bin (30 ms) moving average stays within 1.1x (+1 µs) of the mean of
the run's last 10% for the rest of the run: the time to settle from a cold start. With
``--reference-tasks N`` the same rule is also applied against the mean of 25%-100% of an
N-task run of the same series and seed (``settled_ref_ms``), a level that the last 10% of a
300 000-task run (27 ms) estimates only to within a few per cent.

Writes ``learning_curve.csv`` and ``learning_curve.png``.

    python3 bench/figures/learning_curve.py [--outdir out/figures] [--quick] [--servers 2x14,9x4]
"""

import os
import sys

import numpy as np
from common import parse, parser, png, write_json, write_rows_csv

from malcolm import _argparse as g
from malcolm.sim import simulate


def settle_ms(tm, imb, bin_ms, ref=None):
    """Start of the first bin after which imbalance stays within 1.1x (+1 µs) of the last
    10%'s mean (or of ``ref``); inf if only the last bins do."""
    q = max(1, len(imb) // 10)
    thr = 1.1 * float(np.mean(imb[-q:]) if ref is None else ref) + 1.0
    ma = np.convolve(imb, np.ones(3) / 3, mode="same")
    ma[0], ma[-1] = imb[0], imb[-1]
    bad = np.nonzero(ma > thr)[0]
    first = 0 if not len(bad) else int(bad[-1]) + 1
    if first >= len(imb) - q:
        return float("inf")
    return float(tm[first] - bin_ms / 2)


def run_binned(a, pol, tasks):
    """One run's imbalance per bin: (result, imbalance per bin, bins)."""
    r = simulate(rack=a.rack, policy=pol, workload="exp:50", load=a.load, tasks=tasks,
                 seed=a.seed, warmup=0.0, record_loads=True)
    t = r.loads["t_us"]
    L = r.loads.get("true_load_us", r.loads["load_us"])
    # Whole bins only: a run stops a fraction of a bin after the last full one, and a
    # sliver of a bin (0.5 ms of 10 at 300 ms) is as noisy as a few windows. It sat last,
    # where settle_ms reads it alone, and alone it could call a settled run never settled.
    nb = max(1, int(r.sim_time_s * 1000.0 // a.bin_ms))
    keep = t < nb * a.bin_ms * 1000.0
    t, L = t[keep], L[keep]
    n = L.shape[1]
    imb = np.abs(L[:, :, None] - L[:, None, :]).sum(axis=(1, 2)) / (n - 1)
    b = (t // (a.bin_ms * 1000)).astype(int)
    return r, np.bincount(b, imb, nb) / np.maximum(np.bincount(b, None, nb), 1), nb


def main():
    ap = parser(__doc__, tasks=2_000_000, name="learning_curve", examples="""
        python3 bench/figures/learning_curve.py --quick --seed 2
        python3 bench/figures/learning_curve.py --servers homo --load 0.7 --bin 5ms""")
    ap.add_argument("--servers", type=g.servers, default="2x14,9x4", metavar="SPEC",
                    help="the rack: a spec (2x14,9x4) or a preset, homo (8x8) or hetero "
                         "(2x14,9x4; the default)")
    ap.add_argument("--load", type=float, default=0.85,
                    help="load, a fraction of the rack's capacity (default 0.85)")
    ap.add_argument("--bin", dest="bin_ms", type=g.duration("ms", positive=True), default=10.0,
                    metavar="DURATION", help="width of a bin (bare number: ms; default 10ms)")
    ap.add_argument("--malcolm", default="", metavar="KEY=VAL,...",
                    help="extra parameters for both Malcolm series, e.g. actor_lr=0.01")
    ap.add_argument("--reference-tasks", type=int, default=0, metavar="N",
                    help="also settle against the mean of 25%%-100%% of an N-task run of the "
                         "same series (e.g. 1000000; default 0: off)")
    g.hidden_alias(ap, "--rack", "servers", type=g.servers)
    g.hidden_alias(ap, "--bin-ms", "bin_ms", type=g.duration("ms", positive=True))
    a = parse(ap)
    a.rack = a.servers
    tasks = min(a.tasks, 300_000) if a.quick else a.tasks
    extra = a.malcolm.strip().strip(",")
    series = [("Malcolm (learning)", "malcolm" + (f":{extra}" if extra else "")),
              ("Malcolm frozen at init", "malcolm:learn=0" + (f",{extra}" if extra else "")),
              ("JSQ", "jsq")]
    if a.reference_tasks < 0:
        ap.error("--reference-tasks must be >= 0")
    rows, curves, settle = [], {}, []
    for label, pol in series:
        r, imb_bin, nb = run_binned(a, pol, tasks)
        rate = r.offered / 1e6                       # tasks per µs
        created_ms = np.arange(len(r.latencies_us)) / rate / 1000.0
        lb = (created_ms // a.bin_ms).astype(int)
        p99 = np.full(nb, np.nan)
        for k in range(min(nb, lb.max() + 1)):
            seg = r.latencies_us[lb == k]
            if len(seg) >= 100:
                p99[k] = np.quantile(seg, 0.99)
        tm = (np.arange(nb) + 0.5) * a.bin_ms
        curves[label] = (tm, imb_bin, p99)
        for i in range(nb):
            rows.append(dict(policy=label, t_ms=tm[i], imbalance_us=imb_bin[i], p99_us=p99[i]))
        q = max(1, nb // 10)
        settled = settle_ms(tm, imb_bin, a.bin_ms)
        settle.append(dict(policy=label, seed=a.seed, rack=a.rack, load=a.load,
                           settled_ms=settled, imbalance_last10_us=float(np.mean(imb_bin[-q:])),
                           p99_us=r.p99_us))
        if a.reference_tasks:
            _, ib_ref, nr = run_binned(a, pol, a.reference_tasks)
            ref = float(np.mean(ib_ref[nr // 4:]))
            settle[-1].update(ref_imbalance_us=ref,
                              settled_ref_ms=settle_ms(tm, imb_bin, a.bin_ms, ref))
            print(f"{label:>24}: against the {a.reference_tasks}-task run's level {ref:.1f} µs "
                  f"settled after {settle[-1]['settled_ref_ms']:.0f} ms", file=sys.stderr)
        print(f"{label:>24}: settled after {settled:.0f} ms; first 10% imbalance "
              f"{np.nanmean(imb_bin[:q]):8.1f} µs, "
              f"p99 {np.nanmean(p99[:q]):8.1f} µs; last 10% imbalance "
              f"{np.nanmean(imb_bin[-q:]):8.1f} µs, p99 {np.nanmean(p99[-q:]):8.1f} µs",
              file=sys.stderr)
    os.makedirs(a.outdir, exist_ok=True)
    for name, data in (("learning_curve.csv", rows), ("learning_curve_settle.csv", settle)):
        write_rows_csv(os.path.join(a.outdir, name), data)
    write_json(a, settle=settle, rows=rows)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for label, (tm, imb, p99) in curves.items():
        ax1.plot(tm, imb, lw=1, label=label)
        ax2.plot(tm, p99, lw=1, label=label)
    ax1.set_ylabel("imbalance I(x) (µs)")
    ax2.set_ylabel(f"p99 per {a.bin_ms:g} ms (µs)")
    ax2.set_xlabel("time (ms)")
    for ax in (ax1, ax2):
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    ax1.legend(fontsize=8)
    ax1.set_title(f"Learning curve: rack {a.rack}, Exp(50), {a.load:.0%} load, "
                  f"seed {a.seed}")
    fig.tight_layout()
    fig.savefig(png(a, "learning_curve"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
