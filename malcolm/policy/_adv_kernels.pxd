# cython: language_level=3
"""The per-outcome loops of ``_marginal_advantages`` (``_adv_kernels.h``), declared once."""


cdef extern from "policy/_adv_kernels.h" nogil:
    ctypedef struct mc_adv_in:
        const double* srt
        const double* pre
        const double* fv
        const double* x
        const double* rate
        const double* pm
        const double* ps
        const int* pos
        const unsigned char* known
        int n, me, k, herd, do_mig, do_stl
        double inv, ls, norm, hq, hcs, mcost, scost, cstl, hop, hc, sme, vme, vs, fme, fme_up
    void mc_adv_outcomes(const mc_adv_in* a, double* am, double* st) noexcept nogil
    void mc_adv_set_scalar(int on) noexcept nogil
