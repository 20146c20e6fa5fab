# cython: language_level=3
"""Baseline load-balancing policies (cimport API). See ``baselines.pyx`` for behaviour."""
from libc.stdint cimport int64_t, uint32_t

from malcolm.policy.base cimport ClientPolicy, Heartbeat, MAX_SERVERS, Policy


cdef class RandomPolicy(Policy):
    pass


cdef class HeartbeatView(Policy):
    """What a server knows from heartbeats: the last reported queue length, rate and load."""
    cdef double q[MAX_SERVERS]          # tasks (waiting + in service), own count included
    cdef double rate[MAX_SERVERS]       # tasks per ns
    cdef double load[MAX_SERVERS]       # ns
    cdef uint32_t last_seq[MAX_SERVERS]
    cdef bint heard[MAX_SERVERS]
    cdef public bint count_own          # count tasks this gateway sent since the last report

    cdef inline void _sent(self, int j) noexcept nogil
    cdef void _peer_updated(self, int j) noexcept nogil


cdef class JSQPolicy(HeartbeatView):
    pass


cdef class JBTPolicy(HeartbeatView):
    cdef public double threshold


cdef class JIQPolicy(HeartbeatView):
    cdef public double slots
    cdef double credit[MAX_SERVERS]


cdef class SEDPolicy(HeartbeatView):
    pass


cdef class StealPolicy(HeartbeatView):
    cdef public double min_victim
    cdef public double max_own


cdef class PowerOfDClient(ClientPolicy):
    cdef public int d
    cdef double q[MAX_SERVERS]
