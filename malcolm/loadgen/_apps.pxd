# cython: language_level=3
"""Real application requests for the load generator (see ``malcolm/loadgen/apps.py``)."""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from malcolm._hist cimport Hist

cdef enum:
    APP_MAX_TYPES = 16
    APP_MAX_PAYLOAD = 1024


cdef class KvApp:
    cdef int n_types
    cdef uint32_t n_per[APP_MAX_TYPES]       # keys per GET, by task type
    cdef double cdf[APP_MAX_TYPES]
    cdef uint32_t n_keys, value_size, max_keys
    cdef uint64_t stream                     # keys are a function of (stream, request id)
    cdef double bad_fraction                 # share of deliberately malformed requests
    cdef const double* zcdf                  # Zipf CDF over ranks (NULL: uniform keys)
    cdef const uint32_t* zguide              # its guide table: first rank at u >= j / n_keys
    cdef object _zref
    cdef uint64_t perm_mul                   # rank -> key scatter (coprime with n_keys)
    cdef Hist* lat[APP_MAX_TYPES]
    cdef uint64_t sent[APP_MAX_TYPES]
    cdef uint64_t ok[APP_MAX_TYPES]          # answered ok with every value right
    cdef uint64_t wrong[APP_MAX_TYPES]       # answered ok with a wrong value or length
    cdef uint64_t not_ok[APP_MAX_TYPES]      # a well-formed GET answered with another status
    cdef uint64_t bad_sent, bad_rejected, bad_accepted
    cdef uint8_t pbuf[APP_MAX_PAYLOAD]

    cdef int _type(self, uint64_t rid) noexcept nogil
    cdef uint32_t _key(self, uint64_t rid, uint32_t i) noexcept nogil
    cdef bint _is_bad(self, uint64_t rid) noexcept nogil
    cdef uint16_t fill(self, uint64_t rid, int* task_type) noexcept nogil
    cdef void on_response(self, uint64_t rid, uint8_t status, uint16_t task_type,
                          const uint8_t* payload, uint32_t length, int64_t latency,
                          bint measured) noexcept nogil
