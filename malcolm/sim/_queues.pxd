# cython: language_level=3
"""The simulator's two plain data structures, inline so that they compile into the engine's
event loop (a cross-module ``cdef`` call would be an indirect call per event):

* ``EventQueue``: a 4-ary min-heap of 32-byte events ordered by (time, sequence number), so
  that ties resolve in scheduling order and a run is a pure function of its configuration
  and seed;
* ``Ring``: a growable FIFO of task slots (a server's waiting tasks, oldest first).
"""
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport free, malloc, realloc


ctypedef struct Event:
    int64_t t
    uint64_t order          # (sequence << 8) | kind: one compare breaks ties by sequence
    int32_t a               # the meaning of a, b and x depends on the kind (_engine.pxd)
    int32_t b
    double x


ctypedef struct EventQueue:
    Event* buf
    int64_t count
    int64_t cap
    uint64_t seq            # events scheduled so far: the next one's sequence number


cdef inline int evq_init(EventQueue* q, int64_t cap) noexcept nogil:
    q.buf = <Event*>malloc(sizeof(Event) * cap)
    q.count = 0
    q.cap = cap
    q.seq = 0
    return 0 if q.buf != NULL else -1


cdef inline int event_kind(const Event* e) noexcept nogil:
    return <int>(e.order & 0xFF)


cdef inline bint event_before(const Event* x, const Event* y) noexcept nogil:
    return x.t < y.t or (x.t == y.t and x.order < y.order)


cdef inline int evq_push(EventQueue* q, int64_t t, int kind, int32_t a, int32_t b,
                         double x) noexcept nogil:
    """Schedule an event; -1 when out of memory (the event is lost: the caller stops)."""
    cdef Event e
    cdef Event* h
    cdef int64_t i, p
    if q.count == q.cap:
        h = <Event*>realloc(q.buf, sizeof(Event) * q.cap * 2)
        if h == NULL:
            return -1
        q.buf = h
        q.cap *= 2
    e.t = t
    e.order = (q.seq << 8) | <uint64_t>kind
    q.seq += 1
    e.a = a
    e.b = b
    e.x = x
    h = q.buf
    i = q.count
    q.count += 1
    while i > 0:
        p = (i - 1) >> 2
        if not event_before(&e, &h[p]):
            break
        h[i] = h[p]
        i = p
    h[i] = e
    return 0


cdef inline void evq_pop(EventQueue* q, Event* out) noexcept nogil:
    """Remove the earliest event into ``out``; the queue must not be empty."""
    cdef Event* h = q.buf
    cdef Event last
    cdef int64_t i = 0, c, m, end, n
    out[0] = h[0]
    q.count -= 1
    n = q.count
    if n == 0:
        return
    last = h[n]
    while True:
        c = 4 * i + 1
        if c >= n:
            break
        m = c
        end = c + 4
        if end > n:
            end = n
        c += 1
        while c < end:
            if event_before(&h[c], &h[m]):
                m = c
            c += 1
        if not event_before(&h[m], &last):
            break
        h[i] = h[m]
        i = m
    h[i] = last


ctypedef struct Ring:
    int32_t* buf
    int64_t head
    int64_t count
    int64_t cap             # a power of two


cdef inline int ring_init(Ring* r, int64_t cap) noexcept nogil:
    r.buf = <int32_t*>malloc(sizeof(int32_t) * cap)
    r.head = 0
    r.count = 0
    r.cap = cap
    return 0 if r.buf != NULL else -1


cdef inline int ring_push(Ring* r, int32_t v) noexcept nogil:
    cdef int32_t* nb
    cdef int64_t i, n
    if r.count == r.cap:
        n = r.cap * 2
        nb = <int32_t*>malloc(sizeof(int32_t) * n)
        if nb == NULL:
            return -1
        for i in range(r.count):
            nb[i] = r.buf[(r.head + i) & (r.cap - 1)]
        free(r.buf)
        r.buf = nb
        r.head = 0
        r.cap = n
    r.buf[(r.head + r.count) & (r.cap - 1)] = v
    r.count += 1
    return 0


cdef inline int32_t ring_pop(Ring* r) noexcept nogil:
    cdef int32_t v
    if r.count == 0:
        return -1
    v = r.buf[r.head]
    r.head = (r.head + 1) & (r.cap - 1)
    r.count -= 1
    return v
