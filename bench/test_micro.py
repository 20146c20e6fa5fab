"""Microbenchmarks of the native core (run: ``pytest bench/test_micro.py``).

Each round runs one native loop of ``ITERS`` operations; pytest-benchmark times the rounds
(so its figures are per loop), and ``extra_info['ns_per_op']`` is the best per-operation cost
measured inside the loops. ``malcolm bench micro`` prints the same figures as a table.
"""

import pytest

from malcolm.bench import micro

SIZES = (4, 8, 16, 32)
ITERS = 200_000


def _run(benchmark, op, n):
    best = []
    benchmark.pedantic(lambda: best.append(micro.single(op, n, ITERS)), rounds=7,
                       iterations=1)
    benchmark.extra_info["ns_per_op"] = min(best)
    benchmark.extra_info["ops_per_round"] = ITERS
    assert 0 < min(best) < 10_000


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op", ["sample", "incremental", "rebuild"])
def test_distribution(benchmark, op, n):
    _run(benchmark, op, n)


@pytest.mark.parametrize("op", ["mpmc", "spsc"])
def test_queue_pushpop(benchmark, op):
    _run(benchmark, op, 0)


def test_estimator_observe(benchmark):
    """One completion recorded by the load estimator (four workers, one type)."""
    _run(benchmark, "estimator", 4)
