"""A port chosen as free for a rack's server can be taken by another process before the server
binds it (the chooser must release it: the server binds it in another process). The runner
then restarts that rack on fresh ports, a bounded number of times, and says so in one line;
when every try fails, the demo says so in one line, without a traceback."""

import socket

import pytest
from click.testing import CliRunner

from malcolm.loadgen import experiment, method
from malcolm.net.ports import free_udp_ports


class Squatter:
    """A chooser that picks really free ports, then lets another socket take the last of
    them before the caller's server can bind it: the race, every time (``times``)."""

    def __init__(self, times):
        self.times, self.calls, self.socks = times, [], []

    def __call__(self, n, host="127.0.0.1"):
        ports = free_udp_ports(n, host)
        self.calls.append(ports)
        if len(self.calls) <= self.times:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((host, ports[-1]))
            self.socks.append(s)
        return ports

    def close(self):
        for s in self.socks:
            s.close()


def test_the_runner_restarts_a_rack_whose_port_was_taken(tmp_path, monkeypatch):
    squat = Squatter(times=1)
    monkeypatch.setattr(experiment, "free_udp_ports", squat)
    lines = []
    exp = experiment.Experiment([1, 1], policies=["jsq"], loads=[0.5], dilate=50,
                                echo=lines.append)
    exp.dilate = 50.0
    exp.layout = method.layout(exp.workers, [0, 1], 1000.0)
    rk = experiment.PolicyRack(exp, "jsq", str(tmp_path), "t")
    try:
        rk.start()
        rk.wait_ready(timeout=60)
        assert exp.port_retries == 1 and len(squat.calls) == 2
        taken = squat.calls[0][-1]
        assert f"127.0.0.1:{taken}" not in rk.addresses
        assert not rk.dead() and len(rk.rack.procs) == 2
        (note,) = [ln for ln in lines if "was taken" in ln]
        assert f"127.0.0.1:{taken}" in note and "fresh ports" in note
    finally:
        rk.down()
        squat.close()


def test_a_rack_whose_ports_are_always_taken_is_one_line_of_the_demo(tmp_path, monkeypatch):
    squat = Squatter(times=100)
    monkeypatch.setattr(experiment, "free_udp_ports", squat)
    from malcolm.commands.demo import demo
    r = CliRunner().invoke(demo, ["--quick", "--policy", "jsq", "--workers", "1", "--load",
                                  "0.5", "--plot", str(tmp_path / "p.png"), "--logdir",
                                  str(tmp_path / "logs")])
    squat.close()
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    assert len(squat.calls) == experiment.PORT_TRIES
    (err,) = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert "Address already in use" in err and "jsq rack: server 0 exited" in err
    assert sum("was taken" in ln for ln in r.output.splitlines()) == experiment.PORT_TRIES - 1


@pytest.mark.parametrize("n", [1, 4])
def test_free_ports_are_not_handed_out_twice(n):
    seen = set()
    for _ in range(50):
        got = free_udp_ports(n)
        assert len(set(got)) == n and not seen & set(got)
        seen.update(got)
