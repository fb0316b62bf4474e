"""Cost of a Sinkhorn-attention simulate step against a softmax step (and, optionally, POT).

Setting: d = 2, eps = 1, float64, Numba backend, Sinkhorn tolerance 1e-9 (log-domain
marginal error), Q = [[1, .5], [-.3, .8]], K = I (A = K^T Q non-symmetric; "sym" uses a
symmetric indefinite A), V = [[.5, -.5], [.5, .2]], N tokens from a standard normal.

Measured, all in one run (so the ratios share the machine's load; the 1-minute load
average is printed and stored):

* pass costs: one softmax pass (values), one lse pass, one fused Sinkhorn sweep (a whole
  alternating iteration in one pass, the backend's ``sinkhorn_sweep``), CPU seconds;
* RK4 dt = 0.1 steps (4 evaluations each), as ``simulate`` runs them (per-stage warm
  start, reused Anderson secants): "warm" (general A), "warm_two_pass" (the same with the
  fused sweep switched off: two log-domain passes per iteration), "warm_sym"
  (symmetric A: one pass per iteration), each against a softmax RK4 step; and explicit
  Euler h = 0.01 (the paper's stepping) "euler_warm" against a softmax Euler step;
* where the passes go: iterations per evaluation (mean, per RK stage), the marginal error
  of each stage's warm start (how good the prediction is) and the iterations of every
  evaluation along the run.

Ratios are CPU-time ratios (all threads of this process): less sensitive than wall time
to other processes on a shared machine, though not immune (caches, hyper-threads).  A
step is timed after ``--warmup`` untimed steps (default 14: the per-stage prediction
reaches its full degree, 9, after 11 steps; Euler: 16 steps), ``--steps`` of them (default
8: the iterations of one evaluation move by one or two from step to step, so a window of
16 evaluations moves by about 0.2 per evaluation between variants that differ by less
over a whole run; the iteration counts of the whole run are printed too: they change
along the run as the tokens move).

``--candidates`` measures, instead, variants of the warm general-A RK4 solve that were
candidates for cutting its passes (iterations per evaluation by RK stage are deterministic;
the CPU ratios to an interleaved softmax step are as noisy as the machine): the default
(Anderson memory 10, secants reused across solves), memory 20, "fresh secants" (the
secants of earlier solves are dropped once the solve has stored its first own pair), no
secant reuse at all, and "nystrom300" (a Newton correction on a Nystrom model of the
Jacobian: the linearised fixed-point problem solved on 300 sampled tokens, carried to all
tokens by one softmax pass over the samples, and handed to Anderson as the residual;
its small dense solves go through BLAS, whose spinning threads its CPU time includes).
Its results go to ``benchmarks/results/sinkhorn_candidates.json``.

Run:  PYTHONPATH=$PWD python benchmarks/sinkhorn.py            (about 4 minutes, 2 cores)
      PYTHONPATH=$PWD python benchmarks/sinkhorn.py --pot      (+ a cold solve against POT)
      PYTHONPATH=$PWD python benchmarks/sinkhorn.py --candidates --n 2000
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
import transformer_pde.sinkhorn as sk
import transformer_pde.sinkhorn.field as sk_field
from transformer_pde.backends import get_backend
from transformer_pde.fields import FieldEvaluator
from transformer_pde.integrate import RK4, Euler
from transformer_pde.sinkhorn import sinkhorn_potentials

Q = np.array([[1.0, 0.5], [-0.3, 0.8]])
K = np.eye(2)
Q_SYM = np.array([[1.0, 0.3], [0.3, -0.5]])       # A = K^T Q symmetric (indefinite)
V = np.array([[0.5, -0.5], [0.5, 0.2]])
DT = 0.1
EPS = 1.0
TOL = 1e-9


class Recorder:
    """Wraps ``sinkhorn_potentials`` to keep every solve's error history."""

    def __init__(self):
        self.errors: list[list[float]] = []
        self._orig = sk_field.sinkhorn_potentials

    def __enter__(self):
        def wrapped(*a, **k):
            res = self._orig(*a, **k)
            self.errors.append(list(res.errors))
            return res
        sk_field.sinkhorn_potentials = wrapped      # what sinkhorn_field calls
        return self

    def __exit__(self, *exc):
        sk_field.sinkhorn_potentials = self._orig


class NoFusion:
    """Switches the fused sweep off (two log-domain passes per iteration)."""

    def __enter__(self):
        self._orig = sk.FusedSweep.applies
        sk.FusedSweep.applies = staticmethod(lambda be, logw: False)

    def __exit__(self, *exc):
        sk.FusedSweep.applies = self._orig


def time_steps(att, X, backend, n_steps, *, solver=None, dt=DT, warmup=1):
    """Median (wall, CPU) seconds per step after ``warmup`` untimed steps, the Sinkhorn
    iterations of the timed evaluations and the error histories of all solves."""
    ev = FieldEvaluator(att, X.shape[0], backend=backend, sinkhorn_tol=TOL)
    be = ev.be
    stage = [0]

    def field(t, y):
        ev.stage = stage[0]                      # as simulate does
        stage[0] += 1
        return ev(t, y)

    y = be.asarray(X, np.float64)
    solver = RK4() if solver is None else solver
    t = 0.0
    walls, cpus = [], []
    n_warm = 0
    with Recorder() as rec:
        for k in range(n_steps + warmup):
            stage[0] = 0
            t0, c0 = time.perf_counter(), time.process_time()
            y = solver.step(field, t, y, dt)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            t += dt
            if k < warmup:
                n_warm = len(ev.info.get("sinkhorn_iterations", []))
            else:
                walls.append(wall)
                cpus.append(cpu)
    its = ev.info.get("sinkhorn_iterations", [])
    time_steps.last = (walls, cpus)           # every timed step, for baselines over runs
    return float(np.median(walls)), float(np.median(cpus)), its[n_warm:], its, rec.errors


def pass_costs(n, rng, repeat=3):
    """CPU seconds of one softmax pass, one lse pass and one fused sweep (min of ``repeat``)."""
    be = get_backend("numba")
    X = rng.normal(size=(n, 2))
    bias = np.full(n, -np.log(n))
    w = np.full(n, 1.0 / n)
    qx = X @ (K.T @ Q).T
    vx = X @ V.T
    be.sinkhorn_sweep(qx[:64], X[:64], vx[:64], bias[:64], w[:64])

    def cpu(fn):
        best = np.inf
        for _ in range(repeat):
            c0 = time.process_time()
            fn()
            best = min(best, time.process_time() - c0)
        return best
    return {"softmax_pass_cpu_s": cpu(lambda: be.softmax(qx, X, vx, bias, None)),
            "lse_pass_cpu_s": cpu(lambda: be.lse(qx, X, bias, None)),
            "fused_sweep_cpu_s": cpu(lambda: be.sinkhorn_sweep(qx, X, vx, bias, w))}


def case_row(sec, cpu, its, base_cpu, passes_per_it, n_evals, errors):
    """One table entry, with where the passes go."""
    its = np.asarray(its, float)
    row = {"s_per_step": sec, "cpu_s_per_step": cpu, "ratio_to_softmax": cpu / base_cpu,
           "iters_per_eval_mean": float(its.mean()), "iters_per_eval_max": int(its.max()),
           "passes_per_eval_mean": float(its.mean() * passes_per_it),
           "iters_per_eval_by_stage": [float(its[i::n_evals].mean()) for i in range(n_evals)]}
    timed = errors[-len(its):]
    row["start_error_by_stage"] = [float(np.median([e[0] for e in timed[i::n_evals] if e]))
                                   for i in range(n_evals)]
    return row


def part_steps(n, rng, steps, warmup):
    X = rng.normal(size=(n, 2))
    row = {"n": n, "steps_timed": steps, "warmup_steps": warmup}
    sm = tp.Attention("softmax", Q, K, V)
    # the softmax baseline: 6 steps before the Sinkhorn cases and 6 after, the median of
    # all 12 (one short run of it was measured 50 % slow on this shared machine)
    time_steps(sm, X, "numba", 6, warmup=2)
    walls, cpus = (list(a) for a in time_steps.last)
    cases = {}
    for name, Qm, fused, passes in (("warm", Q, True, 1), ("warm_two_pass", Q, False, 2),
                                    ("warm_sym", Q_SYM, True, 1)):
        att = tp.Attention("sinkhorn", Qm, K, V, eps=EPS)
        if fused:
            sec, cpu, its, all_its, errs = time_steps(att, X, "numba", steps, warmup=warmup)
        else:
            with NoFusion():
                sec, cpu, its, all_its, errs = time_steps(att, X, "numba", max(2, steps - 1),
                                                          warmup=warmup)
        cases[name] = (sec, cpu, its, all_its, errs, passes)
        print(f"  {name}: done", flush=True)
    time_steps(sm, X, "numba", 6, warmup=1)
    walls += time_steps.last[0]
    cpus += time_steps.last[1]
    row["softmax_s"], row["softmax_cpu_s"] = float(np.median(walls)), float(np.median(cpus))
    row["softmax_cpu_s_all"] = [float(c) for c in cpus]
    for name, (sec, cpu, its, all_its, errs, passes) in cases.items():
        row[name] = case_row(sec, cpu, its, row["softmax_cpu_s"], passes, 4, errs)
        if name == "warm":
            row[name]["iters_along_run"] = [int(i) for i in all_its]
    row["euler_softmax_s"], row["euler_softmax_cpu_s"], *_ = time_steps(
        sm, X, "numba", 12, solver=Euler(), dt=0.01, warmup=2)
    att = tp.Attention("sinkhorn", Q, K, V, eps=EPS)
    sec, cpu, its, all_its, errs = time_steps(att, X, "numba", 4, solver=Euler(), dt=0.01,
                                              warmup=16)
    row["euler_warm"] = case_row(sec, cpu, its, row["euler_softmax_cpu_s"], 1, 1, errs)
    return row


def part_pot(sizes, rng):
    import ot
    be = get_backend("numba")
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
        t0, c0 = time.perf_counter(), time.process_time()
        pi_pot = ot.sinkhorn(w, w, -S, EPS, method="sinkhorn_log", numItermax=100_000,
                             stopThr=1e-9 / np.sqrt(n))
        t_pot, c_pot = time.perf_counter() - t0, time.process_time() - c0
        f, g = be.to_numpy(res.f), be.to_numpy(res.g)
        pi = np.exp(logw[:, None] + logw[None, :] + (f[:, None] + g[None, :] + S) / EPS)
        out.append({"n": n, "ours_s": t_ours, "pot_s": t_pot, "speedup": t_pot / t_ours,
                    "ours_cpu_s": c_ours, "pot_cpu_s": c_pot, "ours_iters": res.n_iter,
                    "max_abs_diff_rel": float(np.abs(pi - pi_pot).max() / pi.max())})
    return out


class Candidate:
    """A variant of the warm general-A solve, switched on inside a ``with`` block by
    patching what ``sinkhorn_field`` calls (``"default"`` changes nothing)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self._pot = sk_field.sinkhorn_potentials
        self._anderson = (sk.Anderson.new_problem, sk.Anderson.step)
        pot = self._pot
        if self.name == "anderson20":
            sk_field.sinkhorn_potentials = lambda *a, **k: pot(*a, **{**k, "anderson": 20})
        elif self.name == "no_secant_reuse":
            sk_field.sinkhorn_potentials = lambda *a, **k: pot(*a, **{**k, "memory": None})
        elif self.name == "fresh_secants":
            new_problem, step = self._anderson

            def np_(acc, n):
                new_problem(acc, n)
                acc.stale = len(acc.dX)

            def step_(acc, xp, x, r):
                stale = getattr(acc, "stale", 0)
                if acc.x_prev is not None and stale:     # the first own pair comes now
                    del acc.dX[:stale], acc.dR[:stale]
                    acc.stale = 0
                return step(acc, xp, x, r)
            sk.Anderson.new_problem, sk.Anderson.step = np_, step_
        elif self.name.startswith("nystrom"):
            self._nystrom(int(self.name[len("nystrom"):]))
        elif self.name != "default":
            raise ValueError(f"unknown candidate {self.name!r}")
        return self

    def _nystrom(self, m):
        r"""Anderson mixes the Newton-corrected residual :math:`T(g) + J z - g`, with
        :math:`(I - J_S) z_S = r_S` solved on ``m`` sampled tokens :math:`S` (the row and
        column kernels restricted to :math:`S` and renormalised) and :math:`J z` at every
        token one softmax pass over :math:`S`; the stopping error stays the true one."""
        sweep, step = sk.FusedSweep._sweep, self._anderson[1]
        self._sweep, corr = sweep, {}

        def sweep_(fs, g, eps, values):
            f, g1, out = sweep(fs, g, eps, values)
            q, k, lw = fs.rows.q, fs.rows.k, fs.rows.logw
            idx = np.random.default_rng(7).choice(k.shape[0], min(m, k.shape[0]), replace=False)
            s = q[idx] @ k[idx].T
            rows = lw[idx][None, :] + (g[idx][None, :] + s) / eps
            Pr = np.exp(rows - rows.max(1, keepdims=True))
            Pr /= Pr.sum(1, keepdims=True)
            cols = lw[idx][:, None] + (f[idx][:, None] + s) / eps
            Pc = np.exp(cols - cols.max(0, keepdims=True))
            Pc = (Pc / Pc.sum(0, keepdims=True)).T
            r = (g1 - g)[idx]
            z = np.linalg.solve(np.eye(idx.size) - Pc @ Pr + 1.0 / idx.size, r - r.mean())
            Jz = fs.be.softmax(k / eps, q[idx], (Pr @ z)[:, None], lw[idx] + f[idx] / eps,
                               None)[0][:, 0]
            corr["g"], corr["eps"], corr["gc"] = g, eps, g1 + Jz
            return f, g1, out

        def step_(acc, xp, x, r):
            g = corr.pop("g", None)
            if g is not None and g.shape == x.shape:
                r = (corr["gc"] - g) / corr["eps"]
            return step(acc, xp, x, r)
        sk.FusedSweep._sweep, sk.Anderson.step = sweep_, step_

    def __exit__(self, *exc):
        sk_field.sinkhorn_potentials = self._pot
        sk.Anderson.new_problem, sk.Anderson.step = self._anderson
        if hasattr(self, "_sweep"):
            sk.FusedSweep._sweep = self._sweep


CANDIDATES = ("default", "anderson20", "fresh_secants", "no_secant_reuse", "nystrom300")


def part_candidates(n, rng, steps, warmup):
    """Iterations per evaluation (by RK stage, and over the whole run) and CPU ratio to a
    softmax RK4 step of each :data:`CANDIDATES` variant of the warm general-A solve."""
    X = rng.normal(size=(n, 2))
    sm = tp.Attention("softmax", Q, K, V)
    att = tp.Attention("sinkhorn", Q, K, V, eps=EPS)
    rows, cpus = {}, []
    for name in CANDIDATES:
        time_steps(sm, X, "numba", 3, warmup=1)       # interleaved softmax baseline
        cpus += time_steps.last[1]
        with Candidate(name):
            sec, cpu, its, all_its, errs = time_steps(att, X, "numba", steps, warmup=warmup)
        rows[name] = case_row(sec, cpu, its, 1.0, 1, 4, errs)
        rows[name]["iters_whole_run_mean"] = float(np.mean(all_its))
        print(f"  {name}: done", flush=True)
    base = float(np.median(cpus))
    for r in rows.values():
        r["ratio_to_softmax"] = r["cpu_s_per_step"] / base
    return {"n": n, "steps_timed": steps, "warmup_steps": warmup, "softmax_cpu_s": base,
            "candidates": rows}


def print_candidates(res):
    print(f"\nwarm general-A RK4 candidates, N={res['n']} (softmax step "
          f"{res['softmax_cpu_s']:.3f} s CPU)")
    hdr = (f"{'candidate':<16} {'ratio':>6} {'it/ev':>6} {'whole run':>9}  "
           f"{'it/ev by stage':<22} start error by stage")
    print(hdr)
    print("-" * len(hdr))
    for name, c in res["candidates"].items():
        by = " ".join(f"{x:.2f}" for x in c["iters_per_eval_by_stage"])
        st = " ".join(f"{x:.0e}" for x in c["start_error_by_stage"])
        print(f"{name:<16} {c['ratio_to_softmax']:>6.2f} {c['iters_per_eval_mean']:>6.2f} "
              f"{c['iters_whole_run_mean']:>9.2f}  {by:<22} {st}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000, help="tokens (default 1e4)")
    p.add_argument("--steps", type=int, default=8, help="timed RK4 steps per case")
    p.add_argument("--warmup", type=int, default=14, help="untimed warm RK4 steps first")
    p.add_argument("--pot", action="store_true", help="also a cold solve against POT")
    p.add_argument("--candidates", action="store_true",
                   help="measure the candidate variants of the warm general-A solve only")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/"
                   "sinkhorn.json, or sinkhorn_candidates.json with --candidates)")
    a = p.parse_args(argv)
    results = Path(__file__).parent / "results"
    if a.out is None:
        a.out = str(results / ("sinkhorn_candidates.json" if a.candidates else "sinkhorn.json"))
    rng = np.random.default_rng(0)
    t_start = time.perf_counter()
    tp.velocity(tp.Attention("softmax", Q, K, V), rng.normal(size=(64, 2)), backend="numba")
    tp.velocity(tp.Attention("sinkhorn", Q, K, V), rng.normal(size=(64, 2)), backend="numba")
    load0 = os.getloadavg()
    print(f"numba backend, N={a.n}, d=2, eps={EPS}, tol={TOL:g}, float64, {os.cpu_count()} "
          f"CPUs ({platform.processor() or platform.machine()}); load average "
          f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    if a.candidates:
        res = part_candidates(a.n, rng, a.steps, a.warmup)
        print_candidates(res)
        load1 = os.getloadavg()
        res.update({"machine": {"cpus": os.cpu_count(), "processor": platform.processor(),
                                "platform": platform.platform()},
                    "load_average_start": load0, "load_average_end": load1,
                    "command": f"PYTHONPATH=$PWD python benchmarks/sinkhorn.py --candidates "
                               f"--n {a.n}", "d": 2, "eps": EPS, "tol": TOL, "dt": DT})
        print(f"load average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2))
        print(f"wrote {a.out}")
        return
    costs = pass_costs(a.n, rng)
    row = part_steps(a.n, rng, a.steps, a.warmup)
    load1 = os.getloadavg()
    sm = costs["softmax_pass_cpu_s"]
    print(f"\none pass (CPU s): softmax {sm:.3f}, lse {costs['lse_pass_cpu_s']:.3f} "
          f"({costs['lse_pass_cpu_s'] / sm:.2f}x), fused sweep {costs['fused_sweep_cpu_s']:.3f} "
          f"({costs['fused_sweep_cpu_s'] / sm:.2f}x)")
    print("\nratio = CPU time of a Sinkhorn step / CPU time of a softmax step (same method)")
    hdr = (f"{'case':<15} {'s/step':>8} {'ratio':>6} {'it/ev':>6} {'pass/ev':>7}  "
           f"{'it/ev by stage':<22} start error by stage")
    print(hdr)
    print("-" * len(hdr))
    for name in ("warm", "warm_two_pass", "warm_sym", "euler_warm"):
        c = row[name]
        by = " ".join(f"{x:.1f}" for x in c["iters_per_eval_by_stage"])
        st = " ".join(f"{x:.0e}" for x in c["start_error_by_stage"])
        print(f"{name:<15} {c['s_per_step']:>8.3f} {c['ratio_to_softmax']:>6.2f} "
              f"{c['iters_per_eval_mean']:>6.2f} {c['passes_per_eval_mean']:>7.2f}  {by:<22} {st}")
    print(f"(softmax step: RK4 {row['softmax_s']:.3f} s wall / {row['softmax_cpu_s']:.3f} s CPU; "
          f"Euler {row['euler_softmax_s']:.3f} / {row['euler_softmax_cpu_s']:.3f})")
    print("iterations per evaluation along the warm RK4 run:",
          " ".join(str(i) for i in row["warm"]["iters_along_run"]))
    pot = part_pot([1_000, 5_000], rng) if a.pot else []
    for r in pot:
        print(f"POT N={r['n']}: ours {r['ours_s']:.3f} s, POT {r['pot_s']:.3f} s "
              f"({r['speedup']:.1f}x), |dpi|/max {r['max_abs_diff_rel']:.1e}")
    elapsed = time.perf_counter() - t_start
    print(f"\nload average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; "
          f"{elapsed:.0f} s in all")
    res = {"machine": {"cpus": os.cpu_count(), "processor": platform.processor(),
                       "platform": platform.platform()},
           "load_average_start": load0, "load_average_end": load1, "elapsed_s": elapsed,
           "command": "PYTHONPATH=$PWD python benchmarks/sinkhorn.py",
           "backend": "numba", "d": 2, "eps": EPS, "tol": TOL, "dt": DT, "method": "rk4",
           "Q": Q.tolist(), "K": K.tolist(), "Q_sym": Q_SYM.tolist(), "V": V.tolist(),
           "pass_costs": costs, "steps": row, "pot": pot}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
