"""Benchmark: a rank study through ``transformer_pde.sweep`` against the serial loop.

Setting: ``RankCell()`` (the paper's rank trial: exact moment solves until the covariance
converges) over kinds {softmax, l2}
x d {3, 4, 5} x draws, 200 cells by default.

* serial loop: the cell function called in a plain Python loop (no engine at all);
* ``sweep.run(scheduler="serial")``: the engine in-process (outputs, bookkeeping, Zarr store);
* ``sweep.run(workers=W)``: the embedded Dask LocalCluster with W single-threaded worker
  processes, writing the Zarr store; timed with and without the cluster's start-up (the
  second by running the study on an already started cluster).

The engine's per-cell overhead is measured on a cell that does nothing (in-process engine
with a Zarr store, and the Dask cluster), divided by the number of cells.  The machine may be
shared: the 1-minute load average is printed and stored.

Run:  python benchmarks/sweep.py [--quick] [--workers 2]   (writes benchmarks/results/sweep.json)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from transformer_pde import sweep


def nothing(params, rng):
    return {"x": 0.0}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="48 cells instead of 200")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sweep.json"))
    args = ap.parse_args()
    draws = 8 if args.quick else 34  # 6 (kind, d) pairs x draws ~ 200 cells
    grid = sweep.Grid({"kind": ["softmax", "l2"], "d": [3, 4, 5]}, draws=draws, seed=0)
    cell = sweep.RankCell()
    n = grid.n_cells
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp())

    t_loop, _ = timed(lambda: [cell(c.params, c.rng()) for c in grid])
    t_serial, ref = timed(lambda: sweep.run(sweep.Study(grid, cell), tmp / "serial.zarr",
                                            scheduler="serial", progress=False))
    t_dask, ds = timed(lambda: sweep.run(sweep.Study(grid, cell), tmp / "dask.zarr",
                                         workers=args.workers, progress=False))
    assert ds["rank"].equals(ref["rank"]) and ds["t_stop"].equals(ref["t_stop"])

    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.run(lambda: __import__("transformer_pde.gaussian"))  # warm the workers
        t_warm, _ = timed(lambda: sweep.run(sweep.Study(grid, cell), tmp / "warm.zarr",
                                            scheduler=client, progress=False))
        empty = sweep.Grid({"i": list(range(n))})
        t_empty_dask, _ = timed(lambda: sweep.run(sweep.Study(empty, nothing), tmp / "e1.zarr",
                                                  scheduler=client, progress=False))
    t_empty_serial, _ = timed(lambda: sweep.run(sweep.Study(empty, nothing), tmp / "e2.zarr",
                                                scheduler="serial", progress=False))
    rows = [("serial loop (no engine)", t_loop), ("engine, in-process + Zarr", t_serial),
            (f"Dask LocalCluster x{args.workers}, incl. start", t_dask),
            (f"Dask cluster x{args.workers}, started", t_warm)]
    print(f"rank study: {n} cells; load average at start {load0:.2f}")
    print(f"{'run':<40s} {'seconds':>9s} {'speed-up vs loop':>17s}")
    for name, t in rows:
        print(f"{name:<40s} {t:9.2f} {t_loop / t:17.2f}")
    print(f"engine overhead per cell: in-process + Zarr {1e3 * t_empty_serial / n:.2f} ms, "
          f"Dask cluster {1e3 * t_empty_dask / n:.2f} ms")
    result = {"cells": n, "workers": args.workers, "loadavg_start": load0,
              "loadavg_end": os.getloadavg()[0], "machine": platform.machine(),
              "cpu_count": os.cpu_count(), "seconds": dict(rows),
              "speedup_vs_loop": {k: t_loop / v for k, v in rows},
              "overhead_ms_per_cell": {"in_process_zarr": 1e3 * t_empty_serial / n,
                                       "dask": 1e3 * t_empty_dask / n}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
