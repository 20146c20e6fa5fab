"""Thesis Figs 7.3 and 7.4, runtime side: p99 against load on a real local rack serving
RocksDB GET(n) (the ``rocksdb`` handler), for Malcolm, JSQ, JBT and client power-of-2.

Every server is a ``malcolm serve`` process with the ``rocksdb`` handler on one shared
1 000 000-key dictionary of 16-byte values (built first if missing); ``malcolm loadgen``'s
native client sends ``--app`` requests (every value checked) at a fraction of the rack's
nominal capacity (workers / mean service time of the measured workload). Homogeneous: 3
servers x 1 worker. Heterogeneous: 1 server x 2 workers + 2 x 1. No time dilation: on a
2-vCPU machine the rack, its gateways and the generator share two cores, so the rack
saturates far below its nominal capacity, and the figures say so.

Writes ``fig7_3_rack.{csv,png}``, ``fig7_4_rack.{csv,png}`` and the run's JSON.

    python3 bench/figures/fig7_3_4_rack.py [--outdir DIR] [--db PATH] [--app rocksdb1]
        [--load 0.05,0.1,0.2,0.3] [--duration 2s] [--servers homo|hetero|SPEC]
"""

import argparse
import csv
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from malcolm import _argparse as g  # noqa: E402
from malcolm.net.ports import free_udp_ports  # noqa: E402
from malcolm.workloads import parse_workload  # noqa: E402

# this script's presets: racks small enough for a few cores
RACKS = {"homo": ("fig7_3_rack", [1, 1, 1], "homogeneous 3 x 1 worker"),
         "hetero": ("fig7_4_rack", [2, 1, 1], "heterogeneous 1 x 2 + 2 x 1 workers")}


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
# name: (server [policy] table, client policy)
POLICIES = {"Malcolm": ({"name": "malcolm", "seed": 1}, None), "JSQ": ({"name": "jsq"}, None),
            "JBT": ({"name": "jbt"}, None),
            "client po2": ({"name": "jbt", "threshold": 1e9}, "po2")}


def _ports(n):
    return free_udp_ports(n)


def rack_toml(policy, workers, db, window_us):
    lines = ["[rack]", 'name = "kv"', 'transport = "udp"', 'poll = "adaptive"',
             f"window_us = {window_us}", f'handler = "rocksdb:path={db}"', "", "[policy]"]
    lines += [f"{k} = {json.dumps(v) if isinstance(v, str) else v}" for k, v in policy.items()]
    for p, w in zip(_ports(len(workers)), workers, strict=True):
        lines += ["", "[[server]]", f'address = "127.0.0.1:{p}"', f"workers = {w}"]
    return "\n".join(lines) + "\n"


def main():
    ap = g.parser(__doc__, """
        python3 bench/figures/fig7_3_4_rack.py --servers hetero --load 0.1,0.2 --duration 1s
        python3 bench/figures/fig7_3_4_rack.py --servers 2x2 --app rocksdb2 --json -""")
    ap.add_argument("--outdir", default=os.path.join("out", "figures"), metavar="DIR",
                    help="directory of the CSV, PNG and JSON files (default out/figures)")
    ap.add_argument("--db", default=os.path.join(tempfile.gettempdir(), "malcolm-kv-1m"),
                    help="the RocksDB dictionary (built if missing)")
    ap.add_argument("--app", default="rocksdb1", choices=("rocksdb1", "rocksdb2"),
                    help="the request mix (default rocksdb1)")
    ap.add_argument("--load", type=g.loads, action="extend", default=None, metavar="LOADS",
                    help="loads, fractions of the nominal capacity: 0.05,0.1 or "
                         "0.1:0.3:0.1 (default 0.05,0.1,0.2,0.3); repeatable")
    ap.add_argument("--duration", type=g.duration("s", positive=True), default=2.0,
                    metavar="DURATION", help="measured time per load (bare number: s; "
                                             "default 2s)")
    ap.add_argument("--warmup", type=g.duration("s"), default=0.5, metavar="DURATION",
                    help="time before each measurement (bare number: s; default 500ms)")
    ap.add_argument("--window", dest="window_us", type=g.duration("us", positive=True),
                    default=1000.0, metavar="DURATION",
                    help="the rack's window (bare number: µs; default 1ms)")
    ap.add_argument("--servers", action="append", type=servers, default=None, metavar="SPEC",
                    help="the rack: homo (3 x 1 worker), hetero (1 x 2 + 2 x 1) or "
                         "COUNTxWORKERS,...; repeatable (default: both presets)")
    g.add_json(ap, "every row")
    g.hidden_alias(ap, "--out", "outdir")
    g.hidden_alias(ap, "--loads", "load", type=g.loads, action="extend")
    g.hidden_alias(ap, "--window-us", "window_us", type=g.duration("us", positive=True))
    g.hidden_alias(ap, "--rack", "rack_old", choices=("homo", "hetero", "both"))
    a = ap.parse_args()
    g.json_stdout(a)
    old = getattr(a, "rack_old", None)
    racks = a.servers or [RACKS[k] for k in ("homo", "hetero") if old in (None, k, "both")]
    from malcolm.loadgen import apps
    from malcolm.loadgen.run import LoadSpec, Target, run_load
    from malcolm.runtime.launcher import LocalRack
    from malcolm.workers import rocksdb as rdb
    if not os.path.exists(os.path.join(a.db, "CURRENT")):
        print(f"building {a.db}", file=sys.stderr)
        rdb.load(a.db, 1_000_000, 16)
    db = rdb.open_handler(f"path={a.db}")
    app = apps.parse_app(a.app, db.n_keys, db.value_size)
    mean_us = parse_workload(f"{a.app}-measured").mean_us
    loads = a.load or [0.05, 0.1, 0.2, 0.3]
    os.makedirs(a.outdir, exist_ok=True)
    everything = []
    for name, workers, title in racks:
        capacity = sum(workers) / (mean_us * 1e-6)
        rows = []
        for label, (pol, client_pol) in POLICIES.items():
            if pol["name"] == "malcolm":
                pol = dict(pol, load_scale=mean_us * 1e3, window_ns=int(a.window_us * 1e3))
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "rack.toml")
                with open(path, "w") as f:
                    f.write(rack_toml(pol, workers, a.db, a.window_us))
                lr = LocalRack(path, logdir=tmp)
                with lr:
                    spec = LoadSpec(Target("udp", lr.cfg.addresses, path),
                                    duration_s=a.duration, warmup_s=a.warmup, timeout_s=1.0,
                                    policy=client_pol, seed=7, app=app)
                    for ld in loads:
                        rep = run_load(spec, ld * capacity)
                        alive = all(p.poll() is None for p in lr.procs.values())
                        ap_ = rep["app"]
                        row = dict(series=label, app=a.app, load=ld, rate=ld * capacity,
                                   throughput=rep["throughput_per_s"],
                                   p50_us=rep["latency_us"]["p50"],
                                   p99_us=rep["latency_us"]["p99"],
                                   p99_get16_us=ap_["types"][0]["latency_us"]["p99"],
                                   p99_get64_us=ap_["types"][1]["latency_us"]["p99"],
                                   completed=rep["completed"], timed_out=rep["timed_out"],
                                   rejected=rep["rejected_total"], migrated=rep["migrated"],
                                   wrong_values=ap_["wrong_values"], checked=ap_["checked"],
                                   late_sends=rep["schedule"]["late_fraction"],
                                   servers_up=alive, load_avg=os.getloadavg()[0])
                        rows.append(row)
                        print(f"{name} {label:>11} load {ld:.2f} ({ld * capacity:6.0f}/s): "
                              f"p50 {row['p50_us']:8.1f} µs p99 {row['p99_us']:9.1f} µs, "
                              f"{row['checked']} checked, {row['wrong_values']} wrong, "
                              f"{row['timed_out']} timed out", file=sys.stderr)
        with open(os.path.join(a.outdir, f"{name}.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        _plot(rows, os.path.join(a.outdir, f"{name}.png"),
              f"{name.replace('fig', 'Fig ').replace('_', '.', 1)}: real rack, {title}, "
              f"{a.app} (nominal capacity {capacity:.0f}/s)")
        everything.append({"figure": name, "workers": workers, "capacity": capacity,
                           "rows": rows})
    g.write_json(a, {"runs": everything}, os.path.join(a.outdir, "fig7_3_4_rack.json"))
    g.write_json(a, {"runs": everything})


def _plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in dict.fromkeys(r["series"] for r in rows):
        pts = sorted((r["load"], r["p99_us"]) for r in rows if r["series"] == s)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=s)
    ax.set_yscale("log")
    ax.set_xlabel("offered load (fraction of nominal capacity)")
    ax.set_ylabel("p99 latency (µs)")
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
