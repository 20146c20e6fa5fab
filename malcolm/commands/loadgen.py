"""``malcolm loadgen``: open-loop load (Poisson, fixed or trace-driven arrivals) against a rack;
latency from intended send times."""

from __future__ import annotations

import signal
import sys
import threading

import click

from malcolm._files import shown
from malcolm.commands.types import (
    FLOAT,
    INT,
    Duration,
    IntRange,
    Rate,
    check_writable,
    json_option,
    refuse_empty,
    write_json,
    write_text,
)


def _flags(ctx, names):
    """The options ``names`` (parameter names) as the user spells them."""
    return ", ".join(next(o for p in ctx.command.params if p.name == n for o in p.opts)
                     for n in names)


def _given(ctx, *names):
    """Those of ``names`` the user gave (not left at their defaults)."""
    default = click.core.ParameterSource.DEFAULT
    return [n for n in names if ctx.get_parameter_source(n) != default]


def _refuse_with_app(ctx):
    """--app sends an application's real requests, with their own work and payload: a
    --workload, --payload or --check-echo was ignored (the header said rocksdb1), or sent
    the user to --payload-size, which --app then refused."""
    from malcolm.loadgen.run import LoadgenError
    names = _given(ctx, "workload", "payload_content", "check_echo")
    if names:
        raise LoadgenError(f"{_flags(ctx, names)} {'has' if len(names) == 1 else 'have'} no "
                           "effect with --app: an application's requests carry their own "
                           "work and payload, and its answers are checked against its "
                           "dictionary")


def _refuse_orphans(ctx, raw, app, poll, bad_fraction):
    """A value is checked even where it has no effect, and an option given without the one
    it needs is refused: ignored, it made the run look like it did what was asked."""
    from malcolm.loadgen.run import LoadgenError
    if not 0.0 <= bad_fraction <= 1.0:                  # NaN fails this too
        raise LoadgenError(f"--bad-fraction {bad_fraction!r} must be in 0..1")

    needs = {"without --raw (it bounds the samples --raw keeps)":
             [] if raw else _given(ctx, "raw_max"),
             "without --app (real requests)":
             [] if app else _given(ctx, "app_keys", "app_value_size", "key_dist", "bad_fraction"),
             "with --poll busy (only adaptive polling spins before a send)":
             [] if poll == "adaptive" else _given(ctx, "spin_us", "spin_us_old")}
    for why, names in needs.items():
        if names:
            raise LoadgenError(f"{_flags(ctx, names)} {'has' if len(names) == 1 else 'have'} "
                               f"no effect {why}")


@click.command()
@click.option("--rack", "rack_path", type=click.Path(dir_okay=False), default=None,
              metavar="FILE", help="Rack file (TOML): its servers and transport are the target.")
@click.option("--server", "servers", multiple=True,
              help="Server address (HOST:PORT, or an shm endpoint name); repeat or "
                   "comma-separate. Instead of --rack.")
@click.option("--transport", type=click.Choice(["udp", "shm", "verbs"]), default=None,
              help="With --server: the transport (default udp). With --rack it must match. "
                   "verbs binds --bind, else the RDMA device's first IPv4 address.")
@click.option("--rate", "rates", type=Rate(many=True), default=None,
              show_default="10k; with a trace, its recorded rate",
              help="Target rate, tasks/s (20000, 20k, 1.5M; 0.001 to 1G); a comma-separated "
                   "list sweeps the rates one after the other.")
@click.option("--arrivals", default="poisson", show_default=True,
              help="Arrival process: poisson, fixed (every gap 1/rate), trace:FILE "
                   "(inter-arrival gaps) or trace-ts:FILE (timestamps), in µs; a trace "
                   "keeps its shape and is scaled to --rate (without --rate: replayed as "
                   "recorded).")
@click.option("--payload-size", default="0", show_default=True, metavar="SIZE",
              help="Task payload, bytes: N, uniform:MIN:MAX or exp:MEAN[:MAX]; at most "
                   "1024 (the wire's limit).")
@click.option("--payload", "payload_content", type=click.Choice(["zeros", "random", "pattern"]),
              default="zeros", show_default=True,
              help="Payload content; pattern: byte i of task r is (r + i) % 251.")
@click.option("--check-echo", is_flag=True,
              help="With --payload pattern: check that every response echoes its task's "
                   "payload (servers run the echo handler); a mismatch exits with status 3.")
@click.option("--workload", default="exp:50", show_default=True,
              help="Service-time workload, as in `malcolm sim` (exp:MEAN, bimodal, "
                   "hyperexp1, rocksdb1, mix:W:DIST,...). Times in µs.")
@click.option("--duration", default="5s", show_default=True, type=Duration("s"),
              help="Measured time per rate (5s, 500ms; bare number: seconds).")
@click.option("--warmup", default="1s", show_default=True, type=Duration("s"),
              help="Time before the measurement (bare number: seconds): tasks are sent and "
                   "accounted, not measured.")
@click.option("--threads", default=1, show_default=True, type=IntRange(1, 64),
              help="Client threads, each with its own endpoint and an equal share of the rate.")
@click.option("--timeout", default="1s", show_default=True, type=Duration("s"),
              help="A task with no response this long after its intended send time is "
                   "counted as timed out (bare number: seconds; at most 1e6 s).")
@click.option("--shares", default=None,
              help="Per-server weights, e.g. 1,1,2,2 (default: uniform).")
@click.option("--change", "changes", multiple=True,
              help="Change the load during the run, TIME:key=value[,key=value] with TIME "
                   "after the warm-up: rate=30k | rate=2x (times the base rate) | "
                   "shares=1/0/1/1. Repeatable.")
@click.option("--policy", default=None,
              help="Client-side policy that picks each task's server: po2, po2:d=3, random. "
                   "(Server-side policies are named in the rack file.)")
@click.option("--poll", type=click.Choice(["adaptive", "busy"]), default="adaptive",
              show_default=True,
              help="busy: clients spin while idle (best latency, burns a core each); "
                   "adaptive: block until a response or the next send is near.")
@click.option("--spin", "spin_us", default=50.0, show_default=True, type=Duration("us"),
              help="adaptive: spin this long before each send instead of blocking (more "
                   "CPU, fewer late sends); bare number: µs.")
@click.option("--spin-us", "spin_us_old", default=None, hidden=True, type=Duration("us"))
@click.option("--raw", is_flag=True,
              help="Keep every latency sample and compute exact percentiles.")
@click.option("--raw-max", default=10_000_000, show_default=True, type=INT,
              help="At most this many raw samples (latencies) in all, the first each "
                   "thread completed; the report says when the percentiles are over those.")
@click.option("--lag-threshold", default=50.0, show_default=True, type=Duration("us"),
              help="A send later than this behind its schedule counts as late (bare number: "
                   "µs).")
@click.option("--seed", default=1, show_default=True, type=INT,
              help="Seed of the arrival, server-choice and service-time streams.")
@click.option("--hold-load", default=None, metavar="TOL",
              help="Pick each run's draw (arrivals, service times) among seeded candidates "
                   "so that the work it offers in the measured window is within TOL (1% or "
                   "0.01) of what its rate asks, as malcolm demo does. Not with --app.")
@click.option("--bind", default=None, help="udp, verbs: local address to bind (udp default "
              "0.0.0.0:0; verbs: the RDMA device's first IPv4 address, port 0).")
@click.option("--segment", default=None, type=Duration("s", min=0, min_open=True), metavar="TIME",
              help="Also report each rate's run in segments this long (by intended send "
                   "time): p50, p99 with its 95% interval, losses and late sends per "
                   "segment, to see drift (at most 256 segments).")
@json_option("{'metadata': {...}, 'runs': [report, ...]} with the histograms")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False, allow_dash=True),
              default=None, metavar="FILE",
              help="Write one CSV row per rate (rates/s, latencies in µs, counts) to FILE "
                   "('-': stdout).")
@click.option("--hdr", "hdr_out", type=click.Path(dir_okay=False), default=None,
              metavar="FILE",
              help="Write the latency histograms (ns, one interval per rate) as an "
                   "HdrHistogram log to FILE (needs the hdrhistogram package).")
@click.option("--raw-out", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="With --raw: write the samples (ns, int64) of the last rate to FILE, in "
                   "NumPy's .npy format (no suffix added).")
@click.option("--app", default=None,
              help="Send real requests instead of service times: rocksdb1, rocksdb2 or "
                   "rocksdb:W:N,W:N,... (GET(N) mixes; servers run the rocksdb handler). "
                   "Every value is checked. See docs/rocksdb.md.")
@click.option("--keys", "app_keys", type=INT, default=None,
              help="--app: keys in the dictionary (default: read from the rack's database "
                   "when it is on this host, else 1000000).")
@click.option("--value-size", "app_value_size", type=INT, default=None,
              help="--app: bytes per value (default: as --keys, else 16).")
@click.option("--key-dist", default="uniform", show_default=True,
              help="--app: uniform, or zipf:S (e.g. zipf:0.99).")
@click.option("--bad-fraction", default=0.0, show_default=True, type=FLOAT,
              help="--app: share of requests made malformed on purpose; each must be "
                   "answered 'bad input'.")
@click.option("--max-timeouts", default="1%", show_default=True,
              help="Exit with status 3 when the share of measured tasks that timed out is "
                   "above this (a percentage like 1% or a fraction like 0.01), or when no "
                   "task completed at all.")
@click.option("--key-file", type=click.Path(dir_okay=False), default=None,
              help="The rack key (with --server; a --rack names its own key_file). "
                   "Default: MALCOLM_RACK_KEY_FILE.")
def loadgen(rack_path, servers, transport, rates, arrivals, payload_size, payload_content,
            check_echo, workload, duration, warmup, threads, timeout, shares, changes, policy,
            poll, spin_us, spin_us_old, raw, raw_max, lag_threshold, seed, hold_load, bind,
            segment, json_out, csv_out, hdr_out, raw_out, app, app_keys, app_value_size,
            key_dist, bad_fraction, max_timeouts, key_file):
    """Send open-loop load to a rack and report latency and accounting.

    Latency is measured from each task's intended send time, so a stalled server or a
    lagging generator cannot hide in the percentiles; the report says when the generator
    itself fell behind. Every task ends as completed, rejected (with the server's reason) or
    timed out.

    Exit status: 0 when every task is accounted for, some completed and at most
    --max-timeouts of them timed out; 2 when tasks are unaccounted for; 3 when the run failed
    a check (nothing completed, too many timed out, --app saw a wrong value or --check-echo
    a wrong echo); 130 when interrupted (SIGINT, SIGTERM or SIGHUP).

    With --json, --csv or --hdr naming a file, the table is still printed.

    \b
    Examples:
      malcolm loadgen --rack rack.toml --rate 20k --workload bimodal
      malcolm loadgen --server 127.0.0.1:7001,127.0.0.1:7002 --rate 5k,10k,20k --json -
      malcolm loadgen --rack rack.toml --rate 20k --arrivals trace:gaps.txt --csv out.csv
      malcolm loadgen --rack echo.toml --payload-size exp:200 --payload pattern --check-echo
      malcolm loadgen --rack rack.toml --rate 5k,10k --json out.json --hdr lat.hlog
      malcolm loadgen --rack rack.toml --rate 10k --change 2s:rate=2x --change 4s:rate=1x
      malcolm loadgen --rack rack.toml --rate 10k --policy po2
      malcolm loadgen --rack rack.toml --rate 10k --duration 60s --segment 5s
    """
    if spin_us_old is not None:         # the first release's spelling, kept hidden
        spin_us = spin_us_old
    refuse_empty(rack=rack_path, key_file=key_file, app=app, bind=bind, policy=policy,
                 shares=shares, json=json_out, csv=csv_out, hdr=hdr_out, raw_out=raw_out)
    if raw_out == "-":
        raise click.BadParameter("'-' (stdout) is not supported: give a file",
                                 param_hint="--raw-out")
    if json_out == "-" and csv_out == "-":      # one after the other: neither parses
        raise click.BadParameter("--json - and --csv - would both write to stdout: give "
                                 "one of them a file", param_hint="--csv")
    for path, flag in ((json_out, "--json"), (csv_out, "--csv"), (hdr_out, "--hdr"),
                       (raw_out, "--raw-out")):
        check_writable(path, flag)              # fail now, not after the run
    from malcolm.loadgen.run import (
        HEADER,
        LoadgenError,
        LoadSpec,
        notes,
        parse_change,
        parse_share_limit,
        parse_shares,
        resolve_target,
        row,
        segment_lines,
        sweep,
    )

    try:
        target = resolve_target(rack_path, servers, transport, key_file)
        limit = parse_share_limit(max_timeouts, "--max-timeouts")
        n = len(target.servers)
        spec = LoadSpec(
            target=target, workload=workload, duration_s=duration,
            warmup_s=warmup, threads=threads, timeout_s=timeout,
            shares=parse_shares(shares, n) if shares else None,
            changes=[parse_change(c, n) for c in changes], policy=policy,
            busy=poll == "busy", spin_us=spin_us, raw=raw, raw_max=raw_max,
            lag_threshold_us=lag_threshold, seed=seed, bind=bind, segment_s=segment or 0.0,
            draw_tol=parse_share_limit(hold_load, "--hold-load") if hold_load else 0.0)
        if hold_load and not 0 < spec.draw_tol < 1:
            raise LoadgenError(f"--hold-load {hold_load!r} must be above 0% and below 100%")
        if hold_load and app:
            raise LoadgenError("--hold-load and --app exclude each other: an application "
                               "does real work, it requests no service time to hold")
        if app:
            _refuse_with_app(click.get_current_context())
            from malcolm.loadgen import apps
            shape = note = None
            cfg = apps.rack_config(rack_path) if rack_path else None
            if cfg is not None:
                note = apps.handler_note(cfg, app)
                if app_keys is None or app_value_size is None:
                    shape = apps.dictionary_shape(cfg)
            if note:
                click.echo(note, err=True)
            try:
                spec.app = apps.parse_app(
                    app, app_keys if app_keys is not None else shape and shape[0],
                    app_value_size if app_value_size is not None else shape and shape[1],
                    key_dist, bad_fraction)
            except apps.AppError as e:
                raise LoadgenError(str(e)) from None
        import numpy as np

        from malcolm.loadgen import traffic
        try:
            with np.errstate(over="ignore"):    # a trace's sum beyond floats: check_rate says
                spec.arrivals = traffic.parse_arrivals(arrivals)
            spec.payload = traffic.parse_payload(payload_size, payload_content, check_echo)
        except traffic.TrafficError as e:
            raise LoadgenError(str(e)) from None
        recorded = None
        if rates is None:
            recorded = spec.arrivals.trace_rate()
            rates = [recorded if recorded is not None else 10_000.0]
        spec.validate()
        for r in rates:         # every rate of the sweep, before the first runs
            spec.check_rate(r, "rate" if recorded is None else
                            "without --rate, the trace's recorded rate")
        if raw_out and not raw:
            raise LoadgenError("--raw-out needs --raw")
        _refuse_orphans(click.get_current_context(), raw, app, poll, bad_fraction)
    except LoadgenError as e:
        raise click.UsageError(str(e)) from None

    if hdr_out:
        from malcolm.loadgen import output
        try:
            output._hdr_module()
        except RuntimeError as e:
            raise click.UsageError(str(e)) from None
    quiet = "-" in (json_out, csv_out)
    stop = threading.Event()
    # SIGTERM and SIGHUP (a closed terminal) stop the run as Ctrl-C does: with Python's
    # default action the process died at once, without its report or --json, and an shm
    # client left its 17 MB ring in /dev/shm (the stop lets run_load close its transports)
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {sig: signal.signal(sig, lambda *a: stop.set()) for sig in stop_signals}
    if not quiet:
        what = spec.app.describe() if spec.app else workload
        click.echo(f"loadgen: {n} server(s) over {target.transport} ({target.source}), "
                   f"workload {what}, arrivals {spec.arrivals.describe()}, payload "
                   f"{spec.payload.describe()}, {threads} thread(s), {spec.duration_s:g} s "
                   f"per rate after {spec.warmup_s:g} s warm-up, poll {poll}")
        click.echo(HEADER)

    def show(rep):
        if not quiet:
            click.echo(row(rep))
            for line in notes(rep) + segment_lines(rep):
                click.echo(line)
            sys.stdout.flush()

    try:
        reps = sweep(spec, rates, show, stop)
    except LoadgenError as e:
        raise click.UsageError(str(e)) from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if raw_out and reps and reps[-1].get("_raw") is not None:
        import numpy as np
        try:
            # through a file object: np.save(name) writes name + ".npy" where the name has no
            # such suffix, a path other than the one check_writable looked at
            with open(raw_out, "wb") as f:
                np.save(f, reps[-1]["_raw"])
        except OSError as e:
            raise click.ClickException(f"--raw-out {shown(raw_out)}: {e.strerror}") from None
    if json_out:
        from malcolm._metadata import run_metadata
        write_json(json_out, {"metadata": run_metadata(click.get_current_context().params),
                              "runs": reps})
    if csv_out:
        from malcolm.loadgen import output
        text = output.csv_text(reps)
        if csv_out == "-":
            click.echo(text, nl=False)
        else:
            write_text(csv_out, text, "--csv")
    if hdr_out:
        from malcolm.loadgen import output
        try:
            output.write_hdr(hdr_out, reps)
        except OSError as e:
            raise click.ClickException(f"--hdr {hdr_out}: {e.strerror}") from None
    if any(not r["accounted"] for r in reps):
        sys.exit(2)
    if any(r.get("app") and (r["app"]["wrong_values"] or r["app"]["bad_accepted"])
           or r["payload"]["echo_bad"] for r in reps):
        sys.exit(3)
    if any(r.get("interrupted") for r in reps):
        sys.exit(130)
    bad = [r for r in reps if r["completed"] == 0
           or r["timed_out"] > limit * max(r["sent"], 1)]
    if bad:
        r = bad[0]
        why = ("no task completed" if r["completed"] == 0 else
               f"{r['timed_out']} of {r['sent']} tasks timed out "
               f"({100 * r['timed_out'] / max(r['sent'], 1):.2f}% > "
               f"{100 * limit:g}% --max-timeouts)")
        click.echo(f"loadgen: FAILED at {r['rate']:g}/s: {why}", err=True)
        sys.exit(3)
    return reps
