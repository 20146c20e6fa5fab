"""``malcolm bench runtime``: the runtime's figures, each beside its floor measured in the same run.

* **round trip**: one task at a time through a real server (client -> gateway -> worker with
  the ``echo`` handler -> response), both sides busy-polling, p50/p99; floor: a plain-C
  ping-pong over the same transport (UDP loopback; two shared-memory rings).
* **gateway throughput per core**: a server flooded with no-op (``echo``, 0 ns) tasks; tasks
  answered per second of the gateway thread's own CPU time; floor: a plain-C reflector that
  receives and answers messages in batches (recvmmsg/sendmmsg, or ring peek/push), per
  second of its CPU time.
* **decision overhead**: the gateway's per-task work besides I/O: a timestamp, the policy's
  ``decide_arrival`` and the enqueue (estimator note, MPMC push, the worker's pop); floor: a
  clock read, a xoshiro draw with a 4-entry CDF scan and an SPSC push+pop.

The server runs in this process (its threads are native and release the GIL), so that the
gateway thread's CPU clock can be read.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np


def _free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _server(kind, poll, workers=1, spin_us=50.0):
    from malcolm.config import build_server, parse_rack
    addr = f"127.0.0.1:{_free_port()}" if kind == "udp" else f"rb{os.getpid():x}"[:16]
    cfg = parse_rack({"rack": {"name": "bench", "transport": kind, "poll": poll,
                               "workers": workers, "handler": "echo", "spin_us": spin_us,
                               "window_us": 1000.0, "grace_s": 0.5},
                      "policy": {"name": "random"},      # one server: always accepts
                      "server": [{"address": addr}]}, "<bench>")
    return build_server(cfg, 0).start(), addr


def _gateway_cpu_clock():
    for t in threading.enumerate():
        if t.name == "malcolm-gateway":
            return time.pthread_getcpuclockid(t.ident)
    raise RuntimeError("no malcolm-gateway thread found")


def _pct(a):
    a = np.asarray(a)
    return {"p50_us": float(np.percentile(a, 50)) / 1e3,
            "p99_us": float(np.percentile(a, 99)) / 1e3}


def round_trip(kind, n=20000, poll="busy", max_s=3.0, spin_us=0.0):
    """Floor and malcolm round trips over ``kind``; dict of p50/p99 (µs) and ratios."""
    from malcolm.loadgen import _bench as B
    from malcolm.net.transport import open_transport
    # A server that blocks when idle is compared with a ping-pong whose answering side blocks
    # too (udp: in recv; shm: on the ring's futex doorbell, as the shm transport does); the
    # client side busy-polls in both.
    blocking = poll == "adaptive"
    f = B.floor_pingpong(kind, n, max_s=max_s, block=blocking)
    floor = _pct(f)
    floor["blocking"] = blocking
    srv, addr = _server(kind, poll, spin_us=spin_us)
    tr = open_transport(kind, None if kind == "shm" else "127.0.0.1:0")
    try:
        m = B.ping_server(tr, addr, n, warm=min(1000, n // 10), max_s=max_s)
        mal = _pct(m)
        mal["n"] = int(m.size)
        floor["n"] = int(f.size)
    finally:
        tr.close()
        srv.stop(0.5)
    return {"floor": floor, "malcolm": mal, "poll": poll, "spin_us": spin_us,
            "ratio_p50": mal["p50_us"] / floor["p50_us"],
            "ratio_p99": mal["p99_us"] / floor["p99_us"]}


def gateway_throughput(kind, seconds=2.0, workers=1):
    """Tasks per gateway-CPU-second with no-op tasks, beside the reflector floor."""
    from malcolm.loadgen import _bench as B
    from malcolm.net.transport import open_transport
    f = B.floor_reflect(kind, seconds)
    floor = {"per_cpu_s": f["count"] / f["cpu_s"], "per_wall_s": f["count"] / f["wall_s"],
             "cpu_share": f["cpu_s"] / f["wall_s"]}
    srv, addr = _server(kind, "adaptive", workers)
    tr = open_transport(kind, None if kind == "shm" else "127.0.0.1:0",
                        **({"capacity": 4096} if kind == "shm" else {}))
    try:
        clk = _gateway_cpu_clock()
        r0, c0, w0 = srv.stats()["responses"], time.clock_gettime_ns(clk), time.monotonic()
        B.flood_server(tr, addr, seconds)
        r1, c1, w1 = srv.stats()["responses"], time.clock_gettime_ns(clk), time.monotonic()
    finally:
        tr.close()
        srv.stop(0.5)
    cpu = (c1 - c0) / 1e9
    mal = {"per_cpu_s": (r1 - r0) / cpu if cpu > 0 else float("nan"),
           "per_wall_s": (r1 - r0) / (w1 - w0), "cpu_share": cpu / (w1 - w0)}
    return {"floor": floor, "malcolm": mal,
            "ratio": floor["per_cpu_s"] / mal["per_cpu_s"]}


def decision(repeats=5, iters=300_000):
    """Best-of-``repeats`` ns per task of the decision path, per policy, and the floor."""
    from malcolm.loadgen import _bench as B
    from malcolm.policy.registry import make_policy
    out = {"floor_ns": min(B.decision_floor(iters)["total_ns"] for _ in range(repeats))}
    for name in ("random", "jsq", "malcolm"):
        pol = make_policy(name, 4, 0, 1)
        runs = [B.decision_overhead(pol, iters) for _ in range(repeats)]
        out[name] = {k: min(r[k] for r in runs) for k in
                     ("timestamp_ns", "decide_ns", "enqueue_ns", "total_ns")}
        out[name]["ratio"] = out[name]["total_ns"] / out["floor_ns"]
    return out


def run_all(quick=False, transports=("udp", "shm")):
    n = 3000 if quick else 20000
    secs = 0.5 if quick else 2.0
    max_s = 0.5 if quick else 3.0
    res = {"machine": machine(), "round_trip": {}, "gateway_throughput": {}}
    for kind in transports:
        res["round_trip"][kind] = round_trip(kind, n, max_s=max_s)
        # adaptive with no spin: the server's threads block as soon as they are idle, which
        # on a machine with fewer free cores than spinning threads beats spinning
        res["round_trip"][kind + "_blocking"] = round_trip(kind, n, poll="adaptive",
                                                           max_s=max_s, spin_us=0.0)
        res["gateway_throughput"][kind] = gateway_throughput(kind, secs)
    res["decision"] = decision(3 if quick else 5, 100_000 if quick else 300_000)
    return res


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "load_avg": os.getloadavg()}


def table(res):
    m = res["machine"]
    lines = [f"machine: {m['cpus']} CPUs, {m['cpu']}, load average "
             f"{', '.join(f'{x:.1f}' for x in m['load_avg'])} (noisy: compare ratios)", "",
             f"{'round trip (µs)':<36}{'floor p50':>10}{'p99':>9}{'malcolm p50':>13}{'p99':>9}"
             f"{'x p50':>9}{'x p99':>9}"]
    for k, r in res["round_trip"].items():
        f, mm = r["floor"], r["malcolm"]
        mode = "server busy" if r["poll"] == "busy" else "server blocks"
        fl = ", so does floor's" if f.get("blocking") else ""
        lines.append(f"{k.split('_')[0] + ' (' + mode + fl + ')':<36}{f['p50_us']:10.1f}"
                     f"{f['p99_us']:9.1f}{mm['p50_us']:13.1f}{mm['p99_us']:9.1f}"
                     f"{r['ratio_p50']:9.2f}{r['ratio_p99']:9.2f}")
    lines += ["", f"{'gateway throughput':<36}{'floor /cpu-s':>13}{'malcolm /cpu-s':>16}"
                  f"{'x':>6}{'malcolm /s':>12}{'gw cpu':>8}"]
    for k, r in res["gateway_throughput"].items():
        lines.append(f"{k:<36}{r['floor']['per_cpu_s']:13.0f}{r['malcolm']['per_cpu_s']:16.0f}"
                     f"{r['ratio']:6.2f}{r['malcolm']['per_wall_s']:12.0f}"
                     f"{100 * r['malcolm']['cpu_share']:7.0f}%")
    d = res["decision"]
    lines += ["", f"decision path per task (ns): floor {d['floor_ns']:.1f}"]
    lines.append(f"{'policy':<10}{'timestamp':>10}{'decide':>8}{'enqueue':>9}{'total':>8}"
                 f"{'x floor':>9}")
    for name in ("random", "jsq", "malcolm"):
        r = d[name]
        lines.append(f"{name:<10}{r['timestamp_ns']:10.1f}{r['decide_ns']:8.1f}"
                     f"{r['enqueue_ns']:9.1f}{r['total_ns']:8.1f}{r['ratio']:9.2f}")
    return "\n".join(lines)
