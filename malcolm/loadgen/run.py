"""The load generator's Python front end: parse the run's description, start the native
client threads, merge what they measured and account for every task.

A run is described by a :class:`LoadSpec`; :func:`run_load` runs one target rate and returns a
report (a plain dict, the same one ``malcolm loadgen --json`` prints); :func:`sweep` runs a
list of rates one after the other.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field

from malcolm import _units
from malcolm.loadgen import draws, hist, traffic
from malcolm.net import wire

STATUS_NAMES = {int(s): s.name.lower() for s in wire.Status}


MAX_RATE = 1e9          # tasks/s: far beyond what one machine sends; keeps the arithmetic exact
MAX_RUN_S = 1e6         # s per rate: the native schedule counts in int64 ns
MAX_THREADS = 64        # client threads of one run
# tasks/s, the slowest rate (one task in about 17 minutes). The native schedule adds each gap
# to an int64 count of ns: at 1e-3/s over 64 threads a mean gap is 6.4e13 ns, so even an
# exponential draw a thousand times the mean stays far inside int64 (9.2e18 ns); slower
# rates overflowed it and the run never ended. No load test needs a slower one.
MIN_RATE = 1e-3


class LoadgenError(ValueError):
    """Bad loadgen input; the message says what and how to fix it."""


# ---------------------------------------------------------------- parsing

def parse_rate(text: str) -> float:
    """``"20000"``, ``"20k"``, ``"1.5M"`` -> tasks per second (> 0)."""
    try:
        return _units.parse_rate(text)
    except ValueError as e:
        raise LoadgenError(f"rate {e}") from None


def parse_duration(text: str) -> float:
    """``"2"``, ``"2s"``, ``"500ms"``, ``"250us"`` -> seconds (>= 0)."""
    try:
        return _units.parse_duration(text, "s")
    except ValueError as e:
        raise LoadgenError(f"time {e}") from None


def parse_share_limit(text, what="limit") -> float:
    """``"1%"`` or ``"0.01"`` -> a fraction in 0..1."""
    t = str(text).strip()
    scale = 0.01 if t.endswith("%") else 1.0
    try:        # ASCII digits only, as every number of the CLI (float() read "１%")
        v = _units.ascii_number(t.rstrip("%")) * scale
    except ValueError:
        raise LoadgenError(f"{what} {text!r} must be a percentage (1%) or a fraction "
                           "(0.01)") from None
    if not (math.isfinite(v) and 0 <= v <= 1):
        raise LoadgenError(f"{what} {text!r} must be between 0% and 100%")
    return v


def parse_shares(text, n: int) -> list[float]:
    """``"1,1,2,2"`` or ``"1/1/2/2"``: one non-negative weight per server."""
    try:
        vals = list(text) if isinstance(text, (list, tuple)) else _units.split_items(text, ",/")
    except ValueError as e:
        raise LoadgenError(f"shares {e}") from None
    try:        # a string in ASCII digits only (float() read "１,1"); a number as it is
        vals = [_units.ascii_number(v) if isinstance(v, str) else float(v) for v in vals]
    except ValueError:
        raise LoadgenError(f"shares {text!r} must be numbers, e.g. 1,1,2,2") from None
    if len(vals) != n:
        raise LoadgenError(f"shares {text!r}: {len(vals)} weight(s) for {n} server(s)")
    if any(not (v >= 0 and math.isfinite(v)) for v in vals) or not sum(vals) > 0:
        raise LoadgenError(f"shares {text!r}: weights must be >= 0 with a positive sum")
    return vals


@dataclass
class Change:
    """At ``at_s`` seconds after the warm-up: set the rate (absolute, or ``factor`` times the
    run's base rate) and/or the per-server shares."""

    at_s: float
    rate: float | None = None
    factor: float | None = None
    shares: list | None = None


def parse_change(text: str, n: int) -> Change:
    """``TIME:key=value[,key=value]`` with keys ``rate`` (``30000``, ``30k`` or ``2x``) and
    ``shares`` (``1/1/2/2``). Example: ``2s:rate=2x,shares=1/0/1/1``."""
    when, sep, rest = str(text).partition(":")
    if not sep or not rest.strip():
        raise LoadgenError(f"--change {text!r} must look like 2s:rate=2x or "
                           "3s:shares=1/1/2/2")
    ch, keys = Change(parse_duration(when)), set()
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq:
            raise LoadgenError(f"--change {text!r}: {item!r} must be key=value")
        if key in keys:         # not the last one silently: rate=2x,rate=3x ran 3x
            raise LoadgenError(f"--change {text!r}: {key} is given twice")
        keys.add(key)
        if key == "rate":
            v = value.strip().lower()
            if v.endswith("x"):
                try:    # ASCII digits only, as the rates' own grammar
                    ch.factor = _units.ascii_number(v[:-1])
                except ValueError:
                    raise LoadgenError(f"--change {text!r}: factor {value!r} is not a number")\
                        from None
                # beyond these, every base rate (MIN_RATE..MAX_RATE) gives one out of range;
                # the product itself is checked against each base rate (LoadSpec.check_rate)
                lo, hi = MIN_RATE / MAX_RATE, MAX_RATE / MIN_RATE
                if not (ch.factor == 0 or lo <= ch.factor <= hi):     # NaN fails this too
                    raise LoadgenError(f"--change {text!r}: factor must be 0 or in "
                                       f"{lo:g}..{hi:g}")
            elif v in ("0", "0.0"):
                ch.rate = 0.0
            else:
                ch.rate = parse_rate(v)
                if not MIN_RATE <= ch.rate <= MAX_RATE:
                    raise LoadgenError(f"--change {text!r}: rate {ch.rate:g}/s must be 0 or "
                                       f"in {MIN_RATE:g}..{MAX_RATE:g}")
        elif key == "shares":
            ch.shares = parse_shares(value, n)
        else:
            raise LoadgenError(f"--change {text!r}: unknown key {key!r} (rate, shares)")
    return ch


def _longest_trace_gap(gaps_us, threads) -> float:
    """A trace's longest gap per client thread, in units of the mean gap of the whole stream
    (seconds at 1 task/s): thread ``i`` of ``T`` sends every T-th arrival, so its gaps are
    the sums of T consecutive gaps (:meth:`traffic.Arrivals.for_thread`), of the trace cut
    to a multiple of T and read in a loop. ``inf`` when its values overflow a float."""
    import numpy as np
    m = gaps_us.size - gaps_us.size % threads
    if m == 0:
        return 0.0          # too short for the threads: for_thread says so
    g = gaps_us[:m]
    with np.errstate(over="ignore"):        # inf: said below
        c = np.concatenate(([0.0], np.cumsum(np.concatenate((g, g[:threads - 1])))))
    if not math.isfinite(float(c[-1])):
        return math.inf
    mean = float(c[m]) / m
    if not mean > 0:
        return 0.0          # all zero: for_thread says so
    return float((c[threads:] - c[:-threads]).max()) / mean


# ---------------------------------------------------------------- targets

@dataclass
class Target:
    transport: str
    servers: list
    source: str          # the rack file, or "--server"
    workers: int | None = None      # the rack's worker threads (from a rack file), for loads
    key: bytes | None = None        # the rack's 16-byte MAC key (None: unauthenticated rack)
    hop: dict | None = None         # the rack's emulated network (RackConfig.hop): the client
    #                                 is an endpoint of the rack, its hops are delayed too


def resolve_target(rack=None, servers=(), transport=None, key_file=None) -> Target:
    """The servers to load, from a rack file or ``--server`` addresses, and the rack key
    (``key_file``, else MALCOLM_RACK_KEY_FILE, else the rack file's ``key_file``)."""
    from malcolm.runtime.config import ConfigError, load_rack, rack_key, read_key
    if rack and servers:
        raise LoadgenError("give either --rack or --server, not both")
    try:
        cfg = load_rack(rack) if rack else None
        key = read_key(key_file) if key_file else rack_key(cfg)
    except ConfigError as e:
        raise LoadgenError(str(e)) from None
    if rack:
        if transport and transport != cfg.transport:
            raise LoadgenError(f"--transport {transport} but the rack {rack} uses "
                               f"{cfg.transport}")
        return Target(cfg.transport, list(cfg.addresses), rack,
                      sum(max(1, s.workers) for s in cfg.servers), key=key, hop=cfg.hop)
    if not servers:
        raise LoadgenError("no servers: give --rack RACK.toml or --server HOST:PORT "
                           "(repeatable, or comma-separated)")
    try:
        flat = [s for item in servers for s in _units.split_items(item)]
    except ValueError as e:
        raise LoadgenError(f"--server {e}") from None
    kind = transport or "udp"
    if len(flat) > 64:
        raise LoadgenError(f"at most 64 servers, got {len(flat)}")
    _check_transport(kind)
    from malcolm.net.transport import check_address
    from malcolm.runtime.config import check_server_addresses
    for s in flat:      # here, not as the first run opens its endpoints: before any output
        try:
            check_address(kind, s)
        except ValueError as e:
            raise LoadgenError(f"bad server address: {e}") from None
    try:        # as a rack file: port 0, or an address twice, ran and no task completed
        check_server_addresses(kind, flat)
    except ValueError as e:
        raise LoadgenError(f"--server {e}") from None
    return Target(kind, flat, "--server", key=key)


def _check_transport(kind):
    if kind not in ("udp", "shm", "verbs"):
        raise LoadgenError(f"loadgen supports the udp, shm and verbs transports, not {kind!r} "
                           "(there is no silent fallback to another transport)")


def _open(kind, bind, i, servers=(), key=None):
    from malcolm.net.transport import TransportUnavailable, open_transport
    try:
        if kind == "udp":
            v6 = any(str(s).startswith("[") or str(s).count(":") > 1 for s in servers)
            return open_transport("udp", bind or ("[::]:0" if v6 else "0.0.0.0:0"))
        if kind == "verbs":
            return _open_verbs(bind, servers, key)
        return open_transport("shm", None, capacity=4096)
    except (TransportUnavailable, OSError, ValueError, RuntimeError) as e:
        raise LoadgenError(f"client {i}: cannot open a {kind} endpoint: {e}") from None


def _open_verbs(bind, servers, key, timeout_s=2.0):
    """A verbs endpoint (on ``bind``, else the RDMA device's first IPv4 address) that knows
    every server's queue pair before the run starts, where it can: the first message to an
    unknown destination would otherwise wait for its address answer inside the timed loop.
    A server that does not answer within ``timeout_s`` (down, or another rack key) is
    resolved in the background during the run; its tasks are reported as they go."""
    from malcolm.net.transport import open_transport
    tr = open_transport("verbs", bind, key=key)
    try:
        tr.announce(servers)
        t_end = time.monotonic() + timeout_s
        while (tr.stats()["peers"] < len(set(map(str, servers)))
               and time.monotonic() < t_end):
            tr.recv(0.01)           # polling applies the answers
    except BaseException:
        tr.close()
        raise
    return tr


# ---------------------------------------------------------------- a run

@dataclass
class LoadSpec:
    """Everything about a run except its base rate."""

    target: Target
    workload: str = "exp:50"
    duration_s: float = 5.0
    warmup_s: float = 1.0
    threads: int = 1
    timeout_s: float = 1.0
    shares: list | None = None
    changes: list = field(default_factory=list)
    policy: str | None = None            # a client policy spec (po2, po2:d=3, random)
    busy: bool = False
    spin_us: float = 50.0
    raw: bool = False
    raw_max: int = 10_000_000
    lag_threshold_us: float = 50.0
    seed: int = 1
    # common random numbers: every run with this seed and rate draws the same arrivals,
    # task types and GET keys (the streams depend on the seed and the thread, not on the
    # run's client id); off, two generators with one seed still draw independent streams
    crn: bool = False
    bind: str | None = None
    cpus: list | None = None             # pin client thread i to cpus[i % len(cpus)]
    nice: int | None = None              # the client threads' nice value (if permitted)
    app: object = None                   # a malcolm.loadgen.apps.AppSpec (real requests)
    arrivals: object = None              # a malcolm.loadgen.traffic.Arrivals (None: Poisson)
    payload: object = None               # a malcolm.loadgen.traffic.Payload (None: empty)
    segment_s: float = 0.0               # > 0: also report the run in segments this long
    draw_tol: float = 0.0                # > 0: the draw's offered work within it (draws.py)

    def validate(self):
        from malcolm.workloads import parse_workload
        _check_transport(self.target.transport)
        try:
            parse_workload(self.workload)
        except ValueError as e:
            raise LoadgenError(str(e)) from None
        if not self.duration_s > 0:
            raise LoadgenError("--duration must be > 0")
        if self.warmup_s < 0:
            raise LoadgenError("--warmup must be >= 0")
        if not 1 <= self.threads <= MAX_THREADS:
            raise LoadgenError(f"--threads must be in 1..{MAX_THREADS}")
        # A task's deadline is its send time plus the timeout in int64 ns, and the request
        # window is sized 4 x rate x timeout (a C long): a timeout no longer than the longest
        # run keeps both exact (a longer one could only wait for a task past any run's end).
        if not 0 < self.timeout_s <= MAX_RUN_S:
            raise LoadgenError(f"--timeout must be > 0 and at most {MAX_RUN_S:g} s "
                               "(about 11 days)")
        if not 0 <= self.seed < 2 ** 63:
            raise LoadgenError(f"--seed {self.seed} must be in 0..2**63-1")
        if not (math.isfinite(self.spin_us) and 0 <= self.spin_us <= 1e6):
            raise LoadgenError(f"--spin {self.spin_us} must be in 0..1000000")
        # the native client keeps the threshold as int64 ns; no send can be later than the
        # longest run is long, so a larger threshold could only overflow that
        if not 0 < self.lag_threshold_us <= MAX_RUN_S * 1e6:       # NaN fails this too
            raise LoadgenError(f"--lag-threshold {self.lag_threshold_us:g} µs must be > 0 "
                               f"and at most {MAX_RUN_S * 1e6:g} µs ({MAX_RUN_S:g} s)")
        if not 0 <= self.draw_tol < 1:
            raise LoadgenError(f"draw tolerance {self.draw_tol} must be in [0, 1)")
        if not 1 <= self.raw_max <= 1 << 31:
            raise LoadgenError(f"--raw-max {self.raw_max} must be in 1..2**31")
        if self.raw and self.raw_max < self.threads:
            # each client thread keeps raw_max // threads samples: none would keep any
            raise LoadgenError(f"--raw-max {self.raw_max} must be at least --threads "
                               f"({self.threads}): each thread keeps an equal share")
        if not math.isfinite(self.duration_s + self.warmup_s + self.timeout_s):
            raise LoadgenError("--duration, --warmup and --timeout must be finite")
        if self.duration_s + self.warmup_s > MAX_RUN_S:
            raise LoadgenError(f"--duration plus --warmup must be at most {MAX_RUN_S:g} s "
                               "(about 11 days)")
        if self.policy and self.shares is not None:
            raise LoadgenError("--shares and --policy exclude each other: a client policy "
                               "picks each task's server itself")
        if self.policy and any(c.shares is not None for c in self.changes):
            raise LoadgenError("--change shares=... cannot be used with a client --policy")
        if self.policy:
            self.client_policy(0)        # check it now, with a clear message
        pl = self.payload
        if pl is not None and pl.kind == "exp" and pl.b < pl.a:
            # capped below its mean, the sizes' real mean is far from MEAN (all 0 at MAX 0)
            raise LoadgenError(f"--payload-size exp:{pl.a}:{pl.b}: MAX is below MEAN; "
                               "give MAX >= MEAN (or a fixed size)")
        if self.app and self.payload is not None and not self.payload.empty:
            raise LoadgenError("--payload-size and --app exclude each other: the application "
                               "writes its own requests")
        if self.segment_s and not (0 < self.segment_s <= self.duration_s
                                   and self.duration_s / self.segment_s <= 256 + 1e-9):
            raise LoadgenError(f"segments of {self.segment_s:g} s: must be > 0, at most the "
                               f"duration ({self.duration_s:g} s) and at most 256 of them")
        for c in self.changes:
            if c.at_s > self.duration_s:
                raise LoadgenError(f"--change at {c.at_s:g} s is after the end of the run "
                                   f"({self.duration_s:g} s)")

    def check_rate(self, rate, what="rate"):
        """Raise LoadgenError unless the native schedule can keep a run at ``rate`` tasks/s:
        the rate and every ``--change``'s in MIN_RATE..MAX_RATE (a change may also pause,
        at 0), a trace's longest gap at most MAX_RUN_S, a request window that fits.
        ``what`` names the rate in the message."""
        arr = self.arrivals
        if arr is not None and arr.kind == "trace":
            longest = _longest_trace_gap(arr.gaps_us, self.threads)
            if math.isinf(longest):
                raise LoadgenError(f"trace {arr.source!r}: its gaps add up to more than a "
                                   "float holds; give them in smaller units")
        if not (math.isfinite(rate) and MIN_RATE <= rate <= MAX_RATE):
            raise LoadgenError(f"{what} {rate:g}/s must be in {MIN_RATE:g}..{MAX_RATE:g}")
        phases = self.phases(rate)
        for t, r, _ in phases[1:]:
            if r != 0 and not MIN_RATE <= r <= MAX_RATE:
                raise LoadgenError(f"--change at {t - self.warmup_s:g} s: rate {r:g}/s (base "
                                   f"{rate:g}/s) must be 0 or in {MIN_RATE:g}..{MAX_RATE:g}")
        if arr is not None and arr.kind == "trace":
            slowest = min(r for _, r, _ in phases if r > 0)
            gap = longest / slowest
            if not gap <= MAX_RUN_S:
                raise LoadgenError(f"trace {arr.source!r}: at {slowest:g}/s its longest gap "
                                   f"(per client thread) is {gap:.3g} s, longer than the "
                                   f"longest run ({MAX_RUN_S:g} s); the trace is too uneven "
                                   "for this rate")
        # the native client's request window (LoadClient), per thread: it must fit 2**26
        peak = max(r for _, r, _ in phases) / self.threads
        if 4 * peak * (self.timeout_s + 0.05) + 4096 > 1 << 26:
            raise LoadgenError(f"rate {rate:g}/s: a request window of more than 2**26 tasks "
                               "(4 x rate x --timeout per thread) is too large; lower the "
                               "rate or the timeout, or use more client threads")

    def client_policy(self, stream):
        if not self.policy:
            return None
        from malcolm.policy import registry
        try:
            if self.policy.strip().lower() == "random":
                # the uniform base ClientPolicy (the registry's "random" is the server one)
                name, params, info = "random", {}, None
            else:
                name, params = registry.parse_policy(self.policy)
                info = registry.POLICIES.get(name)
            if info is not None and info.kind != "client":
                where = ("set it in the rack file's [policy] section: it runs in the "
                         "gateways" if info.kind == "server" else "it exists only in the "
                         "simulator")
                raise LoadgenError(f"--policy {name} is a {info.kind} policy; {where}. "
                                   f"Client policies: random, "
                                   f"{', '.join(registry.CLIENT_POLICIES)}")
            return registry.make_client_policy(name, len(self.target.servers), self.seed,
                                               stream, **params)
        except LoadgenError:
            raise
        except ValueError as e:
            raise LoadgenError(str(e)) from None

    def phases(self, rate):
        """(start_s from the run's start, total rate, shares) with the warm-up included."""
        out = [(0.0, rate, self.shares)]
        cur_rate, cur_shares = rate, self.shares
        for c in sorted(self.changes, key=lambda c: c.at_s):
            if c.rate is not None:
                cur_rate = c.rate
            if c.factor is not None:
                cur_rate = rate * c.factor
            if c.shares is not None:
                cur_shares = c.shares
            out.append((self.warmup_s + c.at_s, cur_rate, cur_shares))
        return out


def run_load(spec: LoadSpec, rate: float, stop_event: threading.Event | None = None):
    """Run one open-loop load at ``rate`` tasks/s; return the report (a dict)."""
    from malcolm.loadgen._client import LoadClient
    from malcolm.loadgen.threads import run_threads
    from malcolm.workloads import parse_workload

    spec.validate()
    spec.check_rate(rate)
    wl = parse_workload(spec.workload)
    phases = spec.phases(rate)
    per = [(t, r / spec.threads, s) for t, r, s in phases]
    base_id = (os.getpid() * 64 + int(time.monotonic_ns() // 1000)) & 0x3FFFFFF
    clients, trs, kv, seeds, streams = [], [], [], [], []
    try:
        arr = spec.arrivals
        pl = spec.payload
        for i in range(spec.threads):
            sched = (arr or traffic.Arrivals()).for_thread(i, spec.threads, rate)
            tr = _open(spec.target.transport, spec.bind, i, spec.target.servers,
                       spec.target.key)
            if spec.target.hop:
                from malcolm.net.delay import wrap
                tr = wrap(tr, seed=spec.seed * 64 + 63 - i, **spec.target.hop)
            trs.append(tr)
            try:
                servers = [tr.parse(s) for s in spec.target.servers]
            except ValueError as e:
                raise LoadgenError(f"bad server address: {e}") from None
            cid = ((base_id << 6) + i) & 0xFFFFFFFF
            stream = (spec.seed * 64 + i) & 0x7FFFFFFFFFFFFFFF if spec.crn else -1
            kv.append(spec.app.make(cid if stream < 0 else stream) if spec.app else None)
            seeds.append((spec.seed * 1_000_003 + int(rate)) & 0xFFFFFFFFFFFFFFFF)
            streams.append(stream)
            try:
                clients.append(LoadClient(
                    tr, servers, wl.native(), client_id=cid, stream=stream,
                    seed=seeds[-1], phases=per,
                    warmup_s=spec.warmup_s, duration_s=spec.duration_s,
                    timeout_s=spec.timeout_s, policy=spec.client_policy(i), busy=spec.busy,
                    spin_us=spec.spin_us,
                    raw_capacity=(spec.raw_max // spec.threads) if spec.raw else 0,
                    lag_threshold_us=spec.lag_threshold_us, app=kv[-1], key=spec.target.key,
                    arrival=sched["arrival"], trace=sched["trace"],
                    first_offset_s=sched["first_offset_s"],
                    payload_size=pl.native if pl is not None else (0, 0, 0),
                    payload_content=traffic.CONTENTS[pl.content] if pl is not None else 0,
                    check_echo=pl is not None and pl.check_echo, segment_s=spec.segment_s))
            except ValueError as e:     # its request window: too high a rate x timeout
                raise LoadgenError(f"rate {rate:g}/s: {e}") from None
        draw = None
        if spec.draw_tol and spec.app is None:     # an application requests no service time
            work = draws.expected_work_ns(phases, spec.warmup_s, spec.duration_s,
                                          wl.mean_us * 1e3)
            draw = draws.choose(clients, seeds, streams, work, spec.draw_tol) if work else None
        from malcolm._core import now_ns
        t0 = now_ns() + 20_000_000         # every thread starts on the same schedule
        # a thread that raises stops the run, and the caller gets its exception
        interrupted = run_threads(clients, t0, spec, stop_event, abandon=trs.clear)
        results = [c.results() for c in clients]
    finally:
        # the emulated network's counters (malcolm.net.delay wraps the transport), and the
        # transport's own where it has some (verbs)
        emu = [tr.stats() for tr in trs if hasattr(tr, "inner")]
        own = [t.stats() for t in (getattr(tr, "inner", tr) for tr in trs)
               if hasattr(t, "stats")]
        for tr in trs:
            tr.close()
    rep = report(spec, rate, results, wl)
    if draw is not None:
        rep["draw"] = draw
    if own:
        rep["transport"] = {k: sum(o[k] for o in own) for k in own[0]
                            if isinstance(own[0][k], int) and not isinstance(own[0][k], bool)}
    if emu:         # the client side of the emulated network (malcolm.net.delay)
        rep["net_emulation"] = dict(emu[0], **{k: sum(e[k] for e in emu) for k in (
            "delayed", "net_lost", "reordered", "early")},
            max_late_us=max(e["max_late_us"] for e in emu))
    if spec.app:
        rep["workload"] = spec.app.describe()
        rep["app"] = spec.app.report([a.results() for a in kv])
    rep["interrupted"] = interrupted
    return rep


def report(spec: LoadSpec, rate, results, wl=None):
    """Merge the client threads' results into one report."""
    n = len(spec.target.servers)
    tot = {}
    for k in ("sent", "sent_warm", "completed", "timed_out", "warm_answered",
              "warm_timed_out", "migrated", "stolen", "late", "duplicates", "replayed",
              "unknown",
              "foreign", "malformed", "forged", "unexpected", "send_failed", "window_full",
              "late_sends", "late_episodes", "outstanding", "svc_req_ns", "svc_ns",
              "payload_bytes", "echo_checked", "echo_bad"):
        tot[k] = int(sum(r[k] for r in results))
    rejected = {STATUS_NAMES[s]: int(sum(r["rejected"][s] for r in results))
                for s in range(1, len(STATUS_NAMES))}
    rejected = {k: v for k, v in rejected.items() if v}
    lat = hist.merge([r["lat"] for r in results])
    lag = hist.merge([r["lag"] for r in results])
    raw = None
    if spec.raw:
        import numpy as np
        raw = np.concatenate([r["raw"] for r in results]) if results else np.zeros(0)
    qs = (("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9))
    if raw is not None and raw.size:
        lat_us = {k: hist.exact_percentile(raw, q) / 1e3 for k, q in qs}
        lat_us["source"] = "raw samples"
    else:
        lat_us = {k: hist.percentile(lat, q) / 1e3 for k, q in qs}
        lat_us["source"] = "histogram"
    lat_us.update(min=lat["min"] / 1e3 if lat["n"] else float("nan"),
                  max=lat["max"] / 1e3 if lat["n"] else float("nan"),
                  mean=hist.mean(lat) / 1e3)
    # The measured interval is the duration, cut short if the run was stopped.
    ends = [r["end_ns"] - r["t0_ns"] for r in results]
    dur = max(1e-9, min(spec.duration_s, (max(ends) / 1e9 if ends else 0) - spec.warmup_s))
    n_rej = sum(rejected.values())
    accounted = tot["completed"] + n_rej + tot["timed_out"]
    sent = tot["sent"]
    rep = {
        "rate": rate,
        "offered_per_s": sent / dur,
        "throughput_per_s": tot["completed"] / dur,
        "duration_s": dur,
        "warmup_s": spec.warmup_s,
        "threads": spec.threads,
        "transport": spec.target.transport,
        "servers": [str(s) for s in spec.target.servers],
        "workload": wl.describe() if wl is not None else spec.workload,
        "policy": spec.policy or ("shares" if spec.shares else "uniform"),
        "sent": sent,
        "completed": tot["completed"],
        "rejected": rejected,
        "rejected_total": n_rej,
        "timed_out": tot["timed_out"],
        "timeout_s": spec.timeout_s,
        "accounted": accounted == sent,
        "unaccounted": sent - accounted,
        "migrated": tot["migrated"],
        "stolen": tot["stolen"],
        "late_responses": tot["late"],
        "duplicates": tot["duplicates"],
        # copies of a response already taken (the network sent it twice): not a 2nd answer
        "replayed_responses": tot["replayed"],
        "unknown_responses": tot["unknown"] + tot["foreign"],
        "malformed": tot["malformed"] + tot["unexpected"],
        "forged": tot["forged"],
        "authenticated": spec.target.key is not None,
        "send_failed": tot["send_failed"],
        "window_full": tot["window_full"],
        "warmup": {"sent": tot["sent_warm"], "answered": tot["warm_answered"],
                   "timed_out": tot["warm_timed_out"]},
        "latency_us": lat_us,
        # What the servers measured (RESPONSE.service_ns) against what was asked: the
        # effective load is offered_per_s * measured_mean_us / workers, not the nominal one.
        "service_us": {
            "requested_mean": tot["svc_req_ns"] / sent / 1e3 if sent else float("nan"),
            "measured_mean": (tot["svc_ns"] / tot["completed"] / 1e3 if tot["completed"]
                              else float("nan")),
        },
        "schedule": {
            "late_sends": tot["late_sends"],
            "late_fraction": tot["late_sends"] / sent if sent else 0.0,
            "late_episodes": tot["late_episodes"],
            "threshold_us": spec.lag_threshold_us,
            "lag_p50_us": hist.percentile(lag, 50) / 1e3,
            "lag_p99_us": hist.percentile(lag, 99) / 1e3,
            "lag_max_us": lag["max"] / 1e3 if lag["n"] else float("nan"),
        },
        "per_server": {"sent": [int(sum(r["sent_to"][j] for r in results)) for j in range(n)],
                       "answered": [int(sum(r["answered_by"][j] for r in results))
                                    for j in range(n)]},
        "arrivals": spec.arrivals.describe() if spec.arrivals is not None else "poisson",
        "trace_rate_per_s": spec.arrivals.trace_rate() if spec.arrivals is not None else None,
        "payload": {"size": spec.payload.describe() if spec.payload is not None else "none",
                    "mean_bytes": tot["payload_bytes"] / sent if sent else 0.0,
                    "echo_checked": tot["echo_checked"], "echo_bad": tot["echo_bad"]},
        "phases": [{"at_s": t - spec.warmup_s, "rate": r, "shares": s}
                   for t, r, s in spec.phases(rate)],
        "histogram": {"unit": "ns", "n": int(lat["n"]), "buckets": hist.buckets(lat)},
    }
    w = spec.target.workers
    if w:
        # nominal: what was asked of the rack; effective: what it carried (measured times)
        svc = rep["service_us"]
        rep["nominal_load"] = rep["offered_per_s"] * svc["requested_mean"] * 1e-6 / w
        rep["effective_load"] = rep["offered_per_s"] * svc["measured_mean"] * 1e-6 / w
        rep["target_workers"] = w
    if raw is not None:
        rep["raw_samples"] = int(raw.size)
        rep["raw_truncated"] = any(r["raw_truncated"] for r in results)
    rep["_raw"] = raw
    rep["_lat"] = lat           # the merged native histogram (--hdr), not in the JSON
    if spec.segment_s:
        rep["segments"], rep["_seg_lat"] = segments(results, spec.warmup_s)
    return rep


def segments(results, warmup_s):
    """The client threads' per-segment counts and latencies merged, one dict a segment
    (by intended send time from the end of the warm-up), and the merged histograms.

    Each segment: ``start_s``, ``end_s``, ``sent``, ``completed``, ``rejected`` (by status
    name), ``timed_out``, ``late_sends``, ``migrated``, ``stolen``, ``p50_us``, ``p99_us`` and
    ``p99_ci_us`` (:func:`malcolm.loadgen.hist.percentile_ci`). ``t0_ns`` (CLOCK_MONOTONIC)
    is when the measured interval began, to line up other samples (servers' statistics).
    """
    segs = [r["segments"] for r in results if r.get("segments")]
    if not segs:
        return [], []
    seg_s = segs[0]["segment_s"]
    t0 = min(r["t0_ns"] for r in results) + int(warmup_s * 1e9)
    out, lats = [], []
    for i in range(len(segs[0]["counts"])):
        cs = [s["counts"][i] for s in segs]
        h = hist.merge([s["lat"][i] for s in segs])
        rej = {STATUS_NAMES[k]: int(sum(c["rejected"][k] for c in cs))
               for k in range(1, len(STATUS_NAMES))}
        lo, hi = hist.percentile_ci(h, 99)
        d = {"index": i, "start_s": i * seg_s, "end_s": (i + 1) * seg_s,
             "t0_ns": t0 + int(i * seg_s * 1e9)}
        for k in ("sent", "completed", "timed_out", "late_sends", "migrated", "stolen"):
            d[k] = int(sum(c[k] for c in cs))
        d.update(rejected={k: v for k, v in rej.items() if v}, rejected_total=sum(rej.values()),
                 p50_us=hist.percentile(h, 50) / 1e3, p99_us=hist.percentile(h, 99) / 1e3,
                 p99_ci_us=[lo / 1e3, hi / 1e3],
                 max_us=h["max"] / 1e3 if h["n"] else float("nan"))
        out.append(d)
        lats.append(h)
    return out, lats


def sweep(spec: LoadSpec, rates, on_result=None, stop_event=None):
    """Run each rate in turn; ``on_result(report)`` after each. Returns the reports."""
    out = []
    for r in rates:
        rep = run_load(spec, r, stop_event)
        out.append(rep)
        if on_result:
            on_result(rep)
        if rep.get("interrupted"):
            break
    return out


# ---------------------------------------------------------------- text output

def _f(v, w=9, d=1):
    return f"{v:{w}.{d}f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>{w}}"


HEADER = (f"{'rate/s':>9} {'offered/s':>9} {'tput/s':>9} {'p50 µs':>9} {'p99 µs':>9} "
          f"{'p99.9 µs':>9} {'max µs':>9} {'done':>8} {'reject':>7} {'timeout':>7} "
          f"{'migr':>6} {'stolen':>6} {'late-send':>9}")


def row(rep):
    lu = rep["latency_us"]
    return (f"{rep['rate']:9.0f} {rep['offered_per_s']:9.0f} {rep['throughput_per_s']:9.0f} "
            f"{_f(lu['p50'])} {_f(lu['p99'])} {_f(lu['p99.9'])} {_f(lu['max'])} "
            f"{rep['completed']:8d} {rep['rejected_total']:7d} {rep['timed_out']:7d} "
            f"{rep['migrated']:6d} {rep['stolen']:6d} "
            f"{100 * rep['schedule']['late_fraction']:8.2f}%")


def segment_lines(rep):
    """The run's segments (``LoadSpec.segment_s``), a line each; [] without."""
    segs = rep.get("segments") or []
    if not segs:
        return []
    out = [f"  {'segment s':>13} {'sent':>8} {'p50 µs':>9} {'p99 µs':>9} {'p99 95% CI':>21} "
           f"{'lost':>6} {'late-send':>9}"]
    for sg in segs:
        lo, hi = sg["p99_ci_us"]
        out.append(f"  {sg['start_s']:6.2f}-{sg['end_s']:<6.2f} {sg['sent']:8d} "
                   f"{_f(sg['p50_us'])} {_f(sg['p99_us'])} [{_f(lo)},{_f(hi)}] "
                   f"{sg['rejected_total'] + sg['timed_out']:6d} "
                   f"{100 * sg['late_sends'] / max(1, sg['sent']):8.2f}%")
    return out


def notes(rep):
    """Lines that explain what the row cannot: unaccounted tasks, a lagging generator."""
    out = []
    s = rep["schedule"]
    if s["late_sends"]:
        out.append(f"  generator fell behind its schedule: {s['late_sends']} sends "
                   f"({100 * s['late_fraction']:.2f}%) later than {s['threshold_us']:g} µs, "
                   f"in {s['late_episodes']} episode(s); worst {s['lag_max_us']:.0f} µs "
                   "(latency is still measured from the intended send time)")
    if rep.get("effective_load") is not None and math.isfinite(rep["effective_load"]):
        svc = rep["service_us"]
        nom = (f"nominal {rep['nominal_load']:.3f} (offered rate x requested mean "
               f"{svc['requested_mean']:.1f} µs / {rep['target_workers']} workers), "
               if svc["requested_mean"] > 0 else "")    # --app: requests ask no service time
        out.append(f"  load: {nom}effective {rep['effective_load']:.3f} (measured mean "
                   f"{svc['measured_mean']:.1f} µs)")
    if rep["rejected"]:
        out.append("  rejected by servers: " + ", ".join(f"{v} {k}" for k, v in
                                                        rep["rejected"].items()))
    if rep["timed_out"]:
        out.append(f"  {rep['timed_out']} task(s) timed out (no response within "
                   f"{rep['timeout_s']:g} s): they are not in the percentiles, so the tail "
                   "is a lower bound")
    if rep.get("raw_truncated"):
        out.append(f"  --raw-max: kept {rep['raw_samples']} of {rep['completed']} latency "
                   "samples (the first each thread completed): p50..p99.9 are exact over those "
                   "only; min, max and mean are over every task")
    for key, what in (("late_responses", "responses arrived after their task timed out"),
                      ("duplicates", "duplicate responses"),
                      ("unknown_responses", "responses to unknown requests"),
                      ("malformed", "malformed or unexpected datagrams"),
                      ("forged", "forged responses rejected (MAC did not verify)"),
                      ("send_failed", "tasks the transport could not send"),
                      ("window_full", "tasks given up because the request window was full")):
        if rep.get(key):
            out.append(f"  {rep[key]} {what}")
    if rep.get("payload", {}).get("echo_bad"):
        pl = rep["payload"]
        out.append(f"  WRONG ECHO: {pl['echo_bad']} of {pl['echo_checked']} responses did not "
                   "carry their task's payload pattern")
    if not rep["accounted"]:
        out.append(f"  WARNING: {rep['unaccounted']} task(s) unaccounted for")
    from malcolm.loadgen import apps
    out.extend(apps.lines(rep) + draws.lines(rep))
    if rep.get("interrupted"):
        out.append("  interrupted: the run was cut short")
    return out
