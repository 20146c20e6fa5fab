"""What windows in task times cost a real rack: windows a second and CPU, busy then idle.

Starts ``--count`` local udp servers of one worker each (Malcolm, ``window_us = 100``)
in this process, sends ``--tasks`` tasks of ``--service`` µs (spin) at ``--rate`` tasks a
second, then leaves the rack idle for ``--idle`` seconds and reports each server's window
(``window_us`` in its statistics), the windows a second per server and the CPU cores the
process used while idle, with ``window_tasks`` = 5 (the default) and 0 (fixed windows).
Windows follow the mean of the last completions; an idle server goes back to the configured
window after 5 idle windows (thirty-third session; before it, it kept the windows its last
tasks set), and a rack with no task anywhere lengthens them to ``idle_window_us`` (forty-eighth
session: "A quiet rack sleeps"). Not part of CI; the figures are in docs/performance.md
(thirty-second, thirty-third and forty-eighth sessions)::

    python3 bench/window_cpu.py
    python3 bench/window_cpu.py --service 50us --rate 20k/s
"""
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402


@contextlib.contextmanager
def loaded_rack(n, tasks, service_us, rate, window_tasks=5.0):
    """``n`` local udp servers of one worker each (Malcolm, ``window_us = 100``), after
    ``tasks`` tasks of ``service_us`` µs (spin) at ``rate`` tasks a second: yields the
    servers, and stops them (``bench/hop_estimate.py`` too)."""
    from malcolm.net.transport import open_transport
    from malcolm.runtime.server import Server

    from malcolm.net.client import Client
    from malcolm.policy.registry import make_policy

    trs = [open_transport("udp", "127.0.0.1:0") for _ in range(n)]
    addrs = [t.address for t in trs]
    servers = [Server(trs[i], addrs, i, make_policy("malcolm", n, i, 1), handler="spin",
                      workers=1, window_us=100.0, window_tasks=window_tasks).start()
               for i in range(n)]
    try:
        with Client("udp", addrs) as c:
            c.run(tasks, service_ns=int(service_us * 1000), rate=rate)
        yield servers
    finally:
        for s in servers:
            s.stop(grace_s=1.0)


def rack_load_options(ap, tasks, service_us, rate):
    """``--count``, ``--tasks``, ``--service`` and ``--rate`` of ``loaded_rack``, with these
    defaults."""
    ap.add_argument("--count", type=int, default=3, help="servers (default 3)")
    ap.add_argument("--tasks", type=int, default=tasks, help=f"tasks sent (default {tasks})")
    ap.add_argument("--service", type=g.duration("us", positive=True), default=service_us,
                    help=f"a task's service time (bare number: µs; default {service_us:g})")
    ap.add_argument("--rate", type=g.rate, default=rate,
                    help=f"tasks a second, e.g. {rate / 1000:g}k/s (default {rate:.0f})")


def measure(n, tasks, service_us, rate, idle_s, window_tasks):
    """One rack: (the servers' windows in µs, windows a second per server, idle CPU cores)."""
    with loaded_rack(n, tasks, service_us, rate, window_tasks) as servers:
        st = [s.stats() for s in servers]
        w0, t0, c0 = sum(x["windows"] for x in st), time.monotonic(), time.process_time()
        time.sleep(idle_s)
        st = [s.stats() for s in servers]
        span = time.monotonic() - t0
        return ([x["window_us"] for x in st], (sum(x["windows"] for x in st) - w0) / n / span,
                (time.process_time() - c0) / span)


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/window_cpu.py --count 2 --idle 1s""")
    rack_load_options(ap, tasks=3000, service_us=5.0, rate=100_000.0)
    ap.add_argument("--idle", type=g.duration("s", positive=True), default=2.0,
                    help="how long the rack idles (bare number: s; default 2)")
    a = ap.parse_args(argv)
    if not 1 <= a.count <= 16 or a.tasks < 1 or not a.rate > 0:
        ap.error("--count must be 1-16, --tasks >= 1, --rate > 0")
    for wt in (5.0, 0.0):
        wins, per_s, cores = measure(a.count, a.tasks, a.service, a.rate, a.idle, wt)
        print(f"window_tasks={wt:g}: windows {', '.join(f'{w:.1f}' for w in wins)} µs, "
              f"{per_s:,.0f} windows/s per server, idle CPU {cores:.2f} cores")


if __name__ == "__main__":
    main()
