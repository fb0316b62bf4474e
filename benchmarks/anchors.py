"""Benchmark: the library against what a user would reach for instead, ratios from one run.

Three anchors, each measured interleaved (library, alternative, library, alternative, ...)
in one process, so that the ratios share the machine's load; the machine, the versions and
the load average are printed on one line and stored.

1. **Softmax field vs torch's CPU flash kernel.**  One evaluation of
   :math:`\\Gamma(x_i) = \\sum_j \\mathrm{softmax}_j(\\beta\\langle Qx_i, Kx_j\\rangle) Vx_j`
   with ``transformer_pde.velocity(..., backend="numba")`` (its automatic kernel) against
   ``torch.nn.functional.scaled_dot_product_attention`` on ``q = beta X Q^T``,
   ``k = X K^T``, ``v = X V^T`` (scale 1) under ``sdpa_kernel(FLASH_ATTENTION)`` (torch's
   CPU flash kernel; the call fails rather than fall back to another kernel), float32 and
   float64, torch with 2 intra-op threads.  N tokens, M of them as queries (M grown until a
   call takes ``--min-time``), rate = pairs M·N per CPU-second of this process (all its
   threads): the ratio library / torch and each one's share of the GEMM rate: a pair costs
   2·d multiply-adds (logit and value sum), so % of GEMM = pairs/CPU-s × 2d / (GEMM
   multiply-adds per CPU-s), with NumPy's (OpenBLAS) 2048³ DGEMM and SGEMM measured at the
   start and at the end of the part (the larger rate is used).  The outputs of the two are
   compared on the timed queries (max relative difference).
2. **Sinkhorn field vs POT.**  A cold Sinkhorn-attention evaluation (d = 2, eps = 1,
   tolerance 1e-9 on the log-domain marginal error) with ``transformer_pde.velocity``
   against ``ot.sinkhorn(..., method="sinkhorn_log", stopThr=1e-9/sqrt(N))`` plus the field
   from its plan (N·P·V X); the fields are compared (max relative difference).
3. **Gaussian grid vs scipy.**  The paper's Fig. 2a cone of trace-one covariances, d = 2
   softmax with V = I, where :math:`\\Sigma' = \\Sigma (A + A^\\top) \\Sigma` has the exact
   solution :math:`\\Sigma(t) = (\\Sigma_0^{-1} - t(A + A^\\top))^{-1}`: every member integrated to
   t_end = 0.9 and 0.99 min T* (no member blows up before; near the earliest blow-up one
   member needs small steps, which the stacked system imposes on all) with
   ``gaussian.solve_batch`` and with one ``scipy.integrate.solve_ivp(method="DOP853")`` on
   the stacked system of all members (the vectorised baseline: one step-size controller
   for all; it cannot stop members one by one at their own blow-up, hence a common
   horizon before the first).  Equal accuracy: scipy's
   rtol is lowered (1e-8, 1e-9, ... 1e-13) until its largest error against the exact
   solution is at most solve_batch's; the speed-up is taken at that rtol.

Per CPU-second rates are the fair measure on an idle machine.  On a loaded one, the
OpenMP threads of torch (and of Numba's ``omp`` layer) spin while they wait for a thread
that is not running, which counts as CPU time: run with ``OMP_WAIT_POLICY=PASSIVE`` there
(stored in the results), and compare ratios only from runs at a load below the core count.

torch is not a dependency of the package: install it in a separate environment for this
benchmark (``python -m venv /tmp/benchvenv && /tmp/benchvenv/bin/pip install torch pot
-e .``); without torch (or POT) the part is skipped with a line saying so.

AVX2 on any x86-64 machine: ``--simd avx2`` holds both sides to AVX2, so that an AVX-512
machine measures what a user's AVX2 CPU runs.  The script restarts itself with
``NUMBA_CPU_NAME=haswell`` and ``NUMBA_CPU_FEATURES=""`` (Numba compiles for Haswell's
features: AVX2 and FMA, no AVX-512; the name alone would keep the host's features, AVX-512
included), an empty Numba cache of its own, and ``ATEN_CPU_CAPABILITY=avx2`` (torch's
AVX2 kernels); the machine line records the Numba vector width and torch's capability.

Run:  python benchmarks/anchors.py [--quick] [--parts softmax,sinkhorn,gaussian]
(writes benchmarks/results/anchors.json; about 6 minutes on an idle 2-core machine)
      python benchmarks/anchors.py --simd avx2 --parts softmax --ns 16384 --dims 8,32,64,128
(writes benchmarks/results/anchors_avx2.json)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

import transformer_pde as tp

RESULTS = Path(__file__).resolve().parent / "results"
#: the environment that holds Numba and torch to AVX2 (``--simd avx2``)
AVX2_ENV = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "", "ATEN_CPU_CAPABILITY": "avx2"}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _numba_vector_bits() -> int | None:
    try:
        from transformer_pde.backends.numba import intrinsics
    except ImportError:
        return None
    return intrinsics.VECTOR_BITS


def machine_line() -> dict:
    """The machine, the versions and the load, as one printed line (and a dict)."""
    import numba

    model, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", platform.machine()):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    except OSError:
        pass
    simd = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    info = {"cpu": model, "cores": os.cpu_count(), "simd": simd,
            "python": platform.python_version(), "numpy": np.__version__,
            "numba": numba.__version__, "numba_threads": numba.get_num_threads(),
            "loadavg_start": list(os.getloadavg()),
            "numba_cpu_name": os.environ.get("NUMBA_CPU_NAME"),
            "numba_vector_bits": _numba_vector_bits(),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY")}
    for mod in ("torch", "ot", "scipy"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = None
    print(f"machine: {model}, {info['cores']} cores, {simd}; Python {info['python']}, "
          f"NumPy {info['numpy']}, Numba {info['numba']} ({info['numba_threads']} threads, "
          f"{info['numba_vector_bits']}-bit kernels for {info['numba_cpu_name'] or 'the host'}), "
          f"torch {info['torch']}, POT {info['ot']}, SciPy {info['scipy']}; load average "
          f"{' '.join(f'{x:.2f}' for x in info['loadavg_start'])}", flush=True)
    return info


def gemm_rates(n: int = 2048, repeats: int = 3) -> dict:
    """Multiply-adds per CPU-second (and per second) of NumPy's n×n matrix products."""
    out = {}
    rng = np.random.default_rng(0)
    for name, dt in (("dgemm", np.float64), ("sgemm", np.float32)):
        a, b = rng.random((n, n)).astype(dt), rng.random((n, n)).astype(dt)
        a @ b
        wall, cpu = np.inf, np.inf
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            a @ b
            wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
        out[name] = {"fma_per_s": n**3 / wall, "fma_per_cpu_s": n**3 / cpu}
    return out


def _timed(fn, min_time: float) -> tuple[float, float]:
    """(wall, CPU) seconds per call, looping ``fn`` for about ``min_time`` seconds."""
    t0 = time.perf_counter()
    fn()
    loops = max(1, int(np.ceil(min_time / max(time.perf_counter() - t0, 1e-6))))
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t0) / loops, (time.process_time() - c0) / loops


def _queries(call, n: int, d: int, min_time: float) -> int:
    """Queries M (up to N, from max(1024, 32 d)) for which one call takes ``min_time``."""
    m = min(n, max(1024, 32 * d))
    call(m)
    while m < n:
        t0 = time.perf_counter()
        call(m)
        t = time.perf_counter() - t0
        if t >= min_time:
            break
        m = min(n, max(2 * m, int(m * 1.2 * min_time / max(t, 1e-9))))
    return m


def softmax_part(ns, ds, min_time: float, rounds: int) -> dict:
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa
    except ImportError:
        print("softmax vs torch: SKIPPED, torch is not installed in this environment (install "
              "it in a separate one: it is not a dependency of the package)")
        return {"skipped": "torch not installed"}
    torch.set_num_threads(2)
    print(f"  torch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads", flush=True)
    gemm0 = gemm_rates()
    rng = np.random.default_rng(0)
    rows = []
    for dtype in (np.float64, np.float32):
        for n in ns:
            for d in ds:
                Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
                att = tp.Attention("softmax", Q, K, V)
                X = rng.normal(size=(n, d)).astype(dtype)
                q = torch.from_numpy(np.ascontiguousarray((att.beta * X @ Q.T.astype(dtype))))
                k = torch.from_numpy(np.ascontiguousarray(X @ K.T.astype(dtype)))
                v = torch.from_numpy(np.ascontiguousarray(X @ V.T.astype(dtype)))
                k4, v4 = k[None, None], v[None, None]

                def lib(m, X=X, att=att):
                    return tp.velocity(att, X, queries=X[:m], backend="numba")

                def tor(m, q=q, k4=k4, v4=v4):
                    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return sdpa(q[None, None, :m], k4, v4, scale=1.0)[0, 0]

                m = _queries(lib, n, d, min_time)
                ref, got = np.asarray(lib(m), np.float64), tor(m).numpy().astype(np.float64)
                diff = float(np.abs(got - ref).max() / np.abs(ref).max())
                best = {"library": (np.inf, np.inf), "torch": (np.inf, np.inf)}
                for _ in range(rounds):  # interleaved: library, torch, library, torch, ...
                    for name, call in (("library", lib), ("torch", tor)):
                        w, c = _timed(lambda call=call, m=m: call(m), min_time)
                        best[name] = (min(best[name][0], w), min(best[name][1], c))
                row = {"dtype": np.dtype(dtype).name, "n": n, "d": d, "queries": m,
                       "max_rel_diff": diff}
                for name, (w, c) in best.items():
                    row[f"{name}_pairs_per_s"] = m * n / w
                    row[f"{name}_pairs_per_cpu_s"] = m * n / c
                row["ratio_cpu"] = row["library_pairs_per_cpu_s"] / row["torch_pairs_per_cpu_s"]
                row["ratio_wall"] = row["library_pairs_per_s"] / row["torch_pairs_per_s"]
                rows.append(row)
                print(f"  {row['dtype']} N={n} d={d}: library/torch {row['ratio_cpu']:.2f}x per "
                      f"CPU-s ({row['ratio_wall']:.2f}x wall), rel diff {diff:.1e}, load "
                      f"{_load()}", flush=True)
    gemm1 = gemm_rates()
    gemm = {k: max(gemm0[k]["fma_per_cpu_s"], gemm1[k]["fma_per_cpu_s"]) for k in gemm0}
    for row in rows:
        rate = gemm["dgemm" if row["dtype"] == "float64" else "sgemm"]
        for name in ("library", "torch"):
            row[f"{name}_pct_gemm"] = 100 * row[f"{name}_pairs_per_cpu_s"] * 2 * row["d"] / rate
    return {"rows": rows, "gemm_start": gemm0, "gemm_end": gemm1,
            "gemm_fma_per_cpu_s": gemm, "torch_threads": torch.get_num_threads(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def sinkhorn_part(ns, rounds: int) -> dict:
    try:
        import ot
    except ImportError:
        print("Sinkhorn vs POT: SKIPPED, POT (the `pot` package) is not installed")
        return {"skipped": "POT not installed"}
    Q = np.array([[1.0, 0.5], [-0.3, 0.8]])
    K, V = np.eye(2), np.array([[0.5, -0.5], [0.5, 0.2]])
    att = tp.Attention("sinkhorn", Q, K, V, eps=1.0)
    rng = np.random.default_rng(1)
    tp.velocity(att, rng.normal(size=(64, 2)), backend="numba")  # compile outside timing
    rows = []
    for n in ns:
        X = rng.normal(size=(n, 2))
        w = np.full(n, 1.0 / n)

        def lib(X=X):
            return tp.velocity(att, X, backend="numba", sinkhorn_tol=1e-9)

        def pot(X=X, w=w):
            S = (att.beta * X @ Q.T) @ (X @ K.T).T
            P = ot.sinkhorn(w, w, -S, att.eps, method="sinkhorn_log", numItermax=100_000,
                            stopThr=1e-9 / np.sqrt(len(X)))
            return len(X) * P @ (X @ V.T)

        best = {"library": (np.inf, np.inf), "pot": (np.inf, np.inf)}
        out = {}
        for _ in range(rounds):
            for name, call in (("library", lib), ("pot", pot)):
                t0, c0 = time.perf_counter(), time.process_time()
                out[name] = call()
                w_, c_ = time.perf_counter() - t0, time.process_time() - c0
                best[name] = (min(best[name][0], w_), min(best[name][1], c_))
        diff = float(np.abs(out["library"] - out["pot"]).max() / np.abs(out["pot"]).max())
        row = {"n": n, "library_s": best["library"][0], "library_cpu_s": best["library"][1],
               "pot_s": best["pot"][0], "pot_cpu_s": best["pot"][1],
               "speedup_cpu": best["pot"][1] / best["library"][1],
               "speedup_wall": best["pot"][0] / best["library"][0], "max_rel_diff": diff}
        rows.append(row)
        print(f"  N={n}: library {row['library_s']:.3f} s, POT {row['pot_s']:.3f} s: "
              f"{row['speedup_cpu']:.1f}x per CPU-s ({row['speedup_wall']:.1f}x wall), "
              f"rel diff {diff:.1e}, load {_load()}", flush=True)
    return {"rows": rows, "eps": 1.0, "tol": 1e-9, "d": 2}


def _cone(n_u: int) -> np.ndarray:
    u = np.linspace(-1.0, 1.0, n_u)
    U, W = np.meshgrid(u, u, indexing="ij")
    keep = 1.0 - U**2 > W**2
    uu, ww = U[keep], W[keep]
    return np.stack([np.stack([(1 + uu) / 2, ww / 2], -1),
                     np.stack([ww / 2, (1 - uu) / 2], -1)], -2)


def gaussian_part(n_u: int, rounds: int, frac: float) -> dict:
    from scipy.integrate import solve_ivp

    from transformer_pde import gaussian as g

    Q = np.array([[-0.09678415830991538, 0.42220166048145347],
                  [-0.22546156340099752, -0.6379430932117882]])
    K = np.array([[-0.01628630369574242, 1.0442167783791647],
                  [-1.0848803286340662, -2.2059248271588077]])
    att = tp.Attention("softmax", Q / np.sqrt(2), K, np.eye(2))
    A = K.T @ Q / np.sqrt(2)
    Bm = A + A.T
    covs = _cone(n_u)
    nb = len(covs)
    lam = np.array([np.linalg.eigvalsh(_sqrtm(S) @ Bm @ _sqrtm(S))[-1] for S in covs])
    t_end = frac / lam[lam > 0].max()     # before the earliest blow-up of the grid
    exact = np.linalg.inv(np.linalg.inv(covs) - t_end * Bm)

    def err(c):
        return float(np.max(np.abs(c - exact)) / np.max(np.abs(exact)))

    def lib():
        return g.solve_batch(att, np.zeros((nb, 2)), covs, t_max=t_end, warn=False).covs

    def rhs(t, y):
        S = y.reshape(nb, 2, 2)
        return (S @ Bm @ S).ravel()

    def scipy_at(rtol):
        def call():
            sol = solve_ivp(rhs, (0.0, t_end), covs.ravel(), method="DOP853", rtol=rtol,
                            atol=1e-3 * rtol)
            return sol.y[:, -1].reshape(nb, 2, 2)
        return call

    lib()  # compile / load outside the timing
    e_lib = err(lib())
    chosen, e_sc = None, np.inf
    for rtol in (1e-8, 1e-9, 1e-10, 1e-11, 1e-12, 1e-13):
        e_sc = err(scipy_at(rtol)())
        chosen = rtol
        if e_sc <= e_lib:
            break
    sc = scipy_at(chosen)
    best = {"library": (np.inf, np.inf), "scipy": (np.inf, np.inf)}
    for _ in range(rounds):
        for name, call in (("library", lib), ("scipy", sc)):
            t0, c0 = time.perf_counter(), time.process_time()
            call()
            w_, c_ = time.perf_counter() - t0, time.process_time() - c0
            best[name] = (min(best[name][0], w_), min(best[name][1], c_))
    row = {"members": nb, "t_end": t_end, "t_end_over_min_tstar": frac,
           "library_s": best["library"][0],
           "library_cpu_s": best["library"][1], "scipy_s": best["scipy"][0],
           "scipy_cpu_s": best["scipy"][1], "scipy_rtol": chosen,
           "library_max_rel_err": e_lib, "scipy_max_rel_err": e_sc,
           "equal_accuracy": bool(e_sc <= e_lib),
           "speedup_cpu": best["scipy"][1] / best["library"][1],
           "speedup_wall": best["scipy"][0] / best["library"][0],
           "library_members_per_s": nb / best["library"][0]}
    print(f"  {nb} members to t = {t_end:.3f}: solve_batch {row['library_s']:.3f} s (error "
          f"{e_lib:.1e}), solve_ivp DOP853 stacked rtol={chosen:g} {row['scipy_s']:.3f} s "
          f"(error {e_sc:.1e}): {row['speedup_cpu']:.1f}x per CPU-s "
          f"({row['speedup_wall']:.1f}x wall), load {_load()}", flush=True)
    return row


def _sqrtm(S: np.ndarray) -> np.ndarray:
    lam, U = np.linalg.eigh(S)
    return (U * np.sqrt(np.maximum(lam, 0.0))) @ U.T


def _table(res: dict) -> None:
    rows = res.get("softmax", {}).get("rows", [])
    if rows:
        ds = sorted({r["d"] for r in rows})
        print("\nsoftmax field: library / torch SDPA (flash, 2 threads), pairs per CPU-second; "
              "last column: % of GEMM at the largest d (library / torch)")
        print(f"{'':<16}" + "".join(f"{f'd={d}':>8}" for d in ds) + f"{'% GEMM':>14}")
        for dt in ("float64", "float32"):
            for n in sorted({r["n"] for r in rows}):
                sel = {r["d"]: r for r in rows if r["dtype"] == dt and r["n"] == n}
                if not sel:
                    continue
                top = sel[max(sel)]
                print(f"{f'{dt} N={n}':<16}" + "".join(
                    f"{sel[d]['ratio_cpu']:>7.2f}x" if d in sel else f"{'':>8}" for d in ds)
                    + f"{top['library_pct_gemm']:>7.0f}/{top['torch_pct_gemm']:.0f} %")
        g = res["softmax"]["gemm_fma_per_cpu_s"]
        print(f"GEMM (NumPy, same run): {g['dgemm'] / 1e9:.1f} G multiply-adds per CPU-s "
              f"float64, {g['sgemm'] / 1e9:.1f} float32")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 4096 only, d in {2, 32, 128}")
    ap.add_argument("--parts", default="softmax,sinkhorn,gaussian")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per timed loop")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (best is kept)")
    ap.add_argument("--ns", help="softmax part: key counts N, comma-separated")
    ap.add_argument("--dims", help="softmax part: widths d, comma-separated")
    ap.add_argument("--simd", choices=("native", "avx2"), default="native",
                    help="avx2: hold Numba and torch to AVX2 (restarts the script)")
    ap.add_argument("--out", help="results file (default benchmarks/results/anchors.json, "
                    "anchors_avx2.json with --simd avx2)")
    a = ap.parse_args(argv)
    if a.simd == "avx2" and any(os.environ.get(k) != v for k, v in AVX2_ENV.items()):
        # Numba and torch read these when they are imported: run again in a fresh process,
        # with an empty Numba cache of its own
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, **AVX2_ENV, NUMBA_CACHE_DIR=cache)
            args = sys.argv[1:] if argv is None else list(argv)
            raise SystemExit(subprocess.run([sys.executable, __file__, *args], env=env).returncode)
    out = a.out or str(RESULTS / ("anchors_avx2.json" if a.simd == "avx2" else "anchors.json"))
    parts = set(a.parts.split(","))
    warnings.simplefilter("ignore", tp.errors.EarlyStopWarning)
    t0 = time.perf_counter()
    res: dict = {"machine": machine_line(), "command": "python benchmarks/anchors.py "
                 + " ".join(sys.argv[1:] if argv is None else argv)}
    if "softmax" in parts:
        print("softmax field vs torch scaled_dot_product_attention (CPU flash kernel):")
        ns, ds = ([4096], [2, 32, 128]) if a.quick else ([4096, 16384], [2, 8, 16, 32, 64, 128])
        ns = [int(x) for x in a.ns.split(",")] if a.ns else ns
        ds = [int(x) for x in a.dims.split(",")] if a.dims else ds
        res["softmax"] = softmax_part(ns, ds, a.min_time, a.rounds)
    if "sinkhorn" in parts:
        print("Sinkhorn field (cold solve) vs POT sinkhorn_log:")
        res["sinkhorn"] = sinkhorn_part([1000] if a.quick else [1000, 2000, 4000], a.rounds)
    if "gaussian" in parts:
        print("Gaussian grid: solve_batch vs solve_ivp DOP853 on the stacked members:")
        res["gaussian"] = [gaussian_part(20 if a.quick else 40, a.rounds + 1, f)
                           for f in (0.9, 0.99)]
    _table(res)
    res["machine"]["loadavg_end"] = list(os.getloadavg())
    res["elapsed_s"] = time.perf_counter() - t0
    print(f"load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{res['elapsed_s']:.0f} s in all")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
