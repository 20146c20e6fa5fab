"""The load generator against a stub server whose behaviour is known exactly.

Tolerances: this runs on a 2-vCPU VM shared with other work, so only what the generator
must get right whatever the noise is checked tightly (no latency below the stub's delay,
exact accounting, the stall visible in the tail); the median gets a generous upper margin.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from malcolm.loadgen._hist_py import hist_from_values

from malcolm.cli import main
from malcolm.loadgen import hist
from malcolm.loadgen.run import (
    Change,
    LoadgenError,
    LoadSpec,
    Target,
    parse_change,
    parse_rate,
    parse_shares,
    run_load,
)
from malcolm.loadgen.stub import StubServer


def spec_for(stubs, kind="udp", **kw):
    kw.setdefault("warmup_s", 0.2)
    kw.setdefault("duration_s", 1.5)
    return LoadSpec(Target(kind, [s.address for s in stubs], "test"), **kw)


def test_histogram_percentiles_within_half_a_percent():
    rng = np.random.default_rng(3)
    vals = np.concatenate([rng.lognormal(11, 1.0, 20000), rng.integers(0, 300, 1000)])
    vals = vals.astype(np.int64)
    h = hist_from_values(vals.tolist())
    assert h["n"] == vals.size and h["min"] == vals.min() and h["max"] == vals.max()
    for q in (1, 50, 90, 99, 99.9, 100):
        exact = hist.exact_percentile(vals, q)
        got = hist.percentile(h, q)
        assert abs(got - exact) <= 0.005 * exact + 1, (q, got, exact)
    assert sum(c for _, _, c in hist.buckets(h)) == vals.size
    # merging two halves gives the same histogram as one
    a = hist_from_values(vals[:5000].tolist())
    b = hist_from_values(vals[5000:].tolist())
    m = hist.merge([a, b])
    assert np.array_equal(m["counts"], h["counts"]) and m["max"] == h["max"]


@pytest.mark.parametrize("kind", ["udp", "shm"])
def test_fixed_delay_percentiles(kind):
    delay_us = 2000.0
    with StubServer(kind, delay_us=delay_us) as s:
        rep = run_load(spec_for([s], kind, workload="exp:50", threads=2, raw=True), 1000)
        st = s.core
        assert st.tasks == rep["sent"] + rep["warmup"]["sent"]
    lu = rep["latency_us"]
    assert rep["accounted"] and rep["timed_out"] == 0 and rep["completed"] == rep["sent"]
    assert 1000 < rep["sent"] < 2000                      # 1.5 s at 1000/s, Poisson
    # The stub answers `delay` after it received the task, which is after the intended
    # send time: no latency can be below the delay.
    assert lu["min"] >= delay_us
    assert delay_us <= lu["p50"] <= delay_us + 1000, lu
    assert lu["p99"] >= lu["p50"]
    # the histogram agrees with the exact samples
    raw = rep["_raw"]
    assert raw.size == rep["completed"]
    h = hist_from_values(raw.tolist())
    for q in (50, 99):
        assert abs(hist.percentile(h, q) - hist.exact_percentile(raw, q)) <= 0.005 * \
            hist.exact_percentile(raw, q)
    assert sum(c for _, _, c in rep["histogram"]["buckets"]) == rep["completed"]


def test_stall_shows_in_the_tail():
    """A 60 ms stall: every task sent during it waits for its end. A closed-loop generator
    would record one slow request; an open-loop one records all of them."""
    rate, stall_s = 2000, 0.06
    with StubServer("udp", delay_us=200) as s:
        s.stall(0.2 + 0.6 + 0.02, stall_s)               # 0.6 s into the measurement
        rep = run_load(spec_for([s], raw=True), rate)
    lat = rep["_raw"] / 1e3
    assert rep["accounted"] and rep["timed_out"] == 0
    assert rep["latency_us"]["max"] >= 0.8 * stall_s * 1e6
    # tasks intended in the first half of the stall waited at least half of it
    slow = int((lat >= 0.5 * stall_s * 1e6).sum())
    assert slow >= 0.5 * rate * stall_s / 2, slow
    assert rep["latency_us"]["p99.9"] >= 0.5 * stall_s * 1e6
    assert rep["latency_us"]["p50"] < 5000


def test_rejections_timeouts_and_flags_are_accounted():
    with StubServer("udp", delay_us=300, every_reject=7, reject_status=1, every_drop=10,
                    every_migrated=5, every_stolen=4) as s:
        rep = run_load(spec_for([s], warmup_s=0.0, timeout_s=0.2), 1500)
        st = s.stop()
    assert st["tasks"] == rep["sent"]
    assert rep["timed_out"] == st["ignored"] > 0
    assert rep["rejected"] == {"dropped": st["rejected"]} and st["rejected"] > 0
    assert rep["completed"] == st["answered"] - st["rejected"]
    assert rep["accounted"] and rep["unaccounted"] == 0
    assert rep["late_responses"] == 0 and rep["duplicates"] == 0
    assert 0.12 < rep["migrated"] / rep["completed"] < 0.28
    assert 0.17 < rep["stolen"] / rep["completed"] < 0.33


def test_shares_changes_and_client_po2():
    with StubServer("udp", index=0, delay_us=100) as a, \
            StubServer("udp", index=1, delay_us=100) as b:
        sp = spec_for([a, b], duration_s=2.0, warmup_s=0.0, shares=[1, 3],
                      changes=[Change(1.0, factor=3.0, shares=[3, 1])])
        rep = run_load(sp, 1000)
    sent = rep["per_server"]["sent"]
    assert rep["accounted"]
    # 1 s at 1000/s split 1:3, then 1 s at 3000/s split 3:1
    assert 3000 < rep["sent"] < 5000
    exp0 = 250 + 2250
    assert abs(sent[0] - exp0) < 0.15 * exp0, sent
    assert rep["per_server"]["answered"] == sent

    # the uniform client policy spreads evenly
    with StubServer("udp", index=0, delay_us=100) as a, \
            StubServer("udp", index=1, delay_us=100) as b:
        rep = run_load(spec_for([a, b], duration_s=0.5, policy="random"), 2000)
    sent = rep["per_server"]["sent"]
    assert rep["accounted"] and abs(sent[0] - sent[1]) < 0.15 * sum(sent), sent

    # po2 learns from piggybacked queue lengths: the slow stub holds more tasks, so it gets
    # fewer than the uniform half (not none: its reports are up to 20 ms stale, and a
    # drained slow stub ties with the fast one)
    with StubServer("udp", index=0, delay_us=20000) as slow, \
            StubServer("udp", index=1, delay_us=100) as fast:
        rep = run_load(spec_for([slow, fast], policy="po2"), 1000)
    sent = rep["per_server"]["sent"]
    assert rep["accounted"] and sent[1] > 0.62 * sum(sent), sent


def test_shares_whose_sum_overflows_keep_their_proportions():
    """Each weight finite, their sum past the largest float: every weight over that inf was 0
    and the last server got every task (--shares 1e308,1e308,1 sent [0, 0, 1217])."""
    with StubServer("udp", index=0, delay_us=100) as a, \
            StubServer("udp", index=1, delay_us=100) as b:
        sp = spec_for([a, b], duration_s=1.0, warmup_s=0.0, shares=parse_shares("1e308,1e308", 2),
                      changes=[parse_change("0.5s:shares=1e308/1", 2)])
        rep = run_load(sp, 1000)
    sent = rep["per_server"]["sent"]
    # half a second split evenly, then half a second all to server 0: about 750 and 250
    assert rep["accounted"] and 0.6 < sent[0] / sum(sent) < 0.9, sent


def test_parsers_reject_bad_input():
    assert parse_rate("20k") == 20000 and parse_rate("1.5M") == 1.5e6
    for bad in ("fast", "-3", "0", ""):
        with pytest.raises(LoadgenError):
            parse_rate(bad)
    c = parse_change("2s:rate=2x,shares=1/0/1", 3)
    assert c.at_s == 2 and c.factor == 2 and c.shares == [1, 0, 1]
    assert parse_change("500ms:rate=30k", 1).rate == 30000
    for bad in ("2s", "2s:speed=3", "soon:rate=2x", "1s:shares=1/1"):
        with pytest.raises(LoadgenError):
            parse_change(bad, 3)
    # a key twice: the last one won (rate=2x,rate=3x ran 3x)
    for bad, key in (("1s:rate=2x,rate=3x", "rate"), ("1s:rate=2x,RATE=30k", "rate"),
                     ("1s:shares=1/1/1,rate=2x,shares=1/0/1", "shares")):
        with pytest.raises(LoadgenError, match=f"{key} is given twice"):
            parse_change(bad, 3)
    with pytest.raises(LoadgenError):
        parse_shares("1,-1", 2)
    # an empty item was dropped: "1,,1" was two weights
    for bad in ("1,,1", "1,1,", "1//1", ",1,1"):
        with pytest.raises(LoadgenError, match="has an empty item"):
            parse_shares(bad, 2)


@pytest.mark.parametrize("args, msg", [
    (["--server", "127.0.0.1:9", "--rate", "lots"], "not a rate"),
    (["--server", "127.0.0.1:9", "--workload", "nope"], "unknown workload"),
    (["--server", "127.0.0.1:9", "--policy", "jsq"], "server policy"),
    (["--server", "127.0.0.1:9", "--policy", "cfcfs"], "central policy"),
    (["--rate", "1k"], "no servers"),
    (["--server", "127.0.0.1:9,127.0.0.1:10", "--shares", "1,2,3"], "3 weight(s) for 2"),
    (["--server", "127.0.0.1:9", "--change", "9s:rate=2x", "--duration", "1s"], "after the end"),
    (["--server", "127.0.0.1:9", "--transport", "shm", "--server", "x" * 20], "address"),
    (["--rack", "/nonexistent.toml"], "not found"),
    # beyond int64 ns in the native client: refused before the run, not an OverflowError,
    # a stall of 10 s or a wrong report
    (["--server", "127.0.0.1:9", "--timeout", "1e300"], "--timeout must be > 0 and at most"),
    (["--server", "127.0.0.1:9", "--change", "0.1s:rate=1e300"], "must be 0 or in 0.001..1e+09"),
    (["--server", "127.0.0.1:9", "--change", "0.1s:rate=1e300x"], "factor must be 0 or in"),
    (["--server", "127.0.0.1:9", "--change", "0.1s:rate=infx"], "factor must be 0 or in"),
    (["--server", "127.0.0.1:9", "--rate", "1e-12"], "rate 1e-12/s must be in 0.001..1e+09"),
    (["--server", "127.0.0.1:9", "--change", "0.1s:rate=1e-300"], "must be 0 or in 0.001"),
    (["--server", "127.0.0.1:9", "--change", "0.1s:rate=1e-300x"], "factor must be 0 or in"),
    (["--server", "127.0.0.1:9", "--rate", "0.002", "--change", "0.1s:rate=0.1x"],
     "rate 0.0002/s (base 0.002/s) must be 0 or in"),
    (["--server", "127.0.0.1:9", "--rate", "10k,1k", "--timeout", "1e6"], "request window"),
    (["--server", "127.0.0.1:9", "--lag-threshold", "1e16"], "--lag-threshold 1e+16 µs must"),
    (["--server", "127.0.0.1:9", "--payload-size", "exp:100:0"], "MAX is below MEAN"),
    (["--server", "127.0.0.1:9", "--raw", "--raw-max", "1", "--threads", "2"],
     "--raw-max 1 must be at least --threads (2)"),
    # Zipf keys' tables over 2**32 keys: numpy asked for 32 GiB (a traceback, or the swap)
    (["--server", "127.0.0.1:9", "--app", "rocksdb1", "--keys", "4294967295", "--key-dist",
      "zipf:0.99"], "over 4294967295 keys: at most 16777216 keys"),
    # a value is range-checked even where it would be ignored; an option that has no
    # effect without its companion is refused, not silently dropped
    (["--server", "127.0.0.1:9", "--raw-max", "-5"], "--raw-max -5 must be in 1..2**31"),
    (["--server", "127.0.0.1:9", "--raw-max", "5"], "--raw-max has no effect without --raw"),
    (["--server", "127.0.0.1:9", "--bad-fraction", "nan"], "--bad-fraction nan must be in 0..1"),
    (["--server", "127.0.0.1:9", "--bad-fraction", "0.1"],
     "--bad-fraction has no effect without --app"),
    (["--server", "127.0.0.1:9", "--keys", "5", "--key-dist", "zipf:1"],
     "--keys, --key-dist have no effect without --app"),
    (["--server", "127.0.0.1:9", "--poll", "busy", "--spin", "5us"],
     "--spin has no effect with --poll busy"),
    (["--server", "127.0.0.1:9", "--segment", "0"], "'0' must be > 0s"),
    # ASCII digits only, in every number (int() and float() read '８': "--threads ２" ran two
    # threads, "--payload-size ８" 8 bytes)
    (["--server", "127.0.0.1:9", "--threads", "２"], "'２' is not a valid integer (ASCII"),
    (["--server", "127.0.0.1:9", "--seed", "５"], "'５' is not a valid integer (ASCII"),
    (["--server", "127.0.0.1:9", "--raw", "--raw-max", "５"], "'５' is not a valid integer"),
    (["--server", "127.0.0.1:9", "--keys", "５"], "'５' is not a valid integer (ASCII"),
    (["--server", "127.0.0.1:9", "--value-size", "１６"], "'１６' is not a valid integer"),
    (["--server", "127.0.0.1:9", "--bad-fraction", "０.１"], "'０.１' is not a valid number"),
    (["--server", "127.0.0.1:9,127.0.0.1:10", "--shares", "１,2"], "must be numbers"),
    (["--server", "127.0.0.1:9", "--change", "0.1s:rate=２x"], "factor '２x' is not a number"),
    (["--server", "127.0.0.1:9", "--max-timeouts", "１%"], "must be a percentage (1%)"),
    (["--server", "127.0.0.1:9", "--payload-size", "８"], "'８' is not a whole number"),
    (["--server", "127.0.0.1:9", "--app", "rocksdb1", "--key-dist", "zipf:０.９９"],
     "must be uniform or zipf:S"),
    (["--server", "127.0.0.1:9", "--app", "rocksdb:９０:16"], "must be WEIGHT:N"),
    # addresses are read before the banner and the table's header, not as the run starts
    (["--server", "127.0.0.1:99999"], "bad server address: udp address '127.0.0.1:99999': "
                                      "port out of range"),
    (["--server", "127.0.0.1:9,nohost.invalid.:1"], "cannot resolve 'nohost.invalid.'"),
    (["--server", "a/b", "--transport", "shm"], "shm endpoint name 'a/b' must be"),
    # refused as a rack file refuses them: each ran, no task completed, and it failed (3)
    (["--server", "127.0.0.1:0"], "--server address '127.0.0.1:0' has port 0; a server needs"),
    (["--server", "127.0.0.1:9,127.0.0.1:9"], "--server address '127.0.0.1:9' used twice"),
    (["--server", "127.0.0.1:9", "--server", "127.0.0.1:09"],
     "'127.0.0.1:09' used twice (as '127.0.0.1:9' before)"),
    (["--server", "s0,s0", "--transport", "shm"], "--server address 's0' used twice"),
    # an empty item was dropped, the run went on with the others
    (["--server", "127.0.0.1:9", "--rate", "1k,,2k"], "'1k,,2k' has an empty item"),
    (["--server", "127.0.0.1:9", "--change", "0.1s:rate=2x,rate=3x"],
     "--change '0.1s:rate=2x,rate=3x': rate is given twice"),
    (["--server", ",127.0.0.1:9"], "--server ',127.0.0.1:9' has an empty item"),
    (["--server", ""], "--server is empty"),
    (["--server", "127.0.0.1:9,127.0.0.1:10", "--shares", "1,1,"], "'1,1,' has an empty item"),
    (["--server", "127.0.0.1:9,127.0.0.1:10", "--change", "0.1s:shares=1//1"],
     "shares '1//1' has an empty item"),
])
def test_cli_errors_are_clear(args, msg):
    r = CliRunner().invoke(main, ["loadgen", "--duration", "0.2s", "--warmup", "0"] + args)
    assert r.exit_code == 2, r.output
    assert msg in r.output, r.output
    assert "Traceback" not in r.output and "loadgen: 1 server" not in r.output   # no run


def test_a_trace_too_slow_or_too_uneven_is_refused(tmp_path):
    """One gap of 1e300 µs: recorded, its rate is ~1e-294/s; scaled to a slow rate, its
    longest gap is beyond any run. Either stalled the native schedule (int64 ns)."""
    f = tmp_path / "gaps.txt"
    f.write_text("1e300\n" + "1\n" * 2000)
    for extra, msg in (([], "without --rate, the trace's recorded rate"),
                       (["--rate", "1e-3"], "longer than the longest run"),
                       (["--rate", "1e-3", "--threads", "4"], "longer than the longest run")):
        r = CliRunner().invoke(main, ["loadgen", "--server", "127.0.0.1:9", "--duration", "0.2s",
                                      "--warmup", "0", "--arrivals", f"trace:{f}"] + extra)
        assert r.exit_code == 2 and msg in r.output, r.output
    (tmp_path / "big.txt").write_text("1e308 1e308 1e308\n")
    r = CliRunner().invoke(main, ["loadgen", "--server", "127.0.0.1:9", "--arrivals",
                                  f"trace:{tmp_path / 'big.txt'}", "--rate", "1k"])
    assert r.exit_code == 2 and "more than a float holds" in r.output, r.output
    # the same trace at a rate whose longest gap is 0.2 s is fine
    from malcolm.loadgen import traffic
    spec = LoadSpec(Target("udp", ["127.0.0.1:9"], "t"), threads=2,
                    arrivals=traffic.parse_arrivals(f"trace:{f}"))
    spec.check_rate(1e4)


def test_a_trace_reads_ascii_digits_only(tmp_path):
    """float() read a trace's "８" as 8; the trace, as every number, is ASCII digits."""
    f = tmp_path / "gaps.txt"
    f.write_text("1 2\n3 ８ 5\n")
    r = CliRunner().invoke(main, ["loadgen", "--server", "127.0.0.1:9", "--duration", "0.2s",
                                  "--warmup", "0", "--arrivals", f"trace:{f}"])
    assert r.exit_code == 2 and "line 2: '８' is not a number" in r.output, r.output
    assert "Traceback" not in r.output and "loadgen: 1 server" not in r.output


def test_change_rates_are_bounded_like_the_base_rate():
    assert parse_change("1s:rate=1G", 1).rate == 1e9
    assert parse_change("1s:rate=1e-3", 1).rate == 1e-3
    assert parse_change("1s:rate=0", 1).rate == 0
    assert parse_change("1s:rate=0x", 1).factor == 0
    for bad in ("1s:rate=1.1G", "1s:rate=1e-4", "1s:rate=1e13x", "1s:rate=nanx",
                "1s:rate=1e-13x"):
        with pytest.raises(LoadgenError, match="must be 0 or in"):
            parse_change(bad, 1)
    spec = LoadSpec(Target("udp", ["127.0.0.1:9"], "t"), changes=[parse_change("1s:rate=2x", 1)])
    spec.check_rate(1e3)
    with pytest.raises(LoadgenError, match="--change at 1 s: rate 2e"):
        spec.check_rate(1e9)


def test_truncated_raw_samples_are_said_in_the_text():
    """--raw-max 1: the row's percentiles come from one sample; the text says so."""
    from malcolm.loadgen.run import notes
    with StubServer("udp", delay_us=100) as s:
        rep = run_load(spec_for([s], duration_s=0.3, warmup_s=0.0, raw=True, raw_max=1), 500)
    assert rep["raw_truncated"] and rep["raw_samples"] == 1 and rep["completed"] > 1
    line = [ln for ln in notes(rep) if "--raw-max" in ln]
    assert line and f"kept 1 of {rep['completed']}" in line[0], notes(rep)
    rep["raw_truncated"] = False
    assert not [ln for ln in notes(rep) if "--raw-max" in ln]


def test_cli_json_against_stub():
    with StubServer("udp", delay_us=500) as s:
        r = CliRunner().invoke(main, ["loadgen", "--server", s.address, "--rate", "500,1000",
                                      "--duration", "0.5s", "--warmup", "0.1s", "--json",
                                      "--workload", "bimodal"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["metadata"]["config"]["workload"] == "bimodal"
    runs = d["runs"]
    assert [x["rate"] for x in runs] == [500, 1000]
    for x in runs:
        assert x["accounted"] and x["completed"] == x["sent"] > 0
        assert sum(b[2] for b in x["histogram"]["buckets"]) == x["completed"]
        assert x["latency_us"]["p50"] >= 500 and "p99.9" in x["latency_us"]
        assert "late_sends" in x["schedule"]


@pytest.mark.parametrize("kind", ["udp", "shm"])
def test_against_a_real_server(kind):
    """The native client against the runtime's own server (in this process)."""
    from malcolm.bench.runtime import _server
    srv, addr = _server(kind, "adaptive", workers=2)
    try:
        rep = run_load(LoadSpec(Target(kind, [addr], "test"), workload="exp:100",
                                duration_s=0.6, warmup_s=0.1), 2000)
        responses = srv.stats()["responses"]
    finally:
        srv.stop(0.5)
    assert rep["accounted"] and rep["completed"] == rep["sent"] > 600
    assert responses == rep["sent"] + rep["warmup"]["sent"]
    assert rep["per_server"]["answered"] == [rep["sent"] + rep["warmup"]["answered"]]
    assert 0 < rep["latency_us"]["p50"] <= rep["latency_us"]["max"]



def test_a_lagging_generator_says_so():
    """Ask one thread for far more than it can send: the report must say how late it was,
    and still account for every task (the stub may not keep up either)."""
    with StubServer("udp", delay_us=10) as s:
        rep = run_load(spec_for([s], duration_s=0.1, warmup_s=0.0, timeout_s=0.3), 1_000_000)
    sch = rep["schedule"]
    assert rep["accounted"]
    assert sch["late_sends"] > 0 and sch["late_episodes"] >= 1
    assert sch["lag_max_us"] > sch["threshold_us"]
    assert rep["offered_per_s"] > 0


def test_raw_out_writes_exactly_its_path_and_a_failed_write_is_one_line(tmp_path):
    """--raw-out FILE: the samples go to FILE itself (np.save(name) wrote name + ".npy", a path
    the early check had not looked at), and a write that fails after the run is one line, not
    a traceback."""
    import numpy as np
    out = tmp_path / "samples.bin"
    base = ["loadgen", "--rate", "500", "--duration", "0.3s", "--warmup", "0", "--raw"]
    with StubServer("udp", delay_us=100) as s:
        r = CliRunner().invoke(main, base + ["--server", s.address, "--raw-out", str(out)])
        assert r.exit_code == 0, r.output
        assert out.exists() and not (tmp_path / "samples.bin.npy").exists()
        assert len(np.load(out)) > 0
        # /dev/full opens and passes the early check, and the write fails after the run
        r = CliRunner().invoke(main, base + ["--server", s.address, "--raw-out", "/dev/full"])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output,
                                                                           r.exception)
        assert "Error: --raw-out /dev/full: No space left on device" in r.output, r.output
        # /proc takes no new files: refused before the run (its folder passed os.access as
        # root, and the run failed only at its end)
        r = CliRunner().invoke(main, base + ["--server", s.address, "--raw-out", "/proc/x"])
    assert r.exit_code == 2 and "Invalid value for --raw-out: /proc/x: " in r.output, r.output
    r = CliRunner().invoke(main, base + ["--server", "127.0.0.1:9", "--raw-out", "-"])
    assert r.exit_code == 2 and "stdout" in r.output, r.output


def test_the_load_note_of_an_app_run_gives_no_nominal_load():
    """With --app the requests ask no service time: the note printed "nominal 0.000
    (... requested mean 0.0 µs ...)", a load that means nothing; now only the effective."""
    from malcolm.loadgen.run import notes
    rep = dict(schedule=dict(late_sends=0), effective_load=0.42, nominal_load=0.0,
               service_us=dict(requested_mean=0.0, measured_mean=21.5), target_workers=4,
               rejected={}, timed_out=0, accounted=True)
    line = [ln for ln in notes(rep) if "load:" in ln]
    assert line == ["  load: effective 0.420 (measured mean 21.5 µs)"], line
    rep["service_us"]["requested_mean"], rep["nominal_load"] = 20.0, 0.4
    assert "nominal 0.400 (offered rate x requested mean 20.0 µs / 4 workers)" in \
        [ln for ln in notes(rep) if "load:" in ln][0]


def test_a_client_thread_that_fails_fails_the_run():
    """A client thread that raises (here: pinned to a CPU this process may not use) stops the
    run and its error reaches the caller. It used to die with a traceback on stderr while
    run_load returned a report as if all were well, that thread's tasks simply missing."""
    import os
    import time
    allowed = os.sched_getaffinity(0)
    bad = next(c for c in range(1023, 0, -1) if c not in allowed)
    with StubServer("udp", delay_us=10) as s:
        t = time.monotonic()
        with pytest.raises(LoadgenError, match=r"client thread loadgen-1 failed: OSError") \
                as ei:
            run_load(spec_for([s], threads=2, duration_s=10.0, cpus=[min(allowed), bad]),
                     500)
        took = time.monotonic() - t
    assert isinstance(ei.value.__cause__, OSError)
    assert took < 5.0, took         # the other thread was stopped, not run out (10 s)


def test_a_failed_client_thread_is_one_line_in_the_cli(monkeypatch):
    from malcolm.loadgen import threads

    def boom(client, t0, cpus, i, nice=None):
        if i == 0:
            raise RuntimeError("boom")
        client.run(t0)

    monkeypatch.setattr(threads, "pinned_run", boom)
    with StubServer("udp", delay_us=10) as s:
        r = CliRunner().invoke(main, ["loadgen", "--rate", "500", "--duration", "0.3s",
                                      "--warmup", "0", "--server", s.address])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    err = [ln for ln in r.output.splitlines() if "Error" in ln]
    assert err == ["Error: client thread loadgen-0 failed: RuntimeError: boom"], r.output


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_sigterm_stops_a_run_like_ctrl_c_and_leaves_no_shm_ring(tmp_path, sig):
    """SIGTERM (a launcher, ``kill``) and SIGHUP (a closed terminal) stop a run as Ctrl-C
    does: the report and the --json are written and the client's shm ring is removed. With
    Python's default action the process died at once (exit 143, no report, no JSON) and
    left its ring, 17 MB of /dev/shm, behind (found probing signals, 2026-12-07)."""
    import glob
    import os
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "out.json"
    with StubServer("shm", delay_us=50) as s:
        p = subprocess.Popen([sys.executable, "-m", "malcolm", "loadgen", "--transport",
                              "shm", "--server", s.address, "--rate", "1000", "--duration",
                              "20s", "--warmup", "0", "--json", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            ring = f"/dev/shm/malcolm-c{p.pid:x}-*"
            t_end = time.monotonic() + 20
            while not glob.glob(ring) and p.poll() is None and time.monotonic() < t_end:
                time.sleep(0.05)
            assert glob.glob(ring), "the client's ring never appeared"
            time.sleep(0.3)
            t = time.monotonic()
            p.send_signal(getattr(signal, sig))
            output, _ = p.communicate(timeout=10)
            took = time.monotonic() - t
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 130, output
    assert took < 5.0, took
    assert "Traceback" not in output
    assert "interrupted: the run was cut short" in output
    assert json.loads(out.read_text())["runs"][0]["interrupted"]
    assert not glob.glob(ring), os.listdir("/dev/shm")


def test_a_response_seen_after_its_timeout_is_late_not_completed(tmp_path):
    """A generator stopped (SIGSTOP) past its --timeout finds the answers of the tasks then
    in flight waiting in its socket. Each is late: a completion with a latency above the
    timeout contradicts the report's own definition of timed out. They were handled before
    the timeout sweep and counted completed, up to 309 ms against 50 ms (runtime probe,
    2026-12-07)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "out.json"
    with StubServer("udp", delay_us=5000) as s:        # ~15 tasks in flight at 3000/s
        p = subprocess.Popen([sys.executable, "-m", "malcolm", "loadgen", "--server",
                              s.address, "--rate", "3000", "--duration", "2.5s", "--warmup",
                              "0", "--timeout", "50ms", "--json", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(1.2)
            os.kill(p.pid, signal.SIGSTOP)
            time.sleep(0.3)
            os.kill(p.pid, signal.SIGCONT)
            output, _ = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    run = json.loads(out.read_text())["runs"][0]
    assert run["late_responses"] > 0, output           # the stop did outlast the timeout
    assert run["latency_us"]["max"] < 50_000, (run["latency_us"], output)
    assert run["accounted"], output
