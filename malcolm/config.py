"""Rack description files (TOML) for the real runtime.

Example (``examples`` in ``docs/runtime.md`` has more)::

    [rack]
    name = "demo"            # names shm endpoints; default "rack"
    transport = "udp"        # udp | shm | verbs: one for the whole rack
    poll = "adaptive"        # busy | adaptive (spin, then block)
    window_us = 100          # policy window = heartbeat period
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

import os
from dataclasses import dataclass, field

try:
    import tomllib
except ModuleNotFoundError:     # Python 3.10: the same reader as a package (pyproject pins it)
    import tomli as tomllib

from malcolm.policy.defaults import EST_ALPHA, EST_PRIOR_SERVICE_US

RACK_KEYS = {
    "name": (str, "rack"), "transport": (str, "udp"), "poll": (str, "adaptive"),
    "window_us": (float, 100.0), "spin_us": (float, 50.0), "workers": (int, 2),
    "handler": (str, "spin"), "task_types": (int, 8), "capacity": (int, 4096),
    "task_timeout_ms": (float, 0.0), "steal_timeout_us": (float, 2000.0),
    "max_service_ms": (float, 10_000.0), "clients": (list, None), "grace_s": (float, 2.0),
    # the load estimator's defaults are the simulator's (malcolm/policy/driver.pxd)
    "est_alpha": (float, EST_ALPHA), "prior_service_us": (float, EST_PRIOR_SERVICE_US),
    "shm_capacity": (int, 1024),
    "peer_timeout_ms": (float, -1.0),
}
SERVER_KEYS = {"address", "workers", "handler", "transport", "cpus"}


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
    policy: str
    policy_params: dict
    seed: int
    servers: list[ServerConfig] = field(default_factory=list)

    @property
    def addresses(self):
        """Server addresses by index, in the transport's Python form."""
        return [s.address for s in self.servers]


def _typed(where, key, value, typ):
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if typ is list and value is not None and not isinstance(value, list):
        raise ConfigError(f"{where}: {key} must be a list")
    wrong_type = typ is not list and not isinstance(value, typ)
    if wrong_type or (isinstance(value, bool) and typ is not bool):
        raise ConfigError(f"{where}: {key} must be {typ.__name__}, got {value!r}")
    return value


def parse_rack(data: dict, path: str = "<rack>") -> RackConfig:
    """Validate a rack description already loaded from TOML."""
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
    for k in ("window_us", "task_types", "capacity", "shm_capacity"):
        if vals[k] <= 0:
            raise ConfigError(f"{path}: [rack] {k} must be positive")
    if vals["workers"] < 0:
        raise ConfigError(f"{path}: [rack] workers must be 0 (the gateway runs the tasks "
                          "itself) or more")
    pol = dict(data.get("policy", {"name": "random"}))
    if "name" not in pol:
        raise ConfigError(f"{path}: [policy] needs a name "
                          f"({', '.join(registry.SERVER_POLICIES)})")
    pname = pol.pop("name")
    seed = pol.pop("seed", 0)
    if not isinstance(seed, int):
        raise ConfigError(f"{path}: [policy] seed must be an integer")
    try:
        info = registry.POLICIES.get(str(pname).lower())
        if info is None or info.kind != "server":
            raise ValueError(f"{pname!r} is not a server policy; choose from "
                             f"{', '.join(registry.SERVER_POLICIES)}")
        params = registry.check_params(pname, pol)
    except ValueError as e:
        raise ConfigError(f"{path}: [policy] {e}") from None
    servers = data.get("server", [])
    if not isinstance(servers, list) or not servers:
        raise ConfigError(f"{path}: a rack needs at least one [[server]]")
    if len(servers) > 64:
        raise ConfigError(f"{path}: at most 64 servers, got {len(servers)}")
    cfg = RackConfig(path=path, policy=str(pname).lower(), policy_params=params, seed=seed,
                     **{k: vals[k] for k in RACK_KEYS if k not in ("workers", "handler")})
    from malcolm.net.transport import (
        TransportUnavailable,  # noqa: F401 (import check)
        addr_bytes,
    )
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
        default_addr = f"{cfg.name}-s{i}"[:16] if cfg.transport == "shm" else None
        addr = s.get("address", default_addr)
        if addr is None:
            raise ConfigError(f"{where}: needs an address (host:port)")
        if cfg.transport != "verbs":
            try:
                key = addr_bytes(cfg.transport, addr)
            except ValueError as e:
                raise ConfigError(f"{where}: {e}") from None
            if key in seen:
                raise ConfigError(f"{where}: address {addr!r} used twice")
            seen.add(key)
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


def load_rack(path: str) -> RackConfig:
    """Read and validate a rack file.

    Raises
    ------
    ConfigError
        With the file, section and key at fault.
    """
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"rack file {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    return parse_rack(data, path)


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
    """Open server ``k``'s transport and build its :class:`~malcolm.net.server.Server`."""
    from malcolm.net.server import Server
    from malcolm.net.transport import open_transport
    from malcolm.policy.registry import make_policy
    if not 0 <= k < len(cfg.servers):
        raise ConfigError(f"{cfg.path}: server id {k} out of range 0..{len(cfg.servers) - 1}")
    s = cfg.servers[k]
    opts = {"capacity": cfg.shm_capacity} if cfg.transport == "shm" else {}
    policy = make_policy(cfg.policy, len(cfg.servers), k, cfg.seed, **cfg.policy_params)
    tr = open_transport(cfg.transport, s.address, **opts)
    try:
        return Server(tr, cfg.addresses, k, policy, handler=handler or s.handler,
                      workers=s.workers, capacity=cfg.capacity, n_types=cfg.task_types,
                      window_us=cfg.window_us, poll=cfg.poll, spin_us=cfg.spin_us,
                      task_timeout_ms=cfg.task_timeout_ms,
                      steal_timeout_us=cfg.steal_timeout_us,
                      max_service_ms=cfg.max_service_ms, clients=cfg.clients,
                      est_alpha=cfg.est_alpha, prior_service_us=cfg.prior_service_us,
                      grace_s=cfg.grace_s, peer_timeout_ms=cfg.peer_timeout_ms,
                      cpus=s.cpus)
    except BaseException:
        tr.close()
        raise
