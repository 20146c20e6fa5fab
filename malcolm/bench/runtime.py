"""``malcolm bench runtime``: the runtime's figures, each beside its floor measured in the same run.

* **round trip**: one task at a time through a real server (client -> gateway -> worker with
  the ``echo`` handler -> response), both sides busy-polling, p50/p99; again with
  ``workers=0`` (the gateway runs the task) and with a server that blocks when idle; floor:
  a plain-C ping-pong over the same transport (UDP loopback; two shared-memory rings). A
  run with more spinning threads than CPUs gets no ratio.
* **gateway throughput per core**: a server flooded with no-op (``echo``, 0 ns) tasks; tasks
  answered per second of gateway time, the larger of per CPU second and per busy second
  (see ``gateway_throughput``); floor: a plain-C reflector that receives and answers
  messages in batches (recvmmsg/sendmmsg, or ring peek/push), measured the same way.
* **decision overhead**: the gateway's per-task work besides I/O: a timestamp, the policy's
  ``decide_arrival`` and the enqueue (estimator note, MPMC push, the worker's pop); floor: a
  clock read, a xoshiro draw with a 4-entry CDF scan and an SPSC push+pop.

The server runs in this process (its threads are native and release the GIL), so that the
gateway thread's CPU clock can be read.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from malcolm.net.ports import free_udp_ports


def _unkeyed_is_known(record):
    """A logging filter: the benchmark's servers are unkeyed on purpose (one server on
    loopback, the floor measured without a MAC too), so the server's warning about it,
    printed eight times above the table, says nothing here."""
    return "no rack key" not in record.getMessage()


def _server(kind, poll, workers=1, spin_us=50.0):
    import logging

    from malcolm.runtime.config import build_server, parse_rack
    log = logging.getLogger("malcolm.server")
    addr = f"127.0.0.1:{free_udp_ports(1)[0]}" if kind == "udp" else f"rb{os.getpid():x}"[:16]
    cfg = parse_rack({"rack": {"name": "bench", "transport": kind, "poll": poll,
                               "workers": workers, "handler": "echo", "spin_us": spin_us,
                               "window_us": 1000.0, "grace_s": 0.5},
                      "policy": {"name": "random"},      # one server: always accepts
                      "server": [{"address": addr}]}, "<bench>")
    log.addFilter(_unkeyed_is_known)        # only while this server starts: a filter left
    try:                                    # on the logger hid every later server's warning
        return build_server(cfg, 0).start(), addr
    finally:
        log.removeFilter(_unkeyed_is_known)


def _gateway_cpu_clock():
    for t in threading.enumerate():
        if t.name == "malcolm-gateway":
            return time.pthread_getcpuclockid(t.ident)
    raise RuntimeError("no malcolm-gateway thread found")


def _pct(a):
    a = np.asarray(a)
    return {"p50_us": float(np.percentile(a, 50)) / 1e3,
            "p99_us": float(np.percentile(a, 99)) / 1e3}


def round_trip(kind, n=20000, poll="busy", max_s=3.0, spin_us=0.0, workers=1):
    """Floor and malcolm round trips over ``kind``; dict of p50/p99 (µs) and ratios.
    ``workers=0``: the gateway runs the task itself (no hand-off to a worker thread)."""
    from malcolm.bench import runtime_native
    from malcolm.net.transport import open_transport
    # A server that blocks when idle is compared with a ping-pong whose answering side blocks
    # too (udp: in recv; shm: on the ring's futex doorbell, as the shm transport does); the
    # client side busy-polls in both.
    blocking = poll == "adaptive"
    f = runtime_native.floor_pingpong(kind, n, max_s=max_s, block=blocking)
    floor = _pct(f)
    floor["blocking"] = blocking
    # Spinning threads on the path: the client, and for a busy server its gateway and its
    # worker (the policy thread sleeps). More spinners than CPUs are time-sliced by the
    # kernel, and the figure then measures the scheduler, not the server.
    spinners = 1 + (1 + workers if poll == "busy" else 0)
    cpus = len(os.sched_getaffinity(0))
    srv, addr = _server(kind, poll, workers=workers, spin_us=spin_us)
    tr = open_transport(kind, None if kind == "shm" else "127.0.0.1:0")
    try:
        m = runtime_native.ping_server(tr, addr, n, warm=min(1000, n // 10), max_s=max_s)
        mal = _pct(m)
        mal["n"] = int(m.size)
        floor["n"] = int(f.size)
    finally:
        tr.close()
        srv.stop(0.5)
    return {"floor": floor, "malcolm": mal, "poll": poll, "spin_us": spin_us,
            "workers": workers,
            "spinners": spinners, "cpus": cpus, "oversubscribed": spinners > cpus,
            "ratio_p50": mal["p50_us"] / floor["p50_us"],
            "ratio_p99": mal["p99_us"] / floor["p99_us"]}


def gateway_throughput(kind, seconds=2.0, workers=1):
    """Tasks per second of gateway time with no-op tasks, beside the reflector floor.

    Two denominators: the gateway thread's CPU time (what the kernel charged it, idle
    polling included) and its busy time (loop passes that moved a message or a task, which
    the gateway counts itself; the floor reflector counts its own the same way). On a
    machine with fewer cores than flooder + gateway + worker, the gateway waits for its
    worker, and only the busy figure says what a pass costs.
    """
    from malcolm.bench import runtime_native
    from malcolm.net.transport import open_transport
    f = runtime_native.floor_reflect(kind, seconds)
    floor = {"per_cpu_s": f["count"] / f["cpu_s"], "per_wall_s": f["count"] / f["wall_s"],
             "per_busy_s": f["count"] / f["busy_s"] if f["busy_s"] > 0 else float("nan"),
             "cpu_share": f["cpu_s"] / f["wall_s"]}
    srv, addr = _server(kind, "adaptive", workers)
    tr = open_transport(kind, None if kind == "shm" else "127.0.0.1:0",
                        **({"capacity": 4096} if kind == "shm" else {}))
    try:
        clk = _gateway_cpu_clock()
        s0, c0, w0 = srv.stats(), time.clock_gettime_ns(clk), time.monotonic()
        runtime_native.flood_server(tr, addr, seconds)
        s1, c1, w1 = srv.stats(), time.clock_gettime_ns(clk), time.monotonic()
    finally:
        tr.close()
        srv.stop(0.5)
    done = s1["responses"] - s0["responses"]
    cpu = (c1 - c0) / 1e9
    busy = (s1["gateway_busy_ns"] - s0["gateway_busy_ns"]) / 1e9
    nan = float("nan")
    mal = {"per_cpu_s": done / cpu if cpu > 0 else nan,
           "per_busy_s": done / busy if busy > 0 else nan,
           "per_wall_s": done / (w1 - w0), "cpu_share": cpu / (w1 - w0),
           "busy_share": busy / (w1 - w0)}
    # Each denominator overstates the time a task costs (idle polling; preemption while
    # busy), so the larger rate of the two is the better bound on what a core can do.
    for d in (floor, mal):
        d["per_core_s"] = max(d["per_cpu_s"], d["per_busy_s"])
    return {"floor": floor, "malcolm": mal,
            "ratio": floor["per_core_s"] / mal["per_core_s"],
            "ratio_cpu": floor["per_cpu_s"] / mal["per_cpu_s"],
            "ratio_busy": floor["per_busy_s"] / mal["per_busy_s"]}


def decision(repeats=5, iters=300_000):
    """Best-of-``repeats`` ns per task of the decision path, per policy, and the floor."""
    from malcolm.bench import runtime_native
    from malcolm.policy.registry import make_policy
    out = {"floor_ns": min(runtime_native.decision_floor(iters)["total_ns"]
                           for _ in range(repeats))}
    for name in ("random", "jsq", "malcolm"):
        pol = make_policy(name, 4, 0, 1)
        runs = [runtime_native.decision_overhead(pol, iters) for _ in range(repeats)]
        out[name] = {k: min(r[k] for r in runs) for k in
                     ("timestamp_ns", "decide_ns", "enqueue_ns", "total_ns")}
        out[name]["ratio"] = out[name]["total_ns"] / out["floor_ns"]
    return out


# Message sizes of the wire format, trailer included: an empty task, a response, a heartbeat
# with 16 critic parameters, a task with a 1 KiB payload.
MAC_SIZES = {"task": 64, "response": 80, "heartbeat": 216, "task_1k": 1088}


def mac(repeats=5, reps=200_000):
    """Best-of-``repeats`` ns per message to seal and to verify its SipHash-2-4 MAC."""
    from malcolm.bench import runtime_native
    out = {}
    for name, size in MAC_SIZES.items():
        runs = [runtime_native.mac_cost(size, reps) for _ in range(repeats)]
        out[name] = {"bytes": size, "seal_ns": min(r["seal_ns"] for r in runs),
                     "open_ns": min(r["open_ns"] for r in runs)}
    return out


def run_all(quick=False, transports=("udp", "shm")):
    n = 3000 if quick else 20000
    secs = 0.5 if quick else 2.0
    max_s = 0.5 if quick else 3.0
    res = {"machine": machine(), "round_trip": {}, "gateway_throughput": {}}
    for kind in transports:
        res["round_trip"][kind] = round_trip(kind, n, max_s=max_s)
        # The same, with the gateway running each task itself: two spinning threads
        # (client, gateway), which a 2-CPU machine can hold.
        res["round_trip"][kind + "_inline"] = round_trip(kind, n, max_s=max_s, workers=0)
        # adaptive with no spin: the server's threads block as soon as they are idle, which
        # on a machine with fewer free cores than spinning threads beats spinning
        res["round_trip"][kind + "_blocking"] = round_trip(kind, n, poll="adaptive",
                                                           max_s=max_s, spin_us=0.0)
        res["gateway_throughput"][kind] = gateway_throughput(kind, secs)
    res["decision"] = decision(3 if quick else 5, 100_000 if quick else 300_000)
    res["mac"] = mac(3 if quick else 5, 50_000 if quick else 200_000)
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
             f"{'round trip (µs)':<40}{'floor p50':>10}{'p99':>9}{'malcolm p50':>13}{'p99':>9}"
             f"{'x p50':>9}{'x p99':>9}"]
    for k, r in res["round_trip"].items():
        f, mm = r["floor"], r["malcolm"]
        mode = "server busy" if r["poll"] == "busy" else "server blocks"
        if r.get("workers") == 0:
            mode += ", inline"
        fl = ", so does floor's" if f.get("blocking") else ""
        line = (f"{k.split('_')[0] + ' (' + mode + fl + ')':<40}{f['p50_us']:10.1f}"
                f"{f['p99_us']:9.1f}{mm['p50_us']:13.1f}{mm['p99_us']:9.1f}")
        if r.get("oversubscribed"):
            line += f"   no ratio: {r['spinners']} spinning threads on {r['cpus']} CPUs"
        else:
            line += f"{r['ratio_p50']:9.2f}{r['ratio_p99']:9.2f}"
        lines.append(line)
    lines += ["", "gateway throughput, no-op tasks, M tasks per second of gateway time: per CPU "
                  "second / per busy second / per core (the larger)",
              f"{'':<8}{'floor cpu':>10}{'busy':>7}{'core':>7}{'malcolm cpu':>13}{'busy':>7}"
              f"{'core':>7}{'x core':>8}{'malcolm /s':>12}{'gw cpu':>8}{'gw busy':>9}"]
    for k, r in res["gateway_throughput"].items():
        f, mm = r["floor"], r["malcolm"]
        lines.append(f"{k:<8}{f['per_cpu_s'] / 1e6:10.2f}{f['per_busy_s'] / 1e6:7.2f}"
                     f"{f['per_core_s'] / 1e6:7.2f}{mm['per_cpu_s'] / 1e6:13.2f}"
                     f"{mm['per_busy_s'] / 1e6:7.2f}{mm['per_core_s'] / 1e6:7.2f}"
                     f"{r['ratio']:8.2f}{mm['per_wall_s'] / 1e6:12.3f}"
                     f"{100 * mm['cpu_share']:7.0f}%{100 * mm['busy_share']:8.0f}%")
    d = res["decision"]
    lines += ["", f"decision path per task (ns): floor {d['floor_ns']:.1f}"]
    lines.append(f"{'policy':<10}{'timestamp':>10}{'decide':>8}{'enqueue':>9}{'total':>8}"
                 f"{'x floor':>9}")
    for name in ("random", "jsq", "malcolm"):
        r = d[name]
        lines.append(f"{name:<10}{r['timestamp_ns']:10.1f}{r['decide_ns']:8.1f}"
                     f"{r['enqueue_ns']:9.1f}{r['total_ns']:8.1f}{r['ratio']:9.2f}")
    if "mac" in res:
        lines += ["", "authentication per message (ns, SipHash-2-4 under the rack key; "
                      "bench/mac_cost.c compares HMAC-SHA256 and BLAKE2b)",
                  f"{'message':<12}{'bytes':>7}{'seal':>8}{'verify':>8}"]
        for name, r in res["mac"].items():
            lines.append(f"{name:<12}{r['bytes']:7d}{r['seal_ns']:8.1f}{r['open_ns']:8.1f}")
    return "\n".join(lines)
