# cython: language_level=3
"""Task handlers: C function pointers that worker threads call without the GIL."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "workers/malcolm_handler.h" nogil:
    ctypedef struct malcolm_task:
        uint32_t client_id
        uint16_t task_type
        uint16_t flags
        uint64_t request_id
        int64_t service_ns
        const uint8_t* payload
        uint32_t payload_len
        int32_t worker
        uint8_t* out
        uint32_t out_cap
        uint32_t out_len
    ctypedef int (*malcolm_handler_fn)(void* ctx, malcolm_task* task) noexcept
    ctypedef void* (*malcolm_init_fn)(const char* arg) noexcept
    ctypedef void (*malcolm_fini_fn)(void* ctx) noexcept
    enum:
        MALCOLM_OK               # the task ran: status ok
        MALCOLM_ERROR            # (any other value too) status "handler error"
        MALCOLM_BAD_INPUT        # the request is malformed: status "bad input"


cdef class Handler:
    cdef malcolm_handler_fn fn
    cdef void* ctx
    cdef readonly str spec
    cdef readonly bint python          # calls into Python (takes the GIL per task)
    cdef object _keep                  # objects that must outlive the function pointer
    cdef void* _dl                     # dlopen handle
    cdef malcolm_fini_fn _fini         # a so: or cffi: handler's SYMBOL_fini, if any
    cdef uint8_t* _state               # the built-in handlers' parameters


cdef enum:
    BENCH_SLOTS = 1024          # per-worker calibration state, indexed by worker & (SLOTS-1)
    BENCH_MIN_SLEEP_NS = 5000   # a sleep shorter than this is not worth the wake-up


# One cache line per worker: each worker adapts its own margin, without sharing a line.
ctypedef struct BenchSlot:
    double margin_ns            # sleep this long short of the deadline, spin the rest
    uint64_t sleeps
    uint64_t overruns           # woke up after the deadline
    uint8_t _pad[40]


ctypedef struct BenchState:
    double q                    # target quantile of the wake-up lateness
    double step_ns              # the quantile tracker's step
    double max_margin_ns
    BenchSlot slot[BENCH_SLOTS]


# The ``bench`` handler's calibrated wait, shared with handlers that pad real work (the
# ``rocksdb`` handler's ``dilate``): sleep to the worker's margin before ``end`` (a
# CLOCK_MONOTONIC ns deadline, mc_now_ns), then spin to it.
cdef void bench_wait(BenchState* s, int32_t worker, int64_t end) noexcept nogil
cdef BenchState* bench_state_new(double q, double max_margin_ns) noexcept nogil
