"""What a real rack measures a hop to cost: each Malcolm server's ``hop_ns`` under load.

Starts ``--count`` local udp servers of one worker each (Malcolm, ``window_us = 100``) in
this process, sends ``--tasks`` tasks of ``--service`` µs (spin) at ``--rate`` tasks a
second, and prints every server's hop estimate (``hop_ns`` in its policy statistics: the
EWMA of its peers' heartbeats' one-way delays, which the hop gate and the advantages charge
a migration). Since the forty-seventh session the delay runs from the sender's gateway
sending the heartbeat to the receiver's gateway taking it in, what a migrated task pays;
before, it also counted both policy threads' hand-offs (docs/runtime.md, "The heartbeat's
one-way delay is the gateways'"). On a 2-core machine these are mostly scheduling delays.
Not part of CI; the figures are in docs/performance.md ("Hop estimate")::

    python3 bench/hop_estimate.py
    python3 bench/hop_estimate.py --rate 20k/s --tasks 3000
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402


def measure(n, tasks, service_us, rate):
    """One rack: every server's ``hop_ns`` after the run (µs)."""
    from malcolm.net.transport import open_transport
    from malcolm.runtime.server import Server

    from malcolm.net.client import Client
    from malcolm.policy.registry import make_policy

    trs = [open_transport("udp", "127.0.0.1:0") for _ in range(n)]
    addrs = [t.address for t in trs]
    servers = [Server(trs[i], addrs, i, make_policy("malcolm", n, i, 1), handler="spin",
                      workers=1, window_us=100.0).start() for i in range(n)]
    try:
        with Client("udp", addrs) as c:
            c.run(tasks, service_ns=int(service_us * 1000), rate=rate)
        return [s.stats()["policy"]["hop_ns"] / 1000.0 for s in servers]
    finally:
        for s in servers:
            s.stop(grace_s=1.0)


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/hop_estimate.py --count 2 --rate 2k/s --tasks 600""")
    ap.add_argument("--count", type=int, default=3, help="servers (default 3)")
    ap.add_argument("--tasks", type=int, default=600, help="tasks sent (default 600)")
    ap.add_argument("--service", type=g.duration("us", positive=True), default=50.0,
                    help="a task's service time (bare number: µs; default 50)")
    ap.add_argument("--rate", type=g.rate, default=2_000.0,
                    help="tasks a second, e.g. 2k/s (default 2000)")
    a = ap.parse_args(argv)
    if not 2 <= a.count <= 16 or a.tasks < 1 or not a.rate > 0:
        ap.error("--count must be 2-16, --tasks >= 1, --rate > 0")
    hops = measure(a.count, a.tasks, a.service, a.rate)
    print(f"{a.count} servers, {a.tasks} tasks of {a.service:g} µs at {a.rate:,.0f}/s: hop_ns "
          f"{', '.join(f'{h:.0f}' for h in hops)} µs (median {statistics.median(hops):.0f})")


if __name__ == "__main__":
    main()
