"""Misuse of the public Python API, as a probe of it found it (forty-first session): each
case crashed the interpreter, hung, or ran with a value it should have refused. Now each is
one ValueError or TypeError naming the argument."""

import math

import pytest
from malcolm.net.transport import open_transport

from malcolm.sim import Rack, simulate


@pytest.mark.parametrize("workers, speeds, err, msg", [
    ((1, 2), (1.0,), ValueError, "2 servers' workers and 1 speeds"),      # SIGSEGV before
    ((1,), (1.0, 1.0, 1.0), ValueError, "1 servers' workers and 3 speeds"),
    ((10**9,), (1.0,), ValueError, "must be within 1-4096"),              # hung
    ((2**40,), (1.0,), ValueError, "must be within 1-4096"),              # OverflowError
    ((0, 2), (1.0, 1.0), ValueError, "workers 0 must be within"),         # blamed ewma
    ((), (), ValueError, "0 servers' workers"),
    ((1.5,), (1.0,), TypeError, "workers must be whole numbers"),
    (("2",), (1.0,), TypeError, "workers must be whole numbers"),
    ((1,), ("1",), TypeError, "speeds must be numbers"),
    ((1,), (math.nan,), ValueError, "speed nan must be within"),
])
def test_a_rack_built_by_hand_is_checked_as_a_spec_is(workers, speeds, err, msg):
    with pytest.raises(err, match=msg):
        Rack(workers, speeds)


def test_a_rack_built_by_hand_still_runs():
    r = Rack((2, 3), (1, 2.0))
    assert r.workers == (2, 3) and r.speeds == (1.0, 2.0)
    res = simulate(rack=r, policy="jsq", tasks=2000)
    assert res.measured > 0 and res.p99_us > 0


def test_policy_params_cannot_set_what_the_simulator_sets():
    # seed: "make_policy() got multiple values for argument 'seed'"
    with pytest.raises(ValueError, match="'seed' is not a parameter of malcolm"):
        simulate(policy="malcolm", policy_params={"seed": 3}, tasks=2000)
    with pytest.raises(TypeError, match="parameter names are strings"):
        simulate(policy="malcolm", policy_params={1: 2}, tasks=2000)


@pytest.mark.parametrize("kind", ["udp", "shm"])
def test_transport_waits_and_counts_are_checked(kind):
    t = open_transport(kind)
    try:
        for bad in (-1.0, math.nan, math.inf):      # each blocked forever
            with pytest.raises(ValueError, match="timeout must be a finite number"):
                t.block(bad)
            with pytest.raises(ValueError, match="timeout must be a finite number"):
                t.recv(bad)
        for n in (0, -5):           # -5 reached recvmmsg as a huge count and lost the data
            with pytest.raises(ValueError, match="max_n must be at least 1"):
                t.recv(0.0, max_n=n)
        t.block(0.001)
        t.send(t.address, b"hi")
        got = []
        for _ in range(100):
            got += t.recv(0.05, max_n=1)
            if got:
                break
        assert [d for d, _ in got] == [b"hi"]
    finally:
        t.close()


@pytest.mark.parametrize("cap", [2**30, 2**40, 3, True, 1.0])
def test_an_shm_ring_is_bounded(cap):
    # 2^30 made a 4.4 TB sparse ring that filled /dev/shm; 2^40 overflowed the C int
    with pytest.raises(ValueError, match="must be a power of two in 2..1048576"):
        open_transport("shm", capacity=cap)


@pytest.mark.parametrize("kw, msg", [
    (dict(window_us=math.nan), "window_us=nan must be a finite number in"),
    (dict(spin_us=-1.0), "spin_us=-1.0 must be a finite number in"),
    (dict(task_timeout_ms=math.nan), "task_timeout_ms=nan"),
    (dict(grace_s=math.nan), "grace_s=nan"),                   # failed only at stop()
    (dict(peer_timeout_ms=-5.0), "or -1: 20 windows, at least 100 ms"),
    (dict(idle_window_us=-5.0), "or -1: 32 windows, at most 5 ms"),
    (dict(max_service_ms=math.inf), "max_service_ms=inf"),
])
def test_a_servers_settings_are_checked_as_a_rack_files_are(kw, msg):
    from malcolm.runtime.server import Server

    from malcolm.policy.registry import make_policy
    t = open_transport("udp")
    try:
        with pytest.raises(ValueError, match=msg):
            Server(t, [t.address], 0, make_policy("random", 1, 0), workers=1, **kw)
    finally:
        t.close()
