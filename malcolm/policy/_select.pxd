# cython: language_level=3
"""The consensus's medians of ``_select.h``, declared once for the modules that call them
(``actor_critic``, ``_testing``); each calls ``mc_med_init`` at import."""


cdef extern from "policy/_select.h" nogil:
    void mc_median_rows(double* r, int k, int d, double* out) noexcept nogil
    void mc_med_init() noexcept nogil
