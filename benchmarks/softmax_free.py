"""Cost of one field evaluation: softmax-free (galerkin, fourier) against linear and softmax.

Unmasked galerkin / fourier fields factorise, Gamma(x) = (sum_j w_j v_j k_j^T) q(x), so one
evaluation costs O(N k c) instead of the O(N^2 k) of the pairwise kinds.  This script times
``velocity`` on the NumPy backend (best of ``--repeat`` runs) for a range of token counts,
prints a table and writes benchmarks/results/softmax_free.json.

Run:  python benchmarks/softmax_free.py [--quick]
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

PAIRWISE_MAX_N = 16_000   # softmax / linear beyond this take more than a few seconds


def best_time(fn, repeat: int) -> float:
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--d", type=int, default=16)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    sizes = [1_000, 4_000] if a.quick else [1_000, 4_000, 16_000, 64_000, 256_000]
    rng = np.random.default_rng(0)
    d = a.d
    Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    kinds = ["galerkin", "fourier", "linear", "softmax"]
    rows = []
    for n in sizes:
        X = rng.normal(size=(n, d))
        row = {"n": n}
        for kind in kinds:
            if kind in ("linear", "softmax") and n > PAIRWISE_MAX_N:
                row[kind] = None
                continue
            att = tp.Attention(kind, Q, K, V, heads=a.heads)
            row[kind] = best_time(lambda att=att, X=X: tp.velocity(att, X), a.repeat)
        rows.append(row)
    print(f"one velocity() call, numpy backend, d={d}, heads={a.heads}, float64 "
          f"(seconds, best of {a.repeat})")
    print("       N | " + " | ".join(f"{k:>9s}" for k in kinds))
    for row in rows:
        cells = [f"{row[k]:9.4f}" if row[k] is not None else "        -" for k in kinds]
        print(f"{row['n']:8d} | " + " | ".join(cells))
    out = Path(__file__).resolve().parent / "results" / "softmax_free.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "d": d, "heads": a.heads, "repeat": a.repeat}
    out.write_text(json.dumps({"benchmark": "softmax_free", "meta": meta, "rows": rows},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
