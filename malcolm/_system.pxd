# cython: language_level=3
"""System externs, declared once (uvloop's model: one place per C header).

Every module that needs one of these ``cimport``\\ s it from here instead of writing its own
``cdef extern`` block: a wrong prototype written twice is a bug found twice. Only POSIX/Linux
declarations that Cython's bundled ``posix.*`` / ``libc.*`` pxds lack (or declare without the
constants we need) live here.
"""

cdef extern from "<sys/prctl.h>" nogil:
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4,
              unsigned long arg5)
    enum:
        PR_SET_TIMERSLACK
        PR_SET_NAME

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clockid, timespec* ts)
    int nanosleep(const timespec* req, timespec* rem)
    int clock_nanosleep(int clockid, int flags, const timespec* req, timespec* rem)
    enum:
        CLOCK_REALTIME
        CLOCK_MONOTONIC
        CLOCK_THREAD_CPUTIME_ID
        TIMER_ABSTIME

cdef extern from "<sys/random.h>" nogil:
    ssize_t getrandom(void* buf, size_t n, unsigned int flags)

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    int pthread_create(pthread_t* t, void* attr, void* (*start)(void*) noexcept nogil,
                       void* arg)
    int pthread_join(pthread_t t, void** ret)
