"""Run metadata: where, when and with what a result was measured.

Every JSON that ``malcolm loadgen``, ``sim``, ``bench`` and ``demo`` write carries one
``"metadata"`` object from :func:`run_metadata`, so a figure found later in a file can be
traced to its machine, its code and its exact command. Nothing here may fail a run: a field
that cannot be read is ``None``.
"""

from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
import sys

import malcolm

_FORMAT = 1     # bump when a field changes meaning


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def git_commit(path: str | None = None) -> str | None:
    """The commit of the source checkout ``malcolm`` was imported from (``+dirty`` when it
    has uncommitted changes), or ``None`` for an installed package or no ``git``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(path or malcolm.__file__)))
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_metadata(config: dict | None = None, argv: list | None = None) -> dict:
    """The metadata object of one run.

    Parameters
    ----------
    config : dict, optional
        The run's full configuration (for a CLI command: every parameter, defaults included).
    argv : list of str, optional
        The command line; default :data:`sys.argv`.

    Returns
    -------
    dict
        ``format``, ``utc`` (ISO 8601), ``host``, ``platform``, ``cpu_model``, ``cpus``
        (logical CPUs), ``cpus_usable`` (this process's affinity), ``python``,
        ``malcolm_version``, ``git_commit``, ``argv`` and ``config``.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "format": _FORMAT,
        "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": usable,
        "python": platform.python_version(),
        "malcolm_version": malcolm.__version__,
        "git_commit": git_commit(),
        "argv": list(sys.argv if argv is None else argv),
        "config": _plain(config or {}),
    }


def _plain(v):
    """JSON-safe copy: tuples become lists, anything exotic its ``str``."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)
