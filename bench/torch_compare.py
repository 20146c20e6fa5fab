"""Thesis Table 6.1: Malcolm's native policy step next to the same computation in PyTorch.

For each rack size N it times, per call:

* distribution update: both actors' logits W x + B (the whole product, as a framework would
  do it) and their softmax;
* parameter update: one window's actor-critic step (features, payoff, TD error, critic and
  both actors' gradients by autograd) plus an AdamW step over all parameters, i.e. a
  batch-ending window; the native figure is ``param_update_ns.N`` of ``bench_policy``.

The torch step computes the same losses as the native code (checked against it on one
window before timing), on the CPU, in double precision, one thread, eager mode.

torch is optional (``pip install torch==2.13.0`` installs a CPU build here); without it the
script prints the native figures and says that torch is missing.

    python3 bench/torch_compare.py [--iters 2000] [--json [FILE|-]]
"""

import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from malcolm.bench.policy import bench_policy  # noqa: E402
from malcolm.policy._testing import sample_many, step  # noqa: E402
from malcolm.policy.actor_critic import THESIS, MalcolmPolicy  # noqa: E402

from malcolm import _argparse as g  # noqa: E402

SIZES = (4, 8, 16, 32)


def torch_step_fns(torch, n, p):
    """Build the torch model of ``MalcolmPolicy`` p; return (dist_fn, param_fn, check_fn)."""
    dt = torch.float64
    theta = torch.tensor(p.theta, dtype=dt, requires_grad=True)
    Wm = torch.tensor(p.W_migrate, dtype=dt, requires_grad=True)
    Bm = torch.tensor(p.B_migrate, dtype=dt, requires_grad=True)
    Ws = torch.tensor(p.W_steal, dtype=dt, requires_grad=True)
    Bs = torch.tensor(p.B_steal, dtype=dt, requires_grad=True)
    params = [theta, Wm, Bm, Ws, Bs]
    groups = [dict(params=[theta], lr=p.critic_lr), dict(params=[Wm, Bm, Ws, Bs], lr=p.actor_lr)]
    opt = torch.optim.AdamW(groups, betas=(p.beta1, p.beta2), eps=p.eps,
                            weight_decay=p.weight_decay)
    gamma, ent = p.gamma, p.entropy
    mc, sc = p.migration_cost, p.steal_cost

    symmetric = p.features_kind == "symmetric"

    def features(u):
        mean = u.mean()
        imb = (u[:, None] - u[None, :]).abs().sum() / (n - 1)
        head = [torch.ones(1, dtype=dt), imb.reshape(1)]
        if symmetric:
            return torch.cat(head + [torch.stack([mean, u.max() - mean, mean - u.min()])]), imb
        return torch.cat(head + [u, (u - mean).abs()]), imb

    def dist(u):
        with torch.no_grad():
            return torch.softmax(Wm @ u + Bm, 0), torch.softmax(Ws @ u + Bs, 0)

    def losses(u_prev, u_cur, km, ks, own_mig, own_stl):
        f_prev, _ = features(u_prev)
        f_cur, imb = features(u_cur)
        payoff = -imb - mc * own_mig - sc * own_stl
        with torch.no_grad():
            delta = payoff + gamma * (theta @ f_cur) - theta @ f_prev
        critic = 0.5 * (theta @ f_prev - (payoff + gamma * (theta @ f_cur)).detach()) ** 2
        total = critic
        for W, B, k in ((Wm, Bm, km), (Ws, Bs, ks)):
            logp = torch.log_softmax(W @ u_prev + B, 0)
            pi = logp.exp()
            total = total - delta * (k * logp).sum() / k.sum() - ent * -(pi * logp).sum()
        return total, delta

    def param(u_prev, u_cur, km, ks, own_mig, own_stl, step=True):
        opt.zero_grad(set_to_none=True)
        loss, _ = losses(u_prev, u_cur, km, ks, own_mig, own_stl)
        loss.backward()
        if step:
            opt.step()

    def grads(u_prev, u_cur, km, ks, own_mig, own_stl):
        for q in params:
            q.grad = None
        loss, delta = losses(u_prev, u_cur, km, ks, own_mig, own_stl)
        loss.backward()
        return [q.grad.detach().numpy().copy() for q in params], float(delta)

    return dist, param, grads


def check_against_native(torch, n):
    """One window through both implementations; the gradients must agree."""
    S = 50_000.0
    p = MalcolmPolicy(n, 0, seed=5, consensus_every=0, **{**THESIS, "batch_windows": 10_000})
    rng = np.random.default_rng(2)
    la = rng.uniform(0, 4, n)
    lb = rng.uniform(0, 4, n)
    step(p, 0, la[0] * S, list(la * S))
    km = sample_many(p, "arrival", 40).astype(float)
    ks = sample_many(p, "steal", 40).astype(float)
    p.migrations += int(km.sum() - km[0])
    p.steals += int(ks.sum() - ks[0])
    _, _, grads = torch_step_fns(torch, n, p)
    g, delta = grads(torch.tensor(la, dtype=torch.float64), torch.tensor(lb, dtype=torch.float64),
                     torch.tensor(km, dtype=torch.float64), torch.tensor(ks, dtype=torch.float64),
                     km.sum() - km[0], ks.sum() - ks[0])
    step(p, 1, lb[0] * S, list(lb * S))
    native = p.grad_cache
    d = p.n_theta
    nn = n * n
    ref = np.concatenate([g[0], g[1].T.ravel(), g[2], g[3].T.ravel(), g[4]])
    assert abs(p.last_td_error - delta) <= 1e-9 * max(1.0, abs(delta)), (p.last_td_error, delta)
    np.testing.assert_allclose(native, ref, rtol=1e-7, atol=1e-10)
    return d + 2 * (nn + n)


def time_torch(torch, n, iters):
    p = MalcolmPolicy(n, 0, seed=5, **THESIS)
    dist, param, _ = torch_step_fns(torch, n, p)
    rng = np.random.default_rng(3)
    us = [torch.tensor(rng.uniform(0, 4, n), dtype=torch.float64) for _ in range(64)]
    km = torch.tensor(rng.integers(0, 5, n), dtype=torch.float64) + 1
    ks = torch.tensor(rng.integers(0, 5, n), dtype=torch.float64) + 1
    for i in range(50):
        dist(us[i & 63])
        param(us[i & 63], us[(i + 1) & 63], km, ks, 3.0, 1.0)
    t0 = time.perf_counter()
    for i in range(iters):
        dist(us[i & 63])
    t_dist = (time.perf_counter() - t0) / iters
    t0 = time.perf_counter()
    for i in range(iters):
        param(us[i & 63], us[(i + 1) & 63], km, ks, 3.0, 1.0)
    t_param = (time.perf_counter() - t0) / iters
    t0 = time.perf_counter()
    for i in range(iters):
        param(us[i & 63], us[(i + 1) & 63], km, ks, 3.0, 1.0, step=False)
    t_grad = (time.perf_counter() - t0) / iters
    return t_dist * 1e9, t_param * 1e9, t_grad * 1e9


def main():
    ap = g.parser(__doc__, """
        python3 bench/torch_compare.py --iters 3000 --native-iters 200000
        python3 bench/torch_compare.py --json out/figures/table6_1.json""")
    ap.add_argument("--iters", type=int, default=2000,
                    help="torch calls per measurement (default 2000)")
    ap.add_argument("--native-iters", type=int, default=200_000,
                    help="native calls per measurement (default 200000)")
    g.add_json(ap, "the figures per N")
    a = ap.parse_args()
    g.json_stdout(a)
    # Native figures first: importing torch starts its thread pools, which share the cores.
    native = {n: min((bench_policy(n, a.native_iters) for _ in range(5)),
                     key=lambda r: r[f"param_update_ns.{n}"]) for n in SIZES}
    try:
        import torch
    except ImportError:
        torch = None
        print("torch is not installed: native figures only "
              "(pip install torch==2.13.0 for the comparison)", file=sys.stderr)
    if torch is not None:
        torch.set_num_threads(1)
    out = {}
    print(f"{'N':>3} {'native dist µs':>15} {'native param µs':>16} "
          f"{'torch dist µs':>14} {'torch param µs':>15} {'(of which grad)':>16}")
    for n in SIZES:
        nat = native[n]
        row = dict(native_dist_update_ns=nat[f"dist_update_ns.{n}"],
                   native_param_update_ns=nat[f"param_update_ns.{n}"])
        if torch is not None:
            row["params"] = check_against_native(torch, n)
            td, tp, tg = time_torch(torch, n, a.iters)
            row.update(torch_dist_update_ns=td, torch_param_update_ns=tp, torch_grad_ns=tg)
        out[n] = row
        tds = f"{row['torch_dist_update_ns'] / 1e3:14.2f}" if torch else f"{'-':>14}"
        tps = f"{row['torch_param_update_ns'] / 1e3:15.2f}" if torch else f"{'-':>15}"
        tgs = f"{row['torch_grad_ns'] / 1e3:16.2f}" if torch else f"{'-':>16}"
        print(f"{n:3d} {row['native_dist_update_ns'] / 1e3:15.3f} "
              f"{row['native_param_update_ns'] / 1e3:16.3f} {tds} {tps} {tgs}")
    if torch is not None:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, float64, eager; "
              "gradients checked equal to the native step before timing", file=sys.stderr)
    g.write_json(a, {str(n): row for n, row in out.items()})


if __name__ == "__main__":
    main()
