# cython: language_level=3
"""A compact log-linear latency histogram in C memory (HDR-style), shared by the load
generator's client threads and the servers' workers (measured service times). It lives in
the core layer so that the server runtime and the tools can both use it.

Values are integer nanoseconds. Below 2**SUB_BITS every nanosecond has its own bucket; above,
each power-of-two octave is cut into 2**(SUB_BITS-1) equal buckets, so a bucket is never wider
than 2**(1-SUB_BITS) = 1/128 of its values (0.8%; the midpoint is within 0.4%). Values up to
2**44 ns (about 4.9 hours) are kept; larger ones land in the last bucket (``max`` stays exact).
"""
from libc.stdint cimport int64_t, uint64_t


cdef extern from *:
    int __builtin_clzll(unsigned long long x) nogil

cdef enum:
    SUB_BITS = 8
    SUB_COUNT = 256                 # 2**SUB_BITS
    HALF_COUNT = 128                # 2**(SUB_BITS-1)
    TOP_BIT = 43                    # highest bit position kept
    N_BUCKETS = 256 + (43 - 8 + 1) * 128


ctypedef struct Hist:
    uint64_t n
    int64_t min
    int64_t max
    double sum
    uint64_t counts[N_BUCKETS]


cdef inline int hist_index(int64_t v) noexcept nogil:
    cdef int h
    cdef uint64_t u
    if v < SUB_COUNT:
        return <int>v if v > 0 else 0
    u = <uint64_t>v
    h = 63 - __builtin_clzll(u)
    if h > TOP_BIT:
        return N_BUCKETS - 1
    return SUB_COUNT + (h - SUB_BITS) * HALF_COUNT + <int>((u >> (h - SUB_BITS + 1)) - HALF_COUNT)


cdef inline void hist_add(Hist* h, int64_t v) noexcept nogil:
    if v < 0:
        v = 0
    h.counts[hist_index(v)] += 1
    if h.n == 0 or v < h.min:
        h.min = v
    if h.n == 0 or v > h.max:
        h.max = v
    h.n += 1
    h.sum += <double>v


cdef inline int64_t hist_lower(int i) noexcept nogil:
    """The smallest value of bucket ``i``."""
    cdef int k, h
    if i < SUB_COUNT:
        return i
    k = i - SUB_COUNT
    h = k // HALF_COUNT + SUB_BITS
    return <int64_t>(k % HALF_COUNT + HALF_COUNT) << (h - SUB_BITS + 1)


cdef inline int64_t hist_upper(int i) noexcept nogil:
    """One past the largest value of bucket ``i``."""
    cdef int k, h
    if i < SUB_COUNT:
        return i + 1
    k = i - SUB_COUNT
    h = k // HALF_COUNT + SUB_BITS
    return <int64_t>(k % HALF_COUNT + HALF_COUNT + 1) << (h - SUB_BITS + 1)
