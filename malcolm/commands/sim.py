"""``malcolm sim``: simulate a rack under a policy, one configuration or a sweep."""

from __future__ import annotations

import json
import math
import sys

import click


def _floats(values, what):
    out = []
    for v in values:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            if part.count(":") == 2:           # START:STOP:STEP, STOP included
                try:
                    a, b, s = (float(x) for x in part.split(":"))
                except ValueError:
                    raise click.BadParameter(f"bad range {part!r} (START:STOP:STEP)",
                                             param_hint=what) from None
                if s <= 0 or b < a:
                    raise click.BadParameter(f"bad range {part!r}", param_hint=what)
                k = int(math.floor((b - a) / s + 1e-9))
                out += [round(a + i * s, 10) for i in range(k + 1)]
                continue
            try:
                out.append(float(part))
            except ValueError:
                raise click.BadParameter(f"{part!r} is not a number", param_hint=what) from None
    return out


def _row(r):
    c = r.config
    n = max(r.generated, 1)
    return (c["policy"], c["workload"], f"{c['load']:.3f}", f"{r.p50_us:.1f}", f"{r.p99_us:.1f}",
            f"{r.p999_us:.1f}", f"{r.mean_us:.1f}", f"{r.throughput / 1e3:.1f}",
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
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command("sim")
@click.option("--rack", default="8x8", show_default=True,
              help="Servers x workers[@speed], e.g. 8x8, 2x16,14x2, 2x14@2.0,9x4.")
@click.option("--policy", "policies", multiple=True, default=("random",), show_default=True,
              help="Policy [name:key=val,...]; repeat to sweep. random po2 jsq jbt jiq sed "
                   "steal cfcfs racksched malcolm.")
@click.option("--workload", "workloads", multiple=True, default=("exp:50",),
              show_default=True, help="exp:MEAN, bimodal, hyperexp1, hyperexp2, rocksdb1, "
                                      "rocksdb2, fig2.1a/b, fig3.2a/b or mix:...; repeatable.")
@click.option("--load", "loads", multiple=True, default=("0.8",), show_default=True,
              help="Load(s) relative to rack capacity: 0.5,0.7 or 0.5:0.95:0.05.")
@click.option("--tasks", default=100_000, show_default=True, type=int,
              help="Tasks per run (the first --warmup fraction is not measured).")
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--delay", default=2.0, show_default=True, type=float,
              help="One-way network delay, µs (0 allowed).")
@click.option("--jitter", default=0.0, show_default=True, type=float,
              help="Extra uniform [0, jitter) µs on every message.")
@click.option("--window", default=100.0, show_default=True, type=float,
              help="Load-broadcast window, µs.")
@click.option("--sched", type=click.Choice(["fcfs", "ps"]), default="fcfs", show_default=True,
              help="Scheduling inside a server.")
@click.option("--quantum", default=0.0, show_default=True, type=float,
              help="PS quantum, µs; 0 is ideal processor sharing.")
@click.option("--shares", default=None, help="Per-server traffic shares, e.g. 1,1,2,2.")
@click.option("--loss", default=0.0, show_default=True, type=float,
              help="Heartbeat loss probability.")
@click.option("--clients", default=None, type=int, help="Clients (default: one per server).")
@click.option("--warmup", default=0.1, show_default=True, type=float,
              help="Fraction of the first tasks not measured.")
@click.option("--phase", type=click.Choice(["random", "staggered", "aligned"]),
              default="random", show_default=True, help="Window phases of the servers.")
@click.option("--ewma", default=None, type=float,
              help="Weight of a new sample in the load estimator's averages (default: the "
                   "runtime's, malcolm.policy.defaults.EST_ALPHA).")
@click.option("--gateway-ns", default=0.0, show_default=True, type=float,
              help="Gateway CPU time per message, ns: each server's gateway handles "
                   "received and originated messages one at a time (0: free).")
@click.option("--capacity", default=None, type=int,
              help="Tasks a server holds at most (waiting + running, tasks); beyond it a "
                   "task is dropped and answered at once. Default: unbounded.")
@click.option("--steals-in-flight", default=1, show_default=True, type=int,
              help="Steal requests a server may have outstanding (requests; 0: unlimited).")
@click.option("--steal-timeout", default=2000.0, show_default=True, type=float,
              help="A steal request unanswered this long is given up, µs.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run (JSON lines).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a p99-versus-load plot (PNG).")
def sim(rack, policies, workloads, loads, tasks, seed, delay, jitter, window, sched, quantum,
        shares, loss, clients, warmup, phase, ewma, gateway_ns, capacity, steals_in_flight,
        steal_timeout, as_json, plot):
    """Simulate a rack: p50/p99/p99.9 latency, throughput, migrations and steals.

    Sweeps run every combination of --policy, --workload and --load.
    """
    from malcolm.policy.registry import parse_policy
    from malcolm.sim.rack import parse_rack_spec
    from malcolm.sim.run import simulate
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

    def one(p, w, ld):
        try:
            r = simulate(rack=rack, policy=p, workload=w, load=ld, tasks=tasks, seed=seed,
                         delay_us=delay, jitter_us=jitter, window_us=window, sched=sched,
                         quantum_us=quantum, shares=shares, loss=loss, clients=clients,
                         warmup=warmup, phase=phase, gateway_ns=gateway_ns,
                         capacity=capacity, max_steals_in_flight=steals_in_flight,
                         steal_timeout_us=steal_timeout,
                         **({} if ewma is None else {"ewma": ewma}))
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        # keep the summary only: a sweep of 10^6-task runs would otherwise hold GBs
        r.latencies_us = r.types = r.service_us = r.loads = None
        results.append(r)
        if as_json:
            click.echo(json.dumps(r.summary()))

    if len(runs) == 1:
        one(*runs[0])
    else:
        with click.progressbar(runs, label="simulating", file=sys.stderr,
                               item_show_func=lambda x: x and f"{x[0]} {x[1]} {x[2]:g}") as bar:
            for item in bar:
                one(*item)
    if not as_json:
        click.echo(_table([_row(r) for r in results]))
    if plot:
        plot_p99(results, plot, title=f"rack {rack}, delay {delay:g} µs")
        click.echo(f"wrote {plot}", err=True)
