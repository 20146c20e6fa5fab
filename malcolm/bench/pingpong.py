"""``python3 -m malcolm.bench.pingpong {echo,ping}``: transport round trips between processes.

Run ``echo`` on one host (or in one process) and ``ping`` on another to measure a transport's
round trip from nogil busy-polling loops (:mod:`malcolm.bench.transport`; docs/rdma.md,
"Performance"). Every transport that is built here can be measured: ``--transport udp``,
``shm`` (same host) or ``verbs`` (where libibverbs and pyverbs are).
"""

import argparse
import sys


def main(argv=None):
    """Parse ``argv`` and run ``echo`` or ``ping``; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python3 -m malcolm.bench.pingpong",
                                 description=__doc__.split("\n\n")[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("echo", help="echo messages back to their senders")
    e.add_argument("--address", required=True, help="host:port (shm: a name) to listen on")
    e.add_argument("--seconds", type=float, default=60.0)
    p = sub.add_parser("ping", help="measure round trips to an echo")
    p.add_argument("--address", required=True,
                   help="this side's address: host:0 (shm: a name)")
    p.add_argument("--peer", required=True, help="the echo's address")
    p.add_argument("-n", type=int, default=100_000, help="round trips")
    p.add_argument("-s", "--size", type=int, default=32, help="message bytes")
    for q in (e, p):
        q.add_argument("--transport", default="verbs", choices=("verbs", "udp", "shm"))
    args = ap.parse_args(argv)
    if args.cmd == "ping" and args.n < 1:
        ap.error("-n must be at least 1")

    from malcolm.net.transport import TransportUnavailable, open_transport

    try:
        t = open_transport(args.transport, args.address)
    except (TransportUnavailable, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(args, t)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        t.close()


def _run(args, t):
    import numpy as np

    from malcolm.bench.transport import transport_echo, transport_pingpong

    if args.cmd == "echo":
        from malcolm.net.transport import format_addr
        # The bound address (port 0 resolved), for the ping side.
        print(f"echo on {format_addr(t.address)} ({args.transport})", flush=True)
        print(f"echoed {transport_echo(t, args.seconds)} messages")
        return 0
    warm = min(1000, args.n // 10)
    rtt, lost = transport_pingpong(t, args.peer, args.n + warm, args.size)
    us = np.asarray(rtt[warm:]) / 1e3
    if len(us) == 0:
        print(f"no answers from {args.peer} ({lost} lost)")
        return 1
    print(f"{args.transport} ping-pong {args.size} B x {len(us)}: "
          f"p50 {np.median(us):.2f} us, p99 {np.percentile(us, 99):.2f} us, "
          f"min {us.min():.2f} us, lost {lost}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
