"""How fast a sleeping rack wakes at its first task (docs/runtime.md, "A quiet rack sleeps").

Starts ``--count`` local udp servers of one worker each (RecordingPolicy, which keeps every
task and logs the window protocol's calls with their times; ``window_us = 100``) in this
process. ``--trials`` times: waits until every server sleeps (3 200 µs windows), sends one
20 ms spin task to server 0, and reads from the logs

* when server 0's window ended after the send (the gateway's wake of its policy thread);
* for each peer, when it took in server 0's heartbeat of that window end (the hop), and
  when its own window ended after that (the wake by a busy peer's heartbeat).

All times are CLOCK_MONOTONIC, as the logs record them. On a 2-core machine the 20 ms
task holds one core, so expect some scheduling delays. Not part of CI; the figures are in
docs/performance.md ("A quiet rack sleeps")::

    python3 bench/quiet_wake.py
    python3 bench/quiet_wake.py --count 4 --trials 20
"""
import logging
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402


def trial(servers, pols, client):
    """One wake: (server 0's window end after the send, [(hop, the peer's wake) per peer]),
    in µs; None where a log has no such event."""
    end = time.monotonic() + 3.0
    while not all(s.stats()["window_us"] == 3200.0 for s in servers):
        if time.monotonic() > end:
            raise SystemExit("the rack did not fall asleep within 3 s")
        time.sleep(0.01)
    t0 = time.monotonic_ns()
    client.send(0, service_ns=20_000_000)
    client.collect(2.0)
    time.sleep(0.01)
    e0 = min((c["now"] for c in pols[0].calls() if c["call"] == "end_window" and c["now"] > t0),
             default=None)
    if e0 is None:
        return None, [(None, None)] * (len(pols) - 1)
    peers = []
    for p in pols[1:]:
        calls = p.calls()
        rx = min((c["now"] for c in calls if c["call"] == "observe_peer" and c["src"] == 0
                  and c["now"] > e0), default=None)
        ends = [c["now"] for c in calls if c["call"] == "end_window" and rx is not None
                and c["now"] >= rx]
        peers.append(((rx - e0) / 1e3 if rx is not None else None,
                      (ends[0] - rx) / 1e3 if ends else None))
    return (e0 - t0) / 1e3, peers


def _summary(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return "none"
    return (f"median {statistics.median(xs):.0f}, range {xs[0]:.0f}-{xs[-1]:.0f} "
            f"({len(xs)} values)")


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/quiet_wake.py --count 2 --trials 5""")
    ap.add_argument("--count", type=int, default=3, help="servers (default 3)")
    ap.add_argument("--trials", type=int, default=12, help="wakes measured (default 12)")
    a = ap.parse_args(argv)
    if not 2 <= a.count <= 16 or a.trials < 1:
        ap.error("--count must be 2-16, --trials >= 1")
    logging.disable(logging.WARNING)        # "no rack key", once per server
    from malcolm.net.transport import open_transport
    from malcolm.policy.driver import RecordingPolicy
    from malcolm.runtime.server import Server

    from malcolm.net.client import Client

    trs = [open_transport("udp", "127.0.0.1:0") for _ in range(a.count)]
    addrs = [t.address for t in trs]
    pols = [RecordingPolicy(a.count, i, 1, max_calls=4_000_000) for i in range(a.count)]
    servers = [Server(trs[i], addrs, i, pols[i], handler="spin", workers=1,
                      window_us=100.0).start() for i in range(a.count)]
    own, hops, wakes = [], [], []
    try:
        with Client("udp", [addrs[0]]) as c:
            for _ in range(a.trials):
                o, peers = trial(servers, pols, c)
                own.append(o)
                hops += [h for h, _ in peers]
                wakes += [w for _, w in peers]
    finally:
        for s in servers:
            s.stop(grace_s=1.0)
    print(f"{a.count} servers, {a.trials} wakes from 3 200 µs windows (µs):")
    print(f"  the send -> server 0's window end: {_summary(own)}")
    print(f"  server 0's window end -> a peer took in its heartbeat: {_summary(hops)}")
    print(f"  that -> the peer's window end: {_summary(wakes)}")


if __name__ == "__main__":
    main()
