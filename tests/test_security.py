"""Authentication of the rack (issue 13, item 1): SipHash-2-4 against its published test
vectors (native and reference), the trailer's replay window, rack key files, and servers
that drop what the rack key does not sign."""

import os
import stat
import struct
import threading
import time

import pytest

from malcolm.net import _wire as native
from malcolm.net import wire
from malcolm.runtime import config

# SipHash-2-4, 64-bit output, key 00 01 .. 0f, message 00 01 .. (k-1) for k = 0..63: the
# reference test vectors of Aumasson and Bernstein (vectors.h of the reference code), as the
# little-endian bytes of the result.
VECTORS = """
310e0edd47db6f72 fd67dc93c539f874 5a4fa9d909806c0d 2d7efbd796666785
b7877127e09427cf 8da699cd64557618 cee3fe586e46c9cb 37d1018bf50002ab
6224939a79f5f593 b0e4a90bdf82009e f3b9dd94c5bb5d7a a7ad6b22462fb3f4
fbe50e86bc8f1e75 903d84c02756ea14 eef27a8e90ca23f7 e545be4961ca29a1
db9bc2577fcc2a3f 9447be2cf5e99a69 9cd38d96f0b3c14b bd6179a71dc96dbb
98eea21af25cd6be c7673b2eb0cbf2d0 883ea3e395675393 c8ce5ccd8c030ca8
94af49f6c650adb8 eab8858ade92e1bc f315bb5bb835d817 adcf6b0763612e2f
a5c91da7acaa4dde 716595876650a2a6 28ef495c53a387ad 42c341d8fa92d832
ce7cf2722f512771 e37859f94623f3a7 381205bb1ab0e012 ae97a10fd434e015
b4a31508beff4d31 81396229f0907902 4d0cf49ee5d4dcca 5c73336a76d8bf9a
d0a704536ba93e0e 925958fcd6420cad a915c29bc8067318 952b79f3bc0aa6d4
f21df2e41d4535f9 87577519048f53a9 10a56cf5dfcd9adb eb75095ccd986cd0
51a9cb9ecba312e6 96afadfc2ce666c7 72fe52975a4364ee 5a1645b276d592a1
b274cb8ebf87870a 6f9bb4203de7b381 eaecb2a30b22a87f 9924a43cc1315724
bd838d3aafbf8db7 0b1a2a3265d51aea 135079a3231ce660 932b2846e4d70666
e1915f5cb1eca46c f325965ca16d629f 575ff28e60381be5 724506eb4c328a95
""".split()
KEY16 = bytes(range(16))


def test_siphash_reference_and_native_match_the_published_vectors():
    assert len(VECTORS) == 64
    for k, want in enumerate(VECTORS):
        msg = bytes(range(k))
        assert struct.pack("<Q", wire.siphash24(KEY16, msg)).hex() == want, k
        assert struct.pack("<Q", native.siphash24(KEY16, msg)).hex() == want, k


def test_siphash_native_equals_reference_on_long_and_odd_inputs():
    import random
    rng = random.Random(5)
    for n in (0, 7, 8, 9, 63, 64, 65, 1000, 4031):
        key = bytes(rng.randrange(256) for _ in range(16))
        data = bytes(rng.randrange(256) for _ in range(n))
        assert wire.siphash24(key, data) == native.siphash24(key, data)


def test_replay_window():
    w = native.ReplayWindow()
    assert w.check(10, 1) == 1                  # first epoch: a join
    assert w.check(10, 1) == wire.E_REPLAY      # the same message again
    assert w.check(10, 5) == 0
    assert w.check(10, 3) == 0                  # reordered, inside the window: once
    assert w.check(10, 3) == wire.E_REPLAY
    assert w.check(10, 200) == 0
    assert w.check(10, 200 - 64) == wire.E_REPLAY   # too far behind
    assert w.check(10, 200 - 63) == 0
    assert w.check(9, 500) == wire.E_EPOCH      # an older epoch: a replay of a past run
    assert w.check(11, 1) == 1                  # a restart: accepted at once
    assert w.check(10, 201) == wire.E_EPOCH
    # epoch 0 is no sender's: a fresh window took it, and a client's slot then reset itself
    # at every copy of an epoch-0 task, which ran each time
    assert native.ReplayWindow().check(0, 1) == wire.E_EPOCH


def test_epochs_grow_across_starts():
    a = native.new_epoch()
    time.sleep(0.002)
    b = native.new_epoch()
    assert b > a


def test_key_files(tmp_path, monkeypatch):
    monkeypatch.delenv(config.KEY_ENV, raising=False)
    p = tmp_path / "rack.key"
    config.write_key(str(p))
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600 and len(p.read_bytes()) == 32
    k = config.read_key(str(p))
    assert len(k) == 16 and k == config.read_key(str(p))
    with pytest.raises(config.ConfigError, match="exists"):
        config.write_key(str(p))
    os.chmod(p, 0o640)
    with pytest.raises(config.ConfigError, match="group or others"):
        config.read_key(str(p))
    os.chmod(p, 0o604)
    with pytest.raises(config.ConfigError, match="group or others"):
        config.read_key(str(p))
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 31)
    os.chmod(short, 0o600)
    with pytest.raises(config.ConfigError, match="at least 32"):
        config.read_key(str(short))
    with pytest.raises(config.ConfigError, match="not found"):
        config.read_key(str(tmp_path / "nope"))
    # the environment names the key over the rack file
    os.chmod(p, 0o600)
    monkeypatch.setenv(config.KEY_ENV, str(p))
    assert config.rack_key(None) == k


# ------------------------------------------------------------------ servers with a rack key

KEY = bytes(range(50, 66))
OTHER = bytes(range(70, 86))
TO0 = wire.dst_key(KEY, 0)      # what a member sends server 0 goes under 0's own key


def _server(n=2, key=KEY, policy="jsq", **kw):
    """Server 0 of an n-server rack in this process; the other members are bare endpoints
    this test speaks for. Returns (server, its address, peer endpoints)."""
    from malcolm.net.transport import open_transport
    from malcolm.runtime.server import Server

    from malcolm.policy.registry import make_policy
    tr = open_transport("udp", "127.0.0.1:0")
    peers = [open_transport("udp", "127.0.0.1:0") for _ in range(n - 1)]
    addrs = [tr.address] + [p.address for p in peers]
    kw.setdefault("handler", "echo")
    kw.setdefault("window_us", 2000)
    srv = Server(tr, addrs, 0, make_policy(policy, n, 0, 1), key=key, **kw).start()
    return srv, addrs[0], peers


def _wait(pred, timeout=3.0):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_a_keyed_server_serves_its_rack_and_drops_the_rest():
    from malcolm.net.client import Client
    srv, addr, peers = _server()
    try:
        assert srv.authenticated and srv.stats()["authenticated"]
        with Client("udp", [addr], key=KEY) as c:          # the rack's key: served
            acc = c.run(20, service_ns=0, rate=2000, timeout=5)
            assert len(acc.answered) == 20 and acc.forged == 0
        with Client("udp", [addr], key=None) as c:         # no key: dropped, unanswered
            for _ in range(5):
                c.send(0)
            acc = c.collect(0.5)
            assert acc.lost == 5
        with Client("udp", [addr], key=OTHER) as c:        # another rack's key
            c.send(0)
            assert c.collect(0.3).lost == 1
        # a member's heartbeat signed with another key, from the member's own address
        peers[0].send(addr, wire.encode_heartbeat(1, load=1e300, theta=[1e308],
                                                  key=OTHER, epoch=9, auth_seq=1))
        assert _wait(lambda: srv.stats()["malformed_by_reason"].get("bad MAC") == 7)
        s = srv.stats()
        assert s["tasks_in"] == 20 and s["hb_recv"] == 0 and s["peer_joins"] == 0
    finally:
        srv.stop()
        for p in peers:
            p.close()


def test_a_members_message_to_another_server_is_not_taken_here():
    """Each member numbers its messages per destination, and all went under the rack key: a
    forward or heartbeat captured on its way from member 1 to server 2, replayed to server
    0 from member 1's address, was accepted while 0 had not yet seen its number, and the
    task ran twice (the forty-fourth session's probe). Now each goes under its
    destination's own key."""
    srv, addr, peers = _server(n=3)
    reply = (2, 1, 0, bytes(16))
    try:
        for j, key in enumerate((wire.dst_key(KEY, 2), KEY)):
            peers[0].send(addr, wire.encode_heartbeat(1, load=5.0, key=key, epoch=9,
                                                      auth_seq=j + 1))
            peers[0].send(addr, wire.encode_move(1, 99, j + 1, reply, key=key, epoch=9,
                                                 auth_seq=j + 11))
        assert _wait(lambda: srv.stats()["malformed_by_reason"].get("bad MAC") == 4)
        s = srv.stats()
        assert s["hb_recv"] == 0 and s["forwarded_in"] == 0 and s["peer_joins"] == 0, s
        # the same two under server 0's own key: taken
        peers[0].send(addr, wire.encode_heartbeat(1, load=5.0, key=TO0, epoch=9, auth_seq=21))
        peers[0].send(addr, wire.encode_move(1, 99, 3, reply, key=TO0, epoch=9, auth_seq=22))
        assert _wait(lambda: srv.stats()["forwarded_in"] == 1)
        assert srv.stats()["hb_recv"] == 1 and srv.stats()["peer_joins"] == 1
    finally:
        srv.stop()
        for p in peers:
            p.close()


def test_an_unkeyed_server_warns_once_and_still_runs(caplog):
    import logging
    with caplog.at_level(logging.WARNING, logger="malcolm.server"):
        srv, addr, peers = _server(key=None)
    try:
        warned = [r for r in caplog.records if "no rack key" in r.getMessage()]
        assert len(warned) == 1 and "\n" not in warned[0].getMessage()
        from malcolm.net.client import Client
        with Client("udp", [addr]) as c:
            assert len(c.run(5, service_ns=0, rate=1000).answered) == 5
    finally:
        srv.stop()
        peers[0].close()


def test_replays_restarts_and_forged_sequence_numbers():
    srv, addr, peers = _server(policy="jsq")
    p = peers[0]

    def hb(epoch, aseq, seq=1, load=1000.0):
        return wire.encode_heartbeat(1, seq=seq, load=load, queue_len=1.0, rate=1e-4,
                                     key=TO0, epoch=epoch, auth_seq=aseq)
    try:
        first = hb(100, 1)
        p.send(addr, first)
        assert _wait(lambda: srv.stats()["hb_observed"] == 1)
        s = srv.stats()
        assert s["peer_joins"] == 1 and s["peers_up"] == [1]
        p.send(addr, first)                                     # replayed
        # a member's heartbeat with the body seq 0x7FFFFFFF, which used to freeze the
        # peers' view of it (the policies now get the gateway's count, not the sender's)
        p.send(addr, hb(100, 2, seq=0x7FFFFFFF))
        assert _wait(lambda: srv.stats()["hb_observed"] == 2)
        p.send(addr, hb(100, 3, seq=1))
        assert _wait(lambda: srv.stats()["hb_observed"] == 3)
        p.send(addr, hb(99, 50))                                # an older epoch
        # the member restarts: a new epoch, its numbering from 1 again, applied at once
        p.send(addr, hb(200, 1, seq=1))
        assert _wait(lambda: srv.stats()["hb_observed"] == 4)
        s = srv.stats()
        assert s["malformed_by_reason"] == {"replayed": 1, "stale epoch": 1}, s
        assert s["peer_restarts"] == 1 and s["peer_joins"] == 1
        # reordered: an older heartbeat after a newer one is not applied
        p.send(addr, hb(200, 3))
        p.send(addr, hb(200, 2))
        # the gateway counts the stale one, the policy thread the applied one: wait for both
        assert _wait(lambda: srv.stats()["hb_stale"] == 1)
        assert _wait(lambda: srv.stats()["hb_observed"] == 5)
        assert srv.stats()["hb_stale"] == 1
        # silence: the member leaves (an event), and joins again when heard from
        assert _wait(lambda: srv.stats()["peer_leaves"] == 1, timeout=2.0)
        p.send(addr, hb(200, 4))
        assert _wait(lambda: srv.stats()["peer_joins"] == 2)
    finally:
        srv.stop(grace_s=0.5)
        p.close()


def test_a_recording_of_a_dead_peers_earlier_run_does_not_bring_it_back():
    """A peer presumed down may come back with an older epoch (its clock went back across a
    restart), but not with one it started before: replaying the recorded heartbeats of its
    earlier run, after it restarted and died, brought it back into the rack, and the tasks
    sent to it were lost. An older epoch never seen is still taken."""
    srv, addr, peers = _server(policy="jsq", peer_timeout_ms=50.0)
    p = peers[0]

    def hb(epoch, aseq):
        return wire.encode_heartbeat(1, seq=aseq, load=1000.0, queue_len=1.0, rate=1e-4,
                                     key=TO0, epoch=epoch, auth_seq=aseq)
    try:
        recorded = [hb(100, k) for k in (1, 2, 3)]        # its first run, recorded
        for d in recorded[:2]:
            p.send(addr, d)
        assert _wait(lambda: srv.stats()["peer_joins"] == 1)
        p.send(addr, hb(200, 1))                           # it restarts ...
        assert _wait(lambda: srv.stats()["peer_restarts"] == 1)
        assert _wait(lambda: srv.stats()["peer_leaves"] == 1)   # ... and dies
        for d in recorded:
            p.send(addr, d)                                # the recording, replayed
        assert _wait(lambda: srv.stats()["malformed_by_reason"].get("stale epoch") == 3)
        s = srv.stats()
        assert s["peers_up"] == [] and s["peer_joins"] == 1, s
        p.send(addr, hb(150, 1))          # restarted with its clock set back: a new epoch
        assert _wait(lambda: srv.stats()["peer_joins"] == 2)
        assert srv.stats()["peer_restarts"] == 2
    finally:
        srv.stop(grace_s=0.5)
        p.close()


def _load_through_a_middle_box(on_datagram):
    """0.5 s of load from the generator to a one-server rack (key KEY, spin handler) through
    a box in the middle: ``on_datagram(box, server, data, src)`` gets everything sent to the
    box (the generator's tasks and the server's answers) and passes on what it likes.
    Returns the generator's report."""
    from malcolm.net.transport import open_transport

    from malcolm.loadgen.run import LoadSpec, Target, run_load
    srv, addr, _ = _server(n=1, key=KEY, handler="spin", workers=1)
    box = open_transport("udp", "127.0.0.1:0")
    stop = threading.Event()

    def relay():
        while not stop.is_set():
            for data, src in box.recv(0.05):
                on_datagram(box, addr, data, src)
    t = threading.Thread(target=relay, daemon=True)
    t.start()
    try:
        spec = LoadSpec(target=Target("udp", [box.address], "--server", key=KEY),
                        workload="exp:20", duration_s=0.5, warmup_s=0.0, timeout_s=1.0)
        return run_load(spec, 300)
    finally:
        stop.set()
        t.join(2)
        box.close()
        srv.stop()


def test_forged_responses_are_counted_not_completed():
    """Issue 13, attack 4: a man in the middle answers every task at once with a forged
    "ok" (unsigned, and signed with another key) and relays the task to the real server,
    whose genuine answer it passes back. The load generator completes each task once, from
    the genuine answer, and counts the forgeries."""
    client = [None]
    forged = [0]

    def mitm(box, server, data, src):
        if src == server:                               # the genuine answer: pass it on
            if client[0] is not None:
                box.send(client[0], data)
            return
        client[0] = src
        d = wire.decode(data, KEY)
        for k in (None, OTHER):
            box.send(src, wire.encode_response(0, d["client_id"], d["request_id"],
                                               send_ns=d["send_ns"], key=k))
            forged[0] += 1
        box.send(server, data)
    rep = _load_through_a_middle_box(mitm)
    assert rep["accounted"] and rep["sent"] > 50
    assert rep["completed"] == rep["sent"] and rep["duplicates"] == 0
    assert rep["forged"] == forged[0] == 2 * rep["sent"]


@pytest.mark.parametrize("second", ["copy", "another answer"])
def test_a_response_the_network_sent_twice_is_not_a_second_answer(second):
    """netem ``duplicate`` (bench/faults.py) delivers some responses twice. A byte-for-byte
    copy of the answer taken (same sender epoch and sequence number) is counted as
    ``replayed_responses``, not as a task answered twice; a second, different answer to the
    same task is still a duplicate."""
    client = [None]
    extra = [0]

    def twice(box, server, data, src):
        if src != server:
            client[0] = src
            box.send(server, data)
            return
        if client[0] is None:
            return
        box.send(client[0], data)
        if second == "copy":
            box.send(client[0], data)
        else:
            d = wire.decode(data, KEY)
            box.send(client[0], wire.encode_response(
                0, d["client_id"], d["request_id"], key=KEY, epoch=d["epoch"],
                auth_seq=d["auth_seq"] + 1_000_000))
        extra[0] += 1
    rep = _load_through_a_middle_box(twice)
    assert rep["accounted"] and rep["completed"] == rep["sent"] > 50, rep
    # the extra answer to the last task or two can come after the generator stopped listening
    seen = (rep["replayed_responses"], rep["duplicates"])
    if second == "copy":
        assert seen[1] == 0 and extra[0] - 2 <= seen[0] <= extra[0], (extra, rep)
    else:
        assert seen[0] == 0 and extra[0] - 2 <= seen[1] <= extra[0], (extra, rep)


def test_mac_cost_is_measured():
    from malcolm.bench import runtime_native
    r = runtime_native.mac_cost(64, 2000)
    assert r["seal_ns"] > 0 and r["open_ns"] > 0 and r["size"] == 64
    with pytest.raises(ValueError):
        runtime_native.mac_cost(10)


def test_a_replayed_task_runs_once():
    from malcolm.net.transport import open_transport
    srv, addr, peers = _server(n=1)
    c = open_transport("udp", "127.0.0.1:0")
    try:
        task = wire.encode_task(77, 1, key=KEY, epoch=10, auth_seq=1)
        for _ in range(3):
            c.send(addr, task)                    # captured and replayed: runs once
        c.send(addr, wire.encode_task(77, 2, key=KEY, epoch=10, auth_seq=2))
        c.send(addr, wire.encode_task(77, 3, key=KEY, epoch=9, auth_seq=3))   # old epoch
        zero = wire.encode_task(78, 4, key=KEY, epoch=0, auth_seq=1)    # no sender's epoch
        for _ in range(3):
            c.send(addr, zero)                  # each copy ran: the slot reset itself
        got = []
        t_end = time.monotonic() + 2
        while len(got) < 2 and time.monotonic() < t_end:
            got += [wire.decode(d, KEY)["request_id"] for d, _ in c.recv(0.1)]
        time.sleep(0.2)
        got += [wire.decode(d, KEY)["request_id"] for d, _ in c.recv(0.1)]
        assert sorted(got) == [1, 2]
        assert srv.stats()["malformed_by_reason"] == {"replayed": 2, "stale epoch": 4}
    finally:
        srv.stop()
        c.close()


def test_serve_logs_the_address_datagrams_a_verbs_transport_dropped(caplog):
    """A verbs server's forged, replayed and unsolicited address datagrams (its transport's
    counters, docs/rdma.md) are logged by reason, like malformed messages."""
    from malcolm.commands.serve import log_malformed
    prev = {"malformed": 0, "transport": {"ctl_bad_mac": 1}}
    cur = {"malformed": 0, "malformed_by_reason": {},
           "transport": {"ctl_bad_mac": 4, "ctl_replay": 2, "ctl_unsolicited": 0}}
    with caplog.at_level("WARNING"):
        log_malformed(3, prev, cur)
        log_malformed(3, cur, cur)          # nothing new: nothing logged
    assert caplog.text.count("dropped address datagram") == 1
    assert "server 3 dropped address datagram(s): 3 bad MAC, 2 replayed\n" in caplog.text


def test_serve_logs_which_peers_left_came_back_restarted_or_were_never_heard(caplog):
    """The serve loop's peer log (PeerLog), on snapshots of the statistics: one line per
    kind of change per tick, naming each peer by index and address."""
    from malcolm.commands.serve import PeerLog
    addrs = ["a:1", "b:2", "c:3", "d:4"]

    def snap(up, left=(0, 0, 0, 0), ep=(0, 5, 6, 7)):
        return {"peers_up": list(up), "peer_left": list(left), "peer_epoch": list(ep),
                "peer_timeout_ms": 100.0}

    pl = PeerLog(0, addrs, wait_s=5.0)
    t0 = pl.t0
    with caplog.at_level("INFO"):
        start = snap([], ep=(0, 0, 0, 0))
        pl.update(start, snap([1, 2]), t0 + 1)          # 3 not heard yet: nothing said
        assert caplog.text == ""
        pl.update(snap([1, 2]), snap([1, 2]), t0 + 6)   # ... and after 5 s, said once
        pl.update(snap([1, 2]), snap([1, 2]), t0 + 7)
        pl.update(snap([1, 2]), snap([1, 2, 3]), t0 + 8)
        pl.update(snap([1, 2, 3]), snap([2, 3], left=(0, 1, 0, 0)), t0 + 9)
        pl.update(snap([2, 3], left=(0, 1, 0, 0)),
                  snap([1, 2, 3], left=(0, 1, 0, 0), ep=(0, 9, 6, 7)), t0 + 10)
        pl.update(snap([1, 2, 3]), snap([1, 2, 3], left=(0, 0, 1, 0), ep=(0, 5, 8, 7)),
                  t0 + 11)
        pl.update(snap([1, 2, 3]), snap([1, 2, 3], ep=(0, 5, 6, 9)), t0 + 12)
        pl.update(snap([1, 2, 3]), snap([1, 2, 3]), t0 + 13)      # nothing new
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "server 0: peer 3 (d:4) not heard from in 6 s (not started, another rack key, or "
        "unreachable)",
        "server 0: all 3 peers heard",
        "server 0: peer 1 (b:2) left the rack (silent for 100 ms): no task goes there until "
        "it is heard again",
        "server 0: peer 1 (b:2, restarted) back in the rack",
        "server 0: peer 2 (c:3, restarted) left the rack (silent for 100 ms) and came back "
        "within 1.0 s",
        "server 0: peer 3 (d:4) restarted (a new epoch), taken back at once",
    ], lines


def test_a_members_huge_critic_is_refused_by_the_policy_and_logged(caplog):
    """A member that signs with the rack's key (compromised, or broken) and sends a finite
    but huge critic: the MAC passes it, the policy's consensus refuses it (issue 13's first
    attack, θ = 1e300, now on a real server). The refusal is in the server's statistics
    (``policy``, from the policy's ``stats()``) and in serve's log, the server keeps its own
    critic bounded and keeps serving."""
    import numpy as np

    from malcolm.commands.serve import log_policy
    from malcolm.net.client import Client
    from malcolm.policy.registry import make_policy
    d = len(make_policy("malcolm", 2, 0, 1).py_heartbeat()["theta"])
    srv, addr, peers = _server(policy="malcolm", window_us=500)
    try:
        before = srv.stats()
        assert before["policy"]["consensus_rejected"] == 0 and before["policy"]["learn"]
        for i in range(1, 6):
            peers[0].send(addr, wire.encode_heartbeat(1, seq=i, load=1000.0, rate=1e-4,
                                                      theta=[1e300] * d, key=TO0, epoch=7,
                                                      auth_seq=i))
            time.sleep(0.02)
        assert _wait(lambda: srv.stats()["policy"]["consensus_rejected"] >= 1)
        after = srv.stats()
        assert after["hb_observed"] == 5 and after["malformed"] == 0     # the MAC passed
        theta = srv.policy_obj.theta
        assert np.all(np.isfinite(theta)) and np.abs(theta).max() < 1e3
        with Client("udp", [addr], key=KEY) as c:
            assert len(c.run(20, service_ns=0, rate=2000, timeout=5).answered) == 20
        with caplog.at_level("WARNING"):
            log_policy(0, before, after)
            log_policy(0, after, after)                   # nothing new: nothing said
        (line,) = [r.getMessage() for r in caplog.records]
        n = after["policy"]["consensus_rejected"]
        assert line == (f"server 0: the policy's guards fired: {n} peer critic(s) refused "
                        "in consensus"), line
    finally:
        srv.stop()
        for p in peers:
            p.close()
