"""Policies by name: what ``--policy`` accepts on the command line.

Three kinds of policy:

``server``   a :class:`~malcolm.policy.base.Policy` that runs in every server's gateway
             (``make_policy`` builds one per server);
``client``   a :class:`~malcolm.policy.base.ClientPolicy` that runs in every client
             (``make_client_policy`` builds one per client);
``central``  an idealised centralized scheduler that only the simulator implements
             (``cfcfs``, ``racksched``); they are references, not deployable policies.

A policy spec is ``NAME`` or ``NAME:key=value,key=value``, e.g. ``jbt:threshold=4``. The
name is case-insensitive (``JBT`` is ``jbt``); the parameter keys are not.
"""

from __future__ import annotations

import difflib
import importlib
import math
import re
from dataclasses import dataclass, field

from malcolm._units import ascii_number


@dataclass(frozen=True)
class PolicyInfo:
    """Registry entry. ``params`` maps each accepted parameter to (type, default, help);
    ``params=None`` means the class validates its own keyword arguments."""

    name: str
    kind: str                       # "server" | "client" | "central"
    module: str | None
    cls: str | None
    help: str
    params: dict | None = field(default_factory=dict)
    # central policies: the simulator's engine mode that implements the reference
    # ("cfcfs": one rack-wide queue; "central_pod": power-of-d on true queue lengths)
    sim_mode: str | None = None
    # a server policy that learns per window: its parameter that takes the window, ns
    window_param: str | None = None


_COUNT_OWN = (bool, True, "count tasks this gateway sent since the last heartbeat")
#: An integer parameter fits a C int (the native policies' fields).
INT_PARAM_MAX = 2**31 - 1

POLICIES: dict[str, PolicyInfo] = {
    "random": PolicyInfo("random", "server", "malcolm.policy.baselines", "RandomPolicy",
                         "each new task to a uniformly random server", {}),
    "jsq": PolicyInfo("jsq", "server", "malcolm.policy.baselines", "JSQPolicy",
                      "join the shortest queue known from heartbeats",
                      {"count_own": _COUNT_OWN}),
    "jbt": PolicyInfo("jbt", "server", "malcolm.policy.baselines", "JBTPolicy",
                      "join a random server below a queue-length threshold",
                      {"threshold": (float, 8.0, "queue-length threshold (tasks)"),
                       "count_own": _COUNT_OWN}),
    "jiq": PolicyInfo("jiq", "server", "malcolm.policy.baselines", "JIQPolicy",
                      "join an idle server known from heartbeats",
                      {"slots": (float, 1.0, "a server is idle below this many tasks"),
                       "count_own": _COUNT_OWN}),
    "sed": PolicyInfo("sed", "server", "malcolm.policy.baselines", "SEDPolicy",
                      "shortest expected delay (queue + 1) / service rate",
                      {"count_own": _COUNT_OWN}),
    "steal": PolicyInfo("steal", "server", "malcolm.policy.baselines", "StealPolicy",
                        "accept all; steal from the longest known queue (reference)",
                        {"min_victim": (float, 2.0, "steal only from queues this long "
                                                    "(0: from a random peer)"),
                         "max_own": (float, 0.0, "steal only if own known queue <= this"),
                         "count_own": _COUNT_OWN}),
    "po2": PolicyInfo("po2", "client", "malcolm.policy.baselines", "PowerOfDClient",
                      "client-side power-of-d on loads piggybacked on responses",
                      {"d": (int, 0, "servers sampled per task (0: two, or one on a "
                                     "one-server rack)")}),
    "cfcfs": PolicyInfo("cfcfs", "central", None, None,
                        "ideal centralized FCFS: one rack-wide queue (simulator only)",
                        {"delay": (float, 0.0, "one-way scheduler<->server delay, µs")},
                        sim_mode="cfcfs"),
    "racksched": PolicyInfo("racksched", "central", None, None,
                            "ideal centralized power-of-d on true queue lengths, zero delay, "
                            "PS in servers (simulator only)",
                            {"d": (int, 0, "servers sampled per task (0: two, or one on a "
                                           "one-server rack)"),
                             "quantum": (float, 500.0, "PS quantum, µs (0: ideal PS)"),
                             "sched": (str, "ps", "intra-server scheduling: ps or fcfs")},
                            sim_mode="central_pod"),
    # ---------------------------------------------------------------------------------
    # Malcolm's actor-critic policy (malcolm/policy/actor_critic.pyx, another module).
    # Imported lazily, so this registry works whether or not that module is built yet;
    # its constructor, MalcolmPolicy(n, me, seed=0, **params), validates its parameters.
    # The default is the guarded difference actor-critic (docs/policy.md, "The default
    # policy"); `malcolm:learn=0` freezes it at its safe start, and the thesis's Algorithm 1 is
    # malcolm.policy.actor_critic.THESIS (advantage=td,actor=full,...).
    "malcolm": PolicyInfo("malcolm", "server", "malcolm.policy.actor_critic", "MalcolmPolicy",
                          "Malcolm: distributed actor-critic (difference advantage, capacity-"
                          "proportional safe start, overload mask; learn=0 freezes it)", None,
                          window_param="window_ns"),
    # ---------------------------------------------------------------------------------
}

SERVER_POLICIES = tuple(k for k, v in POLICIES.items() if v.kind == "server")
CLIENT_POLICIES = tuple(k for k, v in POLICIES.items() if v.kind == "client")
CENTRAL_POLICIES = tuple(k for k, v in POLICIES.items() if v.kind == "central")


def spec_name(spec: str) -> str:
    """The policy name of a spec ``NAME[:key=value,...]`` as every command reads it: stripped
    and in lower case (``JSQ`` is ``jsq``; parameter keys keep their case). A command that
    looks at the name before :func:`parse_policy` reads the spec takes it from here: the
    demo compared it as typed and refused ``--policy JSQ``, which ``sim`` ran."""
    return spec.partition(":")[0].strip().lower()


def _info(name: str) -> PolicyInfo:
    if not isinstance(name, str) or name.strip().lower() not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[name.strip().lower()]


class UnknownParameterError(TypeError, ValueError):
    """A policy parameter that the policy does not take: a TypeError, as for an unknown
    keyword argument of the class, and a ValueError, as for every other bad spec."""


#: Up to this many accepted parameters are listed in the message; more point to the list.
_LIST_INLINE = 8


def unknown_params_error(policy: str, unknown, known) -> UnknownParameterError:
    """The one-line error for the parameters ``unknown`` that ``policy`` does not take.

    Each is named with repr (a newline or an escape code in a user's key printed bare forged
    lines of the message), then the closest of ``known`` (:func:`difflib.get_close_matches`,
    ignoring case: keys are case-sensitive), then the accepted names when there are a few, or
    where to list them: malcolm's ~50 were printed in one line.
    """
    unknown, known = list(unknown), list(known)
    by_low = {k.lower(): k for k in known}
    close = dict.fromkeys(by_low[m] for u in unknown
                          for m in difflib.get_close_matches(str(u).lower(), by_low, n=1))
    s = "s" if len(unknown) > 1 else ""
    msg = f"unknown parameter{s} {', '.join(map(repr, unknown))} for {policy}"
    if close:
        msg += f"; did you mean {', '.join(map(repr, close))}?"
    if len(known) <= _LIST_INLINE:
        msg += f" (accepted: {', '.join(known) or 'none'})"
    else:
        msg += f" (`malcolm list policies {policy}` lists them)"
    return UnknownParameterError(msg)


def _convert(info: PolicyInfo, key: str, value):
    typ = info.params[key][0]
    if typ is bool:
        if isinstance(value, str):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"policy {info.name}: {key} must be true/false, got {value!r}")
        return bool(value)
    try:
        if isinstance(value, bool) and typ in (int, float):
            raise TypeError             # True is no number: it set a threshold of 1
        if isinstance(value, float) and typ is int and not value.is_integer():
            raise ValueError            # int(2.5) was 2, silently
        v = ascii_number(value, typ) if isinstance(value, str) else typ(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"policy {info.name}: {key}={value!r} is not a valid "
                         f"{typ.__name__}") from None
    # the native policies keep these in C ints and doubles: NaN, inf or 2^70 would be
    # read as something else there (a NaN threshold made `steal` a random policy)
    if typ is float and not math.isfinite(v):
        raise ValueError(f"policy {info.name}: {key} must be finite, got {value!r}")
    if typ is int and not -INT_PARAM_MAX <= v <= INT_PARAM_MAX:
        raise ValueError(f"policy {info.name}: {key} must be within +-{INT_PARAM_MAX}, "
                         f"got {value!r}")
    return v


def check_params(name: str, params: dict) -> dict:
    """Validate and convert parameters for policy ``name``; return them with defaults.

    Raises
    ------
    ValueError
        Unknown policy or parameter, or a value of the wrong type.
    """
    info = _info(name)
    if info.params is None:
        return dict(params)
    bad = [k for k in params if not isinstance(k, str)]
    if bad:
        raise ValueError(f"policy {info.name}: parameter names must be strings, got {bad[0]!r}")
    unknown = sorted(set(params) - set(info.params))
    if unknown:
        raise unknown_params_error(info.name, unknown, info.params)
    out = {k: spec[1] for k, spec in info.params.items()}
    for k, v in params.items():
        out[k] = _convert(info, k, v)
    return out


def _auto(value: str):
    for typ in (int, float):
        try:
            return ascii_number(value, typ)
        except ValueError:
            pass
    return value


def parse_policy(spec: str, *, defaults: bool = True) -> tuple[str, dict]:
    """Split ``"name:key=value,..."`` into ``(name, params)`` with converted values.

    Parameters
    ----------
    spec : str
        The policy spec, as ``--policy`` takes it.
    defaults : bool
        Fill in the defaults of the parameters ``spec`` leaves out (for a policy with a
        parameter list); False: only the ones it gives.

    Raises
    ------
    ValueError
        Unknown policy; a parameter that is not ``key=value``, is given twice, or that the
        policy does not take (for a policy that validates its own parameters: a key that is
        no identifier, or one the command sets, such as ``seed``); a value of the wrong type.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"policy must be a non-empty string, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    info = _info(name)
    raw = {}
    if rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key:
                raise ValueError(f"policy {spec!r}: parameter {item!r} must be key=value")
            if key in raw:
                # the last one won, silently: `learn=0,learn=1` ran a learning policy
                raise ValueError(f"policy {spec!r}: parameter {key!r} given twice")
            raw[key] = value.strip()
    if info.params is None:
        for key in raw:
            _check_free_key(spec, info, key)
        return info.name, {k: _auto(v) for k, v in raw.items()}
    params = check_params(info.name, raw)
    return info.name, params if defaults else {k: params[k] for k in raw}


# What make_policy and make_client_policy pass a policy's class themselves, and a rack
# file's [policy] holds beside the parameters: as a parameter, ``seed`` was "got multiple
# values for argument 'seed'" in sim and a second ``seed =`` line in the file rack gen
# wrote; ``name`` would name another policy there.
_RESERVED_KEYS = ("name", "seed", "n", "me", "stream")
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_free_key(spec: str, name: str, key: str) -> None:
    """:func:`_check_free_key` for policy ``name``'s parameter ``key``, given outside a spec
    (``simulate(policy_params=...)``); TypeError for a key that is not a string."""
    if not isinstance(key, str):
        raise TypeError(f"policy {spec!r}: parameter names are strings, got {key!r}")
    _check_free_key(spec, POLICIES[name], key)


def _check_free_key(spec: str, info: PolicyInfo, key: str) -> None:
    """Refuse a key that no keyword argument of a self-validating policy (``params=None``)
    can be: its class names its unknown parameters, but a key that is no identifier, or one
    the drivers set, broke the rack files written from it first."""
    if key == "name":
        raise ValueError(f"policy {spec!r}: 'name' is not a parameter of {info.name} "
                         "(the policy's name goes before the colon)")
    if key in _RESERVED_KEYS:
        raise ValueError(f"policy {spec!r}: {key!r} is not a parameter of {info.name} "
                         "(the command sets it)")
    if not _PARAM_NAME.fullmatch(key):
        raise ValueError(f"policy {spec!r}: {key!r} is not a parameter name (letters, "
                         "digits and _)")


def _load_class(info: PolicyInfo):
    try:
        mod = importlib.import_module(info.module)
    except ImportError as e:
        raise ValueError(f"policy {info.name!r} is not available: cannot import "
                         f"{info.module} ({e}); is the extension built?") from None
    try:
        return getattr(mod, info.cls)
    except AttributeError:
        raise ValueError(f"policy {info.name!r} is not available: {info.module} "
                         f"has no {info.cls}") from None


def _construct(info, cls, args, params):
    try:
        return cls(*args, **params)
    except UnknownParameterError:
        raise                           # it names the policy already
    except TypeError as e:
        # the class's message names the parameter; ``params`` also holds what the driver
        # adds (window_ns), which the user did not write
        raise ValueError(f"policy {info.name}: {e}") from None
    except OverflowError:
        # a class that checks its own parameters (params=None) gets them as typed: name
        # the one that does not fit its C field
        big = [k for k, v in params.items() if isinstance(v, int) and not isinstance(v, bool)
               and not -INT_PARAM_MAX <= v <= INT_PARAM_MAX]
        raise ValueError(f"policy {info.name}: {', '.join(big) or 'a parameter'} out of range "
                         f"(integers within +-{INT_PARAM_MAX})") from None


def make_policy(name: str, n: int, me: int, seed: int = 0, **params):
    """Build the server-side policy ``name`` for server ``me`` of an ``n``-server rack.

    Returns
    -------
    malcolm.policy.base.Policy
    """
    info = _info(name)
    if info.kind != "server":
        raise ValueError(f"policy {info.name!r} is a {info.kind} policy, not a server policy")
    return _construct(info, _load_class(info), (n, me, seed), check_params(info.name, params))


def make_client_policy(name: str, n: int, seed: int = 0, stream: int = 0, **params):
    """Build the client-side policy ``name`` for one client (``stream`` tells clients apart).

    ``random`` gives the uniform base :class:`~malcolm.policy.base.ClientPolicy`.
    """
    if isinstance(name, str) and name.strip().lower() == "random":
        if params:
            raise ValueError("client policy random takes no parameters")
        from malcolm.policy.base import ClientPolicy

        return ClientPolicy(n, seed, stream)
    info = _info(name)
    if info.kind != "client":
        raise ValueError(f"policy {info.name!r} is a {info.kind} policy, not a client policy")
    return _construct(info, _load_class(info), (n, seed, stream),
                      check_params(info.name, params))
