"""The delay stage (``malcolm.net.delay``): per-hop delay, jitter, reordering and loss in the
sender's transport, over every transport that can run here (the suite of test_transport).

The stage holds messages on the *sender*: they leave when the sender's thread polls, waits or
sends again, as the gateway and the load generator do in their loops. Timing assertions are
lower bounds (a message never arrives early) plus generous upper bounds, so that a loaded
machine cannot fail them."""

import time

import pytest
from malcolm.net.delay import DelayTransport, wrap

DELAY_US = 20_000.0          # 20 ms: far above scheduling noise, so "not early" is exact


def _pump_until(sender, receiver, want, timeout=5.0):
    """Let the sender's loop run (recv: poll and bounded waits) while collecting at the
    receiver; return [(bytes, arrival time)]."""
    got = []
    t_end = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < t_end:
        sender.recv(0.002)
        for d, _ in receiver.recv(0.0):
            got.append((d, time.monotonic()))
    return got


def test_nothing_to_emulate_is_the_transport_itself(pair):
    kind, a, b = pair
    assert wrap(a) is a
    with pytest.raises(ValueError):
        DelayTransport(a, delay_us=float("nan"))
    with pytest.raises(ValueError):
        DelayTransport(a, loss=1.5)


def test_messages_wait_their_delay_and_keep_their_order(pair):
    kind, a, b = pair
    d = DelayTransport(a, delay_us=DELAY_US)
    assert d.kind == kind and d.address == a.address
    msgs = [f"m{i}".encode() * (1 + i % 5) for i in range(200)]
    t0 = time.monotonic()
    d.send_many([(b.address, m) for m in msgs])
    assert d.held == len(msgs)
    assert b.recv(0.0) == []                    # nothing before its time
    got = _pump_until(d, b, len(msgs))
    assert [m for m, _ in got] == msgs if kind != "udp" else sorted(m for m, _ in got) == \
        sorted(msgs)
    assert min(t for _, t in got) - t0 >= DELAY_US / 1e6
    assert max(t for _, t in got) - t0 < 2.0
    st = d.stats()
    assert st["delayed"] == len(msgs) and st["held"] == 0 and st["net_lost"] == 0
    assert d.n_sent == len(msgs)
    # the receive side goes through the stage untouched, with the sender's address
    b.send(d.address, b"back")
    (data, src), = _pump_until_recv(d)
    assert data == b"back" and src == b.address


def _pump_until_recv(t, timeout=5.0):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        got = t.recv(0.05)
        if got:
            return got
    return []


def test_a_blocked_sender_wakes_to_send_what_is_due(pair):
    kind, a, b = pair
    d = DelayTransport(a, delay_us=DELAY_US)
    d.send(b.address, b"later")
    t0 = time.monotonic()
    d.block(5.0)                 # bounded by the due time, not by the 5 s asked for
    assert DELAY_US / 1e6 * 0.9 <= time.monotonic() - t0 < 2.0
    assert d.held == 0
    assert _pump_until_recv(b)[0][0] == b"later"


def test_jitter_and_reorder_deliver_everything_out_of_order(pair):
    kind, a, b = pair
    d = DelayTransport(a, delay_us=5000.0, jitter_us=5000.0, reorder=0.25, seed=3)
    msgs = [i.to_bytes(4, "big") for i in range(400)]
    for i in range(0, len(msgs), 20):           # in batches, as a gateway sends
        d.send_many([(b.address, m) for m in msgs[i:i + 20]])
        d.recv(0.0005)
    got = [m for m, _ in _pump_until(d, b, len(msgs))]
    assert sorted(got) == msgs                  # every one, once
    assert got != msgs                          # and not in the order sent
    assert 40 < d.stats()["reordered"] < 160


def test_loss_drops_its_share_and_counts_it(pair):
    kind, a, b = pair
    d = DelayTransport(a, loss=0.2, seed=5)
    n = 2000
    got = []
    for i in range(0, n, 50):
        d.send_many([(b.address, i.to_bytes(4, "little"))] * 50)
        got += b.recv(0.0)          # keep the receiver's ring (shm: 1024) from filling
    got += _pump_until(d, b, n - d.n_net_lost - len(got), 5.0)
    lost = d.stats()["net_lost"]
    assert 0.15 * n < lost < 0.25 * n
    assert len(got) == n - lost


def test_a_full_queue_sends_early_rather_than_drop(pair):
    kind, a, b = pair
    d = DelayTransport(a, delay_us=1e6, capacity=8)
    d.send_many([(b.address, bytes([i])) for i in range(12)])
    assert d.stats()["early"] == 4 and d.held == 8
    assert len(_pump_until(d, b, 4, 1.0)) == 4


def test_close_sends_what_is_held(pair):
    kind, a, b = pair
    d = DelayTransport(a, delay_us=1e6)
    d.send_many([(b.address, b"x")] * 5)
    d.close()
    assert a.closed
    got = []
    t_end = time.monotonic() + 5
    while len(got) < 5 and time.monotonic() < t_end:
        got += b.recv(0.05)
    assert len(got) == 5


def test_a_racks_hop_delay_applies_to_servers_and_clients(tmp_path):
    """``[rack] hop_delay_us`` delays every hop: the server's transport (from the rack file)
    and the load generator's (which reads the same file). A task's round trip crosses two
    hops, so no response can come back in less than twice the delay."""
    from malcolm.loadgen.run import LoadSpec, resolve_target, run_load
    from malcolm.net.ports import free_udp_ports
    from malcolm.runtime.config import build_server, load_rack
    port, = free_udp_ports(1)
    path = tmp_path / "rack.toml"
    path.write_text(f"""[rack]
handler = "sleep"
workers = 1
hop_delay_us = 4000.0
[policy]
name = "random"
[[server]]
address = "127.0.0.1:{port}"
""")
    cfg = load_rack(str(path))
    assert cfg.hop == {"delay_us": 4000.0, "jitter_us": 0.0, "reorder": 0.0, "loss": 0.0}
    srv = build_server(cfg, 0).start()
    try:
        target = resolve_target(rack=str(path))
        assert target.hop == cfg.hop
        rep = run_load(LoadSpec(target=target, workload="exp:10", duration_s=0.6,
                                warmup_s=0.1, timeout_s=1.0), 200)
    finally:
        srv.stop()
    assert rep["accounted"] and rep["timed_out"] == 0 and rep["completed"] > 50, rep
    lat = rep["latency_us"]
    assert lat["min"] >= 2 * 4000.0, lat
    assert lat["p50"] < 200_000, lat


def test_the_experiment_runner_dilates_the_hop_delay():
    """``--dilate K`` injects K x 2 µs per hop (the thesis's one-way delay) when K > 1, none
    at K = 1 (real time: the loopback's own delay is already above it), and the simulator
    twin gets exactly the injected delay."""
    from malcolm.loadgen.experiment import HOP_DELAY_US, Experiment, ExperimentError, rack_toml
    exp = Experiment([1, 1], dilate=50)
    assert HOP_DELAY_US == 2.0
    assert exp.hop_us(50) == 2.0 and exp.hop_us(1) == 0.0
    assert Experiment([1], hop_delay_us=0.0).hop_us(50) == 0.0
    assert Experiment([1], hop_delay_us=5.0).hop_us(1) == 5.0
    with pytest.raises(ExperimentError):
        Experiment([1], hop_delay_us=float("nan"))
    exp.dilate = 50.0
    assert exp.costs_for([]).delay_us == 2.0
    assert "hop_delay_us = 100.0" in rack_toml({"name": "jsq"}, [("127.0.0.1:1", 1)],
                                              window_us=5000.0, hop_delay_us=100.0)


@pytest.mark.parametrize("line", ["hop_loss = 1.5", "hop_delay_us = nan", "hop_reorder = -0.1",
                                  "hop_jitter_us = inf"])
def test_bad_hop_settings_are_refused_with_one_line(tmp_path, line):
    from malcolm.runtime.config import ConfigError, load_rack
    path = tmp_path / "rack.toml"
    path.write_text(f'[rack]\n{line}\n[policy]\nname = "random"\n[[server]]\n'
                    'address = "127.0.0.1:7001"\n')
    with pytest.raises(ConfigError, match=line.split()[0]):
        load_rack(str(path))
