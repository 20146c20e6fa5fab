"""The experiment runner behind ``malcolm demo`` and the runtime benchmarks: real racks on this
machine, policies interleaved, every point repeated, medians with confidence intervals, and
runs that did not measure what they claim flagged and kept out of the result.

One experiment is a rack shape (workers per server), a workload, policies and loads:

* **Time dilation** ``K``: service times, the policy window, the steal timeout and the
  admission limit (``max_wait_ms``) are multiplied by ``K``, and latencies divided by ``K``
  on the way out, so a 50 µs rack's dynamics play out at 1/K speed (a 2-core machine cannot
  run 50 µs tasks, a loaded load generator and a dozen server threads in real time). ``K =
  "auto"`` picks the smallest ``K`` of :data:`~malcolm.loadgen.method.DILATION_LADDER` at
  which a short calibration run at the highest load kept time (generator on schedule,
  handler on its service time). The generator's lateness threshold is ``K`` x 50 µs: one
  nominal mean service time late, whatever the scale.
* **Network delay** scales with ``K`` too: every endpoint's transport (servers and load
  generator) holds each message for ``K x hop_delay_us`` (``malcolm/net/delay.pyx``; this
  VM's kernel has no netem), so the ratio of per-hop delay to service time is the real
  rack's. The default :data:`HOP_DELAY_US` is the thesis's measured one-way delay (Table 7.1:
  eRPC round trips of 3.8-4.2 µs median, about 2 µs a hop), which is also the simulator's
  default ``delay_us``; the ``--compare-sim`` twin gets exactly the injected delay. At
  ``K = 1`` nothing is injected by default: the network is real time already (loopback
  one-way delays of 5-7 µs on the 16-core VM, above the 2 µs).
* **Racks**: one per policy and repeat, all started together and paused (SIGSTOP) while
  another policy runs, so the policies take turns at each load (ABCABC...) without sharing
  the CPUs; a rack goes through the loads in order, as one deployment would, and every
  repeat starts fresh racks.
* **Effective load** = arrival rate x measured mean service time / workers (from the
  responses' ``service_ns``). The arrival rate is corrected by the handler's measured
  slowness (the ratio of measured to requested service time in the runs so far) and the
  report says by how much. Each run's draw is picked before it runs so that the work it
  offers is its load within 1% (``malcolm/loadgen/draws.py``; the twin picks its seeds so).
* **Flags**: a run whose generator was late for more than 1% of its sends, whose effective
  load is more than 0.03 off, that lost, timed out or had refused for load tasks, is listed
  with the reason, left out of the median and run again (``retries``); a point with no clean
  run is ``valid: false``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import tempfile
import threading
import time
import types

from malcolm.loadgen import draws, method, table
from malcolm.loadgen.method import (  # noqa: F401 (their home; re-exported)
    BASE_POLICIES,
    SPIN_US,
    rack_toml,
)
from malcolm.loadgen.table import HEADER, format_row, format_run  # noqa: F401 (re-exported)
from malcolm.net.ports import free_udp_ports
from malcolm.runtime.cpus import NICE, raise_priority
from malcolm.runtime.launcher import LocalRack, ServerExited

LAG_US = 50.0                   # late-send threshold at K = 1
# Per-hop one-way delay of the real rack (µs, rack time): half the median eRPC round trip
# between machines in the thesis (Table 7.1: 4.2 µs, 3.8-3.9 on one machine), rounded to the
# simulator's default delay_us = 2.0 so that both clocks see the same network by default.
HOP_DELAY_US = 2.0
PORT_TRIES = 3                  # rack starts on fresh ports when a chosen port was taken
# 1000 repeats of the demo's 12 runs are 12 hours: more is a typo (unbounded, it ran for ever)
MAX_REPEAT, MAX_RETRIES = 1000, 100


class ExperimentError(RuntimeError):
    """The experiment cannot run as asked; the message says why."""


def split_policy(spec):
    """:func:`malcolm.loadgen.method.split_policy`, raising :class:`ExperimentError`."""
    try:
        return method.split_policy(spec)
    except ValueError as e:
        raise ExperimentError(str(e)) from None


# ---------------------------------------------------------------- a rack of one policy

class PolicyRack:
    """One policy's rack: started, paused between its runs, measured per run."""

    INTERVAL = 0.2      # s between the servers' --stats-json updates

    def __init__(self, exp, policy, tmp, tag):
        k = exp.dilate
        self.client_policy, self.text = exp.rack_text(policy, k, tag[:8])
        self.policy = policy
        self.exp = exp
        self.path = os.path.join(tmp, f"rack-{tag}.toml")
        # the load generator is an endpoint of the same network: its sends wait too
        self.hop = {"delay_us": exp.hop_us(k) * k} if exp.hop_us(k) > 0 else None
        self.logdir = os.path.join(exp.logdir or tmp, f"logs-{tag}")
        os.makedirs(self.logdir, exist_ok=True)
        self._place()
        self.last = None
        self.paused = self.failed = False

    def _place(self):
        """Choose free ports for the servers and write the rack file (again, on a retry)."""
        ports = free_udp_ports(len(self.exp.workers))
        self.servers = [(f"127.0.0.1:{p}", w) for p, w in zip(ports, self.exp.workers,
                                                                  strict=True)]
        with open(self.path, "w") as f:
            f.write(self.text(self.servers))
        from malcolm.runtime.config import ConfigError
        try:
            self.rack = self.exp.rack_class(self.path, logdir=self.logdir,
                                            extra_args=["--interval", str(self.INTERVAL)])
        except ConfigError as e:
            raise ExperimentError(f"policy {self.policy!r}: {e}") from None

    @property
    def addresses(self):
        return [a for a, _ in self.servers]

    def start(self):
        for k in self.rack.ids:
            self.rack.start(k, wait=False)

    def wait_ready(self, timeout=90.0):
        """Wait until the servers are ready. A port taken by another process between its
        choice and the server's bind (EADDRINUSE) restarts the rack on fresh ports, at most
        PORT_TRIES times in all (counted in ``port_retries``); any other failure, or the
        last, is one ExperimentError line."""
        for attempt in range(1, PORT_TRIES + 1):
            try:
                self.rack.wait_ready(self.rack.ids, timeout)    # stops the rack on failure
                break
            except ServerExited as e:
                if not e.addr_in_use or attempt == PORT_TRIES:
                    self.failed = True
                    raise ExperimentError(f"{self.policy} rack: server {e.server} exited "
                                          f"({e.reason}){self._where()}") from None
                self.exp.port_retries += 1
                self.exp.echo(f"  ports: {self.policy} server {e.server}'s port "
                              f"{self.servers[e.server][0]} was taken before it bound it; "
                              f"restarting the rack on fresh ports ({attempt}/{PORT_TRIES - 1})")
                self._place()
                self.start()
            except (RuntimeError, TimeoutError) as e:
                self.failed = True
                raise ExperimentError(f"{self.policy} rack: {e}{self._where()}") from None
        if not all([raise_priority(p.pid) for p in self.rack.procs.values()]):
            self.exp.prioritized = False
        time.sleep(self.INTERVAL + 0.1)
        self.last = self.read_stats()

    def _where(self):
        """Where the servers' output stays (a temporary directory is gone by the report)."""
        return f"; servers' output in {self.logdir}" if self.exp.logdir else ""

    def read_stats(self):
        out = []
        for k in self.rack.ids:
            try:
                with open(self.rack.stats_path(k)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                out.append(None)
        return out

    def _signal(self, sig):
        for p in self.rack.procs.values():
            if p.poll() is None:
                os.kill(p.pid, sig)

    def pause(self):
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self._signal(signal.SIGCONT)
        self.paused = False

    def dead(self):
        return [k for k, p in self.rack.procs.items() if p.poll() is not None]

    def measure_delta(self):
        """Counters since the previous call (or since start): per server."""
        time.sleep(self.INTERVAL + 0.1)     # the servers' stats files catch up
        cur = self.read_stats()
        prev, self.last = self.last, cur
        return [method.stats_delta(a, b) for a, b in zip(prev, cur, strict=True)]

    def down(self):
        if self.paused:
            self.resume()
        return self.rack.down()


# ---------------------------------------------------------------- the experiment

class Experiment:
    """A runtime experiment (see the module docstring).

    Parameters
    ----------
    workers : list of int
        Worker threads per server.
    workload : str
        Nominal service times (before dilation), as in ``malcolm sim``.
    policies : list of str
        ``malcolm``, ``jsq``, ``po2``, with parameters (``malcolm:learn=0``).
    loads : list of float
        Target effective loads (fractions of the rack's nominal capacity).
    repeat : int
    duration_s, warmup_s : float
        Real seconds measured (and warmed up) per run.
    window_us : float
        Nominal policy window (dilated by ``dilate``).
    dilate : float or "auto"
    compare_sim : bool
        Run :func:`malcolm.sim.twin.runtime_twin` next to each point.
    hop_delay_us : float or None
        Per-hop one-way delay added by the transports, µs at rack scale (x ``dilate`` in
        real time); 0 adds none (the loopback's own delay only). None: :data:`HOP_DELAY_US`
        when dilated (K > 1), none at K = 1.
    rack_class : type or None
        Runs a rack file's servers as processes; ``None``: the local launcher,
        :class:`malcolm.runtime.launcher.LocalRack`.
    handler : str or callable
        The servers' handler spec, or ``handler(K)`` -> spec for a handler that dilates real
        work itself (``rocksdb:path=...,dilate=K``: pads to K x the warm GET cost by
        default). Its padded calls that overran their target are counted per run
        (``overruns`` of ``padded``) and flag a run beyond ``method.OVERRUN_MAX``.
    retries : int
        A flagged run is run again at once (same rack, fresh arrivals), up to ``retries``
        more times and a quarter more runs than planned in all, so that a transient
        disturbance does not leave a point short of clean repeats. Every attempt is kept in
        ``runs`` and listed in its row (``flagged``, ``attempts``,
        ``late_fraction_attempts``); only clean ones enter the median.
    app : malcolm.loadgen.apps.AppSpec or None
        Real requests (GET(n), values checked) instead of requested service times. The
        nominal service times are then ``workload``'s (e.g. ``rocksdb1-measured``, this
        machine's calibration of the handler): they set the nominal capacity and the rate
        correction's reference; the runs measure the real ones.
    """

    def __init__(self, workers, workload="exp:50", policies=("malcolm", "jsq", "po2"),
                 loads=(0.5, 0.7, 0.85), repeat=1, duration_s=2.0, warmup_s=0.5,
                 window_us=100.0, dilate="auto", compare_sim=False, handler="bench",
                 echo=print, logdir=None, stop=None, sim_tasks=100_000,
                 calib_duration_s=1.0, rack_class=None, hop_delay_us=None, app=None,
                 retries=1):
        from malcolm.workloads import parse_workload
        self.workers = list(workers)
        self.total_workers = sum(max(1, w) for w in self.workers)
        try:
            self.wl = parse_workload(workload)
        except ValueError as e:
            raise ExperimentError(str(e)) from None
        self.workload = workload
        self.policies = list(policies)
        for p in self.policies:
            split_policy(p)
            self._check_client(p)
        self.loads = list(loads)
        if not (1 <= repeat <= MAX_REPEAT and 0 <= retries <= MAX_RETRIES):
            raise ExperimentError(f"--repeat must be in 1..{MAX_REPEAT} and --retries in "
                                  f"0..{MAX_RETRIES}")
        self.repeat, self.retries = repeat, retries
        # at most a quarter more runs than planned: a machine too busy to keep time gets
        # flagged rows, not a run that never ends
        self.retries_left = max(1, len(self.policies) * len(self.loads) * repeat // 4)
        from malcolm.loadgen.run import MAX_RUN_S
        if not (0 < duration_s and 0 <= warmup_s and duration_s + warmup_s <= MAX_RUN_S):
            raise ExperimentError(f"--duration must be > 0, --warmup >= 0, and the two at "
                                  f"most {MAX_RUN_S:g} s together (about 11 days)")
        self.duration_s, self.warmup_s = duration_s, warmup_s
        self.window_us = window_us
        if hop_delay_us is not None and not (math.isfinite(hop_delay_us)
                                             and 0 <= hop_delay_us <= 10_000):
            raise ExperimentError(f"hop delay {hop_delay_us!r} µs must be in 0..10000")
        self.hop_delay_arg = hop_delay_us
        try:
            self.dilate_arg = method.parse_dilation(dilate)
        except ValueError as e:
            raise ExperimentError(str(e)) from None
        self.dilate = 1.0
        self.compare_sim = compare_sim
        self.handler = handler
        self.app = app
        self.echo = echo
        self.logdir = logdir
        self.stop = stop or threading.Event()
        self.sim_tasks = sim_tasks
        self.calib_duration_s = calib_duration_s
        self.rack_class = rack_class or LocalRack
        self.cpus = sorted(os.sched_getaffinity(0))
        self.layout = None
        self.svc_factor = 1.0          # measured / requested service time, runs so far
        self._svc = {}                 # load (None: all) -> [measured sum, requested sum]
        self.runs = []
        self.delay_us = float("nan")   # measured one-way delay, real µs
        self.port_retries = 0          # rack starts retried on fresh ports (EADDRINUSE)
        self.net_delay = ""
        self.prioritized = os.geteuid() == 0
        # the dilations whose runs the load generator takes, checked now (one line) rather
        # than by a run after the racks started: ``auto`` searches only these
        ks = method.DILATION_LADDER if self.dilate_arg == "auto" else (self.dilate_arg,)
        why = {k: self.check_dilation(k) for k in ks}
        self.ladder = tuple(k for k in ks if why[k] is None)
        if not self.ladder:
            raise ExperimentError(why[ks[0]] if why[ks[0]] == why[ks[-1]] else
                                  f"--dilate auto: no K in {ks[0]}..{ks[-1]} works: "
                                  f"{why[ks[0]]}; {why[ks[-1]]}")

    # ------------------------------------------------------------ helpers
    def _check_client(self, policy):
        """Refuse now a client policy this rack's clients cannot build (po2:d=5 on four
        servers), rather than in the load generator of the first run."""
        from malcolm.policy import registry
        client = method.policy_roles(policy)[2]
        if client:
            try:
                name, params = registry.parse_policy(client)
                registry.make_client_policy(name, len(self.workers), **params)
            except ValueError as e:
                raise ExperimentError(f"--policy {policy}: {e}") from None

    def hop_us(self, k=None):
        """The per-hop delay injected at dilation ``k`` (µs of rack time)."""
        k = self.dilate if k is None else k
        if self.hop_delay_arg is not None:
            return float(self.hop_delay_arg)
        return HOP_DELAY_US if k > 1 else 0.0

    def capacity(self, k=None):
        """Tasks/s the rack serves at dilation ``k`` with nominal service times."""
        k = self.dilate if k is None else k
        return self.total_workers / (self.wl.mean_us * k * 1e-6)

    def rack_text(self, policy, k, name):
        """``policy``'s client policy, and its rack file at dilation ``k`` as a function of
        its servers ([(address, workers), ...])."""
        base, section, client = method.policy_roles(policy)
        return client, method.experiment_rack(
            section, base, k=k, window_us=self.window_us,
            hop_us=self.hop_us(k), poll=self.layout.poll, handler=self.handler_spec(k),
            name=name, cpus=self.layout.server_cpus)

    def handler_spec(self, k):
        """The servers' handler at dilation ``k``."""
        return self.handler(k) if callable(self.handler) else self.handler

    def _app_report(self, rep, k):
        """With ``app``: the report's requested mean service time is the nominal one at
        dilation ``k`` (the client requests none: the handler does real work), so the rate
        correction and the nominal load refer to ``workload``."""
        if self.app is not None and "service_us" in rep:
            rep["service_us"]["requested_mean"] = self.wl.mean_us * k
        return rep

    def timeout_s(self, k):
        """The load generator's timeout at dilation ``k`` (real s): method.client_timeout_s."""
        return method.client_timeout_s(k, self.wl.mean_us)

    def _spec(self, rack, k, threads, cpus, duration, warmup, seed=7):
        from malcolm.loadgen.run import LoadSpec, Target
        # with an app the client requests no service time (the workload only draws
        # nothing the app does not overwrite): pass it undilated
        wl = self.workload if self.app is not None else method.dilate_workload(self.wl, k)
        return LoadSpec(Target("udp", rack.addresses, rack.path, hop=rack.hop), app=self.app,
                        workload=wl, duration_s=duration,
                        warmup_s=warmup, threads=threads, timeout_s=self.timeout_s(k),
                        policy=rack.client_policy, busy=self.layout.poll == "busy",
                        spin_us=SPIN_US / k, cpus=cpus, lag_threshold_us=LAG_US * k,
                        seed=seed, crn=True, draw_tol=draws.DRAW_TOL,
                        nice=NICE if self.prioritized else None)

    def check_dilation(self, k):
        """None if the load generator takes this experiment's runs at dilation ``k`` (the
        dilated workload, the highest load's rate and client threads), else why not."""
        from malcolm.loadgen.run import MAX_THREADS, LoadgenError
        top, rate = max(self.loads), max(self.loads) * self.capacity(k)
        saved = self.layout
        self.layout = lay = method.layout(self.workers, self.cpus, rate)
        rack = types.SimpleNamespace(addresses=["127.0.0.1:20001"] * len(self.workers),
                                     path="(check)", hop=None, client_policy=None)
        try:
            if lay.client_threads > MAX_THREADS:
                return (f"load {top:g} at dilation K={k:g} is {rate:.3g} tasks/s "
                        f"({self.wl.mean_us:g} µs tasks x{k:g} on {self.total_workers} "
                        f"workers), more than the load generator's {MAX_THREADS} client "
                        "threads send; give longer service times, fewer workers or a larger "
                        "--dilate")
            # the racks' files too: a server refusing one did so after the banner
            why = method.check_rack_times(k, self.window_us, self.hop_us(k))
            for p in self.policies:
                why = why or method.check_rack_text(self.rack_text(p, k, "check")[1],
                                                    self.workers, f"--policy {p}")
            if why:
                return why
            spec = self._spec(rack, k, lay.client_threads, lay.client_cpus, self.duration_s,
                              self.warmup_s)
            spec.validate()
            spec.check_rate(rate)
        except LoadgenError as e:
            if self.app is None and "workload" in str(e):
                return (f"--workload {self.workload} at dilation K={k:g}: {e}; give shorter "
                        "service times or a smaller --dilate")
            return f"at dilation K={k:g}: {e}"
        finally:
            self.layout = saved
        return None

    # ------------------------------------------------------------ dilation
    def _calibrate(self, tmp):
        """Smallest K of the ladder whose short run at the highest load keeps time."""
        from malcolm.loadgen.run import run_load
        top = max(self.loads)

        def trial(k):
            if self.stop.is_set():
                return False
            self.dilate = k
            rate = top * self.capacity(k)
            self.layout = method.layout(self.workers, self.cpus, rate)
            rack = PolicyRack(self, "jsq", tmp, f"cal{k}")
            try:
                rack.start()
                rack.wait_ready()
                if self.app is not None:
                    # A real handler's service time is not the nominal one (here, under
                    # dilation, GETs run with cold caches): a short pilot at a third of the
                    # load measures it, so that the trial offers the load it claims.
                    spec = self._spec(rack, k, self.layout.client_threads,
                                      self.layout.client_cpus, 0.5, 0.2)
                    pilot = self._app_report(run_load(spec, rate / 3, self.stop), k)
                    ps = pilot["service_us"]
                    if pilot["completed"] and math.isfinite(ps["measured_mean"]):
                        rate /= ps["measured_mean"] / ps["requested_mean"]
                spec = self._spec(rack, k, self.layout.client_threads,
                                  self.layout.client_cpus, self.calib_duration_s, 0.3)
                rep = self._app_report(run_load(spec, rate, self.stop), k)
            finally:
                rack.down()
            if rep.get("interrupted"):
                return False
            s = rep["service_us"]
            ok = method.calibration_ok(rep["schedule"]["late_fraction"], s["measured_mean"],
                                  s["requested_mean"], rep["accounted"], rep["timed_out"],
                                  check_service=self.app is None)
            self.echo(f"  calibration K={k:g}: late {100 * rep['schedule']['late_fraction']:.2f}%"
                      f", service {s['measured_mean']:.1f}/{s['requested_mean']:.1f} µs "
                      f"measured/requested, timed out {rep['timed_out']}: "
                      f"{'keeps time' if ok else 'does not keep time'}")
            if ok:
                self._calib[k] = rep
            return ok

        self._calib = {}
        k, _ = method.search_dilation(trial, self.ladder)     # starts mid-way without K=20
        if self.stop.is_set():
            return None
        if k is None:
            k = self.ladder[-1]
            self.echo(f"dilation: no K up to {k} kept time here (the machine is busy: see the "
                      f"calibration lines); running at K={k}, expect FLAGGED runs")
            self.dilate = k
            return k
        run_k = method.with_headroom(k, self.ladder)
        if self.app is not None:
            # a real handler's slowness is its own, not the padding's: the calibration's
            # measurement is a better first correction than none (the runs refine it)
            self._note_service(self._calib[k], top)
        if run_k != k:
            # The calibration's service-time correction was measured at another K (a larger K
            # runs the handler more accurately): the runs measure their own from the start.
            self.echo(f"dilation: K={k:g} kept time in calibration; running one rung up, at "
                      f"K={run_k:g}, for headroom")
            self.dilate = run_k
            return run_k
        self._note_service(self._calib[k], top)
        return k

    def _note_service(self, rep, load):
        s = rep["service_us"]
        if rep["completed"] and math.isfinite(s["measured_mean"]):
            for key in (None, load):
                acc = self._svc.setdefault(key, [0.0, 0.0])
                acc[0] += s["measured_mean"] * rep["completed"]
                acc[1] += s["requested_mean"] * rep["completed"]
            self.svc_factor = self._svc[None][0] / self._svc[None][1]

    def service_factor(self, load):
        """How much slower than asked the handler ran, at this load if it ran there before
        (a handler slows with the machine's load), else over every run so far."""
        acc = self._svc.get(load) or self._svc.get(None)
        return acc[0] / acc[1] if acc and acc[1] > 0 else 1.0

    def _one_way_us(self, rack):
        """Half the median round trip of near-empty tasks through one server (real µs),
        measured with the native client as the runs are (its polling, its wake-ups)."""
        from malcolm.loadgen.run import LoadSpec, Target, run_load
        n = len(rack.addresses)
        # a real handler answers an empty task "bad input", which has no latency: ping it
        # with GET(1) (one key: its service time is in the round trip)
        app = None if self.app is None else dataclasses.replace(
            self.app, name="ping", mix=((1.0, 1),), bad_fraction=0.0)
        rate = 2000.0
        if app is not None:
            # each ping is a (dilated) GET: a tenth of one worker's capacity, or the round
            # trips would be queueing; long enough for 30 of them (at most 3 s)
            rate = min(rate, 0.1 / (self.wl.mean_us * self.dilate * 1e-6
                                    * self.service_factor(None)))
        spec = LoadSpec(Target("udp", rack.addresses, rack.path, hop=rack.hop), app=app,
                        workload="mix:1:const:0.001",
                        duration_s=min(3.0, max(0.3, 30.0 / rate)), warmup_s=0.1, threads=1,
                        busy=self.layout.poll == "busy", cpus=self.layout.client_cpus,
                        shares=[1.0] + [0.0] * (n - 1),
                        nice=NICE if self.prioritized else None)
        rep = run_load(spec, rate, self.stop)
        return rep["latency_us"]["p50"] / 2.0

    # ------------------------------------------------------------ running
    def run(self):
        """Run everything; return the result dict (``dilate``, ``rows``, ``runs``, ...)."""
        from malcolm.loadgen.run import LoadgenError
        try:
            return self._run()
        except LoadgenError as e:   # vetted up front (check_dilation); any other refuses
            # every run alike: one line, not a traceback (the racks are down: finally blocks)
            raise ExperimentError(f"load generator: {e}") from None

    def _run(self):
        t_start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="malcolm-demo-") as tmp:
            if self.dilate_arg == "auto":
                self.echo("dilation: auto, calibrating at the highest load")
                self.dilate = self._calibrate(tmp)
                if self.dilate is None:         # interrupted
                    self.dilate = 1.0
                    return {"dilate": None, "rows": [], "runs": [], "interrupted": True}
            else:
                self.dilate = float(self.dilate_arg)
            k = self.dilate
            self.net_delay = method.hop_text(self.hop_us(k), k)
            self.layout = method.layout(self.workers, self.cpus, max(self.loads) * self.capacity())
            self.echo(f"dilation K={k:g}: {self.wl.mean_us:g} µs tasks run as "
                      f"{self.wl.mean_us * k:g} µs, {self.window_us:g} µs windows as "
                      f"{self.window_us * k:g} µs; latencies reported /K (rack time)")
            self.echo(f"layout: {self.layout.reason}; {self.layout.client_threads} client "
                      "thread(s)")
            self.echo(self.net_delay)
            self.echo(f"priority: nice {NICE} for the racks and the load generator"
                      if self.prioritized else "priority: unchanged (not root)")
            top, low = max(self.loads), min(self.loads)
            short = method.too_short(low, low * self.capacity(), self.duration_s)
            if short:
                raise ExperimentError(short)
            note = method.sampling_note(top, top * self.capacity(), self.duration_s,
                                        self.wl.scv, self.wl.name,
                                        held=0.0 if self.app is not None else draws.DRAW_TOL)
            if note:
                self.echo(note)
            for r in range(self.repeat):
                if self.stop.is_set():
                    break
                self._repeat(r, tmp)
        rows = self.rows()
        if self.compare_sim and not self.stop.is_set():
            self.simulate(rows)
        return {"dilate": self.dilate, "workers": self.workers, "workload": self.workload,
                "window_us": self.window_us, "capacity_per_s": self.capacity(),
                "layout": self.layout.reason, "poll": self.layout.poll,
                "net_delay": self.net_delay, "one_way_delay_us": self.delay_us / k,
                "hop_delay_us": self.hop_us(k),
                "service_factor": self.svc_factor, "repeat": self.repeat,
                "port_retries": self.port_retries,
                "ci": "order-statistic interval of the median (distribution-free); its "
                      "coverage is given per row (93.75% for 5 repeats)",
                "elapsed_s": time.monotonic() - t_start, "rows": rows, "runs": self.runs}

    def _repeat(self, r, tmp):
        racks = {p: PolicyRack(self, p, tmp, f"r{r}-{p.replace(':', '-').replace('=', '')}")
                 for p in self.policies}
        try:
            for rk in racks.values():
                rk.start()
            for rk in racks.values():
                rk.wait_ready()
                rk.pause()
            if r == 0:
                # a rack that accepts every task (po2's) if there is one: no forward hop
                first = racks.get("po2") or next(iter(racks.values()))
                first.resume()
                try:
                    self.delay_us = self._one_way_us(first)
                    first.measure_delta()           # the pings are not part of a run
                finally:
                    first.pause()
                if self.stop.is_set():
                    return          # interrupted while pinging: no delay measured (nan)
                self.echo(f"one-way delay (half the median round trip of empty tasks through "
                          f"{first.policy}'s server 0): {self.delay_us:.1f} µs real = "
                          f"{self.delay_us / self.dilate:.2f} µs at rack scale")
            rates = {}
            for _, load, p in method.run_order(self.policies, self.loads, 1):
                if self.stop.is_set():
                    return
                rk = racks[p]
                # one rate per load and repeat, fixed before its first policy runs: with the
                # same seed, every policy then gets the same arrivals and service times
                if load not in rates:
                    rates[load] = method.corrected_rate(load, self.capacity(),
                                                   self.service_factor(load))
                if not self._point(r, load, p, rk, rates[load]):
                    return
        finally:
            for rk in racks.values():
                codes = rk.down()
                bad = {k: c for k, c in codes.items() if c != 0}
                if bad and not rk.failed:               # a failed start is said already
                    self.echo(f"  note: {rk.policy} rack servers exited with {bad} "
                              f"(logs in {rk.logdir})")
                    for k in bad:       # the temporary log folder goes with the demo
                        self.echo(rk.rack.tail(k, 60))

    def _point(self, r, load, p, rk, rate):
        """Run ``p`` at ``load`` (repeat ``r``), again at once while flagged, at most
        ``retries`` more times (same rack, fresh arrivals); False if interrupted."""
        attempt = 0
        while True:
            run = self._attempt(r, load, p, rk, rate, attempt)
            if run is None:
                return False
            if (not run["flags"] or self.stop.is_set() or attempt == self.retries
                    or self.retries_left <= 0):
                return True
            self.retries_left -= 1
            attempt += 1
            self.echo(f"  run {r + 1} {p:<16} load {load:4.2f}: again "
                      f"(attempt {attempt + 1} of {1 + self.retries})")

    def _attempt(self, r, load, p, rk, rate, attempt):
        """One run of policy ``p`` at ``load`` (repeat ``r``); the recorded run, or None if
        the experiment was interrupted."""
        from malcolm.loadgen.run import run_load
        rk.resume()
        try:
            # the same arrival stream for every policy at this load, repeat and attempt
            # (common random numbers: the policies differ, not their luck). A retry draws
            # anew: a short run's own draws can be off its load (a 3 s run at K = 100 has
            # 2 400 tasks at 0.5, and one seed offered 0.534 to every policy, every time)
            spec = self._spec(rk, self.dilate, self.layout.client_threads,
                              self.layout.client_cpus, self.duration_s, self.warmup_s,
                              seed=7 + 1000 * r + self.loads.index(load) + 100_003 * attempt)
            try:
                rep = self._app_report(run_load(spec, rate, self.stop), self.dilate)
            except RuntimeError as e:       # a stuck run: say so, keep going
                rep = None
                why = str(e)
            delta = rk.measure_delta()
        finally:
            rk.pause()
        if rep is None:
            return self._record_failed(r, load, p, rate, why, attempt)
        dead = rk.dead()
        if dead:
            raise ExperimentError(f"{p}: server(s) {dead} died; output in {rk.logdir}")
        if rep.get("interrupted"):
            return None
        return self._record(r, load, p, rate, rep, delta, attempt)

    def _record_failed(self, r, load, p, rate, why, attempt=0):
        nan = float("nan")
        run = {"repeat": r, "attempt": attempt, "policy": p, "load": load, "rate_per_s": rate,
               "rate_correction": rate / (load * self.capacity()), "p50_us": nan,
               "p99_us": nan, "p999_us": nan, "late_fraction": 1.0, "effective_load": nan,
               "service_mean_us": nan, "completed": 0, "rejected": 0, "timed_out": 0,
               "accounted": True, "migrations_per_task": nan, "steals_per_task": nan,
               "server_util": [None] * len(self.workers), "flags": [why], "_delta": []}
        self.runs.append(run)
        self.echo(f"  run {r + 1} {p:<16} load {load:4.2f}: FLAGGED: {why}")
        return run

    def _record(self, r, load, p, rate, rep, delta, attempt=0):
        k = self.dilate
        s = rep["service_us"]
        # dilated rate x dilated service time: the same fraction as at rack scale
        eff = method.effective_load(rep["offered_per_s"], s["measured_mean"], self.total_workers)
        late = rep["schedule"]["late_fraction"]
        pad = {k: sum(d["pad_" + k] for d in delta if d is not None)
               for k in ("calls", "overruns", "cpu_ns", "target_ns", "wall_ns")}
        padded, overruns = pad["calls"], pad["overruns"]
        fl = method.flags(late, eff, load, rep["accounted"], rep["timed_out"], overruns, padded,
                          rep["rejected"])
        done = max(1, rep["completed"])
        # busy fraction of each server's workers over the run (warm-up included: the
        # service-time counters cover it)
        span = self.warmup_s + rep["duration_s"]
        util = [None if d is None else d["service_sum_ns"] / 1e9 / span / max(1, w)
                for d, w in zip(delta, self.workers, strict=True)]
        run = {"repeat": r, "attempt": attempt, "policy": p, "load": load, "rate_per_s": rate,
               "rate_correction": rate / (load * self.capacity()),
               "p50_us": rep["latency_us"]["p50"] / k, "p99_us": rep["latency_us"]["p99"] / k,
               "p999_us": rep["latency_us"]["p99.9"] / k, "late_fraction": late,
               "effective_load": eff, "service_mean_us": s["measured_mean"] / k,
               "completed": rep["completed"], "rejected": rep["rejected_total"],
               "timed_out": rep["timed_out"], "accounted": rep["accounted"],
               "migrations_per_task": rep["migrated"] / done,
               "steals_per_task": rep["stolen"] / done, "server_util": util,
               "padded": padded, "overruns": overruns, "flags": fl, "_delta": delta,
               "draw": rep.get("draw"), "guards": method.guards_fired(delta)}
        if padded:
            # the dilating handler's own view, µs per call: the real GET's CPU time (real,
            # undilated), the target it padded to and the wall time it took (rack scale;
            # wall > target: late wake-ups and overruns)
            run["pad_us"] = {"cpu": pad["cpu_ns"] / padded / 1e3,
                             "target": pad["target_ns"] / padded / 1e3 / k,
                             "wall": pad["wall_ns"] / padded / 1e3 / k}
        if self.app is not None:
            a = rep["app"]
            run["app"] = {"checked": a["checked"], "wrong_values": a["wrong_values"],
                          "p99_us_by_type": [t["latency_us"]["p99"] / k for t in a["types"]]}
            if a["wrong_values"]:
                fl.append(f"{a['wrong_values']} wrong value(s)")
        self.runs.append(run)
        self._note_service(rep, load)
        self.echo(format_run(run))
        return run

    # ------------------------------------------------------------ results
    def rows(self):
        """One row per (policy, load): :func:`malcolm.loadgen.method.summarize`."""
        return method.summarize(self.runs, self.policies, self.loads, len(self.workers))

    def costs_for(self, runs):
        """The runtime's measured costs, at rack scale, pooled over ``runs``."""
        from malcolm.sim.twin import RuntimeCosts
        k = self.dilate
        busy = msgs = sent = seen = 0
        buckets = {}
        for x in runs:
            for d in x["_delta"]:
                if d is None:
                    continue
                busy += d["gateway_busy_ns"]
                # every message the gateway handles: received, responses, heartbeat copies
                # (the simulator charges gateway_ns to each; docs/simulator.md)
                msgs += d["rx_msgs"] + d["responses"] + d["hb_sent"]
                sent += d["hb_sent"]
                seen += d["hb_observed"]
                for lo, hi, c in d["service_buckets"]:
                    buckets[(lo, hi)] = buckets.get((lo, hi), 0) + c
        samples = method.bucket_samples(buckets, 20_000, k)
        # The twin's network: the injected per-hop delay, exactly (the loopback's own share
        # of the measured one-way delay is mostly gateway and wake-up time, which the twin
        # charges as gateway_ns); without injection, the measured one-way delay.
        if self.hop_us(k) > 0:
            delay = self.hop_us(k)
        else:
            delay = self.delay_us / k if math.isfinite(self.delay_us) else 2.0
        return RuntimeCosts(
            delay_us=delay,
            gateway_ns=busy / msgs / k if msgs else 0.0,
            hb_loss=min(1.0, max(0.0, 1.0 - seen / sent)) if sent else 0.0,
            capacity=4096, steal_timeout_us=2000.0, service_us=samples or None,
            clients=getattr(self.layout, "client_threads", None))   # po2's view (twin.py)

    def simulate(self, rows):
        """``sim_p99_us`` and the twin's figures for every row (``runs_twin``, costs measured)."""
        from malcolm.sim.twin import runs_twin, runtime_twin
        for row in rows:
            if self.stop.is_set():
                return
            runs = [x for x in self.runs if x["policy"] == row["policy"]
                    and x["load"] == row["load"]]
            costs = self.costs_for(runs)
            load = row["effective_load"] if math.isfinite(row["effective_load"]) else row["load"]
            try:        # Malcolm's defaults in both: load_scale derived from the rates
                kw = dict(workers=self.workers, workload=self.workload, load=load,
                          policy=row["policy"], window_us=self.window_us, costs=costs)
                tw = runs_twin(measured=[x["completed"] for x in runs if not x["flags"]]
                               or [x["completed"] for x in runs], **kw,
                               warmup_share=self.warmup_s / (self.warmup_s + self.duration_s),
                               draw_tol=None if self.app is not None else draws.DRAW_TOL,
                               timeout_us=self.timeout_s(self.dilate) * 1e6 / self.dilate)
                if os.environ.get("MALCOLM_TWIN_AB"):     # the long twin, to compare
                    row["sim_long_p99_us"] = runtime_twin(tasks=self.sim_tasks, **kw)["p99_us"]
            except Exception as e:          # report, do not lose the real measurements
                row["sim_error"] = f"{type(e).__name__}: {e}"
                self.echo(f"  sim twin of {row['policy']} at {row['load']:g} failed: "
                          f"{row['sim_error']}")
                continue
            row["sim_p99_us"] = tw["p99_us"]
            row["sim_ratio"] = row["p99_us"] / tw["p99_us"] if tw["p99_us"] else float("nan")
            row["sim_saturated"] = table.saturated(row)       # then the ratio tests nothing
            row["sim"] = {k: tw[k] for k in (
                "p50_us", "p99_us", "p99_runs_us", "tasks_per_run", "migrations_per_task",
                "steals_per_task", "mean_load_us", "costs", "seeds", "seeds_tried",
                "work_ratios", "seeds_timed_out") if k in tw}

