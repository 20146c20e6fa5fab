"""Fault injection against a real rack (issue 13, item 7): ``malcolm serve`` processes on this
host, the native load generator, and injectors for the faults a rack must survive.

Used by ``tests/test_faults.py`` (short runs) and ``bench/faults.py`` (long runs, netem in a
network namespace). The invariant checked everywhere: every task the generator sent is
accounted for (completed, rejected with a reason, or reported timed out), none is answered
twice, and forged messages are counted by the servers, never acted upon.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import struct
import threading
import time

from malcolm._units import ascii_number
from malcolm.net import wire
from malcolm.net.ports import free_udp_ports
from malcolm.runtime.launcher import LocalRack


class FaultRack:
    """A rack of ``n`` servers, keyed unless ``keyed=False``: udp on loopback, or verbs on
    the RDMA device's address (``MALCOLM_RDMA_HOST``, default 10.77.0.1: the Soft-RoCE guest
    of ``scripts/rdma-vm``).

    Parameters
    ----------
    workdir : str
        Where the rack file, key, server output and statistics go.
    policy : str
        The rack's ``[policy]`` section body, e.g. ``'name = "jsq"'``.
    extra : str
        More ``[rack]`` lines.
    hop : dict, optional
        The network to emulate in every endpoint's transport (``malcolm.net.delay``):
        ``{"delay_us": 1000, "jitter_us": 500, "reorder": 0.25, "loss": 0.05}`` (any
        subset). Where the kernel has no netem this is how delay, reordering and loss are
        injected; the load generator's sends go through it too.
    window_us : float
        The policy window, fixed (``window_tasks = 0``): a fault's timing is stated in
        windows, which tasks shorter than ``window_us`` / 5 would otherwise shorten
        (``drv_window_ns``).
    interval : float
        Seconds between the servers' statistics snapshots (``serve --interval``).
    peer_timeout_ms : float or None
        ``[rack] peer_timeout_ms``; None leaves the rack's default (20 windows, >= 100 ms).
    ready_timeout_s : float
        How long :meth:`up` waits for the servers to say they are ready. Generous: under
        emulation (the Soft-RoCE guest, TCG) three servers importing the package over 9p on
        a loaded host take 30-40 s; only a broken start waits this long.
    transport : str
        ``"udp"`` or ``"verbs"`` (the servers and the load generator).
    """

    def __init__(self, workdir, n=3, policy='name = "jsq"', keyed=True, workers=1,
                 extra="", hop=None, window_us=1000.0, interval=1.0, peer_timeout_ms=100.0,
                 ready_timeout_s=120.0, transport="udp"):
        from malcolm.runtime.config import load_rack, read_key, write_key
        os.makedirs(workdir, exist_ok=True)
        self.dir = workdir
        self.key = None
        key_line = ""
        if keyed:
            kp = os.path.join(workdir, "rack.key")
            if not os.path.exists(kp):
                write_key(kp)
            self.key = read_key(kp)
            key_line = f'key_file = "{kp}"'
        if transport not in ("udp", "verbs"):
            raise ValueError(f"a fault rack runs over udp or verbs, not {transport!r}")
        self.transport = transport
        host = "127.0.0.1" if transport == "udp" else \
            os.environ.get("MALCOLM_RDMA_HOST", "10.77.0.1")
        self.ports = free_udp_ports(n, host)
        servers = "".join(f'[[server]]\naddress = "{host}:{p}"\n' for p in self.ports)
        hop_lines = "\n".join(f"hop_{k} = {float(v)!r}" for k, v in (hop or {}).items())
        self.path = os.path.join(workdir, "rack.toml")
        with open(self.path, "w") as f:
            f.write(f"""[rack]
name = "faults"
transport = "{transport}"
window_us = {float(window_us)!r}
window_tasks = 0.0
handler = "sleep"
workers = {workers}
grace_s = 1.0
{"" if peer_timeout_ms is None else f"peer_timeout_ms = {float(peer_timeout_ms)!r}"}
{key_line}
{hop_lines}
{extra}
[policy]
{policy}
{servers}""")
        self.addresses = [(host, p) for p in self.ports]
        self.ready_timeout_s = float(ready_timeout_s)
        cfg = load_rack(self.path)          # a bad file fails here, with its reason
        self.hop = cfg.hop
        # The rack file names its key: an outer MALCOLM_RACK_KEY_FILE must not override it.
        env = {k: v for k, v in os.environ.items() if k != "MALCOLM_RACK_KEY_FILE"}
        self.lr = LocalRack(self.path, ["--interval", str(interval)], logdir=workdir, env=env)

    def up(self, ids=None):
        """Start the servers (``ids``: only those; the others can join later)."""
        self.lr.up(timeout=self.ready_timeout_s, ids=ids)
        return self

    def down(self):
        return self.lr.down()

    def stats(self, k):
        """The server's latest statistics (its --stats-json, rewritten every second)."""
        return self.lr.stats(k)

    def stats_after(self, ids, t_ns, timeout_s=10.0):
        """Servers ``ids``' statistics, each a snapshot taken at or after ``t_ns``
        (``time.monotonic_ns()``, the clock of the snapshots' ``mono_ns``), waiting up to
        ``timeout_s`` for them; a server with none by then gives its latest (check its
        ``mono_ns``). A fixed sleep of one interval is not enough: with the cores busy a
        server's snapshot read 1.2 s after a load ended was taken up to 2.5 s before it
        ended, and showed a third of the tasks the server had handled."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = [self.stats(k) for k in ids]
            if all(s.get("mono_ns", 0) >= t_ns for s in st) or time.monotonic() > deadline:
                return st
            time.sleep(0.1)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()

    # ------------------------------------------------------------ load
    def load(self, rate, seconds, faults=(), workload="exp:200", timeout_s=1.0,
             servers=None, warmup_s=0.2, shares=None):
        """Run the load generator for ``seconds`` at ``rate`` while the ``faults`` run:
        each a ``(at_s, callable)`` started in its own thread ``at_s`` after the start.
        Returns the generator's report with ``faults``: what each injector returned."""
        from malcolm.loadgen.run import LoadSpec, Target, run_load
        target = Target(self.transport, list(servers or self.addresses), "--server",
                        key=self.key, hop=self.hop)
        spec = LoadSpec(target=target, workload=workload, duration_s=seconds,
                        warmup_s=warmup_s, timeout_s=timeout_s, shares=shares)
        results = {}
        threads = []
        t0 = time.monotonic()

        def run(i, at, fn):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            results[i] = fn()

        for i, (at, fn) in enumerate(faults):
            th = threading.Thread(target=run, args=(i, at, fn), daemon=True)
            th.start()
            threads.append(th)
        rep = run_load(spec, rate)
        for th in threads:
            th.join(30)
        rep["faults"] = [results.get(i) for i in range(len(faults))]
        rep.pop("_raw", None)
        return rep

    # ------------------------------------------------------------ injectors
    def kill(self, k, sig=signal.SIGKILL):
        def go():
            self.lr.kill(k, sig)
            return {"killed": k}
        return go

    def stop_cont(self, k, seconds):
        def go():
            p = self.lr.procs[k]
            p.send_signal(signal.SIGSTOP)
            time.sleep(seconds)
            p.send_signal(signal.SIGCONT)
            return {"stopped_s": seconds}
        return go

    def restart(self, k, down_s=0.3):
        """SIGKILL server k, and start it again (a new epoch) ``down_s`` later."""
        def go():
            self.lr.kill(k)
            time.sleep(down_s)
            self.lr.start(k, wait=True, timeout=self.ready_timeout_s)
            return {"restarted": k}
        return go

    def impostor(self, k, seconds, rate=2000.0, kill=True):
        """Bind dead server k's port (killing it first unless ``kill=False``): answer what
        arrives with forged responses, and send the others forged heartbeats (huge θ, NaN,
        seq jumps), steal requests and forwards, signed with no key. Returns what it
        received and sent. Over verbs: :meth:`verbs_impostor`."""
        if self.transport == "verbs":
            return self.verbs_impostor(k, seconds, rate, kill)

        def go():
            if kill:
                self.lr.kill(k)
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(self.addresses[k])
            sock.settimeout(0.001)
            got = {"tasks": 0, "forwards": 0, "steal_req": 0, "other": 0}
            sent = {"heartbeats": 0, "steal_req": 0, "forwards": 0, "responses": 0}
            peers = [a for j, a in enumerate(self.addresses) if j != k]
            t_end = time.monotonic() + seconds
            gap, nxt, i = 1.0 / rate, time.monotonic(), 0
            while time.monotonic() < t_end:
                try:
                    data, src = sock.recvfrom(4096)
                    kind = data[3] if len(data) > 3 else 0
                    if kind == wire.Kind.TASK and len(data) >= 64:
                        got["tasks"] += 1
                        cid, _, _, rid = struct.unpack_from("<IHHQ", data, 8)
                        sock.sendto(wire.encode_response(k, cid, rid, server=k), src)
                        sent["responses"] += 1
                    elif kind == wire.Kind.FORWARD:
                        got["forwards"] += 1
                    elif kind == wire.Kind.STEAL_REQ:
                        got["steal_req"] += 1
                    else:
                        got["other"] += 1
                except (TimeoutError, OSError):
                    pass
                # (bounded by t_end too: a sender slower than the rate never catches up)
                while nxt <= time.monotonic() < t_end:
                    nxt += gap
                    i += 1
                    what, msg = _forgery(k, i)
                    sent[what] += 1
                    try:
                        sock.sendto(msg, peers[i % len(peers)])
                    except OSError:
                        pass
            sock.close()
            return {"received": got, "sent": sent}
        return go

    def verbs_impostor(self, k, seconds, rate=2000.0, kill=True):
        """Over verbs: a queue pair of its own on dead server k's address, without the key
        (killing k first unless ``kill=False``), sending the others the forgeries of
        :meth:`impostor`. To reach a server it must first introduce itself; its unsigned
        address queries are dropped (``ctl_bad_mac``), so nothing it sends should arrive,
        and the survivors' keyed queries to k's address, which it receives, tell it nothing.
        Returns what it received and sent, and its transport's counters."""
        def go():
            from malcolm.net.transport import open_transport
            if kill:
                self.lr.kill(k)
            host, port = self.addresses[k]
            tr = open_transport("verbs", f"{host}:{port}")
            sent = {"heartbeats": 0, "steal_req": 0, "forwards": 0}
            got = 0
            peers = [a for j, a in enumerate(self.addresses) if j != k]
            t_end = time.monotonic() + seconds
            gap, nxt, i = 1.0 / rate, time.monotonic(), 0
            try:
                while time.monotonic() < t_end:
                    got += len(tr.recv(0.001))
                    while nxt <= time.monotonic() < t_end:
                        nxt += gap
                        i += 1
                        what, msg = _forgery(k, i)
                        sent[what] += 1
                        tr.send(peers[i % len(peers)], msg)
                st = tr.stats()
            finally:
                tr.close()
            return {"received": {"messages": got}, "sent": sent,
                    "transport": {c: st[c] for c in ("n_sent", "n_send_failed", "ctl_bad",
                                                     "ctl_answers", "resolve_failed")}}
        return go

    def spoofed_introductions(self, victim, claimed, seconds, rate=200.0):
        """Send server ``victim`` address queries "from" live server ``claimed``'s address
        (a raw socket: needs root) that put ``claimed`` at a queue pair of the injector's
        own, alternately unsigned and under another key: without the key they must change
        nothing (counted ``ctl_bad_mac``); keyless, the first one re-points the victim's
        traffic for ``claimed`` to the injector. Verbs only. Returns how many were sent and
        how many messages reached the injector's queue pair."""
        def go():
            from malcolm.net.transport import open_transport
            from malcolm.net.verbs import seal_control
            host = self.addresses[victim][0]
            tr = open_transport("verbs", f"{host}:0")
            ep = tr.endpoint
            me = ep.address
            intro = (b"MCV1" + bytes([1, 0]) + struct.pack("!HII", ep.lid, me.qpn, me.qkey)
                     + bytes(me.gid))
            wrong = seal_control(intro[:5] + b"\1" + intro[6:] + bytes(24), os.urandom(16),
                                 self.addresses[claimed], self.addresses[victim])
            n = got = 0
            t_end = time.monotonic() + seconds
            try:
                while time.monotonic() < t_end:
                    spoof_udp(self.addresses[claimed], self.addresses[victim],
                              intro if n % 2 == 0 else wrong)
                    n += 1
                    got += len(tr.recv(1.0 / rate))
                st = tr.stats()
            finally:
                tr.close()
            # what reached its queue pair: taken, or dropped as from a QP it does not know
            return {"sent": n, "received": got + st["unknown_src"]}
        return go


def _forgery(k, i):
    """The i-th forged message of an impostor posing as server k, without the key: a
    heartbeat with θ = 1e308 and seq 0x7FFFFFFF, one with a NaN load, a steal request, a
    forwarded task. Returns ``(what, message)``."""
    m = i % 4
    if m == 0:
        return "heartbeats", wire.encode_heartbeat(k, seq=0x7FFFFFFF, load=0.0,
                                                   theta=[1e308] * 16)
    if m == 1:
        b = bytearray(wire.encode_heartbeat(k, seq=i, theta=[0.0] * 16))
        struct.pack_into("<d", b, 64, math.nan)
        return "heartbeats", bytes(b)
    if m == 2:
        return "steal_req", wire.encode_steal_request(k, i)
    return "forwards", wire.encode_move(k, 1, i, (2, 0, 0, bytes(16)), service_ns=1000)


def spoof_udp(src, dst, payload):
    """Send a UDP datagram to ``dst`` as if from ``src`` (``(host, port)``, IPv4) through a
    raw socket: what any host on the network can do. Needs root (CAP_NET_RAW). No UDP
    checksum (optional over IPv4); the kernel fills in the IP header's."""
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     socket.inet_aton(src[0]), socket.inet_aton(dst[0]))
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as raw:
        raw.sendto(ip + udp, (dst[0], 0))


def impair(ns, spec):
    """Impair the loopback of network namespace ``ns``: ``spec`` is a netem qdisc ("loss 5%",
    "delay 1ms 500us reorder 75% 50%"). Where the kernel has no netem, random loss falls back
    to an nftables rule (``numgen random``) dropping that share of udp datagrams. Returns how
    it was done, or raises ``RuntimeError`` with the reason it cannot be."""
    import shutil
    import subprocess
    r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root",
                        "netem", *spec.split()], capture_output=True, text=True)
    if r.returncode == 0:
        return f"netem {spec}"
    parts = spec.split()
    if len(parts) != 2 or parts[0] != "loss" or not parts[1].endswith("%"):
        raise RuntimeError(f"netem is not available here ({r.stderr.strip()}); only loss "
                           "has a fallback")
    if shutil.which("nft") is None:
        raise RuntimeError(f"netem is not available here ({r.stderr.strip()}) and nft is "
                           "not installed (apt-get install nftables)")
    try:        # ASCII digits only, as every number of the CLI
        pct = ascii_number(parts[1][:-1])
    except ValueError:
        pct = math.nan
    if not 0 <= pct <= 100:             # NaN fails this too (round() refused it: a traceback)
        raise RuntimeError(f"loss {parts[1]!r} is not a percentage in 0..100%")
    rules = ["add table inet mcfault",
             "add chain inet mcfault in { type filter hook input priority 0; }",
             f"add rule inet mcfault in meta l4proto udp numgen random mod 10000 lt "
             f"{int(round(pct * 100))} counter drop"]
    for rule in rules:
        r = subprocess.run(["ip", "netns", "exec", ns, "nft", *rule.split()],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"nft: {r.stderr.strip()}")
    return f"nftables: drop {pct:g}% of udp datagrams at random"


def impairment(ns):
    """What :func:`impair` did so far in namespace ``ns``: ``{"packets": datagrams that went
    through netem (None under the nftables fallback, which counts only its drops),
    "dropped": datagrams dropped, "bad_checksum": udp datagrams the namespace's kernel
    dropped for a bad checksum (netem ``corrupt``)}``; None if neither is in place. netem's
    counters are the qdisc's (``tc -s qdisc``): with loss, every datagram it drops is one
    "drop"."""
    import json
    import subprocess
    r = subprocess.run(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev",
                        "lo"], capture_output=True, text=True)
    if r.returncode == 0:
        for q in json.loads(r.stdout or "[]"):
            if q.get("kind") == "netem":
                return {"packets": int(q.get("packets", 0)), "dropped": int(q.get("drops", 0)),
                        "bad_checksum": _udp_csum_errors(ns)}
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-j", "list", "table", "inet",
                        "mcfault"], capture_output=True, text=True)
    if r.returncode == 0:
        for item in json.loads(r.stdout).get("nftables", []):
            for expr in item.get("rule", {}).get("expr", []):
                if "counter" in expr:
                    return {"packets": None, "dropped": int(expr["counter"]["packets"])}
    return None


def _udp_csum_errors(ns):
    """Udp InCsumErrors of namespace ``ns`` (/proc/net/snmp there), None if unreadable."""
    import subprocess
    r = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"],
                       capture_output=True, text=True)
    rows = [ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("Udp:")]
    if r.returncode or len(rows) < 2 or "InCsumErrors" not in rows[0]:
        return None
    return int(rows[1][rows[0].index("InCsumErrors")])


def dilate_qdisc(spec, k):
    """A netem spec with its times (``1ms``, ``500us``, ``2s``) multiplied by ``k``: the
    network slowed down with the rest of a time-dilated run. Percentages stay."""
    out = []
    for tok in spec.split():
        for unit, scale in (("us", 1.0), ("ms", 1e3), ("s", 1e6)):
            num = tok[:-len(unit)]
            # isascii: isdigit() alone passed "²", which float() then refused (a traceback)
            if tok.endswith(unit) and num.isascii() and num.replace(".", "", 1).isdigit():
                tok = f"{float(num) * scale * k:.3f}".rstrip("0").rstrip(".") + "us"
                break
        out.append(tok)
    return " ".join(out)


def check(rep, allow_timeouts=0):
    """The invariant: every task accounted for, none twice, none forged into a completion."""
    problems = []
    if not rep["accounted"]:
        problems.append(f"{rep['unaccounted']} unaccounted")
    if rep["duplicates"]:
        problems.append(f"{rep['duplicates']} duplicate responses")
    if rep["timed_out"] > allow_timeouts:
        problems.append(f"{rep['timed_out']} timed out (allowed {allow_timeouts})")
    return problems


def summary(name, injected, rep, lost_expected=0):
    """One row of docs/reliability.md's table."""
    return {"fault": name, "injected": injected, "sent": rep["sent"],
            "completed": rep["completed"], "rejected": rep["rejected_total"],
            "timed_out": rep["timed_out"], "unaccounted": rep["unaccounted"],
            "duplicates": rep["duplicates"],
            "replayed_responses": rep.get("replayed_responses", 0),
            "forged_at_client": rep.get("forged", 0),
            "lost_expected": lost_expected}
