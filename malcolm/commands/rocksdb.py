"""``malcolm rocksdb``: build the GET(n) benchmark's dictionary and measure its service times."""

from __future__ import annotations

import sys

import click

from malcolm._files import shown
from malcolm.commands.types import (
    INT,
    IntRange,
    JsonArgsCommand,
    check_writable,
    json_option,
    write_json,
)

# The dictionary's limits (malcolm/workers/rocksdb_kv.h), checked here before any call into
# the extension, whose C integers would overflow on a larger number (a traceback, not a line):
KEY_MAX = 0xFFFFFFFF            # keys are uint32 indices
VALUE_MAX = 1024                # MC_KV_MAX_VALUE: a value fits a response payload
GET_MAX = 64                    # MC_KV_MAX_KEYS: the most keys in one GET
SAMPLES_MAX = 1_000_000         # calibrate holds samples x GET-size keys in memory (256 MB)


def _spec_path(ctx, param, path):
    """PATH as a handler spec names it (``rocksdb:path=PATH``, whose options are split at
    commas): a path with a comma could be built but never served, and ``get`` read the part
    after it as an unknown option."""
    if not path.strip():
        raise click.BadParameter("is empty", param_hint="PATH")
    if "," in path:
        raise click.BadParameter(f"{path!r} contains ',', which a handler spec "
                                 "(rocksdb:path=PATH) cannot hold; choose another path",
                                 param_hint="PATH")
    return path


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
@click.option("--keys", type=IntRange(1, KEY_MAX), default=1_000_000, show_default=True,
              help=f"Number of keys (indices 0..keys-1), 1..{KEY_MAX}.")
@click.option("--value-size", type=IntRange(1, VALUE_MAX), default=16, show_default=True,
              help=f"Bytes per value, 1..{VALUE_MAX}. With 16, the answer to a GET(64) is "
                   "exactly the 1024 bytes a response payload holds.")
@click.option("--force", is_flag=True, help="Replace an existing database at PATH.")
@click.argument("path", type=click.Path(), callback=_spec_path)
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
    click.echo(f"{info['path']!r}: {info['keys']} keys x {info['value_size']} B, "
               f"{info['bytes'] / 1e6:.1f} MB on disk")


@rocksdb.command(epilog="""
\b
Examples:
  malcolm rocksdb get /tmp/kv 0 1 999999
""")
@click.argument("path", type=click.Path(), callback=_spec_path)
@click.argument("keys", nargs=-1, type=INT, required=True)
def get(path, keys):
    """Look up KEYS through the handler, as a server would, and check the values."""
    if len(keys) > GET_MAX:
        raise click.BadParameter(f"{len(keys)} keys: one GET takes at most {GET_MAX}",
                                 param_hint="KEYS")
    big = [k for k in keys if not 0 <= k <= KEY_MAX]
    if big:
        raise click.BadParameter(f"key {big[0]} is outside 0..{KEY_MAX}", param_hint="KEYS")
    rdb = _rdb()
    from malcolm.workers.handlers import Handler
    try:
        h = Handler(f"rocksdb:path={path}")
        st = rdb.open_handler(f"path={path}")       # the dictionary's size, for the message
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    # the handler answers a bad GET with "bad input" alone: say which part is bad
    if len(keys) > st.max_keys:
        raise click.BadParameter(f"{len(keys)} keys: a GET of {st.value_size}-byte values "
                                 f"takes at most {st.max_keys}", param_hint="KEYS")
    big = [k for k in keys if k >= st.n_keys]
    if big:
        raise click.BadParameter(f"key {big[0]} is outside 0..{st.n_keys - 1} (the "
                                 f"dictionary at {path!r} has {st.n_keys} keys)",
                                 param_hint="KEYS")
    payload = len(keys).to_bytes(4, "little") + b"".join(
        k.to_bytes(4, "little") for k in keys)
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
@click.option("--samples", type=IntRange(100, SAMPLES_MAX), default=20000,
              show_default=True, help=f"Requests per size, 100..{SAMPLES_MAX}.")
@click.option("--warmup-requests", "warmup", type=IntRange(0, SAMPLES_MAX), default=2000,
              show_default=True,
              help="Untimed requests per size first (fills the block cache).")
@click.option("--warmup", "warmup_old", type=IntRange(0, SAMPLES_MAX), default=None,
              hidden=True)
@click.option("--key-dist", default="uniform", show_default=True,
              help="uniform or zipf:S.")
@click.option("--seed", type=IntRange(0), default=1, show_default=True,
              help="Seed of the key choice.")
@json_option("the measurement (quantiles per size, the machine, the run metadata)")
@click.option("--out", "out_old", type=click.Path(dir_okay=False), default=None, hidden=True)
@click.option("--update-workloads", is_flag=True,
              help="Also write the measurement where the simulator's rocksdb1-measured and "
                   "rocksdb2-measured workloads read it (malcolm/data/rocksdb-calibration"
                   ".json; needs --sizes with 16 and 64, uniform keys).")
@click.argument("path", type=click.Path(), callback=_spec_path)
def calibrate(sizes, samples, warmup, warmup_old, key_dist, seed, json_out, out_old,
              update_workloads, path):
    """Time the handler's GET(n) on this machine (one thread, no network).

    Each request goes through the handler's C function exactly as a worker calls it. Two
    clocks time the same calls: wall (CLOCK_MONOTONIC, what a worker measures, preemption
    included) and cpu (the thread's CPU time, the work alone). The CPU-time quantiles are
    what the simulator's rocksdb*-measured workloads sample (--update-workloads) and what a
    dilated handler with warm=FILE pads to.
    """
    out_path = json_out or out_old
    check_writable(out_path, "--json" if json_out else "--out")    # not after the whole run
    warmup = warmup if warmup_old is None else warmup_old     # the old spelling, hidden
    from malcolm.loadgen import rocksdb_calibrate as cal
    from malcolm.loadgen.apps import AppError, check_zipf_keys, parse_key_dist
    try:
        s = parse_key_dist(key_dist)
    except AppError as e:
        raise click.UsageError(str(e)) from None
    from malcolm._units import ascii_number, split_items
    try:
        items = split_items(sizes)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--sizes") from None
    try:        # ASCII digits, as every number of the CLI (int() read "１６")
        ns = [ascii_number(x, int) for x in items]
    except ValueError:
        ns = []
    if not ns:
        raise click.BadParameter(f"{sizes!r} must be GET sizes, e.g. 16,64",
                                 param_hint="--sizes")
    bad = [n for n in ns if not 1 <= n <= GET_MAX]
    if bad:
        raise click.BadParameter(f"GET({bad[0]}) is out of range 1..{GET_MAX}",
                                 param_hint="--sizes")
    if update_workloads and (not {16, 64} <= set(ns) or s):
        raise click.UsageError("--update-workloads needs --sizes with 16 and 64 and uniform "
                               "keys (the workloads' GET(16) and GET(64))")
    rdb = _rdb()        # after the flags: a bad one is said whether or not it is built
    try:
        db = rdb.open_handler(f"path={path}")
    except rdb.RocksDBError as e:
        raise click.ClickException(str(e)) from None
    try:
        check_zipf_keys(db.n_keys, s)       # the dictionary's size: known only now
    except AppError as e:
        raise click.UsageError(str(e)) from None
    try:
        res = cal.calibrate(db, ns, samples, warmup, s, seed)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
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
        click.echo(f"wrote {shown(out_path)}")
