"""``LocalRack.down`` waits long enough for a server's own bounded stop, so that a slow stop
ends with the server's report of the threads that did not stop (exit 3), not a SIGKILL, and
asks a server that still runs for its threads' stacks before the SIGKILL;
``LocalRack.tail`` quotes a server's last output lines for a note about how it exited."""

import os
import subprocess
import textwrap
import time

from malcolm.net.ports import free_udp_ports
from malcolm.runtime.config import stop_bound_s
from malcolm.runtime.launcher import STACKS_SIGNAL, LocalRack


def _rack(tmp_path, grace, workers):
    path = tmp_path / "rack.toml"
    servers = "".join(f'\n[[server]]\naddress = "127.0.0.1:{port}"\nworkers = {w}\n'
                      for port, w in zip(free_udp_ports(len(workers)), workers, strict=True))
    path.write_text(textwrap.dedent(f"""
        [rack]
        transport = "udp"
        handler = "echo"
        grace_s = {grace}
        [policy]
        name = "jsq"
        """) + servers)
    return LocalRack(str(path), logdir=str(tmp_path))


class _Slow:
    """A server process that is still stopping: records how long it was waited for."""

    pid = 2 ** 22 + 1           # above any real pid (pid_max), for the launcher's guard

    def __init__(self):
        self.waited, self.killed, self.signals = [], False, []

    def poll(self):
        return None

    def send_signal(self, sig):
        self.signals.append(sig)

    def wait(self, timeout=None):
        if self.killed:
            return -9
        self.waited.append(timeout)
        raise subprocess.TimeoutExpired("serve", timeout)

    def kill(self):
        self.killed = True


def test_down_waits_for_the_servers_own_bounded_stop(tmp_path):
    # RackServer.stop joins the gateway for grace + 5 s, then each of the W workers and the
    # policy thread for grace each, after up to 1 s in the main loop.
    for grace, workers in ((1.0, [3, 1]), (2.0, [8, 2, 2]), (0.0, [1, 1])):
        rk = _rack(tmp_path, grace, workers)
        procs = {k: _Slow() for k in range(len(workers))}
        rk.procs = procs
        codes = rk.down()
        assert codes == {k: -9 for k in procs}
        server_stop = 1.0 + grace + 5.0 + (max(workers) + 1) * max(0.1, grace)
        assert stop_bound_s(grace, max(workers)) == server_stop - 1.0     # the shared bound
        assert procs[0].waited[0] > server_stop, (grace, workers, procs[0].waited)
        assert procs[0].waited[0] < server_stop + 10.0      # still bounded
        # SIGTERM, then (still running) the request for its threads' stacks, then SIGKILL
        assert procs[0].signals[-1] == STACKS_SIGNAL and procs[0].waited[-1] == 1.0


def test_tail_quotes_the_last_lines(tmp_path):
    rk = _rack(tmp_path, 1.0, [1, 1])
    (tmp_path / "server-1.out").write_text("".join(f"line {i}\n" for i in range(20)))
    assert rk.tail(1, 3) == "    server 1: line 17\n    server 1: line 18\n    server 1: line 19"
    (tmp_path / "server-0.out").write_text("")
    assert rk.tail(0) == "    server 0: (no output)"
    assert rk.tail(5).startswith("    server 5: no output (")


def test_a_server_writes_its_threads_stacks_on_the_stacks_signal(tmp_path):
    rk = _rack(tmp_path, 1.0, [1, 1])
    rk.up()
    try:
        os.kill(rk.procs[0].pid, STACKS_SIGNAL)
        t_end = time.monotonic() + 20.0
        while "most recent call first" not in rk.output(0) and time.monotonic() < t_end:
            time.sleep(0.05)
        out = rk.output(0)
        assert "most recent call first" in out, out     # faulthandler's dump
        assert rk.procs[0].poll() is None               # and the server runs on
    finally:
        codes = rk.down()
    assert codes == {0: 0, 1: 0}
