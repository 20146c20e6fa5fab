# cython: language_level=3
"""The gateway's rules (hop gate, shed rule, idle-only steals); see ``gateway_rules.pyx``.

Their fields stay in ``AgentState`` (``agent_state.pxd``), next to the tables the gateway
reads on the same path.
"""
from libc.stdint cimport int64_t, uint64_t

from malcolm.policy.agent_state cimport AgentState


cdef class GatewayRules(AgentState):
    cdef int _decide_live(self, uint64_t g) noexcept nogil
    cdef void _gate_accept(self) noexcept nogil
    cdef double _speed_shift(self) noexcept nogil
    cdef void _shed_threshold(self, double r, int64_t off) noexcept nogil
    cdef void _steal_thresholds(self, double r, int64_t off, double hd) noexcept nogil
    cdef int _unshared_config(self, dict cfg) except -1
    cdef void _grant_bar(self, double h) noexcept nogil
