# cython: language_level=3
"""Task handlers.

Built-in (``spec`` in the rack file or ``--handler``):

``spin``        burn the task's ``service_ns`` on the CPU, timed by clock_gettime;
``spin:tsc``    the same, timed by the TSC (calibrated at start);
``sleep``       emulate ``service_ns`` without the CPU: sleep (timer slack set to 1 ns) to a
                few µs before the deadline, then spin the rest (``sleep:spin_us=10``);
``bench``       the benchmark handler: sleep to a self-calibrated margin before the deadline
                and spin the rest, so the service time is accurate (mean within 2% of nominal
                at 50 µs, see docs/performance.md) while most of a long task costs no CPU.
                Each worker tracks the 99th percentile of its own wake-up lateness and sleeps
                that much short of the deadline (``bench:q=0.95`` for another quantile,
                ``bench:max_spin_us=200`` caps the margin).
``echo``        answer with the task's payload.
``rocksdb:path=PATH[,cache_mb=64][,dilate=K][,pad=warm|cpu]``
                GET(n) on a RocksDB dictionary (:mod:`malcolm.workers.rocksdb`; needs
                librocksdb, and a database built by ``malcolm rocksdb load``); ``dilate=K``
                pads each real GET, with ``bench``'s calibrated wait, to K x a draw from
                the warm back-to-back cost of GET(n) (``pad=warm``, the default) or to
                K x its own CPU time (``pad=cpu``).

User handlers (see ``malcolm/workers/malcolm_handler.h`` for the C ABI):

``so:PATH:SYMBOL[@ARG]``    a C function in a shared library (dlopen + dlsym); if the library
                            exports ``SYMBOL_init``, ``ctx = SYMBOL_init(ARG or "")`` once,
                            and ``SYMBOL_fini(ctx)`` (if exported) at the end;
``cffi:MODULE:SYMBOL[@ARG]`` a C function of a cffi API-mode extension module, with the
                            same optional ``SYMBOL_init``/``SYMBOL_fini`` (declared in the
                            module's cdef);
``python:MODULE:FUNC``      a Python callable ``f(task_type, service_ns, payload) -> bytes | None``.
                            **Slow**: each task takes the GIL (microseconds, and the workers
                            serialise on it). For prototypes and tests only.
"""
import importlib
import os
import re

from cpython.ref cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from malcolm._core cimport mc_aligned_alloc, mc_cpu_relax, mc_now_ns, mc_rdtsc
from malcolm._system cimport CLOCK_MONOTONIC, TIMER_ABSTIME, clock_nanosleep, timespec


cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    char* dlerror()
    int dlclose(void* handle)
    enum:
        RTLD_NOW
        RTLD_LOCAL


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


cdef void bench_wait(BenchState* s, int32_t worker, int64_t end) noexcept nogil:
    # Why calibrated: a plain sleep wakes up 10-70 µs late on a VM (more under load), which
    # inflates a 50 µs service time by 20-40% and silently raises the real load. Sleeping
    # to `margin` before the deadline and spinning the rest is exact as long as a wake-up
    # is less than `margin` late; the margin follows the q-quantile of the observed lateness
    # (a stochastic quantile tracker: up by q*step when late beyond it, down by (1-q)*step
    # otherwise), so only about 1-q of the sleeps overrun, each by less than its lateness.
    cdef BenchSlot* b = &s.slot[(<uint32_t>worker) & (BENCH_SLOTS - 1)]
    cdef int64_t now = mc_now_ns()
    cdef int64_t wake = end - <int64_t>b.margin_ns
    cdef int64_t late
    cdef timespec ts
    if wake - now >= BENCH_MIN_SLEEP_NS:
        ts.tv_sec = wake // 1000000000
        ts.tv_nsec = wake % 1000000000
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)
        now = mc_now_ns()
        late = now - wake
        b.sleeps += 1
        if now > end:
            b.overruns += 1
        if late > b.margin_ns:
            b.margin_ns += s.q * s.step_ns
        else:
            b.margin_ns -= (1.0 - s.q) * s.step_ns
        if b.margin_ns < 1000.0:
            b.margin_ns = 1000.0
        elif b.margin_ns > s.max_margin_ns:
            b.margin_ns = s.max_margin_ns
    elif end - now > b.margin_ns:
        # The margin left no room to sleep: let it creep down as if the wake-up had been
        # punctual, or one slow wake-up would turn every later wait into a pure spin.
        b.margin_ns -= (1.0 - s.q) * s.step_ns
    while mc_now_ns() < end:
        mc_cpu_relax()


cdef BenchState* bench_state_new(double q, double max_margin_ns) noexcept nogil:
    """A zeroed, cache-aligned BenchState (free() it); NULL when out of memory."""
    cdef BenchState* b = <BenchState*>mc_aligned_alloc(64, sizeof(BenchState))
    cdef int i
    if b == NULL:
        return NULL
    memset(b, 0, sizeof(BenchState))
    b.q = q
    # 1 µs per step: with q = 0.99 the margin rises 0.99 µs per overrun and falls 10 ns
    # per punctual wake-up, so it settles within a few thousand tasks; the margin only
    # decides how much is spun, not when the task ends, so its jitter costs no accuracy.
    b.step_ns = 1000.0
    b.max_margin_ns = max_margin_ns
    for i in range(BENCH_SLOTS):
        b.slot[i].margin_ns = 30_000.0 if 30_000.0 < max_margin_ns else max_margin_ns
    return b


cdef int h_bench(void* ctx, malcolm_task* t) noexcept nogil:
    bench_wait(<BenchState*>ctx, t.worker, mc_now_ns() + t.service_ns)
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


def _cffi_addr(ffi, lib, str name, bint optional=False):
    """The C address of function ``name`` of a cffi API-mode module (0 when ``optional`` and
    the module does not declare it)."""
    if optional and not hasattr(lib, name):
        return 0
    return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))


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
        elif kind == "bench":
            self._init_bench(spec, rest)
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
            self._init_state(spec, path, sym, arg,
                             <size_t>dlsym(self._dl, (sym + "_init").encode()),
                             <size_t>dlsym(self._dl, (sym + "_fini").encode()))
        elif kind == "cffi":
            # The module name holds no ':'; ARG (after '@') may hold anything.
            m = re.fullmatch(r"([^:@]+):([A-Za-z_][A-Za-z0-9_]*)(?:@(.*))?", rest, re.S)
            if not m:
                raise ValueError(f"handler {spec!r} must be cffi:MODULE:SYMBOL[@ARG]")
            modname, sym, arg = m.groups()
            try:
                mod = importlib.import_module(modname)
                ffi, lib = mod.ffi, mod.lib
                addr = _cffi_addr(ffi, lib, sym)
            except Exception as e:
                raise ValueError(f"handler {spec!r}: {type(e).__name__}: {e}") from None
            self._keep = mod
            self.fn = <malcolm_handler_fn><void*><size_t>addr
            # SYMBOL_init/SYMBOL_fini are optional: a module that does not declare them in
            # its cdef has none (they are called through their C addresses, never Python).
            self._init_state(spec, modname, sym, arg, _cffi_addr(ffi, lib, sym + "_init", True),
                             _cffi_addr(ffi, lib, sym + "_fini", True))
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
            raise ValueError(f"unknown handler {spec!r}; use bench, spin, spin:tsc, sleep, "
                             "echo, rocksdb:path=PATH, so:PATH:SYMBOL[@ARG], "
                             "cffi:MODULE:SYMBOL[@ARG] or python:MODULE:FUNCTION")

    def _init_state(self, spec, where, sym, arg, size_t init_addr, size_t fini_addr):
        """The optional per-handler state of a shared-library or cffi handler:
        ``SYMBOL_init(arg)`` (at ``init_addr``, 0 if none) makes the ``ctx`` every call gets,
        ``SYMBOL_fini(ctx)`` (at ``fini_addr``, 0 if none) releases it."""
        cdef malcolm_init_fn init = <malcolm_init_fn><void*>init_addr
        cdef bytes barg = (arg or "").encode()
        if init == NULL:
            if arg is not None:
                raise ValueError(f"handler {spec!r}: @{arg} needs {sym}_init in {where}, "
                                 "which it does not export")
            return
        self._fini = <malcolm_fini_fn><void*>fini_addr
        self.ctx = init(barg)
        if self.ctx == NULL:
            self._fini = NULL
            raise ValueError(f"handler {spec!r}: {sym}_init({arg or ''!r}) failed "
                             "(returned NULL)")

    def _init_bench(self, spec, rest):
        opts = {"q": 0.99, "max_spin_us": 500.0}
        for item in filter(None, rest.split(",")):
            key, eq, val = item.partition("=")
            if key not in opts or not eq:
                raise ValueError(f"handler {spec!r}: bench takes q=<0..1> and "
                                 "max_spin_us=<µs>")
            try:
                opts[key] = float(val)
            except ValueError:
                raise ValueError(f"handler {spec!r}: {key} must be a number") from None
        if not 0.5 <= opts["q"] < 1.0:
            raise ValueError(f"handler {spec!r}: q must be in [0.5, 1)")
        if not 1.0 <= opts["max_spin_us"] <= 1e6:
            raise ValueError(f"handler {spec!r}: max_spin_us must be in [1, 1e6]")
        self._state = <uint8_t*>bench_state_new(opts["q"], opts["max_spin_us"] * 1000.0)
        if self._state == NULL:
            raise MemoryError()
        self.ctx = self._state
        self.fn = h_bench

    def calibration(self):
        """``bench`` only: per-worker ``(margin_us, sleeps, overruns)`` of workers that slept."""
        cdef BenchState* b
        cdef int i
        if self.fn != h_bench:
            return None
        b = <BenchState*>self._state
        return [(b.slot[i].margin_ns / 1000.0, b.slot[i].sleeps, b.slot[i].overruns)
                for i in range(BENCH_SLOTS) if b.slot[i].sleeps]

    def handler_stats(self):
        """Counters of a handler that keeps them (``rocksdb`` with ``dilate``: its
        ``dilate_stats()``), else None. For the server's statistics."""
        f = getattr(self._keep, "dilate_stats", None)
        return f() if f is not None else None

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
