"""A server started by the local launcher stops itself when the launcher dies without
stopping it (SIGKILL), instead of running on as an orphan that holds its ports."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

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


# Runs a command as the child of a subreaper in this session, as a CI harness, a container's
# init or ``systemd --user`` may do: the launcher's orphans go to it, not to init, and their
# process groups are not orphaned, so the kernel does not wake a paused one (SIGHUP and
# SIGCONT). It reaps what it adopts, as such a subreaper does, and prints nothing.
_SUBREAPER = textwrap.dedent("""
    import ctypes, os, subprocess, sys, time
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)         # PR_SET_CHILD_SUBREAPER
    subprocess.Popen(sys.argv[1:])
    t_end = time.monotonic() + 90
    while time.monotonic() < t_end:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
""")


def _launch(tmp_path, env_extra=None, pause=(), from_thread=False, subreaper=False):
    """A launcher process running a 2-server rack; ``pause``: servers it SIGSTOPs;
    ``from_thread``: it starts the rack from a thread that exits right after;
    ``subreaper``: it runs under a subreaper in this session (see _SUBREAPER).

    Returns (launcher's pid, servers' pids, the process to stop at the end)."""
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
        import os, signal, sys, threading, time
        from malcolm.runtime.launcher import LocalRack
        lr = LocalRack({str(rack)!r}, logdir={str(tmp_path)!r})
        if {from_thread!r}:
            th = threading.Thread(target=lr.up)
            th.start()
            th.join()
        else:
            lr.up()
        for k in {tuple(pause)!r}:
            pid = lr.procs[k].pid
            os.kill(pid, signal.SIGSTOP)
            while open(f"/proc/{{pid}}/stat").read().split(")")[-1].split()[0] != "T":
                time.sleep(0.01)
        print(os.getpid(), " ".join(str(p.pid) for p in lr.procs.values()), flush=True)
        time.sleep(60)
    """)
    env = dict(os.environ, **(env_extra or {}))
    cmd = [sys.executable, "-c", script]
    if subreaper:
        cmd = [sys.executable, "-c", _SUBREAPER] + cmd
    top = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    pids = [int(x) for x in top.stdout.readline().split()]
    return pids[0], pids[1:], top


def _kill_launcher(launcher):
    os.kill(launcher, signal.SIGKILL)
    assert _gone_within([launcher], 10)


def _cleanup(top, pids):
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)
    top.kill()
    top.wait(10)


def _gone_within(pids, seconds):
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


@pytest.mark.parametrize("subreaper", [False, True])
def test_servers_stop_when_their_launcher_is_killed(tmp_path, subreaper):
    launcher, pids, top = _launch(tmp_path, subreaper=subreaper)
    try:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        _kill_launcher(launcher)
        assert _gone_within(pids, 20), "orphaned servers kept running"
        out = (tmp_path / "server-0.out").read_text()
        assert "its launcher exited" in out
    finally:
        _cleanup(top, pids)


@pytest.mark.parametrize("subreaper", [False, True])
def test_a_paused_server_stops_too_when_its_launcher_is_killed(tmp_path, subreaper):
    """The runner pauses (SIGSTOP) the racks of the policies not running: a stopped process
    neither polls its parent nor acts on a signal other than SIGKILL/SIGCONT. The launcher's
    guard (runtime/_guard.py) resumes it when the launcher dies, and the server stops. The
    kernel's own rule (SIGHUP and SIGCONT to an orphaned process group with a stopped
    member) does not apply under a subreaper in the launcher's session: CI failed this test
    that way before the guard existed."""
    launcher, pids, top = _launch(tmp_path, pause=(1,), subreaper=subreaper)
    try:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        with open(f"/proc/{pids[1]}/stat") as f:
            assert f.read().split(")")[-1].split()[0] == "T"         # stopped
        _kill_launcher(launcher)
        assert _gone_within(pids, 20), "orphaned servers kept running"
        for k in (0, 1):
            assert "stopped (" in (tmp_path / f"server-{k}.out").read_text()
    finally:
        _cleanup(top, pids)


def test_servers_outlive_the_launcher_thread_that_started_them(tmp_path):
    """The kernel's parent-death signal fires when the *thread* that started a server exits
    (the fault injector restarts servers from short-lived threads): the server checks that
    its launcher process is really gone before it stops."""
    launcher, pids, top = _launch(tmp_path, from_thread=True)
    try:
        assert len(pids) == 2
        time.sleep(2.0)
        assert all(_alive(p) for p in pids), "a server stopped when its starter thread ended"
        _kill_launcher(launcher)
        assert _gone_within(pids, 20)
    finally:
        _cleanup(top, pids)


def test_a_forked_child_does_not_hold_the_guards_pipe():
    """The guard sees its launcher's end by the pipe's end: a forked child (multiprocessing)
    that kept the write end open would keep a dead launcher's paused servers stopped."""
    script = textwrap.dedent("""
        import os, sys
        from malcolm.runtime import launcher
        launcher._GUARD.watch(os.getpid())
        ino = os.fstat(launcher._GUARD._proc.stdin.fileno()).st_ino
        pid = os.fork()
        if pid == 0:
            held = [fd for fd in os.listdir("/proc/self/fd")
                    if os.path.exists(f"/proc/self/fd/{fd}")
                    and os.stat(f"/proc/self/fd/{fd}").st_ino == ino]
            os._exit(1 if held else 0)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
