"""Long runs must not degrade (issue 11, item 6): one policy's rack under a steady load for a
long stretch of rack time, reported per segment of rack time, with a trend verdict that can
fail.

Per segment (by the intended send time of its tasks) the load generator gives p50, p99 with
its 95% interval, tasks sent, dropped or refused, timed out, late sends, migrations and
steals (:func:`malcolm.loadgen.run.segments`); a sampler reads the servers' ``--stats-json``
files during the run and adds per server the mean and largest number of tasks held (queue
depth), the estimator's service rate against the nominal one, migrations out, the windows
the policy thread ran against the clock (timer drift), heartbeats dropped or skipped, the
measured mean service time (so the segment's effective load) and the resident memory.

**The verdict** (:func:`trend_verdict`), over every repeat of one policy:

* the first ``settle`` segments are the policy's settling time and are left out; so is any
  segment the runner would flag (the generator late for more than 1% of its sends, or an
  effective load more than 0.03 off the target: it measured the machine, not the policy);
* *early* = the next ``compare`` segments, *late* = the last ``compare`` (they must not
  overlap, or the verdict is ``undetermined``); each group's **level** is the median of its
  segments' p99s, pooled over the repeats;
* the **noise** is the segment-to-segment standard deviation of the p99, estimated from the
  successive differences of the settled segments within each repeat (median |difference| /
  0.954, the value for Gaussian noise: a slow trend or one outlier hardly moves it, where
  the spread of the early segments would include a trend that starts early), plus each
  early segment's own sampling uncertainty (the top of its p99's 95% interval above it);
* **band** = early level + the largest such uncertainty + 3 x noise; ``fail`` if the late
  level is above it, or if the late segments' median share of tasks lost (dropped, refused
  or timed out) is above the early share + 3 x that share's noise + 0.1% of the tasks; else
  ``pass``.

On synthetic flat series of 12 segments (noise +-15%, +-40%, log-normal sigma 0.3 and 0.5)
the rule failed 0.7-1.1% of them (8 segments, 2 compared: 1-2.4%); a p99 that doubles over
the run fails 87% of the time at +-15% noise, 20% at +-40% and 6-13% at log-normal noise:
there the noise, not the policy, is what the run can show. A rise to a plateau within the
settling and early segments (an overloaded rack filling its queues) fails too.
``ratio`` (late level over early level) is reported either way.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time

from malcolm.loadgen import method

# server statistics kept per sample (counters and gauges of Server.stats())
SAMPLE_KEYS = ("queue_len", "waiting", "load_us", "rate_per_us", "windows", "hb_dropped",
               "hb_skipped", "dropped_full", "overloaded", "migrated_out", "stolen_in",
               "completed", "steal_timeouts", "mono_ns")
LOSS_FLOOR = 0.001          # share of tasks the loss test tolerates above the early share


def _rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class StatsSampler:
    """Reads every server's ``--stats-json`` file (and its resident memory) every
    ``period`` seconds in a thread of its own, until :meth:`stop`; ``samples[j]`` is server
    j's list of snapshots (only new ones: by their ``mono_ns``)."""

    def __init__(self, paths, pids, period=0.25):
        self.paths, self.pids, self.period = list(paths), list(pids), period
        self.samples = [[] for _ in self.paths]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="longrun-sampler", daemon=True)

    def start(self):
        self._t.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.period):
            for j, path in enumerate(self.paths):
                try:
                    with open(path) as f:
                        d = json.load(f)
                except (OSError, ValueError):
                    continue
                if self.samples[j] and self.samples[j][-1]["mono_ns"] == d.get("mono_ns"):
                    continue
                s = {k: d.get(k, 0) for k in SAMPLE_KEYS}
                sv = d.get("service") or {}
                s["svc_count"], s["svc_mean_us"] = sv.get("count", 0), sv.get("mean_us", 0.0)
                s["rss_kb"] = _rss_kb(self.pids[j])
                if "probs_migrate" in d:
                    s["probs_migrate"] = d["probs_migrate"]
                self.samples[j].append(s)

    def stop(self):
        self._stop.set()
        self._t.join(5.0)
        return self.samples


def _at(samples, t):
    """The last sample taken at or before ``t`` (ns), else the first one; None if none."""
    best = None
    for s in samples:
        if s["mono_ns"] <= t:
            best = s
        else:
            break
    return best if best is not None else (samples[0] if samples else None)


def server_segments(segs, samples, *, window_ns, nominal_rate_per_us, workers):
    """Add each server's figures to the load generator's segments (in place; see the module
    docstring). ``segs`` carry ``t0_ns`` and, as real seconds, ``real_s``; ``samples`` come
    from :class:`StatsSampler`; ``nominal_rate_per_us[j]`` is server j's nominal service
    rate (tasks per real µs) and ``workers`` the rack's worker threads (for the segment's
    effective load)."""
    for sg in segs:
        t0, t1 = sg["t0_ns"], sg["t0_ns"] + int(sg["real_s"] * 1e9)
        per = []
        svc_n = svc_sum = 0.0
        for j, ss in enumerate(samples):
            inside = [s for s in ss if t0 <= s["mono_ns"] < t1]
            a, b = _at(ss, t0), _at(ss, t1)
            if not inside or a is None or b is None or b is a:
                per.append(None)
                continue
            dt = (b["mono_ns"] - a["mono_ns"]) or 1
            dn = b["svc_count"] - a["svc_count"]
            if dn > 0:
                svc_n += dn
                svc_sum += b["svc_count"] * b["svc_mean_us"] - a["svc_count"] * a["svc_mean_us"]
            rates = [s["rate_per_us"] for s in inside]
            per.append({
                "queue_mean": sum(s["queue_len"] for s in inside) / len(inside),
                "queue_max": max(s["queue_len"] for s in inside),
                "rate_ratio": (sum(rates) / len(rates)) / nominal_rate_per_us[j]
                if nominal_rate_per_us[j] > 0 else float("nan"),
                "migrated_out": b["migrated_out"] - a["migrated_out"],
                "stolen_in": b["stolen_in"] - a["stolen_in"],
                "dropped_full": b["dropped_full"] - a["dropped_full"],
                # windows run per window of clock time: 1.0 when the policy timer keeps pace
                "window_pace": (b["windows"] - a["windows"]) * window_ns / dt,
                "hb_lost": (b["hb_dropped"] + b["hb_skipped"]) - (a["hb_dropped"]
                                                                  + a["hb_skipped"]),
                "rss_kb": b["rss_kb"],
                "probs_migrate": b.get("probs_migrate")})
        sg["servers"] = per
        mean_us = svc_sum / svc_n if svc_n else float("nan")
        sg["service_mean_real_us"] = mean_us
        sg["effective_load"] = (method.effective_load(sg["sent"] / sg["real_s"], mean_us,
                                                      workers) if svc_n else float("nan"))
    return segs


def seg_flags(sg, target):
    """Why a segment must stay out of the verdict (the runner's own rules; [] if none)."""
    late = sg["late_sends"] / sg["sent"] if sg["sent"] else 1.0
    eff = sg.get("effective_load", float("nan"))
    out = method.flags(late, eff, target) if math.isfinite(eff) else \
        method.flags(late, target, target)
    if not sg["completed"]:
        out.append("nothing completed")
    return out


def loss_share(sg):
    """Tasks dropped, refused or timed out, as a share of those sent in the segment."""
    return (sg["rejected_total"] + sg["timed_out"]) / sg["sent"] if sg["sent"] else 0.0


def _median(xs):
    return method.median_ci(xs)[0]


def _noise(series):
    """Segment-to-segment standard deviation of ordered series: median |successive
    difference| / 0.954 (for Gaussian noise the median |difference| is 0.954 sigma), pooled
    over the series; 0 with fewer than two values in each."""
    d = [abs(xs[i + 1] - xs[i]) for xs in series for i in range(len(xs) - 1)]
    return _median(d) / 0.954 if d else 0.0


NOISE_K = 3.0           # the band: early level + uncertainty + NOISE_K x noise


def trend_verdict(series, settle=1, compare=3):
    """The trend verdict over one policy's repeats (module docstring).

    Parameters
    ----------
    series : list of list of dict
        Per repeat, its segments in order; each has ``p99_us``, ``p99_ci_us`` and
        ``sent``, ``rejected_total``, ``timed_out``, and ``flags`` (a list; non-empty keeps
        it out).
    settle : int
        Leading segments left out of every repeat.
    compare : int
        Segments in the early and in the late group, per repeat.

    Returns
    -------
    dict
        ``status`` (``pass``, ``fail``, ``undetermined``), ``why`` (one line), and the
        figures: ``early_p99_us``, ``noise_us``, ``band_us``, ``late_p99_us``, ``ratio``
        (late level over early level), ``early_loss``, ``loss_band``, ``late_loss``.
    """
    early, late, settled = [], [], []
    for segs in series:
        n = len(segs)
        if n - settle < 2 * compare:
            continue
        ok = {id(s) for s in segs if not s.get("flags") and math.isfinite(s["p99_us"])}
        early += [s for s in segs[settle:settle + compare] if id(s) in ok]
        late += [s for s in segs[n - compare:] if id(s) in ok]
        settled.append([s for s in segs[settle:] if id(s) in ok])
    nan = float("nan")
    out = {"status": "undetermined", "settle": settle, "compare": compare,
           "early_segments": len(early), "late_segments": len(late), "early_p99_us": nan,
           "noise_us": nan, "band_us": nan, "late_p99_us": nan, "ratio": nan,
           "early_loss": nan, "loss_band": nan, "late_loss": nan}
    if not early or not late:
        out["why"] = (f"too few clean segments to compare (need {settle} settling + "
                      f"{compare} early + {compare} late per repeat; clean early "
                      f"{len(early)}, late {len(late)})")
        return out
    level = _median([s["p99_us"] for s in early])
    unc = max((s["p99_ci_us"][1] - s["p99_us"]) if math.isfinite(s["p99_ci_us"][1]) else 0.0
              for s in early)
    noise = _noise([[s["p99_us"] for s in ss] for ss in settled])
    band = level + unc + NOISE_K * noise
    late_p99 = _median([s["p99_us"] for s in late])
    l_early = _median([loss_share(s) for s in early])
    loss_band = l_early + NOISE_K * _noise([[loss_share(s) for s in ss] for ss in settled]) \
        + LOSS_FLOOR
    late_loss = _median([loss_share(s) for s in late])
    out.update(early_p99_us=level, noise_us=noise, band_us=band, late_p99_us=late_p99,
               ratio=late_p99 / level, early_loss=l_early, loss_band=loss_band,
               late_loss=late_loss)
    why = []
    if late_p99 > band:
        why.append(f"p99 rose x{out['ratio']:.2f}: late {late_p99:.0f} µs > band {band:.0f} "
                   f"µs (early {level:.0f} + CI {unc:.0f} + 3 x noise {noise:.0f})")
    if late_loss > loss_band:
        why.append(f"losses rose: late {100 * late_loss:.2f}% > band {100 * loss_band:.2f}%")
    if why:
        out["status"], out["why"] = "fail", "; ".join(why)
    else:
        out["status"] = "pass"
        out["why"] = (f"late p99 {late_p99:.0f} µs (x{out['ratio']:.2f} the early {level:.0f})"
                      f" <= band {band:.0f} µs (noise {noise:.0f}); late loss "
                      f"{100 * late_loss:.2f}% <= {100 * loss_band:.2f}%")
    return out


# ---------------------------------------------------------------- the runner

class LongRun:
    """Run each policy's rack for ``rack_s`` seconds of rack time at ``load``, segment by
    segment, ``repeat`` times (policies one after another: a long run is one unbroken run);
    the racks, dilation and load generator are :class:`~malcolm.loadgen.experiment.
    Experiment`'s, so the figures mean what the demo's mean.

    Parameters
    ----------
    rack_s, segment_s, settle_s : float
        Rack time (seconds at rack scale, before dilation) of the run, of a segment, and of
        the settling time left out of the verdict.
    compare : int
        Segments in the verdict's early and late groups.
    **exp
        :class:`~malcolm.loadgen.experiment.Experiment`'s arguments (``workers``,
        ``workload``, ``policies``, ``window_us``, ``dilate``, ``warmup_s``, ``echo``,
        ``stop``, ``logdir``, ``hop_delay_us``).
    """

    def __init__(self, load=0.85, rack_s=12.0, segment_s=1.0, settle_s=1.0, compare=3,
                 repeat=1, **exp):
        from malcolm.loadgen.experiment import Experiment, ExperimentError
        if not (rack_s > 0 and 0 < segment_s <= rack_s and rack_s / segment_s <= 256 + 1e-9):
            raise ExperimentError(f"--segment {segment_s:g} s in --rack-time {rack_s:g} s: "
                                  "need 1..256 segments")
        if not 0 <= settle_s < rack_s:
            raise ExperimentError(f"--settle {settle_s:g} s must be in [0, {rack_s:g}) s")
        if compare < 1 or repeat < 1:
            raise ExperimentError("--compare and --repeat must be >= 1")
        self.load, self.rack_s, self.segment_s = load, rack_s, segment_s
        self.settle = int(math.ceil(settle_s / segment_s - 1e-9))
        self.compare, self.repeat = compare, repeat
        self.exp = Experiment(loads=[load], repeat=1, **exp)
        self.echo = self.exp.echo
        self.runs = []

    def run(self):
        """Run everything; return the result dict (``dilate``, ``policies`` with their
        verdicts, ``runs`` with their segments)."""
        exp = self.exp
        t_start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="malcolm-longrun-") as tmp:
            if exp.dilate_arg == "auto":
                self.echo("dilation: auto, calibrating at the load")
                exp.dilate = exp._calibrate(tmp)
                if exp.dilate is None:
                    return {"interrupted": True, "policies": [], "runs": []}
            else:
                exp.dilate = float(exp.dilate_arg)
            k = exp.dilate
            exp.layout = method.layout(exp.workers, exp.cpus, self.load * exp.capacity())
            self.echo(f"dilation K={k:g}: {self.rack_s:g} s of rack time run {self.rack_s * k:g}"
                      f" s per policy and repeat, in {self.segment_s:g} s segments "
                      f"({self.segment_s * k:g} s real); {exp.layout.reason}")
            for r in range(self.repeat):
                # one rate per repeat, fixed before its first policy runs: every policy gets
                # the same arrivals (common random numbers), whatever the machine did to
                # the handler in the run before
                rate = method.corrected_rate(self.load, exp.capacity(),
                                             exp.service_factor(self.load))
                for p in exp.policies:
                    if exp.stop.is_set():
                        break
                    self._one(r, p, rate, tmp)
        pols = []
        for p in exp.policies:
            rs = [x for x in self.runs if x["policy"] == p]
            v = trend_verdict([x["segments"] for x in rs], self.settle, self.compare)
            pols.append({"policy": p, "verdict": v})
        return {"dilate": exp.dilate, "workers": exp.workers, "workload": exp.workload,
                "window_us": exp.window_us, "load": self.load, "rack_s": self.rack_s,
                "segment_s": self.segment_s, "settle_segments": self.settle,
                "compare": self.compare, "repeat": self.repeat,
                "hop_delay_us": exp.hop_us(exp.dilate), "layout": exp.layout.reason,
                "elapsed_s": time.monotonic() - t_start, "policies": pols,
                "verdict": overall([x["verdict"] for x in pols]),
                "interrupted": exp.stop.is_set(), "runs": self.runs}

    def _one(self, r, p, rate, tmp):
        from malcolm.loadgen.experiment import PolicyRack
        from malcolm.loadgen.run import run_load
        exp, k = self.exp, self.exp.dilate
        rk = PolicyRack(exp, p, tmp, f"l{r}-{p.replace(':', '-').replace('=', '')}")
        try:
            rk.start()
            rk.wait_ready()
            spec = exp._spec(rk, k, exp.layout.client_threads, exp.layout.client_cpus,
                             self.rack_s * k, exp.warmup_s, seed=7 + 1000 * r)
            spec.segment_s = self.segment_s * k
            sampler = StatsSampler([rk.rack.stats_path(j) for j in rk.rack.ids],
                                   [rk.rack.procs[j].pid for j in rk.rack.ids],
                                   period=min(0.25, self.segment_s * k / 4)).start()
            try:
                rep = run_load(spec, rate, exp.stop)
            except RuntimeError as e:
                self.echo(f"  {p} repeat {r + 1}: FAILED: {e}")
                return
            finally:
                samples = sampler.stop()
            dead = rk.dead()
        finally:
            rk.down()
        if dead:
            self.echo(f"  {p} repeat {r + 1}: server(s) {dead} died (logs in {rk.logdir})")
        exp._note_service(rep, self.load)
        segs = rep["segments"]
        for sg in segs:
            sg["real_s"] = self.segment_s * k
        w = [max(1, x) for x in exp.workers]
        # nominal rate per server: workers / dilated mean service time (tasks per real µs)
        nominal = [x / (exp.wl.mean_us * k) for x in w]
        server_segments(segs, samples, window_ns=exp.window_us * 1e3 * k,
                        nominal_rate_per_us=nominal, workers=exp.total_workers)
        for sg in segs:
            # rack scale: latencies /K, segment bounds in rack seconds
            for key in ("p50_us", "p99_us", "max_us"):
                sg[key] /= k
            sg["p99_ci_us"] = [v / k for v in sg["p99_ci_us"]]
            sg["start_s"], sg["end_s"] = sg["index"] * self.segment_s, \
                (sg["index"] + 1) * self.segment_s
            sg["service_mean_us"] = sg.pop("service_mean_real_us") / k
            sg["flags"] = seg_flags(sg, self.load)
            del sg["t0_ns"]
        late = rep["schedule"]["late_fraction"]
        s = rep["service_us"]
        eff = method.effective_load(rep["offered_per_s"], s["measured_mean"], exp.total_workers)
        run = {"repeat": r, "policy": p, "rate_per_s": rate, "late_fraction": late,
               "effective_load": eff, "p99_us": rep["latency_us"]["p99"] / k,
               "completed": rep["completed"], "rejected": rep["rejected_total"],
               "timed_out": rep["timed_out"], "accounted": rep["accounted"],
               "dead_servers": dead, "flags": method.flags(late, eff, self.load,
                                                           rep["accounted"], rep["timed_out"]),
               "segments": segs}
        self.runs.append(run)
        self.echo(f"\n{p} (repeat {r + 1}): whole run p99 {run['p99_us']:.0f} µs, effective "
                  f"load {eff:.3f}, late {100 * late:.2f}%")
        self.echo(SEG_HEADER)
        for sg in segs:
            self.echo(format_segment(sg))


def overall(verdicts):
    """``fail`` if any policy failed, else ``undetermined`` if any was, else ``pass``."""
    st = [v["status"] for v in verdicts]
    return "fail" if "fail" in st else ("undetermined" if "undetermined" in st or not st
                                        else "pass")


def _f(v, w, d=0):
    return f"{v:{w}.{d}f}" if isinstance(v, (int, float)) and math.isfinite(v) else f"{'-':>{w}}"


SEG_HEADER = (f"{'rack s':>11}{'p50':>6} {'p99':>7} {'95% CI':>15} {'sent':>7} {'lost':>5} "
              f"{'late%':>6} {'eff':>5} {'migr':>5} {'steal':>5} {'rate/nom':>8} "
              f"{'pace':>5} {'MB':>5}  queue mean per server")


def format_segment(sg):
    """One line per segment (rack time, µs at rack scale)."""
    per = sg.get("servers") or []
    q = " ".join(_f(x["queue_mean"], 5, 1) if x else "    -" for x in per)
    ok = [x for x in per if x]
    rate = min((x["rate_ratio"] for x in ok), default=float("nan"))
    pace = min((x["window_pace"] for x in ok), default=float("nan"))
    rss = [x["rss_kb"] for x in ok if x["rss_kb"]]
    done = max(1, sg["completed"])
    ci = sg["p99_ci_us"]
    flag = "  FLAGGED: " + "; ".join(sg["flags"]) if sg.get("flags") else ""
    return (f"{sg['start_s']:5.2f}-{sg['end_s']:<5.2f}{_f(sg['p50_us'], 6)} "
            f"{_f(sg['p99_us'], 7)} [{_f(ci[0], 6)},{_f(ci[1], 6)}] {sg['sent']:7d} "
            f"{sg['rejected_total'] + sg['timed_out']:5d} "
            f"{100 * sg['late_sends'] / max(1, sg['sent']):6.2f} "
            f"{_f(sg.get('effective_load'), 5, 3)} {sg['migrated'] / done:5.2f} "
            f"{sg['stolen'] / done:5.2f} {_f(rate, 8, 2)} {_f(pace, 5, 2)} "
            f"{_f(max(rss) / 1024 if rss else None, 5)}  {q}{flag}")


def format_verdict(policy, v):
    return f"longrun {policy}: {v['status'].upper()}: {v['why']}"
