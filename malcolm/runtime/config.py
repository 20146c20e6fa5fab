"""Rack description files (TOML) for the real runtime.

Example (``examples`` in ``docs/runtime.md`` has more)::

    [rack]
    name = "demo"            # names shm endpoints; default "rack"
    transport = "udp"        # udp | shm | verbs: one for the whole rack
    poll = "adaptive"        # busy | adaptive (spin, then block)
    window_us = 100          # policy window = heartbeat period (the longest: window_tasks)
    workers = 2              # defaults for every server (0: the gateway runs the tasks)
    handler = "sleep"

    [policy]
    name = "malcolm"         # any server policy of malcolm.policy.registry
    seed = 1
    # every other key is a parameter of the policy, e.g. threshold = 4 for jbt

    [[server]]
    address = "127.0.0.1:7001"
    [[server]]
    address = "127.0.0.1:7002"
    workers = 4              # per-server override
    handler = "spin"

For ``shm`` the address is the endpoint name (default ``<name>-s<index>``).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass, field

try:
    import tomllib
except ModuleNotFoundError:     # Python 3.10: the same reader as a package (pyproject pins it)
    import tomli as tomllib

from malcolm.net.limits import MAX_SHM_CAPACITY
from malcolm.policy.defaults import EST_ALPHA, EST_PRIOR_SERVICE_US, MAX_WINDOW_TASKS, WINDOW_TASKS

RACK_KEYS = {
    "name": (str, "rack"), "transport": (str, "udp"), "poll": (str, "adaptive"),
    "window_us": (float, 100.0), "window_tasks": (float, WINDOW_TASKS),
    "spin_us": (float, 50.0), "workers": (int, 2),
    "handler": (str, "spin"), "task_types": (int, 8), "capacity": (int, 4096),
    "task_timeout_ms": (float, 0.0), "steal_timeout_us": (float, 2000.0),
    "max_service_ms": (float, 10_000.0), "clients": (list, None), "grace_s": (float, 2.0),
    # the load estimator's defaults are the simulator's (malcolm/policy/driver.pxd)
    "est_alpha": (float, EST_ALPHA), "prior_service_us": (float, EST_PRIOR_SERVICE_US),
    "shm_capacity": (int, 1024),
    "peer_timeout_ms": (float, -1.0), "key_file": (str, None), "max_wait_ms": (float, 200.0),
    # a quiet rack's longest window (malcolm/runtime/policy_thread.pyx); 0: never longer
    "idle_window_us": (float, -1.0),
    # network emulation in every endpoint's transport (malcolm/net/delay.pyx): what netem
    # would add per hop, for dilated runs and fault tests; 0 on a real network
    "hop_delay_us": (float, 0.0), "hop_jitter_us": (float, 0.0), "hop_reorder": (float, 0.0),
    "hop_loss": (float, 0.0),
}
# Closed ranges of the numeric keys (NaN and infinities are refused everywhere). The bounds
# are what the runtime can honour: a window under 1 µs would make the policy thread spin
# through millions of windows a second; capacity is bounded by the slot allocation.
RACK_RANGES = {
    "window_us": (1.0, 10_000_000.0), "window_tasks": (0.0, MAX_WINDOW_TASKS),
    "spin_us": (0.0, 1_000_000.0), "workers": (0, 1024),
    "task_types": (1, 65535), "capacity": (1, 1 << 22), "task_timeout_ms": (0.0, 3_600_000.0),
    "steal_timeout_us": (1.0, 60_000_000.0), "max_service_ms": (0.001, 3_600_000.0),
    "grace_s": (0.0, 3600.0), "est_alpha": (1e-6, 1.0), "prior_service_us": (0.001, 1e9),
    "shm_capacity": (2, MAX_SHM_CAPACITY), "peer_timeout_ms": (1.0, 3_600_000.0),
    "idle_window_us": (0.0, 60_000_000.0),
    "max_wait_ms": (0.0, 3_600_000.0), "hop_delay_us": (0.0, 60_000_000.0),
    "hop_jitter_us": (0.0, 60_000_000.0), "hop_reorder": (0.0, 1.0), "hop_loss": (0.0, 1.0),
}
SERVER_KEYS = {"address", "workers", "handler", "transport", "cpus"}
# The keys whose default, -1, is derived from the window (malcolm/runtime/server.pyx).
AUTO_DEFAULTS = {"peer_timeout_ms": "20 windows, at least 100 ms",
                 "idle_window_us": "32 windows, at most 5 ms and a quarter of peer_timeout_ms"}


def range_error(key: str, v) -> str | None:
    """What is wrong with ``v`` for the numeric setting ``key`` (:data:`RACK_RANGES`), or
    None: the rack file's check, and ``Server``'s for the same settings given in Python."""
    lo, hi = RACK_RANGES[key]
    if key in AUTO_DEFAULTS and v == -1.0:
        return None                     # the default, derived from the window
    if math.isfinite(v) and lo <= v <= hi:
        return None
    extra = f" (or -1: {AUTO_DEFAULTS[key]})" if key in AUTO_DEFAULTS else ""
    return f"must be a finite number in {lo:g}..{hi:g}{extra}"


# RackServer.stop's joins: the gateway's for grace_s + GATEWAY_JOIN_EXTRA_S (it answers every
# waiting task before it exits), then each worker's and the policy thread's for
# max(THREAD_JOIN_MIN_S, grace_s). One place, so the launcher's wait cannot drift from them.
GATEWAY_JOIN_EXTRA_S = 5.0
THREAD_JOIN_MIN_S = 0.1


def stop_bound_s(grace_s: float, workers: int) -> float:
    """The longest ``RackServer.stop`` waits for its threads, in seconds.

    Parameters
    ----------
    grace_s : float
        The server's ``grace_s``.
    workers : int
        Its worker threads (the policy thread is counted here).

    Returns
    -------
    float
        ``grace_s + GATEWAY_JOIN_EXTRA_S + (workers + 1) * max(THREAD_JOIN_MIN_S, grace_s)``.
    """
    return (grace_s + GATEWAY_JOIN_EXTRA_S
            + (max(0, workers) + 1) * max(THREAD_JOIN_MIN_S, grace_s))


class ConfigError(ValueError):
    """A rack file is invalid; the message names the file and the key."""


@dataclass
class ServerConfig:
    index: int
    address: object
    workers: int
    handler: str
    cpus: list | None = None


@dataclass
class RackConfig:
    """A parsed, validated rack file."""

    path: str
    name: str
    transport: str
    poll: str
    window_us: float
    window_tasks: float
    spin_us: float
    task_types: int
    capacity: int
    task_timeout_ms: float
    steal_timeout_us: float
    max_service_ms: float
    clients: list | None
    grace_s: float
    est_alpha: float
    prior_service_us: float
    shm_capacity: int
    peer_timeout_ms: float
    idle_window_us: float
    key_file: str | None
    max_wait_ms: float
    hop_delay_us: float
    hop_jitter_us: float
    hop_reorder: float
    hop_loss: float
    policy: str
    policy_params: dict
    seed: int
    servers: list[ServerConfig] = field(default_factory=list)
    #: The host names that did not resolve where the file was read, each once (only read
    #: with ``resolve=False``, as ``rack check`` does; otherwise they are refused).
    unresolved: list[str] = field(default_factory=list)

    @property
    def addresses(self):
        """Server addresses by index, in the transport's Python form."""
        return [s.address for s in self.servers]

    @property
    def hop(self):
        """The emulated network (``malcolm.net.delay.wrap``'s keywords), or None."""
        h = {"delay_us": self.hop_delay_us, "jitter_us": self.hop_jitter_us,
             "reorder": self.hop_reorder, "loss": self.hop_loss}
        return h if any(h.values()) else None


def _typed(where, key, value, typ):
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if typ is str and value is None:
        return value
    if typ is list and value is not None and not isinstance(value, list):
        raise ConfigError(f"{where}: {key} must be a list")
    wrong_type = typ is not list and not isinstance(value, typ)
    if wrong_type or (isinstance(value, bool) and typ is not bool):
        raise ConfigError(f"{where}: {key} must be {typ.__name__}, got {value!r}")
    return value


# A policy parameter is a scalar; an integer must fit the int64 the native policies and the
# simulator's records take (a larger one failed deep inside, without the key's name).
INT64 = (-(1 << 63), (1 << 63) - 1)
SHM_NAME_MAX = 16              # an shm endpoint name's bytes in a wire address


def _toml_kind(value) -> str:
    """What a TOML value is, in the file's words (its repr may be huge, or fail)."""
    for typ, word in ((bool, "a boolean"), (int, "an integer"), (float, "a float"),
                      (str, "a string"), (dict, "a table"), (list, "an array")):
        if isinstance(value, typ):
            return word
    return "a date or time"


def _policy_value(path, key, value):
    """Refuse a ``[policy]`` parameter no policy can take, naming it."""
    where = f"{path}: [policy] {key}"
    if isinstance(value, bool) or isinstance(value, str):
        return
    if isinstance(value, int):
        if not INT64[0] <= value <= INT64[1]:
            # (the value itself is not printed: an int of 5000 digits cannot be)
            raise ConfigError(f"{where} is out of range (integers within -2**63..2**63-1)")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where} = {value!r} must be a finite number")
        return
    raise ConfigError(f"{where} must be a number, true/false or a string, not "
                      f"{_toml_kind(value)}")


_HOST_NAME = re.compile(r"[A-Za-z0-9_.-]{1,253}")


def check_host_name(host: str) -> None:
    """Refuse a host name no server could resolve: control characters, a ':' outside an
    IPv6 address (``node1:2`` is a hostfile's slot count, not a host), or anything but
    ASCII letters, digits, '-', '.' and '_' (``h"1`` or a hostfile's ``node[01-09]`` were
    written, and every server then failed to resolve its own name). ``rack gen`` checks
    its hosts with it, and ``rack check`` the names that do not resolve where it runs.

    Raises
    ------
    ValueError
        One line naming the host.
    """
    if not host or any(ord(c) < 32 or ord(c) == 127 for c in host):
        raise ValueError(f"host {host!r} is empty or holds control characters")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"host {host!r}: a ':' is only allowed in an IPv6 address "
                             "(give slots with --per-host or a hostfile)") from None
    elif not _HOST_NAME.fullmatch(host):
        raise ValueError(f"host {host!r}: a host name is at most 253 ASCII letters, digits, "
                         "'-', '.' and '_'")


def _unresolved_name(transport: str, addr, err: ValueError):
    """``(host, port)`` of a udp address whose well-formed host name did not resolve here
    (``err`` is the address parser's refusal: its ``HostNotResolved``), or None for any other
    refusal. A malformed name is refused (ValueError): no node could resolve it."""
    from malcolm.net.transport import HostNotResolved, split_host_port
    if transport != "udp" or not isinstance(err, HostNotResolved):
        return None
    check_host_name(err.host)
    return err.host, split_host_port(addr, "udp")[1]


def server_address_key(transport: str, addr, resolve: bool = True) -> tuple:
    """The key that tells two server addresses of ``transport`` apart, ``addr`` checked as a
    server's: a rack file's ``[[server]]`` and ``loadgen --server`` refuse the same ones.
    With ``resolve=False`` a udp host name that does not resolve here is keyed by its name
    (``("?", name, port)``), as verbs' are: the rack may be another cluster's.

    Raises
    ------
    ValueError
        One line starting with the address: unreadable, or port 0.
    """
    from malcolm.net.transport import addr_bytes, split_host_port
    if transport == "verbs":
        # verbs names the RDMA interface, which may resolve only on its node
        host, port = split_host_port(addr, "verbs")
        key = (host.lower(), port)
    else:
        try:
            key = addr_bytes(transport, addr)
            port = key[1]
        except ValueError as e:
            name = None if resolve else _unresolved_name(transport, addr, e)
            if name is None:
                raise
            key = ("?", name[0].lower(), name[1])
            port = name[1]
    if transport != "shm" and port == 0:
        raise ValueError(f"address {addr!r} has port 0; a server needs a fixed port (peers "
                         "and clients send to it), 1..65535")
    return key


def check_server_addresses(transport: str, addrs) -> None:
    """Refuse server addresses given outside a rack file (``loadgen --server``) as its
    ``[[server]]`` tables are refused: port 0 (:func:`server_address_key`), or one address
    twice (also spelled two ways: ``127.0.0.1:7001`` and ``127.0.0.1:07001``).

    Raises
    ------
    ValueError
        One line starting with the address.
    """
    seen = {}
    for i, a in enumerate(addrs):
        j = seen.setdefault(server_address_key(transport, a), i)
        if j != i:
            also = f" (as {addrs[j]!r} before)" if addrs[j] != a else ""
            raise ValueError(f"address {a!r} used twice{also}")


def _server_address(cfg, where, i, s, resolve=True):
    """Server ``i``'s address (its ``[[server]]`` table ``s``) and the key that tells two
    addresses apart, or ConfigError."""
    if cfg.transport == "shm" and "address" not in s:
        addr = f"{cfg.name}-s{i}"
        if len(addr) > SHM_NAME_MAX:
            # cut to 16 characters, the default names of a long rack name collided
            raise ConfigError(f"{where}: its default shm endpoint name, [rack] name + "
                              f"'-s{i}', has {len(addr)} characters, over {SHM_NAME_MAX}: "
                              f"shorten the name to at most {SHM_NAME_MAX - len(f'-s{i}')} "
                              "or give the server an address")
    else:
        addr = s.get("address")
    if addr is None:
        raise ConfigError(f"{where}: needs an address (host:port)")
    if not isinstance(addr, str):
        raise ConfigError(f"{where}: address must be a string such as "
                          f"\"127.0.0.1:7001\", got {addr!r}")
    if "\0" in addr:
        raise ConfigError(f"{where}: address {addr!r} contains NUL")
    try:
        return addr, server_address_key(cfg.transport, addr, resolve)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def parse_rack(data: dict, path: str = "<rack>", resolve: bool = True) -> RackConfig:
    """Validate a rack description already loaded from TOML.

    With ``resolve=False`` a well-formed udp host name that does not resolve here is listed
    in the result's ``unresolved`` instead of refused (each server resolves its own name).
    """
    from malcolm.policy import registry
    rack = data.get("rack", {})
    if not isinstance(rack, dict):
        raise ConfigError(f"{path}: [rack] must be a table")
    unknown = set(data) - {"rack", "policy", "server"}
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {', '.join(sorted(unknown))} "
                          "(expected [rack], [policy], [[server]])")
    bad = set(rack) - set(RACK_KEYS)
    if bad:
        raise ConfigError(f"{path}: [rack] has unknown key(s) {', '.join(sorted(bad))}; "
                          f"known: {', '.join(RACK_KEYS)}")
    vals = {k: _typed(f"{path} [rack]", k, rack.get(k, d), t) if k in rack else d
            for k, (t, d) in RACK_KEYS.items()}
    if vals["transport"] not in ("udp", "shm", "verbs"):
        raise ConfigError(f"{path}: [rack] transport {vals['transport']!r} must be "
                          "udp, shm or verbs")
    if vals["clients"] is not None and vals["transport"] == "shm":
        raise ConfigError(f"{path}: [rack] clients (an allow-list of networks) does not apply "
                          "to the shm transport")
    if vals["poll"] not in ("busy", "adaptive"):
        raise ConfigError(f"{path}: [rack] poll {vals['poll']!r} must be busy or adaptive")
    for k in RACK_RANGES:
        why = range_error(k, vals[k])
        if why:
            raise ConfigError(f"{path}: [rack] {k} = {vals[k]!r} {why}")
    if vals["transport"] == "shm" and vals["shm_capacity"] & (vals["shm_capacity"] - 1):
        raise ConfigError(f"{path}: [rack] shm_capacity = {vals['shm_capacity']} must be a "
                          "power of two")
    if vals["clients"] is not None and not all(isinstance(c, str) for c in vals["clients"]):
        raise ConfigError(f"{path}: [rack] clients must be a list of networks as strings, "
                          "e.g. [\"127.0.0.0/8\"]")
    # isprintable(): the name is printed in banners and messages, where a newline, an escape
    # sequence or another control character (NUL included) would forge lines or recolour
    # the terminal; repr() keeps this message to one line
    if not vals["name"] or "/" in vals["name"] or not vals["name"].isprintable():
        raise ConfigError(f"{path}: [rack] name {vals['name']!r} must be non-empty and "
                          "printable, without '/' (no NUL, newline, escape or other control "
                          "character)")
    kf = vals["key_file"]
    if kf is not None and (not kf.strip() or "\0" in kf):
        # an empty key_file ("$UNSET" in a template) must not run the rack unauthenticated:
        # only a key_file left out does (docs/runtime.md, "Authentication")
        raise ConfigError(f"{path}: [rack] key_file {kf!r} "
                          f"{'holds NUL' if kf.strip() else 'is empty'}; name the rack key "
                          "(malcolm rack keygen PATH), or leave key_file out for an "
                          "unauthenticated rack")
    pol = data.get("policy", {"name": "random"})
    if not isinstance(pol, dict):
        hint = " (write [policy], not [[policy]])" if isinstance(pol, list) else ""
        raise ConfigError(f"{path}: [policy] must be a table (name = \"...\" and the "
                          f"policy's parameters), not {_toml_kind(pol)}{hint}")
    pol = dict(pol)
    if "name" not in pol:
        raise ConfigError(f"{path}: [policy] needs a name "
                          f"({', '.join(registry.SERVER_POLICIES)})")
    pname = pol.pop("name")
    seed = pol.pop("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 63:
        raise ConfigError(f"{path}: [policy] seed must be an integer in 0..2**63-1")
    for k, v in pol.items():
        _policy_value(path, k, v)
    try:
        info = registry.POLICIES.get(str(pname).lower())
        if info is None or info.kind != "server":
            raise ValueError(f"{pname!r} is not a server policy; choose from "
                             f"{', '.join(registry.SERVER_POLICIES)}")
        params = registry.check_params(pname, pol)
    except ValueError as e:
        raise ConfigError(f"{path}: [policy] {e}") from None
    servers = data.get("server", [])
    if not isinstance(servers, list):
        raise ConfigError(f"{path}: server must be [[server]] tables (an array of tables), "
                          f"not {_toml_kind(servers)}")
    if not servers:
        raise ConfigError(f"{path}: a rack needs at least one [[server]]")
    from malcolm.policy.base import MAX_SERVERS

    if len(servers) > MAX_SERVERS:
        raise ConfigError(f"{path}: at most {MAX_SERVERS} servers, got {len(servers)}")
    cfg = RackConfig(path=path, policy=str(pname).lower(), policy_params=params, seed=seed,
                     **{k: vals[k] for k in RACK_KEYS if k not in ("workers", "handler")})
    from malcolm.net.transport import TransportUnavailable  # noqa: F401 (import check)
    seen = set()
    for i, s in enumerate(servers):
        where = f"{path} [[server]] #{i}"
        if not isinstance(s, dict):
            raise ConfigError(f"{where}: must be a table")
        bad = set(s) - SERVER_KEYS
        if bad:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; "
                              f"known: {', '.join(sorted(SERVER_KEYS))}")
        tr = s.get("transport", cfg.transport)
        if tr != cfg.transport:
            raise ConfigError(f"{where}: transport {tr!r} differs from the rack's "
                              f"{cfg.transport!r}; all servers of a rack share one transport")
        addr, key = _server_address(cfg, where, i, s, resolve)
        if key in seen:
            raise ConfigError(f"{where}: address {addr!r} used twice")
        seen.add(key)
        if key[0] == "?" and key[1] not in cfg.unresolved:
            cfg.unresolved.append(key[1])
        workers = _typed(where, "workers", s.get("workers", vals["workers"]), int)
        if not 0 <= workers <= 1024:
            raise ConfigError(f"{where}: workers must be in 0..1024 (0: the gateway runs "
                              f"the tasks itself)")
        handler = _typed(where, "handler", s.get("handler", vals["handler"]), str)
        cpus = s.get("cpus")
        if cpus is not None and (not isinstance(cpus, list) or not cpus or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cpus)):
            raise ConfigError(f"{where}: cpus must be a non-empty list of CPU numbers")
        cfg.servers.append(ServerConfig(i, addr, workers, handler, cpus))
    return cfg


#: A rack file's size: 64 servers (MAX_SERVERS) take a few kB. 64 MiB was allowed, but
#: tomllib reads 14 MB of [[server]] tables in 4 s before the count is refused.
RACK_FILE_MAX = 1 << 20
#: The most '.' a rack file holds (its deepest key is two levels): tomllib's time grows with
#: the square of a dotted key's depth, so that ``a.a.a...= 1`` of 10 000 parts took 2 s to
#: refuse, of 100 000 (200 kB) minutes and all the memory. 64 IPv4 servers use 192.
RACK_FILE_DOTS = 4096


def load_rack(path: str, resolve: bool = True) -> RackConfig:
    """Read and validate a rack file (``resolve``: as :func:`parse_rack`).

    Raises
    ------
    ConfigError
        With the file, section and key at fault.
    """
    if not path:
        raise ConfigError("no rack file given (an empty path)")
    from malcolm._files import read_text
    try:
        text = read_text(path, RACK_FILE_MAX)
    except FileNotFoundError:
        raise ConfigError(f"rack file {path!r} not found") from None
    except OSError as e:                # no permission, an I/O error, a symlink loop
        raise ConfigError(f"rack file {path!r}: {e.strerror}") from None
    except ValueError as e:             # a FIFO, /dev/zero, too large, not UTF-8
        raise ConfigError(f"rack file {e}") from None
    # read_text drops a byte-order mark (Windows editors write one): it is not TOML, and
    # tomllib's error pointed at line 1, column 1, where nothing shows
    if text.count(".") > RACK_FILE_DOTS:
        raise ConfigError(f"{path}: not a rack file: {text.count('.')} '.' characters, over "
                          f"{RACK_FILE_DOTS} (a rack of 64 servers needs a few hundred)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except ValueError as e:             # an integer of over 4300 digits (int's str limit)
        raise ConfigError(f"{path}: not valid TOML: {str(e).split(';')[0]}") from None
    except RecursionError:              # a = [[[[... or {b = {b = ... a thousand deep
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deep") from None
    return parse_rack(data, path, resolve)


KEY_BYTES = 32
KEY_ENV = "MALCOLM_RACK_KEY_FILE"


def key_path(cfg: RackConfig | None) -> str | None:
    """The rack key's file: ``MALCOLM_RACK_KEY_FILE`` if set, else ``[rack] key_file``
    (relative to the rack file's directory), else None (an unauthenticated rack)."""
    env = os.environ.get(KEY_ENV)
    if env is not None:
        # set but empty ("$UNSET" in a job script) must not run the rack unauthenticated,
        # as an empty key_file does not (parse_rack)
        if not env.strip() or "\0" in env:
            raise ConfigError(f"{KEY_ENV} is set but {'holds NUL' if env.strip() else 'empty'}"
                              "; name the rack key, or unset it")
        return env
    if cfg is None or not cfg.key_file:
        return None
    return beside_rack(cfg.path, cfg.key_file)


def beside_rack(rack_path: str, name: str) -> str:
    """Where a file the rack file names lives: ``name`` itself if absolute, else in the rack
    file's folder (the rule for ``key_file``, which ``rack gen --key-file`` follows too)."""
    return os.path.join(os.path.dirname(os.path.abspath(rack_path)), name)


def read_key(path: str) -> bytes:
    """Read a rack key file: at least 32 bytes, readable by its owner only.

    Returns the 16-byte SipHash key derived from the file's content with BLAKE2b (so a key
    file of any length >= 32 bytes maps to one MAC key, and the raw bytes never travel).

    Raises
    ------
    ConfigError
        Missing, too short, or group/world-accessible.
    """
    import hashlib
    import stat
    if "\0" in path:                    # os.stat would raise ValueError
        raise ConfigError(f"rack key {path!r}: not a file name (holds NUL)")
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"rack key {path!r} is not a regular file")
        if st.st_mode & 0o077:
            raise ConfigError(f"rack key {path!r} is accessible to group or others (mode "
                              f"{stat.S_IMODE(st.st_mode):o}); run: chmod 600 {path!r}")
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except FileNotFoundError:
        raise ConfigError(f"rack key {path!r} not found (create one with: malcolm rack keygen "
                          f"{path!r})") from None
    except OSError as e:
        raise ConfigError(f"rack key {path!r}: {e.strerror}") from None
    if len(raw) < KEY_BYTES:
        raise ConfigError(f"rack key {path!r} holds {len(raw)} bytes; at least {KEY_BYTES} "
                          "random bytes are needed (malcolm rack keygen PATH)")
    return hashlib.blake2b(raw, digest_size=16, person=b"malcolm-rack-v2").digest()


def write_key(path: str) -> None:
    """Create a new rack key file of 32 random bytes, mode 0600; never overwrite one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path!r} exists; not overwriting a rack key") from None
    except OSError as e:
        raise ConfigError(f"cannot create {path!r}: {e.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(KEY_BYTES))


def rack_key(cfg: RackConfig | None) -> bytes | None:
    """The rack's 16-byte MAC key, or None when the rack has no key file."""
    p = key_path(cfg)
    return None if p is None else read_key(p)


def check_rack(cfg: RackConfig, servers=None) -> dict:
    """Every check ``malcolm serve`` makes before it binds its address, for ``servers``
    (indices; default all): the key file, the transport, each server's policy and handler,
    the client networks and the CPUs. ``rack check``, ``rack up`` and ``serve`` all call it,
    so a file that passes ``rack check`` on this host fails ``serve`` only for reasons of
    the moment (an address in use).

    Returns ``{"key": bytes or None}``.

    Raises
    ------
    ConfigError
    """
    import ipaddress

    from malcolm.net.transport import available_transports
    from malcolm.policy.registry import make_policy
    from malcolm.workers.handlers import Handler
    key = rack_key(cfg)
    ok, why = available_transports()
    if cfg.transport not in ok:
        raise ConfigError(f"{cfg.path}: transport {cfg.transport} cannot run here: "
                          f"{why.get(cfg.transport, 'unknown')}")
    if cfg.clients is not None:
        if len(cfg.clients) > 16:
            raise ConfigError(f"{cfg.path}: [rack] clients: at most 16 networks")
        for c in cfg.clients:
            try:
                ipaddress.ip_network(c, strict=False)
            except ValueError as e:
                raise ConfigError(f"{cfg.path}: [rack] clients: {e}") from None
    have = os.sched_getaffinity(0)
    handlers = {}
    ids = range(len(cfg.servers)) if servers is None else servers
    for k in ids:
        s = cfg.servers[k]
        where = f"{cfg.path} [[server]] #{k}"
        try:
            make_policy(cfg.policy, len(cfg.servers), k, cfg.seed, **cfg.policy_params)
        except (ValueError, TypeError, OverflowError) as e:
            raise ConfigError(f"{cfg.path}: [policy] {e}") from None
        if s.handler not in handlers:
            try:
                handlers[s.handler] = Handler(s.handler)
            except (ValueError, TypeError, OverflowError) as e:
                raise ConfigError(f"{where}: {e}") from None
        if s.cpus:
            bad = [c for c in s.cpus if c not in have]
            if bad:
                raise ConfigError(f"{where}: cpus {bad} are not available to this process "
                                  f"(allowed: {sorted(have)})")
    return {"key": key}


def default_server_id() -> int | None:
    """This process's rank from SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK, if any."""
    for var in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        v = os.environ.get(var)
        if v is not None and v.strip():
            try:
                return int(v)
            except ValueError:
                raise ConfigError(f"{var}={v!r} is not an integer rank") from None
    return None


def build_server(cfg: RackConfig, k: int, handler=None):
    """Open server ``k``'s transport and build its :class:`~malcolm.runtime.server.Server`."""
    from malcolm.net.transport import open_transport
    from malcolm.policy.registry import make_policy
    from malcolm.runtime.server import Server
    if not 0 <= k < len(cfg.servers):
        raise ConfigError(f"{cfg.path}: server id {k} out of range 0..{len(cfg.servers) - 1}")
    checked = check_rack(cfg, [k])
    s = cfg.servers[k]
    opts = {"capacity": cfg.shm_capacity} if cfg.transport == "shm" else {}
    policy = make_policy(cfg.policy, len(cfg.servers), k, cfg.seed, **cfg.policy_params)
    tr = open_transport(cfg.transport, s.address, key=checked["key"], **opts)
    if cfg.hop:
        from malcolm.net.delay import wrap
        tr = wrap(tr, seed=cfg.seed * 64 + k + 1, **cfg.hop)
    try:
        return Server(tr, cfg.addresses, k, policy, handler=handler or s.handler,
                      workers=s.workers, capacity=cfg.capacity, n_types=cfg.task_types,
                      window_us=cfg.window_us, window_tasks=cfg.window_tasks,
                      poll=cfg.poll, spin_us=cfg.spin_us,
                      task_timeout_ms=cfg.task_timeout_ms,
                      steal_timeout_us=cfg.steal_timeout_us,
                      max_service_ms=cfg.max_service_ms, clients=cfg.clients,
                      est_alpha=cfg.est_alpha, prior_service_us=cfg.prior_service_us,
                      grace_s=cfg.grace_s, peer_timeout_ms=cfg.peer_timeout_ms,
                      idle_window_us=cfg.idle_window_us,
                      cpus=s.cpus, key=checked["key"], max_wait_ms=cfg.max_wait_ms)
    except BaseException:
        tr.close()
        raise
