# cython: language_level=3
"""Task handlers.

Built-in (``spec`` in the rack file or ``--handler``):

``spin``        burn the task's ``service_ns`` on the CPU, timed by clock_gettime;
``spin:tsc``    the same, timed by the TSC (calibrated at start);
``sleep``       emulate ``service_ns`` without the CPU: sleep (timer slack set to 1 ns) to a
                few µs before the deadline, then spin the rest (``sleep:spin_us=10``);
``echo``        answer with the task's payload.
``rocksdb:path=PATH[,cache_mb=64]``
                GET(n) on a RocksDB dictionary (:mod:`malcolm.workers.rocksdb`; needs
                librocksdb, and a database built by ``malcolm rocksdb load``).

User handlers (see ``malcolm/workers/malcolm_handler.h`` for the C ABI):

``so:PATH:SYMBOL[@ARG]``    a C function in a shared library (dlopen + dlsym); if the library
                            exports ``SYMBOL_init``, ``ctx = SYMBOL_init(ARG or "")`` once,
                            and ``SYMBOL_fini(ctx)`` (if exported) at the end;
``cffi:MODULE:SYMBOL``      a C function of a cffi API-mode extension module;
``python:MODULE:FUNC``      a Python callable ``f(task_type, service_ns, payload) -> bytes | None``.
                            **Slow**: each task takes the GIL (microseconds, and the workers
                            serialise on it). For prototypes and tests only.
"""
import importlib
import os
import re

from cpython.ref cimport PyObject
from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from malcolm._core cimport mc_aligned_alloc, mc_cpu_relax, mc_now_ns, mc_rdtsc


cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    char* dlerror()
    int dlclose(void* handle)
    enum:
        RTLD_NOW
        RTLD_LOCAL


cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_nanosleep(int clockid, int flags, const timespec* req, timespec* rem)
    enum:
        CLOCK_MONOTONIC
        TIMER_ABSTIME


ctypedef struct SleepState:
    int64_t spin_ns


ctypedef struct TscState:
    double ticks_per_ns


cdef int h_echo(void* ctx, malcolm_task* t) noexcept nogil:
    cdef uint32_t n = t.payload_len if t.payload_len <= t.out_cap else t.out_cap
    memcpy(t.out, t.payload, n)
    t.out_len = n
    return 0


cdef int h_spin(void* ctx, malcolm_task* t) noexcept nogil:
    cdef int64_t end = mc_now_ns() + t.service_ns
    while mc_now_ns() < end:
        mc_cpu_relax()
    t.out_len = 0
    return 0


cdef int h_spin_tsc(void* ctx, malcolm_task* t) noexcept nogil:
    cdef TscState* s = <TscState*>ctx
    cdef uint64_t end = mc_rdtsc() + <uint64_t>(t.service_ns * s.ticks_per_ns)
    while mc_rdtsc() < end:
        mc_cpu_relax()
    t.out_len = 0
    return 0


cdef int h_sleep(void* ctx, malcolm_task* t) noexcept nogil:
    cdef SleepState* s = <SleepState*>ctx
    cdef int64_t now = mc_now_ns()
    cdef int64_t end = now + t.service_ns
    cdef int64_t wake = end - s.spin_ns
    cdef timespec ts
    if wake > now:
        ts.tv_sec = wake // 1000000000
        ts.tv_nsec = wake % 1000000000
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)
    while mc_now_ns() < end:
        mc_cpu_relax()
    t.out_len = 0
    return 0


cdef int h_python(void* ctx, malcolm_task* t) noexcept nogil:
    with gil:
        try:
            out = (<object><PyObject*>ctx)(t.task_type, t.service_ns,
                                           bytes(t.payload[:t.payload_len]))
            if out is None:
                t.out_len = 0
                return 0
            out = bytes(out)
            if len(out) > t.out_cap:
                return 1
            memcpy(t.out, <const char*>out, len(out))
            t.out_len = len(out)
            return 0
        except BaseException:
            return 1


def _calibrate_tsc():
    cdef uint64_t c0, c1
    cdef int64_t t0, t1
    t0 = mc_now_ns()
    c0 = mc_rdtsc()
    while mc_now_ns() - t0 < 20_000_000:
        pass
    t1 = mc_now_ns()
    c1 = mc_rdtsc()
    return (c1 - c0) / float(t1 - t0)


cdef class Handler:
    """A task handler, resolved from a spec string or a Python callable.

    Parameters
    ----------
    spec : str or callable
        See the module docstring.
    """

    def __init__(self, spec="spin"):
        self.ctx = NULL
        self.python = False
        if callable(spec):
            self._set_python(spec, getattr(spec, "__name__", "callable"))
            return
        if not isinstance(spec, str) or not spec:
            raise ValueError(f"handler must be a non-empty string or a callable, got {spec!r}")
        self.spec = spec
        kind, _, rest = spec.partition(":")
        if kind == "echo" and not rest:
            self.fn = h_echo
        elif kind == "spin":
            if rest == "":
                self.fn = h_spin
            elif rest == "tsc":
                self._state = <uint8_t*>mc_aligned_alloc(64, 64)
                (<TscState*>self._state).ticks_per_ns = _calibrate_tsc()
                self.ctx = self._state
                self.fn = h_spin_tsc
            else:
                raise ValueError(f"handler {spec!r}: spin takes no option but 'tsc'")
        elif kind == "sleep":
            spin_us = 10.0
            if rest:
                key, eq, val = rest.partition("=")
                if key != "spin_us" or not eq:
                    raise ValueError(f"handler {spec!r}: sleep takes only spin_us=<µs>")
                try:
                    spin_us = float(val)
                except ValueError:
                    raise ValueError(f"handler {spec!r}: spin_us must be a number") from None
                if not 0 <= spin_us <= 1e6:
                    raise ValueError(f"handler {spec!r}: spin_us out of range")
            self._state = <uint8_t*>mc_aligned_alloc(64, 64)
            (<SleepState*>self._state).spin_ns = <int64_t>(spin_us * 1000)
            self.ctx = self._state
            self.fn = h_sleep
        elif kind == "rocksdb":
            try:
                from malcolm.workers import rocksdb as rdb
            except ImportError as e:
                raise ValueError(f"handler {spec!r}: the rocksdb extension is not built ({e}); "
                                 "install the Debian package librocksdb-dev and rebuild "
                                 "(./dev does both, as root)") from None
            try:
                st = rdb.open_handler(rest)
            except rdb.RocksDBError as e:
                raise ValueError(f"handler {spec!r}: {e}") from None
            self._keep = st                 # owns the database handle the ctx points into
            self.fn = <malcolm_handler_fn><void*><size_t>st.fn_addr
            self.ctx = <void*><size_t>st.ctx_addr
        elif kind == "so":
            m = re.fullmatch(r"(.+?):([A-Za-z_][A-Za-z0-9_]*)(?:@(.*))?", rest, re.S)
            if not m:
                raise ValueError(f"handler {spec!r} must be so:PATH:SYMBOL[@ARG]")
            path, sym, arg = m.groups()
            if not os.path.exists(path):
                raise ValueError(f"handler {spec!r}: no such file {path}")
            bpath = os.fsencode(path)
            self._dl = dlopen(bpath, RTLD_NOW | RTLD_LOCAL)
            if self._dl == NULL:
                raise ValueError(f"handler {spec!r}: dlopen failed: {dlerror().decode()}")
            bsym = sym.encode()
            self.fn = <malcolm_handler_fn>dlsym(self._dl, bsym)
            if self.fn == NULL:
                raise ValueError(f"handler {spec!r}: no symbol {sym} in {path}")
            self._init_state(spec, path, sym, arg)
        elif kind == "cffi":
            modname, sep, sym = rest.rpartition(":")
            if not sep or not modname or not sym:
                raise ValueError(f"handler {spec!r} must be cffi:MODULE:SYMBOL")
            try:
                mod = importlib.import_module(modname)
                ffi, lib = mod.ffi, mod.lib
                addr = int(ffi.cast("uintptr_t", ffi.addressof(lib, sym)))
            except Exception as e:
                raise ValueError(f"handler {spec!r}: {type(e).__name__}: {e}") from None
            self._keep = mod
            self.fn = <malcolm_handler_fn><void*><size_t>addr
        elif kind == "python":
            modname, sep, fname = rest.rpartition(":")
            if not sep or not modname or not fname:
                raise ValueError(f"handler {spec!r} must be python:MODULE:FUNCTION")
            try:
                f = getattr(importlib.import_module(modname), fname)
            except Exception as e:
                raise ValueError(f"handler {spec!r}: {type(e).__name__}: {e}") from None
            if not callable(f):
                raise ValueError(f"handler {spec!r}: {fname} is not callable")
            self._set_python(f, spec)
        else:
            raise ValueError(f"unknown handler {spec!r}; use spin, spin:tsc, sleep, echo, "
                             "rocksdb:path=PATH, so:PATH:SYMBOL[@ARG], cffi:MODULE:SYMBOL or "
                             "python:MODULE:FUNCTION")

    def _init_state(self, spec, path, sym, arg):
        """The optional per-handler state of a shared-library handler: ``SYMBOL_init(arg)``
        makes the ``ctx`` every call gets, ``SYMBOL_fini(ctx)`` releases it."""
        cdef malcolm_init_fn init = <malcolm_init_fn>dlsym(self._dl, (sym + "_init").encode())
        cdef bytes barg = (arg or "").encode()
        if init == NULL:
            if arg is not None:
                raise ValueError(f"handler {spec!r}: @{arg} needs {sym}_init in {path}, "
                                 "which it does not export")
            return
        self._fini = <malcolm_fini_fn>dlsym(self._dl, (sym + "_fini").encode())
        self.ctx = init(barg)
        if self.ctx == NULL:
            self._fini = NULL
            raise ValueError(f"handler {spec!r}: {sym}_init({arg or ''!r}) failed "
                             "(returned NULL)")

    def _set_python(self, f, spec):
        self._keep = f
        self.ctx = <void*><PyObject*>f
        self.fn = h_python
        self.python = True
        self.spec = spec

    def __dealloc__(self):
        # A server holds its Handler as long as the server object lives, so no worker calls
        # the handler after this (as for _state below).
        if self._fini != NULL:
            self._fini(self.ctx)
        free(self._state)
        # dlclose is deliberately skipped: a worker may still be returning from the code.

    def run(self, int task_type=0, int64_t service_ns=0, bytes payload=b""):
        """Run the handler once in this thread; return ``(status, output bytes)``."""
        cdef malcolm_task t
        cdef uint8_t out[1024]
        cdef int rc
        memset(&t, 0, sizeof(t))
        t.task_type = task_type
        t.service_ns = service_ns
        t.payload = <const uint8_t*>(<const char*>payload)
        t.payload_len = len(payload)
        t.out = out
        t.out_cap = 1024
        if self.python:
            rc = self.fn(self.ctx, &t)
        else:
            with nogil:
                rc = self.fn(self.ctx, &t)
        return rc, bytes(out[:t.out_len])
