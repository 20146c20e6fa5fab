"""Service-time workloads: named distributions and a syntax for user-defined mixtures.

A workload is a finite mixture. Each component is a *task type* (the load estimator keeps
per-type service-rate averages), drawn with probability ``weight`` and with a service time
from one of a few distributions. All times are in microseconds here; the native sampler
(:mod:`malcolm._workload`) works in nanoseconds.

This module is pure Python (numpy only), so the load generator can import it without the
simulator being built.

Names
-----
``exp:MEAN``      Exp(MEAN), one type.
``const:V``, ``uniform:LO:HI``, ``lognormal:MEAN:SIGMA``
                  one type of any of the mixture's distributions (below): ``const:5`` is
                  ``mix:1:const:5``.
``bimodal``       90% 50 µs, 10% 500 µs (constants), thesis §7.1.2.
``hyperexp1``     50% Exp(50), 50% Exp(500).
``hyperexp2``     75% Exp(50), 20% Exp(500), 5% Exp(5000).
``rocksdb1``      90% GET(16), 10% GET(64).
``rocksdb2``      50% GET(16), 50% GET(64).
``rocksdb1-measured``, ``rocksdb2-measured``
                  the same mixes with the GET(16) and GET(64) service times measured on the
                  real ``rocksdb`` handler of this project's 2-vCPU development VM (empirical);
                  ``rocksdb1-measured:FILE`` takes them from another ``malcolm rocksdb
                  calibrate --json`` file.
``fig2.1a``       Exp(20) (thesis Fig 2.1, low dispersion).
``fig2.1b``       95% Exp(20), 5% Exp(400) (thesis Fig 2.1, high dispersion).
``fig3.2a``       50% Exp(10), 50% Exp(1000) (thesis Fig 3.2 "HyperExp-1").
``fig3.2b``       99.9% Exp(25), 0.1% Exp(25025) (thesis Fig 3.2 "HyperExp-2").
``empirical:FILE`` measured service times, µs, from a text file (numbers separated by
                  whitespace or commas, ``#`` comments): one task type whose service times
                  follow the samples' distribution (see :meth:`Workload.empirical`).

RocksDB service-time model: the thesis gives only the means of a GET(16) (about 30 µs) and a
GET(64) (about 100 µs) on its machines. A GET of n keys does a fixed amount of work, so we
model each as *near-constant*: lognormal with that mean and shape sigma = 0.1 (coefficient of
variation about 10%).

The ``-measured`` variants are empirical instead: the CPU time per GET of the real handler,
measured by ``malcolm rocksdb calibrate`` (20 000 GETs of each size, uniform keys over a
1 000 000-key dictionary of 16-byte values; ``docs/rocksdb.md`` has the run). They are read
from :data:`CALIBRATION_FILE` (``malcolm/data/rocksdb-calibration.json``), which
``malcolm rocksdb calibrate --update-workloads`` rewrites: 18 quantiles per size, dense in
the tail; the inverse CDF is linear between them.

Mixture syntax
--------------
``mix:W:DIST,W:DIST,...`` where each ``W`` is a positive weight (weights are normalised)
and ``DIST`` is one of

* ``const:V``          always V µs;
* ``exp:MEAN``         exponential with mean MEAN µs;
* ``uniform:LO:HI``    uniform on [LO, HI] µs;
* ``lognormal:MEAN:SIGMA``  lognormal with mean MEAN µs and shape SIGMA.

Example: ``mix:90:const:50,10:exp:500``. At most 16 components.

Every time given (V, MEAN, HI, a measured sample) is at most 1 s, and every V, MEAN or HI at
least 1 ns (0.001 µs); SIGMA is at most 3; weights are at most 1e9.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass, field

import numpy as np

from malcolm._units import ascii_number

MAX_COMPONENTS = 16
KINDS = ("const", "exp", "uniform", "lognormal", "empirical")
#: The distributions a ``DIST`` may name (alone, or in a mixture), and their parameters.
DIST_PARAMS = {"const": 1, "exp": 1, "uniform": 2, "lognormal": 2}
#: Quantiles kept of an empirical distribution (must match WL_EMP_N in _workload.pxd).
EMP_QUANTILES = 2048
#: The range of a service time (µs). The simulator and the runtime count time in integer ns:
#: below 1 ns a task takes no time at all, and a task of more than a second is no longer
#: microsecond-scale work (a longer one made ``malcolm sim`` run for hours, or overflow its
#: 64-bit clock and report negative latencies).
MIN_TIME_US, MAX_TIME_US = 0.001, 1e6
#: A lognormal's shape: beyond it the median is a few thousandths of the mean, which rests on
#: samples so rare that a run's mean service time (and so its load) is far from MEAN.
MAX_SIGMA = 3.0
#: A mixture weight (weights are normalised; a sum beyond the float range would be inf).
MAX_WEIGHT = 1e9


def _check_number(v, what, where, positive=True, hi=MAX_TIME_US, shown=None):
    """One number of a workload, the parser's or a hand-built :class:`Component`'s: finite,
    > 0 (>= 0 with ``positive=False``) and at most ``hi``; a positive time is also at least
    :data:`MIN_TIME_US`. ``where`` starts the message, ``shown`` is the number as written
    (default ``v``). Returns ``v`` as a float."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{where}: {what} must be a number, got {v!r}")
    shown = f"{v:g}" if shown is None else shown
    if not math.isfinite(v):
        raise ValueError(f"{where}: {what} must be finite, got {shown}")
    if v <= 0 if positive else v < 0:
        raise ValueError(f"{where}: {what} must be {'> 0' if positive else '>= 0'}, got {shown}")
    if v > hi:
        unit = " µs (1 s)" if hi == MAX_TIME_US else ""
        raise ValueError(f"{where}: {what} must be at most {hi:g}{unit}, got {shown}")
    if positive and hi == MAX_TIME_US and v < MIN_TIME_US:
        raise ValueError(f"{where}: {what} must be at least {MIN_TIME_US:g} µs "
                         f"(1 ns, the clock's resolution), got {shown}")
    return float(v)


#: What each distribution's parameters are called in messages.
_PARAM_NAMES = {"const": ("value",), "exp": ("mean",), "uniform": ("uniform low", "uniform high"),
                "lognormal": ("mean", "sigma"), "empirical": ("mean",)}


def _check_dist(kind, a, b, where, shown=(None, None)):
    """A distribution's parameters (``shown``: as written), by :func:`_check_number`."""
    names = _PARAM_NAMES[kind]
    if kind == "uniform":
        lo = _check_number(a, names[0], where, positive=False, shown=shown[0])
        if _check_number(b, names[1], where, shown=shown[1]) < lo:
            raise ValueError(f"{where}: uniform needs LO <= HI")
    elif kind == "lognormal":
        _check_number(a, names[0], where, shown=shown[0])
        _check_number(b, names[1], where, positive=False, hi=MAX_SIGMA, shown=shown[1])
    else:
        _check_number(a, names[0], where, shown=shown[0])


@dataclass(frozen=True)
class Component:
    """One task type: drawn with probability ``weight``, service time from ``kind``.

    Parameters
    ----------
    weight : float
        Probability of this type (the workload normalises weights to sum to 1).
    kind : str
        ``const``, ``exp``, ``uniform``, ``lognormal`` or ``empirical``.
    a, b : float
        Parameters in µs: const (V, -), exp (MEAN, -), uniform (LO, HI),
        lognormal (MEAN, SIGMA; SIGMA is dimensionless), empirical (MEAN, -).
    table : tuple of float, optional
        Empirical only: ``EMP_QUANTILES`` quantiles (µs) at probabilities k / (EMP_QUANTILES
        - 1), smallest to largest sample; service times are drawn from the inverse CDF,
        linear between them.

    Raises
    ------
    ValueError
        For a parameter outside the workload parser's limits (module docstring), named;
        TypeError for one that is not a number.
    """

    weight: float
    kind: str
    a: float
    b: float = 0.0
    table: tuple | None = field(default=None, repr=False)

    def __post_init__(self):
        # a hand-built one is held to the parser's limits (a negative or NaN mean, a zero
        # weight ran, or made every weight NaN); same function, same messages
        where = f"workload component {self.kind!r}"
        if self.kind not in KINDS:
            raise ValueError(f"{where}: unknown distribution (choose from {', '.join(KINDS)})")
        _check_number(self.weight, "weight", where, hi=MAX_WEIGHT)
        _check_dist(self.kind, self.a, self.b, where)
        if self.kind == "empirical":
            try:
                q = np.asarray(self.table, dtype=float)
            except (TypeError, ValueError):
                q = np.empty(0)
            if (q.shape != (EMP_QUANTILES,) or not np.all(np.isfinite(q)) or q[0] < 0
                    or q[-1] > MAX_TIME_US or np.any(np.diff(q) < 0)):
                raise ValueError(f"{where}: table must be {EMP_QUANTILES} rising quantiles "
                                 f"within 0-{MAX_TIME_US:g} µs")

    @property
    def mean_us(self) -> float:
        if self.kind == "uniform":
            return 0.5 * (self.a + self.b)
        return self.a

    @property
    def second_moment_us2(self) -> float:
        if self.kind == "empirical":
            # piecewise-linear inverse CDF: each segment is uniform on [q_k, q_k+1]
            q = np.asarray(self.table)
            lo, hi = q[:-1], q[1:]
            return float(np.mean((lo * lo + lo * hi + hi * hi) / 3))
        if self.kind == "const":
            return self.a**2
        if self.kind == "exp":
            return 2 * self.a**2
        if self.kind == "uniform":
            return (self.a**2 + self.a * self.b + self.b**2) / 3
        return self.a**2 * math.exp(self.b**2)

    def describe(self) -> str:
        if self.kind == "const":
            return f"{self.a:g}"
        if self.kind == "exp":
            return f"Exp({self.a:g})"
        if self.kind == "uniform":
            return f"U({self.a:g},{self.b:g})"
        if self.kind == "empirical":
            return f"Empirical(mean {self.a:.4g})"
        return f"LogN({self.a:g},{self.b:g})"


@dataclass(frozen=True)
class Workload:
    """A mixture of task types. Build one with :func:`parse_workload`.

    Parameters
    ----------
    name : str
        The workload's name in reports.
    components : tuple of Component
        1 to :data:`MAX_COMPONENTS` task types (each checked as the parser checks it).

    Raises
    ------
    ValueError
        For no components or too many; TypeError for a name or components of another type.
    """

    name: str
    components: tuple[Component, ...]

    def __post_init__(self):
        # the parser's limits for a hand-built one too (no components: NaN weights)
        if not isinstance(self.name, str):
            raise TypeError(f"workload name must be a string, got {self.name!r}")
        comps = self.components
        if isinstance(comps, list):
            object.__setattr__(self, "components", comps := tuple(comps))
        if not isinstance(comps, tuple) or not all(isinstance(c, Component) for c in comps):
            raise TypeError(f"workload {self.name!r}: components must be a tuple of "
                            f"Component, got {comps!r}")
        if not comps:
            raise ValueError(f"workload {self.name!r}: needs at least one component")
        if len(comps) > MAX_COMPONENTS:
            raise ValueError(f"workload {self.name!r}: at most {MAX_COMPONENTS} components")

    @classmethod
    def empirical(cls, samples_us, name: str = "empirical") -> Workload:
        """A one-type workload whose service times follow measured ones.

        Parameters
        ----------
        samples_us : array_like
            Service times in µs (at least 2, finite, >= 0, not all equal to 0), e.g. a
            handler's measured times. They are kept as ``EMP_QUANTILES`` quantiles, so the
            tail is resolved to 1 / EMP_QUANTILES (0.05%) of the probability.
        name : str
            The workload's name in reports.

        Raises
        ------
        ValueError
            With a message naming the problem.
        """
        try:
            x = np.asarray(samples_us, dtype=float).ravel()
        except (TypeError, ValueError):
            raise ValueError(f"workload {name!r}: samples must be numbers") from None
        if x.size < 2:
            raise ValueError(f"workload {name!r}: need at least 2 service-time samples, "
                             f"got {x.size}")
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            raise ValueError(f"workload {name!r}: service times must be finite and >= 0")
        if np.any(x > MAX_TIME_US):
            raise ValueError(f"workload {name!r}: service times must be at most "
                             f"{MAX_TIME_US:g} µs (1 s), got {float(x.max()):g}")
        q = np.quantile(x, np.linspace(0.0, 1.0, EMP_QUANTILES))
        q = np.maximum.accumulate(q)        # rounding must not make it decrease
        mean = float((q.sum() - 0.5 * (q[0] + q[-1])) / (EMP_QUANTILES - 1))
        if not mean >= MIN_TIME_US:
            raise ValueError(f"workload {name!r}: the mean service time must be at least "
                             f"{MIN_TIME_US:g} µs (1 ns, the clock's resolution)")
        return cls(name, (Component(1.0, "empirical", mean, 0.0, tuple(float(v) for v in q)),))

    @property
    def n_types(self) -> int:
        return len(self.components)

    @property
    def weights(self) -> np.ndarray:
        w = np.array([c.weight for c in self.components], dtype=float)
        return w / w.sum()

    @property
    def mean_us(self) -> float:
        """Mean service time in µs."""
        pairs = zip(self.weights, self.components, strict=True)
        return float(sum(p * c.mean_us for p, c in pairs))

    @property
    def scv(self) -> float:
        """Squared coefficient of variation of the service time."""
        pairs = zip(self.weights, self.components, strict=True)
        m2 = sum(p * c.second_moment_us2 for p, c in pairs)
        return float(m2 / self.mean_us**2 - 1.0)

    def describe(self) -> str:
        pairs = zip(self.weights, self.components, strict=True)
        parts = [f"{100 * p:g}%:{c.describe()}" for p, c in pairs]
        return f"{self.name} = " + " + ".join(parts) + f" (mean {self.mean_us:.4g} µs)"

    def sample(self, n: int, rng: np.random.Generator | None = None):
        """Draw ``n`` tasks with numpy: returns ``(types int32, service_us float64)``."""
        rng = np.random.default_rng() if rng is None else rng
        types = rng.choice(self.n_types, size=n, p=self.weights).astype(np.int32)
        out = np.empty(n)
        for t, c in enumerate(self.components):
            idx = np.flatnonzero(types == t)
            k = idx.size
            if c.kind == "const":
                out[idx] = c.a
            elif c.kind == "exp":
                out[idx] = rng.exponential(c.a, k)
            elif c.kind == "uniform":
                out[idx] = rng.uniform(c.a, c.b, k)
            elif c.kind == "empirical":
                q = np.asarray(c.table)
                out[idx] = np.interp(rng.uniform(0.0, 1.0, k) * (len(q) - 1),
                                     np.arange(len(q)), q)
            else:
                out[idx] = rng.lognormal(math.log(c.a) - 0.5 * c.b**2, c.b, k)
        return types, out

    def native(self):
        """The nogil sampler (:class:`malcolm._workload.NativeWorkload`) for this mixture."""
        from malcolm._workload import NativeWorkload

        tables = [c.table for c in self.components if c.kind == "empirical"]
        return NativeWorkload(
            [c.weight for c in self.components],
            [KINDS.index(c.kind) for c in self.components],
            [c.a for c in self.components],
            [c.b for c in self.components],
            tables=tables or None,
        )


def _exp(mean):
    return Component(1.0, "exp", float(mean))


def _lognormal_get(mean):
    return Component(1.0, "lognormal", float(mean), 0.1)


def _mixture(name, pairs):
    return Workload(name, tuple(Component(w, c.kind, c.a, c.b, c.table) for w, c in pairs))


def _from_quantiles(points_p, points_us):
    """An empirical component through the points (p, quantile µs), linear between them."""
    q = np.interp(np.linspace(0.0, 1.0, EMP_QUANTILES), points_p, points_us)
    mean = float((q.sum() - 0.5 * (q[0] + q[-1])) / (EMP_QUANTILES - 1))
    return Component(1.0, "empirical", mean, 0.0, tuple(float(v) for v in q))


#: The measurement behind ``rocksdb1-measured``/``rocksdb2-measured``: the JSON that
#: ``malcolm rocksdb calibrate --json`` writes (``--update-workloads`` writes it here). The one
#: shipped: ``malcolm rocksdb calibrate DB --samples 20000 --warmup-requests 20000`` on the
#: 2-vCPU AMD EPYC development VM, 2026-11-23 00:55 UTC, load average 8.3 (five other
#: engineers building); the same file as docs/figures/rocksdb-calibration.json.
CALIBRATION_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                "rocksdb-calibration.json")
#: (weight, GET size) of the measured mixes.
MEASURED_MIXES = {"rocksdb1-measured": ((90, 16), (10, 64)),
                  "rocksdb2-measured": ((50, 16), (50, 64))}


def read_calibration(path, clock="cpu"):
    """The quantiles of a ``malcolm rocksdb calibrate --json`` file.

    Returns
    -------
    dict
        ``{n: (probabilities, quantiles_us)}`` per GET size, for ``clock`` (``cpu``: the
        thread's CPU time per GET; ``wall``: with preemption). Raises ValueError (one line)
        for a file that is missing or not such a measurement.
    """
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        out = {}
        for sz in d["sizes"]:
            pts = sz[clock]["quantiles"]
            ps, qs = [float(p) for p, _ in pts], [float(q) for _, q in pts]
            if (len(ps) < 2 or ps[0] != 0.0 or ps[-1] != 1.0 or np.any(np.diff(ps) <= 0)
                    or np.any(np.diff(qs) < 0) or not qs[0] > 0 or not qs[-1] <= MAX_TIME_US):
                raise ValueError(f"GET({sz['n']}): quantiles must rise from p=0 to p=1, > 0 "
                                 f"and at most {MAX_TIME_US:g} µs")
            out[int(sz["n"])] = (ps, qs)
    except OSError as e:
        raise ValueError(f"cannot read the calibration {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{path} is not a `malcolm rocksdb calibrate --json` measurement "
                         f"({type(e).__name__}: {e})") from None
    if not out:
        raise ValueError(f"{path}: no GET sizes in the calibration")
    return out


def measured_workload(name, path=None):
    """``rocksdb1-measured``/``rocksdb2-measured`` from a calibration file (default: the
    shipped :data:`CALIBRATION_FILE`): the mix of that file's GET(16) and GET(64) CPU-time
    quantiles, linear between them."""
    cal = read_calibration(path or CALIBRATION_FILE)
    pairs = MEASURED_MIXES[name]
    missing = [n for _, n in pairs if n not in cal]
    if missing:
        raise ValueError(f"{path or CALIBRATION_FILE} has no GET({missing[0]}) (calibrate "
                         "with --sizes 16,64)")
    return _mixture(name if path is None else f"{name}:{path}",
                    [(w, _from_quantiles(*cal[n])) for w, n in pairs])


NAMED = {
    "bimodal": _mixture("bimodal", [(90, Component(1, "const", 50.0)),
                                    (10, Component(1, "const", 500.0))]),
    "hyperexp1": _mixture("hyperexp1", [(50, _exp(50)), (50, _exp(500))]),
    "hyperexp2": _mixture("hyperexp2", [(75, _exp(50)), (20, _exp(500)), (5, _exp(5000))]),
    "rocksdb1": _mixture("rocksdb1", [(90, _lognormal_get(30)), (10, _lognormal_get(100))]),
    "rocksdb2": _mixture("rocksdb2", [(50, _lognormal_get(30)), (50, _lognormal_get(100))]),
    **{name: measured_workload(name) for name in MEASURED_MIXES},
    "fig2.1a": _mixture("fig2.1a", [(1, _exp(20))]),
    "fig2.1b": _mixture("fig2.1b", [(95, _exp(20)), (5, _exp(400))]),
    "fig3.2a": _mixture("fig3.2a", [(50, _exp(10)), (50, _exp(1000))]),
    "fig3.2b": _mixture("fig3.2b", [(99.9, _exp(25)), (0.1, _exp(25025))]),
}

WORKLOAD_NAMES = ("exp:MEAN", "const:V", "uniform:LO:HI", "lognormal:MEAN:SIGMA", *NAMED,
                  "mix:W:DIST,...", "empirical:FILE")


def _read_samples(path, spec):
    """Service times (µs) from a text file: numbers separated by whitespace or commas."""
    from malcolm._files import read_text
    try:
        text = read_text(path, 256 << 20)   # a FIFO or /dev/zero: refused, not read
    except OSError as e:
        raise ValueError(f"workload {spec!r}: cannot read {path!r}: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"workload {spec!r}: {e}") from None
    vals = []
    for ln, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0]
        for tok in line.replace(",", " ").split():
            try:
                vals.append(ascii_number(tok))
            except ValueError:
                raise ValueError(f"workload {spec!r}: {path}:{ln}: {tok!r} is not a "
                                 "number") from None
    return vals


def _parse_number(text, what, spec):
    try:
        return ascii_number(text)
    except ValueError:
        raise ValueError(f"workload {spec!r}: {what} {text!r} is not a number") from None


def _num(text, what, spec, **limits):
    """A number from a workload spec, within :func:`_check_number`'s ``limits``."""
    v = _parse_number(text, what, spec)
    return _check_number(v, what, f"workload {spec!r}", shown=text, **limits)


def _parse_dist(fields, spec):
    kind, args = fields[0], fields[1:]
    if kind not in DIST_PARAMS:
        raise ValueError(f"workload {spec!r}: unknown distribution {kind!r} "
                         f"(choose from {', '.join(DIST_PARAMS)})")
    if len(args) != DIST_PARAMS[kind]:
        raise ValueError(f"workload {spec!r}: {kind} takes {DIST_PARAMS[kind]} parameter(s), "
                         f"got {len(args)}")
    vals = [_parse_number(t, what, spec) for t, what in zip(args, _PARAM_NAMES[kind],
                                                              strict=True)]
    pad = 2 - len(args)
    _check_dist(kind, *vals, *[0.0] * pad, f"workload {spec!r}", shown=(*args, *[None] * pad))
    return Component(1.0, kind, *vals)


def parse_workload(spec: str | Workload) -> Workload:
    """Turn a workload name or mixture spec into a :class:`Workload`.

    Raises
    ------
    ValueError
        With a message that names the problem and the accepted forms.
    """
    if isinstance(spec, Workload):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"workload must be a non-empty string, got {spec!r}")
    s = spec.strip()
    low = s.lower()
    if low in NAMED:
        return NAMED[low]
    name, colon, path = s.partition(":")
    if colon and name.lower() in MEASURED_MIXES:
        try:
            return measured_workload(name.lower(), path.strip())
        except ValueError as e:
            raise ValueError(f"workload {spec!r}: {e}") from None
    if low.startswith("empirical:"):
        path = s[len("empirical:"):].strip()
        if not path:
            raise ValueError(f"workload {spec!r}: empirical needs a file, empirical:FILE")
        return Workload.empirical(_read_samples(path, spec), name=s)
    if low.split(":", 1)[0] in DIST_PARAMS:
        # one task type: exp:MEAN, const:V, ... (a mixture's DIST alone)
        return Workload(s, (_parse_dist([f.strip() for f in low.split(":")], spec),))
    if low.startswith("mix:"):
        parts = [p.strip() for p in s[4:].split(",")]
        if not parts or parts == [""]:
            raise ValueError(f"workload {spec!r}: mix needs at least one component "
                             "W:DIST, e.g. mix:90:const:50,10:exp:500")
        if len(parts) > MAX_COMPONENTS:
            raise ValueError(f"workload {spec!r}: at most {MAX_COMPONENTS} components")
        comps = []
        for p in parts:
            fields = [f.strip().lower() for f in p.split(":")]
            if len(fields) < 3:
                raise ValueError(f"workload {spec!r}: component {p!r} must look like "
                                 "W:DIST:PARAMS, e.g. 10:exp:500")
            w = _num(fields[0], "weight", spec, hi=MAX_WEIGHT)
            c = _parse_dist(fields[1:], spec)
            comps.append(Component(w, c.kind, c.a, c.b))
        return Workload(s, tuple(comps))
    raise ValueError(
        f"unknown workload {spec!r}; choose from {', '.join(WORKLOAD_NAMES)} "
        "(mixture example: mix:90:const:50,10:exp:500)")
