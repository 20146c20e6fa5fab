# cython: language_level=3
"""The agent's guards (docs/policy.md, "The default policy"): what keeps learning from
running away, whatever its inputs.

* ``guard_actors``, after each AdamW step: a non-finite parameter resets the actors, the
  critic's norm stays within ``theta_bound``, and the actors stay in a trust region around
  the safe start;
* ``check_runaway``, at each window's end: an own queue that keeps growing far above the
  least loaded peer's resets the actors;
* ``reset_actors``: back to the safe start, with fresh AdamW moments (the critic is kept).

Functions of the agent's state (``AgentState``, whose fields they read and write), which
``MalcolmPolicy`` calls on its policy thread; apart from ``actor_critic.pyx``, which holds
how the agent learns, agrees and publishes.
"""
from libc.math cimport copysign, fabs, log, sqrt
from libc.string cimport memcpy, memset

from malcolm.policy.agent_state cimport ZCLIP, AgentState


cdef inline void _clip(AgentState a, int i, double r) noexcept nogil:
    """Parameter i back within r of its safe start (counted in ``trust_clips``)."""
    cdef double lo = a.P0[i] - r, hi = a.P0[i] + r
    if a.P[i] < lo:
        a.P[i] = lo
        a.trust_clips += 1
    elif a.P[i] > hi:
        a.P[i] = hi
        a.trust_clips += 1


cdef void reset_actors(AgentState a) noexcept nogil:
    """Back to the safe initial actors, with fresh AdamW moments (the critic is kept)."""
    cdef int d = a.n_theta, cnt = a.n_mem - a.n_theta
    memcpy(a.P + d, a.P0 + d, sizeof(double) * cnt)
    memset(a.M + d, 0, sizeof(double) * cnt)
    memset(a.V + d, 0, sizeof(double) * cnt)
    memset(a.G + d, 0, sizeof(double) * cnt)
    memset(a.gdiag, 0, sizeof(double) * 2 * a.n)
    a.tilt = a.tilt_g = a.tilt_m = a.tilt_v = 0.0
    a._push_params()
    a.resets += 1


cdef void check_runaway(AgentState a) noexcept nogil:
    """A runaway own queue (above 4x the least loaded known peer's + 16 own task times for
    ``runaway_windows`` windows, higher at their end than at their start): reset the actors
    to the start. 16 task times: 16 tasks a worker (docs/policy.md, item 16)."""
    cdef int n = a.n, j, me = a.me
    cdef double vmin = 1e300, vme, sme, t, r = a.adv[2 * n + me]
    cdef const double* x = a.x
    vme = x[me] / a.load_scale
    sme = max(a.n_workers, 1) / (r * a.load_scale) if r > 0.0 else 1.0  # a task time
    if vme > 16.0 * sme:            # else below the bar whatever the peers' loads (>= 0)
        for j in range(n):          # the least loaded known peer (loads <= LOAD_MAX_NS)
            t = x[j] if a.known[j] and j != me else 1e300
            vmin = t if t < vmin else vmin
        if vmin == 1e300:
            return                  # no known peer
    vmin /= a.load_scale
    if not (vme > 4.0 * vmin + 16.0 * sme):
        a.runaway_run = 0           # (already 0 with no known peer: a known one stays so)
        return
    if a.runaway_run == 0:
        a.runaway_last = vme     # where this run started
    a.runaway_run += 1
    if a.runaway_run >= a.runaway_windows:
        if vme > a.runaway_last:
            reset_actors(a)
        a.runaway_run = 0


cdef void guard_actors(AgentState a) noexcept nogil:
    """After each AdamW step: a trust region around the initial actors (|dB| <= trust,
    |dW| <= trust / load_clip, so no single input moves a logit by more than ``trust``);
    a non-finite parameter resets the actors; the critic's norm stays within theta_bound.
    """
    cdef int d = a.n_theta, npar = a.n_mem, i, j, k, nn = a.n * a.n
    cdef double r, nrm = 0.0, t = 0.0
    cdef double* P = a.P
    # Adam's step is finite for finite gradients; a NaN can only come from a bug or an
    # absurd input that got past the clamps, and then the safe start is the answer.
    for j in range(a.n):
        t += (P[a.off_bm + j] + P[a.off_bs + j] + P[a.off_wm + a.wcol + j]
              + P[a.off_ws + a.wcol + j])
    if a.sparse:
        for j in range(a.n):
            t += P[a._wd(a.off_wm, j)] + P[a._wd(a.off_ws, j)]
    else:
        for i in range(d, npar):
            t += P[i]
    t += a.tilt
    if not (t == t) or t > 1e300 or t < -1e300:
        reset_actors(a)
    if a.trust > 0.0 and a.use_tilt and fabs(a.tilt) > a.tilt_max:
        # |tilt| <= tilt_max (0.5: with rates skewed 16:1, |tl| <= 2.8, a logit moves by
        # at most 1.4 from the capacity shares, whichever way the tilt learns)
        a.tilt = copysign(a.tilt_max, a.tilt)
        a.trust_clips += 1
    for i in range(d):
        t = P[i]
        if not (t == t) or t > 1e300 or t < -1e300:
            memset(P, 0, sizeof(double) * d)
            memset(a.M, 0, sizeof(double) * d)
            memset(a.V, 0, sizeof(double) * d)
            nrm = 0.0
            break
        nrm += t * t
    nrm = sqrt(nrm)
    if nrm > a.theta_bound:
        for i in range(d):
            P[i] *= 0.99 * a.theta_bound / nrm
    if a.trust <= 0.0:
        return
    if not a.sparse:
        for i in range(d, npar):
            # [Wm | Bm | Ws | Bs]: W blocks are n*n long, B blocks n
            r = a.trust
            if (i - d) < nn or (a.off_ws <= i < a.off_bs):
                r = a.trust * 0.125
            elif i == a.off_bm + a.me:
                r = a.trust + log(<double>a.n)
            _clip(a, i, r)
        return
    # sparse: only the used entries (the others stay 0), O(n)
    for j in range(a.n):
        for i in range(2):
            k = a.off_wm if i == 0 else a.off_ws
            _clip(a, a._wd(k, j), a.trust / ZCLIP)
            _clip(a, k + a.wcol + j, a.trust / ZCLIP)
        _clip(a, a.off_bs + j, a.trust)
        if j == a.me and a.P[a.off_bs + j] > a.P0[a.off_bs + j]:
            # "do not steal": never more reluctant than the safe start (a steal request
            # that finds nothing costs a message, a missed one an idle worker)
            a.P[a.off_bs + j] = a.P0[a.off_bs + j]
            a.trust_clips += 1
        # accepting competes with n - 1 capacity shares: a wider range for its bias
        if j != a.me:
            _clip(a, a.off_bm + j, a.trust)
        else:
            # accepting: never below the safe start (which keeps at most a server's
            # capacity share); above it by up to trust + log n, so that a lightly loaded
            # rack learns to keep its tasks local and save the hop
            _clip(a, a.off_bm + j, a.trust + log(<double>a.n))
            if a.P[a.off_bm + j] < a.P0[a.off_bm + j]:
                a.P[a.off_bm + j] = a.P0[a.off_bm + j]
                a.trust_clips += 1
