"""Time and accuracy of ``wasserstein`` (exact / sliced / Sinkhorn divergence) against exact W2.

Data (``--data``): "gaussians", two 2-D Gaussian clouds of N points each, X ~ N(0, I)
and Y ~ N((1, 0), diag(1.5^2, 0.7^2)); "clusters", two samples of N points from the same
8 tight clusters (what attention flows produce), whose cluster masses differ by sampling.
Uniform weights, fixed seed.  For every N the three
methods of :func:`transformer_pde.diagnostics.wasserstein` run at their defaults
(``method="sinkhorn"``: ``rel_reg=1e-2``, ``tol=1e-3``, ``max_iter=1000``) and are
compared with the exact W2 (``ot.emd2``) when N^2 <= ``--exact-max-pairs`` (default
25e6, i.e. N = 5000: a 200 MB cost matrix and a few seconds in 2-D, beyond the
``EXACT_MAX_PAIRS`` = 4e6 up to which ``method="auto"`` solves exactly).  Reported per method:
wall and CPU seconds (median over ``--repeats``), the value, and its relative error
against exact W2; for Sinkhorn also the iterations of the cross / two self problems,
whether all three reached ``tol`` and whether the documented bracket

    W2^2 - eps/2 (H(a) + H(b)) <= S_eps <= W2^2 + eps min(H(a), H(b))

holds.  The population Bures-Wasserstein distance of the two Gaussians is listed for
context (the sample W2 differs from it by the sampling error).

One core: BLAS/OpenMP threads are limited to 1 before numpy is imported.

Run:  python benchmarks/wasserstein.py [--sizes 500 2000 5000] [--data gaussians clusters]
      [--repeats 1]
Writes benchmarks/results/wasserstein.json.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import ot  # noqa: E402,F401  (imported here so that its import time is not timed)

from transformer_pde.diagnostics import bures_wasserstein, wasserstein, wasserstein_result  # noqa: E402

MEAN_Y = np.array([1.0, 0.0])
SCALE_Y = np.array([1.5, 0.7])


def clouds(n: int, seed: int = 0, data: str = "gaussians") -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if data == "clusters":
        # 8 tight clusters (spread 1e-2, centres ~3 apart) with sampled, hence unequal,
        # masses: the hard case for Sinkhorn (mass crosses where the kernel is tiny)
        c = rng.normal(size=(8, 2)) * 3
        return tuple(c[rng.integers(0, 8, n)] + 1e-2 * rng.normal(size=(n, 2))
                     for _ in range(2))
    return rng.normal(size=(n, 2)), rng.normal(size=(n, 2)) * SCALE_Y + MEAN_Y


def timed(fn, repeats: int):
    """(value, median wall s, median CPU s) of ``fn()`` over ``repeats`` calls."""
    walls, cpus, val = [], [], None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        val = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return val, float(np.median(walls)), float(np.median(cpus))


def run_size(n: int, repeats: int, exact_max_pairs: float, data: str) -> dict:
    X, Y = clouds(n, data=data)
    row: dict = {"data": data, "N": n, "M": n, "d": 2}
    exact = None
    if n * n <= exact_max_pairs:
        exact, wall, cpu = timed(lambda: wasserstein(X, Y, method="exact"), repeats)
        row["exact"] = {"value": exact, "wall_s": wall, "cpu_s": cpu}
    sl, wall, cpu = timed(lambda: wasserstein(X, Y, method="sliced"), repeats)
    row["sliced"] = {"value": sl, "wall_s": wall, "cpu_s": cpu}
    info, wall, cpu = timed(lambda: wasserstein_result(X, Y, method="sinkhorn"), repeats)
    sk = info.value
    row["sinkhorn"] = {"value": sk, "wall_s": wall, "cpu_s": cpu, "reg": info.reg,
                       "n_iter": list(info.n_iter), "marginal_err": list(info.err),
                       "converged": info.converged}
    if exact is not None:
        for m in ("sliced", "sinkhorn"):
            row[m]["rel_err"] = row[m]["value"] / exact - 1.0
            row[m]["rel_err_sq"] = row[m]["value"] ** 2 / exact ** 2 - 1.0
        H = math.log(n)  # uniform weights: H(a) = H(b) = log N
        s2, w2 = info.divergence, exact ** 2
        row["sinkhorn"]["bracket_ok"] = bool(w2 - info.reg * H <= s2 <= w2 + info.reg * H)
    if data == "gaussians":
        row["population_bw"] = bures_wasserstein(np.zeros(2), np.eye(2), MEAN_Y,
                                                 np.diag(SCALE_Y ** 2))
    return row


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    head = (f"{'data':>9} {'N':>6} {'method':>9} {'wall s':>8} {'cpu s':>8} {'W2':>9} "
            f"{'rel err':>9} {'iters (cross/self/self)':>24} {'conv':>5} {'bracket':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        for m in ("exact", "sliced", "sinkhorn"):
            e = r.get(m)
            lead = f"{r['data']:>9} {r['N']:>6} {m:>9}"
            if e is None:
                lines.append(f"{lead} {'(skipped: N*M > exact limit)':>40}")
                continue
            it = "/".join(map(str, e["n_iter"])) if "n_iter" in e else ""
            conv = str(e["converged"]) if "converged" in e else ""
            br = str(e.get("bracket_ok", "")) if m == "sinkhorn" else ""
            lines.append(f"{lead} {e['wall_s']:>8.2f} {e['cpu_s']:>8.2f} "
                         f"{e['value']:>9.5f} {_fmt(e.get('rel_err'), '>9.1e')} {it:>24} "
                         f"{conv:>5} {br:>7}")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 5000])
    p.add_argument("--data", nargs="+", default=["gaussians", "clusters"],
                   choices=["gaussians", "clusters"])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--exact-max-pairs", type=float, default=25e6)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "wasserstein.json"))
    args = p.parse_args(argv)
    rows = []
    for data in args.data:
        for n in args.sizes:
            rows.append(run_size(n, args.repeats, args.exact_max_pairs, data))
            print("\n".join(table(rows[-1:]).splitlines()[2:]), flush=True)
    print()
    print(table(rows))
    res = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "python": platform.python_version(), "cpu_count": os.cpu_count(),
                       "threads": 1},
           "repeats": args.repeats, "exact_max_pairs": args.exact_max_pairs, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
