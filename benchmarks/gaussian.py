"""Benchmark: Gaussian phase-plot grid, ``solve_batch`` vs a per-initialisation projected Euler loop.

Setting (the paper's cone phase plots, Castin et al. 2025): d = 2 softmax attention with V = I
and A = K^T Q / sqrt(d) (the paper's scaling, passed explicitly), Q and K drawn once from a
seeded standard normal; initial covariances Sigma0 = [[a, c], [c, b]] on a grid of cone
coordinates (u, w, v) = (a - b, 2c, a + b) with v = 1 and (u, w) on a 40 x 40 grid inside the
disc u^2 + w^2 < 0.98^2 (1,152 points).  With V = I the exact blow-up time is
T* = 1 / lambda_max(Sigma0^1/2 (A + A^T) Sigma0^1/2) (SPEC), so both methods are scored
against it.

* ``solve_batch``: defaults (rtol 1e-10, blow-up threshold tr Sigma = 1e8, extrapolated T*),
  timed with all numba threads and with one (min of 5 runs, wall and process CPU time; the
  machine may be shared, so the 1-minute load average is recorded).
* Euler: plain NumPy, one initialisation at a time, step h = 0.01, Sigma projected on the PSD
  cone (eigh, negative eigenvalues set to 0) after each step, stopped when tr Sigma > 1e3 (the
  paper's criterion; T* estimate = that time) or at t_max.

Run:  python benchmarks/gaussian.py [--quick]   (writes benchmarks/results/gaussian.json)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from transformer_pde.attention import Attention
from transformer_pde import gaussian as g


def grid(n: int = 40, radius: float = 0.98) -> np.ndarray:
    u = np.linspace(-1, 1, n)
    U, W = np.meshgrid(u, u)
    keep = U ** 2 + W ** 2 < radius ** 2
    u, w = U[keep], W[keep]
    v = np.ones_like(u)
    a, b, c = (v + u) / 2, (v - u) / 2, w / 2
    return np.stack([np.stack([a, c], -1), np.stack([c, b], -1)], -2)


def euler_one(A: np.ndarray, V: np.ndarray, S0: np.ndarray, h: float, t_max: float,
              stop_trace: float) -> tuple[float, np.ndarray, bool]:
    """Projected explicit Euler for Sigma' = M Sigma + Sigma M^T, M = V Sigma A."""
    S = S0.copy()
    t = 0.0
    n = int(round(t_max / h))
    for _ in range(n):
        M = V @ S @ A
        S = S + h * (M @ S + S @ M.T)
        lam, U = np.linalg.eigh(0.5 * (S + S.T))
        S = (U * np.maximum(lam, 0.0)) @ U.T
        t += h
        if np.trace(S) > stop_trace:
            return t, S, True
    return t, S, False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="time Euler on 100 members only")
    ap.add_argument("--euler-subset", type=int, default=None,
                    help="number of members timed with Euler (extrapolated to all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gaussian.json"))
    args = ap.parse_args()

    d = 2
    rng = np.random.default_rng(0)
    Q, K = rng.normal(size=(2, d, d))
    Q = Q / np.sqrt(d)                     # the paper's 1/sqrt(d) scaling, explicit
    A = K.T @ Q
    V = np.eye(d)
    att = Attention("softmax", Q, K, V)
    covs = grid()
    B = len(covs)
    T_exact = np.array([g.blowup_time_identity_value(A, S) for S in covs])
    t_max = float(np.ceil(1.2 * T_exact[np.isfinite(T_exact)].max()))

    load_before = os.getloadavg()[0]

    def timed(reps: int, **kw):
        """min wall and min CPU (all threads of this process) over ``reps`` runs."""
        walls, cpus = [], []
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            r = g.solve_batch(att, np.zeros((B, d)), covs, t_max=t_max, **kw)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        return r, min(walls), min(cpus)

    # warm-up: numba compilation (cached on disk) is not part of the timing; B >= 256 members
    # run the parallel kernel, so warm up with the full batch
    g.solve_batch(att, np.zeros((B, d)), covs, t_max=t_max)
    threads = 1
    t_batch_1 = c_batch_1 = None
    try:
        import numba

        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        _, t_batch_1, c_batch_1 = timed(5)
        numba.set_num_threads(threads)
    except ImportError:
        pass
    res, t_batch, c_batch = timed(5)
    res_np, t_batch_np, c_batch_np = timed(1, use_numba=False)

    n_eu = args.euler_subset or (100 if args.quick else B)
    sel = np.linspace(0, B - 1, n_eu).round().astype(int)
    T_eu = np.full(B, np.nan)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in sel:
        t, S, blew = euler_one(A, V, covs[i], 0.01, t_max, 1e3)
        T_eu[i] = t if blew else np.inf
    t_euler = (time.perf_counter() - t0) * B / n_eu
    c_euler = (time.process_time() - c0) * B / n_eu

    fin = np.isfinite(T_exact)
    err_batch = np.abs(res.blowup_time[fin] / T_exact[fin] - 1)
    sel_fin = sel[fin[sel]]
    err_eu = np.abs(T_eu[sel_fin] / T_exact[sel_fin] - 1)
    # exact rank-one limit direction: u = Sigma0^1/2 w, w top eigenvector
    lim_err = []
    for i in np.nonzero(fin)[0]:
        lam, U = np.linalg.eigh(covs[i])
        R = (U * np.sqrt(np.maximum(lam, 0))) @ U.T
        _, W = np.linalg.eigh(R @ (A + A.T) @ R)
        u = R @ W[:, -1]
        lim_err.append(np.abs(res.limit[i] - np.outer(u, u) / (u @ u)).max())
    out = {
        "setting": "d=2 softmax, V=I, A=K^T Q/sqrt(2) (seed 0), Sigma0 on a cone grid v=1, "
                   f"{B} members, t_max={t_max}",
        "members": B,
        "statuses": res.counts(),
        "numba_threads": threads,
        "solve_batch_s": t_batch,
        "solve_batch_cpu_s": c_batch,
        "solve_batch_1_thread_s": t_batch_1,
        "solve_batch_1_thread_cpu_s": c_batch_1,
        "solve_batch_numpy_path_s": t_batch_np,
        "euler_s": t_euler,
        "euler_cpu_s": c_euler,
        "euler_members_timed": int(n_eu),
        "euler_extrapolated": bool(n_eu < B),
        "speedup": t_euler / t_batch,
        "speedup_cpu": c_euler / c_batch,
        "speedup_1_thread": None if t_batch_1 is None else t_euler / t_batch_1,
        "speedup_numpy_path": t_euler / t_batch_np,
        "Tstar_max_rel_err_solve_batch": float(err_batch.max()),
        "Tstar_max_rel_err_euler": float(err_eu.max()),
        "Tstar_median_rel_err_euler": float(np.median(err_eu)),
        "limit_max_abs_err_solve_batch": float(np.max(lim_err)),
        "mean_steps_solve_batch": float(res.n_steps.mean()),
        "numpy_vs_numba_max_Tstar_diff": float(np.nanmax(np.abs(res_np.blowup_time
                                                                - res.blowup_time))),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"{platform.python_version()}",
        "load_average_1min": [load_before, os.getloadavg()[0]],
    }
    print(f"{'method':<34}{'time [s]':>10}{'CPU [s]':>10}{'speedup':>10}{'max rel err T*':>16}")
    print(f"{f'solve_batch (numba, {threads} threads)':<34}{t_batch:>10.3f}{c_batch:>10.3f}"
          f"{t_euler / t_batch:>10.1f}{err_batch.max():>16.2e}")
    if t_batch_1 is not None:
        print(f"{'solve_batch (numba, 1 thread)':<34}{t_batch_1:>10.3f}{c_batch_1:>10.3f}"
              f"{t_euler / t_batch_1:>10.1f}{err_batch.max():>16.2e}")
    print(f"{'solve_batch (numpy path)':<34}{t_batch_np:>10.3f}{c_batch_np:>10.3f}"
          f"{t_euler / t_batch_np:>10.1f}"
          f"{np.nanmax(np.abs(res_np.blowup_time[fin] / T_exact[fin] - 1)):>16.2e}")
    lab = "Euler h=0.01 (per init)" + (" [extrap.]" if n_eu < B else "")
    print(f"{lab:<34}{t_euler:>10.3f}{c_euler:>10.3f}{1.0:>10.1f}{err_eu.max():>16.2e}")
    print(f"1-min load average before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
          f"({os.cpu_count()} cores); CPU-time speedup {c_euler / c_batch:.1f}")
    print(f"members {B}, statuses {res.counts()}, Euler median rel err "
          f"{np.median(err_eu):.2e}, rank-one limit max err {np.max(lim_err):.1e}")
    if n_eu < B:
        print(f"(Euler timed on {n_eu} of {B} members and extrapolated linearly)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
