# cython: language_level=3
"""The publish kernels of ``_pub_kernels.h``, declared once for the modules that call them
(``agent_state``, ``gateway_rules``, ``actor_critic``): branch-free C loops that vectorize."""
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "policy/_pub_kernels.h" nogil:
    int mc_pub_migrate_weights(const double* x, const double* rate, const uint8_t* known,
                               double* w, int n, int me, double ls, int capacity_prior,
                               double mask_factor, const uint16_t* code, int lg,
                               double t) noexcept nogil
    double mc_speed_ratio(int code, int lg) noexcept nogil
    double mc_speed_ratio_d(int d) noexcept nogil
    void mc_speed_tab_init() noexcept nogil
    void mc_pub_steal_bars(const double* x, int n, double xm, double r, double off, double hd,
                           double never, uint64_t* out) noexcept nogil
    int mc_pub_code_min(const uint16_t* code, int n) noexcept nogil
    void mc_pub_grant_share(const double* x, const double* rate, const uint16_t* code, int n,
                            int me, double t, int lg, double* sums) noexcept nogil
    double mc_busy_share(const double* x, const double* rate, const uint16_t* code, int n,
                         int me, double t, int lg) noexcept nogil
    void mc_pub_steal_weights(const double* x, const uint8_t* known, double* w, int n, int me,
                              int mask) noexcept nogil
    void mc_peer_moves(const uint64_t* last, uint64_t* base, int n, uint64_t cap,
                       uint64_t* mig, uint64_t* stl, uint64_t* big) noexcept nogil
    void mc_pub_scaled_loads(const double* x, double* u, int n, double ls,
                             double clip) noexcept nogil
    void mc_pub_actor_inputs(const double* u, const uint8_t* known, double* z, int n,
                             double zclip) noexcept nogil
    int mc_pub_peer_ages(uint32_t* seq, const uint8_t* known, double* f, int n, int me,
                         double now, double after) noexcept nogil
    void mc_pub_learned_logits(const double* A, const double* z, double* g, int n,
                               int me) noexcept nogil
    int mc_pub_count_pos(const double* a, int n) noexcept nogil
    int mc_pub_count_known(const uint8_t* known, int n) noexcept nogil
    int mc_pub_softmax_w(const double* g, const double* w, double* p, int n) noexcept nogil
