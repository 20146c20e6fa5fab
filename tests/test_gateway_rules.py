"""The gateway's rules beside the hop gate (malcolm/policy/gateway_rules.pyx): the shed rule
(``shed``, off by default; ``shed_runaway`` for a runaway queue, on) and idle-only steals
(``steal_idle``, on by default since the thirteenth session); docs/policy-log.md, "Tiny
racks: the shed rule and idle-only steals"."""
import numpy as np
import pytest

ac = pytest.importorskip("malcolm.policy.actor_critic")
hooks = pytest.importorskip("malcolm.policy._testing")
MalcolmPolicy = ac.MalcolmPolicy

T = 50_000.0        # one task's service time, ns
HOP = 10_000.0      # one-way hop, ns: h r = 0.2 task times on a one-worker server
N = 4


def feed(p, now, tasks, peer_tasks):
    """One window of one-worker servers: own ``tasks``, every peer ``peer_tasks``."""
    r = 1.0 / T
    p.py_observe_local(now, tasks * T, 0.0, r)
    for j in range(p.n):
        if j != p.me:
            p.py_observe_peer(now, j, peer_tasks * T, rate=r)
    p.py_end_window(now)


def complete(p, k):
    """k completions: the gateway's decide_steal calls; returns the steals drawn."""
    c = hooks.sample_many(p, "steal", k)
    return int(k - c[p.me])


def test_defaults_turn_steal_idle_on_and_shed_only_a_runaway_queue():
    """``shed`` is off by default; ``shed_runaway`` (16 own task times a worker) sheds only a
    queue that far beyond a hop plus the peers' wait: the guard for a hot entry server,
    where the table keeps about half of most of the rack's arrivals."""
    p = MalcolmPolicy(N, 0, seed=1)
    assert p.shed < 0 and p.steal_idle is True and p.shed_runaway == 16.0
    assert MalcolmPolicy(N, 0, seed=1, steal_idle=0).steal_idle is False
    for tasks, runaway in ((10, 16.0), (20, 16.0), (10, 0.0)):
        off = MalcolmPolicy(N, 0, seed=1, hop_ns=HOP, learn=False, shed_runaway=runaway)
        feed(off, 0, tasks, 0)          # `tasks` here, idle peers
        counts = hooks.sample_many(off, "arrival", 2000)
        if runaway:
            # the live budget counts the arrivals kept: the queue stops about 16 tasks
            # beyond the peers' (20 is there already: every arrival goes on)
            assert counts[0] <= max(0, 16 - tasks + 2) and off.shed_count >= 1970 - counts[0]
            assert (counts[0] > 0) == (tasks < 16), counts[0]
        else:                           # no guard: the table keeps about half
            assert off.shed_count == 0 and counts[0] > 500, counts[0]
    with pytest.raises(TypeError, match="steal_idle"):
        MalcolmPolicy(N, 0, steal_idle="maybe")
    with pytest.raises(ValueError, match="shed"):
        MalcolmPolicy(N, 0, shed=float("nan"))
    with pytest.raises(ValueError, match="shed_runaway"):
        MalcolmPolicy(N, 0, shed_runaway=-1.0)


def test_shed_draws_peers_in_proportion_to_the_table():
    """Shedding, an arrival goes to peer j with probability pi_j / (1 - pi_me): the
    published table without the accept outcome, never to ``me``."""
    p = MalcolmPolicy(N, 1, seed=3, hop_ns=HOP, learn=False, shed=0.0)
    B = np.array([0.5, 0.0, -0.7, 1.2])
    p.set_params(B_migrate=B)
    feed(p, 0, 40, 0)                    # K = floor(1 - 40 + 0.2) = -39, T = floor(1) = 1
    pm = np.asarray(p.probs_migrate)
    assert pm[1] > 0.1                   # the table keeps some arrivals here
    m = 40_000
    counts = hooks.sample_many(p, "arrival", m)
    assert counts[1] == 0 and p.shed_count == m and p.gated == 0
    want = pm / (1.0 - pm[1])
    for j in (0, 2, 3):
        sd = np.sqrt(m * want[j] * (1 - want[j]))
        assert abs(counts[j] - m * want[j]) < 5 * sd, (j, counts, want)


def test_shed_threshold_follows_the_live_queue():
    """One worker, h r = 0.2, peers at 3.5 tasks (r w = 3.5), shed = 1:
    T = floor(1 - 3.5 - 1) = -4. With 10 tasks here the budget is K = floor(1 - 10 + 0.2)
    = -9; each completion adds one, each arrival kept takes one, a shed arrival neither.
    Arrivals are shed exactly while K + done - used <= -4."""
    p = MalcolmPolicy(N, 0, seed=1, hop_ns=HOP, learn=False, shed=1.0, mask_factor=0.0)
    feed(p, 0, 10, 3.5)
    hooks.sample_many(p, "arrival", 50)
    assert p.shed_count == 50                     # K' = -9 <= -4: every arrival goes away
    complete(p, 5)                                # K' = -4: still shed
    hooks.sample_many(p, "arrival", 10)
    assert p.shed_count == 60
    complete(p, 1)                                # K' = -3 > -4: the table decides again
    kept = int(hooks.sample_many(p, "arrival", 200)[0])
    drawn = 199 - (p.shed_count - 60)             # the table's migrations before its keep
    assert kept == 1 and 0 <= drawn <= 30         # the one kept takes the place: K' = -4
    # a publish starts over from the new queue: peers at 12 tasks, 10 here: T = -14, K = -9
    feed(p, 100_000, 10, 12)
    before = p.shed_count
    hooks.sample_many(p, "arrival", 3)
    assert p.shed_count == before


def test_steal_idle_steals_only_into_an_open_gate():
    """steal_idle: after a completion a drawn steal is kept only while K + done - used >= 1
    (no victim more than a task above the rack's mean). Here K = floor(1 - 3 + 0.2) = -2,
    peers with 4 tasks each (e = 0.25 tasks: bar ceil(0.75) = 1): the first two completions
    steal nothing, from the third on the table decides."""
    kw = dict(seed=2, hop_ns=HOP, learn=False)
    p = MalcolmPolicy(N, 0, steal_idle=True, **kw)
    ref = MalcolmPolicy(N, 0, steal_idle=False, **kw)
    for q in (p, ref):
        feed(q, 0, 3, 4)
        q.set_params(B_steal=np.array([-3.0, 0.0, 0.0, 0.0]))   # steal almost always
        feed(q, 100_000, 3, 4)
    assert complete(ref, 2) > 0                   # without the rule the table steals
    assert complete(p, 2) == 0                    # K' = -1, then 0: closed
    assert complete(p, 200) > 150                 # open from here: the table's draws
    # a publish closes it again
    feed(p, 200_000, 3, 4)
    assert complete(p, 1) == 0


def test_steal_idle_lowers_the_bar_for_an_overloaded_victim():
    """A victim loaded above the rack's mean by e (tasks / rate) is stolen from while
    K' >= ceil(1 - r e): own 10 tasks (K = -9), peer 1 with 40, peers 2 and 3 with 12 (mean
    18.5, e_1 = 21.5 tasks: bar -20; e_2 < 0: bar 1). The table draws the three peers alike;
    in the nine completions before the gate opens only peer 1 is stolen from, as often as
    the table draws it."""
    kw = dict(seed=3, hop_ns=HOP, learn=False)
    p = MalcolmPolicy(N, 0, steal_idle=True, **kw)
    ref = MalcolmPolicy(N, 0, steal_idle=False, **kw)
    r = 1.0 / T
    got = np.zeros(N, dtype=np.int64)
    want = np.zeros(N, dtype=np.int64)
    for q in (p, ref):
        q.set_params(B_steal=np.array([-3.0, 0.0, 0.0, 0.0]))
    for w in range(40):
        for q in (p, ref):
            q.py_observe_local(w * 100_000, 10 * T, 0.0, r)
            for j, tasks in ((1, 40), (2, 12), (3, 12)):
                q.py_observe_peer(w * 100_000, j, tasks * T, rate=r)
            q.py_end_window(w * 100_000)
        got += hooks.sample_many(p, "steal", 9)
        want += hooks.sample_many(ref, "steal", 9)
    assert got[2] == 0 and got[3] == 0            # below the mean: the gate's bar, closed
    assert want[2] > 0 and want[3] > 0
    # peer 1 as often as the same table draws it without the rule (same seed, same draws)
    assert got[1] == want[1] > 40


def test_rules_run_in_the_simulator_and_lose_no_task():
    """Both rules on a tiny rack at high load: every task completes (none dropped)."""
    sim = pytest.importorskip("malcolm.sim")
    r = sim.simulate(rack="2x1", policy="malcolm:shed=1,steal_idle=1", workload="bimodal",
                     load=0.9, tasks=20_000, seed=1, delay_us=5.0)
    assert r.completed == r.generated and r.measured > 0
    assert 0 < r.migrations < r.generated


# ---------------------------------------------------------------- speed_band (item 14)
def slow_and_fast(band=1.5, peer_tasks=0.0, peer_lg_factor=0.25, windows=None, **kw):
    """Server 0 (one worker) runs tasks in 4 T; its peers report speed codes of
    ``peer_lg_factor`` x 4 T (default T: four times faster), ``peer_tasks`` per worker
    (or, per window, the values of ``windows``; default two windows of ``peer_tasks``)."""
    import math
    p = MalcolmPolicy(N, 0, seed=4, hop_ns=HOP, learn=False, speed_band=band, **kw)
    t_me = 4 * T
    p.py_completions(1000, 1000 * math.log(t_me), 1000 * t_me)
    lg = round(256 * math.log2(t_me * peer_lg_factor))
    for w, tasks in enumerate(windows or (peer_tasks, peer_tasks)):
        now = w * 100_000
        p.py_observe_local(now, 0.0, 0.0, 1.0 / t_me)
        for j in range(1, N):
            t_j = t_me * peer_lg_factor
            p.py_observe_peer(now, j, tasks * t_j, rate=1.0 / t_j, svc_lg=lg)
        p.py_end_window(now)
    return p


def test_the_own_speed_code_comes_from_the_completions():
    import math
    p = slow_and_fast()
    assert p.svc_lg == round(256 * math.log2(4 * T))
    assert p.svc_mean_ns == pytest.approx(4 * T)
    assert p.py_heartbeat()["svc_lg"] == p.svc_lg
    fresh = MalcolmPolicy(N, 0, seed=4)
    fresh.py_completions(10, 10 * math.log(T), 10 * T)      # too few completions: not sent
    fresh.py_observe_local(0, 0.0, 0.0, 1.0 / T)
    assert fresh.svc_lg == 0 and fresh.py_heartbeat()["svc_lg"] == 0


def test_a_slow_server_keeps_nothing_outright_while_faster_peers_are_idle():
    """Idle here, idle peers four times faster: a kept task takes 4 T = 200 µs, a migrated
    one 10 + 50 µs, so the gate keeps none outright and every arrival follows the table.
    With speed_band=0 (the rule off), or peers of the same speed, the idle worker keeps
    the first arrival of each window, as the hop gate always did."""
    p = slow_and_fast()
    hooks.sample_many(p, "arrival", 2000)
    assert p.gated == 0 and p.speed_slower >= 1
    for q in (slow_and_fast(band=0.0), slow_and_fast(peer_lg_factor=1.0),
              slow_and_fast(peer_lg_factor=0.8)):          # 1.25x: within the band
        hooks.sample_many(q, "arrival", 2000)
        assert q.gated >= 1 and q.speed_slower == 0


def test_the_speed_rule_leaves_busy_peers_alone():
    """Peers with a task per worker (every worker busy) are not sent more: the gate is the
    hop gate's, and so it is for a server faster than its peers."""
    busy = slow_and_fast(peer_tasks=1.0)
    hooks.sample_many(busy, "arrival", 2000)
    assert busy.gated >= 1 and busy.speed_slower == 0
    fast = slow_and_fast(peer_lg_factor=4.0)
    hooks.sample_many(fast, "arrival", 2000)
    assert fast.gated >= 1 and fast.speed_slower == 0


def test_the_speed_shift_fades_as_the_peers_fill():
    """D = (t (rho b - 1) + w) (1 - u): here t = 4 T, rho = 1/4, b = 1.5. Idle peers (w = 0,
    u = 0): -2.5 T. Peers with half a task per worker wait w = T / 2 for one more task and
    are half busy: (-2.5 T + T / 2) / 2 = -T, not the cut to 0 of a busy limit at u = 0.5.
    A task per worker: 0."""
    got = [hooks.speed_shift(slow_and_fast(peer_tasks=u)) for u in (0.0, 0.5, 1.0)]
    assert got[0] == pytest.approx(-2.5 * T, rel=1e-2)
    assert got[1] == pytest.approx(-1.0 * T, rel=1e-2)
    assert got[2] == 0.0
    half = slow_and_fast(peer_tasks=0.5)
    hooks.sample_many(half, "arrival", 2000)
    assert half.speed_slower >= 1


def test_the_speed_closure_has_hysteresis():
    """Peers 0.6 busy: D = (-2.5 T + 0.6 T) 0.4 = -0.76 T, so h + D = -28 µs, within the
    hysteresis band (0.2 x 4 T = 40 µs) of the point where keeping and migrating finish
    alike. An open gate stays open there (the idle worker keeps an arrival), and a gate the
    idle peers closed stays closed; with idle peers it closes, and with busy ones it opens."""
    assert hooks.speed_shift(slow_and_fast(peer_tasks=0.6)) == pytest.approx(-0.76 * T, rel=1e-2)
    for seq, keeps in (((0.6, 0.6), True), ((0.0, 0.6), False), ((0.0, 0.0), False),
                       ((0.0, 1.0), True), ((0.6, 0.0), False)):
        p = slow_and_fast(windows=seq)
        hooks.sample_many(p, "arrival", 2000)
        assert (p.gated >= 1) == keeps, seq


def test_speed_band_is_checked():
    assert MalcolmPolicy(N, 0).speed_band == 1.5
    with pytest.raises(ValueError, match="speed_band"):
        MalcolmPolicy(N, 0, speed_band=0.5)
    with pytest.raises(ValueError, match="speed_band"):
        MalcolmPolicy(N, 0, speed_band=-1.0)


def test_a_slow_server_at_light_load_sends_its_work_to_a_fast_one():
    """The held-out rack of docs/policy.md, item 14: two 16-worker servers at speeds 0.5 and
    2.0 at 0.18 load. Without the rule each kept its own arrivals (0.1% migrated) and the
    p99 was 1.6x po2's; with it the slow server's work moves and the p99 falls."""
    from malcolm.sim import simulate

    kw = dict(rack="1x16@0.5,1x16@2.0", workload="fig2.1b", load=0.181, delay_us=5.0,
              tasks=60_000, seed=1)
    on = simulate(policy="malcolm", **kw).summary()
    off = simulate(policy="malcolm", policy_params=dict(speed_band=0.0), **kw).summary()
    assert on["migrations"] > 10 * max(off["migrations"], 1)
    assert on["p99_us"] < 0.8 * off["p99_us"]


# ------------------------------------------- the published bars against their formulas
def test_the_speed_ratio_table_is_exp2_to_the_bit():
    """mc_speed_ratio reads a table of 2^(d/256) for |d| <= 2048 and calls exp2 beyond: the
    same bits as exp2 everywhere, the table's edges included."""
    ds = list(range(-2100, 2101, 7)) + [-2049, -2048, -2047, -1, 0, 1, 2047, 2048, 2049, 9000]
    for d in ds:
        got, want = hooks.speed_ratio(6000 + d, 6000)
        assert got == want, d
    assert hooks.speed_ratio(7000, 7000) == (1.0, 1.0)


def _steal_bars_reference(x, r, off, hd):
    """GatewayRules._steal_thresholds as it was written before its C kernel: one bar per j."""
    import math
    xm = 0.0
    for v in x:
        xm += v
    xm /= len(x)
    out = []
    for v in x:
        t, e = 1.0, v - xm
        if r > 0.0 and e > 0.0:
            t = max(float(math.ceil(1.0 - r * e)), -1e9)
        e = max(e, 0.0)
        t = t - float(off) if hd >= 0.0 or hd + e >= 0.0 else 2147483647.0
        out.append(int(t))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_steal_bars_follow_their_formula(seed):
    """Random loads (every server known), rates, speed offsets and closures: every bar is
    the loop's that the kernel replaced (mc_pub_steal_bars), to the integer."""
    rng = np.random.default_rng(seed)
    n = 12
    p = MalcolmPolicy(n, 0, seed=seed, hop_ns=HOP, learn=False)
    x = (rng.exponential(3.0, n) * T).round(1)
    p.py_observe_local(0, x[0], 0.0, 1.0 / T)
    for j in range(1, n):
        p.py_observe_peer(0, j, x[j], rate=1.0 / T)
    assert list(p.loads) == list(x)
    for r, off, hd in [(1.0 / T, 0, 0.0), (3.0 / T, 0, 5.0), (1.0 / T, 7, -2.0 * T),
                       (0.0, 3, 1.0), (0.5 / T, 12, -0.5 * T), (2.0 / T, 0, -40.0 * T)]:
        assert hooks.steal_bars(p, r, off, hd) == _steal_bars_reference(x, r, off, hd)


def test_the_grant_bar_follows_its_formula():
    """Peers of mixed speed codes and loads: the bar is steal_grant hops plus grant_tasks own
    task times x the rate-weighted share of peers whose tasks fill their workers (t_j = t
    2^((code_j - code) / 256)), each compared as written before the speed-ratio table."""
    import math
    rng = np.random.default_rng(5)
    n, t_me = 10, 4 * T
    p = MalcolmPolicy(n, 0, seed=5, hop_ns=HOP, learn=False)
    p.py_completions(1000, 1000 * math.log(t_me), 1000 * t_me)
    p.py_observe_local(0, 0.0, 0.0, 1.0 / t_me)
    peers = []
    for j in range(1, n):
        f = float(rng.choice([0.25, 0.9, 1.0, 1.05, 3.0]))
        lg = 0 if j == 3 else round(256 * math.log2(t_me * f))     # one code not known
        rate = float(rng.uniform(0.5, 2.0)) / (t_me * f)
        load = float(rng.choice([0.0, 0.3, 0.95, 1.0, 2.5])) / rate
        p.py_observe_peer(0, j, load, rate=rate, svc_lg=lg)
        peers.append((load, rate, lg))
    t, code = p.svc_mean_ns, p.svc_lg
    assert t > 0 and code > 0
    rs = us = 0.0
    for load, rate, lg in peers:
        rs += rate
        c0 = rate * t * (2.0 ** ((lg - code) / 256) if lg else 1.0)
        us += rate if load * rate + 0.5 >= c0 else 0.0
    want = p.steal_grant * HOP + p.grant_tasks * t * us / rs
    assert 0 < us < rs and hooks.grant_bar(p, HOP) == int(want)
