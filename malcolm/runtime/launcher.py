"""The local rack launcher: every server of a rack file as a ``malcolm serve`` process here.

One launcher for everything that runs a rack on this host: ``malcolm rack up``, the demo and
the benchmark runner, the fault injector and the tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from malcolm.runtime.config import load_rack


class LocalRack:
    """Servers of a rack file as child processes of this one.

    ``malcolm rack up``, the demo and benchmarks (through ``malcolm.loadgen.experiment``),
    the fault injector (``malcolm.loadgen.faults.FaultRack``) and the tests all start racks
    with it.

    Parameters
    ----------
    rack_path : str
    extra_args : list of str
        Passed to every ``malcolm serve``.
    logdir : str or None
        Where each server's stdout/stderr go (``server-K.out``) and its ``--stats-json``
        (``server-K.json``); a temporary one by default.
    ids : list of int or None
        The servers to run (default: all of the rack file's).
    env : dict or None
        The servers' environment (default: this process's).
    """

    def __init__(self, rack_path, extra_args=(), logdir=None, ids=None, env=None):
        self.cfg = load_rack(rack_path)
        self.path = rack_path
        self.extra = list(extra_args)
        self.logdir = logdir or tempfile.mkdtemp(prefix="malcolm-rack-")
        self.ids = list(range(len(self.cfg.servers))) if ids is None else list(ids)
        self.env = env
        self.procs = {}

    def out_path(self, k):
        return os.path.join(self.logdir, f"server-{k}.out")

    def stats_path(self, k):
        return os.path.join(self.logdir, f"server-{k}.json")

    def start(self, k, wait=True, timeout=30.0):
        out = open(self.out_path(k), "w")
        cmd = server_command() + ["serve", "--rack", self.path, "--id", str(k),
                                  "--stats-json", self.stats_path(k)] + self.extra
        # The server stops itself if this process dies without stopping it (no orphans
        # holding ports after a SIGKILL): see _launcher_pid in commands/serve.py.
        env = dict(os.environ if self.env is None else self.env,
                   MALCOLM_LAUNCHER_PID=str(os.getpid()))
        self.procs[k] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
        out.close()
        if wait:
            self.wait_ready([k], timeout)

    def up(self, timeout=30.0, ids=None):
        """Start every server (``ids``: only those; the others can join later with
        :meth:`start`) and wait until each says it is ready."""
        ids = self.ids if ids is None else list(ids)
        for k in ids:
            self.start(k, wait=False)
        self.wait_ready(ids, timeout)
        return self

    def wait_ready(self, ids, timeout=30.0):
        """Wait until servers ``ids`` say they are ready; on a failure stop the rack and raise
        RuntimeError (a server exited, with its output) or TimeoutError."""
        t_end = time.monotonic() + timeout
        pending = set(ids)
        while pending:
            for k in list(pending):
                with open(self.out_path(k)) as f:
                    if " ready on " in f.read():
                        pending.discard(k)
                        continue
                if self.procs[k].poll() is not None:
                    self.down()
                    raise RuntimeError(f"server {k} exited with {self.procs[k].returncode}:\n"
                                       + open(self.out_path(k)).read()[-3000:])
            if pending and time.monotonic() > t_end:
                self.down()
                raise TimeoutError(f"servers {sorted(pending)} not ready in {timeout} s")
            time.sleep(0.05)

    def kill(self, k, sig=signal.SIGKILL):
        """Kill one server abruptly (tests of failures)."""
        p = self.procs[k]
        p.send_signal(sig)
        p.wait(10)
        if self.cfg.transport == "shm":     # a killed owner leaves its ring behind
            _unlink_shm(self.cfg.servers[k].address)

    def down(self, timeout=None):
        """SIGTERM every server, wait for the clean stop, SIGKILL what is left.

        Returns {server: exit code}.
        """
        timeout = self.cfg.grace_s + 10.0 if timeout is None else timeout
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        t_end = time.monotonic() + timeout
        codes = {}
        for k, p in self.procs.items():
            try:
                codes[k] = p.wait(max(0.1, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                codes[k] = p.wait(5)
                if self.cfg.transport == "shm":
                    _unlink_shm(self.cfg.servers[k].address)
        return codes

    def stats(self, k):
        """Server ``k``'s latest statistics (its ``--stats-json``, rewritten every second);
        {} before the first."""
        try:
            with open(self.stats_path(k)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def output(self, k):
        with open(self.out_path(k)) as f:
            return f.read()

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()


def server_command():
    """How to start ``malcolm`` in a child process: the argv prefix before ``serve ...``.

    The child imports the very ``malcolm`` package this process imported (installed, editable
    or built in place in a source checkout), never whatever ``malcolm/`` folder happens to be
    in the working directory: run from inside a source tree with a non-editable install,
    plain ``python -m malcolm`` would import the uncompiled sources there. ``-P`` (3.11+)
    keeps the working directory off ``sys.path``; the package's own root goes first.
    """
    import malcolm

    root = os.path.dirname(os.path.dirname(os.path.abspath(malcolm.__file__)))
    boot = (f"import sys; sys.path.insert(0, {root!r}); sys.argv[0] = 'malcolm'; "
            "from malcolm.cli import main; main()")
    flags = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *flags, "-c", boot]


def _unlink_shm(name):
    try:
        os.unlink(f"/dev/shm/malcolm-{name}")
    except FileNotFoundError:
        pass
