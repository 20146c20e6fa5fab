"""``malcolm loadgen``: open-loop Poisson load against a rack, latency from intended send times."""

from __future__ import annotations

import json
import signal
import sys
import threading

import click

from malcolm.loadgen.experiment import json_safe as _clean


@click.command()
@click.option("--rack", "rack_path", type=click.Path(dir_okay=False), default=None,
              help="Rack file (TOML): its servers and transport are the target.")
@click.option("--server", "servers", multiple=True,
              help="Server address (HOST:PORT, or an shm endpoint name); repeat or "
                   "comma-separate. Instead of --rack.")
@click.option("--transport", type=click.Choice(["udp", "shm"]), default=None,
              help="With --server: the transport (default udp). With --rack it must match.")
@click.option("--rate", "rate_text", default="10k", show_default=True,
              help="Target rate in tasks/s (20000, 20k, 1.5M); a comma-separated list "
                   "sweeps the rates one after the other.")
@click.option("--workload", default="exp:50", show_default=True,
              help="Service-time workload, as in `malcolm sim` (exp:MEAN, bimodal, "
                   "hyperexp1, rocksdb1, mix:W:DIST,...). Times in µs.")
@click.option("--duration", default="5s", show_default=True,
              help="Measured time per rate (e.g. 5s, 500ms).")
@click.option("--warmup", default="1s", show_default=True,
              help="Time before the measurement: tasks are sent and accounted, not measured.")
@click.option("--threads", default=1, show_default=True,
              help="Client threads, each with its own endpoint and an equal share of the rate.")
@click.option("--timeout", default="1s", show_default=True,
              help="A task with no response this long after its intended send time is "
                   "counted as timed out.")
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
@click.option("--spin-us", default=50.0, show_default=True,
              help="adaptive: spin this long before each send instead of blocking (more "
                   "CPU, fewer late sends).")
@click.option("--raw", is_flag=True,
              help="Keep every latency sample and compute exact percentiles.")
@click.option("--raw-max", default=10_000_000, show_default=True,
              help="At most this many raw samples in all.")
@click.option("--lag-threshold", default=50.0, show_default=True,
              help="µs: a send later than this behind its schedule counts as late.")
@click.option("--seed", default=1, show_default=True)
@click.option("--bind", default=None, help="udp: local address to bind (default 0.0.0.0:0).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: {'runs': [report, ...]} with the histograms.")
@click.option("--raw-out", type=click.Path(dir_okay=False), default=None,
              help="With --raw: write the samples (ns, int64) of the last rate to this .npy.")
@click.option("--app", default=None,
              help="Send real requests instead of service times: rocksdb1, rocksdb2 or "
                   "rocksdb:W:N,W:N,... (GET(N) mixes; servers run the rocksdb handler). "
                   "Every value is checked. See docs/rocksdb.md.")
@click.option("--keys", "app_keys", type=int, default=None,
              help="--app: keys in the dictionary (default: read from the rack's database "
                   "when it is on this host, else 1000000).")
@click.option("--value-size", "app_value_size", type=int, default=None,
              help="--app: bytes per value (default: as --keys, else 16).")
@click.option("--key-dist", default="uniform", show_default=True,
              help="--app: uniform, or zipf:S (e.g. zipf:0.99).")
@click.option("--bad-fraction", default=0.0, show_default=True,
              help="--app: share of requests made malformed on purpose; each must be "
                   "answered 'bad input'.")
@click.option("--max-timeouts", default="1%", show_default=True,
              help="Exit with status 3 when the share of measured tasks that timed out is "
                   "above this (a percentage like 1% or a fraction like 0.01), or when no "
                   "task completed at all.")
@click.option("--key-file", type=click.Path(dir_okay=False), default=None,
              help="The rack key (with --server; a --rack names its own key_file). "
                   "Default: MALCOLM_RACK_KEY_FILE.")
def loadgen(rack_path, servers, transport, rate_text, workload, duration, warmup, threads,
            timeout, shares, changes, policy, poll, spin_us, raw, raw_max, lag_threshold,
            seed, bind, as_json, raw_out, app, app_keys, app_value_size, key_dist,
            bad_fraction, max_timeouts, key_file):
    """Send open-loop Poisson load to a rack and report latency and accounting.

    Latency is measured from each task's intended send time, so a stalled server or a
    lagging generator cannot hide in the percentiles; the report says when the generator
    itself fell behind. Every task ends as completed, rejected (with the server's reason) or
    timed out.

    Exit status: 0 when every task is accounted for, some completed and at most
    --max-timeouts of them timed out; 2 when tasks are unaccounted for; 3 when the run failed
    a check (nothing completed, too many timed out, or --app saw a wrong value); 130 when
    interrupted.

    \b
    Examples:
      malcolm loadgen --rack rack.toml --rate 20k --workload bimodal
      malcolm loadgen --server 127.0.0.1:7001,127.0.0.1:7002 --rate 5k,10k,20k --json
      malcolm loadgen --rack rack.toml --rate 10k --change 2s:rate=2x --change 4s:rate=1x
      malcolm loadgen --rack rack.toml --rate 10k --policy po2
    """
    from malcolm.loadgen.run import (
        HEADER,
        LoadgenError,
        LoadSpec,
        notes,
        parse_change,
        parse_duration,
        parse_rates,
        parse_share_limit,
        parse_shares,
        resolve_target,
        row,
        sweep,
    )

    try:
        target = resolve_target(rack_path, servers, transport, key_file)
        limit = parse_share_limit(max_timeouts, "--max-timeouts")
        n = len(target.servers)
        spec = LoadSpec(
            target=target, workload=workload, duration_s=parse_duration(duration),
            warmup_s=parse_duration(warmup), threads=threads,
            timeout_s=parse_duration(timeout),
            shares=parse_shares(shares, n) if shares else None,
            changes=[parse_change(c, n) for c in changes], policy=policy,
            busy=poll == "busy", spin_us=spin_us, raw=raw, raw_max=raw_max,
            lag_threshold_us=lag_threshold, seed=seed, bind=bind)
        if app:
            from malcolm.loadgen import apps
            shape = None
            if rack_path and (app_keys is None or app_value_size is None):
                shape = apps.dictionary_shape(rack_path)
            try:
                spec.app = apps.parse_app(
                    app, app_keys if app_keys is not None else shape and shape[0],
                    app_value_size if app_value_size is not None else shape and shape[1],
                    key_dist, bad_fraction)
            except apps.AppError as e:
                raise LoadgenError(str(e)) from None
        rates = parse_rates(rate_text)
        spec.validate()
        if raw_out and not raw:
            raise LoadgenError("--raw-out needs --raw")
    except LoadgenError as e:
        raise click.UsageError(str(e)) from None

    stop = threading.Event()
    old = signal.signal(signal.SIGINT, lambda *a: stop.set())
    if not as_json:
        what = spec.app.describe() if spec.app else workload
        click.echo(f"loadgen: {n} server(s) over {target.transport} ({target.source}), "
                   f"workload {what}, {threads} thread(s), {spec.duration_s:g} s per rate "
                   f"after {spec.warmup_s:g} s warm-up, poll {poll}")
        click.echo(HEADER)

    def show(rep):
        if not as_json:
            click.echo(row(rep))
            for line in notes(rep):
                click.echo(line)
            sys.stdout.flush()

    try:
        reps = sweep(spec, rates, show, stop)
    except LoadgenError as e:
        raise click.UsageError(str(e)) from None
    finally:
        signal.signal(signal.SIGINT, old)
    if raw_out and reps and reps[-1].get("_raw") is not None:
        import numpy as np
        np.save(raw_out, reps[-1]["_raw"])
    if as_json:
        click.echo(json.dumps({"runs": [_clean(r) for r in reps]}))
    if any(not r["accounted"] for r in reps):
        sys.exit(2)
    if any(r.get("app") and (r["app"]["wrong_values"] or r["app"]["bad_accepted"])
           for r in reps):
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
