# cython: language_level=3
"""The agent's guards; see ``actor_guards.pyx``."""
from malcolm.policy.agent_state cimport AgentState


cdef void reset_actors(AgentState a) noexcept nogil
cdef void check_runaway(AgentState a) noexcept nogil
cdef void guard_actors(AgentState a) noexcept nogil
