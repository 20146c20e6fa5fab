"""``malcolm sim``: simulate a rack under a policy, one configuration or a sweep."""

from __future__ import annotations

import math
import os
import re
import sys

import click

from malcolm._files import shown
from malcolm._units import ascii_number, split_items
from malcolm.commands.types import (
    FLOAT,
    Duration,
    FloatRange,
    IntRange,
    check_plot_format,
    check_writable,
    json_option,
    refuse_empty,
    write_json,
)
from malcolm.policy.defaults import MAX_WINDOW_TASKS, WINDOW_TASKS

MAX_POINTS = 1000       # values one START:STOP:STEP range may expand to

# A run's peak memory grows with --tasks: the engine's per-task arrays (latency, send time,
# type, service time, drop flag) and the result's copies of them, 81-83 bytes a task as
# measured (8x8 and 64x1, 1-6 M tasks, every policy kind); 96 leaves room. It is checked
# against the memory available before the run: on Linux an allocation past it is not
# refused, the OOM killer ends the process later, with no message.
BYTES_PER_TASK = 96


# simulate()'s argument names, as this command's options spell them: its checks name the
# argument, and a user who typed --delay should read --delay
_FLAGS = {"delay_us": "--delay", "jitter_us": "--jitter", "window_us": "--window",
          "window_tasks": "--window-tasks", "quantum_us": "--quantum",
          "gateway_ns": "--gateway-cost", "steal_timeout_us": "--steal-timeout",
          "max_steals_in_flight": "--steals-in-flight"}
# names that are also words of a message: only where one starts it
_LEAD = {"capacity": "--capacity", "clients": "--clients", "loss": "--loss",
         "ewma": "--ewma", "warmup": "--warmup-fraction", "tasks": "--tasks"}


def in_flags(msg: str) -> str:
    """A message of ``simulate``'s checks in this command's terms (``delay_us must be ...``
    -> ``--delay must be ...``)."""
    msg = re.sub(r"\b(" + "|".join(_FLAGS) + r")\b", lambda m: _FLAGS[m.group(1)], msg)
    word = msg.split(" ", 1)[0]
    return _LEAD[word] + msg[len(word):] if word in _LEAD else msg


def _available_bytes():
    """MemAvailable from /proc/meminfo, in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(tasks):
    """Raise ``click.UsageError`` if a ``tasks``-task run would not fit in the memory
    available now."""
    avail = _available_bytes()
    need = tasks * BYTES_PER_TASK
    if avail is not None and need > avail:
        raise click.UsageError(
            f"--tasks {tasks}: a run needs about {need / 2**30:.1f} GiB of memory (about "
            f"{BYTES_PER_TASK} bytes a task) and {avail / 2**30:.1f} GiB is available here; "
            f"at most about {avail // BYTES_PER_TASK:,} tasks fit")


def _floats(values, what):
    out = []
    for v in values:
        try:
            parts = split_items(v)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=what) from None
        for part in parts:
            if part.count(":") == 2:           # START:STOP:STEP, STOP included
                try:
                    a, b, s = (ascii_number(x) for x in part.split(":"))
                except ValueError:
                    raise click.BadParameter(f"bad range {part!r} (START:STOP:STEP)",
                                             param_hint=what) from None
                if not (s > 0 and b >= a and math.isfinite(a + b + s)):
                    raise click.BadParameter(f"bad range {part!r}", param_hint=what)
                k = math.floor((b - a) / s + 1e-9)
                if k >= MAX_POINTS:
                    raise click.BadParameter(f"range {part!r} has {k + 1:.3g} points; at "
                                             f"most {MAX_POINTS}", param_hint=what)
                out += [round(a + i * s, 10) for i in range(k + 1)]
                continue
            try:
                out.append(ascii_number(part))
            except ValueError:
                raise click.BadParameter(f"{part!r} is not a number", param_hint=what) from None
    if len(out) > MAX_POINTS:       # a list, as a range: a sweep of a run per value
        raise click.BadParameter(f"{len(out)} values; at most {MAX_POINTS}", param_hint=what)
    return out


def _row(r):
    c = r.config
    n = max(r.generated, 1)
    return (c["policy"], c["workload"], f"{c['load']:.3f}", f"{r.p50_us:.1f}", f"{r.p99_us:.1f}",
            f"{r.p999_us:.1f}", f"{r.mean_us:.1f}",
            "n/a" if r.throughput_note else f"{r.throughput / 1e3:.1f}",
            f"{100 * r.migrations / n:.1f}", f"{100 * r.steals / n:.1f}",
            f"{100 * r.dropped / n:.2f}", f"{r.wall_s:.2f}")


_HEAD = ("policy", "workload", "load", "p50_us", "p99_us", "p999_us", "mean_us", "KTPS",
         "migr%", "steal%", "drop%", "wall_s")


def _table(rows):
    rows = [_HEAD] + rows
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(_HEAD))]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(r, widths, strict=False)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot_p99(results, path, title=None):
    """Draw p99 latency versus load, one line per (policy, workload)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for r in results:
        key = (r.config["policy"], r.config["workload"])
        series.setdefault(key, []).append((r.config["load"], r.p99_us))
    workloads = sorted({k[1] for k in series})
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 3.8),
                             squeeze=False)
    for ax, wl in zip(axes[0], workloads, strict=False):
        for (pol, w), pts in sorted(series.items()):
            if w != wl:
                continue
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=pol)
        ax.set_yscale("log")
        ax.set_xlabel("load")
        ax.set_ylabel("p99 latency (µs)")
        ax.set_title(wl)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    # no extension: PNG at exactly this path (matplotlib would otherwise add ".png" to it)
    fig.savefig(path, dpi=120, format=None if os.path.splitext(path)[1] else "png")
    plt.close(fig)


def from_rack_file(path):
    """What a rack file says about the rack to simulate: ``(servers spec, policy spec,
    window_us, window_tasks)``. A server with 0 workers (its gateway runs the tasks) is one
    worker here. The servers' addresses are not used, so their host names need not resolve
    on this machine (a rack file of other nodes is simulated where it is studied)."""
    from malcolm.runtime.config import ConfigError, load_rack
    try:
        cfg = load_rack(path, resolve=False)
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--rack") from None
    groups = []
    for s in cfg.servers:
        w = max(1, s.workers)
        if groups and groups[-1][1] == w:
            groups[-1][0] += 1
        else:
            groups.append([1, w])
    spec = ",".join(f"{n}x{w}" for n, w in groups)
    params = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                      for k, v in cfg.policy_params.items())
    pol = cfg.policy + (f":{params}" if params else "")
    return spec, pol, cfg.window_us, cfg.window_tasks


def guard_note(policy_stats):
    """What the policy's guards did in a run, per server (None where they did nothing):
    the same counters ``malcolm serve`` logs (``SimResult.policy_stats``)."""
    from malcolm.policy.guards import GUARDS

    parts = []
    for key, what in GUARDS:
        at = [i for i, d in enumerate(policy_stats or ()) if d.get(key)]
        if at:
            where = ", ".join(map(str, at[:8])) + (f" and {len(at) - 8} more" if len(at) > 8
                                                   else "")
            parts.append(f"{sum(policy_stats[i][key] for i in at)} {what} "
                         f"(server{'s' * (len(at) > 1)} {where})")
    return "the policy's guards fired: " + "; ".join(parts) if parts else None


@click.command("sim", epilog="""
\b
Examples:
  malcolm sim --policy malcolm
  malcolm sim --servers 2x14,9x4 --policy jsq --workload hyperexp1 --load 0.85 --tasks 1000000
  malcolm sim --policy po2 --policy jsq --load 0.5:0.95:0.05 --plot sweep.png
  malcolm sim --servers 4x2 --policy malcolm:learn=0 --delay 5us --json out.json
  malcolm sim --rack rack.toml --load 0.5:0.9:0.1      the rack a rack file describes
""")
@click.option("--servers", "rack", default="8x8", show_default=True, metavar="SPEC",
              help="Servers x workers[@speed], comma-separated groups: 8x8, 2x16,14x2, "
                   "2x14@2.0,9x4.")
@click.option("--rack", "rack_file", type=click.Path(dir_okay=False), default=None,
              metavar="FILE",
              help="Simulate the rack of a rack file (TOML): its servers' workers, and its "
                   "policy and window unless --policy or --window is given. Instead of "
                   "--servers.")
@click.option("--policy", "policies", multiple=True, default=("random",), show_default=True,
              help="Policy NAME[:key=val,...]; repeat to sweep. See `malcolm list policies`.")
@click.option("--workload", "workloads", multiple=True, default=("exp:50",),
              show_default=True, help="Service times in µs: exp:MEAN, const:V, bimodal, "
                                      "hyperexp1, hyperexp2, rocksdb1, rocksdb2, fig2.1a/b, "
                                      "fig3.2a/b or mix:...; repeat to sweep. See `malcolm "
                                      "list workloads`.")
@click.option("--load", "loads", multiple=True, default=("0.8",), show_default=True,
              help="Load(s), fractions of the rack's capacity: 0.5,0.7 or 0.5:0.95:0.05 "
                   "(START:STOP:STEP, STOP included).")
@click.option("--tasks", default=100_000, show_default=True, type=IntRange(1, 100_000_000),
              help="Tasks per run (the first --warmup-fraction is not measured).")
@click.option("--seed", default=1, show_default=True, type=IntRange(0, 2**64 - 1),
              help="Seed of every random stream of a run (same seed, same result).")
@click.option("--delay", default=2.0, show_default=True, type=Duration("us"),
              help="One-way network delay (bare number: µs; 0 allowed).")
@click.option("--jitter", default=0.0, show_default=True, type=Duration("us"),
              help="Extra uniform [0, jitter) on every message (bare number: µs).")
@click.option("--window", default=100.0, show_default=True, type=Duration("us", min=0,
                                                                          min_open=True),
              help="Load-broadcast window (bare number: µs), the longest (--window-tasks).")
@click.option("--window-tasks", "window_tasks", default=WINDOW_TASKS, show_default=True,
              type=FloatRange(0, MAX_WINDOW_TASKS),
              help="Each server's window is this many of its measured task times, within "
                   "[--window / 5, --window], as in `malcolm serve`; 0: --window, fixed.")
@click.option("--sched", type=click.Choice(["fcfs", "ps"]), default="fcfs", show_default=True,
              help="Scheduling inside a server.")
@click.option("--quantum", default=0.0, show_default=True, type=Duration("us"),
              help="PS quantum (bare number: µs); 0 is ideal processor sharing.")
@click.option("--shares", default=None,
              help="Per-server traffic shares (weights, no unit), e.g. 1,1,2,2.")
@click.option("--loss", default=0.0, show_default=True, type=FloatRange(0, 1, max_open=True),
              help="Heartbeat loss probability, in [0, 1).")
@click.option("--clients", default=None, type=IntRange(1),
              help="Clients (default: one per server).")
@click.option("--warmup-fraction", "warmup", default=0.1, show_default=True,
              type=FloatRange(0, 1, max_open=True),
              help="Fraction (0..1) of the first tasks not measured (--warmup elsewhere is "
                   "a time).")
@click.option("--warmup", "warmup_old", default=None, hidden=True,
              type=FloatRange(0, 1, max_open=True))
@click.option("--phase", type=click.Choice(["random", "staggered", "aligned"]),
              default="random", show_default=True, help="Window phases of the servers.")
@click.option("--ewma", default=None, type=FLOAT,
              help="Weight (0..1) of a new sample in the load estimator's averages (default: "
                   "the runtime's, malcolm.policy.defaults.EST_ALPHA).")
@click.option("--gateway-cost", "gateway_ns", default=0.0, show_default=True,
              type=Duration("ns"),
              help="Gateway CPU time per message (bare number: ns): each server's gateway "
                   "handles received and originated messages one at a time (0: free).")
@click.option("--gateway-ns", "gateway_ns_old", default=None, hidden=True, type=Duration("ns"))
@click.option("--capacity", default=None, type=IntRange(1),
              help="Tasks a server holds at most (waiting + running); beyond it a task is "
                   "dropped and answered at once. Default: unbounded.")
@click.option("--steals-in-flight", default=1, show_default=True, type=IntRange(0),
              help="Steal requests a server may have outstanding (0: unlimited).")
@click.option("--steal-timeout", default=2000.0, show_default=True, type=Duration("us"),
              help="A steal request unanswered this long is given up (bare number: µs).")
@json_option("every run's summary and the run metadata")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write a p99-versus-load plot (PNG) to FILE.")
def sim(rack, rack_file, policies, workloads, loads, tasks, seed, delay, jitter, window,
        window_tasks, sched, quantum, shares, loss, clients, warmup, warmup_old, phase, ewma,
        gateway_ns, gateway_ns_old, capacity, steals_in_flight, steal_timeout, json_out, plot):
    """Simulate a rack: p50/p99/p99.9 latency, throughput, migrations and steals.

    Sweeps run every combination of --policy, --workload and --load. With --json the result
    is one object, {"metadata": {...}, "runs": [summary, ...]}.
    """
    from malcolm.policy.registry import parse_policy
    refuse_empty(rack=rack_file, json=json_out, plot=plot)
    check_writable(json_out, "--json")          # fail now, not after the sweep
    check_writable(plot, "--plot")
    check_plot_format(plot, "--plot")
    if quantum and sched != "ps":       # round robin's quantum: nothing to cut under FCFS
        raise click.BadParameter("a quantum applies to --sched ps only", param_hint="--quantum")
    if warmup_old is not None:          # the first release's spelling, kept hidden
        warmup = warmup_old
    if gateway_ns_old is not None:      # likewise
        gateway_ns = gateway_ns_old
    if rack_file:
        ctx = click.get_current_context()
        default = click.core.ParameterSource.DEFAULT
        if ctx.get_parameter_source("rack") != default:
            raise click.UsageError("give either --servers SPEC or --rack FILE, not both")
        rack, pol, win, wtasks = from_rack_file(rack_file)
        if ctx.get_parameter_source("policies") == default:
            policies = (pol,)
        if ctx.get_parameter_source("window") == default:
            window = win
        if ctx.get_parameter_source("window_tasks") == default:
            window_tasks = wtasks
    from malcolm.sim.rack import parse_rack_spec
    from malcolm.sim.run import check_simulate, simulate
    from malcolm.workloads import parse_workload

    load_list = _floats(loads, "--load")
    if not load_list:
        raise click.BadParameter("no load given", param_hint="--load")
    try:                            # fail fast, before a long sweep starts
        parse_rack_spec(rack)
        for w in workloads:
            parse_workload(w)
        for p in policies:
            parse_policy(p)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    runs = [(p, w, ld) for p in policies for w in workloads for ld in load_list]
    results = []

    def kwargs(p, w, ld):
        return dict(rack=rack, policy=p, workload=w, load=ld, tasks=tasks, seed=seed,
                    delay_us=delay, jitter_us=jitter, window_us=window,
                    window_tasks=window_tasks, sched=sched,
                    quantum_us=quantum, shares=shares, loss=loss, clients=clients,
                    warmup=warmup, phase=phase, gateway_ns=gateway_ns, capacity=capacity,
                    max_steals_in_flight=steals_in_flight, steal_timeout_us=steal_timeout,
                    **({} if ewma is None else {"ewma": ewma}))

    try:
        for run in runs:            # every point of a sweep, before its first run
            check_simulate(**kwargs(*run))
    except (TypeError, ValueError) as e:        # either is one line, not a traceback
        raise click.UsageError(in_flags(str(e))) from None
    check_memory(tasks)             # the runs are one at a time: one run's peak counts

    def one(p, w, ld):
        try:
            r = simulate(**kwargs(p, w, ld))
        except ValueError as e:
            raise click.UsageError(in_flags(str(e))) from None
        except MemoryError:         # a limit below what MemAvailable said (ulimit -v, say)
            raise click.ClickException(f"out of memory simulating {p} {w} at load {ld:g} "
                                       f"with {tasks} tasks; use fewer --tasks") from None
        # keep the summary only: a sweep of 10^6-task runs would otherwise hold GBs
        r.latencies_us = r.types = r.service_us = r.loads = None
        results.append(r)

    if len(runs) == 1:
        one(*runs[0])
    else:
        with click.progressbar(runs, label="simulating", file=sys.stderr,
                               item_show_func=lambda x: x and f"{x[0]} {x[1]} {x[2]:g}") as bar:
            for item in bar:
                one(*item)
    if json_out:
        from malcolm._metadata import run_metadata
        write_json(json_out, {"metadata": run_metadata(click.get_current_context().params),
                              "runs": [r.summary() for r in results]})
    if json_out != "-":
        click.echo(_table([_row(r) for r in results]))
    for r in results:           # why a KTPS is n/a (in the JSON: "throughput_note")
        c = r.config
        for why in (r.throughput_note, guard_note(r.policy_stats)):
            if why:
                click.echo(f"note: {c['policy']} {c['workload']} load {c['load']:.3f}: "
                           f"{why}", err=True)
    if plot:
        try:
            plot_p99(results, plot, title=f"rack {rack}, delay {delay:g} µs")
        except OSError as e:            # the disk filled up during the sweep, say
            raise click.ClickException(f"--plot {shown(plot)}: {e.strerror or e}") from None
        click.echo(f"wrote {shown(plot)}", err=True)
