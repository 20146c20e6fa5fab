"""One window driver for both clocks (malcolm/policy/driver.pxd).

The simulator's engine and the runtime's policy thread both run the driver's window
protocol. A ``RecordingPolicy`` logs the calls it receives; the same checks must pass on the
log from a simulated rack and on the log from real servers on loopback UDP.
"""

import inspect
import time

import pytest
from malcolm.net.transport import open_transport
from malcolm.policy.driver import STEAL_GATE_CAPACITY, RecordingPolicy
from malcolm.runtime.server import Server
from malcolm.sim._engine import Engine

from malcolm.policy import defaults
from malcolm.policy.defaults import EST_ALPHA, EST_PRIOR_SERVICE_US
from malcolm.runtime import config
from malcolm.sim import run
from malcolm.workloads import parse_workload

WINDOW_PATTERN = ["observe_local", "end_window", "fill_heartbeat"]


def check_protocol(logs, strict_seq, from_one=True, allow_skip=False, workers=None,
                   sent_late=0):
    """The window protocol, from the logs of every server of a rack.

    Every server: one ``observe_local`` at the start, then whole windows of
    ``observe_local(now) -> end_window(now) -> fill_heartbeat``, with ``load = queue / rate``
    (``allow_skip``: a window may end without ``fill_heartbeat`` when the last heartbeat is
    still unsent, as at runtime). Every heartbeat received: seq counts from 1 (``from_one``)
    in order (``strict_seq``: with no gaps), and its ``sent_ns`` and load are those of one
    of its sender's window ends (``sent_late`` ns: the heartbeat of the sender's window with
    the same number, its stamp within that of the window's end, as at runtime, where the
    gateway stamps it when it sends it and the receiver's gateway hands the policy its
    arrival less the hop both ways measure). ``workers`` (one per server): the worker
    count the driver hands the policy at every ``observe_local`` (the hop gate's idle
    workers).
    """
    n = len(logs)
    ends = []
    for me, calls in enumerate(logs):
        own = [c for c in calls if c["call"] != "observe_peer"]
        assert own[0]["call"] == "observe_local", own[:3]
        if workers is not None:
            assert {c["workers"] for c in own if c["call"] == "observe_local"} == {workers[me]}
        mine = {}
        k, skipped = 1, 0
        while k < len(own):
            loc, end = own[k], own[k + 1]
            assert (loc["call"], end["call"]) == tuple(WINDOW_PATTERN[:2]), own[k:k + 3]
            assert loc["now"] == end["now"]
            assert loc["load"] == pytest.approx(loc["queue_len"] / loc["rate"], rel=1e-12)
            if k + 2 < len(own) and own[k + 2]["call"] == "fill_heartbeat":
                mine[loc["now"]] = loc
                k += 3
            else:
                assert allow_skip, ("window without a heartbeat", me, own[k:k + 3])
                skipped += 1
                k += 2
        windows = len(mine) + skipped
        # (how many heartbeats a loaded machine's gateway skips is not this test's business)
        assert windows >= 5 and len(mine) >= 3, (me, windows, skipped)
        assert sorted(mine) == [c["now"] for c in own[1:] if c["now"] in mine
                                and c["call"] == "observe_local"]   # time moves forward
        ends.append(mine)
    received = 0
    for me, calls in enumerate(logs):
        peers = [c for c in calls if c["call"] == "observe_peer"]
        for src in range(n):
            got = [c for c in peers if c["src"] == src]
            assert src != me or not got
            if src == me or not got:
                continue
            seqs = [c["seq"] for c in got]
            assert seqs[0] == 1 or not from_one, (me, src, seqs[:5])
            if strict_seq:
                assert seqs == list(range(1, len(seqs) + 1)), (me, src)
            else:
                assert all(b > a for a, b in zip(seqs, seqs[1:], strict=False)), (me, src)
            for c in got:
                w = ends[src].get(c["sent_ns"])
                if sent_late:
                    # the sender's seq-th window with a heartbeat filled it (a fresh rack
                    # loses none, and the gateway counts the sender's own numbers)
                    t = sorted(ends[src])[c["seq"] - 1] if c["seq"] <= len(ends[src]) else None
                    w = ends[src][t] if t is not None and abs(c["sent_ns"] - t) <= sent_late \
                        else None
                assert w is not None, ("heartbeat not stamped at a window end", me, c)
                assert c["now"] >= c["sent_ns"]
                assert (c["load"], c["queue_len"], c["rate"]) == (
                    w["load"], w["queue_len"], w["rate"])
            received += len(got)
    assert received > 0


def _sim_logs(n=3, jitter_ns=0.0, gateway_ns=0.0, loss=0.0, tasks=20_000):
    pols = [RecordingPolicy(n, i, 1) for i in range(n)]
    wl = parse_workload("exp:50")
    window_ns = 100_000.0
    eng = Engine([2] * n, [1.0] * n, wl.native(), mode=0, sched=0, quantum_ns=0.0,
                 rate_per_ns=0.6 * 2 * n / wl.native().mean_ns, shares=[1.0] * n,
                 n_tasks=tasks, n_warm=0, seed=3, delay_ns=2000.0, jitter_ns=jitter_ns,
                 window_ns=window_ns, loss=loss,
                 phases_ns=[window_ns * (i + 1) / (n + 1) for i in range(n)],
                 policies=pols, gateway_ns=gateway_ns)
    raw = eng.run()
    assert raw["generated"] == raw["completed"]
    for p in pols:
        assert p.overflow == 0
    return [p.calls() for p in pols], raw


@pytest.mark.parametrize("jitter_ns,gateway_ns", [(0.0, 0.0), (500.0, 0.0), (0.0, 300.0),
                                                  (500.0, 300.0)])
def test_simulator_runs_the_window_protocol(jitter_ns, gateway_ns):
    # every delivery path: one event for all peers, one per peer, and through the gateways
    logs, raw = _sim_logs(jitter_ns=jitter_ns, gateway_ns=gateway_ns)
    check_protocol(logs, strict_seq=True, workers=[2, 2, 2])
    assert raw["hb_overrun"] == 0


def test_simulator_protocol_with_lost_heartbeats():
    logs, raw = _sim_logs(loss=0.3)
    assert raw["hb_lost"] > 0
    check_protocol(logs, strict_seq=False, from_one=False)


def _idle_rack(pols, workers, window_us, seconds):
    """Real servers on loopback UDP, one per policy, left to their windows for ``seconds``;
    each stops within its grace with no thread stuck."""
    trs = [open_transport("udp", "127.0.0.1:0") for _ in pols]
    addrs = [t.address for t in trs]
    servers = [Server(trs[i], addrs, i, p, handler="spin", workers=workers[i],
                      window_us=window_us) for i, p in enumerate(pols)]
    try:
        for s in servers:
            s.start()
        time.sleep(seconds)
    finally:
        reps = [s.stop(grace_s=1.0) for s in servers]
    assert all(r["stuck_threads"] == [] for r in reps)


def test_runtime_runs_the_same_window_protocol():
    """Three real servers on loopback UDP, 2 ms windows, for about 0.2 s."""
    n = 3
    pols = [RecordingPolicy(n, i, 1) for i in range(n)]
    # 0 workers: the gateway runs the tasks itself, one at a time
    _idle_rack(pols, [2, 1, 0], 2000.0, 0.25)
    for p in pols:
        assert p.overflow == 0
    # A window's heartbeat is skipped at runtime when the gateway has not sent the last one
    # yet (the driver then fills none); everything else is the simulator's check.
    check_protocol([p.calls() for p in pols], strict_seq=False, allow_skip=True,
                   workers=[2, 1, 1], sent_late=200_000_000)


def test_runtime_heartbeat_delay_is_the_gateways_not_the_policy_threads():
    """A heartbeat is stamped when the sender's gateway sends it, and observed with the time
    the receiver's gateway took it in: the one-way delay the policy measures (Malcolm's hop
    estimate, what a migration costs) leaves out both policy threads. Here each policy
    thread is busy for 10 ms in every 20 ms window: the sender's heartbeat waits that long
    for its gateway, and a receiver busy then takes its inbox up to 10 ms late. The
    stamps before this gave 10-20 ms."""
    pols = [RecordingPolicy(2, i, 1, busy_us=10_000.0) for i in range(2)]
    _idle_rack(pols, [1, 1], 20_000.0, 0.5)
    delays = [c["now"] - c["sent_ns"] for p in pols for c in p.calls()
              if c["call"] == "observe_peer"]
    assert len(delays) >= 20
    assert min(delays) >= 0
    assert sorted(delays)[len(delays) // 2] < 3_000_000, sorted(delays)


def test_one_set_of_estimator_defaults():
    assert 0 < EST_ALPHA <= 1 and EST_PRIOR_SERVICE_US > 0
    assert inspect.signature(run.simulate).parameters["ewma"].default == EST_ALPHA
    assert config.RACK_KEYS["est_alpha"][1] == EST_ALPHA
    assert config.RACK_KEYS["prior_service_us"][1] == EST_PRIOR_SERVICE_US
    # the pure-Python bound is the compiled StealGate's
    assert defaults.MAX_STEALS_IN_FLIGHT == STEAL_GATE_CAPACITY
    assert inspect.signature(run.simulate).parameters["max_steals_in_flight"].default == \
        defaults.STEALS_IN_FLIGHT


def test_recording_policy_log_is_bounded():
    p = RecordingPolicy(2, 0, max_calls=3)
    for t in range(5):
        p.py_observe_local(t, 1.0, 1.0, 1.0)
    assert len(p.calls()) == 3 and p.overflow == 2
    with pytest.raises(ValueError):
        RecordingPolicy(2, 0, max_calls=0)


def test_the_protocol_check_can_fail():
    logs, _ = _sim_logs(tasks=5_000)
    check_protocol(logs, strict_seq=True)
    # end_window before observe_local: the order the runtime once had
    bad = [list(c) for c in logs]
    i = next(k for k, c in enumerate(bad[0]) if k > 0 and c["call"] == "observe_local")
    bad[0][i], bad[0][i + 1] = bad[0][i + 1], bad[0][i]
    with pytest.raises(AssertionError):
        check_protocol(bad, strict_seq=True)
    # a heartbeat stamped with a seq its sender never gave
    bad = [list(c) for c in logs]
    j = next(k for k, c in enumerate(bad[1]) if c["call"] == "observe_peer")
    bad[1][j] = dict(bad[1][j], seq=bad[1][j]["seq"] + 1)
    with pytest.raises(AssertionError):
        check_protocol(bad, strict_seq=True)
    # a heartbeat whose load is not its sender's at that window end
    bad = [list(c) for c in logs]
    bad[1][j] = dict(bad[1][j], load=bad[1][j]["load"] + 1.0)
    with pytest.raises(AssertionError):
        check_protocol(bad, strict_seq=False)
    # a skipped heartbeat where skipping is not allowed (the simulator never lags)
    bad = [list(c) for c in logs]
    k = next(k for k, c in enumerate(bad[2]) if c["call"] == "fill_heartbeat")
    del bad[2][k]
    with pytest.raises(AssertionError):
        check_protocol(bad, strict_seq=False)


# ------------------------------------------------------------------ the window's length

def test_window_is_task_times_within_its_bounds():
    from malcolm.policy.driver import WINDOW_WARM_NATIVE, window_ns
    base, warm = 100_000, WINDOW_WARM_NATIVE
    # 5 µs tasks on one worker, after `warm` completions: 5 tasks = 25 µs
    assert window_ns([(warm, warm * 5000.0)], 1, base, 5.0) == 25_000
    # the task time is a task's, whatever the workers (four of them, 4 x the completions)
    assert window_ns([(4 * warm, 4 * warm * 5000.0)], 4, base, 5.0) == 25_000
    # never below base / WINDOW_SHRINK, never above the configured window
    assert window_ns([(warm, warm * 1000.0)], 1, base, 5.0) == base // defaults.WINDOW_SHRINK
    assert window_ns([(warm, warm * 50_000.0)], 1, base, 5.0) == base
    # fixed: 0 task times, nothing completed, or too few completions a worker to trust
    assert window_ns([(warm, warm * 5000.0)], 1, base, 0.0) == base
    assert window_ns([], 1, base, 5.0) == base
    assert window_ns([(4 * warm - 1, (4 * warm - 1) * 5000.0)], 4, base, 5.0) == base
    # a recent mean: after 50 µs tasks, 5 µs ones take over within a few hundred completions
    # (a weight of k / (k + warm c) per window of k), and a window without completions
    # changes nothing
    hist = [(warm, warm * 50_000.0)] + [(10, 10 * 5000.0)] * 40 + [(0, 0.0)] * 5
    assert 25_000 <= window_ns(hist, 1, base, 5.0) <= 26_000
    assert window_ns(hist[:3], 1, base, 5.0) == base


def test_an_idle_server_goes_back_to_the_configured_window():
    """Short windows cost heartbeats; an idle server has nothing new to say. After
    WINDOW_IDLE windows in a row that completed nothing and ended with no task in the
    server, the next window is the configured one, until a task completes or waits."""
    from malcolm.policy.driver import WINDOW_IDLE_NATIVE, WINDOW_WARM_NATIVE, window_ns
    base, idle = 100_000, WINDOW_IDLE_NATIVE
    busy = [(WINDOW_WARM_NATIVE, WINDOW_WARM_NATIVE * 5000.0)]
    empty = (0, 0.0, 0.0)
    assert window_ns(busy + [empty] * (idle - 1), 1, base, 5.0) == 25_000
    assert window_ns(busy + [empty] * idle, 1, base, 5.0) == base
    assert window_ns(busy + [empty] * (3 * idle), 1, base, 5.0) == base
    # a task waiting at the window's end is not idle, nor is a completion that empties it
    assert window_ns(busy + [empty] * (idle - 1) + [(0, 0.0, 1.0)], 1, base, 5.0) == 25_000
    assert window_ns(busy + [empty] * idle + [(1, 5000.0, 0.0)], 1, base, 5.0) == 25_000
    # the count starts again after any window that was not idle
    assert window_ns(busy + [empty] * (idle - 1) + [(1, 5000.0, 0.0)] + [empty] * (idle - 1),
                     1, base, 5.0) == 25_000


def test_one_set_of_window_defaults():
    from malcolm.policy.driver import WINDOW_SHRINK_NATIVE
    from malcolm.runtime.policy_thread import PolicyThread  # noqa: F401 (built)
    assert defaults.WINDOW_SHRINK == WINDOW_SHRINK_NATIVE
    assert defaults.WINDOW_TASKS > 0
    assert inspect.signature(run.simulate).parameters["window_tasks"].default == \
        defaults.WINDOW_TASKS
    assert config.RACK_KEYS["window_tasks"][1] == defaults.WINDOW_TASKS


def test_simulated_windows_follow_the_task_time():
    # 5 µs tasks: 25 µs windows, four per configured 100 µs (a few longer at the start,
    # before the estimator has its completions); 50 µs tasks: 100 µs, as configured
    short = run.simulate(rack="4x1", workload="const:5", load=0.8, tasks=40_000, seed=1,
                         policy="jsq", record_loads=True)
    fixed = run.simulate(rack="4x1", workload="const:5", load=0.8, tasks=40_000, seed=1,
                         policy="jsq", window_tasks=0, record_loads=True)
    w_short, w_fixed = short.per_server["windows"], fixed.per_server["windows"]
    assert all(3.5 * f < s <= 4 * f + 1 for s, f in zip(w_short, w_fixed, strict=True)), \
        (w_short, w_fixed)
    # the recorded loads stay one row per configured window
    assert abs(len(short.loads["t_us"]) - len(fixed.loads["t_us"])) <= 1
    slow = run.simulate(rack="4x1", workload="exp:50", load=0.8, tasks=20_000, seed=1,
                        policy="jsq")
    slow0 = run.simulate(rack="4x1", workload="exp:50", load=0.8, tasks=20_000, seed=1,
                         policy="jsq", window_tasks=0)
    assert slow.per_server["windows"] == slow0.per_server["windows"]
    assert slow.p99_us == slow0.p99_us
    with pytest.raises(ValueError, match="window_tasks"):
        run.simulate(rack="2x1", tasks=100, window_tasks=-1)
