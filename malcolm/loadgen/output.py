"""The load generator's files beside its JSON: a CSV row per rate and an HdrHistogram log.

The native per-thread log-linear histograms (:mod:`malcolm.loadgen.hist`) stay the source of
every figure. :func:`to_hdr` re-records each of their buckets into an
``hdrh.histogram.HdrHistogram`` (3 significant digits) at the value the report would give for
it, so HdrHistogram tools (HistogramLogAnalyzer, ``hdr-plot``, the Java and C libraries) read
the same counts, and percentiles within the native buckets' width (1/128) plus HdrHistogram's
own (0.1%).
"""

from __future__ import annotations

import csv
import datetime
import io
import math
import time

from malcolm.loadgen import hist

CSV_COLUMNS = ("rate", "offered_per_s", "throughput_per_s", "p50_us", "p90_us", "p99_us",
               "p99.9_us", "max_us", "mean_us", "sent", "completed", "rejected", "timed_out",
               "migrated", "stolen", "late_send_fraction", "accounted", "arrivals",
               "payload_mean_bytes", "workload", "latency_source")

HDR_HIGHEST_NS = 1 << 44          # the native histogram's range (about 4.9 hours)
HDR_DIGITS = 3


def csv_text(reports) -> str:
    """One row per report, :data:`CSV_COLUMNS`; missing figures are empty cells."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in reports:
        lu = r["latency_us"]
        row = [r["rate"], r["offered_per_s"], r["throughput_per_s"], lu["p50"], lu["p90"],
               lu["p99"], lu["p99.9"], lu["max"], lu["mean"], r["sent"], r["completed"],
               r["rejected_total"], r["timed_out"], r["migrated"], r["stolen"],
               r["schedule"]["late_fraction"], int(bool(r["accounted"])),
               r.get("arrivals", "poisson"), r.get("payload", {}).get("mean_bytes", 0.0),
               r["workload"], lu["source"]]
        w.writerow(["" if isinstance(v, float) and not math.isfinite(v) else
                    (f"{v:.6g}" if isinstance(v, float) else v) for v in row])
    return buf.getvalue()


def _hdr_module():
    try:
        from hdrh.histogram import HdrHistogram
        from hdrh.log import HistogramLogWriter
    except ImportError:
        raise RuntimeError("--hdr needs the hdrhistogram package: pip install "
                           "'malcolm[hdr]' (or hdrhistogram)") from None
    return HdrHistogram, HistogramLogWriter


def to_hdr(h):
    """An ``HdrHistogram`` (ns) holding the native histogram ``h``'s counts.

    Each bucket's count is recorded at the bucket's midpoint (its exact value below 256 ns),
    clamped to the exact min and max, as :func:`malcolm.loadgen.hist.percentile` reports.
    """
    HdrHistogram, _ = _hdr_module()
    out = HdrHistogram(1, HDR_HIGHEST_NS, HDR_DIGITS)
    if not h["n"]:
        return out
    lo, hi = int(h["min"]), int(h["max"])
    for i in hist.nonzero(h):
        c = int(h["counts"][i])
        lower = hist.LOWER[i]
        mid = (lower + hist.UPPER[i] - 1) // 2 if i >= (1 << hist.SUB_BITS) else lower
        v = min(max(int(mid), lo), hi)
        out.record_value(max(1, min(v, HDR_HIGHEST_NS)), c)
    return out


def write_hdr(path: str, reports, start_s: float | None = None) -> None:
    """Write the latency histogram of every report (one interval each, in order) as an
    HdrHistogram log (``.hlog``, format 1.2): values in ns, interval start times absolute
    (seconds since the epoch), Interval_Max in ms."""
    _, HistogramLogWriter = _hdr_module()
    # whole milliseconds: a reader skips an interval that starts before StartTime by a hair
    t0 = math.floor((time.time() if start_s is None else start_s) * 1000) / 1000
    with open(path, "w") as f:
        w = HistogramLogWriter(f)
        w.output_comment("malcolm loadgen: latency from the intended send time, ns; one "
                         "interval per target rate")
        w.output_log_format_version()
        # written here: hdrh's output_start_time() reads its milliseconds as seconds
        utc = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc)
        f.write(f"#[StartTime: {t0:.3f} (seconds since epoch), {utc.isoformat(' ')}]\n")
        w.output_legend()
        t = 0.0
        for r in reports:
            h = r.get("_lat")
            if h is None:
                continue
            hh = to_hdr(h)
            d = float(r.get("duration_s") or 0.0)
            hh.set_start_time_stamp(int((t0 + t) * 1000))
            hh.set_end_time_stamp(int((t0 + t + d) * 1000))
            w.output_interval_histogram(hh)
            t += d
