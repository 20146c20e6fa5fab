"""Free UDP ports for local racks, tests and tools (one helper, used everywhere)."""

from __future__ import annotations

import socket


def free_udp_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct UDP ports of ``host`` that were free a moment ago.

    All ``n`` sockets are bound (to port 0) before any is closed, so the ports differ; they
    are released on return, so another process may take one before the caller binds it.
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                              socket.SOCK_DGRAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
