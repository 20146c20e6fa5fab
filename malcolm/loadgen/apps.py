"""Real application requests for the load generator: ``--app rocksdb1|rocksdb2|rocksdb:MIX``.

Instead of asking the servers to burn a service time, each task is a GET(n) on the RocksDB
dictionary that ``malcolm rocksdb load`` built and the ``rocksdb`` handler serves (thesis
§7.1): n key indices in the payload, n values in the answer. Every value is checked against
the dictionary's deterministic generator; a wrong value or length is counted, by request
type, and fails the run. Latency is reported per request type as well as overall.

* ``rocksdb1``: 90% GET(16), 10% GET(64); ``rocksdb2``: 50% GET(16), 50% GET(64) (the
  thesis's mixes; task types 0 and 1, as in the simulator's ``rocksdb1``/``rocksdb2``);
* ``rocksdb:W:N,W:N,...``: a custom mix of GET(N) with weights W, e.g. ``rocksdb:70:8,30:32``.

Keys are uniform over the dictionary, or Zipf(s) over key ranks (``--key-dist zipf:0.99``),
the ranks scattered over the key space. ``--bad-fraction`` makes that share of requests
malformed on purpose (GET(0), too many keys, a key out of range, a truncated payload); each
must be answered ``bad input``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from malcolm._units import ascii_number

NAMED = {"rocksdb1": ((90.0, 16), (10.0, 64)), "rocksdb2": ((50.0, 16), (50.0, 64))}
MAX_TYPES = 16
# Zipf keys are drawn from a CDF and a guide table over every key (12 bytes a key, shared by
# the client threads): 4294967295 keys asked numpy for 32 GiB. 16M keys take 200 MB.
ZIPF_KEYS_MAX = 1 << 24
_ZIPF_CACHE: dict = {}


class AppError(ValueError):
    """Bad ``--app`` input; the message says what and how to fix it."""


@dataclass(frozen=True)
class AppSpec:
    """A GET(n) request mix on a dictionary of ``n_keys`` values of ``value_size`` bytes."""

    name: str
    mix: tuple                   # ((weight, n), ...): task type i is mix[i]
    n_keys: int = 1_000_000
    value_size: int = 16
    zipf_s: float = 0.0          # 0: uniform keys
    bad_fraction: float = 0.0

    def describe(self) -> str:
        tot = sum(w for w, _ in self.mix)
        parts = " + ".join(f"{100 * w / tot:g}% GET({n})" for w, n in self.mix)
        keys = f"Zipf({self.zipf_s:g})" if self.zipf_s else "uniform"
        return (f"{self.name} = {parts} on {self.n_keys} keys x {self.value_size} B, "
                f"{keys} keys")

    def make(self, stream: int):
        """The native request builder and checker for one client thread."""
        from malcolm.loadgen._apps import KvApp
        zc = zg = None
        if self.zipf_s:
            zc, zg = zipf_tables(self.n_keys, self.zipf_s)
        return KvApp([n for _, n in self.mix], [w for w, _ in self.mix], self.n_keys,
                     self.value_size, stream, zc, zg, self.bad_fraction)

    def report(self, results) -> dict:
        """Merge the client threads' :meth:`KvApp.results` into the run report's ``app``."""
        from malcolm.loadgen import hist
        types = []
        for i, (_, n) in enumerate(self.mix):
            rs = [r["types"][i] for r in results]
            lat = hist.merge([r["lat"] for r in rs])
            types.append({
                "type": i, "get": n,
                **{k: int(sum(r[k] for r in rs)) for k in ("sent", "ok", "wrong", "not_ok")},
                "latency_us": {"n": int(lat["n"]), "mean": hist.mean(lat) / 1e3,
                               **{k: hist.percentile(lat, q) / 1e3 for k, q in
                                  (("p50", 50), ("p99", 99), ("p99.9", 99.9))}},
            })
        return {
            "app": self.describe(), "types": types,
            "checked": sum(t["ok"] + t["wrong"] for t in types),
            "wrong_values": sum(t["wrong"] for t in types),
            "bad_sent": sum(r["bad_sent"] for r in results),
            "bad_rejected": sum(r["bad_rejected"] for r in results),
            "bad_accepted": sum(r["bad_accepted"] for r in results),
        }


def check_zipf_keys(n_keys, s):
    """Raise AppError unless Zipf(s) keys over ``n_keys`` keys fit their tables."""
    if s and n_keys > ZIPF_KEYS_MAX:
        raise AppError(f"--key-dist zipf:{s:g} over {n_keys} keys: at most {ZIPF_KEYS_MAX} "
                       "keys (its tables take 12 bytes a key); use uniform keys or a smaller "
                       "dictionary")


def zipf_tables(n_keys: int, s: float):
    """The CDF of Zipf(s) over ranks 0..n_keys-1 and its guide table (shared, cached)."""
    check_zipf_keys(n_keys, s)
    key = (n_keys, s)
    if key not in _ZIPF_CACHE:
        _ZIPF_CACHE.clear()             # one table at a time: 12 MB for a million keys
        # in place and the guide in slices: the tables' 12 bytes a key at most, not 48
        cdf = np.arange(1, n_keys + 1, dtype=np.float64)
        np.power(cdf, -s, out=cdf)
        np.cumsum(cdf, out=cdf)
        cdf /= cdf[-1]
        cdf[-1] = 1.0
        guide = np.empty(n_keys, dtype=np.uint32)
        for i in range(0, n_keys, 1 << 20):
            u = np.arange(i, min(n_keys, i + (1 << 20)), dtype=np.float64) / n_keys
            guide[i:i + u.size] = np.minimum(np.searchsorted(cdf, u, side="right"), n_keys - 1)
        _ZIPF_CACHE[key] = (cdf, guide)
    return _ZIPF_CACHE[key]


def parse_key_dist(text) -> float:
    """``uniform`` -> 0; ``zipf:S`` -> S (0 < S <= 10)."""
    t = str(text or "uniform").strip().lower()
    if t == "uniform":
        return 0.0
    kind, sep, val = t.partition(":")
    if kind == "zipf" and sep:
        try:            # ASCII digits only, as every number of the CLI
            s = ascii_number(val)
        except ValueError:
            s = float("nan")
        if 0 < s <= 10:
            return s
    raise AppError(f"--key-dist {text!r} must be uniform or zipf:S with 0 < S <= 10 "
                   "(e.g. zipf:0.99)")


def parse_app(text, n_keys=None, value_size=None, key_dist="uniform",
              bad_fraction=0.0) -> AppSpec:
    """``rocksdb1``, ``rocksdb2`` or ``rocksdb:W:N,W:N,...`` -> :class:`AppSpec`."""
    t = str(text).strip().lower()
    if t in NAMED:
        mix = NAMED[t]
    elif t.startswith("rocksdb:"):
        mix = []
        for part in t[8:].split(","):
            w, sep, n = part.strip().partition(":")
            try:        # ASCII digits only: float() and int() read "９０:１６" too
                w, n = ascii_number(w), ascii_number(n, int)
            except ValueError:
                raise AppError(f"--app {text!r}: {part!r} must be WEIGHT:N, e.g. "
                               "rocksdb:90:16,10:64") from None
            if not (w > 0 and math.isfinite(w)) or n < 1:
                raise AppError(f"--app {text!r}: weights must be > 0 and N >= 1")
            mix.append((w, n))
        if not 1 <= len(mix) <= MAX_TYPES:
            raise AppError(f"--app {text!r}: 1..{MAX_TYPES} request types")
        mix = tuple(mix)
    else:
        raise AppError(f"unknown --app {text!r}; choose rocksdb1, rocksdb2 or "
                       "rocksdb:W:N,W:N,... (e.g. rocksdb:90:16,10:64)")
    n_keys = 1_000_000 if n_keys is None else int(n_keys)
    value_size = 16 if value_size is None else int(value_size)
    if not 1 <= n_keys <= 0xFFFFFFFF:
        raise AppError(f"--keys {n_keys} must be in 1..{0xFFFFFFFF}")
    if not 1 <= value_size <= 1024:
        raise AppError(f"--value-size {value_size} must be in 1..1024")
    most = min(64, 1024 // value_size)
    for _, n in mix:
        if n > most:
            raise AppError(f"--app {text!r}: GET({n}) with {value_size}-byte values does not "
                           f"fit in a 1024-byte answer; at most GET({most})")
    if not 0.0 <= bad_fraction <= 1.0:
        raise AppError("--bad-fraction must be in 0..1")
    zipf_s = parse_key_dist(key_dist)
    check_zipf_keys(n_keys, zipf_s)
    return AppSpec(t.split(":")[0] if t in NAMED else t, mix, n_keys, value_size, zipf_s,
                   float(bad_fraction))


def rack_config(rack_path):
    """The rack file's configuration for :func:`handler_note` and :func:`dictionary_shape`
    (read once for both), or None where it does not load."""
    from malcolm.runtime.config import ConfigError, load_rack
    try:
        return load_rack(rack_path)
    except ConfigError:
        return None


def handler_note(cfg, app):
    """A line for a run of ``app`` against a rack (``cfg``, :func:`rack_config`) none of
    whose servers runs the rocksdb handler (None otherwise): every answer was then a wrong
    value, with nothing to say why. Not an error: a server may have been started with
    ``serve --handler``."""
    kinds = sorted({s.handler.partition(":")[0] for s in cfg.servers})
    if "rocksdb" in kinds:
        return None
    return (f"note: --app {app} sends RocksDB GETs, and the rack file's servers run the "
            f"{', '.join(kinds)} handler: unless they were started with --handler rocksdb:..., "
            "every answer will be a wrong value")


def dictionary_shape(cfg):
    """``(n_keys, value_size)`` of the database the first ``rocksdb`` server of the rack
    ``cfg`` (:func:`rack_config`) names, when it can be opened from here; else ``None`` (the
    caller uses its defaults)."""
    for s in cfg.servers:
        kind, _, rest = s.handler.partition(":")
        if kind != "rocksdb":
            continue
        try:
            from malcolm.workers import rocksdb as rdb
            db = rdb.open_handler(rest)
        except (ImportError, ValueError):
            return None
        return db.n_keys, db.value_size
    return None


def lines(rep) -> list[str]:
    """Text lines for a run's ``app`` section: latency per type and the checks."""
    a = rep.get("app")
    if not a:
        return []
    out = []
    for t in a["types"]:
        lu = t["latency_us"]
        # no answer ok: no latency to give ("p50 nan µs")
        out.append(f"  GET({t['get']}): {t['ok']} ok"
                   + (f", p50 {lu['p50']:.1f} µs, p99 {lu['p99']:.1f} µs, mean "
                      f"{lu['mean']:.1f} µs" if t["ok"] else "")
                   + (f", {t['wrong']} WRONG" if t["wrong"] else "")
                   + (f", {t['not_ok']} not ok" if t["not_ok"] else ""))
    out.append(f"  values checked: {a['checked']}, wrong: {a['wrong_values']}"
               + (f"; malformed sent {a['bad_sent']}, answered bad input "
                  f"{a['bad_rejected']}" if a["bad_sent"] else ""))
    if a["wrong_values"] or a["bad_accepted"]:
        out.append(f"  WARNING: {a['wrong_values']} wrong value(s), {a['bad_accepted']} "
                   "malformed request(s) answered ok")
    return out
