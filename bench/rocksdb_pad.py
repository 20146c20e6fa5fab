"""What a dilated ``rocksdb`` GET costs back to back and after an idle gap, per padding mode.

Under time dilation K a worker idles about K times a GET's length between GETs, and on a
machine that other processes share, the caches are cold when the next GET comes. This times
GET(n) through the handler, in this thread as a worker makes it, four ways: back to back,
and after a ``--gap`` sleep during which ``--trash`` KiB of another buffer are written (the
other processes' work), each with ``pad=cpu`` (K x the GET's own CPU time) and ``pad=warm``
(K x a draw from the server's warm back-to-back cost, calibrated at open). It prints the
GET's CPU time, the padded wall time / K, and the overruns (GETs past their target).

    python bench/rocksdb_pad.py --db /tmp/malcolm-kv-1m [--dilate 20] [--n 16,64]
        [--gets 300] [--gap 2000] [--trash 8192] [--json [FILE|-]]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from malcolm import _argparse as g  # noqa: E402


def measure(db, k, n, gets, gap_us, trash_kb, seed=1):
    """One row per (pad, gap): µs per GET (CPU, wall / K), overruns."""
    import numpy as np

    from malcolm.workers import rocksdb as rdb
    rows = []
    rng = np.random.default_rng(seed)
    for pad in ("cpu", "warm"):
        h = rdb.RocksDB(db, 64.0, k, pad)
        warm = h.warm_table()
        for g_us, t_kb in ((0.0, 0), (gap_us, trash_kb)):
            keys = np.ascontiguousarray(rng.integers(0, h.n_keys, (gets, n)), dtype=np.uint32)
            rdb.time_gets(h, keys[: gets // 4], gap_us=g_us, trash_kb=t_kb)    # settle
            before = h.dilate_stats()
            wall, cpu = rdb.time_gets(h, keys, gap_us=g_us, trash_kb=t_kb)
            after = h.dilate_stats()
            calls = after["calls"] - before["calls"]
            rows.append({
                "pad": pad, "n": n, "gap_us": g_us, "trash_kb": t_kb, "gets": calls,
                "cpu_mean_us": float(cpu.mean() / 1e3 / k) if pad == "cpu" else None,
                "get_cpu_us": (after["cpu_ns"] - before["cpu_ns"]) / calls / 1e3,
                "wall_over_k_us": float(wall.mean() / 1e3 / k),
                "wall_over_k_p99_us": float(np.quantile(wall, 0.99) / 1e3 / k),
                "target_over_k_us": (after["target_ns"] - before["target_ns"]) / calls / 1e3 / k,
                "overruns": after["overruns"] - before["overruns"],
                "warm_mean_us": float(warm[n].mean() / 1e3) if warm and n in warm else None})
    return rows


def main():
    ap = g.parser(__doc__, """
        python bench/rocksdb_pad.py --db /tmp/malcolm-kv-1m --dilate 50 --n 16""")
    ap.add_argument("--db", required=True, help="a dictionary built by malcolm rocksdb load")
    ap.add_argument("--dilate", type=float, default=20.0, metavar="K", help="default 20")
    ap.add_argument("--n", default="16,64", metavar="LIST", help="GET sizes (default 16,64)")
    ap.add_argument("--gets", type=int, default=300, metavar="N", help="per cell (default 300)")
    ap.add_argument("--gap", type=float, default=2000.0, metavar="US",
                    help="idle gap before each GET in the gap rows, µs (default 2000)")
    ap.add_argument("--trash", type=int, default=8192, metavar="KIB",
                    help="KiB written during each gap (default 8192)")
    g.add_json(ap, "the rows")
    a = ap.parse_args()
    g.json_stdout(a)
    try:
        sizes = [int(x) for x in a.n.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--n {a.n!r}: comma-separated whole numbers")
    if a.gets < 8 or not 1 <= a.dilate <= 10_000 or a.gap < 0 or a.trash < 0:
        ap.error("--gets >= 8, --dilate in 1..10000, --gap and --trash >= 0")
    from malcolm.workers import rocksdb as rdb
    rows = []
    try:
        for n in sizes:
            rows += measure(a.db, a.dilate, n, a.gets, a.gap, a.trash)
    except (rdb.RocksDBError, ValueError) as e:
        sys.exit(f"rocksdb_pad: {e}")
    print(f"K={a.dilate:g}, {a.gets} GETs per row; µs per GET; gap rows: {a.gap:g} µs idle "
          f"+ {a.trash} KiB written before each GET", file=sys.stderr)
    print(f"{'pad':<5} {'GET':>4} {'gap':>5} {'GET cpu':>8} {'wall/K':>8} {'p99/K':>8} "
          f"{'target/K':>8} {'warm':>7} {'overran':>7}", file=sys.stderr)
    for r in rows:
        w = r["warm_mean_us"]
        print(f"{r['pad']:<5} {r['n']:>4} {'yes' if r['gap_us'] else 'no':>5} "
              f"{r['get_cpu_us']:8.1f} {r['wall_over_k_us']:8.1f} {r['wall_over_k_p99_us']:8.1f} "
              f"{r['target_over_k_us']:8.1f} {w if w is None else round(w, 1)!s:>7} "
              f"{r['overruns']:>4}/{r['gets']}", file=sys.stderr)
    g.write_json(a, {"dilate": a.dilate, "rows": rows})


if __name__ == "__main__":
    main()
