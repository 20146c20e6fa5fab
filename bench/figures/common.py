"""Shared plumbing of the thesis-figure scripts: run a grid of simulations, write CSV + PNG.

Each script is runnable as ``python3 bench/figures/figX_Y.py [--outdir DIR] [--tasks N]
[--quick] [--json [FILE|-]]`` from the repository root and writes ``DIR/figX_Y.csv`` and
``DIR/figX_Y.png`` (a one-figure script: ``--plot FILE`` for another PNG path). The options
are spelled as the ``malcolm`` CLI spells them (:mod:`malcolm._argparse`, docs/cli.md).
"""

from __future__ import annotations

import csv
import glob
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _import_simulate():
    """The installed malcolm's simulator. The repository root goes on ``sys.path`` only when
    no malcolm is installed and the root holds a build made in place (``setup.py build_ext
    --inplace``): with a regular install it would shadow the compiled package with the
    uncompiled sources."""
    try:
        from malcolm.sim import simulate
        return simulate
    except ImportError:
        if not glob.glob(os.path.join(ROOT, "malcolm", "sim", "_engine*.so")):
            sys.exit("figures: malcolm is not installed (run ./dev --help, or pip install .)")
    sys.path.insert(0, ROOT)
    from malcolm.sim import simulate
    return simulate


simulate = _import_simulate()

FIELDS = ("series", "workload", "load", "p50_us", "p99_us", "p999_us", "p9999_us", "mean_us",
          "throughput", "offered", "migrations", "generated", "sim_time_s", "wall_s")


def parser(description, tasks, name, examples="", plot=True, grid=False):
    """The options every figure script shares: ``--outdir``, ``--tasks``, ``--seed``,
    ``--quick``, ``--json [FILE|-]``; ``plot``: ``--plot FILE`` (the one PNG); ``grid``:
    ``--load LOADS`` to replace the script's grid of loads. ``name`` is the script's stem."""
    from malcolm import _argparse as g
    ex = f"python3 bench/figures/{name}.py --quick\n" \
         f"python3 bench/figures/{name}.py --outdir docs/figures\n" + examples.strip() + \
         f"\npython3 bench/figures/{name}.py --quick --json {name}.json"
    ap = g.parser(description, ex)
    ap.add_argument("--outdir", default=os.path.join("out", "figures"), metavar="DIR",
                    help="directory of the CSV and PNG files, named after the figure "
                         "(default out/figures)")
    g.hidden_alias(ap, "--out", "outdir")
    if plot:
        ap.add_argument("--plot", default=None, metavar="FILE",
                        help=f"the plot (PNG); default DIR/{name}.png")
    if grid:
        ap.add_argument("--load", type=g.loads, action="extend", default=None,
                        metavar="LOADS",
                        help="loads to run instead of the figure's grid: 0.5,0.7 or "
                             "0.5:0.95:0.05 (START:STOP:STEP); repeatable")
    if tasks is not None:
        ap.add_argument("--tasks", type=int, default=tasks,
                        help=f"tasks per point (default {tasks})")
    ap.add_argument("--seed", type=int, default=1,
                    help="seed of every simulation: the same seed gives the same runs "
                         "(default 1)")
    ap.add_argument("--quick", action="store_true", help="fewer loads and tasks")
    g.add_json(ap, "every row")
    return ap


def parse(ap):
    """Parse the command line; with ``--json -`` the prints go to stderr from here on."""
    from malcolm import _argparse as g
    a = ap.parse_args()
    if getattr(a, "tasks", None) is not None and a.tasks < 1:
        ap.error("--tasks must be >= 1")
    g.json_stdout(a)
    return a


def racks(a, figs=("fig7_1", "fig7_2"), suffix=""):
    """The racks of a two-rack figure script: ``(figure name, spec, title)`` per ``--servers``
    (default: both presets; a hidden ``--rack homo|hetero|both`` of the first release too).
    The presets keep the thesis's figure names; another spec is named after itself."""
    from malcolm._argparse import PRESETS
    old = getattr(a, "rack_old", None)
    specs = a.servers or ([PRESETS[k] for k in ("homo", "hetero") if old in (k, "both")]
                          if old else [PRESETS["homo"], PRESETS["hetero"]])
    out = []
    for spec in dict.fromkeys(specs):
        if spec == PRESETS["homo"]:
            out.append((figs[0] + suffix, spec, f"homogeneous {spec}"))
        elif spec == PRESETS["hetero"]:
            out.append((figs[1] + suffix, spec, f"heterogeneous {spec.replace(',', ' + ')}"))
        else:
            tag = spec.replace(",", "+").replace("@", "at")
            out.append((f"{figs[0]}_{figs[1].split('_')[1]}{suffix}_{tag}", spec, spec))
    return out


def png(a, name):
    """The PNG path of figure ``name``: ``--plot`` if given, else in ``--outdir``."""
    return getattr(a, "plot", None) or os.path.join(a.outdir, f"{name}.png")


def write_json(a, **obj):
    """``--json``: ``obj`` and the run metadata."""
    from malcolm import _argparse as g
    g.write_json(a, obj)


def run_grid(points, quiet=False):
    """Run ``points``: a list of (series label, simulate kwargs). Returns CSV rows."""
    rows = []
    t0 = time.time()
    for i, (label, kw) in enumerate(points):
        r = simulate(**kw)
        row = dict(series=label, workload=kw.get("workload"), load=kw.get("load"),
                   p50_us=r.p50_us, p99_us=r.p99_us, p999_us=r.p999_us, p9999_us=r.p9999_us,
                   mean_us=r.mean_us, throughput=r.throughput, offered=r.offered,
                   migrations=r.migrations, generated=r.generated, sim_time_s=r.sim_time_s,
                   wall_s=r.wall_s)
        rows.append(row)
        if not quiet:
            print(f"[{i + 1}/{len(points)} {time.time() - t0:6.1f}s] {label:>22} "
                  f"{kw.get('workload'):>8} load {kw.get('load'):.2f}  "
                  f"p99 {r.p99_us:10.1f} µs", file=sys.stderr)
    return rows


def write_rows_csv(path, rows, **const):
    """Every key of the rows (the first row's order), after the ``const`` columns that are the
    same on every row (``rack=...``)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(const) + list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow(dict(const, **r))


def write_csv(rows, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in FIELDS})


def plot_panels(rows, path, panels, metric="p99_us", ylabel="p99 latency (µs)", title=None,
                ylim=None):
    """One subplot per entry of ``panels`` (a list of (title, filter(row) -> bool, metric)).

    Lines are the distinct ``series`` values, x is load, y is log-scale latency.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (ptitle, keep, m) in zip(axes[0], panels, strict=False):
        sel = [r for r in rows if keep(r)]
        for s in dict.fromkeys(r["series"] for r in sel):
            pts = sorted((r["load"], r[m or metric]) for r in sel if r["series"] == s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=s)
        ax.set_yscale("log")
        ax.set_xlabel("load")
        names = {"p50_us": "p50", "p99_us": "p99", "p999_us": "p99.9", "p9999_us": "p99.99"}
        ax.set_ylabel(ylabel if m in (None, metric) else f"{names.get(m, m)} latency (µs)")
        ax.set_title(ptitle)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary(rows, key="series", factor=3.0):
    """Print, per series and workload, the highest load whose p99 stays within ``factor``
    times the lowest p99 seen for that workload (a knee detector: "max sustainable load")."""
    best = {}
    for r in rows:
        best[r["workload"]] = min(best.get(r["workload"], float("inf")), r["p99_us"])
    out = {}
    for r in sorted(rows, key=lambda r: r["load"]):
        k = (r[key], r["workload"])
        out.setdefault(k, (0.0, True))
        ld, ok = out[k]
        if ok and r["p99_us"] <= factor * best[r["workload"]]:
            out[k] = (r["load"], True)
        else:
            out[k] = (ld, False)
    for (s, w), (ld, _) in out.items():
        print(f"{s:>24} {w:>8}: max load with p99 <= {factor:g} x best "
              f"({factor * best[w]:.0f} µs): {ld:.2f}")
    return {k: v[0] for k, v in out.items()}
