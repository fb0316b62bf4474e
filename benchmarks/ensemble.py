"""Ensemble throughput: B systems of n tokens integrated together by ``simulate_ensemble``.

The default case: B = 64 systems of n = 256 tokens in d = 8, softmax attention
(Q, K, V random with entries of variance 1/d, beta = 1), tokens on the sphere's
neighbourhood (Gaussian, normalised), RK4 with a fixed number of steps, only the last state
saved (``SaveAt(every=steps)``: the run is field evaluations and RK4 combinations, not
copies).  Every backend named on the command line runs the same ensemble in the same
process; the table gives the wall and CPU time of one run (best of ``--repeats``, after a
warm-up run that compiles the kernels) and each backend's speed-up over the first one
(NumPy), wall and per CPU-second.

An ensemble is the particle engine over B segments of n tokens (block-diagonal key
ranges): one field evaluation is B n^2 query–key pairs, so the "pairs/s" column is
4 x steps x B n^2 over the wall time.

The ensemble of earlier versions had its own NumPy field evaluator (one batched
``matmul`` per head).  ``--old-tree PATH`` times the same run with the package found at
``PATH`` (a checkout of such a version, e.g. ``git worktree add /tmp/old <commit>``) in a
child process, in the same run, and the table gives each backend's speed-up over it
(the target: Numba at least 5x the old NumPy ensemble); ``--baseline SECONDS`` gives that
time instead when it was measured before.

Usage::

    python benchmarks/ensemble.py                       # numpy,numba; writes results/ensemble.json
    python benchmarks/ensemble.py --old-tree /tmp/old   # and the old NumPy ensemble
    python benchmarks/ensemble.py --backends numpy --steps 10 --out /tmp/e.json

The machine may be shared: the load average before and after is recorded, and the ratios
per CPU-second depend far less on what else runs than the wall-clock ones.

What bounds the Numba row: ``kernel`` in the JSON is one field evaluation's softmax
primitive on the run's projected tokens and key ranges, on one thread (best CPU time
of ``--repeats`` x 5 calls): the primitive alone (``call``, packing included) and its
compiled kernel alone (``kernel``), scaled to the run's 4 x steps evaluations, and the
ratio the old NumPy ensemble's CPU time would have over a run that were only kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import transformer_pde as tp
from transformer_pde.particles.ensemble import simulate_ensemble

RESULTS = Path(__file__).resolve().parent / "results"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def problem(B: int, n: int, d: int, seed: int = 0) -> tuple[tp.Attention, np.ndarray]:
    """The benchmark's attention and initial tokens (B, n, d), seeded."""
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    X0 = rng.normal(size=(B, n, d))
    X0 /= np.linalg.norm(X0, axis=-1, keepdims=True)
    return tp.Attention("softmax", Q, K, V, beta=1.0), X0


def time_run(backend: str, att: tp.Attention, X0: np.ndarray, steps: int, dt: float,
             repeats: int) -> dict:
    """Best wall and CPU seconds of one ``simulate_ensemble`` run (after a warm-up)."""
    kwargs = dict(t_max=steps * dt, dt=dt, solver="rk4", saveat=tp.SaveAt(every=steps),
                  backend=backend)
    last = simulate_ensemble(att, X0, **kwargs)       # warm-up: compiles, loads kernels
    best, best_cpu = np.inf, np.inf
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        ens = simulate_ensemble(att, X0, **kwargs)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    assert ens.success and ens.info["n_steps"] == steps, (ens.status, ens.info)
    B, n, _ = X0.shape
    return {"backend": backend, "seconds": best, "cpu_seconds": best_cpu,
            "pairs_per_s": 4 * steps * B * n * n / best, "last": last.last}


def kernel_bound(att: tp.Attention, X0: np.ndarray, steps: int, repeats: int) -> dict:
    """CPU seconds of the Numba softmax primitive and of its tiled kernel alone for one
    field evaluation of the benchmark (initial tokens, one thread), and both scaled to
    the run's ``4 * steps`` evaluations."""
    from transformer_pde.backends.numba import NumbaBackend, tiled
    from transformer_pde.backends.ranges import KeyRanges

    B, n, d = X0.shape
    X = X0.reshape(B * n, d)
    q, k, v = (X @ M.T for M in (att.Q, att.K, att.V))
    bias = np.full(B * n, -np.log(n))
    ranges = KeyRanges.segments([n] * B)
    be = NumbaBackend(n_threads=1)
    lo, hi = ranges.lo.copy(), ranges.hi.copy()
    _, qpk, kpk, vpk, bp, lop, hip, nr = tiled.tiled_layout(np.float64, q, k, v, bias, lo, hi)
    out = np.zeros((lop.shape[0], vpk.shape[0] * nr))
    lse = np.full(lop.shape[0], -np.inf)
    work = B * n * n
    qt = tiled.query_tile(lop.shape[0], 1)
    args = (qpk, kpk, vpk, bp, lop, hip, nr, d, qt, *be._groups(lop.shape[0], qt, work), out, lse)

    def best(fn):
        fn()
        t = np.inf
        for _ in range(5 * repeats):
            c0 = time.process_time()
            fn()
            t = min(t, time.process_time() - c0)
        return t
    call = best(lambda: be.softmax(q, k, v, bias, ranges))
    kern = best(lambda: be._run(tiled.softmax_tiled_kernel, work, *args))
    evals = 4 * steps
    return {"call_cpu_s": call, "kernel_cpu_s": kern, "ns_per_pair_kernel": kern / work * 1e9,
            "run_call_cpu_s": call * evals, "run_kernel_cpu_s": kern * evals}


def _table(rows: list[dict], baseline: dict | None) -> str:
    ref = rows[0]
    head = f"{'backend':<8} {'wall s':>8} {'CPU s':>8} {'pairs/s':>10} {'x ' + ref['backend']:>9} " \
           f"{'x/CPU-s':>8}"
    if baseline:
        head += f" {'x old wall':>11} {'x old CPU':>10}"
    lines = [head, "-" * len(head)]
    for r in rows:
        line = (f"{r['backend']:<8} {r['seconds']:>8.3f} {r['cpu_seconds']:>8.3f} "
                f"{r['pairs_per_s']:>10.3g} {ref['seconds'] / r['seconds']:>9.2f} "
                f"{ref['cpu_seconds'] / r['cpu_seconds']:>8.2f}")
        if baseline:
            cpu = baseline.get("cpu_seconds")
            line += f" {baseline['seconds'] / r['seconds']:>11.2f} " + (
                f"{cpu / r['cpu_seconds']:>10.2f}" if cpu else f"{'':>10}")
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="numpy,numba",
                    help="comma-separated backends, the first is the reference (default "
                         "numpy,numba)")
    ap.add_argument("--systems", type=int, default=64, help="B (default 64)")
    ap.add_argument("--tokens", type=int, default=256, help="n (default 256)")
    ap.add_argument("--dim", type=int, default=8, help="d (default 8)")
    ap.add_argument("--steps", type=int, default=20, help="RK4 steps (default 20)")
    ap.add_argument("--dt", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", type=float, default=None,
                    help="wall seconds of the same run with an earlier version's NumPy "
                         "ensemble on this machine")
    ap.add_argument("--old-tree", type=Path, default=None,
                    help="a checkout of an earlier version: time its NumPy ensemble in a "
                         "child process (the baseline)")
    ap.add_argument("--child", action="store_true",
                    help="only time the first backend and print its row as JSON")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    att, X0 = problem(args.systems, args.tokens, args.dim)
    baseline = None if args.baseline is None else {"seconds": args.baseline}
    if args.child:
        row = time_run(args.backends.split(",")[0], att, X0, args.steps, args.dt, args.repeats)
        row.pop("last")
        print(json.dumps(row))
        return 0
    if args.old_tree is not None:
        cmd = [sys.executable, __file__, "--child", "--backends", "numpy"] + [
            f"--{k}={v}" for k, v in (("systems", args.systems), ("tokens", args.tokens),
                                      ("dim", args.dim), ("steps", args.steps),
                                      ("dt", args.dt), ("repeats", args.repeats))]
        env = dict(os.environ, PYTHONPATH=str(args.old_tree.resolve()))
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        old = json.loads(out.stdout.strip().splitlines()[-1])
        baseline = {"seconds": old["seconds"], "cpu_seconds": old["cpu_seconds"]}
        print(f"old NumPy ensemble ({args.old_tree}): {old['seconds']:.3f} s wall, "
              f"{old['cpu_seconds']:.3f} CPU-s", flush=True)
    import numba

    meta = {"command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
            "machine": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "numba": numba.__version__, "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "loadavg_before": _load(), "B": args.systems, "n": args.tokens, "d": args.dim,
            "steps": args.steps, "dt": args.dt, "solver": "rk4", "kind": "softmax",
            "baseline_numpy": baseline,
            "old_tree": None if args.old_tree is None else str(args.old_tree),
            "threads_env": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS",
                                                           "NUMBA_NUM_THREADS")}}
    rows = [time_run(b, att, X0, args.steps, args.dt, args.repeats)
            for b in args.backends.split(",")]
    if "numba" in args.backends.split(","):
        meta["kernel"] = kernel_bound(att, X0, args.steps, args.repeats)
    first = rows[0]["last"]
    for r in rows:
        r["max_abs_diff_vs_first"] = float(np.max(np.abs(r.pop("last") - first)))
    diffs = [r["max_abs_diff_vs_first"] for r in rows]
    meta["loadavg_after"] = _load()
    table = _table(rows, baseline)
    print(table)
    print(f"\nB={args.systems} n={args.tokens} d={args.dim}, RK4 {args.steps} steps; "
          f"max |difference| of the last states vs {rows[0]['backend']}: "
          f"{max(diffs):.2g}; load average before/after: {meta['loadavg_before']} / "
          f"{meta['loadavg_after']}")
    out_path = args.out or RESULTS / "ensemble.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"meta": meta, "rows": rows, "table": table}, indent=1))
    kb = meta.get("kernel")
    if kb:
        old = (baseline or {}).get("cpu_seconds")
        print(f"Numba, one thread, per run of {4 * args.steps} evaluations: softmax primitive "
              f"{kb['run_call_cpu_s']:.3f} CPU-s, its kernel alone {kb['run_kernel_cpu_s']:.3f} "
              f"CPU-s ({kb['ns_per_pair_kernel']:.2f} ns per pair)" + (
                  f"; a run that were only kernel: {old / kb['run_kernel_cpu_s']:.2f}x the old "
                  "NumPy ensemble" if old else ""))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
