"""The local rack launcher: every server of a rack file as a ``malcolm serve`` process here.

One launcher for everything that runs a rack on this host: ``malcolm rack up``, the demo and
the benchmark runner, the fault injector and the tests.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref

from malcolm._units import ascii_digits
from malcolm.runtime.config import load_rack, stop_bound_s

# `malcolm serve` exits with this code when its address is taken (EADDRINUSE, Linux's value):
# a launcher that chose the port itself can then pick another and retry.
EXIT_ADDR_IN_USE = errno.EADDRINUSE
# What the kernel sends a launched server when the thread that started it exits
# (PR_SET_PDEATHSIG). Not SIGTERM: that thread need not be the launcher's last (the fault
# injector restarts servers from short-lived threads), so the server checks that its parent
# really is gone before it stops (see commands/serve.py).
PDEATH_SIGNAL = signal.SIGUSR1
# Asks a server (``malcolm serve``) to write every thread's stack to its output
# (faulthandler): sent before a SIGKILL, so that a stop that hung says where.
STACKS_SIGNAL = signal.SIGUSR2
_PR_SET_PDEATHSIG = 1


# Popen's arguments for a child in a process group of its own (see LocalRack.start)
_OWN_GROUP = ({"process_group": 0} if sys.version_info >= (3, 11)
              else {"preexec_fn": os.setpgrp})


class ServerExited(RuntimeError):
    """A server of a :class:`LocalRack` exited before it said it was ready.

    Attributes: ``server`` (its index), ``code`` (its exit code), ``reason`` (the last line
    of its output), ``addr_in_use`` (its address was taken: :data:`EXIT_ADDR_IN_USE`).
    """

    def __init__(self, server, code, output):
        lines = [ln for ln in output.splitlines() if ln.strip()]
        self.server, self.code = server, code
        self.reason = lines[-1].strip() if lines else "no output"
        self.addr_in_use = code == EXIT_ADDR_IN_USE
        super().__init__(f"server {server} exited with {code}:\n{output[-3000:]}")


#: Server threads (gateways and workers) the demo and ``rack up`` start here, through
#: :class:`LocalRack`, per CPU at most: the demo's default rack has 12 on 2 CPUs, the
#: largest in the docs 20.
THREADS_PER_CPU = 16


def too_many_threads(workers):
    """Why servers of ``workers`` worker threads each cannot all run on this machine, or None.

    Every server runs a gateway and a thread per worker here. Far more of them than cores
    cannot keep a schedule at any dilation, and 64 servers of 64 workers (4160 polling
    threads) stalled a 2-core machine for a quarter of an hour.
    """
    cpus = len(os.sched_getaffinity(0))
    threads = sum(1 + max(0, w) for w in workers)
    if threads > THREADS_PER_CPU * cpus:
        return (f"{threads} server threads (a gateway per server, one per worker) on {cpus} "
                f"CPU(s); at most {THREADS_PER_CPU} per CPU here")
    return None


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
        (``server-K.json``); by default a temporary one, removed with this object (when it
        is collected, or at exit): pass one to keep the logs.
    ids : list of int or None
        The servers to run (default: all of the rack file's).
    env : dict or None
        The servers' environment (default: this process's).
    """

    def __init__(self, rack_path, extra_args=(), logdir=None, ids=None, env=None):
        self.cfg = load_rack(rack_path)
        self.path = rack_path
        self.extra = list(extra_args)
        self.logdir = logdir
        self._rm_logdir = None
        if not logdir:
            self.logdir = tempfile.mkdtemp(prefix="malcolm-rack-")
            # Not in down(): a caller may read the output and statistics after the stop.
            # Every run without a logdir used to leave its folder in /tmp.
            self._rm_logdir = weakref.finalize(self, shutil.rmtree, self.logdir,
                                               ignore_errors=True)
        self.ids = list(range(len(self.cfg.servers))) if ids is None else list(ids)
        self.env = env
        self.procs = {}

    def keep_logs(self):
        """Keep a temporary ``logdir`` after this object is gone (``rack up``, which tells
        the user where its servers' output is)."""
        if self._rm_logdir is not None:
            self._rm_logdir.detach()

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
        # Its own process group: a Ctrl-C at the terminal reaches this process, which stops
        # the rack in order, not every server at once behind its back; and when this process
        # dies, the kernel wakes a server it had paused (SIGSTOP) with SIGHUP and SIGCONT
        # (an orphaned process group with a stopped member), so that it too can stop.
        self.procs[k] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, **_OWN_GROUP)
        out.close()
        # ... but the kernel does that only where the group becomes orphaned, which a
        # subreaper in this session prevents: the guard resumes it in any case.
        _GUARD.watch(self.procs[k].pid)
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
        :class:`ServerExited` (a RuntimeError: a server exited, with its output) or
        TimeoutError."""
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
                    raise ServerExited(k, self.procs[k].returncode, self.output(k))
            if pending and time.monotonic() > t_end:
                self.down()
                raise TimeoutError(f"servers {sorted(pending)} not ready in {timeout} s")
            time.sleep(0.05)

    def kill(self, k, sig=signal.SIGKILL):
        """Kill one server abruptly (tests of failures)."""
        p = self.procs[k]
        p.send_signal(sig)
        p.wait(10)
        _GUARD.forget(p.pid)
        if self.cfg.transport == "shm":     # a killed owner leaves its ring behind
            _unlink_shm(self.cfg.servers[k].address)

    def down(self, timeout=None):
        """SIGTERM every server, wait for the clean stop, SIGKILL what is left.

        Returns {server: exit code}.
        """
        if timeout is None:
            # Long enough for the server's own bounded stop (RackServer.stop's joins, after
            # up to 1 s in its main loop), so that a slow stop ends with the server's report
            # of the threads that did not stop (exit 3), not with a SIGKILL that says nothing.
            most = max((self.cfg.servers[k].workers for k in self.procs), default=1)
            timeout = 1.0 + stop_bound_s(self.cfg.grace_s, most) + 5.0
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        t_end = time.monotonic() + timeout
        codes = {}
        for k, p in self.procs.items():
            try:
                codes[k] = p.wait(max(0.1, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.send_signal(STACKS_SIGNAL)
                try:
                    codes[k] = p.wait(1.0)      # the dump's time (it may exit meanwhile)
                except subprocess.TimeoutExpired:
                    p.kill()
                    codes[k] = p.wait(5)
                if self.cfg.transport == "shm":
                    _unlink_shm(self.cfg.servers[k].address)
            _GUARD.forget(p.pid)
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

    def tail(self, k, lines=6):
        """The last ``lines`` lines of server ``k``'s output, indented, for a note about how
        it exited (a temporary ``logdir`` is gone once its caller is done)."""
        try:
            text = self.output(k)
        except OSError as e:
            return f"    server {k}: no output ({e.strerror})"
        last = text.rstrip().splitlines()[-lines:] or ["(no output)"]
        return "\n".join(f"    server {k}: {line}" for line in last)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()


class _Guard:
    """This process's guard (``_guard.py``): started with the first server, told of each
    server started (``+PID``) and reaped (``-PID``) through a pipe, and left to resume
    (SIGCONT) the servers still listed when the pipe's write end closes: when this process
    dies, however it dies. See ``_guard.py`` for why."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc = None

    def _pipe(self):
        # None in a forked child too (_after_fork): it starts a guard of its own
        if self._proc is None or self._proc.poll() is not None:
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_guard.py")
            # -I -S: the standard library only, started in milliseconds
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", script],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, **_OWN_GROUP)
        return self._proc.stdin

    def _send(self, line):
        with self._lock:
            try:
                pipe = self._pipe()
                pipe.write(line.encode())
                pipe.flush()
            except OSError:
                # No guard (it could not start, or it was killed): a paused server of a dead
                # launcher then relies on the kernel's orphaned-group rule alone. Running
                # servers stop on their own either way; nothing here is worth failing for.
                pass

    def watch(self, pid):
        self._send(f"+{pid}\n")

    def forget(self, pid):
        if self._proc is not None:
            self._send(f"-{pid}\n")

    def _after_fork(self):
        # A forked child must not keep the parent's pipe open (the parent's guard would not
        # see its end while the child lives); it starts its own guard if it starts servers.
        proc, self._proc = self._proc, None
        self._lock = threading.Lock()
        self._inherited = proc          # kept: collecting it here would warn of a "running" child
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def close(self):
        """At this process's normal exit: end the guard now rather than leave it to the
        kernel (and a "still running" warning from the interpreter's shutdown)."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return
            try:
                proc.stdin.close()
                proc.wait(2.0)
            except (OSError, subprocess.TimeoutExpired):
                pass


_GUARD = _Guard()
atexit.register(_GUARD.close)
os.register_at_fork(after_in_child=_GUARD._after_fork)


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
            "from malcolm._entry import run; run()")
    flags = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *flags, "-c", boot]


def die_with_launcher():
    """In a server a :class:`LocalRack` started: the launcher's pid, with the kernel asked
    to send :data:`PDEATH_SIGNAL` when the thread that started this process exits; None
    when no launcher started it.

    Raises SystemExit when the launcher is gone already (it died before the request took
    effect). Where ``prctl`` is unavailable (not Linux) the server's own polling of its
    parent (about once a second) is all there is.
    """
    text = os.environ.get("MALCOLM_LAUNCHER_PID", "")
    if not ascii_digits(text):
        return None
    parent = int(text)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(PDEATH_SIGNAL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        raise SystemExit(f"malcolm serve: its launcher (pid {parent}) exited before it "
                         "started; not starting")
    return parent


def _unlink_shm(name):
    try:
        os.unlink(f"/dev/shm/malcolm-{name}")
    except FileNotFoundError:
        pass
