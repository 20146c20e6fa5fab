"""Faults the rack must survive with every task accounted for (issue 13, items 4 and 7):
overload turns into rejections with a reason rather than timeouts, and recovers at once.
The long runs (netem loss, delay and reorder in network namespaces, kills, impostors) are in
``bench/faults.py``; their figures are in docs/reliability.md."""

import json
import time

import pytest

from malcolm.loadgen.run import LoadSpec, Target, run_load


def _server(**kw):
    from malcolm.net.transport import open_transport
    from malcolm.runtime.server import Server

    from malcolm.policy.registry import make_policy
    tr = open_transport("udp", "127.0.0.1:0")
    srv = Server(tr, [tr.address], 0, make_policy("random", 1, 0, 1), **kw).start()
    return srv, tr.address


def _machine_disturbed(rep):
    """What the machine (not the server's admission) did to a light-load run, from what the
    run measured: the server's own timing of its 1 ms sleeps, and the generator's lag behind
    its schedule. Neither depends on the admission state, so a server stuck rejecting or
    queueing cannot hide behind them. [] when the run got what it asked for."""
    why = []
    svc = rep["service_us"]
    ratio = svc["measured_mean"] / svc["requested_mean"]
    # 1.02-1.07 on a quiet machine; under steal 1.5-2.6 (the effective load 0.6-1.1, not the
    # 0.4 offered: the server really is short of capacity, and admission rightly refuses)
    if not ratio <= 1.15:
        why.append(f"the handler's sleeps took {ratio:.2f}x the time asked (effective load "
                   f"{rep.get('effective_load', float('nan')):.2f})")
    # on a quiet machine the p99 lag is < 0.5 ms; with the cores busy it reached 17 ms: the
    # generator then sends in bursts, and its latency (measured from the intended send)
    # carries the lag itself
    lag = rep["schedule"]["lag_p99_us"]
    if not lag <= 2000.0:
        why.append(f"the generator was {lag:.0f} us behind its schedule (p99)")
    return why


def test_overload_is_rejected_with_a_reason_and_recovers_at_once():
    # One worker serving 1 ms tasks: about 1000 tasks/s. Offer twice that for 1.5 s.
    srv, addr = _server(handler="sleep", workers=1, window_us=1000, max_wait_ms=50.0,
                        prior_service_us=1000.0)
    target = Target("udp", [addr], "--server", key=None, workers=1)
    afters = []
    try:
        over = run_load(LoadSpec(target=target, workload="exp:1000", duration_s=1.5,
                                 warmup_s=0.2, timeout_s=1.0), 2000)
        # The queue held at most ~50 ms of work, so one second after the overload ends the
        # server is back to what a lightly loaded one gives: it is not stuck rejecting, and no
        # task waits behind a backlog. Not "zero rejections" and not the p99: one scheduler
        # stall of some tens of ms on a shared 2-core runner is measured as service time (the
        # EWMA shrinks the admitted work) while the tasks behind it pile up, and admission
        # then rightly turns a few away with a reason (CI saw 10 of 385). A server stuck in
        # overload rejects most of them; M/M/1 at 0.4 puts p90 near 4 ms.
        # That holds only if the run was light. With both cores busy (10 runs: 4 failed) the
        # server measured its 1 ms sleeps at 1.5-2.6 ms (an effective load up to 1.1: 20-49
        # rejections of ~400 were right) and the generator ran up to 21 ms late (p90 21.7
        # ms, the lag included). So a run that misses the bounds is repeated only when it
        # measured such a disturbance; a miss in an undisturbed run fails at once, and the
        # first run must not reject most tasks whatever the machine did.
        for _ in range(6):
            after = run_load(LoadSpec(target=target, workload="exp:1000", duration_s=1.0,
                                      warmup_s=1.0, timeout_s=1.0), 400)
            ok = (after["accounted"] and after["timed_out"] == 0
                  and after["rejected_total"] <= 0.03 * after["sent"]
                  and after["latency_us"]["p90"] < 20_000)
            afters.append((after, _machine_disturbed(after)))
            if ok or not afters[-1][1]:
                break
    finally:
        rep = srv.stop()
    assert over["accounted"], over
    not_served = over["sent"] - over["completed"]
    assert not_served > 0.25 * over["sent"], over        # it really was overloaded
    rejected = over["rejected"].get("overloaded", 0) + over["rejected"].get("dropped", 0)
    assert over["timed_out"] <= 0.01 * not_served, over
    assert rejected >= 0.99 * not_served, over
    assert rep["overloaded"] >= over["rejected"].get("overloaded", 0) > 0
    first = afters[0][0]
    assert first["timed_out"] == 0 and first["rejected_total"] < 0.5 * first["sent"], first
    after = afters[-1][0]
    tried = [(a["sent"], a["rejected_total"], round(a["latency_us"]["p90"]), why)
             for a, why in afters]
    assert after["accounted"], tried
    assert after["timed_out"] == 0, tried
    assert after["rejected_total"] <= 0.03 * after["sent"], tried
    assert after["latency_us"]["p90"] < 20_000, tried


def test_the_clients_deadline_turns_overload_into_rejections():
    """No rack admission limit (max_wait_ms = 0) and no task_timeout_ms: only the deadline
    each task carries (the generator's 0.1 s timeout, wire v3) keeps the queue short. At 2x
    capacity the tasks that cannot be served in time are refused at once, not timed out.
    Without the deadline on the wire the queue grows without bound and they time out."""
    srv, addr = _server(handler="sleep", workers=1, window_us=1000, max_wait_ms=0.0,
                        prior_service_us=1000.0)
    target = Target("udp", [addr], "--server", key=None)
    try:
        over = run_load(LoadSpec(target=target, workload="exp:1000", duration_s=1.5,
                                 warmup_s=0.2, timeout_s=0.1), 2000)
    finally:
        rep = srv.stop()
    assert over["accounted"], over
    not_served = over["sent"] - over["completed"]
    assert not_served > 0.25 * over["sent"], over
    assert over["rejected"].get("overloaded", 0) >= 0.97 * not_served, over
    assert over["timed_out"] <= 0.03 * not_served, over
    assert rep["overloaded"] > 0


def test_the_python_clients_timeout_travels_as_the_tasks_budget():
    from malcolm.net.transport import open_transport

    from malcolm.net import wire
    from malcolm.net.client import Client

    with open_transport("udp", "127.0.0.1:0") as peer, \
            Client("udp", [peer.address], task_timeout=0.25) as c:
        c.send(0)
        c.send(0, timeout=None)
        c.send(0, timeout=1e-9)         # already spent: still a deadline (1 us), not "none"
        got = []
        t_end = time.monotonic() + 5.0
        while len(got) < 3 and time.monotonic() < t_end:
            got += [wire.decode_native(d)["budget_us"] for d, _ in peer.recv(0.05)]
    assert got == [250_000, 0, 1]
    for bad in (float("nan"), float("inf"), 0, -1.0):
        with pytest.raises(ValueError, match="task timeout"):
            Client("udp", ["127.0.0.1:9"], task_timeout=bad)


def test_a_task_whose_budget_ran_out_is_answered_with_the_reason_not_run():
    """The Python client's deadline reaches the server: a task still queued when its budget
    runs out is answered ``timed_out`` (or refused ``overloaded`` at arrival), never run; the
    same task without a deadline runs. Without the budget on the wire both would run."""
    from malcolm.net import wire
    from malcolm.net.client import Client

    srv, addr = _server(handler="sleep", workers=1, window_us=1000)
    try:
        with Client("udp", [addr]) as c:
            busy = c.send(0, service_ns=300_000_000)      # the one worker: 0.3 s
            late = c.send(0, service_ns=1_000, timeout=0.01)
            ok = c.send(0, service_ns=1_000)
            acc = c.collect(10.0)
    finally:
        rep = srv.stop()
    assert acc.lost == 0 and acc.duplicates == 0, acc.summary()
    a = acc.answered
    assert a[busy]["status"] == a[ok]["status"] == wire.Status.OK
    assert a[late]["status"] in (wire.Status.TIMED_OUT, wire.Status.OVERLOADED), a[late]
    assert a[late]["service_ns"] == 0               # the handler never ran it
    assert rep["timed_out"] + rep["overloaded"] == 1, rep


def test_a_task_behind_a_running_one_that_its_budget_cannot_wait_for_is_refused_at_once():
    """Nothing queued, but the one worker busy with a long task (the server's tasks known
    to take 100 ms): a task whose client allows 40 ms (half of it for the wait) would wait a
    task time for the worker, so it is refused ``overloaded`` on arrival, not admitted to
    time out in the queue. Counting only the queued tasks (0) admitted it."""
    from malcolm.net import wire
    from malcolm.net.client import Client

    srv, addr = _server(handler="sleep", workers=1, window_us=1000, max_wait_ms=0.0,
                        prior_service_us=100_000.0)
    try:
        with Client("udp", [addr]) as c:
            busy = c.send(0, service_ns=300_000_000)      # the one worker: 0.3 s
            time.sleep(0.05)                              # it has started
            late = c.send(0, service_ns=1_000, timeout=0.04)
            acc = c.collect(10.0)
    finally:
        rep = srv.stop()
    assert acc.lost == 0 and acc.duplicates == 0, acc.summary()
    a = acc.answered
    assert a[busy]["status"] == wire.Status.OK
    assert a[late]["status"] == wire.Status.OVERLOADED, a[late]
    assert rep["overloaded"] == 1 and rep["timed_out"] == 0, rep


# ------------------------------------------------------------------ real server processes

def test_impostor_on_a_dead_members_port_gets_nothing(tmp_path):
    from malcolm.loadgen.faults import FaultRack, check
    with FaultRack(str(tmp_path), policy='name = "random"') as fr:
        fr.lr.kill(2)
        time.sleep(0.4)                         # past peer_timeout_ms: 2 is presumed down
        rep = fr.load(600, 2.0, servers=fr.addresses[:2],
                      faults=[(0.2, fr.impostor(2, 1.5, kill=False))])
        codes = fr.down()
    imp = rep["faults"][0]
    assert sum(imp["sent"].values()) > 1000
    # Nothing was migrated to it, no steal asked of it, nothing it sent was acted upon.
    assert imp["received"]["forwards"] == 0 and imp["received"]["steal_req"] == 0, imp
    assert check(rep) == [] and rep["completed"] == rep["sent"] > 500, rep
    st = [json.load(open(fr.lr.stats_path(k))) for k in (0, 1)]
    assert sum(x["malformed_by_reason"].get("bad MAC", 0) for x in st) >= \
        0.9 * sum(imp["sent"].values())
    assert all(x["stolen_out"] == 0 for x in st)       # its steal requests did nothing
    assert codes[0] == codes[1] == 0


def test_kill_stop_and_restart_under_load_lose_nothing_unreported(tmp_path):
    from malcolm.loadgen.faults import FaultRack, check
    with FaultRack(str(tmp_path), policy='name = "jsq"') as fr:
        # SIGSTOP for 0.3 s: everything is answered late, nothing lost
        rep = fr.load(600, 1.5, timeout_s=2.0, faults=[(0.3, fr.stop_cont(1, 0.3))])
        assert check(rep) == [], rep
        # restart: what went to server 2 while it was down is reported lost, no more
        rep = fr.load(600, 2.5, timeout_s=1.0, faults=[(0.3, fr.restart(2, 0.3))])
        assert rep["accounted"] and rep["duplicates"] == 0, rep
        assert rep["timed_out"] <= rep["per_server"]["sent"][2], rep
        # after the restart it serves again, and its peers took it back at once: JSQ
        # migrates to it like to any other (a forged or restarted heartbeat sequence used
        # to freeze its peers' view of it: 2 tasks in 4 s)
        rep2 = fr.load(1500, 1.5)
        done_ns = time.monotonic_ns()
        assert check(rep2) == [] and rep2["per_server"]["answered"][2] > 100, rep2
        # The statistics from after that load, not the latest file 1.2 s later: with both
        # cores busy it was up to 2.5 s older than the load's end (forwarded_in 31 of the
        # ~320 the final report gave; failed 1 of 10 runs)
        *st, restarted = fr.stats_after((0, 1, 2), done_ns)
        codes = fr.down()
        assert all(x.get("mono_ns", 0) >= done_ns for x in (*st, restarted)), \
            "no statistics from after the load within 10 s"
        logs = [open(fr.lr.out_path(k)).read() for k in (0, 1)]
    assert restarted["forwarded_in"] > 50 and restarted["peer_joins"] == 2, restarted
    for x in st:
        assert x["peer_restarts"] >= 1 and 2 in x["peers_up"], x
        assert x["peer_leaves"] >= 1, x             # it was missed while down
    assert codes[0] == codes[1] == 0, codes
    # and each survivor's log says so, in the order it happened (serve's PeerLog)
    addr = fr.lr.cfg.addresses[2]
    for k, text in enumerate(logs):
        assert f"server {k}: all 2 peers heard" in text, text
        said = [ln for ln in text.splitlines() if f"server {k}: peer 2 ({addr}" in ln]
        # down 0.3 s: it left (100 ms) and was back within a tick, or over two ticks
        assert said and "left the rack" in said[0] and "back" in said[-1], text


# Time dilation for the netem runs: every time in them (service times, windows, the peers'
# timeout, the admission limit max_wait_ms, the client's timeout, netem's delays) x K, and
# the rate / K. They also run in the
# Soft-RoCE guest (scripts/rdma-vm: its kernel has netem), where TCG on a loaded host makes a
# 200 us sleep take 5 ms and an undilated rack time out nearly everything; at K = 10 it keeps
# up there with seconds to spare.
NETEM_K = 10.0
NETEM_SCRIPT = r"""
import json, sys, tempfile
from malcolm.loadgen.faults import FaultRack
K = float(sys.argv[1])
with FaultRack(tempfile.mkdtemp(prefix="mcnetem-"), policy='name = "random"',
               window_us=1000.0 * K, peer_timeout_ms=100.0 * K,
               extra=f"max_wait_ms = {200.0 * K!r}") as fr:
    rep = fr.load(2000.0 / K, 3.0, timeout_s=0.5 * K, workload=f"exp:{200.0 * K}")
print(json.dumps({k: rep[k] for k in ("sent", "completed", "timed_out", "rejected_total",
                                      "rejected", "accounted", "duplicates", "forged")}))
"""


@pytest.mark.root
@pytest.mark.netem
@pytest.mark.parametrize("qdisc", ["loss 5%", "delay 1ms 500us reorder 75% 50%"],
                         ids=["loss5", "delay-jitter-reorder"])
def test_netem_loss_and_reorder_lose_nothing_unreported(qdisc):
    """A keyed rack and its load in a network namespace whose loopback drops 5% of the
    datagrams, or delays them by 1 ms + jitter and sends a quarter behind later ones (netem,
    all times dilated x NETEM_K): every task is still accounted for, none twice; loss shows
    as reported timeouts, no more of them than the datagrams netem dropped, and reordering as
    none at all (the replay window takes it). Skips with the reason where there is no root,
    iproute2 or netem (loss then falls back to nftables), except in the Soft-RoCE guest
    (``MALCOLM_REQUIRE_NETEM=1``): it has netem, so there a skip is a failure."""
    import os
    import shutil
    import subprocess
    import sys

    from malcolm.loadgen.faults import dilate_qdisc, impair, impairment

    def skip(why):
        if os.environ.get("MALCOLM_REQUIRE_NETEM") == "1":
            pytest.fail(f"netem is required here (MALCOLM_REQUIRE_NETEM=1): {why}")
        pytest.skip(why)

    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        skip("needs root, ip and tc")
    ns = f"mcnetem{os.getpid()}"
    try:
        r = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
        if r.returncode:
            skip(f"ip netns does not work here: {r.stderr.strip()}")
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        try:
            how = impair(ns, dilate_qdisc(qdisc, NETEM_K))
        except RuntimeError as e:
            skip(str(e))
        env = dict(os.environ, PYTHONPATH=os.getcwd())
        env.pop("MALCOLM_RACK_KEY_FILE", None)
        r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", NETEM_SCRIPT,
                            str(NETEM_K)], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        net = impairment(ns)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert rep["accounted"] and rep["duplicates"] == 0 and rep["forged"] == 0, rep
    assert rep["sent"] > 400, rep
    assert net is not None, how
    if "loss" in qdisc:
        # a task is lost if its task, a forward or its response is dropped: about 10-15%,
        # and each lost task needs a dropped datagram of its own
        assert 0 < rep["timed_out"] < 0.3 * rep["sent"], rep
        assert rep["timed_out"] <= net["dropped"], (rep, net)
    else:
        assert rep["timed_out"] == 0 and rep["completed"] == rep["sent"], rep
        assert net["dropped"] == 0 and net["packets"] >= 2 * rep["sent"], net


@pytest.mark.parametrize("hop", [
    {"delay_us": 1000.0, "jitter_us": 500.0, "reorder": 0.25},
    {"delay_us": 200.0, "loss": 0.05},
], ids=["delay-jitter-reorder", "loss5"])
def test_delay_stage_delay_reorder_and_loss_lose_nothing_unreported(tmp_path, hop):
    """The same faults through the transports' delay stage (no netem, no root needed): a
    keyed 3-server rack whose every endpoint delays its datagrams by 1 ms + U[0, 0.5 ms) and
    sends a quarter of them ahead of the others, or drops 5 %. Every task is accounted
    for, none twice; reordering costs nothing (the replay window takes it), loss shows only
    as reported timeouts."""
    from malcolm.loadgen.faults import FaultRack
    with FaultRack(str(tmp_path), policy='name = "jsq"', hop=hop) as fr:
        rep = fr.load(800, 1.5, timeout_s=0.5)
        st = fr.stats_after(range(3), time.monotonic_ns())     # not a stale snapshot
        codes = fr.down()
    assert rep["accounted"] and rep["duplicates"] == 0 and rep["forged"] == 0, rep
    assert rep["sent"] > 1000
    assert sum(x["forwarded_in"] for x in st) > 50        # the servers' hops were used too
    if "loss" in hop:
        # a task is lost if its task, a forward or its response is dropped: about 5-15 %
        assert 0 < rep["timed_out"] < 0.3 * rep["sent"], rep
        assert rep["timed_out"] + rep["completed"] + rep["rejected_total"] == rep["sent"]
    else:
        assert rep["timed_out"] == 0 and rep["completed"] == rep["sent"], rep
        # two hops of >= 1 ms each, unless a quarter of the messages skips the delay
        assert rep["latency_us"]["p50"] >= 2000.0, rep["latency_us"]
    assert all(c == 0 for c in codes.values()), codes


def test_survivors_stop_migrating_to_a_dead_server_within_a_few_windows(tmp_path):
    """Issue 13: the policy re-forms within 10 windows of a failure. A peer silent for 5
    windows gets no more tasks (it sends a heartbeat every window), although it leaves the
    membership only after peer_timeout_ms (here 1 s = 100 windows, which is what the
    survivors' gateways waited before). bench/faults.py --reform measures it for joins and
    restarts too."""
    from malcolm.loadgen.faults import FaultRack
    marks = {}

    def kill():
        marks["t"] = time.monotonic_ns()
        fr.lr.kill(2)
        return {}

    # JSQ without count_own keeps choosing the dead server (its last report stays the
    # shortest queue), so only the gate can stop it: with count_own the tasks JSQ itself
    # sent there pile onto that report, it stopped choosing the server on its own within a
    # few windows, and kept_for_silent was 0 or not depending on the machine's timing.
    with FaultRack(str(tmp_path), policy='name = "jsq"\ncount_own = false',
                   window_us=10_000.0, peer_timeout_ms=1000.0) as fr:
        rep = fr.load(2000, 2.5, workload="exp:500", shares=[1.0, 1.0, 0.0],
                      faults=[(1.0, kill)])
        # The leave comes peer_timeout_ms after the kill, 0.5 s before the load ends on a
        # quiet machine; on a loaded one it may come later: keep the rack up until both
        # survivors' statistics (rewritten every second) show it, or 5 s have passed.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not all(
                (fr.stats(k) or {}).get("peer_leaves", 0) >= 1 for k in (0, 1)):
            time.sleep(0.2)
        codes = fr.down()
    st = [fr.stats(k) for k in (0, 1)]
    assert rep["accounted"] and rep["duplicates"] == 0, rep
    assert all(x["migrated_to"][2] > 20 for x in st), st       # it was used before
    last = max(x["last_migrated_to_ns"][2] for x in st)
    # 5 windows of silence, plus up to one window since its last heartbeat: 60 ms; a bound
    # of 15 windows leaves room for a loaded machine and is far from the 100 of before
    assert last - marks["t"] < 15 * 10_000_000, (last - marks["t"]) / 1e6
    assert all(x["kept_for_silent"] > 0 for x in st), [x["kept_for_silent"] for x in st]
    assert all(x["peer_leaves"] >= 1 for x in st), [x["peer_leaves"] for x in st]
    assert codes[0] == codes[1] == 0
