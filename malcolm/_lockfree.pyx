# cython: language_level=3
"""Bounded lock-free queues of 64-bit items: the ``cdef`` functions of ``_lockfree.pxd`` and
their Python wrappers :class:`MPMCQueue` and :class:`SPSCQueue`."""
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memset

from malcolm._native cimport (
    CACHELINE, mc_aligned_alloc, mc_assert, mc_cas, mc_fence_seq, mc_load_acq,
    mc_load_relaxed, mc_store_rel,
)


cdef inline MpmcCell* _mpmc_cells(Mpmc* q) noexcept nogil:
    return <MpmcCell*>(<char*>q + sizeof(Mpmc))


cdef size_t mpmc_bytes(uint64_t capacity) noexcept nogil:
    return sizeof(Mpmc) + sizeof(MpmcCell) * capacity


cdef int mpmc_init(Mpmc* q, uint64_t capacity) noexcept nogil:
    """Initialise a queue in ``mpmc_bytes(capacity)`` bytes at ``q``. Capacity: power of 2 >= 2."""
    cdef uint64_t i
    cdef MpmcCell* cells = _mpmc_cells(q)
    if capacity < 2 or (capacity & (capacity - 1)) != 0:
        return -1
    memset(q, 0, sizeof(Mpmc))
    q.mask = capacity - 1
    q.capacity = capacity
    for i in range(capacity):
        cells[i].seq = i
        cells[i].value = 0
    mc_fence_seq()
    return 0


cdef bint mpmc_push(Mpmc* q, uint64_t v) noexcept nogil:
    """Vyukov's bounded MPMC enqueue. Returns False when full; never blocks."""
    cdef MpmcCell* cells = _mpmc_cells(q)
    cdef MpmcCell* cell
    cdef uint64_t pos = mc_load_relaxed(&q.enq)
    mc_assert(q.capacity >= 2 and q.mask == q.capacity - 1)
    cdef uint64_t seq
    cdef int64_t dif
    while True:
        cell = &cells[pos & q.mask]
        seq = mc_load_acq(&cell.seq)
        dif = <int64_t>(seq - pos)
        if dif == 0:
            if mc_cas(&q.enq, &pos, pos + 1):
                break
        elif dif < 0:
            return False
        else:
            pos = mc_load_relaxed(&q.enq)
    cell.value = v
    mc_store_rel(&cell.seq, pos + 1)
    return True


cdef bint mpmc_pop(Mpmc* q, uint64_t* out) noexcept nogil:
    """Dequeue the oldest item. Returns False when empty (or when the producer that claimed
    the next cell has not finished writing it yet); never blocks."""
    cdef MpmcCell* cells = _mpmc_cells(q)
    cdef MpmcCell* cell
    cdef uint64_t pos = mc_load_relaxed(&q.deq)
    cdef uint64_t seq
    cdef int64_t dif
    while True:
        cell = &cells[pos & q.mask]
        seq = mc_load_acq(&cell.seq)
        dif = <int64_t>(seq - (pos + 1))
        if dif == 0:
            if mc_cas(&q.deq, &pos, pos + 1):
                break
        elif dif < 0:
            return False
        else:
            pos = mc_load_relaxed(&q.deq)
    out[0] = cell.value
    mc_store_rel(&cell.seq, pos + q.mask + 1)
    return True


cdef uint64_t mpmc_size(Mpmc* q) noexcept nogil:
    """Approximate number of items (exact when the queue is quiescent)."""
    cdef uint64_t d = mc_load_acq(&q.deq)
    cdef uint64_t e = mc_load_acq(&q.enq)
    return e - d if e > d else 0


cdef inline uint64_t* _spsc_slots(Spsc* q) noexcept nogil:
    return <uint64_t*>(<char*>q + sizeof(Spsc))


cdef size_t spsc_bytes(uint64_t capacity) noexcept nogil:
    return sizeof(Spsc) + sizeof(uint64_t) * capacity


cdef int spsc_init(Spsc* q, uint64_t capacity) noexcept nogil:
    if capacity < 2 or (capacity & (capacity - 1)) != 0:
        return -1
    memset(q, 0, sizeof(Spsc))
    q.mask = capacity - 1
    q.capacity = capacity
    mc_fence_seq()
    return 0


cdef bint spsc_push(Spsc* q, uint64_t v) noexcept nogil:
    cdef uint64_t tail = q.tail
    if tail - q.head_cache >= q.capacity:
        # Re-read the consumer's cursor only when the cached copy says full: one shared
        # cache-line read per lap instead of one per push.
        q.head_cache = mc_load_acq(&q.head)
        if tail - q.head_cache >= q.capacity:
            return False
    _spsc_slots(q)[tail & q.mask] = v
    mc_store_rel(&q.tail, tail + 1)
    return True


cdef bint spsc_pop(Spsc* q, uint64_t* out) noexcept nogil:
    cdef uint64_t head = q.head
    if head >= q.tail_cache:
        q.tail_cache = mc_load_acq(&q.tail)
        if head >= q.tail_cache:
            return False
    out[0] = _spsc_slots(q)[head & q.mask]
    mc_store_rel(&q.head, head + 1)
    return True


cdef uint64_t spsc_size(Spsc* q) noexcept nogil:
    cdef uint64_t h = mc_load_acq(&q.head)
    cdef uint64_t t = mc_load_acq(&q.tail)
    return t - h if t > h else 0


cdef object _check_capacity(uint64_t capacity):
    if capacity < 2 or (capacity & (capacity - 1)) != 0:
        raise ValueError(f"capacity={capacity} must be a power of two >= 2")


cdef class MPMCQueue:
    """Bounded lock-free multi-producer multi-consumer FIFO of 64-bit items.

    ``push`` returns False when full and ``pop`` returns None when empty; neither blocks.
    """
    cdef Mpmc* q

    def __cinit__(self, uint64_t capacity):
        _check_capacity(capacity)
        self.q = <Mpmc*>mc_aligned_alloc(CACHELINE, mpmc_bytes(capacity))
        if self.q == NULL:
            raise MemoryError("cannot allocate the queue")
        mpmc_init(self.q, capacity)

    def __dealloc__(self):
        free(self.q)

    @property
    def capacity(self):
        return self.q.capacity

    def push(self, uint64_t v):
        return mpmc_push(self.q, v)

    def pop(self):
        cdef uint64_t v
        return v if mpmc_pop(self.q, &v) else None

    def __len__(self):
        return mpmc_size(self.q)

    cdef Mpmc* ptr(self):
        return self.q


cdef class SPSCQueue:
    """Bounded lock-free single-producer single-consumer FIFO of 64-bit items."""
    cdef Spsc* q

    def __cinit__(self, uint64_t capacity):
        _check_capacity(capacity)
        self.q = <Spsc*>mc_aligned_alloc(CACHELINE, spsc_bytes(capacity))
        if self.q == NULL:
            raise MemoryError("cannot allocate the queue")
        spsc_init(self.q, capacity)

    def __dealloc__(self):
        free(self.q)

    @property
    def capacity(self):
        return self.q.capacity

    def push(self, uint64_t v):
        return spsc_push(self.q, v)

    def pop(self):
        cdef uint64_t v
        return v if spsc_pop(self.q, &v) else None

    def __len__(self):
        return spsc_size(self.q)
