"""Benchmark: the paper's Fig. 2a phase grid, ``solve_batch`` vs a per-initialisation Euler loop.

Setting (Castin et al. 2025, Fig. 2a, "blowup" / variant ``trad``): d = 2 softmax attention
with the paper's seeded Q, K (A = K^T Q / sqrt(2)) and V = I; initial covariances of trace one
on the paper's grid (u on linspace(-1, 1, 40), w on linspace(-1, 1, 40), kept strictly inside
the cone: 1,184 matrices).  With V = I the exact blow-up time is
T* = 1 / lambda_max(Sigma0^1/2 (A + A^T) Sigma0^1/2), so both methods are scored against it.

* Euler (the paper's method): plain NumPy, one initialisation at a time, projected explicit
  Euler (Sigma <- Sigma + h (M Sigma + Sigma M^T), negative eigenvalues set to 0), h = 0.01,
  stopped when tr Sigma > 1e3 ("exceeded"; T* estimate = that time), tr Sigma < 1e-4
  ("converged") or after 100,000 steps.  Timed on an evenly spaced subset and extrapolated
  (``--euler-members``; the machine is shared).
* ``solve_batch``: defaults (rtol 1e-10) with the paper's threshold ``blowup_threshold=1e3``
  (the paths stop there; T* is measured past it), numba path, all threads and one thread.
* Scaling: the same field on a 1e5-point grid of the cone (``--large``), all threads.
* Every kind (one integrator runs them all): softmax d = 4, linear d = 3, l2 and Sinkhorn
  d = 2 batches, one thread, CPU time per accepted member-step (min of 3).

* scipy: ``solve_ivp`` DOP853 on all members stacked in one vectorised system (a
  well-conditioned log-size / shape formulation, see :func:`scipy_tstar`) at the largest
  rtol that reaches solve_batch's T* accuracy; timed interleaved with solve_batch.

Targets: solve_batch >= 1e5 members per second on 2 cores (the large grid) with T*
within 1e-10, >= 20x the vectorised scipy baseline at equal accuracy, >= 50x the Euler
loop.  All ratios come from one run; the load
average is printed (the machine may be shared).  One run takes well under 2 minutes.

One run; prints a table and writes ``benchmarks/results/gaussian.json``.
Run (from the repository root):
    PYTHONPATH=$PWD python benchmarks/gaussian.py [--euler-members 100] [--large 100000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np

from transformer_pde import gaussian as g
from transformer_pde.attention import Attention
from transformer_pde.errors import EarlyStopWarning

Q = np.array([[-0.09678415830991538, 0.42220166048145347],
              [-0.22546156340099752, -0.6379430932117882]])
K = np.array([[-0.01628630369574242, 1.0442167783791647],
              [-1.0848803286340662, -2.2059248271588077]])


def cone_grid(n_u: int, n_c: int) -> np.ndarray:
    """The paper's init_grid: trace-one matrices [[(1+u)/2, w/2], [w/2, (1-u)/2]] with
    1 - u^2 > w^2 (strictly inside the cone)."""
    u = np.linspace(-1.0, 1.0, n_u)
    w = np.linspace(-1.0, 1.0, n_c)
    U, W = np.meshgrid(u, w, indexing="ij")
    keep = 1.0 - U ** 2 > W ** 2
    uu, ww = U[keep], W[keep]
    return np.stack([np.stack([(1 + uu) / 2, ww / 2], -1),
                     np.stack([ww / 2, (1 - uu) / 2], -1)], -2)


def euler_one(A: np.ndarray, S0: np.ndarray, h: float = 0.01, max_iter: int = 100_000,
              tol_high: float = 1e3, tol_low: float = 1e-4) -> tuple[float, str]:
    """The paper's projected explicit Euler for Sigma' = M Sigma + Sigma M^T, M = Sigma A (V = I)."""
    S = S0.copy()
    for it in range(1, max_iter + 1):
        M = S @ A
        S = S + h * (M @ S + S @ M.T)
        lam, U = np.linalg.eigh(0.5 * (S + S.T))
        S = (U * np.maximum(lam, 0.0)) @ U.T
        tr = S[0, 0] + S[1, 1]
        if tr > tol_high:
            return it * h, "exceeded"
        if tr < tol_low:
            return it * h, "converged"
    return max_iter * h, "max_iter"


def scipy_tstar(A: np.ndarray, covs: np.ndarray, rtol: float) -> tuple[np.ndarray, int]:
    """T* of every member by ``scipy.integrate.solve_ivp`` (DOP853), all members stacked in
    one vectorised system (one step size for all).

    Variables per member (well conditioned up to the blow-up, like solve_batch's): the log
    size ``l = log tr Sigma``, the shape ``H = Sigma / tr Sigma`` (3 entries) and ``t``, in
    the time ``s`` with ``ds = tr Sigma dt``.  With ``Sigma' = Sigma A Sigma + Sigma A^T
    Sigma`` (V = I): ``dl/ds = tr(H (A + A^T) H)``, ``dH/ds = H (A + A^T) H - H dl/ds``,
    ``dt/ds = exp(-l)``.  A blow-up is ``l -> inf`` linearly in ``s`` while ``t -> T*``;
    integrated until every member has ``tr Sigma >= 1e14``, then
    ``T* = t + exp(-l) / (dl/ds)`` (the remainder ``Sigma / Sigma'`` to first order).
    Returns ``(T*, right-hand side evaluations)``."""
    from scipy.integrate import solve_ivp

    Sym = A + A.T
    B = len(covs)
    tr = np.trace(covs, axis1=1, axis2=2)
    H0 = covs / tr[:, None, None]
    y0 = np.concatenate([np.log(tr), H0[:, 0, 0], H0[:, 0, 1], H0[:, 1, 1], np.zeros(B)])

    def f(_s, y):
        l_, a, b, c, _t = y.reshape(5, B)
        # H Sym H for H = [[a, b], [b, c]], Sym = [[p, q], [q, r]]
        p, q, r = Sym[0, 0], Sym[0, 1], Sym[1, 1]
        x11 = a * (p * a + q * b) + b * (q * a + r * b)
        x12 = a * (p * b + q * c) + b * (q * b + r * c)
        x22 = b * (p * b + q * c) + c * (q * b + r * c)
        dl = x11 + x22
        return np.concatenate([dl, x11 - a * dl, x12 - b * dl, x22 - c * dl, np.exp(-l_)])

    s_end, nfev = 20.0, 0
    while True:
        sol = solve_ivp(f, (0.0, s_end), y0, method="DOP853", rtol=rtol, atol=1e-14)
        nfev += sol.nfev
        y = sol.y[:, -1].reshape(5, B)
        if np.min(y[0]) >= np.log(1e14):
            break
        s_end *= 2.0
    dl = f(0.0, sol.y[:, -1])[:B]
    return y[4] + np.exp(-y[0]) / dl, nfev


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--euler-members", type=int, default=100,
                    help="members timed with Euler (evenly spaced; extrapolated to all)")
    ap.add_argument("--large", type=int, default=100_000,
                    help="approximate size of the large grid (0: skip)")
    ap.add_argument("--quick", action="store_true",
                    help="20 Euler members, a 2e4-member large grid (writes gaussian_quick.json)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.euler_members, args.large = 20, 20_000
    if args.out is None:
        name = "gaussian_quick.json" if args.quick else "gaussian.json"
        args.out = str(Path(__file__).parent / "results" / name)
    warnings.simplefilter("ignore", EarlyStopWarning)

    att = Attention("softmax", Q / np.sqrt(2), K, np.eye(2))
    A = K.T @ Q / np.sqrt(2)
    covs = cone_grid(40, 40)
    B = len(covs)
    T_exact = np.array([g.blowup_time_identity_value(A, S) for S in covs])
    fin = np.isfinite(T_exact)
    t_max = 1000.0          # the paper's 100,000 Euler steps of 0.01
    kw = {"t_max": t_max, "blowup_threshold": 1e3}
    load_before = os.getloadavg()
    print(f"load average (1, 5, 15 min) at start: {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f} on {os.cpu_count()} cores")

    import numba

    threads = numba.get_num_threads()
    g.solve_batch(att, np.zeros((B, 2)), covs, **kw)           # compile (cached on disk)

    def timed(reps: int):
        """min wall and min CPU (all threads of this process) over ``reps`` runs."""
        walls, cpus = [], []
        for _ in range(reps):
            t0, c0 = time.perf_counter(), time.process_time()
            r = g.solve_batch(att, np.zeros((B, 2)), covs, **kw)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        return r, min(walls), min(cpus)

    res, t_b, c_b = timed(5)
    numba.set_num_threads(1)
    _, t_b1, c_b1 = timed(3)
    numba.set_num_threads(threads)

    # scipy's DOP853 vectorised over members at equal accuracy: the largest rtol of the
    # ladder whose T* is within the accuracy of solve_batch's (or 1e-10); timed
    # interleaved with solve_batch (min of 3 each)
    err_target = max(1e-10, float(np.max(np.abs(res.blowup_time[fin] / T_exact[fin] - 1))))
    sp_rtol, sp_err = None, None
    for rt in (1e-9, 1e-10, 1e-11, 1e-12, 1e-13):
        T_sp, _ = scipy_tstar(A, covs, rt)
        sp_err = float(np.max(np.abs(T_sp[fin] / T_exact[fin] - 1)))
        if sp_err <= err_target:
            sp_rtol = rt
            break
    walls_sp, walls_b = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        _, sp_nfev = scipy_tstar(A, covs, sp_rtol or 1e-13)
        walls_sp.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        g.solve_batch(att, np.zeros((B, 2)), covs, **kw)
        walls_b.append(time.perf_counter() - t0)
    t_sp, t_bi = min(walls_sp), min(walls_b)

    sel = np.unique(np.linspace(0, B - 1, min(args.euler_members, B)).round().astype(int))
    T_eu = np.full(B, np.nan)
    st_eu = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for i in sel:
        T, s = euler_one(A, covs[i])
        st_eu[s] = st_eu.get(s, 0) + 1
        T_eu[i] = T if s == "exceeded" else np.inf
    t_eu = (time.perf_counter() - t0) * B / len(sel)
    c_eu = (time.process_time() - c0) * B / len(sel)

    err_b = np.abs(res.blowup_time[fin] / T_exact[fin] - 1)
    sf = sel[fin[sel]]
    err_eu = np.abs(T_eu[sf] / T_exact[sf] - 1)
    out = {
        "setting": "paper Fig. 2a (blowup, trad): d=2 softmax, V=I, A=K^T Q/sqrt(2), "
                   f"{B} trace-one initial covariances, t_max={t_max}, blowup_threshold=1e3",
        "members": B, "statuses": {k: v for k, v in res.counts().items() if v},
        "exact_blowups": int(fin.sum()),
        "numba_threads": threads,
        "solve_batch_s": t_b, "solve_batch_cpu_s": c_b,
        "solve_batch_1_thread_s": t_b1, "solve_batch_1_thread_cpu_s": c_b1,
        "euler_s": t_eu, "euler_cpu_s": c_eu, "euler_members_timed": len(sel),
        "euler_statuses_timed": st_eu,
        "speedup": t_eu / t_b, "speedup_cpu": c_eu / c_b, "speedup_1_thread": t_eu / t_b1,
        "speedup_cpu_1_thread": c_eu / c_b1,
        "Tstar_max_rel_err_solve_batch": float(err_b.max()),
        "members_per_s_solve_batch": B / t_b,
        "scipy_dop853_vectorised_s": t_sp, "scipy_rtol": sp_rtol,
        "scipy_nfev": int(sp_nfev), "Tstar_max_rel_err_scipy": sp_err,
        "solve_batch_interleaved_s": t_bi, "speedup_vs_scipy": t_sp / t_bi,
        "Tstar_max_rel_err_euler": float(err_eu.max()),
        "Tstar_median_rel_err_euler": float(np.median(err_eu)),
        "steps_per_member_solve_batch": float(res.n_steps.mean()),
    }
    print(f"{'method':<36}{'time [s]':>10}{'CPU [s]':>10}{'speedup':>9}{'max rel err T*':>16}")
    print(f"{f'solve_batch (numba, {threads} threads)':<36}{t_b:>10.4f}{c_b:>10.4f}"
          f"{t_eu / t_b:>9.0f}{err_b.max():>16.2e}")
    print(f"{'solve_batch (numba, 1 thread)':<36}{t_b1:>10.4f}{c_b1:>10.4f}"
          f"{t_eu / t_b1:>9.0f}{err_b.max():>16.2e}")
    print(f"{f'scipy DOP853 vectorised (rtol {sp_rtol})':<36}{t_sp:>10.4f}{'':>10}"
          f"{t_eu / t_sp:>9.0f}{sp_err:>16.2e}")
    print(f"{f'Euler h=0.01 per init [{len(sel)} timed]':<36}{t_eu:>10.3f}{c_eu:>10.3f}"
          f"{1:>9.0f}{err_eu.max():>16.2e}")
    print(f"members {B}: {out['statuses']}; exact blow-ups {int(fin.sum())}; Euler median "
          f"rel err of T* {np.median(err_eu):.2e}; solve_batch {res.n_steps.mean():.1f} "
          "accepted steps per member up to the threshold")
    if args.large:
        n = round(float(np.sqrt(args.large * 4 / np.pi)))
        big = cone_grid(n, n)
        Tb = 1.0 / np.array([np.linalg.eigvalsh(_sqrt(S) @ (A + A.T) @ _sqrt(S))[-1]
                             for S in big[:: max(1, len(big) // 2000)]])
        t0, c0 = time.perf_counter(), time.process_time()
        rl = g.solve_batch(att, np.zeros((len(big), 2)), big, **kw)
        t_l, c_l = time.perf_counter() - t0, time.process_time() - c0
        sub = rl.blowup_time[:: max(1, len(big) // 2000)]
        ok = np.isfinite(Tb) & (Tb > 0)
        out.update({"large_members": len(big), "large_s": t_l, "large_cpu_s": c_l,
                    "large_us_per_member": 1e6 * t_l / len(big),
                    "large_members_per_s": len(big) / t_l,
                    "large_statuses": {k: v for k, v in rl.counts().items() if v},
                    "large_Tstar_max_rel_err_sampled": float(np.max(np.abs(sub[ok] / Tb[ok] - 1)))})
        print(f"large grid: {len(big)} members in {t_l:.2f} s ({c_l:.2f} s CPU, {threads} threads,"
              f" {1e6 * t_l / len(big):.1f} us/member); sampled max rel err of T* "
              f"{out['large_Tstar_max_rel_err_sampled']:.1e}")
    out["kinds"] = kinds_table(numba, threads)
    out["machine"] = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                      f"Python {platform.python_version()}")
    load_after = os.getloadavg()
    out["load_average_start_1_5_15min"] = list(load_before)
    out["load_average_end_1_5_15min"] = list(load_after)
    out["targets_met"] = {"members_per_s_ge_1e5": bool(out.get("large_members_per_s", 0) >= 1e5),
                          "vs_scipy_ge_20": bool(out["speedup_vs_scipy"] >= 20),
                          "Tstar_within_1e-10": bool(out["Tstar_max_rel_err_solve_batch"] <= 1e-10),
                          "speedup_ge_50": bool(out["speedup"] >= 50),
                          "speedup_cpu_ge_50": bool(out["speedup_cpu"] >= 50),
                          "speedup_1_thread_ge_50": bool(out["speedup_1_thread"] >= 50),
                          "Tstar_within_1e-8": bool(out["Tstar_max_rel_err_solve_batch"] <= 1e-8)}
    print(f"solve_batch vs scipy DOP853 vectorised (interleaved, same T* accuracy): "
          f"{t_sp / t_bi:.1f}x ({t_bi:.4f} s vs {t_sp:.4f} s, scipy rtol {sp_rtol}, "
          f"{sp_nfev} evaluations of the stacked field)")
    print(f"load average (1, 5, 15 min) at end: {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f} on {os.cpu_count()} cores; targets: {out['targets_met']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


def kinds_table(numba, threads: int) -> dict:
    """solve_batch on one thread for each kind (seeded covariances, zero means): CPU time
    (min of 3) and per accepted member-step; prints one row per kind."""
    rng = np.random.default_rng(0)
    cases = [("softmax", 4, 1024, 5.0), ("linear", 3, 1024, 3.0), ("l2", 2, 256, 5.0),
             ("sinkhorn", 2, 256, 5.0)]
    rows = {}
    numba.set_num_threads(1)
    print(f"{'kind (1 thread)':<22}{'members':>8}{'CPU [s]':>10}{'ns/member-step':>16}")
    for kind, d, B, t_max in cases:
        X = rng.normal(size=(B, d, d)) * 0.5
        covs = X @ np.swapaxes(X, 1, 2) + 0.1 * np.eye(d)
        att = Attention(kind, Q / np.sqrt(2) if d == 2 else np.eye(d) * 0.4,
                        K if d == 2 else np.eye(d), np.eye(d) * (1.0 if d == 2 else 0.5))
        g.solve_batch(att, np.zeros((2, d)), covs[:2], t_max=t_max)    # compile
        cpus = []
        for _ in range(3):
            c0 = time.process_time()
            r = g.solve_batch(att, np.zeros((B, d)), covs, t_max=t_max)
            cpus.append(time.process_time() - c0)
        ns = 1e9 * min(cpus) / max(int(r.n_steps.sum()), 1)
        rows[f"{kind} d={d}"] = {"members": B, "cpu_s": min(cpus),
                                 "steps": int(r.n_steps.sum()), "ns_per_member_step": ns}
        print(f"{f'{kind} d={d}':<22}{B:>8}{min(cpus):>10.4f}{ns:>16.0f}")
    numba.set_num_threads(threads)
    return rows


def _sqrt(S: np.ndarray) -> np.ndarray:
    lam, U = np.linalg.eigh(S)
    return (U * np.sqrt(np.maximum(lam, 0.0))) @ U.T


if __name__ == "__main__":
    main()
