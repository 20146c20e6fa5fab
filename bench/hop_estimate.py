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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from malcolm import _argparse as g  # noqa: E402

if HERE not in sys.path:
    sys.path.insert(0, HERE)
# the same rack and load options as the idle-CPU bench
from window_cpu import loaded_rack, rack_load_options  # noqa: E402


def measure(n, tasks, service_us, rate):
    """One rack: every server's ``hop_ns`` after the run (µs)."""
    with loaded_rack(n, tasks, service_us, rate) as servers:
        return [s.stats()["policy"]["hop_ns"] / 1000.0 for s in servers]


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/hop_estimate.py --count 2 --rate 2k/s --tasks 600""")
    rack_load_options(ap, tasks=600, service_us=50.0, rate=2_000.0)
    a = ap.parse_args(argv)
    if not 2 <= a.count <= 16 or a.tasks < 1 or not a.rate > 0:
        ap.error("--count must be 2-16, --tasks >= 1, --rate > 0")
    hops = measure(a.count, a.tasks, a.service, a.rate)
    print(f"{a.count} servers, {a.tasks} tasks of {a.service:g} µs at {a.rate:,.0f}/s: hop_ns "
          f"{', '.join(f'{h:.0f}' for h in hops)} µs (median {statistics.median(hops):.0f})")


if __name__ == "__main__":
    main()
