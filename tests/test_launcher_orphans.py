"""A server started by the local launcher stops itself when the launcher dies without
stopping it (SIGKILL), instead of running on as an orphan that holds its ports."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from malcolm.net.ports import free_udp_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _launch(tmp_path, env_extra=None):
    ports = free_udp_ports(2)
    rack = tmp_path / "rack.toml"
    rack.write_text(textwrap.dedent(f"""
        [rack]
        transport = "udp"
        handler = "echo"
        [policy]
        name = "jsq"
        [[server]]
        address = "127.0.0.1:{ports[0]}"
        workers = 1
        [[server]]
        address = "127.0.0.1:{ports[1]}"
        workers = 1
    """))
    script = textwrap.dedent(f"""
        import sys, time
        from malcolm.runtime.launcher import LocalRack
        lr = LocalRack({str(rack)!r}, logdir={str(tmp_path)!r}).up()
        print(" ".join(str(p.pid) for p in lr.procs.values()), flush=True)
        time.sleep(60)
    """)
    env = dict(os.environ, **(env_extra or {}))
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                text=True, env=env, cwd=ROOT)
    line = launcher.stdout.readline()
    return launcher, [int(x) for x in line.split()]


def test_servers_stop_when_their_launcher_is_killed(tmp_path):
    launcher, pids = _launch(tmp_path)
    try:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        t_end = time.monotonic() + 20
        while time.monotonic() < t_end and any(_alive(p) for p in pids):
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "orphaned servers kept running"
        out = (tmp_path / "server-0.out").read_text()
        assert "its launcher exited" in out
    finally:
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
