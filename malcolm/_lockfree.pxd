# cython: language_level=3
"""cimport API of the bounded lock-free queues. ``malcolm._core`` re-exports it.

``Mpmc``: any number of producers and consumers (Vyukov's scheme). ``Spsc``: one of each.
Queues are position-independent blocks (header then cells, no pointers), so they can live in
shared memory between processes.
"""
from libc.stdint cimport uint64_t


ctypedef struct MpmcCell:
    uint64_t seq
    uint64_t value


ctypedef struct Mpmc:
    uint64_t mask
    uint64_t capacity
    uint64_t _pad0[6]
    uint64_t enq                # producers' cursor, own cache line
    uint64_t _pad1[7]
    uint64_t deq                # consumers' cursor, own cache line
    uint64_t _pad2[7]
    # MpmcCell cells[capacity] follow the header


ctypedef struct Spsc:
    uint64_t mask
    uint64_t capacity
    uint64_t _pad0[6]
    uint64_t tail               # written by the producer
    uint64_t head_cache         # producer's stale copy of head
    uint64_t _pad1[6]
    uint64_t head               # written by the consumer
    uint64_t tail_cache         # consumer's stale copy of tail
    uint64_t _pad2[6]
    # uint64_t slots[capacity] follow the header


cdef size_t mpmc_bytes(uint64_t capacity) noexcept nogil
cdef int mpmc_init(Mpmc* q, uint64_t capacity) noexcept nogil
cdef bint mpmc_push(Mpmc* q, uint64_t v) noexcept nogil
cdef bint mpmc_pop(Mpmc* q, uint64_t* out) noexcept nogil
cdef uint64_t mpmc_size(Mpmc* q) noexcept nogil

cdef size_t spsc_bytes(uint64_t capacity) noexcept nogil
cdef int spsc_init(Spsc* q, uint64_t capacity) noexcept nogil
cdef bint spsc_push(Spsc* q, uint64_t v) noexcept nogil
cdef bint spsc_pop(Spsc* q, uint64_t* out) noexcept nogil
cdef uint64_t spsc_size(Spsc* q) noexcept nogil
