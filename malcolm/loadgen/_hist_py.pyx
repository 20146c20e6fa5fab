# cython: language_level=3
"""Native histograms (``malcolm/_hist.pxd``) to Python: the dict of counters and bucket counts
that the load generator's results carry, and a histogram filled from values for the tests and
tools. Kept apart from the client so that the tools can read histograms without it."""
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memset

import numpy as np

from malcolm._core cimport mc_aligned_alloc
from malcolm._hist cimport N_BUCKETS, Hist, hist_add


def n_buckets():
    """The number of buckets of a native histogram."""
    return N_BUCKETS


cdef object hist_py(Hist* h):
    """``{"n", "min", "max", "sum", "counts"}`` of one native histogram (counts copied)."""
    counts = np.array(<uint64_t[:N_BUCKETS]>h.counts, dtype=np.uint64)
    return {"n": h.n, "min": h.min, "max": h.max, "sum": h.sum, "counts": counts}


def hist_from_values(values):
    """Fill a native histogram from integer ns values (tests and tools)."""
    cdef Hist* h = <Hist*>mc_aligned_alloc(64, sizeof(Hist))
    if h == NULL:
        raise MemoryError()
    memset(h, 0, sizeof(Hist))
    try:
        for v in values:
            hist_add(h, <int64_t>v)
        return hist_py(h)
    finally:
        free(h)
