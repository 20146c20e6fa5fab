"""Runtime benchmarks beside their floors (run: ``pytest bench/test_runtime_bench.py``).

Each benchmark records the malcolm figure and the plain-C floor measured in the same round in
``extra_info``; ``malcolm bench runtime`` prints the same figures as a table. The assertions
only check that the measurements are sane (they run on a noisy shared VM).
"""

import json

import pytest
from click.testing import CliRunner

from malcolm.bench import runtime


@pytest.mark.parametrize("kind", ["udp", "shm"])
def test_round_trip(benchmark, kind):
    res = benchmark.pedantic(lambda: runtime.round_trip(kind, 3000, poll="adaptive", max_s=1.0),
                             rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    assert res["floor"]["n"] > 0 and res["malcolm"]["n"] > 0
    assert 0 < res["floor"]["p50_us"] <= res["floor"]["p99_us"]
    assert 0 < res["malcolm"]["p50_us"] <= res["malcolm"]["p99_us"]


@pytest.mark.parametrize("kind", ["udp", "shm"])
def test_inline_busy_round_trip(benchmark, kind):
    res = benchmark.pedantic(lambda: runtime.round_trip(kind, 3000, workers=0, max_s=1.0),
                             rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    assert res["spinners"] == 2 and res["malcolm"]["n"] > 0
    assert 0 < res["malcolm"]["p50_us"] <= res["malcolm"]["p99_us"]


@pytest.mark.parametrize("kind", ["udp", "shm"])
def test_gateway_throughput(benchmark, kind):
    res = benchmark.pedantic(lambda: runtime.gateway_throughput(kind, 0.5), rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    assert res["malcolm"]["per_wall_s"] > 1000      # it answers thousands of tasks a second
    assert res["floor"]["per_cpu_s"] > 0
    # the gateway's busy time is part of its wall time, so per busy second >= per wall second
    assert res["malcolm"]["per_busy_s"] >= res["malcolm"]["per_wall_s"]


def test_decision_overhead(benchmark):
    res = benchmark.pedantic(lambda: runtime.decision(3, 100_000), rounds=1, iterations=1)
    benchmark.extra_info.update(res)
    for name in ("random", "jsq", "malcolm"):
        assert 0 < res[name]["decide_ns"] < 10_000


def test_cli_json():
    from malcolm.cli import main
    r = CliRunner().invoke(main, ["bench", "runtime", "--quick", "--json",
                                  "--transport", "shm"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert set(d["round_trip"]) == {"shm", "shm_inline", "shm_blocking"}
    assert d["round_trip"]["shm_inline"]["workers"] == 0
    assert "malcolm" in d["decision"]
