"""The ``rocksdb`` handler's words and files, without the native library: its spec
(``rocksdb:path=PATH[,...]``), the dictionary's metadata, and what a load checks before it
writes. ``malcolm.workers.rocksdb`` (the handler) and ``rack gen`` (which checks a spec on a
machine that may lack RocksDB) read them from here."""

from __future__ import annotations

import os
import re
import shutil


class RocksDBError(ValueError):
    """The database cannot be opened, built or read; the message says why and what to do."""


PAD_NAMES = ("warm", "cpu")
OPTIONS = "path, cache_mb, dilate, pad, calib, warm"

# the numeric options: (type, what a value must be, lowest, highest); NaN is refused
NUMBERS = {"cache_mb": (float, "a number", 0, 1 << 20),
           "dilate": (float, "a number", 1, 10_000),
           "calib": (int, "a whole number of GETs per size", 16, 100_000)}

# Bytes a key-value pair takes in an uncompressed table beyond its value, with a margin:
# the 4-byte key, the 8-byte sequence and type, and the block's entry and index overhead
# (a million 16-byte values make a 30 MB database, 30 B a pair)
PAIR_OVERHEAD = 20


def _number(key, val, kind, what, lo, hi):
    """Option ``key``'s text ``val`` as a ``kind`` in ``lo..hi``, or RocksDBError."""
    try:
        x = kind(val)
    except ValueError:
        raise RocksDBError(f"{key} must be {what}") from None
    if not lo <= x <= hi:
        raise RocksDBError(f"{key} must be in {lo}..{hi}")
    return x


def parse_spec(rest):
    """``path=PATH[,cache_mb=N][,dilate=K][,pad=warm|cpu][,calib=N][,warm=FILE]`` (a handler
    spec after ``rocksdb:``) -> dict."""
    out = {"cache_mb": 64.0, "dilate": 1.0, "pad": "warm", "calib": 500, "warm": None}
    if not rest:
        raise RocksDBError("needs a database: rocksdb:path=/path/to/db")
    for p in rest.split(","):           # (so a path cannot contain a comma)
        key, eq, val = p.partition("=")
        if not eq:
            raise RocksDBError(f"{p!r} must be key=value ({OPTIONS})")
        if key == "path":
            out["path"] = val
        elif key in NUMBERS:
            out[key] = _number(key, val, *NUMBERS[key])
        elif key == "pad":
            if val not in PAD_NAMES:
                raise RocksDBError(f"pad must be warm or cpu, not {val!r}")
            out["pad"] = val
        elif key == "warm":
            out["warm"] = val
        else:
            raise RocksDBError(f"unknown option {key!r} ({OPTIONS})")
    if not out.get("path"):
        raise RocksDBError("needs path=PATH")
    return out


def read_meta(raw: bytes):
    """Parse the dictionary's metadata value -> (n_keys, value_size)."""
    m = re.fullmatch(rb"malcolm-kv 1 keys=(\d+) value_size=(\d+)", raw)
    if not m:
        raise RocksDBError(f"unrecognised dictionary metadata {raw[:60]!r}")
    return int(m.group(1)), int(m.group(2))


def check_load_target(path, n_keys: int, value_size: int, overwrite: bool) -> None:
    """Refuse, before anything is written, a dictionary ``load`` could not build at ``path``:
    a file there (``--force``'s rmtree raised NotADirectoryError), one there without
    ``overwrite``, a folder that is not a database, or more than the file system has room
    for (the bulk load writes every pair once and its compaction once more: a 4.4 TB load
    started silently and wrote 15 GB a minute)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RocksDBError(f"{path!r} exists and is not a directory (a RocksDB database is "
                           "one); refusing to replace it")
    if os.path.exists(path) and not overwrite:
        raise RocksDBError(f"{path!r} exists; remove it or pass --force to rebuild it")
    if os.path.exists(path) and os.listdir(path) and not os.path.exists(
            os.path.join(path, "CURRENT")):
        raise RocksDBError(f"{path!r} exists and is not a RocksDB database; refusing to "
                           "write into it")
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(folder):        # the folders that load would make
        folder = os.path.dirname(folder)
    need = 2 * n_keys * (value_size + PAIR_OVERHEAD)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if need > free:
        raise RocksDBError(f"{n_keys} keys x {value_size} B need about {need / 1e9:.3g} GB "
                           f"while loading (the pairs, then their compaction), and "
                           f"{folder!r} has {free / 1e9:.3g} GB free")
