"""Benchmark: a rank study through ``transformer_pde.sweep`` against the serial loop.

Setting: ``RankCell()`` (the paper's rank trial: exact moment solves until the covariance
converges) over kinds {softmax, l2} x d {3, 4, 5} x draws, 204 cells by default.

* serial loop: the cell function called in a plain Python loop (no engine at all);
* ``sweep.run(scheduler="serial")``: the engine in-process (outputs, bookkeeping, Zarr store);
* ``sweep.run(workers=W)``: the embedded Dask LocalCluster with W single-threaded worker
  processes, writing the Zarr store, timed with its start-up and shut-down, and on an
  already started cluster (made with the embedded cluster's own Dask settings and start
  method).  On Linux the embedded cluster forks its workers from this process (they
  inherit its imports and compiled kernels) unless Numba's thread pool runs here; the
  start method used is printed and stored;
* the embedded cluster with its workers spawned instead (each a new interpreter that
  imports the package, NumPy, SciPy and Numba and loads the kernels): what it does where
  forking is not safe.

CPU seconds of every run are measured too, over all the processes that did its work
(this one, the reaped worker processes of an embedded cluster, the live workers of the
started one): the CPU cost of the engine and of the cluster's start and stop, which the
load of other processes does not hide (it hides the wall-clock speed-ups).

Each is timed ``--repeat`` times (default 3), the runs of one round back to back; the
table gives the fastest and the median of each, and the speed-ups compare fastest with
fastest and median with median.  On this project's virtual machines the same work varies
by up to 30 % from one run to the next (other tenants of the host), and interference only
ever slows a run down, hence the minimum (as :mod:`timeit` does).

The engine's overhead is measured on a cell that does nothing (in-process with a Zarr store,
and on the started Dask cluster), with n and 4n cells: per cell = the slope
(t(4n) - t(n)) / 3n, fixed = the rest (store creation, task submission).  The 1-minute
load average (as ``uptime`` prints it) is stored at the start and at the end: with a load
above the number of cores the speed-ups of the cluster are bounded by the cores left free --
and with Linux's scheduler autogroups (``/proc/sys/kernel/sched_autogroup_enabled`` = 1)
all processes of one session, the workers included, share one session's CPU share, so on a
machine saturated by other sessions more worker processes cannot run faster at all.  The
speed-ups are meaningful only near load 0.

Run:  PYTHONPATH=. python benchmarks/sweep.py [--quick] [--workers 2] [--repeat 3]
(writes benchmarks/results/sweep.json; about 3 minutes on an idle 2-core machine)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import dask
import psutil

from transformer_pde import sweep


def nothing(params, rng):
    return {"x": 0.0}


def _cpu(pids=()) -> float:
    """CPU seconds of this process, of its reaped children (the embedded cluster's worker
    processes once it has stopped them) and of the live processes ``pids``."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    for pid in pids:
        try:
            c = psutil.Process(pid).cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


#: CPU seconds of every timed run (all processes that did its work), by run name
CPU: dict[str, list[float]] = {}


def timed(fn, name=None, pids=()):
    t0, c0 = time.perf_counter(), _cpu(pids)
    out = fn()
    t = time.perf_counter() - t0
    if name is not None:
        CPU.setdefault(name, []).append(_cpu(pids) - c0)
    return t, out


def overhead(tmp: Path, n: int, **kw) -> tuple[float, float]:
    """(seconds per cell, fixed seconds per study) of the engine on empty cells."""
    t = []
    for k in (n, 4 * n):
        grid = sweep.Grid({"i": list(range(k))})
        store = tmp / f"empty-{time.time_ns()}.zarr"
        t0 = time.perf_counter()
        sweep.run(sweep.Study(grid, nothing), store, progress=False, **kw)
        t.append(time.perf_counter() - t0)
    per_cell = max(0.0, (t[1] - t[0]) / (3 * n))
    return per_cell, t[0] - n * per_cell


def _autogroup() -> str | None:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        return None


def _worker_threads() -> dict:
    return {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                           "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="48 cells instead of 204")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each (default 3)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sweep.json"))
    args = ap.parse_args()
    draws = 8 if args.quick else 34  # 6 (kind, d) pairs x draws = 204 cells
    grid = sweep.Grid({"kind": ["softmax", "l2"], "d": [3, 4, 5]}, draws=draws, seed=0)
    cell = sweep.RankCell()
    n = grid.n_cells
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp())
    # warm this process (imports of scipy, xarray, zarr) so that no timing pays for them
    cell(grid.cell(0).params, grid.cell(0).rng())
    sweep.run(sweep.Study(sweep.Grid({"i": [0]}), nothing), tmp / "warm0.zarr",
              scheduler="serial", progress=False)

    from distributed import Client, LocalCluster

    import transformer_pde.sweep.run as run_module
    from transformer_pde.sweep.run import _EMBEDDED_CLUSTER_CONFIG, _embedded_start_method

    method = _embedded_start_method()
    settings = {**_EMBEDDED_CLUSTER_CONFIG, "distributed.worker.multiprocessing-method": method}

    names = ["serial loop (no engine)", "engine, in-process + Zarr",
             f"Dask LocalCluster x{args.workers}, incl. start",
             f"Dask cluster x{args.workers}, started",
             f"Dask LocalCluster x{args.workers}, incl. start, spawned"]
    times: dict[str, list[float]] = {k: [] for k in names}
    ref = None
    for r in range(args.repeat):
        times[names[0]].append(timed(lambda: [cell(c.params, c.rng()) for c in grid],
                                     names[0])[0])
        t, ds = timed(lambda r=r: sweep.run(sweep.Study(grid, cell), tmp / f"serial{r}.zarr",
                                            scheduler="serial", progress=False), names[1])
        times[names[1]].append(t)
        ref = ds if ref is None else ref
        t, ds = timed(lambda r=r: sweep.run(sweep.Study(grid, cell), tmp / f"dask{r}.zarr",
                                            workers=args.workers, progress=False), names[2])
        times[names[2]].append(t)
        assert ds["rank"].equals(ref["rank"]) and ds["t_stop"].equals(ref["t_stop"])
        # the same with spawned workers (each a new interpreter that imports everything):
        # what the embedded cluster does where forking is not safe
        run_module._embedded_start_method = lambda: "spawn"
        try:
            t, ds = timed(lambda r=r: sweep.run(sweep.Study(grid, cell), tmp / f"spawn{r}.zarr",
                                                workers=args.workers, progress=False), names[4])
        finally:
            run_module._embedded_start_method = _embedded_start_method
        times[names[4]].append(t)
        assert ds["rank"].equals(ref["rank"]) and ds["t_stop"].equals(ref["t_stop"])

    with dask.config.set(settings), \
            LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                         dashboard_address=":0") as cluster, Client(cluster) as client:
        client.run(lambda: __import__("transformer_pde.paper"))  # warm the workers
        env = next(iter(client.run(_worker_threads).values()))
        pids = list(client.run(os.getpid).values())
        for r in range(args.repeat):
            t, ds = timed(lambda r=r: sweep.run(sweep.Study(grid, cell), tmp / f"started{r}.zarr",
                                                scheduler=client, progress=False),
                          names[3], pids)
            times[names[3]].append(t)
            assert ds["rank"].equals(ref["rank"])
        over_dask = overhead(tmp, n, scheduler=client)
    over_serial = overhead(tmp, n, scheduler="serial")
    load1 = os.getloadavg()[0]
    shutil.rmtree(tmp, ignore_errors=True)
    best = {k: min(v) for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"rank study: {n} cells, {args.workers} workers ({method}), {os.cpu_count()} cores, "
          f"{args.repeat} runs each; load average {load0:.2f} at start, {load1:.2f} at end")
    cpu = {k: min(v) for k, v in CPU.items()}
    print(f"{'run':<44s} {'fastest s':>9s} {'median s':>9s} {'speed-up':>9s} "
          f"{'(median)':>9s} {'CPU s':>7s} {'CPU/loop':>8s}")
    for k in names:
        print(f"{k:<44s} {best[k]:9.2f} {median[k]:9.2f} {best[names[0]] / best[k]:9.2f} "
              f"{median[names[0]] / median[k]:9.2f} {cpu[k]:7.2f} {cpu[k] / cpu[names[0]]:8.3f}")
    print("(CPU s: least CPU time of a run, all processes that did its work: this one, the "
          "workers and, for the embedded cluster, their start and stop; CPU/loop - 1 is the "
          "engine's and the cluster's cost, which load does not hide)")
    print(f"engine overhead per cell: in-process + Zarr {1e3 * over_serial[0]:.2f} ms "
          f"(+ {over_serial[1]:.2f} s per study), Dask cluster {1e3 * over_dask[0]:.2f} ms "
          f"(+ {over_dask[1]:.2f} s per study); worker threads {env}")
    result = {"cells": n, "workers": args.workers, "repeat": args.repeat,
              "loadavg_start": load0, "loadavg_end": load1, "machine": platform.machine(),
              "cpu_count": os.cpu_count(), "seconds": times,
              "seconds_fastest": best, "seconds_median": median,
              "cpu_seconds": CPU, "cpu_seconds_least": cpu,
              "cpu_vs_loop": {k: v / cpu[names[0]] for k, v in cpu.items()},
              "speedup_vs_loop": {k: best[names[0]] / v for k, v in best.items()},
              "speedup_vs_loop_median": {k: median[names[0]] / v for k, v in median.items()},
              "overhead_ms_per_cell": {"in_process_zarr": 1e3 * over_serial[0],
                                       "dask": 1e3 * over_dask[0]},
              "overhead_s_per_study": {"in_process_zarr": over_serial[1],
                                       "dask": over_dask[1]},
              "embedded_cluster_config": _EMBEDDED_CLUSTER_CONFIG,
              "worker_start_method": method,
              "worker_thread_env": env, "sched_autogroup_enabled": _autogroup(),
              "command": "PYTHONPATH=. python benchmarks/sweep.py"
                         + (" --quick" if args.quick else "")
                         + f" --workers {args.workers} --repeat {args.repeat}"}
    if max(load0, load1) > (os.cpu_count() or 1):
        print(f"note: load above the {os.cpu_count()} cores (other processes hold them; "
              f"sched autogroup = {_autogroup()}): the speed-ups above are not those of an "
              "idle machine")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
