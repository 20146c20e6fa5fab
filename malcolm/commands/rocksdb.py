"""``malcolm rocksdb``: build the GET(n) benchmark's dictionary and measure its service times."""

from __future__ import annotations

import sys

import click

from malcolm.commands.types import JsonArgsCommand, json_option, write_json


def _rdb():
    try:
        from malcolm.workers import rocksdb
    except ImportError as e:
        raise click.ClickException(
            f"the rocksdb extension is not built ({e}); install the Debian package "
            "librocksdb-dev and rebuild (./dev does both, as root)") from None
    return rocksdb


@click.group(epilog="""
\b
Examples:
  malcolm rocksdb load /tmp/kv --keys 1000000
  malcolm rocksdb get /tmp/kv 1 2 3
  malcolm rocksdb calibrate /tmp/kv --sizes 16,64 --json calibration.json
""")
def rocksdb():
    """The RocksDB GET(n) service (thesis §7.1): dictionary, handler, calibration.

    \b
    Servers run it with handler = "rocksdb:path=PATH" in the rack file; clients send it
    `malcolm loadgen --app rocksdb1` (docs/rocksdb.md).
    """


@rocksdb.command(epilog="""
\b
Examples:
  malcolm rocksdb load /tmp/kv                      a million keys of 16 B
  malcolm rocksdb load /tmp/kv --keys 10000 --value-size 64 --force
""")
@click.option("--keys", default=1_000_000, show_default=True,
              help="Number of keys (indices 0..keys-1).")
@click.option("--value-size", default=16, show_default=True,
              help="Bytes per value, 1..1024. With 16, the answer to a GET(64) is exactly "
                   "the 1024 bytes a response payload holds.")
@click.option("--force", is_flag=True, help="Replace an existing database at PATH.")
@click.argument("path", type=click.Path())
def load(keys, value_size, force, path):
    """Build the dictionary at PATH: deterministic values, so clients check what they get."""
    rdb = _rdb()

    def progress(done, total):
        if sys.stderr.isatty():
            click.echo(f"\r{done}/{total} keys", nl=False, err=True)

    try:
        info = rdb.load(path, keys, value_size, overwrite=force, progress=progress)
    except rdb.RocksDBError as e:
        raise click.ClickException(str(e)) from None
    if sys.stderr.isatty():
        click.echo("", err=True)
    click.echo(f"{info['path']}: {info['keys']} keys x {info['value_size']} B, "
               f"{info['bytes'] / 1e6:.1f} MB on disk")


@rocksdb.command(epilog="""
\b
Examples:
  malcolm rocksdb get /tmp/kv 0 1 999999
""")
@click.argument("path", type=click.Path())
@click.argument("keys", nargs=-1, type=int, required=True)
def get(path, keys):
    """Look up KEYS through the handler, as a server would, and check the values."""
    rdb = _rdb()
    from malcolm.workers.handlers import Handler
    try:
        h = Handler(f"rocksdb:path={path}")
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    payload = len(keys).to_bytes(4, "little") + b"".join(
        (k & 0xFFFFFFFF).to_bytes(4, "little") for k in keys)
    rc, out = h.run(0, 0, payload)
    if rc != 0:
        raise click.ClickException(f"handler answered {'bad input' if rc == 2 else 'error'} "
                                   f"(rc {rc})")
    vs = len(out) // len(keys)
    for i, k in enumerate(keys):
        v = out[i * vs:(i + 1) * vs]
        ok = "ok" if v == rdb.value(k, vs) else "WRONG"
        click.echo(f"{k}: {v.hex()} {ok}")


@rocksdb.command(cls=JsonArgsCommand, epilog="""
\b
Examples:
  malcolm rocksdb calibrate /tmp/kv
  malcolm rocksdb calibrate /tmp/kv --sizes 16,64 --key-dist zipf:0.99 --json cal.json
  malcolm rocksdb calibrate /tmp/kv --samples 20000 --warmup-requests 20000 --update-workloads
""")
@click.option("--sizes", default="16,64", show_default=True,
              help="GET sizes to time (keys per request).")
@click.option("--samples", default=20000, show_default=True, help="Requests per size.")
@click.option("--warmup-requests", "warmup", default=2000, show_default=True,
              help="Untimed requests per size first (fills the block cache).")
@click.option("--warmup", "warmup_old", type=int, default=None, hidden=True)
@click.option("--key-dist", default="uniform", show_default=True,
              help="uniform or zipf:S.")
@click.option("--seed", default=1, show_default=True, help="Seed of the key choice.")
@json_option("the measurement (quantiles per size, the machine, the run metadata)")
@click.option("--out", "out_old", type=click.Path(dir_okay=False), default=None, hidden=True)
@click.option("--update-workloads", is_flag=True,
              help="Also write the measurement where the simulator's rocksdb1-measured and "
                   "rocksdb2-measured workloads read it (malcolm/data/rocksdb-calibration"
                   ".json; needs --sizes with 16 and 64, uniform keys).")
@click.argument("path", type=click.Path())
def calibrate(sizes, samples, warmup, warmup_old, key_dist, seed, json_out, out_old,
              update_workloads, path):
    """Time the handler's GET(n) on this machine (one thread, no network).

    Each request goes through the handler's C function exactly as a worker calls it. Two
    clocks time the same calls: wall (CLOCK_MONOTONIC, what a worker measures, preemption
    included) and cpu (the thread's CPU time, the work alone). The CPU-time quantiles are
    what the simulator's rocksdb*-measured workloads sample (--update-workloads) and what a
    dilated handler with warm=FILE pads to.
    """
    rdb = _rdb()
    warmup = warmup if warmup_old is None else warmup_old     # the old spelling, hidden
    from malcolm.loadgen import rocksdb_calibrate as cal
    from malcolm.loadgen.apps import AppError, parse_key_dist
    try:
        s = parse_key_dist(key_dist)
    except AppError as e:
        raise click.UsageError(str(e)) from None
    try:
        ns = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        raise click.UsageError(f"--sizes {sizes!r} must be GET sizes, e.g. 16,64") from None
    if update_workloads and (not {16, 64} <= set(ns) or s):
        raise click.UsageError("--update-workloads needs --sizes with 16 and 64 and uniform "
                               "keys (the workloads' GET(16) and GET(64))")
    try:
        db = rdb.open_handler(f"path={path}")
    except rdb.RocksDBError as e:
        raise click.ClickException(str(e)) from None
    try:
        res = cal.calibrate(db, ns, samples, warmup, s, seed)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    out_path = json_out or out_old
    if update_workloads:
        from malcolm._metadata import run_metadata
        from malcolm.workloads import CALIBRATION_FILE, MEASURED_MIXES, measured_workload
        res["metadata"] = run_metadata(click.get_current_context().params)
        write_json(CALIBRATION_FILE, res, indent=1)
        click.echo("; ".join(f"{w}: mean {measured_workload(w).mean_us:.1f} µs"
                             for w in MEASURED_MIXES) + f" (wrote {CALIBRATION_FILE})",
                   err=out_path == "-")
    if out_path == "-":
        from malcolm._metadata import run_metadata
        res["metadata"] = run_metadata(click.get_current_context().params)
        write_json("-", res, indent=1)
        return
    click.echo(f"{res['sizes'][0]['samples']} GETs per size, {res['key_dist']} keys, load "
               f"average {res['machine']['load_avg'][0]:.1f} on {res['machine']['cpus']} CPUs")
    for r in res["sizes"]:
        for clock in ("wall", "cpu"):
            x = r[clock]
            click.echo(f"GET({r['n']}) {clock:4s}: mean {x['mean_us']:.2f} µs, p50 "
                       f"{x['p50_us']:.2f}, p99 {x['p99_us']:.2f}, p99.9 {x['p999_us']:.2f}, "
                       f"max {x['max_us']:.1f}")
    if out_path:
        from malcolm._metadata import run_metadata
        res["metadata"] = run_metadata(click.get_current_context().params)
        write_json(out_path, res, indent=1)
        click.echo(f"wrote {out_path}")
