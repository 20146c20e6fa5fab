"""Service times that are what they claim: the ``bench`` handler, the servers' measured
service-time distribution, and the effective load the load generator reports."""

import time

import pytest
from malcolm.workers.handlers import Handler

from malcolm.loadgen.run import LoadSpec, Target, run_load


def test_bench_handler_never_ends_early_and_calibrates():
    h = Handler("bench")
    for us in (0, 3, 200, 1000):
        t0 = time.perf_counter_ns()
        rc, out = h.run(0, us * 1000)
        took = time.perf_counter_ns() - t0
        assert rc == 0 and out == b"" and took >= us * 1000
    cal = h.calibration()
    assert cal and all(1.0 <= m <= 500.0 and s >= o for m, s, o in cal)
    assert Handler("spin").calibration() is None


@pytest.mark.parametrize("spec", ["bench:q=1.5", "bench:max_spin_us=0", "bench:x=1",
                                  "bench:q=abc", "bench:q"])
def test_bench_handler_rejects_bad_options(spec):
    with pytest.raises(ValueError, match="bench"):
        Handler(spec)


def _server(handler, workers=2):
    from malcolm.net.ports import free_udp_ports
    from malcolm.runtime.config import build_server, parse_rack
    addr = f"127.0.0.1:{free_udp_ports(1)[0]}"
    cfg = parse_rack({"rack": {"name": "svc", "transport": "udp", "workers": workers,
                               "handler": handler, "window_us": 1000.0, "grace_s": 0.5},
                      "policy": {"name": "random"}, "server": [{"address": addr}]}, "<svc>")
    return build_server(cfg, 0).start(), addr


def test_server_reports_measured_service_times_and_loadgen_the_effective_load():
    srv, addr = _server("bench")
    try:
        rep = run_load(LoadSpec(Target("udp", [addr], "test", workers=2), workload="exp:200",
                                duration_s=0.5, warmup_s=0.1), 1000)
        st = srv.stats()
    finally:
        srv.stop(0.5)
    svc = st["service"]
    # every task the server ran is in its distribution, none shorter than 0, none lost
    assert svc["count"] == st["completed"] == rep["sent"] + rep["warmup"]["sent"]
    assert sum(c for _, _, c in svc["buckets"]) == svc["count"]
    assert 0 <= svc["min_us"] <= svc["p50_us"] <= svc["p99_us"] <= svc["max_us"]
    # the server's buckets are eight of the load generator's each (one histogram layout),
    # and its percentiles fall in them
    import numpy as np

    from malcolm.loadgen import hist
    for lo, hi, c in svc["buckets"]:
        i = int(np.searchsorted(hist.LOWER, lo))
        assert hist.LOWER[i] == lo and hist.UPPER[i + 7] == hi and i % 8 == 0 and c > 0
    for q in ("p50_us", "p99_us"):
        v = svc[q] * 1e3
        assert any(lo - 1 <= v <= hi for lo, hi, _ in svc["buckets"])
    s = rep["service_us"]
    # exp:200 sampled by the generator; the handler never ends a task early
    assert 100 < s["requested_mean"] < 400
    assert s["measured_mean"] >= s["requested_mean"]
    from malcolm.loadgen.method import effective_load
    eff = effective_load(rep["offered_per_s"], s["measured_mean"], 2)
    assert eff >= rep["offered_per_s"] * s["requested_mean"] * 1e-6 / 2 > 0
    # a target with known workers (a rack file): the report states both loads
    assert rep["effective_load"] == pytest.approx(eff)
    assert rep["nominal_load"] == pytest.approx(rep["offered_per_s"] * s["requested_mean"]
                                                * 1e-6 / 2)
    from malcolm.loadgen.run import notes
    assert any("effective" in ln and "nominal" in ln for ln in notes(rep))
