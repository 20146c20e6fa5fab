"""``malcolm demo``: the main job. A small heterogeneous rack at microsecond scale on this
machine, Malcolm against JSQ, client-side power-of-two and frozen Malcolm, measured with the
experiment runner (:mod:`malcolm.loadgen.experiment`): time dilation, interleaved policies,
repeats, medians with confidence intervals, flagged runs, and optionally the simulator's twin
of every point.

The rack: two fast servers (3 workers) and two slow ones (1 worker), the ``bench`` handler
(sleep plus a self-calibrated spin: accurate service times at little CPU), UDP on loopback.

* ``malcolm``: Malcolm's actor-critic in every gateway, clients spread uniformly;
* ``jsq``: join-shortest-queue on heartbeats in every gateway, clients uniform;
* ``po2``: power-of-two in the clients on the piggybacked loads; the gateways accept every
  task (``jbt`` with an unreachable threshold);
* ``malcolm:learn=0``: Malcolm frozen at its initial policy, the control row.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time

import click

from malcolm._files import shown
from malcolm.commands.types import FLOAT, Duration, IntRange, json_option, write_json

# Two repeats of 3 s: a run disturbed by other jobs is flagged and run again once (at most 6
# of the 24 runs), so that each point keeps two clean repeats; about two minutes on the
# 2-vCPU VM.
FULL = {"loads": (0.5, 0.7, 0.85), "duration": 3.0, "warmup": 0.5, "repeat": 2,
        "dilate": "auto", "retries": 1}
# --quick skips the calibration (a fixed K that a loaded 2-core machine keeps up with)
QUICK = {"loads": (0.5, 0.8), "duration": 0.6, "warmup": 0.3, "repeat": 1, "dilate": "50",
         "retries": 0}
POLICIES = "malcolm,jsq,po2,malcolm:learn=0"


def plot(result, path, title):
    """Median p99 (with its CI) against load, one colour per policy; the sim twin dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"malcolm": "tab:red", "jsq": "tab:blue", "po2": "tab:green",
              "malcolm:learn=0": "tab:gray"}
    rows = result["rows"]
    for name in dict.fromkeys(r["policy"] for r in rows):
        rs = [r for r in rows if r["policy"] == name]
        x = [r["load"] for r in rs]
        y = [r["p99_us"] for r in rs]
        lo = [max(0.0, r["p99_us"] - r["p99_ci_us"][0]) for r in rs]
        hi = [max(0.0, r["p99_ci_us"][1] - r["p99_us"]) for r in rs]
        c = colors.get(name)
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o-", color=c, capsize=3, label=f"{name} p99")
        if all(r.get("sim_p99_us") is not None for r in rs):
            ax.plot(x, [r["sim_p99_us"] for r in rs], "x--", color=c, alpha=0.6,
                    label=f"{name} sim")
    ax.set_xlabel("target load (fraction of the rack's capacity)")
    ax.set_ylabel("p99 latency (µs at rack scale, from intended send)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    # no extension: PNG at exactly this path (matplotlib would otherwise add ".png" to it)
    fig.savefig(path, dpi=110, format=None if os.path.splitext(path)[1] else "png")
    plt.close(fig)


def _clean_at_top(result):
    """{policy: row} of the rows with a clean run at the highest load of any row with a p99
    (a flagged row takes no part in a conclusion); {} if there is none."""
    rows = [r for r in result["rows"] if math.isfinite(r["p99_us"])]
    if not rows:
        return {}
    top = max(r["load"] for r in rows)
    return {r["policy"]: r for r in rows if r["load"] == top and r["valid"]}


def _is_control(policy):
    """The frozen control (``malcolm:learn=0``): compared with, never named the lowest."""
    return "learn=0" in policy


def lowest_at_top(result):
    """The policy with the lowest median p99 at the highest load, among the rows with a clean
    run (a flagged row cannot win) and without the frozen control; None if there is none."""
    cand = [r for p, r in _clean_at_top(result).items() if not _is_control(p)]
    return min(cand, key=lambda r: r["p99_us"])["policy"] if cand else None


def verdict_at_top(result):
    """The demo's conclusion at the highest load, stated only as far as the intervals allow.

    The policy with the lowest median p99 (``lowest_at_top``) is named; for each other clean
    row at that load (the frozen control included) it says whether the two intervals
    separate, and the coverage of the intervals, so that two repeats (coverage 50%) are not
    read as a 95% result.
    """
    best = lowest_at_top(result)
    if best is None:
        return "lowest p99 at the highest load: undetermined (no clean row there)"
    at = _clean_at_top(result)
    b = at[best]
    # The control is not a candidate, but a lower median of its own is said in the first
    # clause: "lowest: malcolm" alone read as if malcolm were below it too.
    ctl = [(p, r["p99_us"]) for p, r in at.items() if _is_control(p) and r["p99_us"] < b["p99_us"]]
    head = f"lowest median p99 at the highest load: {best}"
    if ctl:
        head = (f"lowest median p99 at the highest load, the frozen control aside: {best} "
                f"({b['p99_us']:.0f} µs; " + ", ".join(f"{p} {v:.0f}" for p, v in ctl)
                + " is lower)")
    if not any(r.get("ci_coverage", 0.0) > 0.0 for r in at.values()):
        return (f"{head} (one clean run per policy: no interval, so no separation is claimed;"
                " --repeat 6 gives 95% intervals)")
    above, overlap, below = [], [], []      # below: only the control can be (it is not a candidate)
    for p, r in at.items():
        if p != best:
            lo, hi = r["p99_ci_us"]
            (above if lo > b["p99_ci_us"][1] else below if hi < b["p99_ci_us"][0]
             else overlap).append(p)
    covs = sorted({r["ci_coverage"] for r in at.values() if r.get("ci_coverage", 0.0) > 0.0})
    cov = "/".join(f"{100 * c:.0f}%" for c in covs)
    text = head
    if above:
        text += f"; its interval lies below {', '.join(above)}'s"
    if overlap:
        text += f"; not separated from {', '.join(overlap)} (intervals overlap)"
    if below:
        text += f"; above {', '.join(below)}, whose interval lies below its own"
    hint = "; 95% needs 6 clean repeats: --repeat 6" if covs[0] < 0.95 else ""
    return text + f" [interval coverage {cov}{hint}]"


def _loads(texts):
    from malcolm.commands.sim import _floats
    vals = _floats(texts, "--load")
    if not vals or any(not 0 < x < 1.5 for x in vals):
        raise click.UsageError(f"--load {','.join(texts)}: each load must be in (0, 1.5)")
    return vals


def _dilate(text):
    from malcolm.loadgen.method import parse_dilation
    try:
        return parse_dilation(text)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _workers(text):
    from malcolm._units import ascii_number, split_items
    try:
        items = split_items(text)
    except ValueError as e:
        raise click.UsageError(f"--workers {e}") from None
    try:        # ASCII digits: int() took "８,８" for two servers of 8 workers
        vals = [ascii_number(x, int) for x in items]
    except ValueError:
        raise click.UsageError(f"--workers {text!r} must be integers like 3,3,1,1") from None
    if not 1 <= len(vals) <= 64 or any(not 0 <= w <= 64 for w in vals):
        raise click.UsageError(f"--workers {text!r}: 1-64 servers of 0-64 workers each")
    from malcolm.runtime.launcher import too_many_threads
    why = too_many_threads(vals)
    if why:
        raise click.UsageError(f"--workers {text!r}: {why}")
    return vals


@click.command(epilog="""
\b
Examples:
  malcolm demo                          about two minutes: the table and malcolm-demo.png
  malcolm demo --quick --json -         a short smoke run, the result as JSON on stdout
  malcolm demo --policy malcolm --policy jsq --load 0.6,0.9 --workers 4,4,2,2,1,1
  malcolm demo --dilate auto --repeat 5 --compare-sim --json out.json --plot out.png
""")
@click.option("--quick", is_flag=True, help="Two short loads, one repeat (for tests).")
@click.option("--plot", "png", default="malcolm-demo.png", show_default=True, metavar="FILE",
              type=click.Path(dir_okay=False),
              help="Write the plot to FILE, in the format its extension names (png, pdf, "
                   "svg, ...; none: PNG).")
@click.option("--out", "png_old", default=None, hidden=True, type=click.Path(dir_okay=False))
@json_option("the result (rows, every run, the run metadata)")
@click.option("--policy", "policy_list", multiple=True,
              help="Policy NAME[:key=val,...]; repeat for several: malcolm, jsq, po2 "
                   f"(default {POLICIES.replace(',', ', ')}).")
@click.option("--policies", default=None, hidden=True)
@click.option("--load", "load_list", multiple=True,
              help="Target loads, fractions of the rack's capacity: 0.5,0.7 or "
                   "0.5:0.9:0.1; repeatable (default 0.5,0.7,0.85).")
@click.option("--loads", default=None, hidden=True)
@click.option("--repeat", type=IntRange(1, 1000), default=None,
              help="Runs per policy and load, 1 to 1000 (default 2).")
@click.option("--retries", type=IntRange(0, 100), default=None,
              help="Run a flagged run (generator late, effective load off target) again at "
                   "once, up to this many times (at most 100); every attempt is listed in "
                   "the JSON (default 1, --quick 0).")
@click.option("--duration", type=Duration("s", min=0, min_open=True), default=None,
              help="Real time measured per run (bare number: seconds; default 3s, "
                   "--quick 0.6s).")
@click.option("--warmup", type=Duration("s"), default=None,
              help="Real warm-up time per run (bare number: seconds; default 0.5s, --quick "
                   "0.3s).")
@click.option("--workload", default="exp:50", show_default=True,
              help="Nominal service times (µs), as in `malcolm sim`.")
@click.option("--window", "window_us", default=100.0, show_default=True,
              type=Duration("us", min=0, min_open=True),
              help="Nominal policy window (heartbeat period); bare number: µs.")
@click.option("--window-us", "window_us_old", default=None, hidden=True, type=FLOAT)
@click.option("--workers", "workers_text", default="3,3,1,1", show_default=True,
              help="Worker threads per server (one number per server).")
@click.option("--dilate", "dilate_text", default=None,
              help="Time dilation K (service times, windows, timeouts x K), or 'auto': the "
                   "smallest K at which this machine keeps time. Default auto (--quick: 50).")
@click.option("--hop-delay", "hop_delay_us", type=Duration("us", min=0), default=None,
              help="Per-hop network delay added by the transports, at rack scale (x K in "
                   "real time); bare number: µs. Default 2 µs (half the thesis's measured "
                   "round trip) when K > 1, none at K = 1.")
@click.option("--hop-delay-us", "hop_delay_us_old", type=FLOAT, default=None,
              hidden=True)
@click.option("--compare-sim", is_flag=True,
              help="Run the simulator's twin of every point with the measured costs.")
@click.option("--logdir", default=None, type=click.Path(file_okay=False),
              help="Keep the servers' output here (default: a temporary directory).")
def demo(quick, png, png_old, json_out, policy_list, policies, load_list, loads, repeat,
         retries, duration, warmup, workload, window_us, window_us_old, workers_text, dilate_text,
         hop_delay_us, hop_delay_us_old, compare_sim, logdir):
    """Run a small heterogeneous rack here and compare Malcolm with JSQ, client po2 and
    frozen Malcolm, at microsecond scale (dilated to what this machine can time).

    Two fast servers (3 workers) and two slow ones (1 worker) by default, the bench handler,
    UDP on loopback. Prints every run as it finishes, then per policy and load the median
    p99 over the clean repeats with its confidence interval, and writes a plot. The JSON
    (--json) is written before the plot.
    """
    # the spellings of the first release, kept as hidden aliases
    png = png_old or png
    window_us = window_us_old if window_us_old is not None else window_us
    if hop_delay_us_old is not None:
        hop_delay_us = hop_delay_us_old
    if policies:
        policy_list = tuple(policy_list) + tuple(p for p in policies.split(",") if p.strip())
    if loads:
        load_list = tuple(load_list) + (loads,)
    json_path = json_out
    from malcolm.commands.types import check_plot_format, check_writable, refuse_empty
    refuse_empty(dilate=dilate_text, logdir=logdir, workers=workers_text)
    check_writable(json_path, "--json")         # fail now, not after minutes of runs
    check_writable(png, "--plot")
    check_plot_format(png, "--plot")
    if logdir:
        try:
            os.makedirs(logdir, exist_ok=True)
        except OSError as e:
            raise click.BadParameter(f"{logdir}: {e.strerror}", param_hint="--logdir") from None
    import threading

    from malcolm.loadgen.experiment import HEADER as ROW_HEADER
    from malcolm.loadgen.experiment import Experiment, ExperimentError, format_row
    from malcolm.loadgen.table import format_twin_check, twin_check
    from malcolm.runtime.launcher import LocalRack
    cfg = QUICK if quick else FULL
    stop = threading.Event()
    echo = lambda s: (click.echo(s, err=json_path == "-"), sys.stderr.flush(),  # noqa: E731
                      sys.stdout.flush())
    try:
        exp = Experiment(_workers(workers_text), workload,
                         [p.strip() for p in policy_list or POLICIES.split(",")],
                         _loads(load_list) if load_list else cfg["loads"],
                         repeat=cfg["repeat"] if repeat is None else repeat,
                         retries=cfg["retries"] if retries is None else retries,
                         duration_s=duration or cfg["duration"],
                         warmup_s=cfg["warmup"] if warmup is None else warmup,
                         window_us=window_us, dilate=_dilate(dilate_text or cfg["dilate"]),
                         compare_sim=compare_sim, echo=echo, logdir=logdir, stop=stop,
                         sim_tasks=40_000 if quick else 100_000, rack_class=LocalRack,
                         **({} if hop_delay_us is None else {"hop_delay_us": hop_delay_us}))
    except ExperimentError as e:
        raise click.UsageError(str(e)) from None
    # Ctrl-C, SIGTERM or a closed terminal: finish the run in hand and stop the racks (a
    # SIGKILL leaves that to the servers themselves: see malcolm.runtime.launcher)
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {sig: signal.signal(sig, lambda *a: stop.set()) for sig in stop_signals}
    t0 = time.monotonic()
    ns = len(exp.workers)
    echo(f"malcolm demo: {ns} server{'s' * (ns != 1)} (workers {exp.workers}, bench handler, "
         f"udp), workload {exp.wl.describe()}, {exp.window_us:g} µs windows; loads "
         f"{', '.join(f'{x:g}' for x in exp.loads)}; {exp.repeat} repeat(s), policies "
         "interleaved")
    try:
        result = exp.run()
    except ExperimentError as e:
        raise click.ClickException(str(e)) from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if stop.is_set():
        click.echo("malcolm demo: interrupted; the racks were stopped", err=True)
        sys.exit(130)
    rows = result["rows"]
    echo(f"\nmalcolm demo at dilation K={result['dilate']:g} (latencies in µs at rack "
         f"scale; CI: order-statistic interval of the median over the clean repeats)")
    echo(ROW_HEADER)
    for row in rows:
        echo(format_row(row))
    best = lowest_at_top(result)
    if rows:
        echo(verdict_at_top(result))
    twin = twin_check(rows)
    if twin is not None:
        echo(format_twin_check(twin))
        result["twin_check"] = twin
    result["lowest_at_top"] = best
    if json_path:
        from malcolm._metadata import run_metadata
        result["metadata"] = run_metadata(click.get_current_context().params)
        write_json(json_path, result, indent=1)
    if rows:
        try:
            plot(result, png, f"malcolm demo: workers {exp.workers}, {exp.workload}, "
                              f"K={result['dilate']:g}")
            echo(f"plot: {shown(png)}")
        except ImportError:
            echo("plot: skipped (matplotlib is not installed)")
        except (OSError, ValueError) as e:      # checked up front; a full disk, say
            raise click.ClickException(f"--plot {png}: {e}") from None
    bad = [r for r in result["runs"] if not r["accounted"]]
    echo(f"malcolm demo: done in {time.monotonic() - t0:.0f} s"
         + ("" if not bad else f"; {len(bad)} run(s) did not account for every task"))
    if bad:
        sys.exit(2)
