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
# u64 owner_ns, u32 owner_flags
_HEADER = struct.Struct("=QIIIiQI")
_MAGIC = 0x4d4352494e4731       # "MCRING1", MC_RING_MAGIC
_LOCKED = 1                     # MC_RING_LOCKED: the owner holds the file's flock while it runs
_ALIVE_AT = 16                  # the offset of alive


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


def _lock_held(fd: int) -> bool:
    """Does a running owner hold the ring file's exclusive lock? (A shared lock taken
    without waiting fails only then; closing ``fd`` drops it.)"""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def reap(directory: str = SHM_DIR) -> list[str]:
    """Unlink the rings in ``directory`` whose owner stopped without unlinking them.

    A ring's owner runs while it holds the ring file's lock (rings whose header says they
    have one, ``MC_RING_LOCKED``): the kernel drops it however the owner ends, so this holds
    whatever its pid has come to name since (reused, or a pid of another pid namespace,
    where containers share ``/dev/shm``). Of a ring without one the header must say its
    owner stopped (``alive`` 0) or name a process that no longer exists, and one made in
    another pid namespace is unlinked only once stopped. Only this user's regular files
    that hold a ring's header are read; the caller holds :func:`lock`. Returns the names
    unlinked."""
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
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                continue
            head = os.pread(fd, _HEADER.size, 0)
            if len(head) < _HEADER.size:
                continue
            magic, _, _, alive, pid, ns, flags = _HEADER.unpack(head)
            other_ns = ns != 0 and my_ns != 0 and ns != my_ns
            if magic != _MAGIC or (pid == me and not other_ns) or pid <= 0:
                continue
            if alive and (_lock_held(fd) if flags & _LOCKED
                          else other_ns or not _owner_gone(pid)):
                continue
            if alive:
                # stopped, for the peers that still map it (mc_shm_mark_stopped): they let
                # go of it at their next send and look the name up afresh
                os.pwrite(fd, bytes(4), _ALIVE_AT)
        except OSError:
            continue
        finally:
            os.close(fd)
        try:
            os.unlink(path)
            gone.append(name)
        except OSError:
            pass
    return gone
