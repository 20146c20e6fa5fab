"""Measure the ``rocksdb`` handler's GET(n) service times on this machine (``malcolm rocksdb
calibrate``): the numbers the simulator's empirical ``rocksdb1e``/``rocksdb2e`` workloads
are made of (``malcolm.workloads``)."""

from __future__ import annotations

import os
import platform
import time

import numpy as np

# The probabilities at which the measurement is kept: dense in the tail, which is what a
# p99 simulation is sensitive to. ``malcolm.workloads.Empirical`` interpolates between them.
QUANTILES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98,
             0.99, 0.995, 0.999, 1.0)


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def draw_keys(n_keys, rows, n, zipf_s, rng):
    """``rows`` GETs of ``n`` keys each, uniform or Zipf(s) (as the load generator draws)."""
    if not zipf_s:
        return rng.integers(0, n_keys, size=(rows, n), dtype=np.uint32)
    from malcolm.loadgen.apps import zipf_tables
    cdf, _ = zipf_tables(n_keys, zipf_s)
    ranks = np.searchsorted(cdf, rng.random((rows, n)), side="right").astype(np.uint64)
    ranks = np.minimum(ranks, n_keys - 1)
    mul = 2654435761 % n_keys if n_keys % 2654435761 else 1
    if mul == 0 or np.gcd(mul, n_keys) != 1:
        mul = 1
    return ((ranks * np.uint64(mul)) % np.uint64(n_keys)).astype(np.uint32)


def _stats(t_us):
    return {"mean_us": float(t_us.mean()), "p50_us": float(np.quantile(t_us, 0.5)),
            "p99_us": float(np.quantile(t_us, 0.99)),
            "p999_us": float(np.quantile(t_us, 0.999)), "max_us": float(t_us.max()),
            "quantiles": [[p, float(v)] for p, v in
                          zip(QUANTILES, np.quantile(t_us, QUANTILES), strict=True)]}


def calibrate(db, sizes, samples=20000, warmup=2000, zipf_s=0.0, seed=1):
    """Time ``samples`` GET(n) for each n in ``sizes`` (after ``warmup`` untimed ones).

    Each size gets two measurements of the same calls: ``wall`` (CLOCK_MONOTONIC around the
    call, what a server's worker measures, preemption included) and ``cpu`` (the thread's CPU
    time: the work alone). On a shared machine the two differ in the tail only.
    """
    from malcolm.workers.rocksdb import time_gets
    if samples < 100:
        raise ValueError("--samples must be at least 100")
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        if not 1 <= n <= db.max_keys:
            raise ValueError(f"GET({n}) is out of range 1..{db.max_keys} for "
                             f"{db.value_size}-byte values")
        time_gets(db, draw_keys(db.n_keys, warmup, n, zipf_s, rng))
        wall, cpu = time_gets(db, draw_keys(db.n_keys, samples, n, zipf_s, rng))
        out.append({"n": n, "samples": int(wall.size), "wall": _stats(wall / 1e3),
                    "cpu": _stats(cpu / 1e3)})
    return {"what": "rocksdb handler GET(n) service time, one thread, in-process",
            "db": {"path": os.path.abspath(db.path), "keys": db.n_keys,
                   "value_size": db.value_size},
            "key_dist": f"zipf:{zipf_s:g}" if zipf_s else "uniform",
            "machine": {"cpu": _cpu_model(), "cpus": os.cpu_count(),
                        "load_avg": os.getloadavg()},
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "sizes": out}
