# cython: language_level=3
"""cimport API of ``param_layout.pyx``: the actors' parameters between their memory layout
and the dense one the Python API shows."""
from malcolm.policy.agent_state cimport AgentState


cdef object dense_of(AgentState s, const double* src)
cdef int from_dense(AgentState s, object dense, double* dst) except -1
