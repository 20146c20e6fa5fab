"""The load generator's client threads: one native :class:`LoadClient` each, started on a
common schedule and waited for, by :func:`malcolm.loadgen.run.run_load`. A thread that
raises stops the run and its exception reaches the caller (a ``LoadgenError``, which the CLI
says in one line): a run whose thread died used to return as if it were fine, with that
thread's tasks simply missing from the report (for a ``--cpus`` core it may not use, none
sent at all)."""

from __future__ import annotations

import os
import threading
import time


def pinned_run(client, t0, cpus, i, nice=None):
    """One client thread: pinned to ``cpus[i % len(cpus)]`` and at ``nice`` if given."""
    if cpus:
        os.sched_setaffinity(0, {cpus[i % len(cpus)]})      # 0: this thread on Linux
    if nice is not None:
        try:        # on Linux a thread id names one thread: only this client thread
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError:
            pass    # not permitted: the experiment runner says whether it could
    client.run(t0)


def run_threads(clients, t0, spec, stop_event=None, abandon=None):
    """Run each client in its own thread from ``t0`` (ns) and wait for them; return whether
    the run was interrupted (``stop_event`` or Ctrl-C: the clients are stopped, their results
    stand). Raises ``LoadgenError`` if a thread raised (the others are stopped first; the
    exception is its ``__cause__``) or the threads are not done 10 s past the run; then
    ``abandon()`` is called first if a thread is still running (its transport must not be
    closed under it)."""
    from malcolm.loadgen.run import LoadgenError
    failed = []                 # (thread name, exception), in the order they happened
    any_failed = threading.Event()

    def body(c, i):
        try:
            pinned_run(c, t0, spec.cpus, i, spec.nice)
        except BaseException as e:       # handed to the caller, not lost with the thread
            failed.append((threading.current_thread().name, e))
            any_failed.set()

    threads = [threading.Thread(target=body, args=(c, i), daemon=True, name=f"loadgen-{i}")
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    limit = spec.warmup_s + spec.duration_s + spec.timeout_s + 10.0
    t_end = time.monotonic() + limit
    interrupted = late = False
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.1)
                if any_failed.is_set() or (stop_event is not None and stop_event.is_set()):
                    raise KeyboardInterrupt
                if time.monotonic() > t_end:
                    late = True
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        interrupted = True
        for c in clients:
            c.stop()
        for t in threads:
            t.join(spec.timeout_s + 5.0)
    alive = [t.name for t in threads if t.is_alive()]
    if (failed or late) and alive and abandon is not None:
        abandon()       # leak their transports rather than pull a socket from under a thread
    if failed:
        name, e = failed[0]
        raise LoadgenError(f"client thread {name} failed: {type(e).__name__}: {e}"
                           + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else "")
                           + (f"; still running: {', '.join(alive)}" if alive else "")) from e
    if late:
        # stopped, not abandoned where it could be. A LoadgenError: the CLI says it in one
        # line (a rate far beyond what the threads can send left them behind their schedule,
        # a traceback before)
        raise LoadgenError(f"client thread(s) did not finish within {limit:.0f} s, 10 s "
                           "past the run (far behind their schedule: lower --rate or add "
                           "--threads)"
                           + (f"; still running: {', '.join(alive)}" if alive else ""))
    return interrupted
