# cython: language_level=3
"""Parse a client allow-list (``[rack] clients``) into the gateway's table."""
import ipaddress
import socket

from libc.string cimport memcpy


cdef int clients_set(ClientNets* c, object clients, str kind) except -1:
    """Fill ``c`` from CIDR strings; ``None`` accepts any client. ValueError on bad input."""
    c.n = -1
    if clients is None:
        return 0
    if kind == "shm":
        raise ValueError("a client allow-list (clients) applies to network transports; "
                         "shm endpoints are all on this host")
    if len(clients) > MAX_CLIENT_NETS:
        raise ValueError(f"at most {MAX_CLIENT_NETS} client networks")
    c.n = 0
    for s in clients:
        net = ipaddress.ip_network(s, strict=False)
        raw = net.network_address.packed
        c.nets[c.n].family = socket.AF_INET if net.version == 4 else socket.AF_INET6
        c.nets[c.n].prefix = net.prefixlen
        memcpy(c.nets[c.n].addr, <const char*>raw, len(raw))
        c.n += 1
    return 0
