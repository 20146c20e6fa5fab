"""A two-server rack of ``malcolm serve`` processes over the verbs transport, on Soft-RoCE.

Runs only under ``pytest -m rdma`` (``scripts/rdma-vm``). The same checks as the udp and
shm racks in test_runtime.py: every task answered exactly once, and migrations and steals
really happen between the servers over RDMA.
"""

import contextlib
import json
import os
import uuid

import pytest

from malcolm.net.ports import free_udp_ports

pytestmark = pytest.mark.rdma

HOST = os.environ.get("MALCOLM_RDMA_HOST", "10.77.0.1")


def _free_ports(n):
    return free_udp_ports(n, HOST)


def _rack_file(tmp_path, policy, n=2, workers=2, keyed=False):
    from malcolm.runtime.config import write_key

    name = f"v{uuid.uuid4().hex[:6]}"
    key = ""
    if keyed:
        write_key(str(tmp_path / f"{name}.key"))
        key = f'key_file = "{tmp_path / name}.key"\n'
    lines = [f'[rack]\nname = "{name}"\ntransport = "verbs"\nwindow_us = 2000\n'
             f'workers = {workers}\nhandler = "sleep"\ngrace_s = 2.0\n{key}',
             f"[policy]\n{policy}\nseed = 5\n"]
    for port in _free_ports(n):
        lines.append(f'[[server]]\naddress = "{HOST}:{port}"\n')
    p = tmp_path / f"{name}.toml"
    p.write_text("\n".join(lines))
    return str(p)


@contextlib.contextmanager
def _rack(path):
    from malcolm.runtime.launcher import LocalRack

    # Servers start slowly under emulation (each imports numpy and pyverbs over 9p).
    lr = LocalRack(path).up(timeout=150)
    try:
        yield lr
    finally:
        lr.down()


def _final_stats(lr):
    return [json.load(open(lr.stats_path(k))) for k in lr.ids]


def test_verbs_rack_migrates_and_answers_every_task_once(tmp_path):
    from malcolm.net.client import Client

    with _rack(_rack_file(tmp_path, 'name = "random"')) as lr:
        with Client("verbs", lr.cfg.addresses, address=f"{HOST}:0") as c:
            acc = c.run(300, service_ns=20_000, rate=1000, timeout=20)
        codes = lr.down()
    assert set(codes.values()) == {0}, codes
    s = acc.summary()
    assert s["answered"] == 300 and s["lost"] == 0 and s["duplicates"] == 0, s
    assert s["status"] == {"ok": 300}
    assert s["migrated"] > 50, s            # random sends about half to the other server
    st = _final_stats(lr)
    assert sum(x["migrated_out"] for x in st) == sum(x["forwarded_in"] for x in st) == \
        s["migrated"]
    for x in st:
        assert x["hb_sent"] > 3 and x["hb_recv"] > 3        # heartbeats flow over RDMA
        assert x["unfinished"] == 0


def test_verbs_rack_steals_from_the_busy_server(tmp_path):
    from malcolm.net.client import Client

    with _rack(_rack_file(tmp_path, 'name = "steal"\nmin_victim = 0', workers=1)) as lr:
        with Client("verbs", lr.cfg.addresses, address=f"{HOST}:0") as c:
            # Server 0 gets most of the work; server 1 steals after its own completions.
            acc = c.run(240, service_ns=300_000, rate=2500, servers=[0, 0, 0, 0, 0, 1],
                        timeout=30)
        codes = lr.down()
    assert set(codes.values()) == {0}, codes
    s = acc.summary()
    assert s["answered"] == 240 and s["lost"] == 0 and s["duplicates"] == 0, s
    assert s["stolen"] > 5, s
    st = _final_stats(lr)
    assert sum(x["stolen_in"] for x in st) == sum(x["stolen_out"] for x in st) >= s["stolen"]
    assert st[0]["stolen_out"] > 0


@pytest.mark.parametrize("keyed", [False, True], ids=["keyless", "keyed"])
def test_verbs_rack_server_restart_is_found_again_by_its_peer_and_its_client(tmp_path, keyed):
    """A verbs server restarted on its address has a new queue pair. A client that keeps
    sending to it, which the server cannot announce itself to, finds it again by re-querying
    a silent peer: every task is answered or reported lost, and only those sent before the
    client's re-query was answered are lost. Before, a client that sent only to the restarted
    server sent everything into the old queue pair for ever (nothing else told it: with tasks
    also going to the other server, the restarted one's answers to migrated tasks did). Its
    peer takes it back at once (it announces itself at start; its first heartbeat is a new
    epoch) and migrates to it again. With a rack key, the same through authenticated
    address queries (the servers' and the client's)."""
    from malcolm.net.client import Accounting, Client
    from malcolm.runtime.config import rack_key

    with _rack(_rack_file(tmp_path, 'name = "random"', keyed=keyed)) as lr:
        key = rack_key(lr.cfg)
        with Client("verbs", lr.cfg.addresses, address=f"{HOST}:0", key=key) as c:
            first = c.run(200, service_ns=20_000, rate=1000, timeout=20).summary()
            lr.kill(1)
            lr.start(1, timeout=150)
            c.acc = Accounting()
            only = c.run(200, service_ns=20_000, rate=1000, servers=[1], timeout=20).summary()
            c.acc = Accounting()
            both = c.run(300, service_ns=20_000, rate=1000, timeout=20).summary()
        codes = lr.down()
    print(f"\nafter the restart, to server 1 only: {only}\nthen to both: {both}")
    assert first["answered"] == 200 and first["duplicates"] == 0, first
    assert set(codes.values()) == {0}, codes
    assert only["answered"] + only["lost"] == 200 and only["duplicates"] == 0, only
    assert only["lost"] <= 30, only                    # all 200 before the fix
    assert both["answered"] == 300 and both["duplicates"] == 0, both
    st = _final_stats(lr)
    assert st[1]["forwarded_in"] > 20, st[1]            # its peer migrates to it again
    assert st[0]["peer_restarts"] >= 1, st[0]         # (peers_up: read after the rack is down)
    for x in st:
        t = x["transport"]
        assert t["authenticated"] == keyed and x["authenticated"] == keyed, t
        assert t["ctl_bad_mac"] == t["ctl_replay"] == t["ctl_unsolicited"] == 0, t


def test_malcolm_loadgen_loads_a_verbs_rack_from_its_rack_file(tmp_path):
    """The operator's path on an RDMA rack (docs/deploy.md): ``malcolm loadgen --rack`` takes
    the transport (verbs) and the key from the rack file, binds the RDMA device's address on
    its own, and every task it sends is answered, by both servers."""
    import subprocess
    import sys

    path = _rack_file(tmp_path, 'name = "random"', keyed=True)
    out = tmp_path / "load.json"
    with _rack(path) as lr:
        r = subprocess.run([sys.executable, "-m", "malcolm", "loadgen", "--rack", path,
                            "--rate", "1000", "--duration", "2s", "--warmup", "0.5s",
                            "--workload", "exp:20", "--timeout", "10s", "--json", str(out)],
                           capture_output=True, text=True, timeout=300)
        codes = lr.down()
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(codes.values()) == {0}, codes
    d = json.loads(out.read_text())
    (x,) = d["runs"]
    t = x["transport"]              # the client endpoint's counters: only verbs has ctl_*
    assert t.get("ctl_bad_mac") == t.get("ctl_replay") == t.get("ctl_unsolicited") == 0, t
    assert x["authenticated"] and x["forged"] == 0, x
    assert x["accounted"] and x["completed"] == x["sent"] > 1000, x
    answered = x["per_server"]["answered"]
    assert len(answered) == 2 and min(answered) > 200, answered
    st = _final_stats(lr)
    assert sum(s["responses"] for s in st) == x["sent"] + x["warmup"]["sent"], st
    for s in st:
        assert s["authenticated"] and s["transport"]["ctl_bad_mac"] == 0, s["transport"]
