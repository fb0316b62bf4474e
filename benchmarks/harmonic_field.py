"""Benchmark: one harmonic field evaluation on the circle at N = 10^6 and 10^7 tokens.

Softmax attention with Q = K = V = I on the unit circle, ``FieldOptions(method="harmonic")``
(:mod:`transformer_pde.fields.harmonic`, Numba backend) against the direct Numba field,
for beta = 5 (tokens uniform on the circle, default ``harmonic_tol = 1e-13``) and
beta = 100: tokens in four clusters of angular width 0.01 at the default tolerance, and
uniform tokens at ``harmonic_tol = 1e-12`` (uniform tokens at beta = 100 have too little
mass near each query, F_w ~ 0.04, for the expansion to certify 1e-13: every query would be
evaluated directly).  For each row:

* ``t_harmonic``: the best of ``--repeat`` evaluations (after one warm-up call, which
  compiles or loads the kernels), moments and mode sums included;
* ``t_direct``: the direct Numba field at ``N_ref = 10^5`` tokens (best of two), and its
  extrapolation by N^2 to the row's N; ``speedup`` = extrapolated direct / harmonic;
* ``max_rel_error``: max over tokens of |harmonic - direct| / max |direct| at ``N_ref``;
* ``direct_queries``: the queries the harmonic evaluation answered by the direct sum.

A second table times one evaluation at small N (beta = 5, uniform tokens) on the NumPy
and the Numba backends (best of ``--small-repeat``): the per-call overhead.

The machine's load average is printed and stored (timings on a loaded machine are longer;
the ratios are measured under the same load).

Run:  python benchmarks/harmonic_field.py [--quick]
Writes benchmarks/results/harmonic_field.json (about 3 minutes; the 10^7 rows need ~1.5 GB).
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

RESULTS = Path(__file__).resolve().parent / "results"


def tokens(kind: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` unit vectors of the circle: uniform, or four clusters of width 0.01."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        th = rng.uniform(0.0, 2.0 * np.pi, n)
    else:
        th = rng.choice([0.3, 1.9, 3.1, 4.8], size=n) + 0.01 * rng.normal(size=n)
    return np.stack([np.cos(th), np.sin(th)], axis=1)


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def small_rows(repeat: int) -> list:
    """One evaluation at small N on the NumPy and Numba backends (beta = 5)."""
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=5.0)
    print(f"\n{'N':>7} {'t_numpy':>10} {'t_numba':>10} {'numba/numpy':>11}")
    out = []
    for n in (100, 600, 10**4):
        X = tokens("uniform", n)
        t = {}
        for be in ("numpy", "numba"):
            ev = FieldEvaluator(att, n, backend=be, method="harmonic")
            ev(0.0, X)
            t[be], _ = best(lambda ev=ev, X=X: ev(0.0, X), repeat)
        out.append({"N": n, "t_numpy": t["numpy"], "t_numba": t["numba"]})
        print(f"{n:7d} {1e3 * t['numpy']:8.3f}ms {1e3 * t['numba']:8.3f}ms "
              f"{t['numba'] / t['numpy']:11.2f}", flush=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="N = 10^5 and 10^6, N_ref = 10^4")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--small-repeat", type=int, default=50)
    p.add_argument("--out", default=str(RESULTS / "harmonic_field.json"))
    a = p.parse_args(argv)
    n_ref = 10**4 if a.quick else 10**5
    sizes = [10**5, 10**6] if a.quick else [10**6, 10**7]
    rows = []
    load = os.getloadavg()[0]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {load:.1f}")
    print(f"{'beta':>5} {'tokens':>8} {'tol':>6} {'N':>9} {'modes':>5} {'t_harmonic':>11} "
          f"{'t_direct(ext)':>14} {'speedup':>9} {'direct_q':>8} {'max_rel_err':>11}")
    for beta, kind, tol in ((5.0, "uniform", 1e-13), (100.0, "clusters", 1e-13),
                            (100.0, "uniform", 1e-12)):
        att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=beta)
        X = tokens(kind, n_ref)
        ev = FieldEvaluator(att, n_ref, backend="numba", method="harmonic", harmonic_tol=tol)
        ev(0.0, X)                                              # compile / load, warm
        harm = ev(0.0, X)
        tp.velocity(att, X[:256], backend="numba")              # compile / load, warm
        t_dir, direct = best(lambda X=X, att=att: tp.velocity(att, X, backend="numba"), 2)
        err = float(np.abs(harm - direct).max() / np.abs(direct).max())
        for n in sizes:
            Xn = tokens(kind, n)
            evn = FieldEvaluator(att, n, backend="numba", method="harmonic", harmonic_tol=tol)
            evn(0.0, Xn)
            t_h, _ = best(lambda evn=evn, Xn=Xn: evn(0.0, Xn), a.repeat)
            t_ext = t_dir * (n / n_ref) ** 2
            fell = evn.info["harmonic_direct_queries"] // evn.info["harmonic_evaluations"]
            row = {"beta": beta, "tokens": kind, "harmonic_tol": tol, "N": n, "modes": evn.info["harmonic_modes"],
                   "t_harmonic": t_h, "N_ref": n_ref, "t_direct_ref": t_dir,
                   "t_direct_extrapolated": t_ext, "speedup": t_ext / t_h,
                   "direct_queries": fell, "max_rel_error_at_N_ref": err}
            rows.append(row)
            print(f"{beta:5g} {kind:>8} {tol:6.0e} {n:9.0e} {row['modes']:5d} {t_h:10.3f}s "
                  f"{t_ext:13.0f}s {row['speedup']:9.3g} {fell:8d} {err:11.1e}", flush=True)
            del Xn, evn
    small = small_rows(a.small_repeat)
    res = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "cores": os.cpu_count(), "load_average": load},
           "rows": rows, "small": small}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
