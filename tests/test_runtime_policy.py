"""How the server runtime drives its policy, compared with the simulator.

The simulator calls, at each window boundary of a server, ``observe_local`` (the load now),
then ``end_window`` and ``fill_heartbeat`` (``malcolm/sim/_engine.pyx``, ``on_window``). The
runtime used to call ``observe_local`` *after* ``end_window``, so the load the policy learnt
from, published its distributions with and sent in its heartbeats was a window old. With the
demo's 1 ms windows that was enough to make Malcolm's learning drift (docs/loadgen.md, "Why
Malcolm loses in the demo"). These tests pin the simulator's order.
"""

import time

from malcolm._core import now_ns
from malcolm.net.transport import open_transport
from malcolm.runtime.server import Server

from malcolm.net import wire
from malcolm.policy.registry import make_policy

WINDOW_US = 100_000          # long windows, so that "this window" and "the last" differ clearly


def _next_heartbeat(peer, srv_addr, deadline):
    while time.monotonic() < deadline:
        for data, src in peer.recv(0.05):
            d = wire.decode(data)
            if d["kind"] == "heartbeat" and src == srv_addr:
                return d
    raise AssertionError("no heartbeat from the server in time")


def test_heartbeat_reports_the_load_at_the_end_of_its_window():
    """Tasks that arrive during a window are in the heartbeat sent at its end.

    A one-worker server with 100 ms windows; right after one of its heartbeats, three 600 ms
    tasks are sent to it. The first heartbeat stamped more than 20 ms later (the tasks have
    arrived by then) must count all three (one running, two waiting). With ``observe_local``
    called after ``end_window`` it reported the load of the window's start: 0 tasks.
    """
    peer = open_transport("udp", "127.0.0.1:0")       # a silent "server 1" that only listens
    client = open_transport("udp", "127.0.0.1:0")
    tr = open_transport("udp", "127.0.0.1:0")
    # jbt with an unreachable threshold keeps every task and never steals; without count_own
    # its heartbeats carry exactly what observe_local gave it.
    pol = make_policy("jbt", 2, 0, 1, threshold=1e9, count_own=False)
    srv = Server(tr, [tr.address, peer.address], 0, pol, handler="sleep", workers=1,
                 window_us=WINDOW_US).start()
    try:
        deadline = time.monotonic() + 10
        _next_heartbeat(peer, tr.address, deadline)
        # One window now lies ahead: send the tasks at its start.
        t_sent = now_ns()
        for i in range(3):
            client.send(tr.address, wire.encode_task(1, i + 1, service_ns=600_000_000,
                                                     send_ns=t_sent))
        while True:
            hb = _next_heartbeat(peer, tr.address, deadline)
            if hb["sent_ns"] > t_sent + 20_000_000:
                break
        assert hb["queue_len"] == 3.0, hb
        assert hb["load"] > 0.0, hb
        assert srv.stats()["accepted"] == 3
    finally:
        rep = srv.stop(grace_s=1.5)
        peer.close()
        client.close()
    assert rep["stuck_threads"] == []


def _frozen_keeper_and_stealer(handler, **kw):
    """Server 0 of a two-server rack whose server 1 is the test's bare endpoint ``peer``:
    Malcolm frozen (learn=0) to keep every task and to steal from server 1 after every
    completion (``steal_idle`` off: the driver's steal gate is under test, not the policy's
    rule, which would drop steals from an idle peer). Returns (peer, client endpoint, server
    transport, policy, started server)."""
    import numpy as np
    peer = open_transport("udp", "127.0.0.1:0")
    client = open_transport("udp", "127.0.0.1:0")
    tr = open_transport("udp", "127.0.0.1:0")
    pol = make_policy("malcolm", 2, 0, 1, learn=0, steal_idle=0)
    pol.set_params(W_migrate=np.zeros((2, 2)), B_migrate=np.array([50.0, 0.0]),
                   W_steal=np.zeros((2, 2)), B_steal=np.array([0.0, 50.0]))
    srv = Server(tr, [tr.address, peer.address], 0, pol, handler=handler, workers=1,
                 window_us=WINDOW_US, **kw).start()
    return peer, client, tr, pol, srv


def test_end_window_learns_from_the_load_at_its_end():
    """``end_window`` sees the own load of the boundary it is called at.

    Malcolm, frozen and set to keep every task, on server 0 of a two-server rack whose other
    server is this test, reporting load 0. Three 600 ms tasks arrive at the start of a window;
    the imbalance that the window's ``end_window`` computed (``last_imbalance``, read right
    after that window's heartbeat, a whole window before the next one) must include them. With
    ``observe_local`` after ``end_window`` it was 0: the own load was the window start's.
    """
    peer, client, tr, pol, srv = _frozen_keeper_and_stealer("sleep")
    seq = [0]

    def report_idle():
        seq[0] += 1
        peer.send(tr.address, wire.encode_heartbeat(1, seq=seq[0], load=0.0, queue_len=0.0,
                                                    rate=1e-5))

    try:
        deadline = time.monotonic() + 10
        for _ in range(3):      # the peer is known (load 0) well before the tasks come
            report_idle()
            _next_heartbeat(peer, tr.address, deadline)
        t_sent = now_ns()
        for i in range(3):
            client.send(tr.address, wire.encode_task(1, i + 1, service_ns=600_000_000,
                                                     send_ns=t_sent))
        while True:
            report_idle()
            hb = _next_heartbeat(peer, tr.address, deadline)
            if hb["sent_ns"] > t_sent + 20_000_000:
                break
        imbalance = pol.last_imbalance
        assert srv.stats()["accepted"] == 3
        assert hb["load"] > 0.0, hb
        assert imbalance > 0.0
    finally:
        rep = srv.stop(grace_s=1.5)
        peer.close()
        client.close()
    assert rep["stuck_threads"] == []


def _steal_requests(peer, srv_addr, done, timeout=10.0):
    """Steal requests from the server until ``done()`` holds (and 50 ms more)."""
    out = []
    t_end = time.monotonic() + timeout
    t_done = None
    while time.monotonic() < (t_end if t_done is None else min(t_end, t_done)):
        for data, src in peer.recv(0.02):
            d = wire.decode(data)
            if d["kind"] == "steal_request" and src == srv_addr:
                out.append(d)
        if t_done is None and done(out):
            t_done = time.monotonic() + 0.05
    return out


def test_gateway_steals_through_the_drivers_steal_gate():
    """The runtime's steal rule is the simulator's ``StealGate`` (policy/driver.pxd).

    Malcolm, frozen to keep every task and to steal from server 1 after every completion.
    Server 1 is this test and answers nothing at first: of the completions of a burst, one
    sends a request and the others are suppressed while it is in flight. A reply that comes
    after the request was given up is counted late, and the gate lets a new request through.
    """
    peer, client, tr, pol, srv = _frozen_keeper_and_stealer(
        "echo", steal_timeout_us=50_000.0, peer_timeout_ms=60_000.0)
    try:
        for i in range(20):
            client.send(tr.address, wire.encode_task(1, i + 1, send_ns=now_ns()))
        reqs = _steal_requests(peer, tr.address, lambda r: srv.stats()["completed"] == 20)
        st = srv.stats()
        assert st["completed"] == 20
        # every completion asked, and the gate either sent or suppressed
        assert st["steal_req_sent"] + st["steal_suppressed"] == 20, st
        assert len(reqs) == st["steal_req_sent"] >= 1
        # one in flight at a time: each request after the first waited for a timeout
        assert st["steal_timeouts"] >= st["steal_req_sent"] - 1
        time.sleep(0.1)                     # the last request is given up (50 ms)
        peer.send(tr.address, wire.encode_steal_empty(1, reqs[-1]["seq"]))
        for i in range(3):
            client.send(tr.address, wire.encode_task(1, 100 + i, send_ns=now_ns()))
        more = _steal_requests(peer, tr.address,
                               lambda r: r and srv.stats()["completed"] == 23)
        st2 = srv.stats()
        assert st2["steal_late_replies"] == 1 and st2["steal_empty_recv"] == 1, st2
        assert len(more) >= 1 and more[0]["seq"] == reqs[-1]["seq"] + 1
        assert st2["steal_req_sent"] + st2["steal_suppressed"] == 23, st2
    finally:
        rep = srv.stop(grace_s=1.0)
        peer.close()
        client.close()
    assert rep["stuck_threads"] == []


def _overloaded(params, done, seconds=5.0, window_us=500.0):
    """Server 0 (one worker, 5 ms tasks, learning Malcolm with ``params``) gets ten times
    what it can serve, while server 1 (this test) reports itself idle and answers nothing,
    until ``done(stats)`` or ``seconds``: its stats before and after, and the stop report."""
    peer = open_transport("udp", "127.0.0.1:0")
    client = open_transport("udp", "127.0.0.1:0")
    tr = open_transport("udp", "127.0.0.1:0")
    d = len(make_policy("malcolm", 2, 0, 1).py_heartbeat()["theta"])
    pol = make_policy("malcolm", 2, 0, 1, **params)
    srv = Server(tr, [tr.address, peer.address], 0, pol, handler="sleep", workers=1,
                 window_us=window_us, peer_timeout_ms=60_000.0).start()
    try:
        before = srv.stats()
        t0 = time.monotonic()
        t_end = t0 + seconds
        seq = sent = 0
        while time.monotonic() < t_end and not done(srv.stats()):
            seq += 1            # an idle peer of the same speed (the rate: tasks per ns)
            # It says a 20 ms window (wire v5): suspected only after 3 of them, so this
            # loop's late wake-ups on a loaded machine (tens of ms) do not make it a suspect,
            # to which no task goes (kept_for_silent: the queue then ran away, and reset).
            peer.send(tr.address, wire.encode_heartbeat(1, seq=seq, sent_ns=now_ns(),
                                                        load=0.0, rate=2e-7, theta=[0.0] * d,
                                                        window_us=20_000))
            # 2 000 tasks/s of 5 ms on one worker, 10x its capacity, by the clock: at four
            # tasks per 2 ms sleep, a busy machine's late wake-ups offered it no more than
            # it serves, the queue stopped growing, and no reset came within the 5 s
            due = min(int((time.monotonic() - t0) * 2000.0), sent + 64)
            while sent < due:
                client.send(tr.address, wire.encode_task(1, sent, service_ns=5_000_000,
                                                         send_ns=now_ns()))
                sent += 1
            time.sleep(0.002)
            peer.recv(0)        # whatever it migrated to us, dropped
        after = srv.stats()
    finally:
        rep = srv.stop(grace_s=0.5)
        peer.close()
        client.close()
    return before, after, rep


def test_a_runaway_queue_resets_the_actors_on_a_real_server(caplog):
    """The runaway guard in the runtime, not only in the simulator: with the runaway's shed
    off, the own queue runs far above the idle peer's and keeps growing, and the policy
    resets its actors to the safe start: counted in the statistics (``policy``) and said in
    serve's log."""
    from malcolm.commands.serve import log_policy
    before, after, rep = _overloaded(dict(shed_runaway=0),
                                     lambda st: st["policy"]["resets"] > 0)
    assert after["policy"]["resets"] >= 1, after["policy"]
    assert after["policy"]["windows"] > 20 and after["queue_len"] > 16
    caplog.clear()                          # the start's "no rack key" warning
    with caplog.at_level("WARNING"):
        log_policy(0, before, after)
    assert [r.getMessage() for r in caplog.records] == [
        f"server 0: the policy's guards fired: {after['policy']['resets']} runaway "
        "reset(s) of the actors"]
    assert rep["stuck_threads"] == []


def test_a_runaway_queue_is_shed_on_a_real_server():
    """The default (``shed_runaway``): the same overload is sent on to the idle peer once
    the queue is 16 tasks beyond it, in the runtime's gateway as in the simulator, so the
    queue stops growing, learning moves the rest, and no reset comes (with it off, the same
    2 s gave 49 resets and 2 106 tasks queued). Windows of 2 ms: this test's heartbeats,
    late on a loaded machine, must not make the peer a suspect (5 windows of silence), to
    which no task goes, or the kept tasks are the suspicion's, not the policy's (the
    heartbeats also say 20 ms windows: under four CPU hogs the 2 ms windows alone still let
    the peer become a suspect, and 9 runs of 10 reset; with it, none of 10)."""
    _, after, rep = _overloaded({}, lambda st: False, 2.0, window_us=2000.0)
    why = {k: after[k] for k in ("queue_len", "kept_for_silent", "migrated_out", "accepted")}
    assert after["policy"]["shed_count"] >= 1, (after["policy"], why)
    assert after["policy"]["resets"] == 0 and after["queue_len"] < 40, (after["policy"], why)
    assert rep["stuck_threads"] == []


def test_a_peer_that_falls_silent_is_stale_on_a_real_server_and_fresh_when_it_reports():
    """Item 22 in the runtime's policy thread, with its clock: once a heartbeat was lost
    (``hb_lost``), a peer that sends nothing for two of its heartbeat periods is stale
    (``stale_peers``; the only peer here, so no load steers the actors), and its next
    heartbeat, whose sequence number jumps over the lost ones, makes it fresh again. 2 ms
    windows and heartbeats; the silence is 60 ms, so a loaded machine's late wake-ups do not
    decide the outcome; the suspicion of a silent peer (``peer_timeout_ms``) is kept out."""
    peer = open_transport("udp", "127.0.0.1:0")
    tr = open_transport("udp", "127.0.0.1:0")
    d = len(make_policy("malcolm", 2, 0, 1).py_heartbeat()["theta"])
    srv = Server(tr, [tr.address, peer.address], 0, make_policy("malcolm", 2, 0, 1),
                 handler="sleep", workers=1, window_us=2000.0,
                 peer_timeout_ms=60_000.0).start()
    seq = 0

    def beat(count, jump=1):
        nonlocal seq
        for _ in range(count):
            seq += jump
            peer.send(tr.address, wire.encode_heartbeat(1, seq=seq, sent_ns=now_ns(), load=0.0,
                                                        rate=2e-7, theta=[0.0] * d))
            time.sleep(0.002)
            peer.recv(0)

    def stale_within(want, seconds):
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            if srv.stats()["policy"]["stale_peers"] == want:
                return True
            beat(1) if want == 0 else time.sleep(0.002)
        return False

    try:
        beat(25)
        beat(1, jump=2)                 # one heartbeat lost: the ages are kept from now on
        beat(25)                        # 50 ms: its period measured
        time.sleep(0.06)                # silent for 30 periods
        assert stale_within(1, 1.0), str(srv.stats()["policy"])
        beat(1, jump=30)                # the lost ones' numbers skipped, as after a loss
        assert stale_within(0, 1.0), srv.stats()["policy"]
        assert srv.stats()["policy"]["hb_lost"] == 30, srv.stats()["policy"]
        # a jump beyond 1024 (a restarted sender's, or a forged one) counts as one step
        beat(1, jump=5000)
        beat(1, jump=-100)              # backwards: one step too
        time.sleep(0.01)
        assert srv.stats()["policy"]["hb_lost"] == 30, srv.stats()["policy"]
    finally:
        rep = srv.stop(grace_s=0.5)
        peer.close()
    assert rep["stuck_threads"] == []


def test_the_hop_is_measured_between_hosts_whose_clocks_differ():
    """CLOCK_MONOTONIC on two hosts differs by their boot times, so one heartbeat's
    ``now - sent_ns`` there is no delay at all, and Malcolm ignored it (outside 0-10
    windows): across hosts its hop estimate stayed unknown, so the hop gate never opened and
    no migration was charged a hop. Each heartbeat now echoes the delay its sender last
    measured from the destination (wire v4 ``echo_ns``), and the gateway hands the policy
    the mean of the two directions, in which the clocks' offset cancels. Here server 1's
    gateway runs 1000 s ahead (``clock_offset_ns``): both servers still measure a hop of
    at most a few ms (without the echo both stayed at 0)."""
    n = 2
    trs = [open_transport("udp", "127.0.0.1:0") for _ in range(n)]
    addrs = [t.address for t in trs]
    srvs = [Server(trs[i], addrs, i, make_policy("malcolm", n, i, 1), handler="echo",
                   workers=1, window_us=1000.0) for i in range(n)]
    srvs[1].gateway.clock_offset_ns = 10**12
    try:
        for s in srvs:
            s.start()
        time.sleep(0.4)
        hops = [s.stats()["policy"]["hop_ns"] for s in srvs]
    finally:
        for s in srvs:
            s.stop()
    assert all(0 < h < 10_000_000 for h in hops), hops
