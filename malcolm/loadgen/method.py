"""The measurement method of the experiment runner, as pure functions (unit-tested without a
rack): run order, the median and its confidence interval, the flags that keep a bad run out
of a result, the load correction, thread layout and time dilation, the racks' files and the
deltas of their counters.

Nothing here measures; :mod:`malcolm.loadgen.experiment` feeds it real reports.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass

from malcolm._units import ascii_number

# A run is flagged, and kept out of the median, when its generator was late for more than
# LATE_MAX of its sends or its effective load is more than LOAD_TOL off the target.
LATE_MAX = 0.01
LOAD_TOL = 0.03
# ... or more than OVERRUN_MAX of a dilating handler's calls overran their target.
OVERRUN_MAX = 0.01
# The largest time dilation the runner accepts (a 50 µs task then runs 0.5 s).
DILATE_MAX = 10_000


def parse_dilation(value):
    """``--dilate``: ``"auto"``, or a factor K in [1, DILATE_MAX] (returned as a float).

    Raises ValueError with a one-line message naming the flag; every front end (the demo,
    the figure scripts, :class:`~malcolm.loadgen.experiment.Experiment`) checks through here.
    """
    if value == "auto":
        return "auto"
    try:        # ASCII digits only, as every number of the CLI (float() read "５０")
        k = ascii_number(value)
    except (TypeError, ValueError):
        raise ValueError(f"--dilate {value!r} must be 'auto' or a number >= 1") from None
    if not 1 <= k <= DILATE_MAX:       # NaN fails this too
        raise ValueError(f"--dilate {value!r} must be in [1, {DILATE_MAX}]")
    return k


def run_order(policies, loads, repeat):
    """The order of the runs: repeats outermost, then loads, then the policies interleaved.

    ``[(repeat, load, policy), ...]``: at every load the policies take turns (ABCABC...), so
    a slow drift of the machine (other jobs, thermal state) touches every policy alike
    instead of whichever ran last.
    """
    return [(r, x, p) for r in range(repeat) for x in loads for p in policies]


def _binom_cdf(k, n):
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2.0 ** n


def median_ci(values, level=0.95):
    """Median of ``values`` and a distribution-free confidence interval for it.

    The interval is the order-statistic one: ``[x_(k), x_(n+1-k)]`` with the largest ``k``
    whose coverage ``1 - 2 P(Binomial(n, 1/2) <= k-1)`` is at least ``level``. With fewer
    than 6 values no pair reaches 95% and the interval is ``[min, max]``, whose coverage is
    returned (93.75% for 5 values), never silently claimed to be ``level``.

    Returns
    -------
    (median, lo, hi, coverage) : tuple of float
        ``nan`` everywhere for no values; ``coverage`` 0 for one value.
    """
    xs = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    n = len(xs)
    nan = float("nan")
    if n == 0:
        return nan, nan, nan, nan
    med = xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
    if n == 1:
        return med, xs[0], xs[0], 0.0
    best = 1
    for k in range(1, n // 2 + 1):
        if 1.0 - 2.0 * _binom_cdf(k - 1, n) >= level:
            best = k
    cov = 1.0 - 2.0 * _binom_cdf(best - 1, n)
    return med, xs[best - 1], xs[n - best], cov


def effective_load(offered_per_s, measured_mean_us, total_workers):
    """Arrival rate x measured mean service time / workers (``nan`` if unknown)."""
    if not (total_workers > 0 and math.isfinite(measured_mean_us)):
        return float("nan")
    return offered_per_s * measured_mean_us * 1e-6 / total_workers


# The statuses of tasks a rack refused for its load: each would have waited past what the
# rack or the client allows, so, like a timed-out task, it is missing from the tail.
REFUSED_FOR_LOAD = ("dropped", "overloaded", "timed_out")


def flags(late_fraction, eff_load, target, accounted=True, timed_out=0, overruns=0,
          padded=0, rejected=None):
    """Why a run must not enter a result (empty list: it may). ``overruns`` of ``padded``
    handler calls ended past their dilated target (a real handler's work took longer than
    the service time it pads to): more than ``OVERRUN_MAX`` of them and the service-time
    distribution is not the one the run claims. ``rejected``: the run's rejections by
    status name; those refused for the rack's load (:data:`REFUSED_FOR_LOAD`) flag it as
    timeouts do."""
    out = []
    if padded and overruns > OVERRUN_MAX * padded:
        out.append(f"{overruns} of {padded} handler calls overran their dilated service time "
                   f"(> {100 * OVERRUN_MAX:g}%)")
    if late_fraction > LATE_MAX:
        out.append(f"generator late for {100 * late_fraction:.1f}% of sends "
                   f"(> {100 * LATE_MAX:g}%)")
    if not math.isfinite(eff_load):
        out.append("effective load unknown (no completed task)")
    elif abs(eff_load - target) > LOAD_TOL:
        out.append(f"effective load {eff_load:.3f}, target {target:g} (off by more than "
                   f"{LOAD_TOL:g})")
    if not accounted:
        out.append("not every task accounted for")
    if timed_out:
        out.append(f"{timed_out} task(s) timed out (the tail is a lower bound)")
    refused = sum((rejected or {}).get(k, 0) for k in REFUSED_FOR_LOAD)
    if refused:
        out.append(f"{refused} task(s) refused by the rack for its load (the tail is a lower "
                   "bound)")
    return out


def hop_text(hop_us, k):
    """The banner's line on the per-hop delay ``hop_us`` (rack scale) at dilation ``k``."""
    if hop_us > 0:
        return (f"per-hop delay: {hop_us:g} µs at rack scale, added by every endpoint's "
                f"transport ({hop_us * k:g} µs real), on top of the loopback's own")
    return ("per-hop delay: none added (K = 1 or --hop-delay 0): the loopback's own, "
            "measured below")


#: The fewest tasks a run at the lowest load may draw on average: a p99 of fewer is a
#: maximum, and a run of none is a row of nothing.
MIN_RUN_TASKS = 100


def too_short(load, rate_per_s, duration_s):
    """Why runs of ``duration_s`` at ``load`` (``rate_per_s`` arrivals) are too short to give
    a p99, or None: ``demo --duration 1ns`` ran every run, flagged each "no completed task",
    and exited 0."""
    tasks = rate_per_s * duration_s
    if tasks >= MIN_RUN_TASKS:
        return None
    return (f"--duration {duration_s:g} s: a run at load {load:g} draws about {tasks:.3g} "
            f"tasks, and a p99 needs at least {MIN_RUN_TASKS}: give --duration "
            f"{MIN_RUN_TASKS / rate_per_s:.2g}s or more")


def sampling_note(load, rate_per_s, duration_s, scv, name, held=0.0):
    """A note for the banner where a run is too short for its effective load to stay within
    :data:`LOAD_TOL` of ``load`` by chance alone (None where it mostly does).

    A run of ``rate_per_s`` x ``duration_s`` tasks (Poisson arrivals; service times of
    squared coefficient of variation ``scv``) measures its effective load, the count times
    the sample mean, with a relative standard deviation of sqrt((1 + scv) / tasks): Bimodal
    (scv 2) on the demo's rack of 2, 2, 1, 1, 1 workers at 0.85 over 3 s is +/-0.024, and a
    fifth to a third of such runs were flagged and run again, a whole load at a time (the
    policies share their arrivals), which looks like a machine that cannot keep its load.
    Said once, before the runs, with the --duration that brings it under one in twenty (two
    standard deviations within the tolerance).

    ``held`` > 0: each run's draw is picked to offer its load within that fraction
    (:mod:`malcolm.loadgen.draws`), so chance no longer flags runs; the note says so."""
    tasks = rate_per_s * duration_s
    if not (tasks > 0 and math.isfinite(scv) and scv >= 0):
        return None
    sd = load * math.sqrt((1.0 + scv) / tasks)
    if 2.0 * sd <= LOAD_TOL:
        return None
    if held:
        return (f"draws: a {duration_s:g} s run at load {load:g} draws about {tasks:.0f} "
                f"{name} tasks, whose offered load varies by +/-{sd:.3f} (1 sd) by chance; "
                f"each run's draw is picked to offer its load within {100 * held:g}%")
    off = math.erfc(LOAD_TOL / sd / math.sqrt(2.0))       # P(|N(0, sd)| > LOAD_TOL)
    need_s = (2.0 * load / LOAD_TOL) ** 2 * (1.0 + scv) / rate_per_s
    return (f"note: a {duration_s:g} s run at load {load:g} draws about {tasks:.0f} {name} "
            f"tasks, so its effective load varies by +/-{sd:.3f} (1 sd) by chance alone: "
            f"about {100 * off:.0f}% of such runs will be flagged as off target by more than "
            f"{LOAD_TOL:g}; --duration {math.ceil(need_s):g}s would make it under 5%")


def corrected_rate(load, nominal_capacity, service_factor):
    """Arrival rate (tasks/s) that gives ``load`` when the handler's real mean service time
    is ``service_factor`` times the nominal one (1: no correction)."""
    f = service_factor if service_factor and math.isfinite(service_factor) else 1.0
    return load * nominal_capacity / f


def choose_dilation(trials):
    """The smallest dilation whose calibration run kept time.

    ``trials`` is ``[(K, ok), ...]`` in any order; returns the smallest ``K`` with ``ok`` or
    ``None``. A trial is ok when the generator stayed on schedule and the handler's mean
    service time stayed within tolerance (see :func:`calibration_ok`).
    """
    good = sorted(k for k, ok in trials if ok)
    return good[0] if good else None


def calibration_ok(late_fraction, measured_mean_us, requested_mean_us, accounted=True,
                   timed_out=0, check_service=True):
    """A calibration run keeps time: late sends <= 0.5% (half the limit a measured run is
    flagged at: one short JSQ run is not every policy's run), the measured mean service time
    within 3% of the requested one (the runner corrects the arrival rate for a slow handler,
    but not for one that is erratic), every task answered.

    ``check_service=False`` for a handler doing real work (``--app``): it has no requested
    service time to keep (its own is measured, and the arrival rate corrected for it, run by
    run; a run whose effective load is off is flagged as usual)."""
    if not (accounted and timed_out == 0 and late_fraction <= LATE_MAX / 2):
        return False
    if not check_service:
        return True
    if not (math.isfinite(measured_mean_us) and requested_mean_us > 0):
        return False
    return abs(measured_mean_us / requested_mean_us - 1.0) <= LOAD_TOL


DILATION_LADDER = (1, 2, 5, 10, 20, 50, 100, 200)


def search_dilation(try_k, ladder=DILATION_LADDER, start=20):
    """Binary search of ``ladder`` for the smallest K with ``try_k(K)`` true, assuming that a
    larger K never keeps time worse (less work per second). Starts at ``start`` (a good
    guess saves calibration runs). Returns ``(K or None, [(K, ok), ...])``.
    """
    lo, hi = 0, len(ladder) - 1          # the answer's index is in [lo, hi], or none
    trials = []
    found = None
    mid = ladder.index(start) if start in ladder else (lo + hi) // 2
    while lo <= hi:
        ok = bool(try_k(ladder[mid]))
        trials.append((ladder[mid], ok))
        if ok:
            found = mid
            hi = mid - 1
        else:
            lo = mid + 1
        mid = (lo + hi) // 2
    return (ladder[found] if found is not None else None), trials


def with_headroom(k, ladder=DILATION_LADDER):
    """The K to run at when calibration found ``k`` the smallest that keeps time: one rung
    up the ladder (the top rung stays). A 1 s calibration run of one rack at a quiet moment
    was too optimistic for the whole experiment: on the 2-vCPU machine (2026-11-23) K=20
    passed its calibration, then 15 of the demo's 24 runs and every run at 0.85 were
    flagged (late sends, a handler 10-16% slow) as the racks of all the policies took
    turns."""
    if k not in ladder:
        return k
    i = ladder.index(k)
    return ladder[min(i + 1, len(ladder) - 1)]


def dilate_workload(wl, k):
    """The workload spec with every service time multiplied by ``k`` (a ``mix:`` spec)."""
    if k == 1:
        return wl.name
    parts = []
    for c in wl.components:
        if c.kind in ("const", "exp"):
            parts.append(f"{c.weight!r}:{c.kind}:{c.a * k!r}")
        elif c.kind == "uniform":
            parts.append(f"{c.weight!r}:uniform:{c.a * k!r}:{c.b * k!r}")
        else:                       # lognormal: the mean scales, sigma is dimensionless
            parts.append(f"{c.weight!r}:lognormal:{c.a * k!r}:{c.b!r}")
    return "mix:" + ",".join(parts)


@dataclass
class Layout:
    """Where the threads go.

    ``poll`` is ``busy`` when every gateway, worker and client thread gets a core of its
    own (then ``server_cpus[k]`` lists server k's cores, gateway first, and ``client_cpus``
    the load generator's), else ``adaptive`` with nothing pinned.
    """

    poll: str
    server_cpus: list | None
    client_cpus: list | None
    client_threads: int
    reason: str


def layout(workers, cpus, rate_per_s, per_thread_rate=40_000.0):
    """Lay a rack's threads out on ``cpus`` (the CPUs this process may use).

    Every server needs one core for its gateway and one per worker (``workers = 0``: the
    gateway only); the policy thread sleeps between heartbeats and shares a worker's core.
    The load generator wants ``ceil(rate / per_thread_rate)`` threads and gets as many of
    them as there are cores left (at least one). One CPU is left for the runner and the
    kernel. Without a core for every server thread and one client thread nothing is pinned
    and everything polls adaptively (spinners sharing a core are time-sliced, which turns
    microseconds into milliseconds).
    """
    cpus = sorted(cpus)
    want = max(1, math.ceil(rate_per_s / per_thread_rate))
    need = sum(1 + max(0, w) for w in workers) + 1 + 1
    if len(cpus) < need:
        return Layout("adaptive", None, None, want,
                      f"{len(cpus)} CPUs < {need} needed for disjoint cores (gateways + "
                      "workers + a client thread + 1 spare): adaptive polling, nothing "
                      "pinned")
    free = cpus[1:]                 # the first is the spare
    server_cpus = []
    for w in workers:
        n = 1 + max(0, w)
        server_cpus.append(free[:n])
        free = free[n:]
    threads = max(1, min(want, len(free)))
    return Layout("busy", server_cpus, free[:threads], threads,
                  f"{len(cpus)} CPUs >= {need}: busy polling, every gateway, worker and "
                  f"client thread on a core of its own ({threads} client thread(s) of the "
                  f"{want} wanted)")


def summarize(runs, policies, loads, n_servers):
    """One row per (policy, load) of an experiment's ``runs``: the median p99 over the clean
    runs, with its confidence interval.

    Flagged runs never enter the median (a row whose every run is flagged shows the median
    of the flagged ones and ``valid: False``). ``repeats`` counts the repeats, ``attempts``
    every run including retries of flagged ones (``Experiment(retries=)``), ``used`` the
    runs in the median. ``late_fraction`` is the worst late-send fraction of the runs in the
    median, ``late_fraction_attempts`` the worst of all attempts; ``flagged`` lists every
    flagged attempt with its reasons.
    """
    out = []
    for p in policies:
        for load in loads:
            rs = [x for x in runs if x["policy"] == p and x["load"] == load]
            if not rs:
                continue
            clean = [x for x in rs if not x["flags"]]
            use = clean or rs
            med, lo, hi, cov = median_ci([x["p99_us"] for x in use])
            util = [median_ci([x["server_util"][j] for x in use
                               if x["server_util"][j] is not None])[0]
                    for j in range(n_servers)]
            out.append({
                "policy": p, "load": load, "p99_us": med, "p99_ci_us": [lo, hi],
                "ci_coverage": cov, "p50_us": median_ci([x["p50_us"] for x in use])[0],
                "late_fraction": max(x["late_fraction"] for x in use),
                "late_fraction_attempts": max(x["late_fraction"] for x in rs),
                "effective_load": median_ci([x["effective_load"] for x in use])[0],
                "repeats": len({x["repeat"] for x in rs}), "attempts": len(rs),
                "used": len(use), "valid": bool(clean),
                "flagged": [{"repeat": x["repeat"], "attempt": x.get("attempt", 0),
                             "why": x["flags"]} for x in rs if x["flags"]],
                "migrations_per_task": median_ci([x["migrations_per_task"] for x in use])[0],
                "steals_per_task": median_ci([x["steals_per_task"] for x in use])[0],
                "overruns": sum(x.get("overruns", 0) for x in rs),
                "padded": sum(x.get("padded", 0) for x in rs),
                "server_util": util})
    return out


def bucket_samples(buckets, n, k):
    """Up to ``n`` service times (µs, rack scale) drawn from histogram buckets (midpoints)."""
    total = sum(buckets.values())
    if not total:
        return []
    out = []
    for (lo, hi), c in sorted(buckets.items()):
        m = max(0, round(c * n / total))
        out += [(lo + hi) / 2 / 1e3 / k] * m
    return out


# An experiment rack's steal timeout (µs) and admission limit (ms) at K = 1, x K when dilated:
# admission is a time limit too, and undilated a K=200 rack refused tasks after 1 ms of rack
# time (20 services)
STEAL_TIMEOUT_US, MAX_WAIT_MS = 2000.0, 200.0
# Adaptive polling spins this long (real µs) before blocking, divided by K: a wake-up costs
# 25-50 µs real, which at K = 1 is what the spin saves and at K = 100 is 0.5 µs of rack
# time, while spinning 50 µs after every event would cost the 2-core machine half a core.
SPIN_US = 50.0


# The load generator's timeout is at least this many mean service times (rack scale).
TIMEOUT_MEANS = 400


def client_timeout_s(k, mean_us=0.0):
    """The load generator's timeout in an experiment at dilation ``k`` (real seconds): 1 s,
    20 ms of rack time, or :data:`TIMEOUT_MEANS` mean service times (``mean_us``, rack
    scale), whichever is longest. A task answered later is timed out, and a server refuses
    at once one it could not start before then; either flags its run (:func:`flags`), and
    the twin drops its seeds that would have been flagged. The mean's rule is for heavy
    tails: HyperExp-2 (387.5 µs) at K = 20 had 50 ms, 130 means, and po2's runs at 0.6 on a
    held-out rack had tasks past it in five of six; now 155 ms. It leaves Exp(50) as it was
    (20 ms = 400 x 50 µs)."""
    return max(1.0, 0.02 * k, TIMEOUT_MEANS * mean_us * 1e-6 * k)


def rack_times(k, window_us, hop_us):
    """An experiment rack's ``[rack]`` times at dilation ``k`` (:func:`rack_toml`'s keywords,
    real time) from the nominal ones."""
    return {"window_us": window_us * k, "steal_timeout_us": STEAL_TIMEOUT_US * k,
            "max_wait_ms": MAX_WAIT_MS * k, "hop_delay_us": hop_us * k, "spin_us": SPIN_US / k}


# The demo's policies: name -> (the servers' [policy] section, the clients' policy).
BASE_POLICIES = {
    "malcolm": ({"name": "malcolm", "seed": 1}, None),
    "jsq": ({"name": "jsq"}, None),
    "jbt": ({"name": "jbt"}, None),
    # accept everything, never steal: jbt with an unreachable threshold
    "po2": ({"name": "jbt", "threshold": 1e9}, "po2"),
}


def split_policy(spec):
    """A demo policy spec: ``"malcolm:learn=0"`` -> ``("malcolm", {"learn": 0})``.

    The parameters are checked here against the policy the user named, by ``malcolm
    sim``'s parser (its twin's), before they become lines of a rack file: a key that was no
    TOML key failed in words of that temporary file, a key given twice won silently, and
    ``jsq:name=random`` ran the random policy under jsq's label.

    Raises
    ------
    ValueError
        Not a demo policy, or ``--policy SPEC: why`` for its parameters.
    """
    from malcolm.policy.registry import parse_policy, spec_name
    base = spec_name(spec)              # case-insensitive, as sim's (JSQ was refused)
    if base not in BASE_POLICIES:
        raise ValueError(f"unknown policy {spec!r}; choose from "
                         f"{', '.join(BASE_POLICIES)} (with :key=value parameters)")
    try:
        _, params = parse_policy(spec, defaults=False)
        if base == "malcolm":
            # its class validates its own parameters: check them now rather than after
            # the servers read them (ac_params is pure Python: no native build needed)
            from malcolm.policy.ac_params import check_params
            check_params(params)
    except (TypeError, ValueError) as e:
        why = str(e).removeprefix(f"policy {spec!r}: ")      # the spec is said once
        raise ValueError(f"--policy {spec}: {why}") from None
    return base, params


def policy_roles(spec):
    """A demo policy spec's ``(base, the servers' [policy] section, the clients' policy
    spec or None)``: po2's parameters (``d``) are its clients', whose gateways only accept
    (they went to the gateways' jbt, which has no ``d``)."""
    base, params = split_policy(spec)
    section, client = BASE_POLICIES[base]
    if client is None:
        return base, dict(section, **params), None
    if params:
        client += ":" + ",".join(f"{k}={v!r}" for k, v in params.items())
    return base, dict(section), client


def experiment_rack(section, base, *, k, window_us, hop_us, **kw):
    """A demo policy's rack file at dilation ``k`` as a function of its servers (``kw``: the
    rest of :func:`rack_toml`'s keywords). Malcolm learns once per (dilated) window, unless
    the user's policy parameters say otherwise. Its ``load_scale`` is the default's, derived
    from the service rates the heartbeats report, as in the simulator: the demo set it to
    the dilated mean service time until the twenty-fourth session, from
    before the default derived it, so the demo did not run the default policy."""
    section = dict(section)
    if base == "malcolm":
        section.setdefault("window_ns", int(window_us * 1e3 * k))
    return functools.partial(rack_toml, section, **kw, **rack_times(k, window_us, hop_us))


def check_rack_times(k, window_us, hop_us):
    """None if a rack file takes :func:`rack_times` at dilation ``k``, else why not in the
    user's options: otherwise the first server refused its rack file after the banner, in
    words of a temporary file the user never named."""
    from malcolm.runtime.config import RACK_RANGES
    given = {"window_us": (f"--window {window_us:g} µs", "--window"),
             "hop_delay_us": (f"--hop-delay {hop_us:g} µs", "--hop-delay"),
             "steal_timeout_us": (f"the steal timeout ({STEAL_TIMEOUT_US:g} µs)", None),
             "max_wait_ms": (f"the admission limit ({MAX_WAIT_MS:g} ms)", None)}
    for key, v in rack_times(k, window_us, hop_us).items():
        lo, hi = RACK_RANGES[key]
        if key in given and not lo <= v <= hi:      # NaN fails this too
            what, flag = given[key]
            more = not v < lo
            unit = {"us": "µs"}.get(key.rsplit("_", 1)[1], "ms")
            fix = f"a {'shorter' if more else 'longer'} {flag} or " if flag else ""
            return (f"{what} at dilation K={k:g} is {v:g} {unit} in real time, outside a "
                    f"rack's {lo:g}..{hi:g} {unit}: give {fix}a "
                    f"{'smaller' if more else 'larger'} --dilate")
    return None


def check_rack_text(text, workers, what):
    """None if ``malcolm serve`` takes the rack file ``text(servers)`` (every check it
    makes before it binds, for the first server), else why not, after ``what`` (the user's
    options that made it)."""
    from malcolm.runtime.config import ConfigError, check_rack, parse_rack, tomllib
    servers = [(f"127.0.0.1:{20001 + i}", w) for i, w in enumerate(workers)]
    try:
        check_rack(parse_rack(tomllib.loads(text(servers)), what), [0])
    except (ConfigError, tomllib.TOMLDecodeError) as e:
        return str(e)
    return None


def rack_toml(policy, servers, *, window_us, poll="adaptive", handler="bench",
              steal_timeout_us=2000.0, name="exp", cpus=None, spin_us=50.0,
              hop_delay_us=0.0, max_wait_ms=200.0):
    """A rack file: ``servers`` is a list of (address, workers); ``hop_delay_us`` (real µs)
    is the delay every endpoint's transport adds to each message it sends; ``max_wait_ms``
    (real) the admission limit (the rack's default 200 ms, x K when dilated)."""
    lines = ["[rack]", f'name = "{name}"', 'transport = "udp"', f'poll = "{poll}"',
             f"window_us = {window_us!r}", f"spin_us = {spin_us!r}",
             f"hop_delay_us = {float(hop_delay_us)!r}",
             f"handler = {_toml(handler)}", "capacity = 4096",
             f"steal_timeout_us = {steal_timeout_us!r}", f"max_wait_ms = {max_wait_ms!r}",
             "grace_s = 1.0", "", "[policy]"]
    for k, v in policy.items():
        lines.append(f"{_toml_key(k)} = {_toml(v)}")
    for i, (addr, workers) in enumerate(servers):
        lines += ["", "[[server]]", f'address = "{addr}"', f"workers = {workers}"]
        if cpus:
            lines.append(f"cpus = {list(cpus[i])}")
    return "\n".join(lines) + "\n"


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    # JSON's escapes are TOML's, but for DEL, which TOML forbids raw in a string
    return json.dumps(str(v)).replace("\x7f", "\\u007f")


def _toml_key(k):
    """``k`` as a TOML key: bare if it can be, else quoted (a key the parameters let through
    must not become a statement of its own, or a second [rack] table)."""
    k = str(k)
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml(k)


def stats_delta(a, b):
    """A server's counters from its stats ``a`` to ``b`` (``--stats-json``; None if either
    is missing): messages, heartbeats, tasks, the service-time buckets and their sum, a
    dilating handler's own counters (``pad_*``)."""
    if a is None or b is None:
        return None
    keys = ("rx_msgs", "responses", "gateway_busy_ns", "hb_sent", "hb_recv", "hb_observed",
            "hb_dropped", "completed", "migrated_out", "stolen_in", "dropped_full")
    d = {k: b.get(k, 0) - a.get(k, 0) for k in keys}
    d["uptime_s"] = b.get("uptime_s", 0) - a.get("uptime_s", 0)
    sa, sb = a.get("service", {}), b.get("service", {})
    ca = {lo: c for lo, _, c in sa.get("buckets", [])}
    d["service_buckets"] = [[lo, hi, c - ca.get(lo, 0)] for lo, hi, c in sb.get("buckets", [])
                            if c - ca.get(lo, 0) > 0]
    d["service_sum_ns"] = sum((lo + hi) / 2 * c for lo, hi, c in d["service_buckets"])
    # a dilating handler's own counters (rocksdb: padded calls, overruns of their target)
    ha, hb = a.get("handler") or {}, b.get("handler") or {}
    for k in ("calls", "overruns", "cpu_ns", "target_ns", "wall_ns"):
        d["pad_" + k] = hb.get(k, 0) - ha.get(k, 0)
    # the policy's guards that fired (its stats(), under "policy"; none for the baselines)
    from malcolm.policy.guards import GUARDS
    pa, pb = a.get("policy") or {}, b.get("policy") or {}
    d["guards"] = {k: pb.get(k, 0) - pa.get(k, 0) for k, _ in GUARDS}
    return d


def guards_fired(delta):
    """The policy's guards that fired in a run, summed over its servers' ``stats_delta``s:
    ``{counter: count}`` for the counters above zero (empty: none fired)."""
    out = {}
    for d in delta:
        for k, v in ((d or {}).get("guards") or {}).items():
            if v > 0:
                out[k] = out.get(k, 0) + v
    return out
