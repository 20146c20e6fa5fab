"""How close a handler's real service times are to the requested ones, measured the way a
server measures them (around the handler call, per worker), under open-loop load.

    python bench/handler_accuracy.py [--handlers bench,sleep,spin:tsc] [--workers 2]
        [--load 0.5] [--duration 3s] [--workload mix:1:const:50] [--json [FILE|-]]

Prints, per handler: requested mean (the load generator's), measured mean/p50/p99 (the
server's service-time histogram) and the mean's error in percent.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malcolm import _argparse as g  # noqa: E402


def measure(handler, workload, workers, load, duration, poll="adaptive", cpus=None):
    from malcolm.loadgen.run import LoadSpec, Target, run_load
    from malcolm.net.ports import free_udp_ports
    from malcolm.runtime.config import build_server, parse_rack
    from malcolm.workloads import parse_workload
    addr = f"127.0.0.1:{free_udp_ports(1)[0]}"
    srv_cfg = {"address": addr}
    if cpus:
        srv_cfg["cpus"] = cpus
    cfg = parse_rack({"rack": {"name": "hacc", "transport": "udp", "workers": workers,
                               "handler": handler, "window_us": 1000.0, "grace_s": 0.5,
                               "poll": poll},
                      "policy": {"name": "random"}, "server": [srv_cfg]}, "<hacc>")
    srv = build_server(cfg, 0).start()
    mean = parse_workload(workload).mean_us
    try:
        rep = run_load(LoadSpec(Target("udp", [addr], "bench"), workload=workload,
                                duration_s=duration, warmup_s=0.5),
                       load * workers / (mean * 1e-6))
        svc = srv.stats()["service"]
        cal = srv.handler_obj.calibration()
    finally:
        srv.stop(0.5)
    req = rep["service_us"]["requested_mean"]
    return {"handler": handler, "requested_mean_us": req, "server_mean_us": svc["mean_us"],
            "server_p50_us": svc["p50_us"], "server_p99_us": svc["p99_us"],
            "count": svc["count"], "error_pct": 100 * (svc["mean_us"] / req - 1),
            "client_measured_mean_us": rep["service_us"]["measured_mean"],
            "margins_us": [round(m, 1) for m, _, _ in cal] if cal else None}


def main():
    ap = g.parser(__doc__, """
        python bench/handler_accuracy.py
        python bench/handler_accuracy.py --handlers spin:tsc --duration 2s --json -""")
    ap.add_argument("--handlers", default="bench,sleep,spin:tsc",
                    help="handlers to measure, comma-separated (default bench,sleep,spin:tsc)")
    ap.add_argument("--workload", default="mix:1:const:50",
                    help="service times in µs (default mix:1:const:50)")
    ap.add_argument("--workers", type=int, default=2, help="workers (default 2)")
    ap.add_argument("--load", type=float, default=0.5,
                    help="load, a fraction of the workers' capacity (default 0.5)")
    ap.add_argument("--duration", type=g.duration("s", positive=True), default=3.0,
                    metavar="DURATION", help="per handler (bare number: s; default 3s)")
    ap.add_argument("--poll", default="adaptive", choices=("adaptive", "busy"),
                    help="the server's poll mode (default adaptive)")
    ap.add_argument("--cpus", default=None, help="e.g. 2,3,4 (gateway, workers)")
    g.add_json(ap, "every handler's row")
    a = ap.parse_args()
    g.json_stdout(a)
    rows = []
    cpus = [int(x) for x in a.cpus.split(",")] if a.cpus else None
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}; workload "
          f"{a.workload}, {a.workers} workers at load {a.load}, {a.duration} s, poll {a.poll}")
    for h in a.handlers.split(","):
        r = measure(h, a.workload, a.workers, a.load, a.duration, a.poll, cpus)
        rows.append(r)
        print(f"{h:<10} requested {r['requested_mean_us']:8.2f} µs  server mean "
              f"{r['server_mean_us']:8.2f} p50 {r['server_p50_us']:8.2f} p99 "
              f"{r['server_p99_us']:8.2f}  error {r['error_pct']:+6.2f}%  n {r['count']}"
              f"  margins {r['margins_us']}")
    g.write_json(a, {"rows": rows})


if __name__ == "__main__":
    main()
