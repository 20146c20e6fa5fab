# cython: language_level=3
"""The client allow-list of a gateway: CIDR networks tasks may come from (udp, verbs)."""
from libc.stdint cimport uint8_t, uint16_t

from malcolm.net._wire cimport NetAddr


cdef enum:
    MAX_CLIENT_NETS = 16


ctypedef struct ClientNet:
    uint16_t family
    uint16_t prefix
    uint8_t addr[16]


ctypedef struct ClientNets:
    int n                        # -1: any client
    ClientNet nets[MAX_CLIENT_NETS]


cdef int clients_set(ClientNets* c, object clients, str kind) except -1


cdef inline bint _prefix_match(const uint8_t* a, const uint8_t* net, int bits) noexcept nogil:
    cdef int i, full = bits // 8, rem = bits % 8
    for i in range(full):
        if a[i] != net[i]:
            return False
    if rem:
        return (a[full] >> (8 - rem)) == (net[full] >> (8 - rem))
    return True


cdef inline bint clients_allow(const ClientNets* c, const NetAddr* a) noexcept nogil:
    """True if a task from ``a`` may be served."""
    cdef int i
    if c.n < 0:
        return True
    for i in range(c.n):
        if a.family == c.nets[i].family and _prefix_match(a.addr, c.nets[i].addr,
                                                          c.nets[i].prefix):
            return True
    return False
