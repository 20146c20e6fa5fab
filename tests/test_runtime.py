"""The server runtime: in-process servers for the details, multi-process racks (``malcolm
serve`` processes) over every local transport for the whole, and a rack across network
namespaces joined by veth when this runs as root."""

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from malcolm.net.transport import available_transports, open_transport
from malcolm.runtime.server import Server

from malcolm.net import wire
from malcolm.net.client import Client
from malcolm.net.ports import free_udp_ports
from malcolm.policy.registry import make_policy
from malcolm.runtime.config import ConfigError, load_rack, parse_rack
from malcolm.runtime.launcher import LocalRack

LOCAL = [k for k in available_transports()[0] if k in ("udp", "shm")]
ENV = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _addr(kind):
    return "127.0.0.1:0" if kind == "udp" else f"r{uuid.uuid4().hex[:10]}"


class InProcRack:
    """n servers in this process (threads), for tests that poke at one behaviour."""

    def __init__(self, kind, n, policy="random", params=None, **kw):
        self.kind = kind
        trs = [open_transport(kind, _addr(kind)) for _ in range(n)]
        self.addresses = [t.address for t in trs]
        self.servers = [Server(trs[i], self.addresses, i,
                               make_policy(policy, n, i, 7, **(params or {})), **kw).start()
                        for i in range(n)]

    def client(self, **kw):
        return Client(self.kind, self.addresses, **kw)

    def stop(self, **kw):
        return [s.stop(**kw) for s in self.servers]


@pytest.fixture
def inproc():
    racks = []

    def make(*a, **kw):
        racks.append(InProcRack(*a, **kw))
        return racks[-1]

    yield make
    for r in racks:
        r.stop(grace_s=1.0)


# ------------------------------------------------------------------ in-process details

def test_echo_and_python_handlers(inproc):
    r = inproc("udp", 1, handler="echo")
    with r.client() as c:
        c.send(0, payload=b"ping")
        acc = c.collect(5)
        assert acc.lost == 0
        assert next(iter(acc.answered.values()))["payload"] == b"ping"

    calls = []

    def py_handler(task_type, service_ns, payload):
        calls.append(task_type)
        if task_type == 3:
            raise RuntimeError("boom")
        return payload.upper()

    r = inproc("udp", 1, handler=py_handler)
    with r.client() as c:
        c.send(0, task_type=1, payload=b"abc")
        c.send(0, task_type=3, payload=b"abc")
        acc = c.collect(5)
    res = {v["task_type"]: v for v in acc.answered.values()}
    assert res[1]["payload"] == b"ABC" and res[1]["status"] == wire.Status.OK
    assert res[3]["status"] == wire.Status.HANDLER_ERROR
    assert sorted(calls) == [1, 3]


HANDLER_C = r"""
#include <stdint.h>
#include "malcolm_handler.h"
int add_one(void *ctx, malcolm_task *t) {
  for (uint32_t i = 0; i < t->payload_len && i < t->out_cap; i++) t->out[i] = t->payload[i] + 1;
  t->out_len = t->payload_len;
  return t->task_type == 7 ? 1 : 0;
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler")
def test_shared_library_and_cffi_handlers(tmp_path, inproc):
    inc = os.path.join(os.getcwd(), "malcolm", "workers")
    src = tmp_path / "h.c"
    src.write_text(HANDLER_C)
    so = tmp_path / "libh.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", f"-I{inc}", str(src), "-o", str(so)],
                   check=True)
    r = inproc("udp", 1, handler=f"so:{so}:add_one")
    with r.client() as c:
        c.send(0, payload=b"\x01\x02")
        c.send(0, task_type=7)
        acc = c.collect(5)
    res = {v["task_type"]: v for v in acc.answered.values()}
    assert res[0]["payload"] == b"\x02\x03"
    assert res[7]["status"] == wire.Status.HANDLER_ERROR

    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef("typedef struct malcolm_task malcolm_task; int add_one(void*, malcolm_task*);")
    ffi.set_source("_mc_test_handler", HANDLER_C, include_dirs=[inc])
    ffi.compile(tmpdir=str(tmp_path), verbose=False)
    sys.path.insert(0, str(tmp_path))
    try:
        r = inproc("udp", 1, handler="cffi:_mc_test_handler:add_one")
        with r.client() as c:
            c.send(0, payload=b"\x05")
            acc = c.collect(5)
        assert next(iter(acc.answered.values()))["payload"] == b"\x06"
    finally:
        sys.path.remove(str(tmp_path))


def test_bad_handler_specs_are_clear():
    from malcolm.workers.handlers import Handler
    for spec, msg in [("warp", "unknown handler"), ("so:/nonexistent.so:f", "no such file"),
                      ("python:os:nothing_here", "AttributeError"),
                      ("sleep:spin_us=x", "number")]:
        with pytest.raises(ValueError, match=msg):
            Handler(spec)


def test_bad_input_and_malformed_messages(inproc):
    r = inproc("udp", 1, handler="echo", n_types=4, max_service_ms=1.0)
    with r.client() as c:
        c.send(0, task_type=9)                        # no such type
        c.send(0, service_ns=5_000_000)               # over max_service_ms
        c.send(0, task_type=1)                        # fine
        acc = c.collect(5)
        assert sorted(v["status"] for v in acc.answered.values()) == [
            wire.Status.OK, wire.Status.BAD_INPUT, wire.Status.BAD_INPUT]
        good = wire.encode_task(1, 99)
        c.tr.send(r.addresses[0], good[:-3])          # truncated: dropped, no answer
        c.tr.send(r.addresses[0], b"\x00" * 40)       # garbage
        time.sleep(0.3)
        assert c.tr.recv(0.2) == []
    s = r.servers[0].stats()
    assert s["bad_input"] == 2
    assert s["malformed_by_reason"] == {"bad magic": 1, "length does not match": 1}
    assert s["last_bad"] is not None and s["last_bad"][0] in ("bad magic",
                                                               "length does not match")


def test_queue_full_timeout_and_stop_are_answered_with_reasons(inproc):
    # One worker, two slots, 80 ms tasks: a burst overflows, waits time out, and stopping
    # answers what is still waiting.
    r = inproc("udp", 1, handler="sleep", workers=1, capacity=2, task_timeout_ms=40)
    with r.client() as c:
        for _ in range(6):
            c.send(0, service_ns=80_000_000)
        acc = c.collect(5)
    st = acc.by_status()
    assert acc.lost == 0 and acc.duplicates == 0
    assert st["dropped"] == 4 and st["ok"] == 1 and st["timed_out"] == 1, st

    r = inproc("udp", 1, handler="sleep", workers=1, capacity=64)
    with r.client() as c:
        for _ in range(10):
            c.send(0, service_ns=200_000_000)
        time.sleep(0.3)
        rep = r.servers[0].stop(grace_s=2.0)
        acc = c.collect(3)
    st = acc.by_status()
    assert acc.lost == 0 and st["stopped"] >= 7 and st["ok"] >= 1, st
    assert rep["unfinished"] == 0 and rep["stuck_threads"] == []
    assert rep["stopped"] == st["stopped"]


def test_estimator_sees_real_service_times(inproc):
    r = inproc("udp", 1, handler="spin", workers=1, est_alpha=0.2)
    with r.client() as c:
        acc = c.run(60, service_ns=200_000, rate=2000)
    assert acc.lost == 0
    by_id = [acc.answered[k]["service_ns"] for k in sorted(acc.answered)]
    assert min(by_id) >= 200_000                      # measured on the worker, never shorter
    assert sorted(by_id)[len(by_id) // 2] < 1_000_000
    # The estimator is an EWMA (alpha 0.2) of exactly these measurements (of the service
    # time, or of its inverse: _core offers both), whatever the load here did to them.
    mean, inv = float(by_id[0]), 1.0 / by_id[0]
    for x in by_id[1:]:
        mean += 0.2 * (x - mean)
        inv += 0.2 * (1.0 / x - inv)
    rate = r.servers[0].stats()["rate_per_us"] / 1e3     # tasks per ns
    assert any(abs(rate / want - 1) < 0.05 for want in (1 / mean, inv)), (rate, 1 / mean, inv)
    assert rate < 1 / 180_000                            # not the 50 µs prior any more


def _policy_with_theta():
    try:
        make_policy("malcolm", 2, 0, 1)
        return "malcolm"
    except ValueError:
        return "jsq"


def test_heartbeats_carry_theta_and_reach_the_policy():
    name = _policy_with_theta()
    expected_theta = len(make_policy(name, 2, 0, 1).py_heartbeat()["theta"])
    peer = open_transport("udp", "127.0.0.1:0")
    stranger = open_transport("udp", "127.0.0.1:0")
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address, peer.address], 0, make_policy(name, 2, 0, 1),
                 handler="echo", window_us=2000).start()
    try:
        hbs = []
        t_end = time.monotonic() + 5
        while len(hbs) < 5 and time.monotonic() < t_end:
            for data, src in peer.recv(0.1):
                d = wire.decode(data)
                assert d["kind"] == "heartbeat" and src == tr.address
                hbs.append(d)
        assert len(hbs) >= 5
        assert all(h["src"] == 0 for h in hbs)
        assert [h["seq"] for h in hbs] == sorted(h["seq"] for h in hbs)
        assert all(len(h["theta"]) == expected_theta for h in hbs)
        before = srv.stats()["hb_observed"]
        theta = [0.25] * expected_theta
        for i in range(3):
            peer.send(tr.address, wire.encode_heartbeat(1, seq=i + 1, load=1000.0,
                                                        queue_len=2.0, rate=1e-4, theta=theta))
        stranger.send(tr.address, wire.encode_heartbeat(1, seq=9, theta=theta))   # spoofed
        peer.send(tr.address, wire.encode_heartbeat(5, seq=9))                    # no such src
        time.sleep(0.3)
        s = srv.stats()
        assert s["hb_observed"] - before == 3
        assert s["malformed_by_reason"] == {"sender address outside the rack": 1,
                                            "bad sender index": 1}
    finally:
        rep = srv.stop()
        peer.close()
        stranger.close()
    assert rep["windows"] > 0 and rep["hb_sent"] >= 5 and rep["stuck_threads"] == []


@pytest.mark.parametrize("poll", ["adaptive", "busy"])
def test_heartbeats_wake_the_policy_thread_before_its_window_ends(poll):
    # eq. 6.1 applies each load as it arrives: with a 0.5 s window, the policy thread (which
    # never spins) must observe a heartbeat long before the window ends, in both poll modes
    # (adaptive mode used to wait for the window end).
    peer = open_transport("udp", "127.0.0.1:0")
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address, peer.address], 0, make_policy("jsq", 2, 0, 1),
                 handler="echo", window_us=500_000, poll=poll, workers=0).start()
    try:
        time.sleep(0.05)
        t0 = time.monotonic()
        peer.send(tr.address, wire.encode_heartbeat(1, seq=1, load=1000.0, queue_len=2.0,
                                                    rate=1e-4))
        while srv.stats()["hb_observed"] == 0 and time.monotonic() - t0 < 2.0:
            time.sleep(0.002)
        waited = time.monotonic() - t0
        s = srv.stats()
        assert s["hb_observed"] == 1
        assert s["windows"] == 0 and waited < 0.3, (waited, s["windows"])
    finally:
        srv.stop()
        peer.close()


@pytest.mark.parametrize("kind", LOCAL)
def test_inline_server_without_workers_answers_everything(inproc, kind):
    r = inproc(kind, 2, handler="spin", workers=0)
    with r.client() as c:
        acc = c.run(300, service_ns=20_000, rate=5000)
    assert acc.lost == 0 and len(acc.answered) == 300
    assert all(v["status"] == wire.Status.OK for v in acc.answered.values())
    assert all(v["service_ns"] >= 20_000 for v in acc.answered.values())
    st = [s.stats() for s in r.servers]
    assert sum(x["completed"] for x in st) == 300
    # The gateway charged itself for the passes that did this work, and not for idling.
    for x in st:
        assert 0 < x["gateway_busy_ns"] < x["uptime_s"] * 1e9


def test_busy_server_warns_when_spinners_outnumber_cpus(caplog):
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address], 0, make_policy("random", 1, 0, 1), handler="echo",
                 workers=2, poll="busy", cpus=[sorted(os.sched_getaffinity(0))[0]])
    with caplog.at_level("WARNING", logger="malcolm.server"):
        srv.start()
        srv.stop()
    assert any("spins 3 threads" in r.getMessage() and "on 1 CPUs" in r.getMessage()
               for r in caplog.records)


def test_a_stopped_server_refuses_to_start_again_and_stays_stopped():
    """start() after stop() failed inside (its transport is closed) after logging as a
    start, and left the server marked running; now it is refused at once, and nothing
    changes."""
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address], 0, make_policy("random", 1, 0, 1), handler="echo")
    assert not srv.stopped
    srv.start()
    srv.stop()
    with pytest.raises(RuntimeError, match="cannot be started again"):
        srv.start()
    assert srv.stopped and not srv.running
    assert srv.stop()["stuck_threads"] == []        # a second stop is harmless


def test_a_server_stopped_before_it_started_closes_its_transport():
    # the server owns its transport from construction on: stop() without start() left the
    # socket open for as long as the caller held the transport
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address], 0, make_policy("random", 1, 0, 1), handler="echo")
    assert srv.stop()["stuck_threads"] == []
    assert tr.closed and srv.stopped and not srv.running
    with pytest.raises(RuntimeError, match="cannot be started again"):
        srv.start()


def test_client_networks_outside_the_allowlist_are_dropped():
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address], 0, make_policy("random", 1, 0), handler="echo",
                 clients=["127.0.0.1/32"]).start()
    try:
        with Client("udp", [tr.address], address="127.0.0.2:0") as out, \
                Client("udp", [tr.address]) as ok:
            out.send(0)
            ok.send(0)
            assert ok.collect(3).lost == 0
            assert out.collect(0.5).lost == 1
        assert srv.stats()["malformed_by_reason"] == {"sender address outside the rack": 1}
    finally:
        srv.stop()


# ------------------------------------------------------------------ configuration

def test_rack_files_are_validated(tmp_path):
    def bad(text, match):
        p = tmp_path / "r.toml"
        p.write_text(textwrap.dedent(text))
        with pytest.raises(ConfigError, match=match):
            load_rack(str(p))

    bad("[rack]\ntransport='tcp'\n[[server]]\naddress='127.0.0.1:1'\n", "udp, shm or verbs")
    bad("[rack]\n[[server]]\naddress='127.0.0.1:1'\ntransport='shm'\n", "share one transport")
    bad("[rack]\nfoo=1\n[[server]]\naddress='127.0.0.1:1'\n", "unknown key")
    bad("[policy]\nname='nope'\n[[server]]\naddress='127.0.0.1:1'\n", "not a server policy")
    bad("[policy]\nname='po2'\n[[server]]\naddress='127.0.0.1:1'\n", "not a server policy")
    bad("[policy]\nname='jbt'\nthreshhold=3\n[[server]]\naddress='127.0.0.1:1'\n",
        "unknown parameter 'threshhold' for jbt; did you mean 'threshold'?")
    bad("[[server]]\naddress='127.0.0.1:1'\n[[server]]\naddress='127.0.0.1:1'\n", "twice")
    bad("[[server]]\naddress='127.0.0.1'\n", "host:port")
    bad("[rack]\n", "at least one")
    bad("[rack]\ntransport='shm'\nclients=['127.0.0.1/8']\n[[server]]\n", "does not apply")
    bad("[[server]]\naddress='127.0.0.1:1'\ncpus=[]\n", "cpus")
    bad("[rack\n", "not valid TOML")
    cfg = parse_rack({"rack": {"transport": "shm", "name": "x"}, "policy": {"name": "jbt",
                      "threshold": 3}, "server": [{}, {"workers": 3, "handler": "echo"}]})
    assert cfg.addresses == ["x-s0", "x-s1"] and cfg.servers[1].workers == 3
    assert cfg.policy_params["threshold"] == 3.0
    # a byte-order mark (Windows editors write one) is read past: tomllib refused it, at
    # line 1 column 1, where nothing shows
    p = tmp_path / "bom.toml"
    p.write_bytes(b"\xef\xbb\xbf[[server]]\naddress='127.0.0.1:1'\n")
    assert load_rack(str(p)).addresses == ["127.0.0.1:1"]


def test_serve_needs_an_id(tmp_path, monkeypatch):
    p = tmp_path / "r.toml"
    p.write_text("[[server]]\naddress='127.0.0.1:1'\n")
    env = {k: v for k, v in ENV.items()
           if k not in ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")}
    out = subprocess.run([sys.executable, "-m", "malcolm", "serve", "--rack", str(p)],
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode != 0 and "SLURM_PROCID" in out.stderr
    from malcolm.runtime.config import default_server_id
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    assert default_server_id() == 3


# ------------------------------------------------------------------ multi-process racks

def _rack_file(tmp_path, kind, policy, n=3, extra="", window_us=1000, workers=2):
    name = f"m{uuid.uuid4().hex[:6]}"
    lines = [f'[rack]\nname = "{name}"\ntransport = "{kind}"\nwindow_us = {window_us}\n'
             f'workers = {workers}\nhandler = "sleep"\ngrace_s = 1.0\n{extra}\n',
             f"[policy]\n{policy}\nseed = 5\n"]
    ports = free_udp_ports(n) if kind == "udp" else None
    for i in range(n):
        lines.append("[[server]]\n" + (f'address = "127.0.0.1:{ports[i]}"\n' if ports else ""))
    p = tmp_path / f"{name}.toml"
    p.write_text("\n".join(lines))
    return str(p)


def _final_stats(lr):
    return [json.load(open(lr.stats_path(k))) for k in lr.ids]


def _garbage(kind, servers, stop):
    """Throw malformed, truncated and spoofed messages at the servers until stopped."""
    import random
    rng = random.Random(5)
    tr = open_transport(kind, _addr(kind))
    reply = (2, 1, 0, bytes(16))
    good = [wire.encode_task(99, 1), wire.encode_heartbeat(1, theta=[1.0]),
            wire.encode_move(1, 99, 2, reply), wire.encode_steal_request(1, 1)]
    sent = 0
    try:
        while not stop.is_set():
            batch = []
            for dst in servers:
                m = rng.choice(good)
                batch += [(dst, m[:rng.randrange(len(m))]),                       # truncated
                          (dst, bytes(rng.randrange(256) for _ in range(rng.randrange(60)))),
                          (dst, m[:4] + bytes([rng.choice([1, 5]), 0]) + m[6:]
                           if m[3] != 1 else b"ML")]                 # spoofed sender
            tr.send_many(batch)
            sent += len(batch)
            time.sleep(0.005)
    finally:
        tr.close()
    return sent


@pytest.mark.parametrize("kind", LOCAL)
def test_rack_answers_every_task_once_despite_garbage(tmp_path, kind):
    path = _rack_file(tmp_path, kind, 'name = "random"')
    with LocalRack(path) as lr:
        stop = threading.Event()
        g = threading.Thread(target=_garbage, args=(kind, lr.cfg.addresses, stop))
        g.start()
        try:
            with Client(kind, lr.cfg.addresses) as c:
                acc = c.run(600, service_ns=20_000, rate=3000, timeout=10)
        finally:
            stop.set()
            g.join(10)
        time.sleep(0.05)
        codes = lr.down()
    assert codes == {0: 0, 1: 0, 2: 0}
    s = acc.summary()
    assert s["answered"] == 600 and s["lost"] == 0 and s["duplicates"] == 0, s
    assert s["status"] == {"ok": 600}
    assert s["migrated"] > 100                 # random sends 2/3 of the tasks elsewhere
    st = _final_stats(lr)
    assert sum(x["migrated_out"] for x in st) == sum(x["forwarded_in"] for x in st) == \
        s["migrated"]
    for x in st:
        assert x["windows"] > 10 and x["hb_sent"] > 10 and x["hb_recv"] > 10
        assert x["hb_observed"] == x["hb_recv"]          # every heartbeat reached the policy
        assert x["malformed"] > 10
        assert "length does not match" in x["malformed_by_reason"]
        assert x["unfinished"] == 0 and x["stuck_threads"] == []
    for k in lr.ids:
        assert "malformed message(s)" in lr.output(k)      # logged with reasons


@pytest.mark.parametrize("kind", LOCAL)
def test_rack_steals_from_the_busy_server(tmp_path, kind):
    path = _rack_file(tmp_path, kind, 'name = "steal"\nmin_victim = 0', workers=1)
    with LocalRack(path) as lr:
        with Client(kind, lr.cfg.addresses) as c:
            # Server 0 gets most of the work; 1 and 2 steal after their own completions.
            idx = [0, 0, 0, 0, 0, 0, 1, 2]
            acc = c.run(480, service_ns=200_000, rate=8000, servers=idx, timeout=15)
        codes = lr.down()
    assert set(codes.values()) == {0}
    s = acc.summary()
    assert s["answered"] == 480 and s["lost"] == 0 and s["duplicates"] == 0, s
    assert s["stolen"] > 10, s
    st = _final_stats(lr)
    # Each steal is counted once by the thief and once by the victim. A task may be stolen
    # again from its thief (the oldest waiting task goes, whatever its history), so the
    # client sees at most as many stolen tasks as there were steals.
    assert sum(x["stolen_in"] for x in st) == sum(x["stolen_out"] for x in st) >= s["stolen"]
    assert st[0]["stolen_out"] > 0 and st[0]["steal_req_recv"] > 0


def _steals_on_a_malcolm_rack(tmp_path, params):
    """480 tasks of 200 µs on three udp servers of one worker running Malcolm with
    ``params`` (rack-file lines), six in eight sent to server 0: (the client's summary, each
    server's final statistics), after checking that every task was answered once."""
    if _policy_with_theta() != "malcolm":
        pytest.skip("the malcolm policy is not built")
    path = _rack_file(tmp_path, "udp", 'name = "malcolm"\n' + params, workers=1)
    with LocalRack(path) as lr:
        with Client("udp", lr.cfg.addresses) as c:
            acc = c.run(480, service_ns=200_000, rate=8000, servers=[0, 0, 0, 0, 0, 0, 1, 2],
                        timeout=15)
        codes = lr.down()
    assert set(codes.values()) == {0}
    s = acc.summary()
    assert s["answered"] == 480 and s["lost"] == 0 and s["duplicates"] == 0, s
    return s, _final_stats(lr)


@pytest.mark.parametrize("grant", [0.0, 1000.0])
def test_the_victims_steal_bar_runs_in_the_gateway(tmp_path, grant):
    """``steal_grant`` decides in the runtime's gateway as in the simulator: with a bar no
    queue reaches (1000 hops of waiting work) every steal request is answered empty."""
    s, st = _steals_on_a_malcolm_rack(tmp_path, f"steal_grant = {grant}")
    assert st[0]["steal_req_recv"] > 0
    if grant:
        assert sum(x["stolen_out"] for x in st) == 0 and s["stolen"] == 0, s
    else:
        assert st[0]["stolen_out"] > 0 and s["stolen"] > 0, s


@pytest.mark.parametrize("first", [False, True])
def test_a_stolen_task_is_queued_ahead_where_the_policy_says_so(tmp_path, first):
    """``stolen_first`` in the runtime's gateway as in the simulator: each stolen task goes on
    the queue the workers empty first (``stolen_ahead``), and every task is answered."""
    _, st = _steals_on_a_malcolm_rack(tmp_path, "steal_grant = 0\n"
                                      f"stolen_first = {str(first).lower()}")
    stolen = sum(x["stolen_in"] for x in st)
    assert stolen > 0 and stolen == sum(x["stolen_out"] for x in st)
    assert sum(x["stolen_ahead"] for x in st) == (stolen if first else 0)


@pytest.mark.parametrize("kind", LOCAL)
def test_rack_runs_malcolm_and_its_critics_travel(tmp_path, kind):
    if _policy_with_theta() != "malcolm":
        pytest.skip("the malcolm policy is not built")
    n_theta = len(make_policy("malcolm", 3, 0, 1).py_heartbeat()["theta"])
    path = _rack_file(tmp_path, kind, 'name = "malcolm"')
    with LocalRack(path) as lr:
        with Client(kind, lr.cfg.addresses) as c:
            acc = c.run(300, service_ns=20_000, rate=3000, servers=[0, 0, 1], timeout=10)
        codes = lr.down()
    assert set(codes.values()) == {0}
    s = acc.summary()
    assert s["answered"] == 300 and s["lost"] == 0 and s["duplicates"] == 0, s
    for x in _final_stats(lr):
        assert x["hb_recv"] > 10 and x["hb_observed"] == x["hb_recv"]
        assert x["hb_theta_recv"] == n_theta * x["hb_recv"] > 0


@pytest.mark.parametrize("kind", LOCAL)
def test_killed_server_loses_only_its_tasks(tmp_path, kind):
    path = _rack_file(tmp_path, kind, 'name = "random"', extra="peer_timeout_ms = 100")
    lr = LocalRack(path).up()
    try:
        with Client(kind, lr.cfg.addresses) as c:
            assert c.run(150, service_ns=20_000, rate=3000, timeout=5).lost == 0
        lr.kill(2)
        # Right after the kill: what goes to server 2, directly or migrated, is lost, and
        # the client's accounting says so; nothing hangs.
        t0 = time.monotonic()
        with Client(kind, lr.cfg.addresses, client_id=2) as c:
            s = c.run(150, service_ns=20_000, rate=3000, timeout=2).summary()
        assert time.monotonic() - t0 < 10
        assert s["answered"] + s["lost"] == s["sent"] == 150 and s["duplicates"] == 0
        assert s["lost_by_server"].get(2, 0) == 50
        assert s["by_server"].get(0, 0) > 20 and s["by_server"].get(1, 0) > 20
        # Once the survivors have missed its heartbeats (peer_timeout_ms), they stop
        # migrating to it: only the tasks sent to server 2 itself are lost.
        time.sleep(0.4)
        with Client(kind, lr.cfg.addresses, client_id=3) as c:
            s = c.run(300, service_ns=20_000, rate=3000, timeout=2).summary()
        assert s["lost"] == s["lost_by_server"].get(2, 0) == 100, s
        assert s["answered"] == 200 and s["status"] == {"ok": 200}
        lr.procs[0].send_signal(signal.SIGINT)
        assert lr.procs[0].wait(15) == 0
        assert "stopped (SIGINT)" in lr.output(0)
        assert json.load(open(lr.stats_path(0)))["kept_for_silent"] > 0
    finally:
        codes = lr.down()
    assert codes[1] == 0 and codes[2] != 0


def _have_netns():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False, "needs root and iproute2"
    ns = f"mcprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", ns], capture_output=True)
    if r.returncode != 0:
        return False, f"ip netns does not work here: {r.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return True, ""


CLIENT = r"""
import json, sys
from malcolm.net.client import Client
with Client("udp", sys.argv[1].split(","), address=sys.argv[2]) as c:
    acc = c.run(int(sys.argv[3]), service_ns=20_000, rate=2000, timeout=5)
print(json.dumps(acc.summary()))
"""


@pytest.mark.root
def test_rack_across_network_namespaces(tmp_path):
    ok, why = _have_netns()
    if not ok:
        pytest.skip(why)
    tag = f"{os.getpid() % 100000}"
    ns = [f"mca{tag}", f"mcb{tag}"]
    ips = ["10.231.7.1", "10.231.7.2"]

    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True)

    procs = []
    try:
        for n in ns:
            ip("netns", "add", n)
        ip("link", "add", f"va{tag}", "netns", ns[0], "type", "veth", "peer", "name",
           f"vb{tag}", "netns", ns[1])
        for n, dev, a in zip(ns, (f"va{tag}", f"vb{tag}"), ips, strict=True):
            ip("-n", n, "addr", "add", f"{a}/24", "dev", dev)
            ip("-n", n, "link", "set", dev, "up")
            ip("-n", n, "link", "set", "lo", "up")
        rack = tmp_path / "veth.toml"
        rack.write_text(textwrap.dedent(f"""
            [rack]
            name = "veth"
            window_us = 1000
            handler = "sleep"
            grace_s = 1.0
            [policy]
            name = "random"
            [[server]]
            address = "{ips[0]}:7101"
            [[server]]
            address = "{ips[1]}:7101"
            """))
        outs = []
        for k in range(2):
            out = tmp_path / f"s{k}.out"
            outs.append(out)
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns[k], sys.executable, "-m", "malcolm", "serve",
                 "--rack", str(rack), "--id", str(k), "--stats-json", str(tmp_path / f"s{k}.json")],
                stdout=open(out, "w"), stderr=subprocess.STDOUT, env=ENV))
        t_end = time.monotonic() + 30
        while not all(" ready on " in o.read_text() for o in outs):
            assert time.monotonic() < t_end, [o.read_text() for o in outs]
            assert all(p.poll() is None for p in procs), [o.read_text() for o in outs]
            time.sleep(0.05)
        servers = ",".join(f"{a}:7101" for a in ips)
        r = subprocess.run(["ip", "netns", "exec", ns[0], sys.executable, "-c", CLIENT,
                            servers, f"{ips[0]}:0", "300"],
                           capture_output=True, text=True, env=ENV, timeout=60)
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        assert s["answered"] == 300 and s["lost"] == 0 and s["duplicates"] == 0
        assert s["by_server"].get("1", 0) > 50 and s["migrated"] > 50   # crossed the veth
        for p in procs:
            p.send_signal(signal.SIGTERM)
        assert [p.wait(15) for p in procs] == [0, 0]
        st = [json.load(open(tmp_path / f"s{k}.json")) for k in range(2)]
        assert all(x["hb_recv"] > 5 for x in st)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_serve_names_the_handler_it_runs(tmp_path):
    """--handler overrides the rack file's, and the banner said the rack file's."""
    path = _rack_file(tmp_path, "udp", 'name = "jsq"', n=1)
    r = subprocess.run([sys.executable, "-m", "malcolm", "serve", "--rack", path, "--id", "0",
                        "--handler", "echo", "--duration", "0.2"], capture_output=True,
                       text=True, env=ENV, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " ready on " in r.stdout and "workers, echo, policy" in r.stdout, r.stdout


def test_rack_up_command_starts_and_stops(tmp_path):
    path = _rack_file(tmp_path, "udp", 'name = "jsq"', n=2)
    r = subprocess.run([sys.executable, "-m", "malcolm", "rack", "up", "--rack", path,
                        "--duration", "1s", "--stats"], capture_output=True, text=True,
                       env=dict(ENV, TMPDIR=str(tmp_path)), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up: 2 servers" in r.stdout and "down: exit codes {0: 0, 1: 0}" in r.stdout
    assert "resp/s" in r.stdout                         # --stats lines were relayed
    # the temporary folder it named is kept for the user to read
    logdir = r.stdout.split("(output in ")[1].split(")")[0]
    assert logdir.startswith(str(tmp_path)) and os.path.isfile(f"{logdir}/server-1.out")


def test_local_rack_removes_its_temporary_logdir(tmp_path):
    # every LocalRack without a logdir used to leave a folder in /tmp
    path = _rack_file(tmp_path, "udp", 'name = "jsq"', n=2)
    with LocalRack(path) as lr:
        logdir = lr.logdir
    assert os.path.isfile(f"{logdir}/server-0.out")     # readable after the stop
    del lr
    gc.collect()
    assert not os.path.exists(logdir)


def test_rack_up_stops_cleanly_on_ctrl_c(tmp_path):
    path = _rack_file(tmp_path, "shm" if "shm" in LOCAL else "udp", 'name = "random"', n=2)
    out = tmp_path / "up.out"
    # Ctrl-C in a terminal signals the foreground process group: `rack up`, which stops its
    # servers in order (each runs in a process group of its own, out of the terminal's reach)
    p = subprocess.Popen([sys.executable, "-m", "malcolm", "rack", "up", path],
                         stdout=open(out, "w"), stderr=subprocess.STDOUT,
                         env=dict(ENV, TMPDIR=str(tmp_path)),
                         start_new_session=True)
    try:
        t_end = time.monotonic() + 30
        while "up: 2 servers" not in out.read_text():
            assert p.poll() is None and time.monotonic() < t_end, out.read_text()
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(30) == 0, out.read_text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
    text = out.read_text()
    assert "stopped (SIGTERM)" in text and "down: exit codes {0: 0, 1: 0}" in text


def test_stop_is_bounded_by_stop_bound_s_and_names_a_stuck_worker(inproc):
    # A task that outlives the grace: stop returns within the bound the launcher waits for
    # (config.stop_bound_s) and names the worker it could not join; the task ends on its own.
    from malcolm.runtime.config import stop_bound_s
    r = inproc("udp", 1, handler="sleep", workers=1, capacity=8)
    srv = r.servers[0]
    with r.client() as c:
        c.send(0, service_ns=1_500_000_000)
        time.sleep(0.2)
        t0 = time.monotonic()
        rep = srv.stop(grace_s=0.2)
        took = time.monotonic() - t0
    assert rep["unfinished"] == 1 and len(rep["stuck_threads"]) == 1, rep["stuck_threads"]
    assert 0.2 <= took <= stop_bound_s(0.2, 1), took
    time.sleep(1.5)         # the sleeping task's thread ends before the next test


def test_windows_follow_the_measured_task_time(inproc):
    # 200 µs tasks and a 5 ms configured window: once each worker has completed its first
    # tasks, a window is 5 task times, 1 ms (drv_window_ns, the simulator's rule)
    r = inproc("udp", 1, handler="spin", workers=1, window_us=5000.0)
    with r.client() as c:
        acc = c.run(120, service_ns=200_000, rate=2000)
    assert acc.lost == 0
    st = r.servers[0].stats()
    assert st["completed"] == 120
    assert 900.0 <= st["window_us"] <= 2000.0, st["window_us"]
    r2 = inproc("udp", 1, handler="spin", workers=1, window_us=5000.0, window_tasks=0)
    with r2.client() as c:
        c.run(60, service_ns=200_000, rate=2000)
    assert r2.servers[0].stats()["window_us"] == 5000.0
