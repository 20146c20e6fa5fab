# cython: language_level=3
"""The actors' parameters between their memory layout and the dense one the API shows.

``AgentState`` keeps its parameters, their AdamW moments and its cached gradients as
[theta | Wm | Bm | Ws | Bs] blocks of ``n_mem`` doubles (``agent_state.pxd``). The dense
actors hold each W as n x n, column-major; the sparse ones (the default) only what they use,
each W's diagonal and column ``me``, so that their per-batch AdamW steps and guards run over
contiguous memory. The Python API (``params``, ``grad_cache``, ``adam_moments``,
``W_migrate``, ``set_params``) and the tests' reference arithmetic keep the dense layout of
``n_params`` doubles: for the sparse actors every other entry of a W reads 0 and is not a
parameter (a value written there has no effect, as it never had).
"""
import numpy as np


cdef object dense_of(AgentState s, const double* src):
    """A copy of ``src`` (laid out as ``s.P``) in the dense layout, as numpy."""
    cdef int n = s.n, d = s.n_theta, me = s.me, a, j, w, b, wd
    out = np.zeros(s.n_params, dtype=np.float64)
    cdef double[::1] o = out
    if not s.sparse:
        for j in range(s.n_mem):
            o[j] = src[j]
        return out
    for j in range(d):
        o[j] = src[j]
    for a in range(2):
        w = s.off_wm if a == 0 else s.off_ws
        b = s.off_bm if a == 0 else s.off_bs
        wd = d + a * (n * n + n)                    # the dense W block; its biases follow
        for j in range(n):
            o[wd + me * n + j] = src[w + s.wcol + j]        # column me, W[me, me] included
            if j != me:
                o[wd + j * (n + 1)] = src[s._wd(w, j)]      # the diagonal
            o[wd + n * n + j] = src[b + j]
    return out


cdef int from_dense(AgentState s, object dense, double* dst) except -1:
    """``dst`` (laid out as ``s.P``) <- ``dense`` (``n_params`` values in the dense layout);
    for the sparse actors the entries they do not hold are left out."""
    cdef double[::1] v = np.ascontiguousarray(dense, dtype=np.float64)
    cdef int n = s.n, d = s.n_theta, me = s.me, a, j, w, b, wd
    if v.shape[0] != s.n_params:
        raise ValueError(f"expected {s.n_params} parameters, got {v.shape[0]}")
    if not s.sparse:
        for j in range(s.n_mem):
            dst[j] = v[j]
        return 0
    for j in range(d):
        dst[j] = v[j]
    for a in range(2):
        w = s.off_wm if a == 0 else s.off_ws
        b = s.off_bm if a == 0 else s.off_bs
        wd = d + a * (n * n + n)
        for j in range(n):
            dst[w + s.wcol + j] = v[wd + me * n + j]
            if j != me:
                dst[s._wd(w, j)] = v[wd + j * (n + 1)]
            dst[b + j] = v[wd + n * n + j]
    return 0
