"""Long fault-injection runs against a real keyed rack (issue 13, item 7); the table of
docs/reliability.md comes from here.

    sudo .venv/bin/python bench/faults.py --duration 5s --rate 2000 [--json out.json]

Each scenario starts a fresh 3-server udp rack (``malcolm serve`` processes, a rack key,
policy jsq, one ``sleep`` worker each, 1 ms windows), runs the native load generator with
the key for ``--duration`` at ``--rate`` tasks/s (``exp:200`` µs), injects the fault, and
checks the invariant: every task the generator sent is completed, rejected with a reason,
or reported timed out; none is answered twice; forged messages are counted by the servers.

The netem scenarios (loss 1 % and 5 %, 1 ms ± 0.5 ms delay, reordering) run the rack and the
generator in a network namespace of their own whose loopback carries the netem qdisc (needs
root and iproute2; skipped with the reason otherwise). On a kernel without netem, loss falls
back to an nftables rule in the namespace (``apt-get install nftables``); delay and reorder
are then skipped. Nothing outside the namespace is touched.

The delay-stage scenarios inject the same faults without netem or root: every endpoint's
transport (servers and generator) delays, reorders or drops its own datagrams
(``[rack] hop_delay_us, hop_jitter_us, hop_reorder, hop_loss``; ``malcolm/net/delay.pyx``),
and the table gives the datagrams each stage delayed, sent ahead or dropped.

``--dilate K`` slows a run down K times, for machines that cannot keep the rack's schedule
(the Soft-RoCE guest under TCG, where netem exists): service times, windows,
``peer_timeout_ms``, ``max_wait_ms``, the client's timeout and netem's delays x K, the rate / K
(so the rack carries the same load); percentages (loss, reordering) and the fault
injectors' own times (a 0.5 s stop) stay. In the guest::

    scripts/rdma-vm --python .venv/bin/python -- \
        python bench/faults.py --only netem --duration 10s --rate 2000 --dilate 10

``--transport verbs`` runs the rack and the generator over verbs instead (in the Soft-RoCE
guest, as root): the scenarios of the first table, where the impostor on a dead server's
port is a queue pair of its own on that address without the key, plus "spoofed
introductions": address queries from a live server's address (a raw socket) that would put
it at the injector's queue pair. The netem and delay-stage scenarios stay udp's::

    scripts/rdma-vm --python .venv/bin/python --timeout 1800 -- \
        python bench/faults.py --transport verbs --duration 10s --rate 2000 --dilate 20

``--reform`` measures how many windows the rack's policy takes to re-form after a failure,
a restart and a join (issue 13 item 3), for jsq and malcolm; see :func:`reform`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from malcolm import _argparse as g

NETEM = {
    "netem loss 1%": "loss 1%",
    "netem loss 5%": "loss 5%",
    "netem delay 1ms ±0.5ms": "delay 1ms 500us",
    "netem reorder 25% (delay 1ms)": "delay 1ms reorder 75% 50%",
    # what only a real network does to a datagram: sends it twice, or flips a bit of it
    "netem duplicate 1%": "duplicate 1%",
    "netem corrupt 1%": "corrupt 1%",
}
# The same faults through the transports' delay stage (no netem needed): [rack] hop_* keys.
DELAY_STAGE = {
    "delay 1 ms + U[0, 0.5 ms) (delay stage)": {"delay_us": 1000.0, "jitter_us": 500.0},
    "delay 1ms, reorder 25% (delay stage)": {"delay_us": 1000.0, "reorder": 0.25},
    "loss 1% (delay stage)": {"loss": 0.01},
    "loss 5% (delay stage)": {"loss": 0.05},
}


SPOOFED = "spoofed introductions from live server 1's address"


def scenario(name, seconds, rate, dilate=1.0, transport="udp", keyed=True):
    """Run one scenario here (already inside its namespace if it needs one), every time of
    the rack and the load x ``dilate`` and the rate / ``dilate``, over ``transport``, with a
    rack key unless ``keyed=False`` (the control that shows what an attack does without)."""
    from malcolm.loadgen.faults import FaultRack, summary
    work = tempfile.mkdtemp(prefix="malcolm-faults-")
    k = dilate
    extra = f'max_wait_ms = {200.0 * k!r}'
    hop = DELAY_STAGE.get(name)
    if hop and k != 1.0:
        hop = {h: v * k if h.endswith("_us") else v for h, v in hop.items()}
    fr = FaultRack(work, policy='name = "jsq"', extra=extra, hop=hop, window_us=1000.0 * k,
                   peer_timeout_ms=100.0 * k, transport=transport, keyed=keyed).up()
    try:
        injected = "-"
        faults = []
        servers = None
        at = seconds * 0.3
        expected = "none"
        if name == "SIGKILL server 2 under load":
            faults = [(at, fr.kill(2))]
            injected = "1 kill"
            expected = "tasks sent to server 2 after the kill (and migrated to it within " \
                       "peer_timeout_ms)"
        elif name == "SIGSTOP server 1 for 0.5 s":
            faults = [(at, fr.stop_cont(1, 0.5))]
            injected = "1 stop"
        elif name == "restart server 2 (down 0.5 s)":
            faults = [(at, fr.restart(2, 0.5))]
            injected = "1 restart"
            expected = "tasks sent to server 2 while it was down"
        elif name == "impostor on dead server 2's port":
            fr.lr.kill(2)
            time.sleep(0.5)
            servers = fr.addresses[:2]
            faults = [(0.0, fr.impostor(2, seconds, kill=False))]
        elif name == SPOOFED:
            faults = [(at, fr.spoofed_introductions(0, 1, seconds * 0.5))]
        workload = f"exp:{200.0 * k!r}"
        rate = rate / k
        if name == "overload 2x capacity":
            workload = f"exp:{2000.0 * k!r}"
            rate = 2 * 3 * 500 / k        # 3 servers x 1 worker x 1/(2 ms)
            injected = f"{rate:g} tasks/s offered to a capacity of {rate / 2:g}"
            expected = "rejected with a reason (overloaded), not timed out"
        rep = fr.load(rate, seconds, faults=faults, servers=servers, timeout_s=1.0 * k,
                      workload=workload)
        time.sleep(1.2)
        stats = [fr.stats(k) for k in range(3)]
    finally:
        fr.down()
        shutil.rmtree(work, ignore_errors=True)
    if name.startswith("impostor"):
        imp = rep["faults"][0]
        injected = f"{sum(imp['sent'].values())} forged datagrams " \
                   f"({imp['sent']['heartbeats']} heartbeats with θ=1e308/NaN and seq jumps)"
        if transport == "verbs":
            injected = injected.replace("datagrams", "messages through a keyless queue pair")
            expected = (f"none; the impostor received {imp['received']['messages']} "
                        f"messages, its transport: {imp['transport']}")
    elif name == SPOOFED:
        sp = rep["faults"][0]
        injected = f"{sp['sent']} spoofed address queries (unsigned / another key)"
        expected = f"none; {sp['received']} messages reached the injector's queue pair"
    if hop:
        # what every endpoint's stage did: the servers' (their statistics) and the client's
        emu = [st.get("net_emulation", {}) for st in stats] + [rep.get("net_emulation", {})]
        tot = {k: sum(e.get(k, 0) for e in emu) for k in ("delayed", "reordered", "net_lost")}
        injected = ", ".join(f"{v} datagrams {what}" for k, what in (
            ("delayed", "delayed"), ("reordered", "sent ahead of delayed ones"),
            ("net_lost", "dropped")) if (v := tot[k]))
        expected = ("tasks whose task, forward or response was dropped (reported timed out)"
                    if "loss" in hop else "none")
    row = summary(name, injected, rep)
    row["expected_loss"] = expected
    row["rejected_by_reason"] = rep["rejected"]
    row["bad_mac_at_servers"] = sum(s.get("malformed_by_reason", {}).get("bad MAC", 0)
                                    for s in stats)
    # copies of a datagram already taken (netem duplicate): dropped by the replay windows
    row["replayed_at_servers"] = sum(s.get("malformed_by_reason", {}).get("replayed", 0)
                                     for s in stats)
    row["malformed_at_client"] = rep["malformed"]       # e.g. a response with a bit flipped
    row["transport"] = transport
    row["keyed"] = keyed
    # verbs: address datagrams the servers dropped, by reason; messages from unknown QPs
    tst = [st.get("transport", {}) for st in stats]
    row["ctl_dropped_at_servers"] = {c: sum(t.get(c, 0) for t in tst) for c in (
        "ctl_bad_mac", "ctl_replay", "ctl_unsolicited", "ctl_bad")} if transport == "verbs" \
        else None
    row["unknown_src_at_servers"] = sum(t.get("unknown_src", 0) for t in tst)
    row["p99_us"] = rep["latency_us"]["p99"]
    # answered after the client gave up: late (a stalled process), not lost
    row["late_responses"] = rep["late_responses"]
    row["sent_to"] = rep["per_server"]["sent"]
    row["dilate"] = k
    # under emulation a run that is late on its schedule is flagged, not silently kept
    row["late_fraction"] = rep["schedule"]["late_fraction"]
    return row


REFORM_WINDOW_US = 10_000.0     # 10 ms windows: a statistics snapshot (10 ms) per window
REFORM_POLICIES = {
    "jsq": 'name = "jsq"',
    # loads scaled by the mean service time (ns), one learning step per window
    "malcolm": 'name = "malcolm"\nseed = 1\nload_scale = 500000.0\nwindow_ns = 10000000',
}


def _series(fr, k, stop, out):
    """Poll server k's statistics (rewritten every 10 ms) into ``out`` until ``stop``."""
    seen = None
    while not stop.is_set():
        st = fr.stats(k)
        if st.get("mono_ns") and st["mono_ns"] != seen:
            seen = st["mono_ns"]
            out.append((st["mono_ns"], st["started_ns"], st.get("forwarded_in", 0)))
        time.sleep(0.003)


def _rate_between(pts, t0, t1):
    """Tasks/s received between t0 and t1 (ns), from (time, cumulative count) samples."""
    a = [p for p in pts if p[0] <= t0]
    b = [p for p in pts if p[0] <= t1]
    if not a or not b or b[-1][0] <= a[-1][0]:
        return None
    return (b[-1][1] - a[-1][1]) / ((b[-1][0] - a[-1][0]) / 1e9)


def _windows_to_steady(series, started_ns, steady, w_ns, span=3, frac=0.75):
    """Windows from ``started_ns`` until the server received, over ``span`` windows, at
    least ``frac`` of ``steady`` (tasks/s): the first sample that meets it (None: none)."""
    pts = [(t, f) for t, s0, f in series if s0 == started_ns]
    for t, _ in pts:
        got = _rate_between(pts, t - span * w_ns, t)
        if got is not None and got >= frac * steady:
            return (t - started_ns) / w_ns
    return None


def reform(policy, event, seconds=6.0, rate=3000.0):
    """How many windows the policy takes to re-form after ``event`` (failure, restart or
    join of server 2), on a 3-server rack (one ``sleep`` worker each, exp:500 µs tasks,
    capacity 6000/s, 10 ms windows), with the load offered to servers 0 and 1 only, so that
    server 2's work is what the survivors' policies send it.

    Re-formed means:

    * after a **failure** (SIGKILL): no survivor migrates a task to the dead server any
      more; measured as the last migration to it (each survivor's ``last_migrated_to_ns``)
      minus the time of the kill, in windows (0 if none was sent after it);
    * after a **restart** or a **join**: the server receives, over 3 windows, at least 3/4
      of the rate of tasks it receives in the steady state the rack settles in (the last
      second of the run); measured from its start. Not its capacity share: at this load a
      policy need not send it that much (Malcolm sends it about 0.2 of the arrivals, before
      a fault as after it), and the question is how fast the survivors' policies take it
      back, not where they settle.
    """
    import threading

    from malcolm.loadgen.faults import FaultRack
    w_ns = int(REFORM_WINDOW_US * 1000)
    work = tempfile.mkdtemp(prefix="malcolm-reform-")
    fr = FaultRack(work, policy=REFORM_POLICIES[policy], window_us=REFORM_WINDOW_US,
                   interval=0.01, extra="max_wait_ms = 200", peer_timeout_ms=None)
    series, stop, marks = [], threading.Event(), {}
    try:
        fr.up([0, 1] if event == "join" else None)
        poller = threading.Thread(target=_series, args=(fr, 2, stop, series), daemon=True)
        poller.start()
        at = seconds * 0.35

        def inject():
            if event == "failure":
                marks["t"] = time.monotonic_ns()
                fr.lr.kill(2)
            elif event == "restart":
                fr.lr.kill(2)
                time.sleep(0.3)
                fr.lr.start(2, wait=True)
            else:
                fr.lr.start(2, wait=True)
            return {}

        # the steady state: the load's last second but 0.2 s (it starts 20 ms after the
        # call, then 0.2 s of warm-up)
        marks["end"] = time.monotonic_ns() + int((0.2 + seconds - 0.2) * 1e9)
        rep = fr.load(rate, seconds, faults=[(at, inject)], workload="exp:500",
                      shares=[1.0, 1.0, 0.0], timeout_s=1.0)
        time.sleep(0.1)
    finally:
        stop.set()
        fr.down()
    st = [fr.stats(k) for k in range(3)]
    shutil.rmtree(work, ignore_errors=True)
    row = {"policy": policy, "event": event, "window_ms": REFORM_WINDOW_US / 1000,
           "sent": rep["sent"], "unaccounted": rep["unaccounted"],
           "timed_out": rep["timed_out"], "suspect_ms": st[0].get("suspect_ms")}
    if event == "failure":
        last = [st[k].get("last_migrated_to_ns", [0] * 3)[2] for k in (0, 1)]
        row["migrated_to_2"] = [st[k].get("migrated_to", [0] * 3)[2] for k in (0, 1)]
        row["windows"] = max(0.0, (max(last) - marks["t"]) / w_ns)
    else:
        started = max((s0 for _, s0, _ in series), default=0)
        pts = [(t, f) for t, s0, f in series if s0 == started]
        steady = _rate_between(pts, marks["end"] - int(1e9), marks["end"])
        row["steady_share"] = steady / rate if steady else None
        row["windows"] = _windows_to_steady(series, started, steady, w_ns) if steady else None
        row["forwarded_in"] = series[-1][2] if series else 0
    row["reformed_within_10"] = row["windows"] is not None and row["windows"] <= 10
    return row


def in_netns(name, qdisc, seconds, rate, dilate=1.0):
    """Run ``scenario(name)`` in a fresh network namespace whose loopback has ``qdisc`` (its
    times x ``dilate``), and count what netem did."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return {"fault": name, "skipped": "needs root, ip and tc"}
    ns = f"mcfault{os.getpid()}"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True,
                       capture_output=True)
        from malcolm.loadgen.faults import dilate_qdisc, impair, impairment
        try:
            how = impair(ns, dilate_qdisc(qdisc, dilate))
        except RuntimeError as e:
            return {"fault": name, "skipped": str(e)}
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--inside",
                            name, "--duration", str(seconds), "--rate", str(rate),
                            "--dilate", str(dilate)],
                           capture_output=True, text=True,
                           timeout=seconds * 10 + 300 + 2 * dilate)
        if r.returncode != 0:
            return {"fault": name, "error": r.stderr[-2000:]}
        row = json.loads(r.stdout.strip().splitlines()[-1])
        net = impairment(ns) or {}
        row["fault"] = name
        row["injected"] = how
        row["net_packets"] = net.get("packets")
        row["net_dropped"] = net.get("dropped")
        row["net_bad_checksum"] = net.get("bad_checksum")
        row["expected_loss"] = (
            "tasks whose task, forward or response was dropped (reported timed out)"
            if "loss" in qdisc else
            "tasks whose task, forward or response was corrupted: dropped for its udp "
            "checksum, or its MAC (reported timed out)" if "corrupt" in qdisc else "none")
        return row
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _dilation(text):
    try:
        k = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 1.0 <= k <= 1000.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [1, 1000]")
    return k


SCENARIOS = ["no fault", "SIGKILL server 2 under load", "SIGSTOP server 1 for 0.5 s",
             "restart server 2 (down 0.5 s)", "impostor on dead server 2's port",
             "overload 2x capacity"]


def main(argv=None):
    ap = g.parser(__doc__, """
        sudo .venv/bin/python bench/faults.py --duration 5s --rate 2k --json faults.json
        .venv/bin/python bench/faults.py --only SIGSTOP --duration 2s
        .venv/bin/python bench/faults.py --reform --repeat 1 --json -""")
    ap.add_argument("--duration", dest="seconds", type=g.duration("s", positive=True),
                    default=5.0, metavar="DURATION",
                    help="load time per scenario (bare number: s; default 5s)")
    ap.add_argument("--rate", type=g.rate, default=2000.0,
                    help="tasks per second (20k, 1.5M; default 2000)")
    ap.add_argument("--only", default=None, help="run only scenarios containing this")
    ap.add_argument("--dilate", type=_dilation, default=1.0, metavar="K",
                    help="every time x K, the rate / K, for a machine that cannot keep the "
                         "rack's schedule (the Soft-RoCE guest; default 1)")
    ap.add_argument("--transport", choices=("udp", "verbs"), default="udp",
                    help="the rack's transport (verbs: in the Soft-RoCE guest, as root; the "
                         "first table's scenarios and spoofed introductions; default udp)")
    ap.add_argument("--keyless", action="store_true",
                    help="a rack without a key: the control for the forgery scenarios")
    ap.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    g.add_json(ap, "every scenario's row")
    g.hidden_alias(ap, "--seconds", "seconds", type=g.duration("s", positive=True))
    ap.add_argument("--reform", action="store_true",
                    help="measure windows to re-form after failure/restart/join instead")
    ap.add_argument("--repeat", type=int, default=3, help="--reform runs per case")
    a = ap.parse_args(argv)
    if not a.inside:
        g.json_stdout(a)
    if a.reform:
        rows = []
        for policy in REFORM_POLICIES:
            for event in ("failure", "restart", "join"):
                if a.only and a.only not in f"{policy} {event}":
                    continue
                for _ in range(a.repeat):
                    row = reform(policy, event)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        g.write_json(a, {"rows": rows})
        return 0 if all(r["reformed_within_10"] for r in rows) else 1
    if a.inside:
        print(json.dumps(scenario("no fault" if a.inside in NETEM else a.inside,
                                  a.seconds, a.rate, a.dilate)))
        return 0
    rows = []
    if os.geteuid() == 0 and shutil.which("nft") is None and shutil.which("apt-get"):
        # The loss scenarios fall back to nftables where the kernel has no netem; install
        # it (as scripts/rdma-vm installs what the RDMA guest needs).
        print("faults: installing nftables (apt-get) for the loss scenarios", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-q", "nftables"], capture_output=True)
    names = SCENARIOS + ([SPOOFED] if a.transport == "verbs" else
                         list(DELAY_STAGE) + list(NETEM))
    for name in names:
        if a.only and a.only not in name:
            continue
        if name in NETEM:
            row = in_netns(name, NETEM[name], a.seconds, a.rate, a.dilate)
        else:
            row = scenario(name, a.seconds, a.rate, a.dilate, a.transport, not a.keyless)
        rows.append(row)
        print(json.dumps(row), flush=True)
    g.write_json(a, {"rows": rows})
    bad = [r for r in rows if r.get("unaccounted") or r.get("duplicates") or r.get("error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
