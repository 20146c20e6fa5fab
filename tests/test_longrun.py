"""The long-run benchmark's pieces (``bench/longrun.py``, ``malcolm/loadgen/longrun.py``):
the load generator's per-segment report adds up and shows a stall in its own segment; the
servers' samples become per-segment queue depth, rate, window pace and memory; and the trend
verdict passes a flat noisy series and fails a degrading one. A few seconds."""

import math
import random
import threading
import time

import pytest
from malcolm.loadgen._hist_py import hist_from_values

from malcolm.loadgen import hist, longrun
from malcolm.loadgen.run import LoadgenError, LoadSpec, Target, run_load
from malcolm.loadgen.stub import StubServer


def _stall_after_first_task(stub, after_s, duration_s):
    """Stall ``stub`` ``after_s`` after the first task reached it (the schedule's start, to
    a millisecond or so), from a thread of its own: run_load's set-up time, which a loaded
    machine stretches, does not move the stall against the segments."""
    def go():
        t_end = time.monotonic() + 30.0
        while stub.core.tasks == 0 and time.monotonic() < t_end:
            time.sleep(0.0005)
        stub.stall(after_s, duration_s)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_segments_add_up_and_a_stall_lands_in_its_segment():
    """A 0.6 s stall 1.2 s into a 2.4 s run of 0.3 s segments (after 0.2 s of warm-up):
    the tasks sent in its first half time out (0.3 s), all in segment 4; those of its second
    half wait for its end, in segment 5; every count adds up to the run's."""
    with StubServer("udp", delay_us=300, every_reject=7, reject_status=1, every_drop=10,
                    every_migrated=5) as s:
        t = _stall_after_first_task(s, 0.2 + 1.2, 0.6)
        rep = run_load(LoadSpec(Target("udp", [s.address], "t"), warmup_s=0.2,
                                duration_s=2.4, timeout_s=0.3, segment_s=0.3), 1000)
        t.join(5.0)
    segs = rep["segments"]
    assert [sg["index"] for sg in segs] == list(range(8))
    assert segs[-1]["end_s"] == pytest.approx(2.4)
    for key, total in (("sent", rep["sent"]), ("completed", rep["completed"]),
                       ("rejected_total", rep["rejected_total"]),
                       ("timed_out", rep["timed_out"]), ("migrated", rep["migrated"])):
        assert sum(sg[key] for sg in segs) == total, key
    assert rep["timed_out"] > 0 and rep["rejected_total"] > 0
    tmo = [sg["timed_out"] for sg in segs]
    # every 10th task is never answered (about 30 a segment); the stall adds about 300
    assert tmo[4] > 3 * max(tmo[:3] + tmo[6:]), tmo
    assert segs[5]["p99_us"] > 100_000 and max(sg["p99_us"] for sg in segs[:3]) < 100_000
    for sg in segs:
        if math.isfinite(sg["p99_us"]):
            lo, hi = sg["p99_ci_us"]
            assert lo <= sg["p99_us"] <= hi


def test_segment_length_is_checked():
    t = Target("udp", ["127.0.0.1:9"], "t")
    for bad in (-1.0, 2.0, 0.001):
        with pytest.raises(LoadgenError, match="segments"):
            LoadSpec(t, duration_s=1.0, segment_s=bad).validate()


def test_percentile_ci_brackets_and_narrows():
    rng = random.Random(1)
    widths = []
    for n in (1_000, 100_000):
        h = hist_from_values([int(rng.expovariate(1 / 50_000)) for _ in range(n)])
        lo, hi = hist.percentile_ci(h, 99)
        assert lo <= hist.percentile(h, 99) <= hi
        widths.append((hi - lo) / hist.percentile(h, 99))
    assert widths[1] < widths[0] / 3
    assert all(math.isnan(x) for x in hist.percentile_ci(hist.empty(), 99))


def _seg(p99, sent=10_000, lost=0, flags=(), ci=0.03):
    return {"p99_us": p99, "p99_ci_us": [p99 * (1 - ci), p99 * (1 + ci)], "sent": sent,
            "rejected_total": lost, "timed_out": 0, "flags": list(flags)}


def test_verdict_passes_flat_noise_and_fails_degradation():
    rng = random.Random(7)
    # flat, with segment-to-segment noise of +-15%: 50 series of 12 segments
    fails = 0
    for _ in range(50):
        flat = [_seg(500 * (1 + rng.uniform(-0.15, 0.15))) for _ in range(12)]
        fails += longrun.trend_verdict([flat], settle=1, compare=3)["status"] == "fail"
    assert fails <= 2, fails
    # the same noise on a p99 that grows 10% a segment (x2.6 over the run): nearly always
    caught = 0
    for _ in range(20):
        grow = [_seg(500 * 1.1 ** i * (1 + rng.uniform(-0.15, 0.15))) for i in range(12)]
        v = longrun.trend_verdict([grow], settle=1, compare=3)
        caught += v["status"] == "fail" and "p99 rose" in v["why"] and v["ratio"] > 1.5
    assert caught >= 18, caught
    # a rise to a plateau that starts in the settling time: the simulator's demo rack
    # (2x3,2x1 workers, exp:50, malcolm) at load 1.02, p99 per rack second, queues filling
    climb = [55636, 112377, 171290, 198656, 191236, 187016, 186656, 184534, 184781, 186623,
             186359, 185370]
    v = longrun.trend_verdict([[_seg(x) for x in climb]], settle=1, compare=3)
    assert v["status"] == "fail", v
    # settling is left out: a slow start that settles passes
    settle = [_seg(5000)] + [_seg(500) for _ in range(11)]
    assert longrun.trend_verdict([settle], settle=1, compare=3)["status"] == "pass"
    assert longrun.trend_verdict([settle], settle=0, compare=3)["status"] == "pass"


def test_verdict_fails_on_growing_losses_and_repeats_pool():
    steady = [_seg(500, lost=5) for _ in range(8)]
    losing = [_seg(500, lost=5) for _ in range(5)] + [_seg(500, lost=400) for _ in range(3)]
    assert longrun.trend_verdict([steady], 1, 2)["status"] == "pass"
    v = longrun.trend_verdict([losing], 1, 2)
    assert v["status"] == "fail" and "losses rose" in v["why"]
    # repeats: one degrading repeat among flat ones pulls the late median only if it is
    # the majority; two of three degrade -> fail
    flat = [_seg(500) for _ in range(8)]
    bad = [_seg(500) for _ in range(5)] + [_seg(5000) for _ in range(3)]
    assert longrun.trend_verdict([flat, flat, bad], 1, 2)["status"] == "pass"
    assert longrun.trend_verdict([flat, bad, bad], 1, 2)["status"] == "fail"


def test_verdict_undetermined_when_short_or_flagged():
    short = [_seg(500) for _ in range(4)]
    assert longrun.trend_verdict([short], 1, 2)["status"] == "undetermined"
    flagged = [_seg(500, flags=["generator late"]) for _ in range(8)]
    v = longrun.trend_verdict([flagged], 1, 2)
    assert v["status"] == "undetermined" and "clean" in v["why"]
    # a flagged late segment is left out, not counted as degradation
    mixed = [_seg(500) for _ in range(6)] + [_seg(9000, flags=["late"]), _seg(510)]
    assert longrun.trend_verdict([mixed], 1, 2)["status"] == "pass"
    assert longrun.overall([{"status": "pass"}, {"status": "undetermined"}]) == "undetermined"
    assert longrun.overall([{"status": "fail"}, {"status": "undetermined"}]) == "fail"


def test_server_samples_become_segment_figures():
    # one server, window 1 ms, nominal 0.1 tasks/µs; samples every 0.1 s over 2 s; the
    # second second runs only half its windows (a stalled policy thread) and grows its queue
    samples, windows = [], 0
    for i in range(21):
        t = i * 100_000_000
        samples.append({"mono_ns": t, "queue_len": 2 if t < 1e9 else 20, "waiting": 0,
                        "load_us": 0.0, "rate_per_us": 0.1 if t < 1e9 else 0.05,
                        "windows": windows, "hb_dropped": 0, "hb_skipped": 0,
                        "dropped_full": 0, "overloaded": 0, "migrated_out": 10 * i,
                        "stolen_in": 0, "completed": 0, "steal_timeouts": 0,
                        "svc_count": 1000 * i, "svc_mean_us": 10.0, "rss_kb": 1000 + i})
        windows += 100 if t < 1e9 else 50
    segs = [{"t0_ns": 0, "real_s": 1.0, "sent": 1000},
            {"t0_ns": 1_000_000_000, "real_s": 1.0, "sent": 1000}]
    longrun.server_segments(segs, [samples], window_ns=1e6, nominal_rate_per_us=[0.1],
                            workers=1)
    a, b = segs[0]["servers"][0], segs[1]["servers"][0]
    assert a["queue_mean"] == 2 and b["queue_mean"] > 15 and b["queue_max"] == 20
    assert a["window_pace"] == pytest.approx(1.0) and b["window_pace"] == pytest.approx(0.5)
    assert a["rate_ratio"] == pytest.approx(1.0) and b["rate_ratio"] < 0.6
    assert a["migrated_out"] == 100 and b["rss_kb"] == 1020
    assert segs[0]["effective_load"] == pytest.approx(1000 * 10e-6)
    line = longrun.format_segment(dict(segs[1], start_s=1.0, end_s=2.0, p50_us=1.0,
                                       p99_us=2.0, p99_ci_us=[1.5, 2.5], completed=10,
                                       rejected_total=0, timed_out=0, late_sends=0,
                                       migrated=1, stolen=0, flags=[]))
    assert "0.50" in line and "20.0" not in line.split("]")[0]


def test_loadgen_cli_prints_and_writes_segments():
    import json

    from click.testing import CliRunner

    from malcolm.cli import main
    with StubServer("udp", delay_us=300) as s:
        args = ["loadgen", "--server", s.address, "--rate", "800", "--duration", "0.6s",
                "--warmup", "0.1s", "--segment", "200ms"]
        text = CliRunner().invoke(main, args)
        js = CliRunner().invoke(main, args + ["--json", "-"])
        bad = CliRunner().invoke(main, args[:-1] + ["2s"])
    assert text.exit_code == 0, text.output
    assert "segment s" in text.output and "0.40-0.60" in text.output
    assert js.exit_code == 0, js.output
    run = json.loads(js.output)["runs"][0]
    assert [sg["index"] for sg in run["segments"]] == [0, 1, 2]
    assert sum(sg["sent"] for sg in run["segments"]) == run["sent"]
    assert bad.exit_code == 2 and "segments" in bad.output


def test_a_dilated_rack_dilates_its_admission_limit(tmp_path):
    """Every time constant of the rack scales with K: admission (max_wait_ms) was left at
    200 ms real, so a K=200 rack refused tasks after 1 ms of rack time (20 services on a
    1-worker server) that the real rack would have queued."""
    from malcolm.loadgen import method
    from malcolm.loadgen.experiment import Experiment, PolicyRack
    from malcolm.runtime.config import load_rack

    class NoRack:
        def __init__(self, path, extra_args=(), logdir=None):
            self.path = path

    exp = Experiment([3, 1], policies=["jsq"], loads=[0.8], dilate=50, rack_class=NoRack)
    exp.dilate = 50.0
    exp.layout = method.layout(exp.workers, [0, 1], 1000.0)
    cfg = load_rack(PolicyRack(exp, "jsq", str(tmp_path), "t").path)
    assert cfg.window_us == 100.0 * 50 and cfg.max_wait_ms == 200.0 * 50
