"""Thesis Figs 7.3 and 7.4, runtime side: p99 against load on a real local rack serving
RocksDB GET(n) (the ``rocksdb`` handler), for Malcolm, JSQ, JBT and client power-of-2, next to
the simulator's twin of the same rack.

Every server is a ``malcolm serve`` process with the ``rocksdb`` handler on one shared
1 000 000-key dictionary of 16-byte values (built first if missing); the load generator's
native client sends ``--app`` requests (every value checked). The experiment runner
(:mod:`malcolm.loadgen.experiment`) runs it: time dilation ``K`` (``--dilate auto``: the
smallest K at which a calibration run kept time, one rung up; the handler does the real GET
and pads it to K x a draw from the warm back-to-back cost of GET(n) (``--pad warm``, the
default: measured once, by this script before the racks start, with ``malcolm rocksdb
calibrate``'s loop, or read from ``--warm FILE``; every server pads to that distribution and
the runner's nominal workload is the same one, ``rocksdb1-measured:FILE``; ``--pad cpu``: K x
the GET's own CPU time, which grows with the idle gap before it), the window, steal timeout
and network delay are dilated by K,
latencies reported /K), the policies' racks interleaved at every load, ``--repeat`` fresh
racks, medians of p99 with a distribution-free CI, runs that did not measure what they claim
(generator late, effective load off, timeouts, a wrong value) flagged and kept out, and the
simulator's twin (``--app``-measured workload, same rack, measured service times and costs)
at each point's effective load. Load = effective load: arrival rate x measured mean service
time / workers. Homogeneous: 3 servers x 1 worker. Heterogeneous: 1 x 2 + 2 x 1 workers.

Writes ``fig7_3_rack.{csv,png}``, ``fig7_4_rack.{csv,png}`` and ``fig7_3_4_rack.json`` (every
run, flags included).

    python3 bench/figures/fig7_3_4_rack.py [--outdir DIR] [--db PATH] [--app rocksdb1]
        [--load 0.5,0.7,0.85] [--repeat 3] [--dilate auto|K] [--duration 2s]
        [--servers homo|hetero|SPEC] [--pad warm|cpu] [--warm FILE]
"""

import argparse
import csv
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from malcolm import _argparse as g  # noqa: E402

# this script's presets: racks small enough for a few cores
RACKS = {"homo": ("fig7_3_rack", [1, 1, 1], "homogeneous 3 x 1 worker"),
         "hetero": ("fig7_4_rack", [2, 1, 1], "heterogeneous 1 x 2 + 2 x 1 workers")}
RACK_TITLES = {tuple(w): t for _, w, t in RACKS.values()}


def servers(text):
    """``--servers``: homo, hetero or COUNTxWORKERS,... -> (figure name, workers, title)."""
    if text in RACKS:
        return RACKS[text]
    spec = g.servers(text)
    if "@" in spec:
        raise argparse.ArgumentTypeError("a real rack has no server speeds (@SPEED)")
    workers = [int(w) for grp in spec.split(",") for n, w in [grp.split("x")]
               for _ in range(int(n))]
    return (f"fig7_3_4_rack_{spec.replace(',', '+')}", workers, spec)
POLICIES = ("malcolm", "jsq", "jbt", "po2")
LABELS = {"malcolm": "Malcolm", "jsq": "JSQ", "jbt": "JBT", "po2": "client po2"}


def dilate_arg(text):
    """``--dilate``: auto or a number in [1, 10000] (the runner's own check)."""
    from malcolm.loadgen.method import parse_dilation
    try:
        return parse_dilation(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main():
    ap = g.parser(__doc__, """
        python3 bench/figures/fig7_3_4_rack.py --servers hetero --load 0.5,0.7 --repeat 1
        python3 bench/figures/fig7_3_4_rack.py --servers 2x2 --app rocksdb2 --json -""")
    ap.add_argument("--outdir", default=os.path.join("out", "figures"), metavar="DIR",
                    help="directory of the CSV, PNG and JSON files (default out/figures)")
    ap.add_argument("--db", default=os.path.join(tempfile.gettempdir(), "malcolm-kv-1m"),
                    help="the RocksDB dictionary (built if missing)")
    ap.add_argument("--app", default="rocksdb1", choices=("rocksdb1", "rocksdb2"),
                    help="the request mix (default rocksdb1)")
    ap.add_argument("--load", type=g.loads, action="extend", default=None, metavar="LOADS",
                    help="effective loads, fractions of the nominal capacity: 0.5,0.7 or "
                         "0.5:0.9:0.1 (default 0.5,0.7,0.85); repeatable")
    ap.add_argument("--policies", default=",".join(POLICIES), metavar="LIST",
                    help="comma-separated, of " + ", ".join(POLICIES) + " (default all)")
    ap.add_argument("--repeat", type=int, default=3, metavar="N",
                    help="fresh racks per policy and load (default 3)")
    ap.add_argument("--dilate", type=dilate_arg, default="auto", metavar="auto|K",
                    help="time dilation (default auto: calibrated)")
    ap.add_argument("--duration", type=g.duration("s", positive=True), default=2.0,
                    metavar="DURATION", help="measured real time per run (bare number: s; "
                                             "default 2s)")
    ap.add_argument("--warmup", type=g.duration("s"), default=0.5, metavar="DURATION",
                    help="real time before each measurement (bare number: s; default 500ms)")
    ap.add_argument("--window", dest="window_us", type=g.duration("us", positive=True),
                    default=100.0, metavar="DURATION",
                    help="the rack's window at rack scale, dilated by K (bare number: µs; "
                         "default 100us, the simulator figures')")
    ap.add_argument("--servers", action="append", type=servers, default=None, metavar="SPEC",
                    help="the rack: homo (3 x 1 worker), hetero (1 x 2 + 2 x 1) or "
                         "COUNTxWORKERS,...; repeatable (default: both presets)")
    ap.add_argument("--pad", choices=("warm", "cpu"), default="warm",
                    help="what a dilated GET is padded to: K x a draw from the warm "
                         "back-to-back cost (default) or K x its own CPU time")
    ap.add_argument("--warm", metavar="FILE",
                    help="--pad warm: the warm cost, a `malcolm rocksdb calibrate --json` "
                         "file (default: measure it first, 5000 GETs per size, and write "
                         "OUTDIR/rocksdb-warm.json)")
    ap.add_argument("--no-sim", dest="sim", action="store_false",
                    help="skip the simulator twin")
    ap.add_argument("--replot", metavar="JSON",
                    help="redraw the PNGs from this script's JSON output, run nothing")
    g.add_json(ap, "every row and run")
    g.hidden_alias(ap, "--out", "outdir")
    g.hidden_alias(ap, "--loads", "load", type=g.loads, action="extend")
    g.hidden_alias(ap, "--window-us", "window_us", type=g.duration("us", positive=True))
    g.hidden_alias(ap, "--rack", "rack_old", choices=("homo", "hetero", "both"))
    a = ap.parse_args()
    g.json_stdout(a)
    if a.replot:
        return replot(a.replot, a.outdir)
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        ap.error(f"--policies: unknown {', '.join(bad) or '(none)'}; choose from "
                 f"{', '.join(POLICIES)}")
    if a.repeat < 1:
        ap.error("--repeat must be >= 1")
    old = getattr(a, "rack_old", None)
    racks = a.servers or [RACKS[k] for k in ("homo", "hetero") if old in (None, k, "both")]
    from malcolm.loadgen import apps
    from malcolm.loadgen.experiment import Experiment, ExperimentError, format_row
    from malcolm.workers import rocksdb as rdb
    if not os.path.exists(os.path.join(a.db, "CURRENT")):
        print(f"building {a.db}", file=sys.stderr)
        rdb.load(a.db, 1_000_000, 16)
    db = rdb.open_handler(f"path={a.db}")
    app = apps.parse_app(a.app, db.n_keys, db.value_size)
    loads = a.load or [0.5, 0.7, 0.85]
    os.makedirs(a.outdir, exist_ok=True)
    workload = f"{a.app}-measured"
    warm = ""
    if a.pad == "warm":
        path = a.warm or os.path.join(a.outdir, "rocksdb-warm.json")
        if not a.warm:
            from malcolm.loadgen import rocksdb_calibrate as cal
            print(f"measuring the warm GET cost -> {path}", file=sys.stderr)
            res = cal.calibrate(db, sorted({n for _, n in app.mix}), samples=5000, warmup=5000)
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
        workload = f"{a.app}-measured:{os.path.abspath(path)}"
        try:
            from malcolm.workloads import parse_workload
            print(f"warm cost: {parse_workload(workload).mean_us:.1f} µs per {a.app} GET "
                  f"(mean, CPU time, back to back) from {path}", file=sys.stderr)
        except ValueError as e:
            sys.exit(f"fig7_3_4_rack: --warm: {e}")
        warm = f",warm={os.path.abspath(path)}"

    def handler(k):
        return f"rocksdb:path={a.db}" + (f",dilate={k:g},pad={a.pad}{warm}" if k > 1 else "")

    def echo(line):
        print(line, file=sys.stderr, flush=True)

    everything = []
    for name, workers, title in racks:
        echo(f"== {name}: {title}, {a.app}")
        exp = Experiment(workers, workload=workload, policies=policies,
                         loads=loads, repeat=a.repeat, duration_s=a.duration,
                         warmup_s=a.warmup, window_us=a.window_us, dilate=a.dilate,
                         compare_sim=a.sim, handler=handler, app=app, echo=echo)
        try:
            res = exp.run()
        except ExperimentError as e:
            sys.exit(f"fig7_3_4_rack: {e}")
        rows = res["rows"]
        for r in rows:
            echo(format_row(r))
        for r in res["runs"]:
            r.pop("_delta", None)
        with open(os.path.join(a.outdir, f"{name}.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["policy", "load", "effective_load", "p99_us", "p99_ci_lo_us",
                        "p99_ci_hi_us", "ci_coverage", "p50_us", "sim_p99_us", "runs_used",
                        "runs", "valid", "flagged", "migrations_per_task", "steals_per_task",
                        "dilate", "pad", "overruns", "padded"])
            for r in rows:
                w.writerow([LABELS.get(r["policy"], r["policy"]), r["load"],
                            _r(r["effective_load"]), _r(r["p99_us"]), _r(r["p99_ci_us"][0]),
                            _r(r["p99_ci_us"][1]), _r(r["ci_coverage"]), _r(r["p50_us"]),
                            _r(r.get("sim_p99_us")), r["used"], r["repeats"], r["valid"],
                            len(r["flagged"]), _r(r["migrations_per_task"]),
                            _r(r["steals_per_task"]), res["dilate"], a.pad,
                            r.get("overruns", 0), r.get("padded", 0)])
        fig = {"figure": name, "workers": workers, "app": a.app, "pad": a.pad,
               "command": " ".join(sys.argv), **res}
        _plot(rows, os.path.join(a.outdir, f"{name}.png"), _title(fig, res))
        everything.append(fig)
    g.write_json(a, {"runs": everything}, os.path.join(a.outdir, "fig7_3_4_rack.json"))
    g.write_json(a, {"runs": everything})


def _title(fig, res):
    return (f"{fig['figure'].replace('fig', 'Fig ').replace('_', '.', 1)}: real rack, "
            f"{RACK_TITLES.get(tuple(fig['workers']), fig['workers'])}, {fig['app']}, "
            f"K={res['dilate']:g}, pad={fig.get('pad', 'cpu')}\nsolid: runtime, median p99 "
            "and CI; dashed: simulator twin; x: no clean run")


def replot(path, outdir):
    """Redraw every figure of a ``fig7_3_4_rack.json``."""
    try:
        with open(path) as f:
            figs = json.load(f)["runs"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"fig7_3_4_rack: cannot read {path}: {e}")
    os.makedirs(outdir, exist_ok=True)
    for fig in figs:
        _plot(fig["rows"], os.path.join(outdir, f"{fig['figure']}.png"), _title(fig, fig))


def _r(v, d=4):
    return round(v, d) if isinstance(v, float) and math.isfinite(v) else v


def _plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, p in enumerate(dict.fromkeys(r["policy"] for r in rows)):
        pts = sorted((r for r in rows if r["policy"] == p), key=lambda r: r["load"])
        c = f"C{i}"
        # at the load measured (the twin ran there too), not the target
        x = [r["effective_load"] if math.isfinite(r["effective_load"]) else r["load"]
             for r in pts]
        y = [r["p99_us"] for r in pts]
        err = [[max(0.0, r["p99_us"] - r["p99_ci_us"][0]) for r in pts],
               [max(0.0, r["p99_ci_us"][1] - r["p99_us"]) for r in pts]]
        ax.errorbar(x, y, yerr=err, color=c, marker="o", ms=3, capsize=2,
                    label=LABELS.get(p, p))
        for xi, r in zip(x, pts, strict=True):
            if not r["valid"]:
                ax.plot([xi], [r["p99_us"]], "x", color=c, ms=8)
        sim = [(xi, r.get("sim_p99_us")) for xi, r in zip(x, pts, strict=True)
               if r.get("sim_p99_us")]
        if sim:
            ax.plot([s[0] for s in sim], [s[1] for s in sim], "--", color=c, alpha=0.7)
    ax.set_yscale("log")
    ax.set_xlabel("effective load (median over the runs used)")
    ax.set_ylabel("p99 latency (µs, rack time)")
    ax.set_title(title, fontsize=7)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
