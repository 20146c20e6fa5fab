"""Faults the rack must survive with every task accounted for (issue 13, items 4 and 7):
overload turns into rejections with a reason rather than timeouts, and recovers at once.
The long runs (netem loss, delay and reorder in network namespaces, kills, impostors) are in
``bench/faults.py``; their figures are in docs/reliability.md."""


from malcolm.loadgen.run import LoadSpec, Target, run_load


def _server(**kw):
    from malcolm.net.server import Server
    from malcolm.net.transport import open_transport

    from malcolm.policy.registry import make_policy
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address], 0, make_policy("random", 1, 0, 1), **kw).start()
    return srv, tr.address


def test_overload_is_rejected_with_a_reason_and_recovers_at_once():
    # One worker serving 1 ms tasks: about 1000 tasks/s. Offer twice that for 1.5 s.
    srv, addr = _server(handler="sleep", workers=1, window_us=1000, max_wait_ms=50.0,
                        prior_service_us=1000.0)
    target = Target("udp", [addr], "--server", None)
    try:
        over = run_load(LoadSpec(target=target, workload="exp:1000", duration_s=1.5,
                                 warmup_s=0.2, timeout_s=1.0), 2000)
        after = run_load(LoadSpec(target=target, workload="exp:1000", duration_s=1.0,
                                  warmup_s=1.0, timeout_s=1.0), 400)
    finally:
        rep = srv.stop()
    assert over["accounted"] and after["accounted"]
    not_served = over["sent"] - over["completed"]
    assert not_served > 0.25 * over["sent"], over        # it really was overloaded
    rejected = over["rejected"].get("overloaded", 0) + over["rejected"].get("dropped", 0)
    assert over["timed_out"] <= 0.01 * not_served, over
    assert rejected >= 0.99 * not_served, over
    assert rep["overloaded"] >= over["rejected"].get("overloaded", 0) > 0
    # The queue held at most ~50 ms of work, so one second after the overload ends the
    # tail is back to what a lightly loaded server gives: no task waits behind a backlog.
    assert after["timed_out"] == 0 and after["rejected_total"] == 0, after
    assert after["latency_us"]["p99"] < 50_000, after["latency_us"]
