# cython: language_level=3
"""Malcolm's learning policy: a decentralized linear actor-critic with consensus.

See ``actor_critic.pyx`` for the algorithm, ``agent_state.pxd`` for the agent's state,
``gateway_rules.pyx`` for the gateway's decisions and
``docs/policy.md`` for the design.
"""
from malcolm.policy.gateway_rules cimport GatewayRules


cdef class MalcolmPolicy(GatewayRules):
    cdef readonly double lr_boost    # the actors' step x up to this where gradients agree
    cdef readonly double weight_boost    # the same for the sparse load weights; < 1: lr_boost
    cdef void _learn_window(self) noexcept nogil
    cdef void _apply_adamw(self) noexcept nogil
    cdef void _consensus(self) noexcept nogil
    cdef void _publish(self) noexcept nogil
