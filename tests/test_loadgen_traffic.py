"""The load generator for real services: arrival processes, payloads, HdrHistogram and CSV
output, run metadata. Schedules are checked on the native client's own schedule (no network,
no timing); payloads against the runtime's echo handler."""

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from malcolm.loadgen._client import LoadClient
from malcolm.loadgen._hist_py import hist_from_values
from malcolm.net.transport import open_transport

from malcolm.cli import main
from malcolm.loadgen import hist, output, traffic
from malcolm.loadgen.run import LoadSpec, Target, run_load
from malcolm.loadgen.stub import StubServer
from malcolm.workloads import parse_workload


def _client(rate, arrival=0, trace=None, trace_start=0, offset=0.0, **kw):
    # one client's schedule, from its own view (rate: this client's share)
    tr = open_transport("udp", "127.0.0.1:0")
    c = LoadClient(tr, ["127.0.0.1:9"], parse_workload("exp:50").native(), client_id=1,
                   seed=5, phases=[(0.0, rate, None)], warmup_s=0.0, duration_s=1.0,
                   timeout_s=1.0, arrival=arrival, trace=trace, trace_start=trace_start,
                   first_offset_s=offset, **kw)
    return c, tr


def _gaps(rate, n=2000, **kw):
    c, tr = _client(rate, **kw)
    try:
        t = c.preview(n)
    finally:
        tr.close()
    return t, np.diff(t)


def test_fixed_arrivals_are_evenly_spaced():
    t, g = _gaps(10_000, arrival=1, offset=25e-6)
    assert t[0] == 100_000 + 1 + 25_000
    assert (g == 100_001).all()          # 1e9/rate ns, plus the 1 ns every gap gets


def test_poisson_arrivals_are_exponential():
    _, g = _gaps(10_000, n=20_000)
    assert abs(g.mean() / 100_000 - 1) < 0.05
    assert abs(g.std() / g.mean() - 1) < 0.05       # CV of an exponential is 1


def test_trace_arrivals_keep_the_shape_and_follow_the_rate():
    shape = np.array([1.0, 1.0, 1.0, 97.0])          # bursts of 4 every 100 units
    _, g = _gaps(1_000, n=401, arrival=2, trace=shape, trace_start=1)
    mean_gap = 1e9 / 1_000
    want = np.tile(np.roll(shape, -1) / shape.mean() * mean_gap, 101)[1:401]
    assert np.allclose(g, want.astype(np.int64) + 1, atol=1)
    assert abs(g.mean() / mean_gap - 1) < 0.01


@pytest.mark.parametrize("kind", ["fixed", "trace"])
def test_threads_together_replay_the_schedule(kind, tmp_path):
    """T threads' schedules merge into the one asked for: the trace itself (cut to a
    multiple of T gaps), or evenly spaced fixed arrivals."""
    threads, rate, n = 3, 10_000.0, 40
    gaps = np.random.default_rng(2).pareto(1.5, 10) + 0.1
    f = tmp_path / "g.txt"
    f.write_text("\n".join(repr(float(x)) for x in gaps))
    arr = traffic.parse_arrivals(f"trace:{f}" if kind == "trace" else "fixed")
    times = []
    for i in range(threads):
        sch = arr.for_thread(i, threads, rate)
        c, tr = _client(rate / threads, arrival=sch["arrival"], trace=sch["trace"],
                        offset=sch["first_offset_s"])
        try:
            times.append(c.preview(n))
        finally:
            tr.close()
    got = np.sort(np.concatenate(times))
    if kind == "trace":
        g = gaps[:9] / gaps[:9].mean() * 1e9 / rate       # ns at the target rate
    else:
        g = np.full(9, 1e9 / rate)
    want = np.cumsum(np.tile(g, n))[threads - 1:threads - 1 + threads * n]
    assert np.allclose(got, want, rtol=0, atol=2 * n + 2), np.abs(got - want).max()
    with pytest.raises(traffic.TrafficError, match="per thread"):
        traffic.parse_arrivals(f"trace:{f}").for_thread(0, 11, rate)


def test_trace_files_and_their_errors(tmp_path):
    f = tmp_path / "gaps.txt"
    f.write_text("# gaps in µs\n10, 20\n30 40\n")
    a = traffic.parse_arrivals(f"trace:{f}")
    assert a.gaps_us.tolist() == [10, 20, 30, 40] and a.trace_rate() == pytest.approx(4e4)
    ts = tmp_path / "ts.txt"
    ts.write_text("100\n110\n130\n")
    assert traffic.parse_arrivals(f"trace-ts:{ts}").gaps_us.tolist() == [10, 20]
    bad = {"words.txt": "10\nten\n", "empty.txt": "# nothing\n", "neg.txt": "5 -1\n",
           "zeros.txt": "0 0 0\n"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    for spec, msg in [(f"trace:{tmp_path / 'words.txt'}", "line 2"),
                      (f"trace:{tmp_path / 'empty.txt'}", "no numbers"),
                      (f"trace:{tmp_path / 'neg.txt'}", "negative"),
                      (f"trace:{tmp_path / 'zeros.txt'}", "zero"),
                      (f"trace-ts:{tmp_path / 'neg.txt'}", "before"),
                      (f"trace:{tmp_path / 'missing.txt'}", "No such file"),
                      ("trace:", "needs a file"), ("gamma", "poisson, fixed")]:
        with pytest.raises(traffic.TrafficError, match=msg):
            traffic.parse_arrivals(spec)
    r = CliRunner().invoke(main, ["loadgen", "--server", "127.0.0.1:9", "--arrivals",
                                  f"trace:{tmp_path / 'words.txt'}"])
    assert r.exit_code == 2 and "line 2" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("spec, msg", [
    ("2000", "outside 0..1024"), ("uniform:9:3", "below MIN"), ("exp:0", "mean"),
    ("lognormal:3", "use N"), ("x", "whole number"),
])
def test_payload_size_errors(spec, msg):
    with pytest.raises(traffic.TrafficError, match=msg):
        traffic.parse_payload(spec)


def test_payload_sizes_and_means():
    assert traffic.parse_payload("64").mean() == 64
    assert traffic.parse_payload("uniform:10:20").mean() == 15
    p = traffic.parse_payload("exp:100:1024")
    x = np.minimum(np.floor(np.random.default_rng(1).exponential(100, 200_000)), 1024)
    assert p.mean() == pytest.approx(x.mean(), rel=0.01)
    with pytest.raises(traffic.TrafficError, match="pattern"):
        traffic.parse_payload("64", "random", check_echo=True)


@pytest.mark.parametrize("size, content", [("uniform:1:1024", "pattern"), ("300", "random"),
                                           ("exp:200", "zeros")])
def test_payloads_reach_an_echo_server_and_come_back(size, content):
    from malcolm.bench.runtime import _server
    srv, addr = _server("udp", "adaptive", workers=1)
    pl = traffic.parse_payload(size, content, check_echo=content == "pattern")
    try:
        rep = run_load(LoadSpec(Target("udp", [addr], "test"), workload="exp:20",
                                duration_s=0.4, warmup_s=0.05, payload=pl,
                                arrivals=traffic.parse_arrivals("fixed")), 1000)
    finally:
        srv.stop(0.5)
    assert rep["accounted"] and rep["completed"] == rep["sent"] > 100
    assert rep["payload"]["mean_bytes"] == pytest.approx(pl.mean(), rel=0.25)
    if content == "pattern":
        assert rep["payload"]["echo_checked"] == rep["completed"]
        assert rep["payload"]["echo_bad"] == 0


def test_a_wrong_echo_is_caught():
    """The stub answers with an empty payload: every checked response is wrong."""
    with StubServer("udp", delay_us=100) as s:
        r = CliRunner().invoke(main, [
            "loadgen", "--server", s.address, "--rate", "500", "--duration", "0.3s",
            "--warmup", "0", "--payload-size", "32", "--payload", "pattern", "--check-echo"])
    assert r.exit_code == 3, r.output
    assert "WRONG ECHO" in r.output


def test_hdr_output_reads_back_the_same_histogram(tmp_path):
    from hdrh.log import HistogramLogReader
    rng = np.random.default_rng(7)
    vals = np.concatenate([rng.lognormal(11, 1.2, 30000), rng.integers(1, 300, 500)])
    vals = vals.astype(np.int64)
    h = hist_from_values(vals.tolist())
    reps = [{"_lat": h, "duration_s": 1.0}, {"_lat": h, "duration_s": 2.0}]
    path = tmp_path / "lat.hlog"
    output.write_hdr(str(path), reps, start_s=1_700_000_000.0)
    reader = HistogramLogReader(str(path), output.to_hdr(h))
    got = [reader.get_next_interval_histogram() for _ in range(2)]
    assert reader.get_next_interval_histogram() is None
    for hh in got:
        assert hh.get_total_count() == h["n"] == vals.size
        for q in (1, 50, 90, 99, 99.9):
            native = hist.percentile(h, q)
            hdr = hh.get_value_at_percentile(q)
            # the native bucket (1/128 wide: its midpoint is within 0.4%) plus HDR's 0.1%
            assert abs(hdr - native) <= 0.006 * native + 1, (q, hdr, native)
            assert abs(hdr - hist.exact_percentile(vals, q)) <= 0.01 * native + 1


def test_cli_csv_hdr_json_with_metadata(tmp_path):
    js, cs, hl = tmp_path / "o.json", tmp_path / "o.csv", tmp_path / "o.hlog"
    with StubServer("udp", delay_us=300) as s:
        r = CliRunner().invoke(main, [
            "loadgen", "--server", s.address, "--rate", "400,800", "--duration", "300ms",
            "--warmup", "50ms", "--arrivals", "fixed", "--payload-size", "uniform:0:64",
            "--json", str(js), "--csv", str(cs), "--hdr", str(hl), "--seed", "9"])
    assert r.exit_code == 0, r.output
    assert "arrivals fixed" in r.output         # the table still prints with files
    d = json.loads(js.read_text())
    md = d["metadata"]
    assert md["config"]["seed"] == 9 and md["config"]["arrivals"] == "fixed"
    assert md["malcolm_version"] and md["host"] and md["utc"]
    rows = list(csv.DictReader(io.StringIO(cs.read_text())))
    assert [float(x["rate"]) for x in rows] == [400, 800]
    for row, run in zip(rows, d["runs"], strict=True):
        assert int(row["completed"]) == run["completed"] > 0
        assert float(row["p99_us"]) == pytest.approx(run["latency_us"]["p99"], rel=1e-5)
        assert row["arrivals"] == "fixed"
    from hdrh.log import HistogramLogReader
    reader = HistogramLogReader(str(hl), output.to_hdr(hist_from_values([1])))
    counts = [reader.get_next_interval_histogram().get_total_count() for _ in range(2)]
    assert counts == [run["completed"] for run in d["runs"]]


def test_a_trace_without_rate_is_replayed_as_recorded(tmp_path):
    f = tmp_path / "ts.txt"
    f.write_text("\n".join(str(2000 * k) for k in range(50)))     # every 2 ms: 500/s
    with StubServer("udp", delay_us=100) as s:
        r = CliRunner().invoke(main, ["loadgen", "--server", s.address, "--arrivals",
                                      f"trace-ts:{f}", "--duration", "400ms", "--warmup", "0",
                                      "--csv", "-"])
    assert r.exit_code == 0, r.output
    (row,) = csv.DictReader(io.StringIO(r.output))
    assert float(row["rate"]) == pytest.approx(500)
    # arrivals at 2, 4, ... ms (each gap 1 ns longer: the 200th lands just past 400 ms)
    assert int(row["sent"]) == int(row["completed"]) == 199
