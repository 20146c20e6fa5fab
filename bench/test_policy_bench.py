"""Benchmarks of Malcolm's policy (thesis Table 6.1): run ``pytest bench/test_policy_bench.py``.

Each round is one call of ``bench_policy(n, ITERS)``, which times native loops of ``ITERS``
operations (see its docstring for exactly what each key covers). pytest-benchmark's figure is
per round; ``extra_info`` holds the best per-operation costs in ns over the rounds.
"""

import pytest

ac = pytest.importorskip("malcolm.bench.policy")

SIZES = (4, 8, 16, 32)
ITERS = 50_000
KEYS = ("dist_update_ns", "param_update_ns", "param_grad_ns", "adamw_ns", "decide_ns")


@pytest.mark.parametrize("n", SIZES)
def test_policy_step_costs(benchmark, n):
    runs = []
    benchmark.pedantic(lambda: runs.append(ac.bench_policy(n, ITERS)), rounds=5, iterations=1)
    for k in KEYS:
        benchmark.extra_info[f"{k}.{n}"] = min(r[f"{k}.{n}"] for r in runs)
    best = benchmark.extra_info
    # sanity bounds, loose enough for a shared, noisy machine
    assert 0 < best[f"decide_ns.{n}"] < 1_000
    assert 0 < best[f"dist_update_ns.{n}"] < 100_000
    assert 0 < best[f"param_update_ns.{n}"] < 1_000_000
    assert best[f"param_grad_ns.{n}"] < best[f"param_update_ns.{n}"]
