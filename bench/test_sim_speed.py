"""Simulator speed: simulated events per second on one core.

Run: ``python3 -m pytest bench/test_sim_speed.py --benchmark-only -q`` (pytest-benchmark,
from the repo root), or ``python3 bench/test_sim_speed.py`` for a table of events/s and
tasks/s per case.

An "event" is one simulated occurrence handled by the engine's loop: a client arrival, a
message reception (task, migrated task, steal request/reply, response, and each peer's
reception of a heartbeat), a completion or quantum end, a window tick. Rates are per CPU
second of the loop (``time.thread_time``), which on a shared machine is what one core
delivers; wall time is also shown by the table.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malcolm.sim import simulate  # noqa: E402

CASES = {
    # rack, policy, workload, load
    "jsq-8x8-exp50": ("8x8", "jsq", "exp:50", 0.8),
    "random-8x8-bimodal": ("8x8", "random", "bimodal", 0.8),
    "sed-2x14,9x4-hyperexp1": ("2x14,9x4", "sed", "hyperexp1", 0.8),
    "po2-2x14,9x4-hyperexp1": ("2x14,9x4", "po2", "hyperexp1", 0.8),
    "cfcfs-8x8-exp50": ("8x8", "cfcfs", "exp:50", 0.8),
    "racksched-8x8-hyperexp2": ("8x8", "racksched", "hyperexp2", 0.8),
    "malcolm-8x8-exp50": ("8x8", "malcolm", "exp:50", 0.8),
}


def run_case(case, tasks):
    rack, policy, workload, load = CASES[case]
    return simulate(rack=rack, policy=policy, workload=workload, load=load, tasks=tasks,
                    seed=1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_sim_events_per_second(benchmark, case):
    out = {}

    def run():
        out["r"] = run_case(case, 300_000)

    benchmark.pedantic(run, rounds=3, iterations=1)
    r = out["r"]
    benchmark.extra_info["events"] = r.events
    benchmark.extra_info["events_per_s"] = r.events_per_s
    benchmark.extra_info["tasks_per_s"] = r.generated / r.loop_s
    assert r.completed == r.generated
    # A floor well below what one core does here (see docs/simulator.md), so that only a
    # real regression fails it.
    assert r.events_per_s > 1.5e6


if __name__ == "__main__":
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    print(f"{'case':26} {'events':>10} {'ev/task':>7} {'cpu_s':>6} {'wall_s':>6} "
          f"{'Mev/s':>6} {'Mtask/s':>7}")
    for case in CASES:
        r = run_case(case, tasks)
        print(f"{case:26} {r.events:10d} {r.events / r.generated:7.2f} {r.loop_s:6.2f} "
              f"{r.wall_s:6.2f} {r.events_per_s / 1e6:6.2f} {r.generated / r.loop_s / 1e6:7.2f}")
