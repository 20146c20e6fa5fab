"""``malcolm bench``: microbenchmarks timed inside native loops, beside a plain-C floor."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from importlib import resources

import click

from malcolm.commands.types import check_writable, json_option, write_json

SIZES = (4, 8, 16, 32)
WINDOW_SIZES = (4, 8, 16, 32, 64)   # the default policy's window: up to a full rack
# Thesis Tables 6.1 and 6.2 (C++ with SIMD, 2.6 GHz EPYC), ns.
THESIS = {
    "incremental_ns": {4: 7, 8: 12, 16: 22, 32: 43},
    "rebuild_ns": {4: 100, 8: 100, 16: 200, 32: 500},
    "dist_update_ns": {4: 100, 8: 100, 16: 200, 32: 500},
    "param_update_ns": {4: 500, 8: 900, 16: 2000, 32: 8000},
}


def _compiler():
    """The C compiler's command line (a list) and how to name it in a message: CC as make
    takes it ("ccache gcc", "gcc -m64"), else cc or gcc on the PATH."""
    env = os.environ.get("CC", "")
    if env.strip():
        try:
            return shlex.split(env), f"CC={env!r}"
        except ValueError as e:         # an unbalanced quote
            raise click.ClickException(f"CC={env!r} is not a command line ({e}); set CC to "
                                       "a C compiler, or pass --no-floor") from None
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise click.ClickException("--floor needs a C compiler (install gcc, or pass "
                                   "--no-floor)")
    return [cc], repr(cc)


def _step(cmd, what, timeout):
    """Run one step of the floor; its failure is one line naming ``what``."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                           stdin=subprocess.DEVNULL, timeout=timeout)
    except OSError as e:                # not found, not executable, not a program
        raise click.ClickException(f"--floor: {what}: cannot run {cmd[0]!r}: {e.strerror}; "
                                   "set CC to a C compiler, or pass --no-floor") from None
    except subprocess.TimeoutExpired:
        raise click.ClickException(f"--floor: {what} did not finish in {timeout} s") from None
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
        raise click.ClickException(f"--floor: {what} failed (exit {r.returncode})"
                                   + (f": {first[:200]!r}" if first else "")
                                   + "; pass --no-floor to skip the floor")
    return r.stdout


def run_floor():
    """Compile and run the plain-C floor with ``-O3 -march=native``; returns its JSON dict.

    Raises ``click.ClickException`` (one line) when no C compiler is available, or when
    compiling or running the floor fails."""
    cc, name = _compiler()
    src = resources.files("malcolm.bench").joinpath("floor.c")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "floor")
        with resources.as_file(src) as path:
            _step(cc + ["-O3", "-march=native", "-o", exe, str(path), "-lm"],
                  f"compiling floor.c with {name}", 300)
        out = _step([exe], "the compiled floor", 600)
    try:
        return json.loads(out)
    except ValueError:
        raise click.ClickException(f"--floor: the floor compiled with {name} printed no "
                                   "JSON; pass --no-floor to skip it") from None


def micro_results(quick=False, policy=True):
    """Run the core (and, when built, the policy) microbenchmarks; flat dict of ns/op."""
    from malcolm.bench import micro

    iters, rebuild_iters, repeats = (200_000, 50_000, 3) if quick else (2_000_000, 500_000, 7)
    res = micro.core(SIZES, iters, rebuild_iters, repeats)
    if policy:
        try:
            from malcolm.bench import policy as policy_bench
        except ImportError as exc:
            click.echo(f"malcolm bench: policy benchmarks skipped: {exc}", err=True)
        else:
            for n in SIZES:
                res.update(policy_bench.bench_policy(n, *((2_000, 7) if quick else (5_000, 41))))
            res["window_ns.64"] = policy_bench.bench_window(
                64, *((2_000, 7) if quick else (5_000, 41)))
    return res


def _table(res, floor):
    rows = []
    for key in ("sample_ns", "incremental_ns", "rebuild_ns", "dist_update_ns",
                "param_update_ns", "window_ns"):
        for n in WINDOW_SIZES:
            k = f"{key}.{n}"
            if k not in res:
                continue
            f = floor.get(k) if floor else None
            rows.append((k, res[k], f, THESIS.get(key, {}).get(n)))
    for k in ("queue_pushpop_ns", "spsc_pushpop_ns", "estimator_observe_ns"):
        if k in res:
            rows.append((k, res[k], None, None))
    lines = [f"{'operation':<22}{'malcolm ns':>12}{'C floor ns':>12}{'ratio':>8}{'thesis ns':>11}"]
    for k, v, f, t in rows:
        fs = f"{f:12.2f}" if f else f"{'':>12}"
        rs = f"{v / f:8.2f}" if f else f"{'':>8}"
        ts = f"{t:11.0f}" if t else f"{'':>11}"
        lines.append(f"{k:<22}{v:12.2f}{fs}{rs}{ts}")
    return "\n".join(lines)


@click.group(epilog="""
\b
Examples:
  malcolm bench micro                   the core's operations beside the plain-C floor
  malcolm bench runtime --quick         round trips and gateway throughput, short runs
  malcolm bench micro --json micro.json
""")
def bench():
    """Benchmarks. Each figure is measured inside a native loop (best of several runs)."""


@bench.command(epilog="""
\b
Examples:
  malcolm bench micro
  malcolm bench micro --quick --no-floor
  malcolm bench micro --json -          one flat object: sample_ns.8, floor.sample_ns.8, ...
""")
@json_option("one flat object (ns/op) with the run metadata")
@click.option("--floor/--no-floor", default=True, show_default=True,
              help="Also compile and run the plain-C floor in the same run.")
@click.option("--quick", is_flag=True, help="Fewer iterations (for smoke tests).")
def micro(json_out, floor, quick):
    """Sampling, incremental logit update, softmax+CDF rebuild and queue push+pop.

    Sizes N = 4, 8, 16, 32. With --json, keys look like sample_ns.8 (ns per operation);
    floor figures appear as floor.sample_ns.8, and the run's metadata under metadata.
    """
    check_writable(json_out, "--json")
    floor_res = run_floor() if floor else {}
    res = micro_results(quick=quick)
    if json_out:
        from malcolm._metadata import run_metadata
        out = dict(res)
        out.update({f"floor.{k}": v for k, v in floor_res.items()})
        out["metadata"] = run_metadata(click.get_current_context().params)
        write_json(json_out, out)
    if json_out != "-":
        click.echo(_table(res, floor_res))
        if floor_res:
            click.echo("\nratio = malcolm / plain-C floor measured just before, same machine.",
                       err=False)
    sys.stdout.flush()


@bench.command(epilog="""
\b
Examples:
  malcolm bench runtime
  malcolm bench runtime --quick --transport shm --json runtime.json
""")
@json_option("one object (sections per measurement, times in µs and ns) with the metadata")
@click.option("--quick", is_flag=True, help="Shorter runs (for smoke tests).")
@click.option("--transport", "transports", multiple=True, type=click.Choice(["udp", "shm"]),
              help="Transports to measure (default both).")
def runtime(json_out, quick, transports):
    """Round trip, gateway throughput and decision overhead, each beside its plain-C floor
    measured in the same run (implementation: malcolm/bench/runtime.py)."""
    from malcolm.bench import runtime
    check_writable(json_out, "--json")
    res = runtime.run_all(quick=quick, transports=transports or ("udp", "shm"))
    if json_out:
        from malcolm._metadata import run_metadata
        res["metadata"] = run_metadata(click.get_current_context().params)
        write_json(json_out, res)
    if json_out != "-":
        click.echo(runtime.table(res))
