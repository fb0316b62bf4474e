"""Stored outputs of the Sinkhorn solvers on fixed inputs (tests/sinkhorn/test_sinkhorn_golden.py).

Run from the repository root to regenerate ``tests/data/sinkhorn_golden.npz``::

    PYTHONPATH=$PWD python tests/data/make_sinkhorn_golden.py

Regenerate only when a change of the mathematics is intended (say which in the commit).
Besides the outputs, the file keeps "canaries": the raw primitives the solvers are built
on (a BLAS product, the NumPy and Numba ``lse`` passes) on fixed inputs.  The test demands
bit-identity only where the canaries are bit-identical on the machine running it (another
BLAS or CPU rounds differently), and a relative 1e-10 agreement otherwise.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

import transformer_pde as tp
from transformer_pde.backends import get_backend
from transformer_pde.sinkhorn import sinkhorn_potentials

OUT = Path(__file__).with_name("sinkhorn_golden.npz")
A_GEN = np.array([[1.0, 0.5], [-0.3, 0.8]])
A_SYM = np.array([[1.0, 0.3], [0.3, -0.5]])
V = np.array([[0.5, -0.5], [0.5, 0.2]])


def canaries() -> dict:
    """The primitives under the solvers, on fixed inputs."""
    rng = np.random.default_rng(123)
    X = rng.normal(size=(67, 3))
    Y = rng.normal(size=(41, 3))
    lw = rng.normal(size=41)
    out = {"blas": X @ Y.T, "exp": np.exp(X), "log": np.log(np.abs(X) + 0.5)}
    for name in ("numpy", "numba"):
        be = get_backend(name)
        out[f"lse_{name}"] = np.asarray(be.lse(X, Y, lw, None))
        o, lse = be.softmax(X, Y, Y, lw, None)
        out[f"softmax_{name}"] = np.asarray(o)
        out[f"softmax_lse_{name}"] = np.asarray(lse)
    return out


def _out(res) -> np.ndarray:
    """The value average of a solve, or a NaN marker when it did not converge."""
    return np.array([np.nan]) if res.out is None else np.asarray(res.out)


def potentials_cases() -> dict:
    out = {}
    rng = np.random.default_rng(7)
    n = 120
    X = rng.normal(size=(n, 2))
    w = rng.uniform(0.5, 1.5, size=n)
    w[5] = 0.0
    w /= w.sum()
    with np.errstate(divide="ignore"):
        logw = np.log(w)
    vals = X @ V.T
    for bname in ("numpy", "numba"):
        be = get_backend(bname)
        for aname, A in (("gen", A_GEN), ("sym", A_SYM)):
            sym = aname == "sym"
            qx = X @ A.T
            for eps in (1.0, 0.02):                   # 0.02: cold eps-scaling ladder
                for m in (10, 0):
                    key = f"pot_{bname}_{aname}_eps{eps}_m{m}"
                    r = sinkhorn_potentials(be, qx, X, logw, eps, symmetric=sym, values=vals,
                                            anderson=m, max_iter=5000 if m else 400)
                    out[key + "_f"] = np.asarray(r.f)
                    out[key + "_g"] = np.asarray(r.g)
                    out[key + "_out"] = _out(r)
                    out[key + "_it"] = np.array([r.n_iter])
                    out[key + "_err"] = np.array([r.err])
                    # warm start from a perturbed solution, with the secant memory
                    g0 = np.asarray(r.g) + 0.01 * np.sin(X[:, 0])
                    r2 = sinkhorn_potentials(be, qx * 1.01, X, logw, eps, symmetric=sym,
                                             g0=g0, values=vals, anderson=m, memory=r.memory,
                                             max_iter=5000 if m else 400)
                    out[key + "_warm_f"] = np.asarray(r2.f)
                    out[key + "_warm_g"] = np.asarray(r2.g)
                    out[key + "_warm_out"] = _out(r2)
                    out[key + "_warm_it"] = np.array([r2.n_iter])
    # positive weights: the Numba backend's fused sweep (one pass per iteration)
    w = rng.uniform(0.5, 1.5, size=n)
    logw = np.log(w / w.sum())
    for bname in ("numpy", "numba"):
        be = get_backend(bname)
        r = sinkhorn_potentials(be, X @ A_GEN.T, X, logw, 0.5, values=vals)
        key = f"pot_{bname}_gen_positive"
        out[key + "_f"], out[key + "_g"] = np.asarray(r.f), np.asarray(r.g)
        out[key + "_out"], out[key + "_it"] = _out(r), np.array([r.n_iter])
    return out


def field_cases() -> dict:
    out = {}
    rng = np.random.default_rng(11)
    X = rng.normal(size=(90, 4))
    Xq = rng.normal(size=(13, 4))
    w = rng.uniform(0.5, 1.5, size=90)
    Q, K, Vh = (rng.normal(size=(4, 4)) * 0.5 for _ in range(3))
    att = tp.Attention("sinkhorn", Q, K, Vh, heads=2, eps=0.7)
    for bname in ("numpy", "numba"):
        out[f"field_{bname}"] = np.asarray(tp.velocity(att, X, weights=w, backend=bname))
        out[f"field_query_{bname}"] = np.asarray(tp.velocity(att, X, weights=w, queries=Xq,
                                                             backend=bname))
    return out


def trajectory_cases() -> dict:
    out = {}
    rng = np.random.default_rng(3)
    X = rng.normal(size=(150, 2))
    for aname, A in (("gen", A_GEN), ("sym", A_SYM)):
        att = tp.Attention("sinkhorn", A, np.eye(2), V, eps=1.0)
        for bname in ("numpy", "numba"):
            for solver, dt, t_max in (("rk4", 0.1, 0.6), ("euler", 0.01, 0.08)):
                traj = tp.simulate(att, X, t_max=t_max, dt=dt, solver=solver,
                                   field=tp.FieldOptions(backend=bname))
                key = f"traj_{aname}_{bname}_{solver}"
                out[key] = np.asarray(traj.states[-1])
                out[key + "_its"] = np.asarray(traj.info["sinkhorn_iterations"])
    return out


def w2_cases() -> dict:
    out = {}
    rng = np.random.default_rng(5)
    X = rng.normal(size=(160, 2))
    Y = 0.7 * rng.normal(size=(130, 2)) + [1.0, -0.5]
    centers = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0]])
    Xc = centers[rng.integers(0, 3, size=150)] + 0.2 * rng.normal(size=(150, 2))
    Yc = centers[rng.integers(0, 3, size=140)] + 0.2 * rng.normal(size=(140, 2)) + 0.3
    wx = rng.uniform(0.2, 1.0, size=160)
    wx[7] = 0.0
    cases = {"gauss": (X, Y, None, None, {}), "clustered": (Xc, Yc, None, None, {}),
             "weighted": (X, Y, wx, None, {"tol": 1e-6}),
             "abs_reg": (X, Y, None, None, {"reg": 0.05, "tol": 1e-8}),
             "budget": (Xc, Yc, None, None, {"max_iter": 30})}
    for name, (a, b, wa, wb, kw) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = tp.diagnostics.wasserstein_result(a, b, weights_x=wa, weights_y=wb,
                                                  method="sinkhorn", **kw)
        out[f"w2_{name}"] = np.array([r.value, r.divergence, *r.err])
        out[f"w2_{name}_it"] = np.array(r.n_iter)
    return out


def main() -> None:
    data = {}
    for part in (canaries(), potentials_cases(), field_cases(), trajectory_cases(), w2_cases()):
        data.update(part)
    canary_keys = sorted(canaries().keys())
    data = {k: v for k, v in data.items()}
    data["__canaries__"] = np.array(canary_keys)
    np.savez_compressed(OUT, **data)
    print(f"wrote {OUT} ({len(data)} arrays)", file=sys.stderr)


if __name__ == "__main__":
    main()
