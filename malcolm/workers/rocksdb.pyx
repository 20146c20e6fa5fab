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
handler does the real GET(n), so the values are real and checked, measures the CPU time ``t``
its thread spent on it (CLOCK_THREAD_CPUTIME_ID: the work itself, not the time another
process held the core, which on a busy machine is the machine's cost, not RocksDB's), then
waits, with the ``bench`` handler's calibrated sleep and spin, until ``K t`` after it started.
The service-time distribution is then the real one scaled by ``K``. A GET preempted for longer
than ``K t`` is not padded (its wall time is already past the target).

Spec: ``rocksdb:path=/var/lib/malcolm/db[,cache_mb=64][,dilate=K]`` (``handler = ...`` in the
rack file, per server). Build the dictionary with ``malcolm rocksdb load``.
"""
import os
import re

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

import numpy as np

from malcolm._core cimport mc_aligned_alloc, mc_now_ns
from malcolm._system cimport CLOCK_THREAD_CPUTIME_ID, clock_gettime, timespec
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


cdef inline int64_t _thread_cpu_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


# Per worker (one cache line each): what the dilation padded, for the runner and the tests.
ctypedef struct DilSlot:
    uint64_t calls
    uint64_t cpu_ns              # the GETs' own CPU time
    uint64_t wall_ns             # start to end of the padded calls
    uint8_t _pad[40]


ctypedef struct KvState:
    rocksdb_t* db
    rocksdb_readoptions_t* ropts
    uint32_t n_keys
    uint32_t value_size
    uint32_t max_keys            # the most keys one GET may ask for (fits in a response)
    double dilate                # pad each GET to dilate x its CPU time (1: no padding)
    BenchState* pad              # the bench handler's per-worker sleep margins (dilate > 1)
    DilSlot* dil                 # BENCH_SLOTS of them (dilate > 1)


cdef int h_rocksdb(void* ctx, malcolm_task* t) noexcept nogil:
    """GET(n): see the module docstring. Never reads or writes outside the task's buffers."""
    cdef KvState* s = <KvState*>ctx
    cdef int rc
    cdef int64_t t0 = 0, c0 = 0, cpu
    cdef DilSlot* d
    if s.pad != NULL:
        t0 = mc_now_ns()
        c0 = _thread_cpu_ns()
    rc = _get(s, t)
    if s.pad != NULL:
        cpu = _thread_cpu_ns() - c0
        bench_wait(s.pad, t.worker, t0 + <int64_t>(s.dilate * <double>cpu))
        d = &s.dil[(<uint32_t>t.worker) & (BENCH_SLOTS - 1)]
        d.calls += 1
        d.cpu_ns += <uint64_t>cpu
        d.wall_ns += <uint64_t>(mc_now_ns() - t0)
    return rc


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


class RocksDBError(ValueError):
    """The database cannot be opened, built or read; the message says why and what to do."""


cdef _raise_err(char* e, what):
    """Raise RocksDBError with RocksDB's message ``e`` (malloc()ed by RocksDB; freed here)."""
    msg = e.decode(errors="replace") if e != NULL else "unknown error"
    if e != NULL:
        rocksdb_free(e)
    raise RocksDBError(f"{what}: {msg}")


def parse_spec(rest):
    """``path=PATH[,cache_mb=N][,dilate=K]`` (a handler spec after ``rocksdb:``) -> dict."""
    out = {"cache_mb": 64.0, "dilate": 1.0}
    if not rest:
        raise RocksDBError("needs a database: rocksdb:path=/path/to/db")
    for p in rest.split(","):           # (so a path cannot contain a comma)
        key, eq, val = p.partition("=")
        if not eq:
            raise RocksDBError(f"{p!r} must be key=value "
                               "(path=PATH, cache_mb=N, dilate=K)")
        if key == "path":
            out["path"] = val
        elif key == "cache_mb":
            try:
                out["cache_mb"] = float(val)
            except ValueError:
                raise RocksDBError("cache_mb must be a number")\
                    from None
            if not 0 <= out["cache_mb"] <= 1 << 20:
                raise RocksDBError("cache_mb out of range")
        elif key == "dilate":
            try:
                out["dilate"] = float(val)
            except ValueError:
                raise RocksDBError("dilate must be a number") from None
            if not 1 <= out["dilate"] <= 10_000:
                raise RocksDBError("dilate must be in 1..10000")
        else:
            raise RocksDBError(f"unknown option {key!r} "
                               "(path, cache_mb, dilate)")
    if not out.get("path"):
        raise RocksDBError("needs path=PATH")
    return out


def read_meta(bytes raw):
    """Parse the dictionary's metadata value -> (n_keys, value_size)."""
    m = re.fullmatch(rb"malcolm-kv 1 keys=(\d+) value_size=(\d+)", raw)
    if not m:
        raise RocksDBError(f"unrecognised dictionary metadata {raw[:60]!r}")
    return int(m.group(1)), int(m.group(2))


cdef class RocksDB:
    """An open dictionary, read-only: the ``rocksdb`` handler's state.

    Parameters
    ----------
    path : str
        A database built by ``malcolm rocksdb load``.
    cache_mb : float
        Block cache size.
    dilate : float
        Pad every GET to ``dilate`` x its CPU time (1: no padding; see the module docstring).
    """
    cdef KvState st
    cdef rocksdb_options_t* opts
    cdef rocksdb_block_based_table_options_t* topts
    cdef rocksdb_cache_t* cache
    cdef readonly str path

    def __init__(self, path, double cache_mb=64.0, double dilate=1.0):
        cdef char* err = NULL
        cdef size_t mlen = 0
        cdef char* meta
        self.path = os.fspath(path)
        if not 1.0 <= dilate <= 10_000.0:
            raise RocksDBError(f"dilate {dilate!r} must be in 1..10000")
        if not os.path.exists(os.path.join(self.path, "CURRENT")):
            raise RocksDBError(f"{self.path} is not a RocksDB database (build one with "
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
            _raise_err(err, f"cannot open {self.path}")
        self.st.ropts = rocksdb_readoptions_create()
        meta = rocksdb_get(self.st.db, self.st.ropts, MC_KV_META, MC_KV_META_LEN, &mlen, &err)
        if err != NULL:
            _raise_err(err, f"cannot read {self.path}")
        if meta == NULL:
            raise RocksDBError(f"{self.path} is not a malcolm dictionary (no metadata key; "
                               "build it with `malcolm rocksdb load`)")
        raw = (<char*>meta)[:mlen]
        rocksdb_free(meta)
        n_keys, vs = read_meta(raw)
        if not 1 <= vs <= MC_KV_MAX_VALUE or not 1 <= n_keys <= 0xFFFFFFFF:
            raise RocksDBError(f"{self.path}: metadata out of range: {raw!r}")
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

    def __dealloc__(self):
        # Runs only once no worker can use the handle: the Handler keeps this object alive
        # as long as its function pointer.
        free(self.st.pad)
        free(self.st.dil)
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

    def dilate_stats(self):
        """``dilate`` > 1: ``{"calls", "cpu_ns", "wall_ns"}`` over every padded GET so far:
        the GETs' own CPU time and their padded wall time (``wall_ns / cpu_ns`` is the
        dilation achieved; above ``dilate`` by the waits that overran); else None."""
        cdef int i
        if self.st.dil == NULL:
            return None
        out = {"calls": 0, "cpu_ns": 0, "wall_ns": 0}
        for i in range(BENCH_SLOTS):
            out["calls"] += self.st.dil[i].calls
            out["cpu_ns"] += self.st.dil[i].cpu_ns
            out["wall_ns"] += self.st.dil[i].wall_ns
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


def time_gets(RocksDB db not None, const uint32_t[:, ::1] keys):
    """Time one handler call per row of ``keys`` (a GET of that row's keys), in this thread,
    without the GIL, exactly as a worker makes it.

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
    if not 1 <= n <= db.st.max_keys:
        raise ValueError(f"GET({n}) is out of range 1..{db.st.max_keys}")
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
    return RocksDB(o["path"], o["cache_mb"], o["dilate"])


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
    if os.path.exists(path) and not overwrite:
        raise RocksDBError(f"{path} exists; remove it or pass --force to rebuild it")
    if os.path.exists(path) and os.listdir(path) and not os.path.exists(
            os.path.join(path, "CURRENT")):
        raise RocksDBError(f"{path} exists and is not a RocksDB database; refusing to "
                           "write into it")
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
            _raise_err(err, f"cannot create {path}")
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
                _raise_err(err, f"writing {path}")
            start = end
            if progress is not None:
                progress(start, n_keys)
        meta = f"malcolm-kv 1 keys={n_keys} value_size={value_size}".encode()
        rocksdb_put(db, wopts, MC_KV_META, MC_KV_META_LEN, meta, len(meta), &err)
        if err != NULL:
            _raise_err(err, f"writing {path}")
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
