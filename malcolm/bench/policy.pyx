# cython: language_level=3
"""The actor-critic's micro-benchmarks (``malcolm bench policy``): native loops over the policy's
steps, one clock read per loop. See docs/performance.md ("Malcolm's policy (thesis Table 6.1)").
"""
import numpy as np

from libc.stdint cimport INT64_MAX, int64_t, uint32_t
from libc.string cimport memcpy, memset

from malcolm._core cimport cat_publish_probs, cat_update, mc_now_ns, softmax
from malcolm.policy.actor_critic cimport MalcolmPolicy
from malcolm.policy.base cimport Heartbeat

from malcolm.policy.actor_critic import THESIS


cdef inline void _bench_window(MalcolmPolicy p, const double[:, ::1] L,
                               Py_ssize_t it) noexcept nogil:
    # what a window's observe_* calls leave behind: new scaled loads, a few decisions
    cdef int n = p.n, j
    cdef int k = <int>(it & 63)
    for j in range(n):
        p.u[j] = L[k, j]
    p.cnt_mig[k % n] += 3
    p.cnt_mig[p.me] += 5
    p.cnt_stl[(k + 1) % n] += 1
    p.cnt_stl[p.me] += 7


def bench_policy(int n, Py_ssize_t iters=100_000, int repeats=1):
    """Time the policy's native steps at rack size ``n`` (loops in C, one clock read per loop).

    Each figure is the best of ``repeats`` loops of ``iters`` operations (the same state
    carried on from loop to loop). On the shared 2-core VM one loop of 200 000 operations
    was often slowed 1.5-2x by a neighbour for its whole length (a false "regression" at
    N = 4-16 in docs/performance.md); several shorter loops and the best of them do not.

    Returns a dict (ns per operation):

    ``dist_update_ns.N``
        one window's distribution work for both actors: ``n`` incremental logit updates
        (eq. 6.1) per actor plus a softmax and atomic publish per actor.
    ``param_update_ns.N``
        a full parameter update, counted per *batch-ending* window: features, payoff, TD
        error, critic and both actors' gradients into the cache, and the AdamW step over all
        parameters with the new weights handed to the distributions.
    ``param_grad_ns.N`` / ``adamw_ns.N``
        the two parts: the per-window cached-gradient step (what the other
        ``batch_windows - 1`` windows of a batch cost), and AdamW + handing the weights to the
        distributions (the difference of the two loops).
    ``decide_ns.N``
        one ``decide_arrival`` (sample from the published CDF).
    ``window_ns.N``
        the *default* policy's whole window: ``n - 1`` heartbeats, the own load and
        ``end_window`` (rescale check, learning step with AdamW every 16 windows, consensus
        every 16, publish); the keys above time Algorithm 1 (``THESIS``), whose steps the
        thesis's Table 6.1 reports.
    """
    if iters < 1:
        raise ValueError("iters must be >= 1")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    cdef MalcolmPolicy p = MalcolmPolicy(n, 0, seed=1, consensus_every=0,
                                         **{**THESIS, "batch_windows": 1 << 30})
    cdef int j, k, _r
    cdef Py_ssize_t it, _it
    cdef int64_t t0, t1, best
    # scaled loads (what the distributions see), a new random state every window
    loads_np = np.random.default_rng(7).uniform(0.0, 4.0, (64, n))
    cdef double[:, ::1] L = loads_np
    cdef double sink = 0.0
    out = {}
    # prime: every load known, a previous state exists
    for j in range(n):
        p._set_load(j, L[0, j] * p.load_scale)
    p._publish()
    best = INT64_MAX
    for _r in range(repeats):
        with nogil:
            t0 = mc_now_ns()
            for it in range(iters):
                k = <int>(it & 63)
                for j in range(n):
                    cat_update(&p.mig, j, L[k, j])
                    cat_update(&p.stl, j, L[k, j])
                softmax(p.mig.f, p.pm_pub, n)
                cat_publish_probs(&p.mig, p.pm_pub)
                softmax(p.stl.f, p.ps_pub, n)
                cat_publish_probs(&p.stl, p.ps_pub)
            t1 = mc_now_ns()
        best = min(best, t1 - t0)
    out[f"dist_update_ns.{n}"] = best / <double>iters

    # Each window: new loads and some decisions, so every gradient is non-zero (an all-zero
    # gradient would decay the Adam moments into denormals and time the wrong thing).
    best = INT64_MAX
    for _r in range(repeats):
        with nogil:
            t0 = mc_now_ns()
            for it in range(iters):
                _bench_window(p, L, it)
                p._learn_window()
                memcpy(p.feat_prev, p.feat_cur, sizeof(double) * p.n_theta)
                memcpy(p.u_pub, p.u, sizeof(double) * n)
            t1 = mc_now_ns()
        best = min(best, t1 - t0)
    out[f"param_grad_ns.{n}"] = best / <double>iters

    best = INT64_MAX
    for _r in range(repeats):
        with nogil:
            t0 = mc_now_ns()
            for it in range(iters):
                _bench_window(p, L, it)
                p._learn_window()
                memcpy(p.feat_prev, p.feat_cur, sizeof(double) * p.n_theta)
                memcpy(p.u_pub, p.u, sizeof(double) * n)
                p._apply_adamw()
                p._push_params()
            t1 = mc_now_ns()
        best = min(best, t1 - t0)
    out[f"param_update_ns.{n}"] = best / <double>iters
    out[f"adamw_ns.{n}"] = out[f"param_update_ns.{n}"] - out[f"param_grad_ns.{n}"]

    p._publish()
    best = INT64_MAX
    for _r in range(repeats):
        with nogil:
            t0 = mc_now_ns()
            for _it in range(iters):
                sink += p.decide_arrival(0, 0)
            t1 = mc_now_ns()
        best = min(best, t1 - t0)
    out[f"decide_ns.{n}"] = best / <double>iters
    if sink < 0:
        print(sink)
    out[f"window_ns.{n}"] = _bench_default_window(n, iters, loads_np, repeats)
    return out


def bench_window(int n, Py_ssize_t iters=20_000, int repeats=1):
    """``window_ns.N`` of :func:`bench_policy` alone (the default policy's whole window, ns),
    best of ``repeats`` loops of ``iters`` windows; the same loads as there. Cheap enough
    for N = 64, where Algorithm 1's O(N^2) figures are not wanted."""
    if iters < 1:
        raise ValueError("iters must be >= 1")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    loads_np = np.random.default_rng(7).uniform(0.0, 4.0, (64, n))
    return _bench_default_window(n, iters, loads_np, repeats)


def _bench_default_window(int n, Py_ssize_t iters, loads_np, int repeats=1):
    cdef MalcolmPolicy p = MalcolmPolicy(n, 0, seed=1)
    cdef double[:, ::1] L = loads_np
    cdef Heartbeat hb
    cdef Py_ssize_t it
    cdef int j, k
    cdef int64_t t0, t1, now = 0, best = INT64_MAX
    cdef double rate = 8.0 / 50_000.0
    cdef uint32_t seq = 0
    cdef int _r
    memset(&hb, 0, sizeof(Heartbeat))
    p.fill_heartbeat(&hb)           # a valid critic of the right length
    for _r in range(repeats):
        with nogil:
            t0 = mc_now_ns()
            for it in range(iters):
                k = <int>(it & 63)
                now += 100_000
                seq += 1
                for j in range(1, n):
                    hb.src = j
                    hb.seq = seq
                    hb.sent_ns = now - 2000
                    hb.load = L[k, j] * 50_000.0
                    hb.rate = rate
                    p.observe_peer(now, &hb)
                p.observe_local(now, L[k, 0] * 50_000.0, L[k, 0] * 8.0, rate)
                p.cnt_mig[k % n] += 3
                p.cnt_mig[0] += 5
                p.cnt_stl[(k + 1) % n] += 1
                p.end_window(now)
            t1 = mc_now_ns()
        best = min(best, t1 - t0)
    return best / <double>iters
