"""Cost of a Sinkhorn-attention simulate step against a softmax step, and against POT.

Part 1 (steps): one RK4 step (4 field evaluations) of the particle flow for
``kind="sinkhorn"`` (eps = 1, d = 2, A = K^T Q non-symmetric, and a symmetric A) and for
``kind="softmax"`` with the same Q, K, V, on the same backend.  "cold" clears the
potentials before every evaluation; "warm" is what ``simulate`` does (the field is told
the index of each evaluation within the step, and each RK stage is predicted from the same
stage of the previous steps; Anderson secants reused); "*_stageless" is the earlier warm
start (extrapolation in t through the previous evaluations, stages mixed), measured in the
same run for comparison.  Reported: seconds
per step (median over the timed steps, after ``--warmup`` untimed warm steps, default 3;
one for softmax and cold), the ratio to the
softmax step, and Sinkhorn iterations / passes over all pairs per evaluation.

The same for the paper's time stepping, explicit Euler with h = 0.01 (one evaluation per
step; cases ``euler_warm`` and ``euler_warm_sym``, compared with an Euler softmax step).

Part 2 (POT): a cold solve of the same coupling (uniform weights, cost -s, eps = 1) by
this library and by ``ot.sinkhorn(..., method="sinkhorn_log")`` to the same accuracy
(log-domain marginal error 1e-9, i.e. POT's stopThr = 1e-9 / sqrt(N) on the L2 marginal
violation), with the achieved errors and the largest difference between the couplings.

From ``--large-from`` tokens on (default 30 000: a warm Sinkhorn step there takes about
ten minutes on 2 cores), the step costs are *estimated*, and labelled so: one softmax
pass and one lse pass are timed at that N, and a step is 4 evaluations of (iterations
per evaluation measured at the largest fully measured N) x (softmax + lse pass) for
Sinkhorn, 4 softmax passes for softmax.  ``--large-from 1e9`` measures everything.

Run:  python benchmarks/sinkhorn.py [--quick] [--backend numba] [--sizes 1000 10000 50000]
Writes benchmarks/results/sinkhorn.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

import transformer_pde as tp
from transformer_pde.fields import FieldEvaluator
from transformer_pde.integrate import RK4, Euler
from transformer_pde.sinkhorn import sinkhorn_potentials

Q = np.array([[1.0, 0.5], [-0.3, 0.8]])
K = np.eye(2)
Q_SYM = np.array([[1.0, 0.3], [0.3, -0.5]])       # A = K^T Q symmetric (indefinite)
V = np.array([[0.5, -0.5], [0.5, 0.2]])
DT = 0.1
EPS = 1.0
EULER_STEPS = 8       # timed Euler steps (h = 0.01) after EULER_WARMUP untimed ones
EULER_WARMUP = 4


def time_steps(att, X, backend, n_steps, cold=False, tol=1e-9, solver=None, dt=DT,
               warmup=1, staged=True):
    """Median (wall, CPU) seconds per step after ``warmup`` untimed steps, and the iterations.

    CPU time (all threads of this process) is the cost measure: unlike wall time it does
    not depend on what else runs on a shared machine.
    """
    ev = FieldEvaluator(att, X.shape[0], backend=backend, sinkhorn_tol=tol)
    be = ev.be

    stage = [None]

    def field(t, y):
        # as simulate does: pass the index of the evaluation within the step
        ev.stage = stage[0]
        if stage[0] is not None:
            stage[0] += 1
        if cold:
            ev.state.clear()
        return ev(t, y)

    y = be.asarray(X, np.float64)
    solver = RK4() if solver is None else solver
    t = 0.0
    walls, cpus = [], []
    n_warm = 0
    for k in range(n_steps + warmup):
        stage[0] = 0 if staged else None
        t0, c0 = time.perf_counter(), time.process_time()
        y = solver.step(field, t, y, dt)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        t += dt
        if k < warmup:
            n_warm = len(ev.info.get("sinkhorn_iterations", []))
        else:
            walls.append(wall)
            cpus.append(cpu)
    its = ev.info.get("sinkhorn_iterations", [])[n_warm:]
    return float(np.median(walls)), float(np.median(cpus)), its


def estimate_large(n, backend, ref, rng):
    """Step costs at large ``n`` from timed single passes and the reference iteration counts."""
    from transformer_pde.backends import get_backend
    be = get_backend(backend)
    X = rng.normal(size=(n, 2))
    bias = np.full(n, -np.log(n))
    qx = X @ (K.T @ Q).T
    t0, c0 = time.perf_counter(), time.process_time()
    be.softmax(qx, X, X @ V.T, bias, None)
    t_soft, c_soft = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    be.lse(qx, X, bias, None)
    t_lse, c_lse = time.perf_counter() - t0, time.process_time() - c0
    row = {"n": n, "estimated": True, "softmax_pass_s": t_soft, "lse_pass_s": t_lse,
           "softmax_pass_cpu_s": c_soft, "lse_pass_cpu_s": c_lse,
           "iterations_from_n": ref["n"], "softmax_s": 4 * t_soft, "softmax_cpu_s": 4 * c_soft}
    its = ref["warm"]["iters_per_eval_mean"]
    sec = 4 * its * (t_soft + t_lse)
    cpu = 4 * its * (c_soft + c_lse)
    row["warm"] = {"s_per_step": sec, "cpu_s_per_step": cpu,
                   "ratio_to_softmax": cpu / row["softmax_cpu_s"],
                   "iters_per_eval_mean": its, "iters_per_eval_max": ref["warm"]["iters_per_eval_max"],
                   "passes_per_eval_mean": 2 * its, "iters_per_step_mean": 4 * its}
    return row


def case_row(sec, cpu, its, softmax_cpu, symmetric, n_steps):
    """One table entry: times, CPU ratio to softmax, iterations and passes per evaluation."""
    passes = np.asarray(its, float) * (1 if symmetric else 2)
    return {"s_per_step": sec, "cpu_s_per_step": cpu, "ratio_to_softmax": cpu / softmax_cpu,
            "iters_per_eval_mean": float(np.mean(its)), "iters_per_eval_max": int(np.max(its)),
            "passes_per_eval_mean": float(passes.mean()),
            "iters_per_step_mean": float(np.sum(its) / n_steps)}


def part_steps(sizes, backend, steps, large_from, rng, warmup=3):
    rows = []
    for n in sizes:
        if n >= large_from and rows:
            rows.append(estimate_large(n, backend, rows[-1], rng))
            print(f"  N={n}: done (estimated)", flush=True)
            continue
        X = rng.normal(size=(n, 2))
        ns = steps
        row = {"n": n, "steps_timed": ns}
        sm = tp.Attention("softmax", Q, K, V)
        row["softmax_s"], row["softmax_cpu_s"], _ = time_steps(sm, X, backend, ns, warmup=1)
        cases = [("warm", Q, False, 1e-9, True), ("warm_stageless", Q, False, 1e-9, False),
                 ("cold", Q, True, 1e-9, True), ("warm_sym", Q_SYM, False, 1e-9, True),
                 ("warm_sym_stageless", Q_SYM, False, 1e-9, False),
                 ("warm_tol1e-6", Q, False, 1e-6, True)]
        for name, Qm, cold, tol, staged in cases:
            att = tp.Attention("sinkhorn", Qm, K, V, eps=EPS)
            sec, cpu, its = time_steps(att, X, backend, ns, cold=cold, tol=tol, staged=staged,
                                       warmup=1 if cold else warmup)
            row[name] = case_row(sec, cpu, its, row["softmax_cpu_s"], "sym" in name, ns)
        # the paper's time stepping: explicit Euler, h = 0.01 (one evaluation per step)
        row["euler_softmax_s"], row["euler_softmax_cpu_s"], _ = time_steps(
            sm, X, backend, EULER_STEPS, solver=Euler(), dt=0.01, warmup=EULER_WARMUP)
        for name, Qm, staged in (("euler_warm", Q, True), ("euler_warm_stageless", Q, False),
                                 ("euler_warm_sym", Q_SYM, True),
                                 ("euler_warm_sym_stageless", Q_SYM, False)):
            att = tp.Attention("sinkhorn", Qm, K, V, eps=EPS)
            sec, cpu, its = time_steps(att, X, backend, EULER_STEPS, solver=Euler(), dt=0.01,
                                       warmup=EULER_WARMUP, staged=staged)
            row[name] = case_row(sec, cpu, its, row["euler_softmax_cpu_s"],
                                 "sym" in name, EULER_STEPS)
        rows.append(row)
        print(f"  N={n}: done", flush=True)
    return rows


def part_pot(sizes, backend, rng):
    try:
        import ot
    except ImportError:
        return []
    from transformer_pde.backends import get_backend
    be = get_backend(backend)
    out = []
    for n in sizes:
        X = rng.normal(size=(n, 2))
        w = np.full(n, 1.0 / n)
        logw = np.log(w)
        qx = X @ (K.T @ Q).T
        sinkhorn_potentials(be, qx[:64], X[:64], logw[:64], EPS)   # compile outside timing
        t0, c0 = time.perf_counter(), time.process_time()
        res = sinkhorn_potentials(be, qx, X, logw, EPS, tol=1e-9)
        t_ours, c_ours = time.perf_counter() - t0, time.process_time() - c0
        S = qx @ X.T
        M = -S
        t0, c0 = time.perf_counter(), time.process_time()
        pi_pot = ot.sinkhorn(w, w, M, EPS, method="sinkhorn_log", numItermax=100_000,
                             stopThr=1e-9 / np.sqrt(n))
        t_pot, c_pot = time.perf_counter() - t0, time.process_time() - c0
        f, g = be.to_numpy(res.f), be.to_numpy(res.g)
        logpi = logw[:, None] + logw[None, :] + (f[:, None] + g[None, :] + S) / EPS
        pi = np.exp(logpi)

        def logerr(p, w=w):
            return float(max(np.abs(np.log(p.sum(1) / w)).max(),
                             np.abs(np.log(p.sum(0) / w)).max()))

        out.append({"n": n, "ours_s": t_ours, "pot_s": t_pot, "speedup": t_pot / t_ours,
                    "ours_cpu_s": c_ours, "pot_cpu_s": c_pot, "speedup_cpu": c_pot / c_ours,
                    "ours_iters": res.n_iter, "ours_logerr": logerr(pi),
                    "pot_logerr": logerr(pi_pot),
                    "max_abs_diff_rel": float(np.abs(pi - pi_pot).max() / pi.max())})
        del S, M, pi, pi_pot, logpi
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    p.add_argument("--backend", default="numba")
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 50_000])
    p.add_argument("--steps", type=int, default=3, help="timed RK4 steps per case")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed warm RK4 steps before the timed ones (the per-stage "
                        "prediction reaches its full degree after 4 steps)")
    p.add_argument("--large-from", type=float, default=30_000,
                   help="estimate (not time) the steps from this N on")
    p.add_argument("--pot-sizes", type=int, nargs="+", default=[1_000, 5_000])
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "sinkhorn.json"))
    a = p.parse_args(argv)
    if a.quick:
        a.sizes, a.pot_sizes, a.steps = [500, 2_000], [500], 2
    rng = np.random.default_rng(0)
    tp.velocity(tp.Attention("softmax", Q, K, V), rng.normal(size=(64, 2)), backend=a.backend)
    tp.velocity(tp.Attention("sinkhorn", Q, K, V), rng.normal(size=(64, 2)), backend=a.backend)
    print(f"backend={a.backend}, d=2, eps={EPS}, RK4 dt={DT}, float64, "
          f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})")
    rows = part_steps(a.sizes, a.backend, a.steps, a.large_from, rng, a.warmup)
    print("\nwall seconds per step (RK4 dt=0.1: 4 evaluations; euler_*: Euler h=0.01, one; "
          "softmax column: the softmax step of the same method);\nratio = sinkhorn / softmax in CPU "
          "time (all threads; robust to other load);\nit/ev = Sinkhorn iterations per "
          "evaluation (mean), pass/ev = passes over all pairs, it/step = iterations per step")
    hdr = f"{'N':>7} {'softmax':>9} | {'case':<24} {'s/step':>9} {'ratio':>7} {'it/ev':>6} " \
          f"{'pass/ev':>7} {'it/step':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        first = True
        for name in ("warm", "warm_stageless", "cold", "warm_sym", "warm_sym_stageless",
                     "warm_tol1e-6", "euler_warm", "euler_warm_stageless", "euler_warm_sym",
                     "euler_warm_sym_stageless"):
            if name not in r:
                continue
            c = r[name]
            base = r["euler_softmax_s"] if name.startswith("euler") else r["softmax_s"]
            lead = f"{r['n']:>7} {base:>9.3f}" if first or name == "euler_warm" else " " * 17
            label = name + (" (est.)" if r.get("estimated") else "")
            print(f"{lead} | {label:<24} {c['s_per_step']:>9.3f} {c['ratio_to_softmax']:>7.1f} "
                  f"{c['iters_per_eval_mean']:>6.1f} {c['passes_per_eval_mean']:>7.1f} "
                  f"{c['iters_per_step_mean']:>7.1f}")
            first = False
    pot = part_pot(a.pot_sizes, a.backend, rng)
    if pot:
        print("\ncold solve of the same coupling to log-marginal error 1e-9: this library "
              f"({a.backend}) vs POT ot.sinkhorn(method='sinkhorn_log')")
        print(f"{'N':>6} {'ours s':>8} {'POT s':>8} {'speedup':>8} {'cpu x':>6} {'ours err':>9} "
              f"{'POT err':>9} {'|dpi|/max':>9}")
        for r in pot:
            print(f"{r['n']:>6} {r['ours_s']:>8.3f} {r['pot_s']:>8.3f} {r['speedup']:>8.1f} "
                  f"{r['speedup_cpu']:>6.1f} "
                  f"{r['ours_logerr']:>9.1e} {r['pot_logerr']:>9.1e} "
                  f"{r['max_abs_diff_rel']:>9.1e}")
    res = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor(),
                       "platform": platform.platform()},
           "backend": a.backend, "d": 2, "eps": EPS, "dt": DT, "method": "rk4",
           "warmup_steps": a.warmup, "Q": Q.tolist(), "K": K.tolist(), "Q_sym": Q_SYM.tolist(), "V": V.tolist(),
           "steps": rows, "pot": pot}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
