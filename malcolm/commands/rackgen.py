"""``malcolm rack gen``: write a rack file for the hosts of a Slurm job, an MPI hostfile or a
list, and the start-up check that a server really runs on the host its rank names.

Server ``k`` of the rack is the ``k``-th process the launcher starts, so the servers are
listed in the launcher's rank order: every slot of the first host, then of the next (Slurm's
default *block* distribution, Open MPI's and MPICH's default *by slot* mapping). Servers that
share a host get consecutive ports; a host listed more than once (``--hosts a,a``, a hostfile
line repeated) gets its further servers on the ports after those it already has, in the order
listed, so no two servers share a host:port.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import shutil
import socket
import subprocess

import click

from malcolm._files import shown
from malcolm._units import ascii_digits
from malcolm.commands.types import IntRange

try:
    import tomllib
except ModuleNotFoundError:     # Python 3.10
    import tomli as tomllib

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm node list: ``node[01-03,07],gpu1`` -> node01 node02 node03 node07 gpu1.

    Zero padding is kept (``[08-10]`` gives 08, 09, 10) and several bracket groups in one name
    multiply (``r[1-2]n[1-2]`` gives r1n1 r1n2 r2n1 r2n2), as ``scontrol show hostnames`` does.

    Raises
    ------
    ValueError
        Unbalanced brackets, an empty name or a range that runs backwards.
    """
    names, depth, cur = [], 0, ""
    for ch in nodelist.strip():
        depth += ch == "["
        depth -= ch == "]"
        if depth < 0 or depth > 1:
            raise ValueError(f"node list {nodelist!r}: unbalanced or nested brackets")
        if ch == "," and depth == 0:
            names.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"node list {nodelist!r}: unbalanced brackets")
    names.append(cur)
    out: list[str] = []
    for name in names:
        name = name.strip()
        if not name:
            raise ValueError(f"node list {nodelist!r}: empty host name")
        if any(c.isspace() for c in name):
            raise ValueError(f"node list {nodelist!r}: host name {name!r} contains white "
                             "space (separate hosts with commas)")
        out.extend(_expand_one(name, nodelist))
    return out


def _expand_one(name: str, whole: str) -> list[str]:
    m = _BRACKET.search(name)
    if not m:
        return [name]
    head, tail = name[:m.start()], name[m.end():]
    items = []
    for part in m.group(1).split(","):
        lo, dash, hi = part.strip().partition("-")
        # ASCII: isdigit() is true of '²' and '１' ("n[²]" was a host "n²", "n[１-２]" n1, n2)
        if not ascii_digits(lo) or (dash and not ascii_digits(hi)):
            raise ValueError(f"node list {whole!r}: {part!r} is not N or N-M")
        if not dash:
            items.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ValueError(f"node list {whole!r}: range {part!r} runs backwards")
        if b - a > 100_000:
            raise ValueError(f"node list {whole!r}: range {part!r} is too long")
        items.extend(str(i).zfill(len(lo)) for i in range(a, b + 1))
    return [h for it in items for h in _expand_one(head + it + tail, whole)]


def slurm_hosts(nodelist: str | None = None) -> list[str]:
    """Hosts of this Slurm job, from ``scontrol show hostnames`` when it exists, else by
    :func:`expand_nodelist` of ``SLURM_JOB_NODELIST``."""
    nodelist = nodelist or os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise ValueError("SLURM_JOB_NODELIST is not set (not inside a Slurm allocation); "
                         "use --hosts or --hostfile")
    if shutil.which("scontrol"):
        try:
            r = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                               text=True, timeout=30, check=True)
            hosts = r.stdout.split()
            if hosts:
                return hosts
        except (subprocess.SubprocessError, OSError):
            pass                    # fall back to our own expansion
    return expand_nodelist(nodelist)


def read_hostfile(path: str) -> list[tuple[str, int | None]]:
    """``[(host, slots)]`` from an MPI hostfile.

    Accepts Open MPI's ``host slots=N [max_slots=M]`` and MPICH/Hydra's ``host:N`` lines;
    ``#`` starts a comment; ``slots`` is None where the line gives none.

    Raises
    ------
    ValueError
        A line that is neither form, or a bad slot count; the message names the line.
    """
    from malcolm._files import read_text
    try:
        lines = read_text(path, 16 << 20).splitlines()     # a FIFO or /dev/zero: refused
    except OSError as e:
        raise ValueError(f"hostfile {path!r}: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"hostfile {e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"hostfile {path}: not a text file") from None
    out = []
    for no, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        host, slots = words[0], None
        if ":" in host and host.count(":") == 1:
            host, _, n = host.partition(":")
            slots = _slots(n, path, no)
        for w in words[1:]:
            key, eq, val = w.partition("=")
            if key in ("slots", "cpu") and eq:
                slots = _slots(val, path, no)
            elif key in ("max_slots", "max-slots") and eq:
                pass
            else:
                raise ValueError(f"hostfile {path} line {no}: cannot read {w!r} "
                                 "(expected 'host slots=N' or 'host:N')")
        if not host:
            raise ValueError(f"hostfile {path} line {no}: no host name")
        out.append((host, slots))
    if not out:
        raise ValueError(f"hostfile {path}: no hosts")
    return out


def _slots(text, path, no):
    if not ascii_digits(text) or int(text) < 1:
        raise ValueError(f"hostfile {path} line {no}: slot count {text!r} must be a "
                         "positive integer")
    return int(text)


def _toml_str(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML forbids raw."""
    return json.dumps(text).replace("\x7f", "\\u007f")


def _toml_value(key: str, v) -> str:
    """A policy parameter as TOML; NaN and infinities have no TOML spelling a rack accepts."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"--policy: {key}={v} must be a finite number")
    if isinstance(v, (int, float)):
        return repr(v)
    return _toml_str(str(v))


def host_key(host: str) -> str:
    """What tells two hosts apart: an IP address in its canonical form, a name in lower case."""
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        return host.lower()


def rack_toml(hosts: list[tuple[str, int]], transport: str = "udp", port: int = 7001,
              workers: int | None = None, handler: str | None = None,
              policy: str = "malcolm", name: str = "rack", seed: int = 1,
              key_file: str | None = None) -> str:
    """The text of a rack file with ``count`` servers on each ``(host, count)``, in order.

    The servers of a host get the ports from ``port`` up; a host named twice continues where
    its first entry stopped. ``key_file`` is written into ``[rack]`` as it is given (each
    server resolves a relative one against the rack file's folder).

    Raises
    ------
    ValueError
        A bad policy or parameter, or a host's ports past 65535.
    """
    from malcolm.policy.registry import parse_policy
    pname, params = parse_policy(policy)
    lines = ["# Written by `malcolm rack gen`. Server k is launcher rank k "
             "(SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK).",
             "[rack]", f"name = {_toml_str(name)}", f"transport = {_toml_str(transport)}"]
    if workers is not None:
        lines.append(f"workers = {workers}")
    if handler is not None:
        lines.append(f"handler = {_toml_str(handler)}")
    if key_file is not None:
        lines.append(f"key_file = {_toml_str(key_file)}")
    lines += ["", "[policy]", f"name = {_toml_str(pname)}", f"seed = {seed}"]
    for k, v in params.items():
        lines.append(f"{k} = {_toml_value(k, v)}")
    next_port: dict[str, int] = {}
    for host, count in hosts:
        first = next_port.get(host_key(host), port)
        if first + count - 1 > 65535:
            raise ValueError(f"the servers on {host} run past port 65535 (--port {port})")
        next_port[host_key(host)] = first + count
        h = f"[{host}]" if ":" in host else host           # an IPv6 literal
        for p in range(first, first + count):
            lines += ["", "[[server]]", f"address = {_toml_str(f'{h}:{p}')}"]
    return "\n".join(lines) + "\n"


def _rack_key(key_file: str | None, output: str) -> str:
    """Make sure the rack's key exists where its servers will read it (a relative path
    beside the rack file; with the rack on stdout, here), creating it when it does not; an
    existing one is kept, and must be a valid key. Returns what the final line says."""
    from malcolm.runtime.config import ConfigError, beside_rack, read_key, write_key
    if key_file is None:
        return "unauthenticated (any host that can reach it can join; --key-file FILE keys it)"
    if not key_file.strip() or "\0" in key_file:
        raise click.BadParameter("is not a file name", param_hint="--key-file")
    path = key_file if output == "-" else beside_rack(output, key_file)
    try:
        if os.path.lexists(path):
            read_key(path)
            return f"keyed with the existing {shown(path)}"
        write_key(path)
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--key-file") from None
    return f"keyed with a new 32-byte key in {shown(path)} (mode 0600)"


# Handlers that name something on the servers' nodes (a database, a library, a module): gen
# checks only their form, as a login node may not have it; each server opens its own at start.
_HANDLER_FORMS = {"so": r"(.+?):([A-Za-z_][A-Za-z0-9_]*)(?:@(.*))?",
                  "cffi": r"([^:@]+):([A-Za-z_][A-Za-z0-9_]*)(?:@(.*))?",
                  "python": r"(.+):([^:]+)"}


def check_handler(spec: str) -> None:
    """Refuse a handler spec every server would refuse: the built-in ones are built here (what
    ``rack check`` does); ``rocksdb``, ``so``, ``cffi`` and ``python`` ones are checked for
    their form only.

    Raises
    ------
    ValueError
        With the handler's own message.
    """
    kind, _, rest = spec.partition(":")
    if kind in _HANDLER_FORMS:
        if not re.fullmatch(_HANDLER_FORMS[kind], rest, re.S):
            raise ValueError(f"handler {spec!r} must be {kind}:"
                             f"{'PATH' if kind == 'so' else 'MODULE'}:"
                             f"{'FUNCTION' if kind == 'python' else 'SYMBOL[@ARG]'}")
        return
    if kind == "rocksdb":
        from malcolm.workers.rocksdb_spec import parse_spec  # pure Python: no RocksDB here
        try:
            parse_spec(rest)
        except ValueError as e:
            raise ValueError(f"handler {spec!r}: {e}") from None
        return
    from malcolm.workers.handlers import Handler
    Handler(spec)


def _split_host(address) -> str:
    addr = str(address)
    if addr.startswith("["):
        return addr[1:addr.index("]")]
    return addr.rsplit(":", 1)[0]


def check_local_address(cfg, k: int) -> None:
    """Fail when server ``k``'s address in ``cfg`` is not an address of this host.

    Called by ``malcolm serve`` before it opens its transport, so that a rank started on the
    wrong node (a hostfile out of order, ``--ntasks-per-node`` unlike the rack file's) stops
    at once with one clear line instead of joining the rack under a peer's identity. Each
    address the host name resolves to is tried with ``bind()`` to port 0: the kernel accepts
    exactly the addresses of this host's interfaces (and the wildcard). The ``shm`` transport
    names endpoints, not hosts, and is not checked.

    Raises
    ------
    malcolm.runtime.config.ConfigError
        With the rack file, the server, its address and this host's name.
    """
    from malcolm.runtime.config import ConfigError
    if cfg.transport == "shm":
        return
    addr = cfg.servers[k].address
    host = _split_host(addr)
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise ConfigError(f"{cfg.path}: server {k}'s address {addr!r}: cannot resolve "
                          f"{host!r} ({e.strerror})") from None
    for family, _, _, _, sa in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.bind((sa[0], 0) + tuple(sa[2:]))
                return
            except OSError:
                continue
    ips = sorted({sa[0] for *_, sa in infos})
    raise ConfigError(f"{cfg.path}: server {k}'s address {addr!r} ({', '.join(ips)}) is not "
                      f"an address of this host ({socket.gethostname()}); is rank {k} "
                      "running on the right node?")


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
        return True
    except (socket.gaierror, UnicodeError):
        return False


def _resolve(host: str) -> str:
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except socket.gaierror as e:
        raise ValueError(f"cannot resolve host {host!r}: {e.strerror}") from None


@click.command("gen", epilog="""
\b
Examples:
  malcolm rack gen --hosts 10.0.0.1,10.0.0.2,10.0.0.3 --key-file rack.key -o rack.toml
  malcolm rack gen --slurm --transport verbs --host-suffix -ib -o rack.toml   (in sbatch)
  malcolm rack gen --hostfile hosts.txt --per-host 2 --port 7100 -o rack.toml
  scontrol show hostnames is used for --slurm when it is on PATH.
""")
@click.option("--slurm", "from_slurm", is_flag=True,
              help="Hosts of this Slurm job (SLURM_JOB_NODELIST); the default when it is set "
                   "and no other source is given.")
@click.option("--hostfile", type=click.Path(dir_okay=False),
              help="An MPI hostfile ('host slots=N' or 'host:N' lines).")
@click.option("--hosts", help="Comma-separated host names or IP addresses; Slurm's "
                              "node[01-04] ranges are expanded.")
@click.option("--per-host", type=IntRange(1, 64), default=None,
              help="Servers per host [default: the hostfile's slots, else "
                   "SLURM_NTASKS_PER_NODE, else 1].")
@click.option("--transport", type=click.Choice(["udp", "verbs"]), default="udp",
              show_default=True, help="The rack's transport (shm racks are local: write "
                                      "those by hand).")
@click.option("--port", type=IntRange(1, 65535), default=7001, show_default=True,
              help="UDP port of a host's first server; the next ones count up from it (a host "
                   "listed twice continues on the ports after its first servers').")
@click.option("--workers", type=IntRange(0, 1024), default=None,
              help="Worker threads per server (0: the gateway runs the tasks) "
                   "[default: the rack file's default, 2].")
@click.option("--handler", default=None,
              help="Task handler (see `malcolm list handlers`) [default: spin]. Built-in ones "
                   "are checked here; rocksdb, so, cffi and python ones for their form only "
                   "(each server opens its own at start).")
@click.option("--policy", default="malcolm", show_default=True,
              help="Server policy, NAME or NAME:key=value,... (see `malcolm list policies`).")
@click.option("--name", default="rack", show_default=True, help="The rack's name.")
@click.option("--host-suffix", default="",
              help="Appended to every host name, e.g. -ib for the names of the InfiniBand "
                   "interfaces.")
@click.option("--resolve", is_flag=True,
              help="Write IPv4 addresses, resolved here, instead of host names.")
@click.option("--key-file", "key_file", default=None, metavar="FILE",
              help="Authenticate the rack with this key: written into [rack] as key_file, "
                   "and created (32 random bytes, mode 0600) when it does not exist. A "
                   "relative FILE is beside the rack file, as every server reads it.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True, help="Rack file to write ('-': stdout).")
def gen(from_slurm, hostfile, hosts, per_host, transport, port, workers, handler, policy,
        name, host_suffix, resolve, key_file, output):
    """Write a rack file for several machines: one [[server]] per launcher rank, in order.

    Start every server with the same rack file and let the launcher give each its rank
    (srun malcolm serve --rack rack.toml, or mpirun); docs/deploy.md has sbatch and
    mpirun scripts. A host listed more than once gets its further servers on its next
    ports, so no two servers share an address.
    """
    from malcolm.runtime.config import ConfigError, check_host_name, parse_rack
    if handler is not None and not handler.strip():
        raise click.BadParameter("is empty (see malcolm list handlers)", param_hint="--handler")
    given = sum(bool(x) for x in (from_slurm, hostfile, hosts))
    if given > 1:
        raise click.UsageError("give one of --slurm, --hostfile, --hosts")
    try:
        if hostfile:
            entries = read_hostfile(hostfile)
        elif hosts:
            entries = [(h, None) for h in expand_nodelist(hosts)]
        elif from_slurm or os.environ.get("SLURM_JOB_NODELIST"):
            entries = [(h, None) for h in slurm_hosts()]
        else:
            raise click.UsageError("no hosts: give --hosts, --hostfile or --slurm (inside a "
                                   "Slurm job)")
        env_per = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0].strip()
        default_per = 1
        if env_per and not hostfile:
            # Slurm writes a positive count ("4", or "4(x2)"); anything else is a broken
            # environment, said in one line rather than taken for 1 (or 0 servers)
            if not (ascii_digits(env_per) and 1 <= int(env_per) <= 64):
                raise click.UsageError(f"SLURM_NTASKS_PER_NODE={env_per!r} must be a count "
                                       "of 1-64 tasks per node")
            default_per = int(env_per)
        counts = [(h + host_suffix, per_host or slots or default_per) for h, slots in entries]
        for h, _ in counts:
            check_host_name(h)
        if resolve:
            counts = [(_resolve(h), c) for h, c in counts]
        total = sum(c for _, c in counts)
        if total > 64:
            raise ValueError(f"{total} servers: a rack has at most 64")
        text = rack_toml(counts, transport, port, workers, handler, policy, name,
                         key_file=key_file)
        if handler is not None:
            check_handler(handler)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    # Validate everything but the host names with the rack file's own parser and the policy
    # as serve builds it (what rack check does): the names are resolved by each server on its
    # own node, and a login node may not know them, so each distinct host stands in as its
    # own loopback address, with the ports as written (a host:port used twice is refused).
    from malcolm.policy.registry import make_policy
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as e:     # a bug here, never the input's
        raise click.ClickException(f"rack gen wrote an unreadable rack: {e}") from None
    stand_in: dict[str, int] = {}
    for srv in data["server"]:
        h, _, p = srv["address"].rpartition(":")
        j = stand_in.setdefault(host_key(h.strip("[]")), len(stand_in) + 1)
        srv["address"] = f"127.0.0.{j}:{p}"
    try:
        cfg = parse_rack(data, "<rack gen>")
        make_policy(cfg.policy, len(cfg.servers), 0, cfg.seed, **cfg.policy_params)
    except ConfigError as e:
        raise click.ClickException(f"the generated rack is invalid: {e}") from None
    except (ValueError, TypeError, OverflowError) as e:
        raise click.ClickException(f"--policy: {e}") from None
    key_note = _rack_key(key_file, output)
    unknown = [h for h in dict.fromkeys(h for h, _ in counts) if not _resolves(h)]
    if unknown:
        click.echo(f"rack gen: note: {', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''}"
                   " do(es) not resolve here; each server resolves its own name at start",
                   err=True)
    if output == "-":
        click.echo(text, nl=False)
        click.echo(f"rack gen: {key_note}", err=True)
    else:
        try:
            with open(output, "w") as f:
                f.write(text)
        except OSError as e:
            raise click.BadParameter(f"cannot write {shown(output)}: {e.strerror}",
                                     param_hint="--output") from None
        click.echo(f"wrote {shown(output)}: {total} server{'s' * (total != 1)} on "
                   f"{len(stand_in)} host(s) over {transport}, {key_note}", err=True)
