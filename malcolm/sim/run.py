"""Python front end of the rack simulator: configuration in, latency statistics out."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from malcolm.policy import registry
from malcolm.policy.defaults import (
    EST_ALPHA,
    MAX_STEALS_IN_FLIGHT,
    MAX_WINDOW_TASKS,
    STEAL_TIMEOUT_US,
    STEALS_IN_FLIGHT,
    WINDOW_SHRINK,
    WINDOW_TASKS,
)
from malcolm.sim._args import _json_safe, _number, _shares, _whole
from malcolm.sim.rack import MAX_SPEED, MIN_SPEED, Rack, parse_rack_spec
from malcolm.workloads import MAX_TIME_US, MIN_TIME_US, Workload, parse_workload


@dataclass(frozen=True)
class RackChange:
    """A change of the offered traffic or of a server at time ``t_us``.

    Exactly one of:

    * ``load``: new offered load, relative to the rack's *initial* capacity;
    * ``rate_tps``: new total arrival rate, tasks per second;
    * ``shares``: new per-server traffic shares (clients pick servers in these proportions);
    * ``server`` and ``speed``: new speed factor of one server (under FCFS a task already in
      service finishes at the old speed; under ideal PS the change is immediate).
    """

    t_us: float
    load: float | None = None
    rate_tps: float | None = None
    shares: tuple | None = None
    server: int | None = None
    speed: float | None = None


@dataclass
class SimResult:
    """Outcome of one run: summary statistics plus the raw per-task latencies."""

    config: dict
    p50_us: float
    p99_us: float
    p999_us: float
    p9999_us: float
    mean_us: float
    max_us: float
    throughput: float
    offered: float
    mean_load: list
    mean_queue: list
    utilization: list
    migrations: int
    steals: int
    steal_requests: int
    steal_empty: int
    heartbeats_lost: int
    generated: int
    completed: int
    measured: int
    sim_time_s: float
    events: int
    wall_s: float
    loop_s: float
    little_L: float
    latencies_us: np.ndarray = field(repr=False)
    types: np.ndarray = field(repr=False)
    service_us: np.ndarray = field(repr=False)
    per_server: dict = field(repr=False)
    loads: dict | None = field(default=None, repr=False)
    dropped: int = 0
    heartbeats_overrun: int = 0
    steal_suppressed: int = 0
    steal_timeouts: int = 0
    gateway_util: list | None = None
    #: Why ``throughput`` is NaN (a run too short to measure it); None when it is a number.
    throughput_note: str | None = None
    #: The measured tasks' drawn service times over what the arrival rate asks of the time
    #: they were sent in (1: the run offered its load exactly; NaN with any ``changes``).
    offered_work_ratio: float = math.nan
    #: Per server, its policy's counters and guards (``stats()``: Malcolm's runaway resets,
    #: refused critics, clamps...), where the policy has them; else None.
    policy_stats: list | None = field(default=None, repr=False)

    @property
    def events_per_s(self) -> float:
        """Simulated events per CPU second of the engine's event loop (one core)."""
        return self.events / self.loop_s if self.loop_s > 0 else float("nan")

    def summary(self) -> dict:
        """JSON-ready dict: ``p50_us``, ``p99_us``, ``p999_us``, ``mean_us``, ``throughput``
        (null in a run too short to measure it, ``throughput_note`` saying why),
        ``mean_load`` (per server, µs of expected wait), ``migrations``, ``steals``, ...,
        and ``config``."""
        keys = ("p50_us", "p99_us", "p999_us", "p9999_us", "mean_us", "max_us", "throughput",
                "offered", "mean_load", "mean_queue", "utilization", "migrations", "steals",
                "steal_requests", "steal_empty", "heartbeats_lost", "generated", "completed",
                "measured", "sim_time_s", "events", "wall_s", "loop_s", "dropped",
                "heartbeats_overrun", "steal_suppressed", "steal_timeouts", "gateway_util",
                "throughput_note", "offered_work_ratio", "policy_stats")
        out = {k: _json_safe(getattr(self, k)) for k in keys}
        out["events_per_s"] = _json_safe(self.events_per_s)
        out["config"] = _json_safe(self.config)
        return out

    def quantile_us(self, q: float) -> float:
        return float(np.quantile(self.latencies_us, q))


#: The servers' window phases (``simulate(phase=...)``).
PHASES = ("random", "staggered", "aligned")
#: ``simulate``'s load when neither ``load`` nor ``rate_tps`` is given.
DEFAULT_LOAD = 0.5


def _phases(mode, n, window_ns, seed):
    if mode == "aligned":
        return [0.0] * n
    if mode == "staggered":
        return [s * window_ns / n for s in range(n)]
    rng = np.random.default_rng([seed, 0x9A5E])             # "random" (_plan checked it)
    return list(rng.uniform(0, window_ns, n))


def _check_time(label, us):
    """A time in µs: finite, within 0 - :data:`MAX_TIME_US`."""
    if not (math.isfinite(us) and 0 <= us <= MAX_TIME_US):
        raise ValueError(f"{label} must be within 0-{MAX_TIME_US:g} µs (1 s), got {us}")


def _check_quantum(label, us):
    """A round-robin quantum: a time (:func:`_check_time`) that is 0 (ideal PS) or at least
    one ns, the clock's step (below it the engine's quantum was 0 ns and round robin never
    moved on: the run hung)."""
    _check_time(label, us)
    if 0 < us < MIN_TIME_US:
        raise ValueError(f"{label} must be 0 (ideal PS) or at least {MIN_TIME_US:g} µs "
                         f"(1 ns), got {us}")


def _check_slices(label, quantum_us, wl, rk, tasks):
    """Round robin cuts each task into quanta, an event each: refuse a quantum that makes
    the run more than :data:`MAX_QUANTA` of them (a 1 ns quantum on 1 s tasks: 10^9 a task,
    the run never ended)."""
    if quantum_us > 0:
        per_task = wl.mean_us / min(rk.speeds) / quantum_us
        if tasks * per_task > MAX_QUANTA:
            raise ValueError(f"{label}: a quantum of {quantum_us:g} µs cuts a mean task of "
                             f"{wl.mean_us:g} µs into {per_task:.3g} quanta, {tasks} tasks "
                             f"into more than {MAX_QUANTA:.0e} events: give a longer quantum, "
                             "or 0 (ideal processor sharing)")


def _check_gateway_keeps_up(gateway_ns, rk, wl, window_us, window_tasks):
    """Each server's gateway handles 2 (n - 1) heartbeat messages a window (its n - 1 copies
    out, one in from each peer) before any task. At a cost per message that fills the window
    with them its backlog, and the engine's events, grow without end (100 ms a message on 2
    servers: 2 GB in 20 s, never done). The window is the shortest a server runs: window_tasks
    of its task times, within [window / WINDOW_SHRINK, window] (``drv_window_ns``)."""
    msgs = 2 * (rk.n - 1)
    if gateway_ns <= 0 or msgs == 0:
        return
    win = window_us
    if window_tasks > 0:
        win = min(max(window_tasks * wl.mean_us / max(rk.speeds), window_us / WINDOW_SHRINK),
                  window_us)
    if msgs * gateway_ns >= win * 1e3:
        raise ValueError(f"gateway_ns: {gateway_ns:g} ns a message fills the gateways with "
                         f"heartbeats alone ({msgs} a window of {win:.3g} µs on each of "
                         f"{rk.n} servers): at most {win * 1e3 / msgs:.3g} ns here")


def _check_windows(rk, tasks, rate, window_us):
    """A server policy's rack ends a window on every server about every ``window_us`` (an
    idle server goes back to it), each with a heartbeat to every peer: about n^2 events a
    window, whatever the tasks. Refuse a run of more than :data:`MAX_WINDOW_EVENTS` (about
    100 ns each on this project's 2-core VM: 50 one-second tasks on a server of speed 0.001
    ran for tens of minutes, a rack of them for days)."""
    sim_ns = tasks / rate
    events = sim_ns / (window_us * 1e3) * rk.n * rk.n
    if events > MAX_WINDOW_EVENTS:
        raise ValueError(f"{tasks} tasks last about {sim_ns * 1e-9:.3g} s of simulated time: "
                         f"{sim_ns / (window_us * 1e3):.3g} policy windows of {window_us:g} "
                         f"µs on {rk.n} servers, about {events:.2g} window and heartbeat "
                         f"events, more than {MAX_WINDOW_EVENTS:.0e}: give fewer tasks or "
                         "a longer window")


def _check_rate(rate, capacity, tasks, what):
    """An arrival rate (tasks per ns), the run's or a change's: > 0, at most :data:`MAX_LOAD`
    times the rack's ``capacity``, and slow enough no more than that ``tasks`` at it fit
    :data:`MAX_SIM_NS` (the 64-bit ns clock: a load of 1e-300 overflowed it). ``what`` starts
    the message."""
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"{what}: the arrival rate must be > 0")
    if rate > MAX_LOAD * capacity:
        raise ValueError(f"{what}: load must be at most {MAX_LOAD:g} (that many times the "
                         f"rack's capacity), got {rate / capacity:.3g}")
    if tasks / rate > MAX_SIM_NS:
        raise ValueError(f"{what}: {tasks} tasks at load {rate / capacity:.3g} would take "
                         f"about {tasks / rate * 1e-9:.3g} s of simulated time, at most "
                         f"{MAX_SIM_NS * 1e-9:g} s: raise the load or lower the tasks")


def _check_mechanics(info, gateway_ns, capacity, max_steals, steal_timeout_us, prior_us, ewma):
    """Validate the runtime mechanics' parameters; return them normalised."""
    gateway_ns = _number("gateway_ns", gateway_ns)
    if not (math.isfinite(gateway_ns) and 0 <= gateway_ns <= MAX_TIME_US * 1e3):
        # beyond a second per message the engine's ns clock overflowed (the cost vanished)
        raise ValueError(f"gateway_ns must be within 0-{MAX_TIME_US * 1e3:g} ns (1 s), "
                         f"got {gateway_ns}")
    if gateway_ns > 0 and info.kind == "central":
        raise ValueError(f"gateway_ns: {info.name} is an ideal reference without gateways; "
                         "a gateway cost applies to server and client policies")
    capacity = _whole("capacity", capacity, 1, MAX_TASKS, optional=True,
                      unit=" tasks per server")
    if capacity is not None and info.sim_mode == "cfcfs":
        raise ValueError(f"capacity: {info.name} has one rack-wide queue, no per-server "
                         "slots")
    max_steals = _whole("max_steals_in_flight", max_steals, 0, MAX_STEALS_IN_FLIGHT,
                        unit=" (0: unlimited)")
    # a time the engine keeps in ns: beyond 1 s it overflowed and every steal was given up
    # at once; below 1 ns it is 0
    for label, us in (("steal_timeout_us", steal_timeout_us), ("prior_service_us", prior_us)):
        us = _number(label, us, optional=label == "prior_service_us")
        if us is not None and not (math.isfinite(us) and MIN_TIME_US <= us <= MAX_TIME_US):
            raise ValueError(f"{label} must be within {MIN_TIME_US:g}-{MAX_TIME_US:g} µs, "
                             f"got {us}")
    ewma = _number("ewma", ewma)
    if not (math.isfinite(ewma) and 0 < ewma <= 1):
        raise ValueError(f"ewma must be in (0, 1], got {ewma}")
    return gateway_ns, capacity, max_steals


# per run: the engine keeps about 30 bytes per task (latency, send time, type, service, drop)
MAX_TASKS = 100_000_000
#: The run's simulated time, ns (11.6 days): the clock is a 64-bit count of ns, and a load
#: of 1e-300 overflowed it (negative latencies).
MAX_SIM_NS = 1e15
#: Arrivals at most this many times the rack's capacity.
MAX_LOAD = 100.0
#: Round robin's quanta in a run at most (an event each: a minute or so of the engine).
MAX_QUANTA = 1e9
#: A server policy's window and heartbeat events in a run at most (:func:`_check_windows`;
#: 20 minutes or so of the engine; the 64x1 400 000-task run has 1.4e7).
MAX_WINDOW_EVENTS = 1e10
#: The policy window (µs): at least 1 µs, at most :data:`MAX_TIME_US`.
MIN_WINDOW_US = 1.0
#: Clients of a run (each keeps its own policy object).
MAX_CLIENTS = 65536
#: Heartbeats in flight: the engine keeps (delay + jitter) / window + 2 of them per server
#: (2 KiB each), so the hop is at most this many windows.
MAX_HB_WINDOWS = 1000


def simulate(rack="8x8", policy="random", workload="exp:50", load=None, tasks=100_000,
             seed=1, delay_us=2.0, jitter_us=0.0, window_us=100.0, sched="fcfs",
             quantum_us=0.0, shares=None, loss=0.0, clients=None, warmup=0.1, ewma=EST_ALPHA,
             phase="random", record_loads=False, changes=(), rate_tps=None,
             policy_params=None, gateway_ns=0.0, capacity=None,
             max_steals_in_flight=STEALS_IN_FLIGHT, steal_timeout_us=STEAL_TIMEOUT_US,
             prior_service_us=None, window_tasks=WINDOW_TASKS) -> SimResult:
    """Simulate one rack configuration.

    Parameters
    ----------
    rack : str or Rack
        Rack spec, e.g. ``"8x8"``, ``"2x16,14x2"``, ``"2x14@2.0,9x4"``.
    policy : str
        Policy spec ``name[:key=value,...]`` (see :mod:`malcolm.policy.registry`):
        server policies (``random``, ``jsq``, ``jbt``, ``jiq``, ``sed``, ``steal``,
        ``malcolm``), the client policy ``po2``, or the ideal references ``cfcfs`` and
        ``racksched``.
    workload : str or Workload
        Workload name or mixture (see :mod:`malcolm.workloads`).
    load : float, optional
        Offered load relative to rack capacity, sum(workers * speed) / mean service time;
        default 0.5 (:data:`DEFAULT_LOAD`). Not with ``rate_tps``.
    tasks : int
        Tasks whose latency counts (the first ``warmup`` fraction of them is dropped); a
        whole number (``2.0`` is 2, ``1.5`` an error).
    seed : int
        Everything random derives from it; a run is a pure function of its arguments.
    delay_us, jitter_us : float
        One-way network delay of every message, plus a uniform [0, jitter) extra.
    window_us : float
        Load-broadcast (and policy) window: the longest; see ``window_tasks``.
    window_tasks : float
        A server's window is this many of its own measured task times, within
        [``window_us`` / 5, ``window_us``] (the runtime's rule, ``policy/driver.pxd``); 0:
        every window is ``window_us``. Default ``malcolm.policy.defaults.WINDOW_TASKS``.
    sched : str
        ``fcfs`` or ``ps`` inside each server; with ``ps``, ``quantum_us`` > 0 is round robin
        with that quantum and 0 is ideal processor sharing.
    shares : sequence of float, optional
        Fraction of the client traffic sent to each server (default uniform).
    loss : float
        Probability that a heartbeat is lost (tasks and steal messages are never lost).
    clients : int, optional
        Number of clients (default: one per server). Matters for client policies.
    warmup : float
        Fraction of the first tasks excluded from the statistics.
    ewma : float
        Weight of a new sample in the load estimator's moving averages (default
        ``malcolm.policy.defaults.EST_ALPHA``, the runtime's too).
    phase : str
        Window phases of the servers: ``random`` (default), ``staggered`` or ``aligned``.
    record_loads : bool
        Also return every server's state at each of its windows: ``result.loads`` is a dict
        with ``t_us`` (row r is every server's r-th window, about r x window after the
        start; phases differ by less than a window), ``load_us`` (the estimator's load, what
        the policy saw), ``queue`` (true tasks in the server) and ``true_load_us`` (true
        tasks x mean service time / (workers x speed): the load a perfect estimator would
        report), each of shape (windows, servers).
    changes : sequence of RackChange or dict
        Changes of load, rate, shares or server speed at given times.
    rate_tps : float, optional
        Total arrival rate in tasks per second, instead of ``load`` (giving both is an
        error).
    policy_params : dict, optional
        Extra policy parameters (merged over those in the policy spec).
    gateway_ns : float
        CPU time, ns, of a server's gateway per message: each message a server receives
        (a task from a client, a forwarded task, a steal request or reply, a heartbeat) and
        each it originates (a response, one heartbeat copy per peer) waits for the gateway,
        a single FIFO server, and is handled when the gateway is done with it. 0 (default):
        gateways are infinitely fast. Not for ``cfcfs``/``racksched``.
    capacity : int, optional
        Tasks a server holds at most (waiting + in service), as the runtime's task slots; a
        task that finds its server full is dropped and answered at once (``dropped``; not
        in the latency statistics). Default: unbounded.
    max_steals_in_flight : int
        Steal requests a server may have outstanding (default 1, as the runtime); while that
        many are, ``decide_steal`` is still asked but its steal is not sent
        (``steal_suppressed``). 0: unlimited, the simulator's model before the runtime's
        mechanics were added.
    steal_timeout_us : float
        A steal request unanswered this long is given up (``steal_timeouts``); its reply,
        if it comes, still brings its task.
    prior_service_us : float, optional
        Service time the estimator assumes before a worker's first completion of a type;
        default: the workload's mean.

    Numbers are ints or floats (numpy's too), never bools or strings; counts (``tasks``,
    ``clients``, ``capacity``, ``max_steals_in_flight``) whole numbers.

    Returns
    -------
    SimResult

    Raises
    ------
    ValueError
        Naming the argument that is out of its range (or ``load`` with ``rate_tps``).
    TypeError
        Naming the argument of the wrong type (``tasks="100"``, ``load=True``).
    """
    plan = _plan(dict(
        rack=rack, policy=policy, workload=workload, load=load, tasks=tasks, seed=seed,
        delay_us=delay_us, jitter_us=jitter_us, window_us=window_us, sched=sched,
        quantum_us=quantum_us, shares=shares, loss=loss, clients=clients, warmup=warmup,
        ewma=ewma, phase=phase, record_loads=record_loads, changes=changes,
        rate_tps=rate_tps, policy_params=policy_params, gateway_ns=gateway_ns,
        capacity=capacity, max_steals_in_flight=max_steals_in_flight,
        steal_timeout_us=steal_timeout_us, prior_service_us=prior_service_us,
        window_tasks=window_tasks))
    eng = _build_engine(plan)
    t0 = time.perf_counter()
    raw = eng.run()
    return _assemble(plan, raw, time.perf_counter() - t0)


def check_simulate(**kwargs) -> None:
    """Check the arguments of :func:`simulate` as it would, without running it (a sweep
    checks every point before its first run, not after hours of them).

    Raises
    ------
    ValueError
        Naming the bad argument; TypeError for an unknown one or one of the wrong type.
    """
    bound = inspect.signature(simulate).bind(**kwargs)
    bound.apply_defaults()
    _plan(dict(bound.arguments))


@dataclass
class _Plan:
    """A validated run: the caller's arguments (``args``, for the result's config) and what
    the engine needs, in its units (ns, tasks per ns, engine enums)."""

    args: dict
    rack: Rack
    workload: Workload
    params: dict                # the policy's parameters, converted
    tasks: int
    n_warm: int
    load: float
    rate: float                 # tasks per ns
    capacity: float             # the rack's capacity, tasks per ns
    n_clients: int
    gateway_ns: float
    slots: int | None           # tasks per server (None: unbounded)
    max_steals: int
    changes: list               # (t_ns, kind, server, value, shares) sorted by time
    shares: list                # per server
    engine: dict = field(default_factory=dict)     # policy-specific Engine arguments


def _plan(a: dict) -> _Plan:
    """Check every argument of :func:`simulate`; raise ValueError naming the bad one
    (TypeError for one of the wrong type)."""
    a = _typed(a)
    rk: Rack = parse_rack_spec(a["rack"])
    wl: Workload = parse_workload(a["workload"])
    name, params = registry.parse_policy(a["policy"])
    if a["policy_params"]:
        params = {**params, **a["policy_params"]}
        if registry.POLICIES[name].params is not None:
            params = registry.check_params(name, params)
        else:       # what parse_policy refuses of a spec (seed: "multiple values for ...")
            for key in a["policy_params"]:
                registry.check_free_key(f"{a['policy']} with policy_params", name, key)
    info = registry.POLICIES[name]
    # each component's times are in range (Component checks them), not always the mean's
    # (uniform:0:0.001 is 0.5 ns)
    if not MIN_TIME_US <= wl.mean_us <= MAX_TIME_US:
        raise ValueError(f"workload {wl.name!r}: mean service time {wl.mean_us:g} µs, must be "
                         f"within {MIN_TIME_US:g}-{MAX_TIME_US:g}")
    tasks = _whole("tasks", a["tasks"], 1, MAX_TASKS)
    if not 0.0 <= a["warmup"] < 1.0:
        raise ValueError(f"warmup must be in [0, 1), got {a['warmup']}")
    seed = a["seed"]
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be a whole number in 0..2^64-1, got {seed!r}")
    for label in ("delay_us", "jitter_us"):
        _check_time(label, a[label])
    _check_quantum("quantum_us", a["quantum_us"])
    if not (math.isfinite(a["window_us"]) and MIN_WINDOW_US <= a["window_us"] <= MAX_TIME_US):
        raise ValueError(f"window_us must be within {MIN_WINDOW_US:g}-{MAX_TIME_US:g} µs, "
                         f"got {a['window_us']}")
    wt = a["window_tasks"]
    if not (math.isfinite(wt) and 0.0 <= wt <= MAX_WINDOW_TASKS):
        raise ValueError(f"window_tasks must be within 0-{MAX_WINDOW_TASKS:g}, got {wt!r}")
    if a["delay_us"] + a["jitter_us"] > MAX_HB_WINDOWS * a["window_us"]:
        raise ValueError(f"delay_us + jitter_us = {a['delay_us'] + a['jitter_us']:g} µs is "
                         f"more than {MAX_HB_WINDOWS} policy windows of {a['window_us']:g} "
                         "µs: a heartbeat that old carries nothing (and the engine would "
                         "keep that many per server)")
    if not 0.0 <= a["loss"] < 1.0:
        raise ValueError(f"loss must be in [0, 1), got {a['loss']}")
    if a["sched"] not in ("fcfs", "ps"):
        raise ValueError(f"sched must be fcfs or ps, got {a['sched']!r}")
    if a["phase"] not in PHASES:
        raise ValueError(f"phase must be {', '.join(PHASES)}, got {a['phase']!r}")
    gateway_ns, slots, max_steals = _check_mechanics(
        info, a["gateway_ns"], a["capacity"], a["max_steals_in_flight"],
        a["steal_timeout_us"], a["prior_service_us"], a["ewma"])
    capacity = rk.capacity / (wl.mean_us * 1e3)         # tasks per ns
    if a["rate_tps"] is not None:
        rate = a["rate_tps"] * 1e-9
        load = rate / capacity
        what = f"rate_tps {a['rate_tps']:g}"
    else:
        load = DEFAULT_LOAD if a["load"] is None else a["load"]
        if not (math.isfinite(load) and load > 0):
            raise ValueError(f"load must be {'> 0' if math.isfinite(load) else 'finite'}, "
                             f"got {load}")
        rate = load * capacity
        what = f"load {load:g}"
    _check_rate(rate, capacity, tasks, what)
    if a["sched"] == "ps":
        _check_slices("quantum_us", a["quantum_us"], wl, rk, tasks)
    if info.kind == "server":
        _check_gateway_keeps_up(gateway_ns, rk, wl, a["window_us"], a["window_tasks"])
        _check_windows(rk, tasks, rate, a["window_us"])
    n_clients = _whole("clients", a["clients"], 1, MAX_CLIENTS, optional=True) or rk.n
    plan = _Plan(args=a, rack=rk, workload=wl, params=params, tasks=tasks,
                 n_warm=int(tasks * a["warmup"]), load=float(load), rate=rate,
                 capacity=capacity, n_clients=n_clients, gateway_ns=gateway_ns, slots=slots,
                 max_steals=max_steals, changes=_changes(a["changes"], rk.n, capacity, tasks),
                 shares=_shares(a["shares"], rk.n))
    plan.engine = _POLICY_SETUP[info.kind](plan, info)
    return plan


def _typed(a: dict) -> dict:
    """The arguments with their types checked and numbers made floats (the range checks
    compare them; a string failed there with a bare TypeError from inside)."""
    a = dict(a)
    for label in ("delay_us", "jitter_us", "window_us", "quantum_us", "loss", "warmup",
                  "window_tasks"):
        a[label] = _number(label, a[label])
    for label in ("load", "rate_tps"):
        a[label] = _number(label, a[label], optional=True)
    if a["load"] is not None and a["rate_tps"] is not None:
        # one of them was dropped silently: both set the arrival rate
        raise ValueError(f"give load or rate_tps, not both (load {a['load']:g}, rate_tps "
                         f"{a['rate_tps']:g}): each sets the arrival rate")
    if not isinstance(a["record_loads"], (bool, np.bool_)):
        raise TypeError(f"record_loads must be True or False, got {a['record_loads']!r}")
    if a["policy_params"] is not None and not isinstance(a["policy_params"], Mapping):
        raise TypeError(f"policy_params must be a dict, got {a['policy_params']!r}")
    if a["changes"] is None:
        a["changes"] = ()
    if isinstance(a["changes"], str) or not isinstance(a["changes"], Sequence):
        raise TypeError(f"changes must be a list of RackChange (or dicts of its fields), got "
                        f"{a['changes']!r}")
    return a


def _sched_kind(sched, quantum_us):
    """The engine's scheduler: FCFS, or PS with a quantum (round robin), or ideal PS."""
    from malcolm.sim._engine import SCHED_FCFS, SCHED_PS, SCHED_RR

    if sched == "fcfs":
        return SCHED_FCFS
    return SCHED_RR if quantum_us > 0 else SCHED_PS


def _setup_server(plan: _Plan, info) -> dict:
    """Server policies: one per server, all servers in the distributed mode."""
    from malcolm.sim._engine import MODE_DIST

    a, params = plan.args, plan.params
    if info.window_param and info.window_param not in params:
        # the policy learns once per window: the simulator's window unless told
        params = plan.params = {**params, info.window_param: int(round(a["window_us"] * 1e3))}
    return dict(mode=MODE_DIST, sched=_sched_kind(a["sched"], a["quantum_us"]),
                quantum_ns=a["quantum_us"] * 1e3,
                policies=[registry.make_policy(info.name, plan.rack.n, s, a["seed"], **params)
                          for s in range(plan.rack.n)])


def _setup_client(plan: _Plan, info) -> dict:
    """Client policies: one per client; servers accept every task."""
    from malcolm.sim._engine import MODE_DIST

    a = plan.args
    return dict(mode=MODE_DIST, sched=_sched_kind(a["sched"], a["quantum_us"]),
                quantum_ns=a["quantum_us"] * 1e3,
                clients=[registry.make_client_policy(info.name, plan.rack.n, a["seed"], c,
                                                     **plan.params)
                         for c in range(plan.n_clients)])


def _setup_central(plan: _Plan, info) -> dict:
    """An ideal centralized reference: the registry names the engine mode that implements
    it (``sim_mode``); its parameters set the scheduler (``delay``: scheduler-server delay;
    ``d``: servers sampled; ``sched``/``quantum``: scheduling inside servers)."""
    from malcolm.sim import _engine

    p, n = plan.params, plan.rack.n
    delay_us = float(p.get("delay", 0.0))
    _check_time(f"{info.name} delay", delay_us)
    # d = 0, the default: two choices, or one on a one-server rack; a d the user gave is checked
    pod_d = int(p.get("d", 0)) or min(2, n)
    if not 1 <= pod_d <= n:
        raise ValueError(f"{info.name} d must be in 1..{n}")
    sched = p.get("sched", "fcfs")
    if sched not in ("ps", "fcfs"):
        raise ValueError(f"{info.name} sched must be ps or fcfs")
    quantum_us = float(p.get("quantum", 0.0))
    _check_quantum(f"{info.name} quantum", quantum_us)
    if sched == "ps":
        _check_slices(f"{info.name} quantum", quantum_us, plan.workload, plan.rack, plan.tasks)
    return dict(mode={"cfcfs": _engine.MODE_CFCFS,
                      "central_pod": _engine.MODE_CENTRAL_POD}[info.sim_mode],
                sched=_sched_kind(sched, quantum_us), quantum_ns=quantum_us * 1e3,
                central_delay_ns=delay_us * 1e3, pod_d=pod_d)


# The simulator's side of each kind of policy in malcolm.policy.registry.
_POLICY_SETUP = {"server": _setup_server, "client": _setup_client, "central": _setup_central}


def _changes(changes, n, capacity, tasks):
    """Validate the changes; return them as the engine's (t_ns, kind, server, value, shares)
    tuples, sorted by time. A new arrival rate is bounded as the run's own is (``tasks``
    at that rate within :data:`MAX_SIM_NS`, at most :data:`MAX_LOAD`)."""
    from malcolm.sim._engine import CH_RATE, CH_SHARES, CH_SPEED

    ch, accepted = [], "t_us (required) and one of load, rate_tps, shares, speed (with server)"
    for c in changes:
        if isinstance(c, Mapping):
            # named, not RackChange(**c)'s bare TypeError ('unexpected keyword argument')
            unknown = [k for k in c if k not in RackChange.__dataclass_fields__]
            if unknown:
                raise TypeError(f"change {dict(c)!r}: unknown field {unknown[0]!r}; its fields "
                                f"are {accepted}")
            try:
                c = RackChange(**c)
            except TypeError:
                raise TypeError(f"change {dict(c)!r}: its fields are {accepted}") from None
        elif not isinstance(c, RackChange):
            raise TypeError(f"a change must be a RackChange or a dict of its fields, got {c!r}")
        set_ = [x for x in ("load", "rate_tps", "shares", "speed") if getattr(c, x) is not None]
        if len(set_) != 1:
            raise ValueError(f"change {c}: give exactly one of load, rate_tps, shares, speed")
        if c.server is not None and c.speed is None:    # it was ignored: the change was rack-wide
            raise ValueError(f"change {c}: server is only for a speed change (the server whose "
                             f"speed changes); a {set_[0]} change is rack-wide")
        t = _number(f"change {c}: t_us", c.t_us) * 1e3
        if not 0 <= t <= MAX_SIM_NS:
            raise ValueError(f"change {c}: t_us must be within 0-{MAX_SIM_NS * 1e-3:g}")
        if c.load is not None or c.rate_tps is not None:
            rate = (_number(f"change {c}: load", c.load) * capacity if c.load is not None
                    else _number(f"change {c}: rate_tps", c.rate_tps) * 1e-9)
            _check_rate(rate, capacity, tasks, f"change {c}")
            ch.append((t, CH_RATE, 0, rate, None))
        elif c.shares is not None:
            ch.append((t, CH_SHARES, 0, 0.0, _shares(c.shares, n)))
        else:
            if c.server is None:
                raise ValueError(f"change {c}: speed needs a server index in 0..{n - 1}")
            server = _whole(f"change {c}: server", c.server, 0, n - 1)
            speed = _number(f"change {c}: speed", c.speed)
            if not MIN_SPEED <= speed <= MAX_SPEED:
                raise ValueError(f"change {c}: speed must be within {MIN_SPEED:g}-"
                                 f"{MAX_SPEED:g}")
            ch.append((t, CH_SPEED, server, speed, None))
    ch.sort(key=lambda x: x[0])
    return ch


def _build_engine(plan: _Plan):
    """The native engine for a validated run."""
    from malcolm.sim._engine import Engine

    a, rk = plan.args, plan.rack
    window_ns = float(a["window_us"]) * 1e3
    return Engine(list(rk.workers), list(rk.speeds), plan.workload.native(),
                  rate_per_ns=plan.rate, shares=plan.shares,
                  n_tasks=plan.tasks, n_warm=plan.n_warm, seed=a["seed"],
                  delay_ns=a["delay_us"] * 1e3, jitter_ns=a["jitter_us"] * 1e3,
                  window_ns=window_ns, loss=a["loss"],
                  phases_ns=_phases(a["phase"], rk.n, window_ns, a["seed"]),
                  n_clients=plan.n_clients, ewma=a["ewma"], record=a["record_loads"],
                  changes=plan.changes, prior_ns=(a["prior_service_us"] or 0.0) * 1e3,
                  gateway_ns=plan.gateway_ns, capacity=plan.slots or 0,
                  max_steals=plan.max_steals, steal_timeout_ns=a["steal_timeout_us"] * 1e3,
                  window_tasks=float(a["window_tasks"]), **plan.engine)


#: Tasks at the start of a run whose answers time the rack's filling up (:func:`_throughput`).
FILL_TASKS = 100


def _throughput(raw: dict, n_warm: int) -> tuple[float, str | None]:
    """Throughput as clients see it: responses received while the measured tasks were being
    sent, per second of that interval (tasks created later cannot answer before it ends),
    and None; or NaN and why it is not available.

    A rack answers at its steady rate only once it has filled up: the interval starts no
    earlier than the 90th percentile latency of the run's first :data:`FILL_TASKS` tasks
    after its first send, which a warm-up usually covers. Counted from the first measured
    send instead, a run whose tasks were all sent within a round trip showed 0.0 (64 servers
    of 1024 workers, 1000 tasks), and one only a few round trips long far too little."""
    sent = raw["sent_ns"][n_warm:]
    if len(sent) < 2 or sent[-1] <= sent[0]:
        return math.nan, (f"throughput n/a: {len(sent)} measured task(s), sent at one "
                          "instant: no interval to count responses over (raise the tasks)")
    served = ~raw["dropped"]
    first = raw["latency_ns"][:FILL_TASKS][served[:FILL_TASKS]]
    fill = float(np.quantile(first, 0.9)) if len(first) else 0.0
    start = max(float(sent[0]), raw["sent_ns"][0] + fill)
    span_us = (sent[-1] - sent[0]) / 1e3
    if start - sent[0] > (sent[-1] - sent[0]) / 2:
        return math.nan, (f"throughput n/a: the measured tasks were sent within {span_us:.3g} "
                          f"µs and the rack took {fill / 1e3:.3g} µs to answer its first "
                          "tasks, more than half of it: too short a run (raise the tasks)")
    recv = (raw["sent_ns"] + raw["latency_ns"])[served]
    n = np.count_nonzero((recv >= start) & (recv <= sent[-1]))
    if not n:
        return math.nan, (f"throughput n/a: no response arrived while the measured tasks were "
                          f"sent, over {span_us:.3g} µs (raise the tasks)")
    return float(n / ((sent[-1] - start) / 1e9)), None


def _assemble(plan: _Plan, raw: dict, wall: float) -> SimResult:
    """Summary statistics of a finished run (``raw``: what ``Engine.run`` returned)."""
    a, rk, n_warm = plan.args, plan.rack, plan.n_warm
    n = rk.n
    # Dropped tasks were answered, not served: like the load generator, the latency
    # statistics are over served tasks only, and the drops are counted.
    served = ~raw["dropped"][n_warm:]
    lat = raw["latency_ns"][n_warm:][served] / 1e3
    per = raw["server"]
    end_s = raw["end_ns"] / 1e9
    thr, thr_note = _throughput(raw, n_warm)
    windows = np.maximum(per["windows"], 1)
    has_windows = bool(per["windows"].sum())
    q = np.quantile(lat, [0.5, 0.99, 0.999, 0.9999]) if len(lat) else [math.nan] * 4
    config = dict(rack=str(rk), policy=a["policy"], workload=plan.workload.name,
                  load=plan.load, tasks=plan.tasks, seed=a["seed"], delay_us=a["delay_us"],
                  jitter_us=a["jitter_us"], window_us=a["window_us"], sched=a["sched"],
                  quantum_us=a["quantum_us"], loss=a["loss"], clients=plan.n_clients,
                  warmup=a["warmup"], ewma=a["ewma"], phase=a["phase"],
                  shares=None if a["shares"] is None else plan.shares,
                  changes=[asdict(c) if isinstance(c, RackChange) else dict(c)
                           for c in a["changes"]],
                  policy_params=plan.params, mean_service_us=plan.workload.mean_us,
                  capacity_tps=plan.capacity * 1e9, gateway_ns=plan.gateway_ns,
                  capacity=plan.slots, max_steals_in_flight=plan.max_steals,
                  steal_timeout_us=a["steal_timeout_us"],
                  prior_service_us=a["prior_service_us"], window_tasks=a["window_tasks"])
    loads = None
    if a["record_loads"]:
        loads = dict(t_us=np.arange(raw["rec_load_ns"].shape[0]) * a["window_us"],
                     load_us=raw["rec_load_ns"] / 1e3, queue=raw["rec_queue"],
                     true_load_us=raw["rec_true_ns"] / 1e3)
    end_ns = raw["end_ns"]
    pols = plan.engine.get("policies")
    sent = raw["sent_ns"][n_warm:]
    want = (float(sent[-1] - sent[0]) * plan.rate * plan.workload.mean_us * 1e3
            if len(sent) > 1 and not a["changes"] else 0.0)
    return SimResult(
        config=config, p50_us=float(q[0]), p99_us=float(q[1]), p999_us=float(q[2]),
        p9999_us=float(q[3]), mean_us=float(lat.mean()) if len(lat) else math.nan,
        max_us=float(lat.max()) if len(lat) else math.nan, throughput=thr,
        throughput_note=thr_note,
        offered=plan.rate * 1e9,
        mean_load=[float(x) for x in (per["load_sum"] / windows / 1e3)] if has_windows
        else [math.nan] * n,
        mean_queue=[float(x) for x in per["q_sum"] / windows] if has_windows
        else [math.nan] * n,
        utilization=[float(b / (w * end_ns)) if end_ns else 0.0
                     for b, w in zip(per["busy_ns"], rk.workers, strict=False)],
        migrations=int(per["migrations"].sum()), steals=int(per["steals"].sum()),
        steal_requests=int(per["steal_requests"].sum()),
        steal_empty=int(per["steal_empty"].sum()), heartbeats_lost=int(raw["hb_lost"]),
        generated=int(raw["generated"]), completed=int(raw["completed"]),
        measured=int(len(lat)), sim_time_s=end_s, events=int(raw["events"]), wall_s=wall,
        loop_s=float(raw["loop_s"]),
        little_L=raw["area"] / end_ns if end_ns else 0.0,
        latencies_us=lat, types=raw["types"][n_warm:][served],
        service_us=raw["service_ns"][n_warm:][served] / 1e3,
        per_server={k: v.tolist() for k, v in per.items()}, loads=loads,
        dropped=int(raw["n_dropped"]), heartbeats_overrun=int(raw["hb_overrun"]),
        steal_suppressed=int(per["steal_suppressed"].sum()),
        steal_timeouts=int(per["steal_timeouts"].sum()),
        gateway_util=[float(m * plan.gateway_ns / end_ns) if end_ns else 0.0
                      for m in per["gateway_msgs"]],
        offered_work_ratio=raw["work_measured_ns"] / want if want > 0 else math.nan,
        policy_stats=[p.stats() for p in pols] if pols and hasattr(pols[0], "stats") else None,
    )
