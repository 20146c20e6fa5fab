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
}


def scenario(name, seconds, rate):
    """Run one scenario here (already inside its namespace if it needs one)."""
    from malcolm.loadgen.faults import FaultRack, summary
    work = tempfile.mkdtemp(prefix="malcolm-faults-")
    extra = 'max_wait_ms = 200'
    fr = FaultRack(work, policy='name = "jsq"', extra=extra).up()
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
        workload = "exp:200"
        if name == "overload 2x capacity":
            workload = "exp:2000"
            rate = 2 * 3 * 500        # 3 servers x 1 worker x 1/(2 ms)
            injected = f"{rate:g} tasks/s offered to a capacity of {rate / 2:g}"
            expected = "rejected with a reason (overloaded), not timed out"
        rep = fr.load(rate, seconds, faults=faults, servers=servers, timeout_s=1.0,
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
    row = summary(name, injected, rep)
    row["expected_loss"] = expected
    row["rejected_by_reason"] = rep["rejected"]
    row["bad_mac_at_servers"] = sum(s.get("malformed_by_reason", {}).get("bad MAC", 0)
                                    for s in stats)
    row["p99_us"] = rep["latency_us"]["p99"]
    row["sent_to"] = rep["per_server"]["sent"]
    return row


def in_netns(name, qdisc, seconds, rate):
    """Run ``scenario(name)`` in a fresh network namespace whose loopback has ``qdisc``."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return {"fault": name, "skipped": "needs root, ip and tc"}
    ns = f"mcfault{os.getpid()}"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True,
                       capture_output=True)
        from malcolm.loadgen.faults import impair
        try:
            how = impair(ns, qdisc)
        except RuntimeError as e:
            return {"fault": name, "skipped": str(e)}
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--inside",
                            name, "--duration", str(seconds), "--rate", str(rate)],
                           capture_output=True, text=True, timeout=seconds * 10 + 120)
        if r.returncode != 0:
            return {"fault": name, "error": r.stderr[-2000:]}
        row = json.loads(r.stdout.strip().splitlines()[-1])
        row["fault"] = name
        row["injected"] = how
        row["expected_loss"] = "tasks or responses the network dropped (reported timed out)"
        return row
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


SCENARIOS = ["no fault", "SIGKILL server 2 under load", "SIGSTOP server 1 for 0.5 s",
             "restart server 2 (down 0.5 s)", "impostor on dead server 2's port",
             "overload 2x capacity"]


def main(argv=None):
    ap = g.parser(__doc__, """
        sudo .venv/bin/python bench/faults.py --duration 5s --rate 2k --json faults.json
        .venv/bin/python bench/faults.py --only SIGSTOP --duration 2s""")
    ap.add_argument("--duration", dest="seconds", type=g.duration("s", positive=True),
                    default=5.0, metavar="DURATION",
                    help="load time per scenario (bare number: s; default 5s)")
    ap.add_argument("--rate", type=g.rate, default=2000.0,
                    help="tasks per second (20k, 1.5M; default 2000)")
    ap.add_argument("--only", default=None, help="run only scenarios containing this")
    ap.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    g.add_json(ap, "every scenario's row")
    g.hidden_alias(ap, "--seconds", "seconds", type=g.duration("s", positive=True))
    a = ap.parse_args(argv)
    if not a.inside:
        g.json_stdout(a)
    if a.inside:
        print(json.dumps(scenario("no fault" if a.inside in NETEM else a.inside,
                                  a.seconds, a.rate)))
        return 0
    rows = []
    if os.geteuid() == 0 and shutil.which("nft") is None and shutil.which("apt-get"):
        # The loss scenarios fall back to nftables where the kernel has no netem; install
        # it (as scripts/rdma-vm installs what the RDMA guest needs).
        print("faults: installing nftables (apt-get) for the loss scenarios", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-q", "nftables"], capture_output=True)
    for name in SCENARIOS + list(NETEM):
        if a.only and a.only not in name:
            continue
        if name in NETEM:
            row = in_netns(name, NETEM[name], a.seconds, a.rate)
        else:
            row = scenario(name, a.seconds, a.rate)
        rows.append(row)
        print(json.dumps(row), flush=True)
    g.write_json(a, {"rows": rows})
    bad = [r for r in rows if r.get("unaccounted") or r.get("duplicates") or r.get("error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
