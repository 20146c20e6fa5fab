"""Malcolm's policy parameters: the defaults, Algorithm 1's settings, and their validation.

Pure Python, so that configuration code and ``malcolm list`` read them without the native
build; ``malcolm.policy.actor_critic`` re-exports ``DEFAULTS`` and ``THESIS``.
"""
import math

import numpy as np

from malcolm.policy.registry import unknown_params_error

__all__ = ["DEFAULTS", "THESIS", "check_params"]

DEFAULTS = dict(
    window_ns=100_000,
    batch_windows=0,            # AdamW every K windows; 0: four learning windows a step,
                                # 4 x learn_every (0.4 ms below 32 servers, 1.6 on 64)
    learn_every=0,              # learning step on one window in K; 0: K = max(1, n // 16)
    consensus_every=16,
    gamma=0.9,
    critic_lr=0.05,
    actor_lr=0.003,             # the actors' biases
    cold_lr=0.015,              # ... through a cold start, the first beta2_steps steps (item
    #                             19: its last 5-10% took 100-300 ms at actor_lr); 0: actor_lr
    lr_boost=30.0,              # actors' step x up to this where the gradients agree; 1: off
                                # (seventh session: re-converges within 50 ms, docs/policy.md)
    weight_boost=-1.0,          # the same for the sparse actors' load weights; < 1: lr_boost
    accept_lr=0.0,              # sparse actors: the own outcome's bias and weight (0: kept at
                                # the safe start; the live gate decides what a hop saves)
    tilt_max=0.5,               # |tilt| <= this (with trust > 0)
    tilt_lr=0.0,                # > 0: learn the capacity tilt, peer logit_j += t log r_j (centred)
    weight_lr=0.001,            # sparse actors' load weights (their state-dependent part),
    #                             whose gradients carry the loads' noise (item 19); < 0: actor_lr
    weight_decay=1e-4,
    beta1=0.95,                 # 0.9 before the seventh session (with lr_boost: fewer noisy boosts)
    beta2=0.999,
    beta2_decay=0.8,            # AdamW's second-moment rate at step t: min(beta2, 1 - t^-0.8),
    #                             Adafactor's schedule (item 18); 0: beta2 throughout
    beta2_steps=250,            # ... through the first 250 steps, beta2 after; 0: every step
    eps=1e-8,
    migration_cost=0.01,
    steal_cost=0.01,
    entropy=0.3,
    features="symmetric",
    init="safe",
    init_scale=0.02,
    load_scale=0.0,             # 0: derived from the service rates heartbeats report
    load_clip=32.0,
    learn=True,
    actor="sparse",             # "full": the thesis's dense n x n actor weights
    actor_input="absolute",     # "full" only; "relative": inputs u_j - u_me (experimental)
    # The per-agent difference advantage is the default; "td" is Algorithm 1's TD-error
    # actor, kept for fidelity (see docs/policy.md, "Deviations").
    advantage="difference",
    herd=0.5,                   # > 0: the herd term in the migrate advantages (stale or
    #                             simultaneous reports; docs/policy.md, "The default policy")
    herd_busy=4.0,              # ... times the peers' busy share to this power (0: unscaled)
    hop_ns=-1.0,                # < 0: one-way delay measured from heartbeats
    hop_weight=0.3,             # the hop's weight in the actors' advantages (not the gate)
    hop_cap=1.0,                # weighted hop <= this x (s_i + s_me) in an advantage; 0: off
    capacity_prior=True,        # migrate logits += the capacity prior (capacity shares)
    hop_gate=True,              # accept while a local task would wait no longer than a hop
    mask_factor=2.0,            # 0 disables the overload mask
    stale_after=1.0,            # while no peer sent a heartbeat within (1 + this) x its
    #                             period, no load steers the sparse actors (lost heartbeats;
    #                             docs/policy.md, item 22); < 0: off
    gate_live=True,             # the hop gate follows the own queue between publishes
    shed=-1.0,                  # >= 0: send an arrival away while keeping waits this many
    #                             own task times longer than a hop plus a peer's wait (off)
    shed_runaway=16.0,          # ... or this many own task times a worker, whichever is less:
    #                             a queue the runaway reset would see (0: off; docs/policy.md)
    gate_residual=True,         # the gate counts a busy worker's residual service, from its
    #                             measured variability (docs/policy.md, item 17); False: a
    #                             whole task time, M/M/c's (items 1-16)
    speed_band=1.5,             # the gate weighs a per-task speed differing by more than this
    #                             factor from the peers' (their worker counts in heartbeats); 0: off
    steal_idle=True,            # steal only into an open gate, or from a peer above the mean
    steal_grant=2.0,            # victim: give a task only if its waiting work >= this many hops;
    #                             0: every steal granted (the sixteenth session's)
    grant_tasks=1.0,            # ... plus this many own mean task times x the peers' share
    #                             with no worker idle (a thief's next arrivals queue behind
    #                             it); 0: off, the twenty-ninth session's default
    stolen_first=False,         # True: a stolen task runs before the tasks waiting here (it
    #                             has waited longest); measured, not the default (docs/policy.md)
    steal_state="decision",     # a steal's advantage at the own queue where it went ahead;
    #                             "window": at the window's end (the fourteenth session's)
    trust=8.0,                  # 0 disables the trust region around the initial actors
    runaway_windows=20,         # 0 disables the runaway reset
    theta_bound=1000.0,         # peers' critics with a larger norm are refused
    consensus="median",         # "mean": the thesis's average (one bad peer moves it)
)


# Algorithm 1 as the thesis specifies it: TD-error actors with dense W, a fixed load_scale
# (the workload's 50 µs mean), random start, entropy bonus, the mean for consensus, none of the
# guards. ``MalcolmPolicy(n, me, **THESIS)``; the defaults differ for the reasons in
# docs/policy.md ("The default policy").
THESIS = dict(advantage="td", actor="full", entropy=0.1, init="random", load_scale=50_000.0,
              load_clip=8.0, actor_lr=0.001, capacity_prior=False, mask_factor=0.0, trust=0.0,
              runaway_windows=0, shed_runaway=0.0, stale_after=-1.0, hop_ns=0.0,
              consensus="mean", hop_gate=False, lr_boost=1.0, beta1=0.9, beta2_decay=0.0,
              cold_lr=0.0, herd=0.0, batch_windows=16)


def _as_bool(name, v):
    truthy, falsy = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
    if isinstance(v, str) and v.strip().lower() in truthy + falsy:
        return v.strip().lower() in truthy
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v in (0, 1):
        return bool(v)      # what `malcolm:learn=0` on the command line gives
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"MalcolmPolicy: {name} must be a bool (or 0/1), got {v!r}")
    return bool(v)


def check_params(params):
    """Validate ``params`` against ``DEFAULTS``; return the full, typed configuration."""
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:     # a TypeError, as for any unknown keyword argument
        raise unknown_params_error("malcolm", unknown, sorted(DEFAULTS))
    cfg = dict(DEFAULTS)
    cfg.update(params)

    def num(name, lo=None, hi=None, lo_open=False, hi_open=False):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"MalcolmPolicy: {name} must be a number, got {v!r}")
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"MalcolmPolicy: {name} must be finite, got {v}")
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise ValueError(f"MalcolmPolicy: {name}={v} must be {'>' if lo_open else '>='} {lo}")
        if hi is not None and (v >= hi if hi_open else v > hi):
            raise ValueError(f"MalcolmPolicy: {name}={v} must be {'<' if hi_open else '<='} {hi}")
        cfg[name] = v

    def integer(name, lo):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise TypeError(f"MalcolmPolicy: {name} must be an integer, got {v!r}")
        if v < lo:
            raise ValueError(f"MalcolmPolicy: {name}={v} must be >= {lo}")
        cfg[name] = int(v)

    def choice(name, *allowed):
        if cfg[name] not in allowed:
            quoted = [repr(a) for a in allowed]
            listed = ", ".join(quoted[:-1]) + " or " + quoted[-1]
            raise ValueError(f"MalcolmPolicy: {name} must be {listed}, got {cfg[name]!r}")

    integer("window_ns", 1)
    integer("batch_windows", 0)
    integer("learn_every", 0)
    integer("consensus_every", 0)
    num("gamma", 0.0, 1.0, hi_open=True)
    num("critic_lr", 0.0)
    num("actor_lr", 0.0)
    num("cold_lr", 0.0)
    num("herd", 0.0, 10.0)
    num("herd_busy", 0.0, 16.0)
    num("lr_boost", 1.0)
    num("weight_boost", -1.0)
    num("accept_lr", 0.0)
    num("tilt_lr", 0.0)
    num("tilt_max", 0.0)
    num("weight_lr", -1.0)
    num("weight_decay", 0.0)
    num("beta1", 0.0, 1.0, hi_open=True)
    num("beta2", 0.0, 1.0, hi_open=True)
    num("beta2_decay", 0.0, 1.0)
    integer("beta2_steps", 0)
    num("eps", 0.0, lo_open=True)
    num("migration_cost", 0.0)
    num("steal_cost", 0.0)
    num("entropy", 0.0)
    # the random start's weights are uniform in +-init_scale on inputs clipped to +-ZCLIP:
    # past a few hundred every logit saturates, and past 1e307 numpy's draw overflowed (the
    # message then blamed an integer)
    num("init_scale", 0.0, 1000.0)
    num("load_scale", 0.0)
    num("load_clip", 0.0, lo_open=True)
    num("hop_ns", -1.0)
    num("hop_weight", 0.0)
    num("hop_cap", 0.0)
    num("shed")
    num("shed_runaway", 0.0, 1e6)
    num("mask_factor", 0.0)
    num("stale_after", -1.0, 1e6)
    num("steal_grant", 0.0, 1000.0)
    num("grant_tasks", 0.0, 1000.0)
    num("speed_band", 0.0)
    if 0.0 < cfg["speed_band"] < 1.0:
        raise ValueError(f"MalcolmPolicy: speed_band={cfg['speed_band']} must be 0 (off) or >= 1")
    num("trust", 0.0)
    num("theta_bound", 0.0, lo_open=True)
    integer("runaway_windows", 0)
    choice("features", "symmetric", "per_server")
    choice("actor", "sparse", "full")
    choice("actor_input", "absolute", "relative")
    choice("advantage", "td", "marginal", "difference")
    choice("consensus", "median", "mean")
    choice("steal_state", "decision", "window")
    choice("init", "safe", "random", "zero")
    cfg["learn"] = _as_bool("learn", cfg["learn"])
    cfg["capacity_prior"] = _as_bool("capacity_prior", cfg["capacity_prior"])
    cfg["hop_gate"] = _as_bool("hop_gate", cfg["hop_gate"])
    cfg["gate_live"] = _as_bool("gate_live", cfg["gate_live"])
    cfg["steal_idle"] = _as_bool("steal_idle", cfg["steal_idle"])
    cfg["gate_residual"] = _as_bool("gate_residual", cfg["gate_residual"])
    cfg["stolen_first"] = _as_bool("stolen_first", cfg["stolen_first"])
    return cfg


