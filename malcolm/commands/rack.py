"""``malcolm rack``: start a whole rack on this machine, or check a rack file."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time

import click

from malcolm.commands.types import Duration
from malcolm.policy.defaults import WINDOW_SHRINK
from malcolm.runtime.launcher import LocalRack, ServerExited, too_many_threads


@click.group(epilog="""
\b
Examples:
  malcolm rack gen --hosts node1,node2 --per-host 2 --key-file rack.key -o rack.toml
  malcolm rack check --rack rack.toml
  malcolm rack keygen rack.key      (a key of its own; rack gen --key-file makes one)
  malcolm rack up --rack rack.toml --stats
""")
def rack():
    """Rack files: generate, check and key them; up runs every server of one on this host."""


def _rack_file(ctx, positional, option):
    """The rack file from --rack FILE, or from the positional spelling of the first release
    (kept as a deprecated alias)."""
    if positional and option and positional != option:
        raise click.UsageError(f"two rack files: {positional} and --rack {option}")
    path = option or positional
    if not path:
        raise click.UsageError("no rack file: give --rack FILE")
    return path


def rack_file_option(f):
    """``--rack FILE`` with the old positional RACK_FILE as a deprecated alias."""
    f = click.argument("rack_pos", required=False, metavar="[RACK_FILE]",
                       type=click.Path(dir_okay=False))(f)
    return click.option("--rack", "rack_opt", type=click.Path(dir_okay=False), metavar="FILE",
                        default=None, help="The rack file (TOML). A bare RACK_FILE argument "
                                           "is the deprecated spelling of the same.")(f)


rack.add_command(importlib.import_module("malcolm.commands.rackgen").gen)


@rack.command(epilog="""
\b
Examples:
  malcolm rack check --rack rack.toml
""")
@rack_file_option
def check(rack_pos, rack_opt):
    """Validate a rack file with every check malcolm serve makes and print what it describes.

    Only what depends on the moment (an address already in use) or on the node is left to
    serve: a host name that does not resolve here is a warning, as each server resolves its
    own. Exit status 0: valid (warnings or not); 1: invalid, with the reason.
    """
    rack_path = _rack_file(click.get_current_context(), rack_pos, rack_opt)
    from malcolm.runtime.config import ConfigError, check_rack, key_path, load_rack
    try:
        # a login node may not know the compute nodes' names: rack gen writes them as they
        # are, and refusing them here refused every rack it wrote for such a cluster
        cfg = load_rack(rack_path, resolve=False)
        checked = check_rack(cfg)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    auth = (f"authenticated (key {key_path(cfg)})" if checked["key"] is not None
            else "UNAUTHENTICATED (no key_file): any host that can reach it can join")
    params = f" {cfg.policy_params}" if cfg.policy_params else ""
    ns = len(cfg.servers)
    click.echo(f"rack {cfg.name}: {ns} server{'s' * (ns != 1)} over {cfg.transport}, "
               f"policy {cfg.policy}{params}, window {cfg.window_us} µs"
               + (f" (or {cfg.window_tasks:g} task times, down to "
                  f"{cfg.window_us / WINDOW_SHRINK:g} µs)"
                  if cfg.window_tasks > 0 else " (fixed)") + ", "
               f"poll {cfg.poll}, {auth}")
    for s in cfg.servers:
        click.echo(f"  server {s.index}: {s.address}  {s.workers} worker"
                   f"{'s' * (s.workers != 1)}  {s.handler}")
    if cfg.unresolved:
        names = cfg.unresolved
        click.echo(f"rack check: warning: {', '.join(names[:4])}{' ...' * (len(names) > 4)} "
                   f"do{'es' * (len(names) == 1)} not resolve here; each server resolves its "
                   "own name at start (serve stops if its node cannot)", err=True)


@rack.command(epilog="""
\b
Examples:
  malcolm rack keygen rack.key      then key_file = "rack.key" in the rack file's [rack]
""")
@click.argument("key_path", type=click.Path(dir_okay=False))
def keygen(key_path):
    """Write a new rack key (32 random bytes, mode 0600) to KEY_PATH.

    Name it in the rack file ([rack] key_file = "...") or in MALCOLM_RACK_KEY_FILE, and
    give the same file to every server and client of the rack.
    """
    from malcolm.runtime.config import ConfigError, write_key
    try:
        write_key(key_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote a 32-byte rack key to {key_path!r} (mode 0600)")


@rack.command(epilog="""
\b
Examples:
  malcolm rack up --rack rack.toml                  until Ctrl-C
  malcolm rack up --rack rack.toml --stats --duration 30s --logdir logs
""")
@rack_file_option
@click.option("--stats/--no-stats", default=False, help="Servers print live statistics.")
@click.option("--duration", type=Duration("s"), default=None,
              help="Stop after this long (bare number: seconds). Default: until Ctrl-C.")
@click.option("--logdir", type=click.Path(file_okay=False), default=None,
              help="Directory for each server's output (default: a temporary one).")
@click.option("--keep-going", is_flag=True,
              help="When a server exits, report it and leave the others running (default: "
                   "stop the whole rack).")
def up(rack_pos, rack_opt, stats, duration, logdir, keep_going):
    """Start every server of a rack file here; Ctrl-C stops them all cleanly."""
    rack_path = _rack_file(click.get_current_context(), rack_pos, rack_opt)
    import math

    from malcolm.commands.types import refuse_empty
    refuse_empty(logdir=logdir)

    from malcolm.runtime.config import ConfigError, check_rack
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise click.BadParameter(f"{duration} must be a positive number of seconds",
                                 param_hint="--duration")
    try:
        if logdir:
            os.makedirs(logdir, exist_ok=True)
        lr = LocalRack(rack_path, ["--stats"] if stats else [], logdir)
        check_rack(lr.cfg)
        why = too_many_threads([s.workers for s in lr.cfg.servers])
        if why:         # rack check takes it: a rack of many hosts runs serve on each
            raise ConfigError(f"rack file {rack_path!r}: {why}; rack up runs every server "
                              "on this host (run malcolm serve on each of the rack's hosts)")
        lr.keep_logs()      # a temporary folder too: the user is told where it is
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        where = f"--logdir {logdir}" if logdir else "a temporary folder"
        raise click.ClickException(f"{where}: {e.strerror}") from None
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):     # HUP: a closed terminal
        signal.signal(sig, lambda *a: stop.append(1))
    try:
        lr.up()
    except ServerExited as e:
        raise click.ClickException(f"server {e.server} exited with {e.code} ({e.reason}); "
                                   f"its output is in {lr.out_path(e.server)}") from None
    except (RuntimeError, TimeoutError) as e:
        raise click.ClickException(str(e)) from None
    ns = len(lr.ids)
    click.echo(f"rack {lr.cfg.name} up: {ns} server{'s' * (ns != 1)} over {lr.cfg.transport} "
               f"(output in {lr.logdir}); Ctrl-C stops it")
    t_end = None if duration is None else time.monotonic() + duration
    offsets = {k: 0 for k in lr.ids}
    failed = False
    reported = set()
    while not stop and (t_end is None or time.monotonic() < t_end):
        time.sleep(0.2)
        for k in lr.ids:               # relay the servers' output, prefixed
            text = lr.output(k)
            for line in text[offsets[k]:].splitlines():
                click.echo(line)
            offsets[k] = len(text)
        dead = [k for k, p in lr.procs.items() if p.poll() is not None and k not in reported]
        if dead and not stop:           # after Ctrl-C, lr.down() below stops the others
            failed = True
            codes = {k: lr.procs[k].returncode for k in dead}
            if not keep_going:
                click.echo(f"rack: server(s) {dead} exited {codes}; stopping the rack "
                           "(--keep-going leaves the others running)", err=True)
                break
            reported.update(dead)
            alive = [k for k in lr.ids if lr.procs[k].poll() is None]
            click.echo(f"rack: server(s) {dead} exited {codes}; {len(alive)} still running "
                       "(--keep-going)", err=True)
            if not alive:
                break
    codes = lr.down()
    for k in lr.ids:
        for line in lr.output(k)[offsets[k]:].splitlines():
            click.echo(line)
    click.echo(f"rack {lr.cfg.name} down: exit codes {codes}")
    if failed or any(c != 0 for c in codes.values()):
        sys.exit(1)
