"""Time of ``cluster_counts`` on a post-LN run of N tokens, against the dense tree it replaced.

The run: N tokens uniform on the sphere S^2, softmax attention with beta = 9 (the tokens
gather into a few clusters), RK4 with dt = 0.1 up to t = 12: 121 saved frames.  For every N
``cluster_counts(traj)`` (the separated cut, exact minimum spanning tree up to
``EXACT_MST_MAX`` tokens) is timed with the compiled Prim tree of the package and, when
``--reference`` is given, with the dense scipy tree it replaced (the distance matrix and
``scipy.sparse.csgraph.minimum_spanning_tree``) on the same frames; the cluster counts of
the two must agree.  The first call (numba compilation or loading its cache) is made before
the timing.

One core: BLAS/OpenMP threads are limited to 1 before numpy is imported.

Run:  python benchmarks/clusters.py [--sizes 150 500 2000] [--reference]
Writes benchmarks/results/clusters.json.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import transformer_pde as tp  # noqa: E402
from transformer_pde.diagnostics import clustering  # noqa: E402


def _dense_tree(Z):
    """The tree the package formed before the compiled one (kept for comparison)."""
    from scipy.sparse.csgraph import minimum_spanning_tree
    from scipy.spatial.distance import pdist, squareform

    D = squareform(pdist(Z))
    off = D + 1.0
    np.fill_diagonal(off, 0.0)
    T = minimum_spanning_tree(off).tocoo()
    return T.row, T.col, D[T.row, T.col]


def _run(n: int, seed: int = 0):
    X0 = np.random.default_rng(seed).normal(size=(n, 3))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), beta=9.0)
    t = time.perf_counter()
    traj = tp.simulate(att, X0, t_max=12.0, dt=0.1, block=tp.Block(constraint="sphere"))
    return traj, time.perf_counter() - t


def _timed(traj):
    t = time.perf_counter()
    counts = clustering.cluster_counts(traj)
    return counts, time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[150, 500, 1000, 2000])
    p.add_argument("--reference", action="store_true",
                   help="also time the dense tree (slow: about 2-3 s per frame at N = 2000)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "clusters.json"))
    args = p.parse_args(argv)
    clustering.clusters(np.random.default_rng(1).normal(size=(10, 3)))   # compile / load
    rows = []
    print(f"{'N':>6} {'frames':>6} {'simulate s':>10} {'counts s':>9} {'dense s':>9} "
          f"{'final clusters':>14}")
    for n in args.sizes:
        traj, t_sim = _run(n)
        counts, t_new = _timed(traj)
        row = {"N": n, "frames": int(traj.times.size), "simulate_s": t_sim,
               "cluster_counts_s": t_new, "final_clusters": int(counts[-1])}
        if args.reference:
            compiled = clustering._mst_edges
            clustering._mst_edges = _dense_tree
            try:
                ref, t_ref = _timed(traj)
            finally:
                clustering._mst_edges = compiled
            if not np.array_equal(ref, counts):
                raise SystemExit(f"N={n}: the dense tree gives other counts")
            row["dense_s"] = t_ref
        rows.append(row)
        dense = f"{row['dense_s']:9.2f}" if "dense_s" in row else f"{'-':>9}"
        print(f"{n:6d} {row['frames']:6d} {t_sim:10.2f} {t_new:9.2f} {dense} "
              f"{row['final_clusters']:14d}")
    res = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "python": platform.python_version(), "cpu_count": os.cpu_count(),
                       "numpy": np.__version__},
           "exact_mst_max": clustering.EXACT_MST_MAX, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
