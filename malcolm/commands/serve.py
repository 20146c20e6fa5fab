"""``malcolm serve``: run one server of a rack until SIGINT/SIGTERM."""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import select
import signal
import sys
import time

import click

from malcolm.commands.types import INT, Duration

log = logging.getLogger("malcolm.server")


def _format_line(k, s, prev, dt):
    done = s["responses"] - prev.get("responses", 0)
    drops = (s["dropped_full"] + s["overloaded"] + s["bad_input"] + s["timed_out"]
             + s["send_failed"])
    return (f"[server {k}] {done / dt:8.0f} resp/s  load {s['load_us']:8.1f} µs  "
            f"queue {s['queue_len']:4d}  rate {s['rate_per_us']:.3f}/µs  "
            f"migrated {s['migrated_out']}  stolen {s['stolen_in']}  "
            f"steals-out {s['stolen_out']}  hb {s['hb_sent']}/{s['hb_recv']}  "
            f"drops {drops}  malformed {s['malformed']}")


_CTL_DROPS = (("ctl_bad_mac", "bad MAC"), ("ctl_replay", "replayed"),
              ("ctl_unsolicited", "unsolicited answer"), ("ctl_bad", "malformed"))


def log_malformed(k, prev, cur):
    """Log, at most once per call (the caller calls once a second), new malformed input:
    messages, and the transport's own control datagrams (verbs address queries)."""
    now_t, was_t = cur.get("transport", {}), prev.get("transport", {})
    parts = [f"{now_t[c] - was_t.get(c, 0)} {r}" for c, r in _CTL_DROPS
             if now_t.get(c, 0) - was_t.get(c, 0) > 0]
    if parts:
        log.warning("server %d dropped address datagram(s): %s", k, ", ".join(parts))
    new = cur["malformed"] - prev.get("malformed", 0)
    if new <= 0:
        return
    before = prev.get("malformed_by_reason", {})
    parts = [f"{n - before.get(r, 0)} {r}" for r, n in cur["malformed_by_reason"].items()
             if n - before.get(r, 0) > 0]
    last = cur.get("last_bad")
    src = f"; last from {last[1]}" if last and last[1] is not None else ""
    log.warning("server %d dropped %d malformed message(s): %s%s", k, new, ", ".join(parts), src)


def log_policy(k, prev, cur):
    """Log, once a tick, the policy's guards that fired since the last snapshot (its
    ``stats()`` under ``policy``: a runaway reset, peers' critics refused, heartbeat fields
    clamped); the simulator says the same of a run (``malcolm sim``'s notes)."""
    from malcolm.policy.guards import GUARDS, guards_text

    now, was = cur.get("policy") or {}, prev.get("policy") or {}
    text = guards_text({key: now.get(key, 0) - was.get(key, 0) for key, _ in GUARDS})
    if text:
        log.warning("server %d: the policy's guards fired: %s", k, text)


class PeerLog:
    """Log, once a tick, the peers that left the rack (silent for ``peer_timeout_ms``: no
    task goes to them), came back or restarted, and when every peer has first been heard;
    an operator reads a dead or misconfigured peer here rather than in statistics.

    Parameters
    ----------
    k : int
        This server's index.
    addresses : list of str
        Every server's address, by index.
    wait_s : float
        After this long with peers never heard, say which (once).
    """

    def __init__(self, k, addresses, wait_s=5.0):
        self.k, self.addresses = k, addresses
        self.peers = set(range(len(addresses))) - {k}
        self.ever: set[int] = set()         # heard at least once
        self.t0, self.wait_s = time.monotonic(), wait_s
        self.t_prev = self.t0
        self.said_all = self.said_wait = not self.peers

    def _names(self, js, new_epoch=()):
        js = sorted(js)
        shown = ", ".join(f"{j} ({self.addresses[j]}{', restarted' * (j in new_epoch)})"
                          for j in js[:8])
        more = f" and {len(js) - 8} more" if len(js) > 8 else ""
        return f"peer{'s' * (len(js) > 1)} {shown}{more}"

    def update(self, prev, cur, now=None):
        """Compare two statistics snapshots and log what changed between them."""
        now = time.monotonic() if now is None else now
        was, up = set(prev.get("peers_up", ())), set(cur.get("peers_up", ()))
        n = len(self.addresses)
        left0, left1 = prev.get("peer_left", [0] * n), cur.get("peer_left", [0] * n)
        ep0, ep1 = prev.get("peer_epoch", [0] * n), cur.get("peer_epoch", [0] * n)
        gone, back, blip, restarted = [], [], [], []
        renewed = {j for j in self.peers if ep0[j] != 0 and ep1[j] != ep0[j]}
        for j in sorted(self.peers):
            if j in was and j not in up:
                gone.append(j)
            elif j in up and j not in was and j in self.ever:
                back.append(j)          # its leaving was logged at an earlier tick
            elif j in up and left1[j] > left0[j]:
                blip.append(j)          # left and came back between two ticks
            elif j in renewed:
                restarted.append(j)     # a restart quicker than the peers' timeout
        timeout = cur.get("peer_timeout_ms", float("nan"))
        if gone:
            log.warning("server %d: %s left the rack (silent for %g ms): no task goes "
                        "there until it is heard again", self.k, self._names(gone), timeout)
        if blip:
            log.warning("server %d: %s left the rack (silent for %g ms) and came back "
                        "within %.1f s", self.k, self._names(blip, renewed), timeout,
                        now - self.t_prev)
        if back:
            log.info("server %d: %s back in the rack", self.k, self._names(back, renewed))
        if restarted:
            log.info("server %d: %s restarted (a new epoch), taken back at once",
                     self.k, self._names(restarted))
        self.ever |= up
        self.t_prev = now
        if not self.said_all and self.ever >= self.peers:
            self.said_all = self.said_wait = True
            log.info("server %d: all %d peers heard", self.k, len(self.peers))
        elif not self.said_wait and now - self.t0 >= self.wait_s:
            self.said_wait = True
            log.warning("server %d: %s not heard from in %.0f s (not started, another "
                        "rack key, or unreachable)", self.k,
                        self._names(self.peers - self.ever), now - self.t0)


@click.command(epilog="""
\b
Examples:
  malcolm serve --rack rack.toml --id 0             server 0 of the rack file
  srun malcolm serve --rack rack.toml               the rank from Slurm (SLURM_PROCID)
  malcolm serve --rack rack.toml --id 1 --stats --interval 500ms --duration 30s
""")
@click.option("--rack", "rack_path", required=True, type=click.Path(dir_okay=False),
              metavar="FILE", help="The rack file (TOML).")
@click.option("--id", "server_id", type=INT, default=None,
              help="This server's index; defaults to SLURM_PROCID, OMPI_COMM_WORLD_RANK "
                   "or PMI_RANK.")
@click.option("--stats/--no-stats", default=False, help="Print live statistics to stderr.")
@click.option("--interval", default=1.0, show_default=True, type=Duration("s"),
              help="Time between stat lines (bare number: seconds; 10ms..1h).")
@click.option("--stats-json", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write the statistics to this JSON file every interval, and the final "
                   "report at the end; each carries the run metadata (host, version, commit, "
                   "parameters) under 'metadata'.")
@click.option("--duration", type=Duration("s"), default=None,
              help="Stop after this long (bare number: seconds). Default: run until a signal.")
@click.option("--handler", default=None, help="Override the rack file's handler.")
def serve(rack_path, server_id, stats, interval, stats_json, duration, handler):
    """Run server ID of the rack file until SIGINT or SIGTERM.

    On a stop signal the server answers its waiting tasks with "server stopped", lets
    running ones finish (grace_s), and reports anything it could not finish.
    """
    import errno
    import math

    from malcolm.commands.types import refuse_empty
    refuse_empty(rack=rack_path, stats_json=stats_json, handler=handler)

    from malcolm.runtime.launcher import (
        EXIT_ADDR_IN_USE,
        PDEATH_SIGNAL,
        STACKS_SIGNAL,
        die_with_launcher,
    )
    # kill -USR2: every thread's stack to stderr (the launcher asks before a SIGKILL); not
    # where stderr is no file (an embedding, a test's captured output): only a diagnostic
    try:
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr.fileno(), all_threads=True)
    except (AttributeError, OSError, ValueError):    # io.UnsupportedOperation is both
        pass

    # Started by a local launcher (malcolm.runtime.launcher): first of all, ask to be told
    # when it dies, so that a SIGKILLed runner leaves no server behind holding its ports.
    parent = die_with_launcher()
    # A handler runs in the main thread between two bytecodes, maybe while that thread is in
    # threading.Event.wait holding the event's lock: Event.set() there deadlocked (a server
    # that ignored SIGTERM until its SIGKILL, its stacks showed it). So a handler takes no
    # lock: it notes why in ``got`` and writes a byte to a pipe the main loop waits on.
    got = []
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)

    def _wake():
        try:
            os.write(wake_w, b"\0")
        except OSError:                 # the pipe is full: a wake-up is pending already
            pass

    def _on_signal(signum, frame):
        got.append(signal.Signals(signum).name)
        _wake()

    def _on_launcher_death(signum, frame):
        # also sent when only the launcher's thread that started this server exited
        if os.getppid() != parent:
            got.append("its launcher exited")
            _wake()

    # SIGHUP: a closed terminal, or the kernel waking a paused server whose launcher died
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    if parent is not None:
        signal.signal(PDEATH_SIGNAL, _on_launcher_death)

    from malcolm.net.transport import TransportUnavailable
    from malcolm.runtime.config import ConfigError, build_server, default_server_id, load_rack
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise click.BadParameter(f"{duration} must be a positive number of seconds",
                                 param_hint="--duration")
    if not (math.isfinite(interval) and 0.01 <= interval <= 3600):
        raise click.BadParameter(f"{interval} must be in 0.01..3600 seconds",
                                 param_hint="--interval")
    meta = None
    if stats_json:
        from malcolm._metadata import run_metadata
        meta = run_metadata(click.get_current_context().params)
        try:                            # fail now, not after the run
            _write_json(stats_json, {"starting": True, "metadata": meta})
        except OSError as e:
            raise click.BadParameter(f"cannot write {stats_json}: {e.strerror}",
                                     param_hint="--stats-json") from None
    try:
        cfg = load_rack(rack_path)
        k = server_id if server_id is not None else default_server_id()
        if k is None:
            raise ConfigError("no --id given and no rank in SLURM_PROCID, "
                              "OMPI_COMM_WORLD_RANK or PMI_RANK")
        if 0 <= k < len(cfg.servers):
            # A rank started on the wrong node must not join the rack as a peer it is not.
            from malcolm.commands.rackgen import check_local_address
            check_local_address(cfg, k)
        srv = build_server(cfg, k, handler=handler)
    except (ConfigError, TransportUnavailable, ValueError, OSError) as e:
        err = click.ClickException(str(e))
        if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
            err.exit_code = EXIT_ADDR_IN_USE    # the launcher may retry on another port
        raise err from None

    srv.start()
    addr = cfg.servers[k].address
    click.echo(f"malcolm serve: server {k} of {len(cfg.servers)} ready on {addr} "
               f"({cfg.transport}, {cfg.servers[k].workers} worker"
               f"{'s' * (cfg.servers[k].workers != 1)}, {handler or cfg.servers[k].handler}, "
               f"policy {cfg.policy}, poll {cfg.poll}, "
               f"{'authenticated' if srv.authenticated else 'UNAUTHENTICATED'})", nl=True)
    sys.stdout.flush()
    t_end = None if duration is None else time.monotonic() + duration
    prev, t_prev = srv.stats(), time.monotonic()
    peers = PeerLog(k, cfg.addresses)
    # Besides the kernel's signal (Linux), a server whose launcher died without stopping it
    # (SIGKILL, a crash) sees that it was re-parented within a second, and stops.
    while not got:
        timeout = interval if parent is None else min(interval, 1.0)
        if t_end is not None:
            timeout = min(timeout, max(0.0, t_end - time.monotonic()))
        select.select([wake_r], [], [], timeout)    # never drained: once woken, stays
        now = time.monotonic()
        if parent is not None and os.getppid() != parent:
            got.append("its launcher exited")
            break
        if now - t_prev < 0.999 * interval and not got and (
                t_end is None or now < t_end):
            continue                    # woke early only to look at the launcher
        cur = srv.stats()
        log_malformed(k, prev, cur)
        log_policy(k, prev, cur)
        peers.update(prev, cur, now)
        if stats and now > t_prev:
            click.echo(_format_line(k, cur, prev, now - t_prev), err=True)
        if stats_json:
            _write_json_logged(stats_json, dict(cur, metadata=meta))
        prev, t_prev = cur, now
        if t_end is not None and now >= t_end:
            break
    report = srv.stop()
    log_malformed(k, prev, report)
    why = got[0] if got else "duration reached"
    click.echo(f"malcolm serve: server {k} stopped ({why}): {report['responses']} responses, "
               f"{report['completed']} completed, {report['stopped']} answered 'server stopped', "
               f"{report['unfinished']} unfinished (never answered), "
               f"{report['migrated_out']} migrated, {report['stolen_in']} stolen in, "
               f"{report['stolen_out']} stolen out, {report['malformed']} malformed dropped")
    if report["stuck_threads"]:
        click.echo(f"malcolm serve: threads that did not stop: {report['stuck_threads']}",
                   err=True)
    if stats_json:
        _write_json_logged(stats_json, dict(report, metadata=meta))
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown: it restores the default signal handlers,
    # and a second SIGTERM (``rack up`` stopping a server that already got Ctrl-C) would
    # then turn a clean stop into a kill. Everything is stopped and flushed by now.
    os._exit(0 if not report["stuck_threads"] else 3)


def _write_json(path, data):
    from malcolm._files import write_file
    write_file(path, json.dumps(data, indent=1, default=str))


_json_failed = []


def _write_json_logged(path, data):
    """Write the statistics; a failure (disk full, directory removed) is logged once and the
    server keeps serving."""
    try:
        _write_json(path, data)
    except OSError as e:
        if not _json_failed:
            log.warning("cannot write --stats-json %s: %s", path, e.strerror)
        _json_failed.append(1)
