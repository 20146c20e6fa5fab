"""A quiet rack's windows lengthen, and its first task wakes it (runtime/policy_thread.pyx).

Real servers over udp and shm (one suite for the transports), with 2 ms windows, slow
enough for a loaded 2-core machine. A rack with no task anywhere lengthens each server's
windows, up to ``idle_window_us``, after QUIET_WINDOWS quiet window ends. A task in, or a
peer's heartbeat reporting one, ends the long window at once. A sleeping peer, whose
heartbeats come a long window apart, is neither suspected (its heartbeats say its window)
nor dropped from the membership.
"""
import time

import pytest
from malcolm.net.transport import available_transports, open_transport
from malcolm.policy.driver import RecordingPolicy
from malcolm.runtime.server import Server
from test_security import _wait as _until
from test_transport import _addr

from malcolm.net.client import Client
from malcolm.policy.registry import make_policy

WINDOW_US = 2000.0
# Long enough that a long window rarely ends on its own while the wake is on its way (a
# loaded machine's thread wake-ups take ms), which would leave ``idle_wakes`` at 0.
SLEEP_US = 200_000.0
PEER_TIMEOUT_MS = 10_000.0      # the sleep's cap is a quarter of it
LOCAL = [k for k in available_transports()[0] if k in ("udp", "shm")]


def _rack(pols, idle_window_us=SLEEP_US, workers=1, kind="udp"):
    trs = [open_transport(kind, _addr(kind)) for _ in pols]
    addrs = [t.address for t in trs]
    return addrs, [Server(trs[i], addrs, i, p, handler="spin", workers=workers,
                          window_us=WINDOW_US, idle_window_us=idle_window_us,
                          peer_timeout_ms=PEER_TIMEOUT_MS).start()
                   for i, p in enumerate(pols)]


def _stop(servers):
    reps = [s.stop(grace_s=1.0) for s in servers]
    assert all(r["stuck_threads"] == [] for r in reps)


def _asleep(servers):
    return all(s.stats()["window_us"] == SLEEP_US for s in servers)


@pytest.mark.parametrize("kind", LOCAL)
def test_a_quiet_rack_sleeps_and_its_first_task_wakes_the_server_and_its_peer(kind):
    """50 quiet windows (100 ms) and a few doublings: 200 ms windows, none suspected or left.
    A 50 ms task at server 0 (RecordingPolicy keeps every task): its gateway ends the long
    window at once, and that window's heartbeat, which reports the task, ends the peer's."""
    addrs, servers = _rack([RecordingPolicy(2, i, 1) for i in range(2)], kind=kind)
    try:
        assert _until(lambda: _asleep(servers), 3.0), [s.stats() for s in servers]
        before = [s.stats() for s in servers]
        assert all(st["idle_windows"] > 0 and st["idle_wakes"] == 0 for st in before), before
        assert all(st["peer_leaves"] == 0 for st in before), before
        # once its peer's heartbeats say 200 ms windows, it is suspected only after 3 of
        # them (capped at peer_timeout_ms), not after 5 windows (10 ms)
        assert _until(lambda: all(
            2.5 * SLEEP_US / 1000 <= s.stats()["peer_suspect_ms"][1 - k] <= PEER_TIMEOUT_MS
            for k, s in enumerate(servers)), 1.0), [s.stats() for s in servers]
        with Client(kind, [addrs[0]]) as c:
            acc = c.run(1, service_ns=50_000_000, rate=100)
        assert len(acc.answered) == 1
        after = [s.stats() for s in servers]
        assert after[0]["idle_wakes"] >= 1, after[0]
        # the peer's wake came from server 0's heartbeat (it had no task of its own)
        assert after[1]["idle_wakes"] >= 1 and after[1]["tasks_in"] == 0, after[1]
    finally:
        _stop(servers)


@pytest.mark.parametrize("kind", LOCAL)
def test_a_sleeping_peer_still_gets_migrations_and_is_not_suspected(kind):
    """Malcolm at server 0 under a burst that its one worker cannot hold: tasks go to the
    sleeping peer (its heartbeats 200 ms apart must not make it a suspect), whose arrivals
    wake it; no task is lost and no peer leaves."""
    pols = [make_policy("malcolm", 2, i, 1) for i in range(2)]
    addrs, servers = _rack(pols, kind=kind)
    try:
        assert _until(lambda: _asleep(servers), 3.0), [s.stats() for s in servers]
        with Client(kind, [addrs[0]]) as c:
            acc = c.run(200, service_ns=1_000_000, rate=2000)
        assert acc.lost == 0 and len(acc.answered) == 200
        st = [s.stats() for s in servers]
        assert st[0]["migrated_out"] > 0 and st[1]["forwarded_in"] > 0, st
        assert st[1]["idle_wakes"] >= 1, st[1]
        assert all(x["peer_leaves"] == 0 for x in st), st
    finally:
        _stop(servers)


def test_without_idle_windows_the_windows_stay_as_configured():
    _, servers = _rack([RecordingPolicy(2, i, 1) for i in range(2)], idle_window_us=0.0)
    try:
        time.sleep(0.4)
        st = [s.stats() for s in servers]
        assert all(x["window_us"] == WINDOW_US and x["idle_windows"] == 0 for x in st), st
    finally:
        _stop(servers)


@pytest.mark.parametrize("kind", LOCAL)
def test_a_sleeping_policy_thread_wakes_for_its_windows_not_for_each_idle_heartbeat(kind):
    """Three sleeping servers: each takes in two idle peers' heartbeats a long window, and
    observes them at its window's end; its policy thread wakes about once a window (a ring
    for each heartbeat was three wakes a window). No heartbeat is lost on the way."""
    _, servers = _rack([RecordingPolicy(3, i, 1) for i in range(3)], kind=kind)
    try:
        assert _until(lambda: _asleep(servers), 3.0), [s.stats() for s in servers]
        before = [s.stats() for s in servers]
        time.sleep(1.2)                                 # about 6 windows of 200 ms
        after = [s.stats() for s in servers]
        for b, a in zip(before, after, strict=True):
            windows = a["windows"] - b["windows"]
            assert windows >= 3, (b, a)
            assert a["policy_wakeups"] - b["policy_wakeups"] <= windows + 2, (b, a)
            assert a["hb_observed"] - b["hb_observed"] >= windows, (b, a)
            assert a["hb_dropped"] == 0 and a["idle_wakes"] == 0, a
    finally:
        _stop(servers)
