"""The shm rings of endpoints whose process died: found and unlinked when an endpoint is made.

Each shm endpoint owns a ring, ``/dev/shm/malcolm-NAME``, which it unlinks when it closes. A
process that is killed (SIGKILL, the OOM killer, ``srun`` ending a job) cannot: its ring
stays, 17 MB for a load generator's client, until the tmpfs is full and every new endpoint
fails. A client's name holds its pid, so nothing ever replaces it.

Every endpoint that is made first unlinks the rings whose owner is gone (:func:`reap`), and
both happen under one lock (:func:`lock`, an ``flock`` on a file of ``/dev/shm`` whose name no
endpoint's ring can have):
otherwise a process could find a dead server's ring, and unlink it just after that server,
restarted under the same name, made its new one. Pure Python: it runs once per endpoint,
never on a message's path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct

__all__ = ["LOCK_NAME", "lock", "reap"]

SHM_DIR = "/dev/shm"
# longer than "malcolm-" and an endpoint's 16 characters: no ring is ever named so. One per
# user: another user's lock file (mode 0600) could not be opened, and /dev/shm's sticky bit
# already keeps each user's rings from the others' unlinking.
LOCK_NAME = f"malcolm-.lock-of-the-shm-rings-{os.getuid()}"
PREFIX = "malcolm-"
# mc_ring_hdr (net/_netc.h): u64 magic, u32 capacity, u32 cell_bytes, u32 alive, i32 owner_pid,
# u64 owner_ns
_HEADER = struct.Struct("=QIIIiQ")
_MAGIC = 0x4d4352494e4731       # "MCRING1", MC_RING_MAGIC


@contextlib.contextmanager
def lock(directory: str = SHM_DIR):
    """Hold the lock under which endpoints are made and dead rings unlinked."""
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)            # releases the lock


def pid_namespace() -> int:
    """This process's pid namespace, as a ring's ``owner_ns`` records it (``mc_pid_ns``):
    the inode of ``/proc/self/ns/pid``, 0 where ``/proc`` does not say."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _owner_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:     # another user's live process
        return False
    return False


def reap(directory: str = SHM_DIR) -> list[str]:
    """Unlink the rings in ``directory`` whose owner stopped without unlinking them: a
    ring's header says its owner stopped (``alive`` 0) or names a process that no longer
    exists. A ring made in another pid namespace (a container that shares ``/dev/shm``) is
    unlinked only once stopped: its pid names nothing, or another process, here. Only this
    user's regular files that hold a ring's header are read; the caller holds :func:`lock`.
    Returns the names unlinked."""
    gone = []
    me, my_ns = os.getpid(), pid_namespace()
    try:
        names = os.listdir(directory)
    except OSError:
        return gone
    for name in names:
        if not name.startswith(PREFIX) or name == LOCK_NAME:
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                continue
            head = os.pread(fd, _HEADER.size, 0)
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(head) < _HEADER.size:
            continue
        magic, _, _, alive, pid, ns = _HEADER.unpack(head)
        other_ns = ns != 0 and my_ns != 0 and ns != my_ns
        if magic != _MAGIC or (pid == me and not other_ns) or pid <= 0:
            continue
        if alive and (other_ns or not _owner_gone(pid)):
            continue
        try:
            os.unlink(path)
            gone.append(name)
        except OSError:
            pass
    return gone
