# cython: language_level=3
"""Native request builder and response checker for the load generator's ``--app rocksdb*``.

A :class:`KvApp` belongs to one client thread. Everything about a request (its GET size, its
keys, whether it is one of the deliberately malformed ones) is a hash of the client's stream
and the request id, so the response can be checked against the dictionary's deterministic
values (``malcolm/workers/rocksdb_kv.h``) without keeping any per-request state: the checker
recomputes the keys from the request id the response echoes.
"""
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memset

import numpy as np

from malcolm._core cimport mc_aligned_alloc
from malcolm._hist cimport N_BUCKETS, Hist, hist_add
from malcolm.net._wire cimport ST_BAD_INPUT, ST_OK


cdef extern from "workers/rocksdb_kv.h" nogil:
    enum:
        MC_KV_MAX_KEYS
        MC_KV_MAX_VALUE
    uint64_t mc_kv_mix(uint64_t x)
    int mc_kv_check(uint32_t k, const uint8_t* p, uint32_t n)
    void mc_kv_st32(uint8_t* p, uint32_t v)


cdef enum:
    H_TYPE = 0
    H_BAD = 1000
    H_BAD_KIND = 1001
    H_KEY = 1                   # keys i = 0..n-1 use H_KEY + i


cdef inline uint64_t _h(uint64_t stream, uint64_t rid, uint64_t j) noexcept nogil:
    return mc_kv_mix(mc_kv_mix(stream ^ rid) + j)


cdef inline double _u01(uint64_t x) noexcept nogil:
    return <double>(x >> 11) * (1.0 / 9007199254740992.0)


cdef class KvApp:
    """GET(n) requests for one client thread.

    Parameters
    ----------
    sizes, weights : sequences
        Keys per GET of each task type, and each type's weight.
    n_keys, value_size : int
        The dictionary's shape (as ``malcolm rocksdb load`` built it).
    stream : int
        Distinguishes this client's requests (use the client id).
    zipf_cdf, zipf_guide : numpy arrays or None
        The Zipf CDF over key ranks (float64, ``n_keys`` long) and its guide table (uint32,
        ``n_keys`` long), shared read-only by all threads; ``None`` for uniform keys.
    bad_fraction : float
        Share of requests made malformed on purpose (each must be answered ``bad input``).
    """
    def __init__(self, sizes, weights, uint32_t n_keys, uint32_t value_size,
                 unsigned long long stream, zipf_cdf=None, zipf_guide=None,
                 double bad_fraction=0.0):
        cdef int i
        cdef double[::1] zc
        cdef const uint32_t[::1] zg
        if not 1 <= len(sizes) <= APP_MAX_TYPES or len(sizes) != len(weights):
            raise ValueError(f"1..{APP_MAX_TYPES} request types, one weight each")
        if not 1 <= value_size <= MC_KV_MAX_VALUE or n_keys < 1:
            raise ValueError("bad dictionary shape")
        self.max_keys = min(MC_KV_MAX_KEYS, MC_KV_MAX_VALUE // value_size)
        tot = float(sum(weights))
        if not tot > 0 or any(not w > 0 for w in weights):
            raise ValueError("weights must be positive")
        self.n_types = len(sizes)
        acc = 0.0
        for i in range(self.n_types):
            if not 1 <= sizes[i] <= self.max_keys:
                raise ValueError(f"GET({sizes[i]}): n must be in 1..{self.max_keys} with "
                                 f"{value_size}-byte values (the answer must fit in "
                                 f"{MC_KV_MAX_VALUE} bytes)")
            self.n_per[i] = sizes[i]
            acc += weights[i] / tot
            self.cdf[i] = acc
        self.cdf[self.n_types - 1] = 2.0
        self.n_keys = n_keys
        self.value_size = value_size
        self.stream = mc_kv_mix(stream + 0x6D616C63)
        if not 0.0 <= bad_fraction <= 1.0:
            raise ValueError("bad_fraction must be in 0..1")
        self.bad_fraction = bad_fraction
        self.perm_mul = 1
        if zipf_cdf is not None:
            if len(zipf_cdf) != n_keys or len(zipf_guide) != n_keys:
                raise ValueError("the Zipf tables must have n_keys entries")
            zc = zipf_cdf
            zg = zipf_guide
            self._zref = (zipf_cdf, zipf_guide)
            self.zcdf = &zc[0]
            self.zguide = &zg[0]
            # Scatter the ranks over the key space (hot keys are not neighbours in the
            # store): multiplication by a prime that does not divide n_keys is a bijection.
            self.perm_mul = 2654435761 % n_keys if n_keys % 2654435761 else 1
            if self.perm_mul == 0 or _gcd(self.perm_mul, n_keys) != 1:
                self.perm_mul = 1
        for i in range(self.n_types):
            self.lat[i] = <Hist*>mc_aligned_alloc(64, sizeof(Hist))
            if self.lat[i] == NULL:
                raise MemoryError()
            memset(self.lat[i], 0, sizeof(Hist))

    def __dealloc__(self):
        cdef int i
        for i in range(self.n_types):
            free(self.lat[i])

    cdef int _type(self, uint64_t rid) noexcept nogil:
        cdef double u = _u01(_h(self.stream, rid, H_TYPE))
        cdef int t = 0
        while self.cdf[t] <= u:
            t += 1
        return t

    cdef uint32_t _key(self, uint64_t rid, uint32_t i) noexcept nogil:
        cdef uint64_t x = _h(self.stream, rid, H_KEY + i)
        cdef double u
        cdef uint64_t r
        if self.zcdf == NULL:
            return <uint32_t>(((x >> 32) * <uint64_t>self.n_keys) >> 32)
        u = _u01(x)
        r = self.zguide[<uint64_t>(u * self.n_keys)]
        while r + 1 < self.n_keys and self.zcdf[r] <= u:
            r += 1
        return <uint32_t>((r * self.perm_mul) % self.n_keys)

    cdef bint _is_bad(self, uint64_t rid) noexcept nogil:
        return self.bad_fraction > 0 and _u01(_h(self.stream, rid, H_BAD)) < self.bad_fraction

    cdef uint16_t fill(self, uint64_t rid, int* task_type) noexcept nogil:
        """Write request ``rid``'s payload into ``self.pbuf``; return its length."""
        cdef int t = self._type(rid)
        cdef uint32_t n = self.n_per[t], i, kind
        cdef uint32_t length = 4 + 4 * n
        task_type[0] = t
        self.sent[t] += 1
        mc_kv_st32(self.pbuf, n)
        for i in range(n):
            mc_kv_st32(self.pbuf + 4 + 4 * i, self._key(rid, i))
        if self._is_bad(rid):
            self.bad_sent += 1
            kind = <uint32_t>(_h(self.stream, rid, H_BAD_KIND) % 4)
            if kind == 0:
                mc_kv_st32(self.pbuf, 0)                        # GET(0)
            elif kind == 1:
                mc_kv_st32(self.pbuf, self.max_keys + 1)        # more than an answer holds
                for i in range(n, self.max_keys + 1):
                    mc_kv_st32(self.pbuf + 4 + 4 * i, 0)
                length = 4 + 4 * (self.max_keys + 1)
            elif kind == 2:
                mc_kv_st32(self.pbuf + 4 + 4 * (n - 1), self.n_keys)   # key out of range
            else:
                length -= 2                                     # truncated
        return <uint16_t>length

    cdef void on_response(self, uint64_t rid, uint8_t status, uint16_t task_type,
                          const uint8_t* payload, uint32_t length, int64_t latency,
                          bint measured) noexcept nogil:
        """Check one response to request ``rid`` (called once per answered request)."""
        cdef int t = self._type(rid)
        cdef uint32_t n, i, vs = self.value_size
        if self._is_bad(rid):
            if status == ST_BAD_INPUT:
                self.bad_rejected += 1
            elif status == ST_OK:
                self.bad_accepted += 1
            return
        if status != ST_OK:
            self.not_ok[t] += 1
            return
        n = self.n_per[t]
        if task_type != t or length != n * vs:
            self.wrong[t] += 1
            return
        for i in range(n):
            if not mc_kv_check(self._key(rid, i), payload + i * vs, vs):
                self.wrong[t] += 1
                return
        self.ok[t] += 1
        if measured:
            hist_add(self.lat[t], latency)

    # ------------------------------------------------------------ Python side
    def keys(self, unsigned long long rid):
        """The keys request ``rid`` asks for (tests and tools)."""
        cdef int t = self._type(rid)
        return [self._key(rid, i) for i in range(self.n_per[t])]

    def payload(self, unsigned long long rid):
        """``(task_type, payload bytes)`` of request ``rid`` (tests and tools)."""
        cdef int t
        cdef uint16_t n = self.fill(rid, &t)
        return t, bytes(self.pbuf[:n])

    def check(self, unsigned long long rid, int status, int task_type, bytes payload):
        """Feed one response through :meth:`on_response` (tests and tools)."""
        self.on_response(rid, <uint8_t>status, <uint16_t>task_type,
                         <const uint8_t*><const char*>payload, len(payload), 0, False)

    def results(self):
        """Per-type counters and latency histograms (the format of ``malcolm.loadgen.hist``)."""
        cdef int i
        per = []
        for i in range(self.n_types):
            h = self.lat[i]
            per.append({"n_keys": int(self.n_per[i]), "sent": int(self.sent[i]),
                        "ok": int(self.ok[i]), "wrong": int(self.wrong[i]),
                        "not_ok": int(self.not_ok[i]),
                        "lat": {"n": h.n, "min": h.min, "max": h.max, "sum": h.sum,
                                "counts": np.array(<uint64_t[:N_BUCKETS]>h.counts,
                                                   dtype=np.uint64)}})
        return {"types": per, "bad_sent": int(self.bad_sent),
                "bad_rejected": int(self.bad_rejected),
                "bad_accepted": int(self.bad_accepted)}


cdef uint64_t _gcd(uint64_t a, uint64_t b) noexcept nogil:
    while b:
        a, b = b, a % b
    return a
