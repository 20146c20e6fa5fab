# cython: language_level=3
"""The ``rocksdb`` handler: GET(n) on a RocksDB dictionary, the thesis's real application (§7.1).

A worker thread serves each task without the GIL: it reads the n key indices of the request
(``malcolm/workers/rocksdb_kv.h`` has the format), looks them up with one
``rocksdb_multi_get`` and answers with the n values. A malformed request (n of 0 or over the
most that fit in a response, a payload that is not exactly 4 + 4 n bytes, a key index outside
the dictionary) is answered ``bad input``; a key missing from the database, or an error from
RocksDB, ``handler error``. Nothing a client sends can crash the worker.

The state (the ``ctx`` of the handler ABI) is one :class:`RocksDB` per server process: the
database handle (opened read-only: RocksDB's handle is thread-safe, so the workers share it,
and several server processes on one host can serve the same files), the read options and the
dictionary's shape. Per-request buffers live on the worker's stack.

Time dilation (``dilate=K``, set by the experiment runner from the rack's dilation): the
handler does the real GET(n), so the values are real and checked, then waits, with the
``bench`` handler's calibrated sleep and spin, until a target after the GET started. Two
targets (``pad=``):

``warm`` (the default)
    ``K`` x a draw from the *back-to-back* cost of GET(n): the sorted CPU times of GETs of
    each size, from ``warm=FILE`` (a ``malcolm rocksdb calibrate --json`` measurement, so
    that every server pads to one distribution; linear between its sizes, in proportion to
    n outside them) or else timed when the handler opens (``calib`` GETs of each size 1, 2,
    4, ..., 64 after as many untimed ones, at most 5 s). Per request: a uniform quantile,
    read on the request's size (linear between sizes, same quantile). Under dilation a GET
    follows an idle gap of about K times its length and runs cold (2-9x the back-to-back cost
    on a busy 2-core machine), so padding to K x its own cost made the service time, hence
    the effective load, depend on the load and the policy; this one does not. A GET whose
    wall time is already past its target is not padded and is counted (``overruns``).
``cpu``
    ``K`` x the CPU time the thread spent on this very GET (CLOCK_THREAD_CPUTIME_ID: not the
    time another process held the core), cold cost included.

Spec: ``rocksdb:path=PATH[,cache_mb=64][,dilate=K][,pad=warm|cpu][,calib=N][,warm=FILE]``
(``handler = ...`` in the rack file, per server). Build the dictionary with
``malcolm rocksdb load``.
"""
import os

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, qsort
from libc.string cimport memcpy, memset

import numpy as np

from malcolm.workers.rocksdb_spec import (  # noqa: F401 (RocksDBError, parse_spec: API)
    RocksDBError, check_load_target, parse_spec, read_meta,
)

from malcolm._core cimport mc_aligned_alloc, mc_now_ns
from malcolm._system cimport (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID, clock_gettime,
                              clock_nanosleep, timespec)

cdef extern from "<stdlib.h>" nogil:
    void* calloc(size_t n, size_t size)
from malcolm.workers.handlers cimport (BENCH_SLOTS, MALCOLM_BAD_INPUT, MALCOLM_ERROR,
                                       MALCOLM_OK, BenchState, bench_state_new, bench_wait,
                                       malcolm_task)


cdef extern from "rocksdb/c.h" nogil:
    ctypedef struct rocksdb_t:
        pass
    ctypedef struct rocksdb_options_t:
        pass
    ctypedef struct rocksdb_readoptions_t:
        pass
    ctypedef struct rocksdb_writeoptions_t:
        pass
    ctypedef struct rocksdb_writebatch_t:
        pass
    ctypedef struct rocksdb_block_based_table_options_t:
        pass
    ctypedef struct rocksdb_filterpolicy_t:
        pass
    ctypedef struct rocksdb_cache_t:
        pass
    enum:
        rocksdb_no_compression
    rocksdb_options_t* rocksdb_options_create()
    void rocksdb_options_destroy(rocksdb_options_t*)
    void rocksdb_options_set_create_if_missing(rocksdb_options_t*, unsigned char)
    void rocksdb_options_set_error_if_exists(rocksdb_options_t*, unsigned char)
    void rocksdb_options_set_compression(rocksdb_options_t*, int)
    void rocksdb_options_prepare_for_bulk_load(rocksdb_options_t*)
    void rocksdb_options_set_block_based_table_factory(
        rocksdb_options_t*, rocksdb_block_based_table_options_t*)
    rocksdb_block_based_table_options_t* rocksdb_block_based_options_create()
    void rocksdb_block_based_options_destroy(rocksdb_block_based_table_options_t*)
    void rocksdb_block_based_options_set_filter_policy(
        rocksdb_block_based_table_options_t*, rocksdb_filterpolicy_t*)
    void rocksdb_block_based_options_set_block_cache(
        rocksdb_block_based_table_options_t*, rocksdb_cache_t*)
    rocksdb_filterpolicy_t* rocksdb_filterpolicy_create_bloom_full(double bits_per_key)
    rocksdb_cache_t* rocksdb_cache_create_lru(size_t capacity)
    void rocksdb_cache_destroy(rocksdb_cache_t*)
    rocksdb_t* rocksdb_open(const rocksdb_options_t*, const char* name, char** errptr)
    rocksdb_t* rocksdb_open_for_read_only(const rocksdb_options_t*, const char* name,
                                          unsigned char error_if_wal_file_exists,
                                          char** errptr)
    void rocksdb_close(rocksdb_t*)
    rocksdb_readoptions_t* rocksdb_readoptions_create()
    void rocksdb_readoptions_destroy(rocksdb_readoptions_t*)
    rocksdb_writeoptions_t* rocksdb_writeoptions_create()
    void rocksdb_writeoptions_destroy(rocksdb_writeoptions_t*)
    void rocksdb_writeoptions_disable_WAL(rocksdb_writeoptions_t*, int disable)
    rocksdb_writebatch_t* rocksdb_writebatch_create()
    void rocksdb_writebatch_destroy(rocksdb_writebatch_t*)
    void rocksdb_writebatch_clear(rocksdb_writebatch_t*)
    void rocksdb_writebatch_put(rocksdb_writebatch_t*, const char* key, size_t klen,
                                const char* val, size_t vlen)
    void rocksdb_write(rocksdb_t*, const rocksdb_writeoptions_t*, rocksdb_writebatch_t*,
                       char** errptr)
    void rocksdb_put(rocksdb_t*, const rocksdb_writeoptions_t*, const char* key, size_t klen,
                     const char* val, size_t vlen, char** errptr)
    char* rocksdb_get(rocksdb_t*, const rocksdb_readoptions_t*, const char* key, size_t klen,
                      size_t* vallen, char** errptr)
    void rocksdb_multi_get(rocksdb_t*, const rocksdb_readoptions_t*, size_t num_keys,
                           const char* const* keys_list, const size_t* keys_list_sizes,
                           char** values_list, size_t* values_list_sizes, char** errs)
    void rocksdb_compact_range(rocksdb_t*, const char* start_key, size_t start_key_len,
                               const char* limit_key, size_t limit_key_len)
    void rocksdb_free(void* ptr)


cdef extern from "workers/rocksdb_kv.h" nogil:
    const char* MC_KV_META
    enum:
        MC_KV_META_LEN
        MC_KV_MAX_KEYS
        MC_KV_MAX_VALUE
    void mc_kv_key(uint32_t k, uint8_t* out)
    void mc_kv_value(uint32_t k, uint8_t* out, uint32_t n)
    uint32_t mc_kv_ld32(const uint8_t* p)
    void mc_kv_st32(uint8_t* p, uint32_t v)
    uint64_t mc_kv_mix(uint64_t x)


cdef inline int64_t _thread_cpu_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


# Per worker (one cache line each): what the dilation padded, for the runner and the tests.
ctypedef struct DilSlot:
    uint64_t calls
    uint64_t cpu_ns              # the GETs' own CPU time
    uint64_t wall_ns             # start to end of the padded calls
    uint64_t target_ns           # the targets padded to (K x the warm draw, or K x cpu)
    uint64_t overruns            # the GET itself ended past its target: not padded
    uint64_t rng                 # this worker's draws (pad=warm)
    uint8_t _pad[16]


cdef enum:
    PAD_CPU = 0                  # K x this GET's CPU time
    PAD_WARM = 1                 # K x a draw from the warm back-to-back cost of GET(n)
    WARM_GRID_MAX = 8            # calibrated sizes: 1, 2, 4, ..., 64
    WARM_GET_FAILED = 0x7FFFFFFF  # _calibrate_warm: a GET failed (no count of rounds is)


ctypedef struct KvState:
    rocksdb_t* db
    rocksdb_readoptions_t* ropts
    uint32_t n_keys
    uint32_t value_size
    uint32_t max_keys            # the most keys one GET may ask for (fits in a response)
    double dilate                # pad each GET to dilate x its cost (1: no padding)
    BenchState* pad              # the bench handler's per-worker sleep margins (dilate > 1)
    DilSlot* dil                 # BENCH_SLOTS of them (dilate > 1)
    int pad_mode                 # PAD_CPU or PAD_WARM
    uint32_t n_grid              # calibrated GET sizes (pad=warm), ascending, 1 .. max_keys
    uint32_t grid[WARM_GRID_MAX]
    uint32_t warm_m              # samples kept per size (>= 2)
    uint32_t warm_stride         # row stride of warm
    double* warm                 # n_grid rows of warm_m sorted CPU ns, one row per size


cdef inline double _row_at(const double* row, uint32_t m, double pos) noexcept nogil:
    """The empirical quantile at fractional rank ``pos`` in [0, m - 1] of a sorted row."""
    cdef uint32_t i = <uint32_t>pos
    if i >= m - 1:
        return row[m - 1]
    return row[i] + (pos - <double>i) * (row[i + 1] - row[i])


cdef inline double _warm_draw(const KvState* s, uint32_t n, uint64_t* rng) noexcept nogil:
    """One draw (ns) from the warm cost of GET(n): a uniform quantile of the calibrated size n,
    or the same quantile of the two calibrated sizes around n, linear in n."""
    cdef uint32_t j = 0
    cdef double pos, hi, lo, w
    rng[0] += 0x9E3779B97F4A7C15ULL
    pos = <double>(mc_kv_mix(rng[0]) >> 11) * (1.0 / 9007199254740992.0) * (s.warm_m - 1)
    while j + 1 < s.n_grid and s.grid[j] < n:
        j += 1
    hi = _row_at(s.warm + j * s.warm_stride, s.warm_m, pos)
    if s.grid[j] == n:
        return hi
    if j == 0 or s.grid[j] < n:         # outside the sizes a file measured: in proportion
        return hi * <double>n / <double>s.grid[j]
    lo = _row_at(s.warm + (j - 1) * s.warm_stride, s.warm_m, pos)
    w = <double>(n - s.grid[j - 1]) / <double>(s.grid[j] - s.grid[j - 1])
    return lo + w * (hi - lo)


cdef int h_rocksdb(void* ctx, malcolm_task* t) noexcept nogil:
    """GET(n): see the module docstring. Never reads or writes outside the task's buffers."""
    cdef KvState* s = <KvState*>ctx
    cdef int rc
    cdef int64_t t0 = 0, c0 = 0, cpu, target, now
    cdef DilSlot* d
    if s.pad != NULL:
        t0 = mc_now_ns()
        c0 = _thread_cpu_ns()
    rc = _get(s, t)
    if s.pad != NULL:
        cpu = _thread_cpu_ns() - c0
        d = &s.dil[(<uint32_t>t.worker) & (BENCH_SLOTS - 1)]
        if s.pad_mode == PAD_WARM and rc == MALCOLM_OK:
            # (rc OK: the payload held a valid n)
            target = <int64_t>(s.dilate * _warm_draw(s, mc_kv_ld32(t.payload), &d.rng))
        else:
            target = <int64_t>(s.dilate * <double>cpu)
        now = mc_now_ns()
        if now - t0 > target:
            d.overruns += 1
        else:
            bench_wait(s.pad, t.worker, t0 + target)
            now = mc_now_ns()
        d.calls += 1
        d.cpu_ns += <uint64_t>cpu
        d.target_ns += <uint64_t>target
        d.wall_ns += <uint64_t>(now - t0)
    return rc


cdef int _cmp_double(const void* a, const void* b) noexcept nogil:
    cdef double x = (<const double*>a)[0], y = (<const double*>b)[0]
    return (x > y) - (x < y)


cdef uint32_t _calibrate_warm(KvState* s, uint32_t m, int64_t budget_ns,
                              uint64_t seed) noexcept nogil:
    """Fill ``s.warm``: ``m`` back-to-back GETs of each calibrated size (a round: one GET of
    each size, sharing the cache state) after ``m`` untimed rounds, thread CPU time each (a
    round with a GET of <= 0 ns, a VM clock glitch, is dropped), until ``budget_ns`` of wall
    time (>= 32 rounds kept). Sorts each row; returns the rounds kept, or WARM_GET_FAILED."""
    cdef uint8_t payload[4 + 4 * MC_KV_MAX_KEYS]
    cdef uint8_t out[MC_KV_MAX_VALUE]
    cdef malcolm_task t
    cdef uint32_t r = 0, j, i, n, kept = 0
    cdef uint64_t x = seed
    cdef int64_t c0, d, start = mc_now_ns()
    cdef bint seen                      # every GET of the round took > 0 ns
    memset(&t, 0, sizeof(t))
    t.payload = payload
    t.out = out
    t.out_cap = MC_KV_MAX_VALUE
    while r < 2 * m:
        if r < m and mc_now_ns() - start > budget_ns // 2:
            r = m                       # the warm-up had its half of the budget
        if kept >= 32 and mc_now_ns() - start > budget_ns:
            break
        seen = True
        for j in range(s.n_grid):
            n = s.grid[j]
            mc_kv_st32(payload, n)
            for i in range(n):
                x += 0x9E3779B97F4A7C15ULL
                mc_kv_st32(payload + 4 + 4 * i, <uint32_t>(mc_kv_mix(x) % s.n_keys))
            t.payload_len = 4 + 4 * n
            c0 = _thread_cpu_ns()
            if _get(s, &t) != MALCOLM_OK:
                return WARM_GET_FAILED
            d = _thread_cpu_ns() - c0
            seen = seen and d > 0
            if r >= m:
                s.warm[j * s.warm_stride + kept] = <double>d
        kept += (r >= m) and seen       # a timed round, every GET seen by the clock
        r += 1
    for j in range(s.n_grid):
        qsort(s.warm + j * s.warm_stride, kept, sizeof(double), _cmp_double)
    return kept


cdef inline int _get(KvState* s, malcolm_task* t) noexcept nogil:
    cdef uint32_t n, i, k, vs = s.value_size
    cdef uint8_t keys[MC_KV_MAX_KEYS][4]
    cdef const char* kp[MC_KV_MAX_KEYS]
    cdef size_t klen[MC_KV_MAX_KEYS]
    cdef char* vals[MC_KV_MAX_KEYS]
    cdef size_t vlen[MC_KV_MAX_KEYS]
    cdef char* errs[MC_KV_MAX_KEYS]
    cdef int rc = MALCOLM_OK
    t.out_len = 0
    if t.payload_len < 4:
        return MALCOLM_BAD_INPUT
    n = mc_kv_ld32(t.payload)
    if n == 0 or n > s.max_keys or t.payload_len != 4 + 4 * n or n * vs > t.out_cap:
        return MALCOLM_BAD_INPUT
    for i in range(n):
        k = mc_kv_ld32(t.payload + 4 + 4 * i)
        if k >= s.n_keys:
            return MALCOLM_BAD_INPUT
        mc_kv_key(k, keys[i])
        kp[i] = <const char*>keys[i]
        klen[i] = 4
    rocksdb_multi_get(s.db, s.ropts, n, kp, klen, vals, vlen, errs)
    for i in range(n):
        if errs[i] != NULL:
            rocksdb_free(errs[i])
            rc = MALCOLM_ERROR
        if vals[i] == NULL:
            rc = MALCOLM_ERROR        # a key of the dictionary is missing: a broken database
        elif vlen[i] != vs:
            rc = MALCOLM_ERROR
        elif rc == MALCOLM_OK:
            memcpy(t.out + i * vs, vals[i], vs)
        if vals[i] != NULL:
            rocksdb_free(vals[i])
    if rc == MALCOLM_OK:
        t.out_len = n * vs
    return rc


WARM_BUDGET_S = 5      # most wall time the warm calibration may take (it keeps >= 32 rounds)


cdef _raise_err(char* e, what):
    """Raise RocksDBError with RocksDB's message ``e`` (malloc()ed by RocksDB; freed here)."""
    msg = e.decode(errors="replace") if e != NULL else "unknown error"
    if e != NULL:
        rocksdb_free(e)
    # RocksDB's messages name the path as given: a newline in it must not forge a line
    raise RocksDBError(f"{what}: {msg if msg.isprintable() else repr(msg)}")


PAD_MODES = {"warm": PAD_WARM, "cpu": PAD_CPU}     # rocksdb_spec.PAD_NAMES


cdef class RocksDB:
    """An open dictionary, read-only: the ``rocksdb`` handler's state.

    Parameters
    ----------
    path : str
        A database built by ``malcolm rocksdb load``.
    cache_mb : float
        Block cache size.
    dilate : float
        Pad every GET to ``dilate`` x its cost (1: no padding; see the module docstring).
    pad : {"warm", "cpu"}
        ``dilate`` > 1: pad to ``dilate`` x a draw from the warm back-to-back cost of GET(n),
        calibrated here when the database opens, or to ``dilate`` x this GET's CPU time.
    calib : int
        ``pad="warm"``: timed GETs per calibrated size (1, 2, 4, ..., 64).
    warm : str or None
        ``pad="warm"``: take the warm cost from this ``malcolm rocksdb calibrate --json``
        file (its CPU-time quantiles per GET size) instead of calibrating here, so that every
        server of every rack pads to the same distribution (and the simulator's
        ``rocksdb1-measured:FILE`` is that distribution).
    """
    cdef KvState st
    cdef rocksdb_options_t* opts
    cdef rocksdb_block_based_table_options_t* topts
    cdef rocksdb_cache_t* cache
    cdef readonly str path

    def __init__(self, path, double cache_mb=64.0, double dilate=1.0, pad="warm",
                 int calib=500, warm=None):
        cdef char* err = NULL
        cdef size_t mlen = 0
        cdef char* meta
        cdef int i
        self.path = os.fspath(path)
        if not 1.0 <= dilate <= 10_000.0:
            raise RocksDBError(f"dilate {dilate!r} must be in 1..10000")
        if pad not in PAD_MODES:
            raise RocksDBError(f"pad must be warm or cpu, not {pad!r}")
        if not 16 <= calib <= 100_000:
            raise RocksDBError(f"calib {calib} must be in 16..100000")
        if not os.path.exists(os.path.join(self.path, "CURRENT")):
            raise RocksDBError(f"{self.path!r} is not a RocksDB database (build one with "
                               "`malcolm rocksdb load --keys N PATH`)")
        self.opts = rocksdb_options_create()
        self.topts = rocksdb_block_based_options_create()
        self.cache = rocksdb_cache_create_lru(<size_t>(cache_mb * (1 << 20)))
        rocksdb_block_based_options_set_block_cache(self.topts, self.cache)
        rocksdb_block_based_options_set_filter_policy(
            self.topts, rocksdb_filterpolicy_create_bloom_full(10.0))
        rocksdb_options_set_block_based_table_factory(self.opts, self.topts)
        bpath = os.fsencode(self.path)
        self.st.db = rocksdb_open_for_read_only(self.opts, bpath, 0, &err)
        if err != NULL:
            self.st.db = NULL
            _raise_err(err, f"cannot open {self.path!r}")
        self.st.ropts = rocksdb_readoptions_create()
        meta = rocksdb_get(self.st.db, self.st.ropts, MC_KV_META, MC_KV_META_LEN, &mlen, &err)
        if err != NULL:
            _raise_err(err, f"cannot read {self.path!r}")
        if meta == NULL:
            raise RocksDBError(f"{self.path!r} is not a malcolm dictionary (no metadata key; "
                               "build it with `malcolm rocksdb load`)")
        raw = (<char*>meta)[:mlen]
        rocksdb_free(meta)
        n_keys, vs = read_meta(raw)
        if not 1 <= vs <= MC_KV_MAX_VALUE or not 1 <= n_keys <= 0xFFFFFFFF:
            raise RocksDBError(f"{self.path!r}: metadata out of range: {raw!r}")
        self.st.n_keys = n_keys
        self.st.value_size = vs
        self.st.max_keys = min(MC_KV_MAX_KEYS, MC_KV_MAX_VALUE // vs)
        self.st.dilate = dilate
        if dilate > 1.0:
            # the bench handler's defaults: q = 0.99 of the wake-up lateness, at most 500 µs
            self.st.pad = bench_state_new(0.99, 500_000.0)
            self.st.dil = <DilSlot*>mc_aligned_alloc(64, BENCH_SLOTS * sizeof(DilSlot))
            if self.st.pad == NULL or self.st.dil == NULL:
                raise MemoryError()
            memset(self.st.dil, 0, BENCH_SLOTS * sizeof(DilSlot))
            for i in range(BENCH_SLOTS):        # distinct draw streams per worker
                self.st.dil[i].rng = mc_kv_mix(<uint64_t>i * 0x632BE59BD9B4E019ULL + 1)
            self.st.pad_mode = PAD_MODES[pad]
            if self.st.pad_mode == PAD_WARM and warm:
                self._load_warm(warm)
            elif self.st.pad_mode == PAD_WARM:
                self._calibrate_warm(calib)

    def _load_warm(self, path):
        from malcolm.workloads import read_calibration
        cdef uint32_t j, i
        try:
            cal = read_calibration(path)
        except ValueError as e:
            raise RocksDBError(f"warm={path!r}: {e}") from None
        sizes = sorted(cal)
        if len(sizes) > WARM_GRID_MAX or not all(1 <= n <= MC_KV_MAX_KEYS for n in sizes):
            raise RocksDBError(f"warm={path!r}: at most {WARM_GRID_MAX} GET sizes, each in "
                               f"1..{MC_KV_MAX_KEYS}")
        m = 1024                # the file's quantiles, resampled: linear between them
        self.st.n_grid = len(sizes)
        self.st.warm_stride = m
        self.st.warm = <double*>calloc(<size_t>self.st.n_grid * m, sizeof(double))
        if self.st.warm == NULL:
            raise MemoryError()
        for j, n in enumerate(sizes):
            self.st.grid[j] = n
            row = np.interp(np.linspace(0.0, 1.0, m), cal[n][0], cal[n][1]) * 1e3
            for i in range(m):
                self.st.warm[j * m + i] = row[i]
        self.st.warm_m = m

    def _calibrate_warm(self, uint32_t calib):
        cdef uint32_t n = 1, kept
        cdef uint32_t g = 0
        cdef int64_t budget = WARM_BUDGET_S * 1_000_000_000
        while n < self.st.max_keys and g < WARM_GRID_MAX - 1:
            self.st.grid[g] = n
            g += 1
            n *= 2
        self.st.grid[g] = self.st.max_keys
        self.st.n_grid = g + 1
        self.st.warm_stride = calib
        self.st.warm = <double*>calloc(<size_t>self.st.n_grid * calib, sizeof(double))
        if self.st.warm == NULL:
            raise MemoryError()
        with nogil:
            kept = _calibrate_warm(&self.st, calib, budget, 0x5EED)
        if kept == WARM_GET_FAILED or kept < 2:     # < 2: the clock read 0 ns every round
            raise RocksDBError(f"{self.path!r}: a warm calibration GET failed (a broken database?)"
                               if kept == WARM_GET_FAILED else "the warm calibration's GETs all "
                               "took 0 ns by this thread's CPU clock: give warm=FILE")
        self.st.warm_m = kept

    def __dealloc__(self):
        # Runs once no worker can use the handle (the Handler holds this object until then).
        free(self.st.pad)
        free(self.st.dil)
        free(self.st.warm)
        if self.st.ropts != NULL:
            rocksdb_readoptions_destroy(self.st.ropts)
        if self.st.db != NULL:
            rocksdb_close(self.st.db)
        if self.topts != NULL:
            rocksdb_block_based_options_destroy(self.topts)
        if self.opts != NULL:
            rocksdb_options_destroy(self.opts)
        if self.cache != NULL:
            rocksdb_cache_destroy(self.cache)

    @property
    def n_keys(self):
        return self.st.n_keys

    @property
    def value_size(self):
        return self.st.value_size

    @property
    def dilate(self):
        return self.st.dilate

    @property
    def pad(self):
        """``"warm"`` or ``"cpu"`` (see the module docstring); None without dilation."""
        if self.st.pad == NULL:
            return None
        return "warm" if self.st.pad_mode == PAD_WARM else "cpu"

    def dilate_stats(self):
        """``dilate`` > 1: counters over every padded GET so far, else None.

        ``calls``; ``cpu_ns`` (the GETs' own CPU time); ``target_ns`` (the targets padded to);
        ``wall_ns`` (start to end of the padded calls: ``wall_ns / target_ns`` is the padding's
        accuracy, ``wall_ns / cpu_ns`` the dilation of the real cost); ``overruns`` (GETs that
        ended past their target, not padded); ``pad``."""
        cdef int i
        if self.st.dil == NULL:
            return None
        out = {"calls": 0, "cpu_ns": 0, "wall_ns": 0, "target_ns": 0, "overruns": 0}
        for i in range(BENCH_SLOTS):
            out["calls"] += self.st.dil[i].calls
            out["cpu_ns"] += self.st.dil[i].cpu_ns
            out["wall_ns"] += self.st.dil[i].wall_ns
            out["target_ns"] += self.st.dil[i].target_ns
            out["overruns"] += self.st.dil[i].overruns
        out["pad"] = self.pad
        return out

    def warm_table(self):
        """``pad="warm"``: ``{n: sorted back-to-back CPU ns of GET(n)}`` for the calibrated
        sizes; else None."""
        cdef uint32_t j, i
        if self.st.warm == NULL or self.st.warm_m == 0:
            return None
        return {int(self.st.grid[j]): np.array([self.st.warm[j * self.st.warm_stride + i]
                                                for i in range(self.st.warm_m)])
                for j in range(self.st.n_grid)}

    def warm_draws(self, uint32_t n, Py_ssize_t m, uint64_t seed=1):
        """``m`` draws (ns, before the factor ``dilate``) from the warm cost of GET(n), as
        the handler makes them per request."""
        cdef uint64_t rng = seed
        cdef Py_ssize_t i
        if self.st.warm == NULL or self.st.warm_m == 0:
            raise RocksDBError("no warm calibration (needs dilate > 1 and pad=warm)")
        if not 1 <= n <= self.st.max_keys:
            raise ValueError(f"GET({n}) is out of range 1..{self.st.max_keys}")
        out = np.empty(m)
        cdef double[::1] ov = out
        with nogil:
            for i in range(m):
                ov[i] = _warm_draw(&self.st, n, &rng)
        return out

    def pad_calibration(self):
        """``dilate`` > 1: per-worker ``(margin_us, sleeps, overruns)`` of the padding's
        calibrated waits (as ``Handler.calibration`` for ``bench``); else None."""
        cdef int i
        if self.st.pad == NULL:
            return None
        return [(self.st.pad.slot[i].margin_ns / 1000.0, self.st.pad.slot[i].sleeps,
                 self.st.pad.slot[i].overruns)
                for i in range(BENCH_SLOTS) if self.st.pad.slot[i].sleeps]

    @property
    def max_keys(self):
        """The most keys one GET may ask for: 64, or fewer when the values are large."""
        return self.st.max_keys

    @property
    def fn_addr(self):
        """Address of the nogil handler function (for ``Handler``)."""
        return <uintptr_t>h_rocksdb

    @property
    def ctx_addr(self):
        return <uintptr_t>&self.st


def time_gets(RocksDB db not None, const uint32_t[:, ::1] keys, double gap_us=0.0,
              Py_ssize_t trash_kb=0):
    """Time one handler call per row of ``keys`` (a GET of that row's keys), in this thread,
    without the GIL, exactly as a worker makes it.

    ``gap_us`` > 0 sleeps that long before each call, and ``trash_kb`` > 0 writes that many
    KiB of another buffer first (what other processes do to the caches while a dilated
    worker idles): the GETs then run cold, as they do between the tasks of a dilated rack.

    Returns
    -------
    wall, cpu : numpy int64 arrays
        Each call's CLOCK_MONOTONIC time (what a worker measures; includes any preemption)
        and this thread's CPU time (the work itself; the kernel's accounting, exact to the ns).
    """
    cdef Py_ssize_t m = keys.shape[0], n = keys.shape[1], i, j
    cdef uint8_t payload[4 + 4 * MC_KV_MAX_KEYS]
    cdef uint8_t out[MC_KV_MAX_VALUE]
    cdef malcolm_task t
    cdef int64_t t0, c0
    cdef long long failed = 0
    cdef timespec gap
    cdef Py_ssize_t tb = max(0, trash_kb) * 1024, b
    if not 1 <= n <= db.st.max_keys:
        raise ValueError(f"GET({n}) is out of range 1..{db.st.max_keys}")
    trash = np.zeros(max(1, tb), dtype=np.uint8)
    cdef uint8_t[::1] tv = trash
    gap.tv_sec = <long>(gap_us / 1e6)
    gap.tv_nsec = <long>((gap_us - gap.tv_sec * 1e6) * 1000.0)
    wall = np.empty(m, dtype=np.int64)
    cpu = np.empty(m, dtype=np.int64)
    cdef int64_t[::1] wv = wall
    cdef int64_t[::1] cv = cpu
    memset(&t, 0, sizeof(t))
    with nogil:
        for i in range(m):
            mc_kv_st32(payload, <uint32_t>n)
            for j in range(n):
                mc_kv_st32(payload + 4 + 4 * j, keys[i, j])
            t.payload = payload
            t.payload_len = <uint32_t>(4 + 4 * n)
            t.out = out
            t.out_cap = MC_KV_MAX_VALUE
            if tb > 0:
                for b in range(0, tb, 64):
                    tv[b] += 1
            if gap_us > 0:
                clock_nanosleep(CLOCK_MONOTONIC, 0, &gap, NULL)
            c0 = _thread_cpu_ns()
            t0 = mc_now_ns()
            if h_rocksdb(&db.st, &t) != MALCOLM_OK:
                failed += 1
            wv[i] = mc_now_ns() - t0
            cv[i] = _thread_cpu_ns() - c0
    if failed:
        raise RocksDBError(f"{failed} of {m} GETs failed (keys out of range for this "
                           f"{db.st.n_keys}-key dictionary?)")
    return wall, cpu


def open_handler(rest):
    """Open the database named by a ``rocksdb:...`` spec's options; return the state object."""
    o = parse_spec(rest)
    return RocksDB(o["path"], o["cache_mb"], o["dilate"], o["pad"], o["calib"], o["warm"])


def value(uint32_t k, uint32_t value_size):
    """Key ``k``'s value (bytes), as ``malcolm rocksdb load`` stores it."""
    cdef uint8_t buf[MC_KV_MAX_VALUE]
    if not 1 <= value_size <= MC_KV_MAX_VALUE:
        raise ValueError(f"value size must be in 1..{MC_KV_MAX_VALUE}")
    mc_kv_value(k, buf, value_size)
    return bytes(buf[:value_size])


def load(path, long long n_keys, int value_size=16, bint overwrite=False, progress=None):
    """Build the dictionary: keys ``0..n_keys-1`` with values :func:`value`, then compact.

    Parameters
    ----------
    path : str
        A directory that does not exist yet (or holds a database, with ``overwrite``).
    n_keys : int
    value_size : int
        Bytes per value, 1..1024. With 16, a GET(64) answer is exactly 1024 bytes.
    progress : callable or None
        ``progress(done, total)`` after each batch.

    Returns
    -------
    dict
        ``keys``, ``value_size``, ``path``, ``bytes`` (on disk).
    """
    cdef char* err = NULL
    cdef rocksdb_options_t* opts
    cdef rocksdb_writeoptions_t* wopts
    cdef rocksdb_writebatch_t* wb
    cdef rocksdb_block_based_table_options_t* topts
    cdef rocksdb_t* db
    cdef uint8_t key[4]
    cdef uint8_t val[MC_KV_MAX_VALUE]
    cdef long long k, start, end
    cdef uint32_t vs = value_size
    if not 1 <= n_keys <= 0xFFFFFFFF:
        raise RocksDBError(f"--keys must be in 1..{0xFFFFFFFF}, got {n_keys}")
    if not 1 <= value_size <= MC_KV_MAX_VALUE:
        raise RocksDBError(f"--value-size must be in 1..{MC_KV_MAX_VALUE}, got {value_size}")
    path = os.fspath(path)
    check_load_target(path, n_keys, value_size, overwrite)
    if os.path.exists(path):
        import shutil
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    opts = rocksdb_options_create()
    rocksdb_options_set_create_if_missing(opts, 1)
    rocksdb_options_prepare_for_bulk_load(opts)
    rocksdb_options_set_compression(opts, rocksdb_no_compression)  # values are random
    topts = rocksdb_block_based_options_create()
    rocksdb_block_based_options_set_filter_policy(
        topts, rocksdb_filterpolicy_create_bloom_full(10.0))
    rocksdb_options_set_block_based_table_factory(opts, topts)
    db = rocksdb_open(opts, os.fsencode(path), &err)
    wopts = rocksdb_writeoptions_create()
    rocksdb_writeoptions_disable_WAL(wopts, 1)
    wb = rocksdb_writebatch_create()
    try:
        if err != NULL:
            _raise_err(err, f"cannot create {path!r}")
        start = 0
        while start < n_keys:
            end = min(start + 100_000, n_keys)
            with nogil:
                rocksdb_writebatch_clear(wb)
                for k in range(start, end):
                    mc_kv_key(<uint32_t>k, key)
                    mc_kv_value(<uint32_t>k, val, vs)
                    rocksdb_writebatch_put(wb, <const char*>key, 4, <const char*>val, vs)
                rocksdb_write(db, wopts, wb, &err)
            if err != NULL:
                _raise_err(err, f"writing {path!r}")
            start = end
            if progress is not None:
                progress(start, n_keys)
        meta = f"malcolm-kv 1 keys={n_keys} value_size={value_size}".encode()
        rocksdb_put(db, wopts, MC_KV_META, MC_KV_META_LEN, meta, len(meta), &err)
        if err != NULL:
            _raise_err(err, f"writing {path!r}")
        with nogil:
            # one compacted level: the layout a long-running read-only store settles into
            rocksdb_compact_range(db, NULL, 0, NULL, 0)
    finally:
        rocksdb_writebatch_destroy(wb)
        rocksdb_writeoptions_destroy(wopts)
        if db != NULL:
            rocksdb_close(db)
        rocksdb_options_destroy(opts)
        rocksdb_block_based_options_destroy(topts)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return {"path": path, "keys": int(n_keys), "value_size": int(value_size), "bytes": size}
