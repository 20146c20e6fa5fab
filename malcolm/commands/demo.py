"""``malcolm demo``: the main job. A small heterogeneous rack on this machine, the same load
through Malcolm and two baselines, a comparison table and a plot.

The rack has fast servers (more workers) and slow ones (one worker), all with the ``sleep``
handler, so that service time costs no CPU and the whole rack fits on a 2-core machine. Each
policy gets a fresh rack (server-side policies are named in the rack file) and the same
open-loop Poisson load from ``malcolm loadgen``'s native client:

* ``malcolm``: Malcolm's actor-critic policy in every gateway, clients spread uniformly;
* ``jsq``: join-shortest-queue on heartbeats in every gateway, clients spread uniformly;
* ``po2``: client-side power-of-two on the loads piggybacked on responses; the gateways
  accept every task (``jbt`` with an unreachable threshold).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys
import tempfile
import threading
import time

import click

FULL = {"loads": (0.5, 0.7, 0.85), "duration": 3.0, "warmup": 1.0}
QUICK = {"loads": (0.5, 0.8), "duration": 0.8, "warmup": 0.3}
POLICIES = {
    # name: (server policy section, client policy)
    "malcolm": ({"name": "malcolm", "seed": 1}, None),
    "jsq": ({"name": "jsq"}, None),
    "po2": ({"name": "jbt", "threshold": 1e9}, "po2"),
}


def _free_udp_ports(n):
    """Ports that were free a moment ago (bind to port 0, read, release)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def rack_toml(policy, servers, window_us=1000.0, name="demo"):
    """The rack file of one demo run; ``servers`` is a list of (address, workers)."""
    lines = ["[rack]", f'name = "{name}"', 'transport = "udp"', 'poll = "adaptive"',
             f"window_us = {window_us}", 'handler = "sleep"', "capacity = 4096", "",
             "[policy]"]
    for k, v in policy.items():
        lines.append(f"{k} = {json.dumps(v) if isinstance(v, str) else v}")
    for addr, workers in servers:
        lines += ["", "[[server]]", f'address = "{addr}"', f"workers = {workers}"]
    return "\n".join(lines) + "\n"


class Demo:
    """One demo run; :meth:`run` returns the rows of the comparison table."""

    def __init__(self, quick=False, fast=2, slow=2, fast_workers=3, workload="exp:2000",
                 policies=("malcolm", "jsq", "po2"), loads=None, duration=None,
                 warmup=None, echo=print, logdir=None, window_us=1000.0):
        from malcolm.workloads import parse_workload
        cfg = QUICK if quick else FULL
        self.loads = tuple(loads or cfg["loads"])
        self.duration = duration or cfg["duration"]
        self.warmup = cfg["warmup"] if warmup is None else warmup
        self.workers = [fast_workers] * fast + [1] * slow
        self.wl = parse_workload(workload)
        self.workload = workload
        self.policies = list(policies)
        for p in self.policies:
            if p not in POLICIES:
                raise click.UsageError(f"unknown demo policy {p!r}; choose from "
                                       f"{', '.join(POLICIES)}")
        for x in self.loads:
            if not 0 < x < 1.5:
                raise click.UsageError(f"load {x} must be in (0, 1.5)")
        # capacity in tasks/s: every worker serves one task per mean service time
        self.capacity = sum(self.workers) / (self.wl.mean_us * 1e-6)
        self.echo = echo
        self.stop = threading.Event()
        self.logdir = logdir
        self.rack = None
        self.window_us = window_us

    def _run_policy(self, name, tmp):
        from malcolm.commands.rack import LocalRack
        from malcolm.loadgen.run import LoadSpec, Target, run_load
        server_pol, client_pol = POLICIES[name]
        if name == "malcolm":
            # Malcolm scales loads (ns) by load_scale before they enter its features; its
            # default suits ~50 µs tasks, so set it to this workload's mean service time.
            server_pol = dict(server_pol, load_scale=float(self.wl.mean_us * 1e3),
                              window_ns=int(self.window_us * 1e3))
        ports = _free_udp_ports(len(self.workers))
        servers = [(f"127.0.0.1:{p}", w) for p, w in zip(ports, self.workers, strict=True)]
        path = os.path.join(tmp, f"rack-{name}.toml")
        with open(path, "w") as f:
            f.write(rack_toml(server_pol, servers, window_us=self.window_us))
        logdir = os.path.join(self.logdir or tmp, f"logs-{name}")
        os.makedirs(logdir, exist_ok=True)
        self.rack = LocalRack(path, logdir=logdir)
        rows = []
        try:
            self.rack.up(timeout=60.0)
            spec = LoadSpec(Target("udp", [a for a, _ in servers], path),
                            workload=self.workload, duration_s=self.duration,
                            warmup_s=self.warmup, threads=1, timeout_s=1.0,
                            policy=client_pol, seed=7)
            for load in self.loads:
                if self.stop.is_set():
                    break
                rep = run_load(spec, load * self.capacity, self.stop)
                dead = [k for k, p in self.rack.procs.items() if p.poll() is not None]
                row = {"policy": name, "load": load, "report": rep, "dead_servers": dead}
                rows.append(row)
                self.echo(format_row(row))
                if dead:
                    raise click.ClickException(f"{name}: server(s) {dead} died; output in "
                                               f"{logdir}")
                if rep.get("interrupted"):
                    break
        finally:
            codes = self.rack.down()
            self.rack = None
            bad = {k: c for k, c in codes.items() if c != 0}
            if bad:
                self.echo(f"  note: {name} rack servers exited with {bad} (logs in {logdir})")
        return rows

    def run(self):
        rows = []
        with tempfile.TemporaryDirectory(prefix="malcolm-demo-") as tmp:
            for name in self.policies:
                if self.stop.is_set():
                    break
                rows += self._run_policy(name, tmp)
        return rows


HEADER = (f"{'policy':<8} {'load':>5} {'rate/s':>7} {'tput/s':>7} {'p50 µs':>8} "
          f"{'p99 µs':>8} {'p99.9 µs':>9} {'migr':>6} {'steals':>6} {'rej':>5} {'t/o':>5} "
          f"{'late':>6}")


def _n(v, w, d=0):
    return f"{v:{w}.{d}f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>{w}}"


def format_row(row):
    r = row["report"]
    lu = r["latency_us"]
    return (f"{row['policy']:<8} {row['load']:5.2f} {r['rate']:7.0f} "
            f"{r['throughput_per_s']:7.0f} {_n(lu['p50'], 8)} {_n(lu['p99'], 8)} "
            f"{_n(lu['p99.9'], 9)} {r['migrated']:6d} {r['stolen']:6d} "
            f"{r['rejected_total']:5d} {r['timed_out']:5d} "
            f"{100 * r['schedule']['late_fraction']:5.1f}%")


def plot(rows, path, title):
    """p50 and p99 against load, one colour per policy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"malcolm": "tab:red", "jsq": "tab:blue", "po2": "tab:green"}
    for name in dict.fromkeys(r["policy"] for r in rows):
        rs = [r for r in rows if r["policy"] == name]
        x = [r["load"] for r in rs]
        c = colors.get(name)
        ax.plot(x, [r["report"]["latency_us"]["p99"] / 1e3 for r in rs], "o-", color=c,
                label=f"{name} p99")
        ax.plot(x, [r["report"]["latency_us"]["p50"] / 1e3 for r in rs], "s--", color=c,
                alpha=0.6, label=f"{name} p50")
    ax.set_xlabel("offered load (fraction of the rack's capacity)")
    ax.set_ylabel("latency (ms, from intended send time)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command()
@click.option("--quick", is_flag=True, help="Two short load levels (for tests), ~30 s.")
@click.option("--out", "png", default="malcolm-demo.png", show_default=True,
              type=click.Path(dir_okay=False), help="Where to write the plot.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="Also write the rows (with every loadgen report) to this JSON file.")
@click.option("--policies", default="malcolm,jsq,po2", show_default=True,
              help="Comma-separated subset of malcolm, jsq, po2.")
@click.option("--loads", default=None,
              help="Comma-separated loads as fractions of capacity (default 0.5,0.7,0.85).")
@click.option("--duration", type=float, default=None, help="Seconds measured per load.")
@click.option("--workload", default="exp:2000", show_default=True,
              help="Service times (µs), as in `malcolm sim`.")
@click.option("--window-us", default=1000.0, show_default=True,
              help="Policy window (heartbeat period) of the demo racks, µs.")
@click.option("--logdir", default=None, type=click.Path(file_okay=False),
              help="Keep the servers' output here (default: a temporary directory).")
def demo(quick, png, json_path, policies, loads, duration, workload, window_us, logdir):
    """Run a small heterogeneous rack here and compare Malcolm with JSQ and client po2.

    Two fast servers (3 workers) and two slow ones (1 worker), `sleep` handler, UDP on
    loopback. For each policy a fresh rack is started, loaded at a few fractions of its
    capacity by the open-loop load generator, and torn down (also on Ctrl-C or an error).
    Prints p50/p99/throughput/migrations/steals per policy and load, and writes a PNG.
    """
    try:
        load_list = [float(x) for x in loads.split(",")] if loads else None
    except ValueError:
        raise click.UsageError(f"--loads {loads!r} must be numbers like 0.5,0.7") from None
    d = Demo(quick=quick, policies=[p.strip() for p in policies.split(",") if p.strip()],
             loads=load_list, duration=duration, workload=workload,
             echo=lambda s: (click.echo(s), sys.stdout.flush()), logdir=logdir,
             window_us=window_us)
    old_int = signal.signal(signal.SIGINT, lambda *a: d.stop.set())
    old_term = signal.signal(signal.SIGTERM, lambda *a: d.stop.set())
    t0 = time.monotonic()
    click.echo(f"malcolm demo: 4 servers (workers {d.workers}, sleep handler, udp, "
               f"{d.window_us:g} µs windows), "
               f"workload {d.wl.describe()}; capacity {d.capacity:.0f} tasks/s; loads "
               f"{', '.join(f'{x:g}' for x in d.loads)}; {d.duration:g} s each")
    click.echo(HEADER)
    try:
        rows = d.run()
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
    if d.stop.is_set():
        click.echo("malcolm demo: interrupted; the racks were stopped", err=True)
        sys.exit(130)
    if rows:
        plot(rows, png, f"malcolm demo: 4 servers, workers {d.workers}, {d.workload}")
        click.echo(f"plot: {png}")
    if json_path:
        from malcolm.commands.loadgen import _clean
        with open(json_path, "w") as f:
            json.dump(_clean({"capacity": d.capacity, "workers": d.workers,
                              "workload": d.workload, "rows": rows}), f, indent=1)
    bad = [r for r in rows if not r["report"]["accounted"]]
    click.echo(f"malcolm demo: done in {time.monotonic() - t0:.0f} s"
               + ("" if not bad else f"; {len(bad)} run(s) did not account for every task"))
    if bad:
        sys.exit(2)
