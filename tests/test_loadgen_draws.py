"""A run's draw picked for its offered work (``malcolm/loadgen/draws.py``): the native client
plans exactly what a run then sends, the runner holds the measured window's work to its load,
and every run of one seed gets the same draw (common random numbers)."""

import pytest

from malcolm.loadgen import draws, traffic
from malcolm.loadgen.run import LoadgenError, LoadSpec, Target, run_load
from malcolm.loadgen.stub import StubServer
from malcolm.workloads import parse_workload


def _run(stub, tol, seed=3, **kw):
    spec = LoadSpec(Target("udp", [stub.address], "test"), workload="hyperexp2",
                    warmup_s=0.1, duration_s=1.0, threads=2, seed=seed, crn=True,
                    draw_tol=tol, payload=traffic.parse_payload("uniform:0:64", "random"),
                    **kw)
    rep = run_load(spec, 2000)
    assert rep["accounted"] and rep["timed_out"] == 0, rep
    expected = 2000 * 1.0 * parse_workload("hyperexp2").mean_us
    work = rep["service_us"]["requested_mean"] * rep["sent"]        # µs of the measured sends
    return rep, work / expected


def test_a_run_sends_the_draw_it_planned_and_its_work_is_its_load():
    with StubServer("udp", delay_us=100) as s:
        free, free_ratio = _run(s, 0.0)
        held, ratio = _run(s, 0.01)
        again, ratio2 = _run(s, 0.01)
    assert "draw" not in free
    d = held["draw"]
    assert d["within"] and d["tol"] == 0.01 and d["tried"] == d["candidate"] + 1
    # the run sent what the plan drew, to the nanosecond (two threads, random payloads of
    # random sizes: every draw of the run in the plan's order)
    assert abs(ratio - d["work_ratio"]) < 1e-9
    assert abs(ratio - 1) <= 0.01
    # HyperExp-2 over about 2 000 tasks: +/-9% by chance; this seed's own draw is off by more
    # than the tolerance, so the selection moved it (candidate > 0)
    assert abs(free_ratio - 1) > 0.01 and d["candidate"] > 0
    # common random numbers: the same seed, the same draw
    assert again["draw"] == d and again["sent"] == held["sent"] and ratio2 == ratio


class _Fake:
    """A client whose candidate draws offer the given works, in order."""

    def __init__(self, works):
        self.works, self.seeds, self.reseeded = works, [], None

    def plan(self, seed, stream):
        self.seeds.append(seed)
        return 0, self.works[len(self.seeds) - 1]

    def reseed(self, seed, stream):
        self.reseeded = seed


def test_choose_takes_the_first_draw_within_the_tolerance_or_the_nearest():
    c = _Fake([1100, 980, 1004, 1000])
    d = draws.choose([c], [7], [0], 1000.0, tol=0.01)
    assert d == {"candidate": 2, "work_ratio": 1.004, "tol": 0.01, "tried": 3, "within": True}
    assert c.seeds[0] == 7 and c.reseeded == draws.candidate_seed(7, 2) == c.seeds[2] != 7
    c = _Fake([1030, 1020, 1050])
    d = draws.choose([c], [7], [0], 1000.0, tol=0.01, limit=3)
    assert d["candidate"] == 1 and not d["within"] and d["tried"] == 3
    c = _Fake([1000])
    assert draws.choose([c], [7], [0], 1000.0)["candidate"] == 0 and c.reseeded is None
    with pytest.raises(ValueError, match="expected work"):
        draws.choose([c], [7], [0], 0.0)


def test_expected_work_follows_the_phases_over_the_measured_window():
    # 1 s of warm-up, 2 s measured; the rate doubles 1.5 s into the run, then stops at 2.5 s
    phases = [(0.0, 100.0, None), (1.5, 200.0, None), (2.5, 0.0, None)]
    assert draws.expected_work_ns(phases, 1.0, 2.0, 10.0) == (100 * 0.5 + 200 * 1.0) * 10
    assert draws.expected_work_ns([(0.0, 50.0, None)], 0.5, 2.0, 4.0) == 400.0


def test_a_bad_draw_tolerance_is_refused():
    spec = LoadSpec(Target("udp", ["127.0.0.1:9"], "test"), draw_tol=1.5)
    with pytest.raises(LoadgenError, match="draw tolerance"):
        spec.validate()


def test_loadgen_hold_load_holds_the_work_and_says_so():
    import json

    from click.testing import CliRunner

    from malcolm.cli import main
    with StubServer("udp", delay_us=100) as s:
        base = ["loadgen", "--server", s.address, "--rate", "1500", "--duration", "1s",
                "--warmup", "0.1s", "--workload", "bimodal", "--seed", "4"]
        r = CliRunner().invoke(main, base + ["--hold-load", "0.5%"])
        assert r.exit_code == 0, r.output
        assert "draw: candidate " in r.output and "(within 0.5%)" in r.output
        j = CliRunner().invoke(main, base + ["--hold-load", "0.005", "--json", "-"])
    rep = json.loads(j.output)["runs"][0]
    assert rep["draw"]["within"] and rep["draw"]["tol"] == 0.005
    work = rep["service_us"]["requested_mean"] * rep["sent"]
    assert abs(work / (1500 * 1.0 * 95.0) - 1) <= 0.005
    for bad, msg in ((["--hold-load", "0"], "above 0%"), (["--hold-load", "x"], "percentage"),
                     (["--hold-load", "1%", "--app", "rocksdb1"], "exclude each other")):
        r = CliRunner().invoke(main, base + bad)
        assert r.exit_code != 0 and msg in r.output and "Traceback" not in r.output, r.output


def test_plan_leaves_the_stream_as_it_was_and_reseed_adopts_the_planned_one():
    import numpy as np
    from malcolm.loadgen._client import LoadClient
    from malcolm.net.transport import open_transport
    trs = []

    def client(seed, stream):
        trs.append(open_transport("udp", "127.0.0.1:0"))
        return LoadClient(trs[-1], ["127.0.0.1:9"], parse_workload("bimodal").native(),
                          client_id=1, seed=seed, stream=stream,
                          phases=[(0.0, 5000.0, None)], warmup_s=0.1, duration_s=1.0,
                          timeout_s=1.0, payload_size=(1, 0, 64), payload_content=1)
    try:
        a, b, c = client(5, 3), client(5, 3), client(99, 4)
        n, work = a.plan(99, 4)
        assert a.plan(99, 4) == (n, work) and 4000 < n < 6000
        assert a.plan(5, 3) != (n, work)
        assert np.array_equal(a.preview(300), b.preview(300))   # its own stream, untouched
        d = client(5, 3)
        d.reseed(99, 4)
        assert np.array_equal(d.preview(300), c.preview(300))   # the planned stream
    finally:
        for t in trs:
            t.close()


def test_choose_stops_planning_at_its_time_budget():
    c = _Fake([2000] * 1000)
    d = draws.choose([c], [7], [0], 1000.0, budget_s=0.0)
    assert d["tried"] == 1 and d["candidate"] == 0 and not d["within"]
