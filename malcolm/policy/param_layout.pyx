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


cdef object _where(AgentState s):
    """For each entry of the dense layout, its index in memory (-1: not held); the one
    statement of the mapping, which both directions read."""
    cdef int n = s.n, d = s.n_theta, me = s.me, a, j, w, b, wd
    if not s.sparse:
        return np.arange(s.n_params, dtype=np.intp)
    out = np.full(s.n_params, -1, dtype=np.intp)
    out[:d] = np.arange(d)
    for a in range(2):
        w = s.off_wm if a == 0 else s.off_ws
        b = s.off_bm if a == 0 else s.off_bs
        wd = d + a * (n * n + n)                    # the dense W block; its biases follow
        for j in range(n):
            out[wd + me * n + j] = w + s.wcol + j           # column me, W[me, me] included
            if j != me:
                out[wd + j * (n + 1)] = s._wd(w, j)         # the diagonal
            out[wd + n * n + j] = b + j
    return out


cdef object dense_of(AgentState s, const double* src):
    """A copy of ``src`` (laid out as ``s.P``) in the dense layout, as numpy."""
    where = _where(s)
    held = where >= 0
    out = np.zeros(s.n_params, dtype=np.float64)
    out[held] = np.asarray(<const double[:s.n_mem]> src)[where[held]]
    return out


cdef int from_dense(AgentState s, object dense, double* dst) except -1:
    """``dst`` (laid out as ``s.P``) <- ``dense`` (``n_params`` values in the dense layout);
    for the sparse actors the entries they do not hold are left out."""
    v = np.ascontiguousarray(dense, dtype=np.float64)
    if v.ndim != 1 or v.shape[0] != s.n_params:
        raise ValueError(f"expected {s.n_params} parameters, got {v.size}")
    where = _where(s)
    held = where >= 0
    np.asarray(<double[:s.n_mem]> dst)[where[held]] = v[held]
    return 0
