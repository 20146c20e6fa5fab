"""CPU pinning and priority of a server's threads.

The gateway gets ``cpus[0]``, the workers go round-robin over the others (or over ``cpus[0]``
if there is only one), and the policy thread, which mostly sleeps, shares ``cpus[1]`` (or
``cpus[0]``). Busy polling wants one core per gateway and worker thread.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("malcolm.server")


def check_cpus(cpus):
    """``cpus`` as a list, or None for no pinning; ValueError for CPUs this process lacks."""
    if not cpus:
        return None
    have = os.sched_getaffinity(0)
    bad = [c for c in cpus if c not in have]
    if bad:
        raise ValueError(f"cpus {bad} are not available to this process "
                         f"(allowed: {sorted(have)})")
    return list(cpus)


def cpu_for(cpus, role, w=0):
    """The CPU of thread ``role`` ("gateway", "policy" or "worker" number ``w``)."""
    if role == "gateway":
        return cpus[0]
    if role == "policy":
        return cpus[1] if len(cpus) > 1 else cpus[0]
    rest = cpus[1:] if len(cpus) > 1 else cpus
    return rest[w % len(rest)]


def pin(cpus, role, w=0):
    """Pin the calling thread (no-op without ``cpus``)."""
    if cpus:
        os.sched_setaffinity(0, {cpu_for(cpus, role, w)})     # 0: the calling thread


def warn_oversubscribed(me, busy, n_workers, cpus):
    """Warn when busy polling spins more threads than there are CPUs.

    A spinning thread without a core of its own is time-sliced by the kernel, which turns
    microsecond hand-offs into millisecond ones: say so rather than be slow.
    """
    if not busy:
        return
    cores = len(cpus) if cpus else len(os.sched_getaffinity(0))
    spinners = 1 + n_workers
    if spinners > cores:
        log.warning("server %d: poll=busy spins %d threads (gateway + %d workers) on %d "
                    "CPUs; they will be time-sliced and round trips will take "
                    "milliseconds. Use poll='adaptive' or give each spinner a core.",
                    me, spinners, n_workers, cores)


#: The nice value the experiment runner gives its racks' and load generator's threads.
NICE = -10


def raise_priority(pid):
    """Give every thread of process ``pid`` nice :data:`NICE`; False if not permitted.

    Why: on a machine shared with other jobs the kernel otherwise slices the rack's and the
    load generator's threads evenly against them, which shows up as late sends and slow
    handlers, i.e. as runs that measure the machine rather than the policy.
    """
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), NICE)
        return True
    except (OSError, ValueError):
        return False
