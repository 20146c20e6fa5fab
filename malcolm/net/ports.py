"""Free UDP ports for local racks, tests and tools (one helper, used everywhere)."""

from __future__ import annotations

import collections
import socket
import threading

# Ports this process handed out lately. A port is released on return (the caller's server
# binds it later, in another process), so without this memory the kernel could hand the same
# port to the next caller here (the runner starts several racks at once) before the first
# server bound it. Bounded: the oldest are forgotten, by then long bound or abandoned.
_RECENT_MAX = 4096
_recent: collections.deque = collections.deque(maxlen=_RECENT_MAX)
_lock = threading.Lock()


def free_udp_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct UDP ports of ``host`` that were free a moment ago.

    All ``n`` sockets are bound (to port 0) before any is closed, so the ports differ, and
    none is one this process handed out lately. They are released on return, so another
    process may still take one before the caller binds it: a caller that starts servers on
    them must handle ``EADDRINUSE`` (the experiment runner picks fresh ports and retries).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks = []
    with _lock:
        try:
            got = []
            # a port handed out lately is kept bound (so the kernel does not offer it again)
            # and another is asked for; bounded, in case the kernel keeps offering them
            for _ in range(n + 256):
                if len(got) == n:
                    break
                s = socket.socket(family, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind((host, 0))
                port = s.getsockname()[1]
                if port not in _recent:
                    got.append(port)
            if len(got) < n:
                raise OSError(f"no {n} free UDP ports on {host} outside the recently used ones")
            _recent.extend(got)
            return got
        finally:
            for s in socks:
                s.close()
