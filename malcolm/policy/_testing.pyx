# cython: language_level=3
"""Test support for ``MalcolmPolicy``: drive it and look inside it from Python.

Not public API: for the tests and the benchmark scripts only; names and signatures change
without notice. Heartbeats are delivered with ``Policy.py_observe_peer``.
"""
import numpy as np

from libc.math cimport exp2
from libc.stdint cimport int32_t, int64_t, uint32_t

from malcolm._core cimport cat_publish_probs, cat_set_params, softmax
from malcolm.policy.actor_critic cimport MalcolmPolicy
from malcolm.policy.param_layout cimport from_dense
from malcolm.policy._pub_kernels cimport mc_speed_ratio, mc_speed_tab_init
from malcolm.policy._select cimport mc_med_init, mc_median_rows

mc_speed_tab_init()
mc_med_init()


def step(MalcolmPolicy p, int64_t now, double own_load, peer_loads=None,
         peer_migrations=None, peer_steals=None, peer_thetas=None, rates=None):
    """Drive one window from Python: own load, one heartbeat per peer, end of window.

    ``peer_loads`` etc. are sequences of length ``n`` (the entry at ``me`` is ignored;
    ``None`` entries mean the peer's heartbeat was lost). ``rates`` (length ``n``, tasks
    per ns, own entry included) are the service rates reported with the loads (0 if
    omitted).
    """
    cdef int j
    if rates is not None and len(rates) != p.n:
        raise ValueError(f"rates must have length n={p.n}")
    p.observe_local(now, own_load, 0.0, 0.0 if rates is None else float(rates[p.me]))
    if peer_loads is not None:
        if len(peer_loads) != p.n:
            raise ValueError(f"peer_loads must have length n={p.n}")
        for j in range(p.n):
            if j == p.me or peer_loads[j] is None:
                continue
            p.py_observe_peer(
                now, j, float(peer_loads[j]),
                rate=0.0 if rates is None else float(rates[j]),
                theta=None if peer_thetas is None else peer_thetas[j],
                migrations=0 if peer_migrations is None else peer_migrations[j],
                steals=0 if peer_steals is None else peer_steals[j])
    p.end_window(now)


def sample_many(MalcolmPolicy p, str kind, Py_ssize_t count):
    """Make ``count`` gateway decisions in a native loop; return counts per outcome.

    ``kind`` is "arrival" or "steal" (for steal, index ``me`` counts "no steal").
    The GIL is released, so another thread may publish meanwhile.
    """
    out = np.zeros(p.n, dtype=np.int64)
    cdef int64_t[::1] o = out
    cdef Py_ssize_t _k
    cdef int a
    cdef bint arr
    if kind not in ("arrival", "steal"):
        raise ValueError("kind must be 'arrival' or 'steal'")
    if count < 0:
        raise ValueError("count must be >= 0")
    arr = kind == "arrival"
    with nogil:
        for _k in range(count):
            if arr:
                a = p.decide_arrival(0, 0)
            else:
                a = p.decide_steal(0)
                if a < 0:
                    a = p.me
            o[a] += 1
    return out


def publish_flip(MalcolmPolicy p, B_a, B_b, Py_ssize_t rounds):
    """Publish migrate biases ``B_a`` and ``B_b`` alternately, ``rounds`` times, nogil.

    For concurrency tests: readers must only ever see one of the two distributions.
    """
    a = np.ascontiguousarray(B_a, dtype=np.float64)
    b = np.ascontiguousarray(B_b, dtype=np.float64)
    if a.shape != (p.n,) or b.shape != (p.n,):
        raise ValueError(f"biases must have shape ({p.n},)")
    if p.sparse:        # the sparse actors keep no n x n W to hand the table
        raise ValueError("publish_flip needs the dense actors (actor='full')")
    cdef double[::1] av = a
    cdef double[::1] bv = b
    cdef Py_ssize_t r
    with nogil:
        for r in range(rounds):
            cat_set_params(&p.mig, p.P + p.off_wm, &av[0] if r % 2 == 0 else &bv[0])
            softmax(p.mig.f, p.pm_pub, p.n)
            cat_publish_probs(&p.mig, p.pm_pub)
    # The logits go back to the parameters; the last flipped table stays live until the
    # next publish.
    p._push_params()


def apply_adamw(MalcolmPolicy p, grad):
    """Apply one AdamW step with the given (descent) gradient, flat like ``params``.

    Any gradient cached by windows is replaced. For checking against a reference.
    """
    g = np.ascontiguousarray(grad, dtype=np.float64)
    if g.shape != (p.n_params,):
        raise ValueError(f"gradient must have shape ({p.n_params},)")
    cdef int i
    from_dense(p, g, p.G)           # the sparse actors' unused weights: no gradient
    for i in range(2 * p.n):
        p.gdiag[i] = 0.0        # what windows cached of the sparse diagonal: replaced too
    p.win_in_batch = 1
    p._apply_adamw()
    p._push_params()
    p._publish()


def consensus(MalcolmPolicy p):
    """Run the consensus step now (normally every ``consensus_every`` windows)."""
    p._consensus()


def actor_inputs(MalcolmPolicy p):
    """The sparse actors' inputs z at the current state, as the next publish computes them."""
    out = np.zeros(p.n, dtype=np.float64)
    cdef double[::1] o = out
    p._actor_inputs(&o[0])
    return out


def set_tilt(MalcolmPolicy p, double t):
    """Set the capacity tilt (``tilt_lr`` > 0) and republish."""
    p.tilt = t
    p._publish()


def speed_shift(MalcolmPolicy p):
    """``GatewayRules._speed_shift`` at the policy's current state: D (ns, <= 0)."""
    return p._speed_shift()


def speed_ratio(int code, int lg):
    """``mc_speed_ratio(code, lg)`` (its table, filled at this module's import) and
    ``exp2((code - lg) / 256)`` computed here."""
    return mc_speed_ratio(code, lg), exp2(<double>(code - lg) * (1.0 / 256.0))


def steal_bars(MalcolmPolicy p, double r, int64_t off, double hd):
    """Run ``GatewayRules._steal_thresholds(r, off, hd)``: the n bars, as signed numbers."""
    p._steal_thresholds(r, off, hd)
    return [<int32_t>(<uint32_t>p.steal_pub[j]) for j in range(p.n)]


def grant_bar(MalcolmPolicy p, double h):
    """Run ``GatewayRules._grant_bar(h)``: the published bar."""
    p._grant_bar(h)
    return p.grant_pub


def median_rows(values):
    """``mc_median_rows`` of ``values`` (k x d, k <= 64, d <= 8): the d column medians."""
    cdef double[:, ::1] v = np.ascontiguousarray(values, dtype=np.float64)
    cdef Py_ssize_t k = v.shape[0], d = v.shape[1], i, c
    cdef double[::1] r = np.zeros(64 * 8)
    cdef double[::1] out = np.zeros(d)
    if not (1 <= k <= 64 and 1 <= d <= 8):
        raise ValueError("1..64 rows of 1..8 values")
    for i in range(k):
        for c in range(d):
            r[i * 8 + c] = v[i, c]
    mc_median_rows(&r[0], <int>k, <int>d, &out[0])
    return np.asarray(out)
