"""Long runs must not degrade (issue 11, item 6): the demo rack under a steady load for a
long stretch of rack time, per policy, reported per segment of rack time, with a trend
verdict that can fail (``malcolm/loadgen/longrun.py`` defines it).

The demo's rack (workers 3,3,1,1, the bench handler, udp, 100 µs windows, exp:50 µs
tasks, 2 µs per hop), dilated by K: 12 s of rack time at K = 50 is 10 minutes per policy.
Each policy gets a fresh rack and one unbroken run; the segments give p50, p99 (95%
interval), tasks sent, lost (dropped, refused, timed out), late sends, effective load,
migrations and steals per task, the servers' service-rate estimate against the nominal one
(rate/nom), the pace of the policy windows against the clock, resident memory and the
queue depth per server. The last line is the verdict; exit status 1 if a policy degraded,
3 if undetermined (too few clean segments), else 0.
"""

import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from malcolm import _argparse as g  # noqa: E402

POLICIES = "malcolm,malcolm:learn=0,jsq,po2"


def main(argv=None):
    ap = g.parser(__doc__, """
        python3 bench/longrun.py                      12 s rack time per policy at K=50
        nice -n 10 python3 bench/longrun.py --rack-time 3s --segment 0.5s --settle 0.5s \\
            --compare 2 --json longrun.json
        python3 bench/longrun.py --policy malcolm:learn=0 --load 0.7 --dilate auto""")
    ap.add_argument("--policy", action="append", default=None, metavar="NAME[:k=v,...]",
                    help=f"a policy (repeatable; default {POLICIES})")
    ap.add_argument("--load", type=g.loads, default=[0.85],
                    help="the target effective load (one; default 0.85)")
    ap.add_argument("--workers", default="3,3,1,1",
                    help="worker threads per server (default 3,3,1,1)")
    ap.add_argument("--workload", default="exp:50", help="service times (default exp:50)")
    ap.add_argument("--window", type=g.duration("us", positive=True), default=100.0,
                    help="policy window at rack scale (default 100us)")
    ap.add_argument("--rack-time", type=g.duration("s", positive=True), default=12.0,
                    help="length of each run in rack time (default 12s; x K in real time)")
    ap.add_argument("--segment", type=g.duration("s", positive=True), default=1.0,
                    help="segment length in rack time (default 1s)")
    ap.add_argument("--settle", type=g.duration("s"), default=1.0,
                    help="rack time left out of the verdict at the start (default 1s)")
    ap.add_argument("--compare", type=int, default=3,
                    help="segments in the verdict's early and late groups (default 3)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per policy (default 1)")
    ap.add_argument("--dilate", default="50",
                    help="time dilation K, or 'auto' (calibrate; default 50)")
    ap.add_argument("--warmup", type=g.duration("s"), default=0.5,
                    help="real warm-up before the measured run (default 0.5s)")
    ap.add_argument("--hop-delay", type=g.duration("us"), default=None,
                    help="per-hop delay at rack scale (default 2us when K > 1)")
    ap.add_argument("--logdir", default=None, help="keep the servers' output here")
    g.add_json(ap, "every run's segments and the verdicts")
    a = ap.parse_args(argv)
    g.json_stdout(a)
    if len(a.load) != 1:
        ap.error("--load: give one load")
    try:
        workers = [int(x) for x in a.workers.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--workers {a.workers!r} must be integers like 3,3,1,1")
    if not workers or any(not 0 <= w <= 64 for w in workers):
        ap.error(f"--workers {a.workers!r}: 1-64 servers of 0-64 workers each")
    from malcolm.loadgen import longrun
    from malcolm.loadgen.experiment import ExperimentError
    from malcolm.loadgen.method import parse_dilation
    try:
        dilate = parse_dilation(a.dilate)
    except ValueError as e:
        ap.error(str(e))
    stop = threading.Event()
    policies = [p.strip() for p in (a.policy or POLICIES.split(",")) if p.strip()]
    try:
        lr = longrun.LongRun(load=a.load[0], rack_s=a.rack_time, segment_s=a.segment,
                             settle_s=a.settle, compare=a.compare, repeat=a.repeat,
                             workers=workers, workload=a.workload, policies=policies,
                             window_us=a.window, dilate=dilate, warmup_s=a.warmup,
                             echo=lambda s: print(s, flush=True), stop=stop,
                             logdir=a.logdir, hop_delay_us=a.hop_delay)
    except ExperimentError as e:
        ap.error(str(e))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        res = lr.run()
    except ExperimentError as e:
        print(f"longrun: {e}", file=sys.stderr)
        return 2
    g.write_json(a, res)
    print()
    for p in res["policies"]:
        print(longrun.format_verdict(p["policy"], p["verdict"]))
    st = "interrupted" if res.get("interrupted") else res["verdict"]
    each = ", ".join(f"{p['policy']} {p['verdict']['status']}" for p in res["policies"])
    print(f"longrun verdict: {st.upper()} ({each}; K={res.get('dilate') or 0:g}, "
          f"{a.rack_time:g} s rack time, load {a.load[0]:g})")
    return {"pass": 0, "fail": 1}.get(st, 3)


if __name__ == "__main__":
    sys.exit(main())
