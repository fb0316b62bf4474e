r"""``transformer-pde bench``: a small built-in timing, or the project's benchmark scripts.

:func:`run_bench` times the particle field on the CPU backends and a batched Gaussian
solve; :func:`run_benchmark_scripts` runs the scripts of ``benchmarks/`` in a source
checkout (:func:`benchmark_scripts`), each of which prints its table and writes
``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..attention import Attention
from ..backends import available_backends
from ..fields import FieldEvaluator
from .exits import ExitCode, RunError, UsageError
from .output import OutputDir

__all__ = ["benchmark_scripts", "cmd_bench", "run_bench", "run_benchmark_scripts"]


def run_bench(*, quick: bool = True, out: str | Path | None = None,
              backends: Sequence[str] | None = None, force: bool = False) -> dict:
    r"""Small built-in timing: particle field evaluations and a Gaussian batch solve.

    Times (best of 3 repeats, after one warm-up call that also compiles numba kernels) one
    evaluation of the softmax field :math:`\Gamma_{\mu_N}` at all :math:`N` tokens in
    :math:`d = 16` on each available CPU backend, and one
    :func:`~transformer_pde.gaussian.solve_batch` of 256 random 4-D softmax Gaussians with
    :math:`V = I` (random :math:`Q, K`, most of which blow up in finite time).
    The project's full benchmark scripts are in ``benchmarks/``.
    """
    # deferred: SciPy takes seconds to import; only this path needs it
    from .. import gaussian  # noqa: PLC0415

    outdir = OutputDir(out, force=force) if out is not None else None
    try:
        rng = np.random.default_rng(0)
        d = 16
        sizes = (256, 1024) if quick else (256, 1024, 4096, 16384)
        att = Attention("softmax", rng.normal(size=(d, d)) / d,
                        rng.normal(size=(d, d)) / math.sqrt(d), np.eye(d))
        rows = []
        wanted = ("numpy", "numba") if backends is None else tuple(backends)
        for be in [b for b in available_backends() if b in wanted]:
            for n in sizes:
                X = rng.normal(size=(n, d))
                ev = FieldEvaluator(att, n, backend=be)
                ev(0.0, ev.be.asarray(X, np.float64))  # warm-up (JIT compilation for numba)
                best = math.inf
                for _ in range(3):
                    t0 = time.perf_counter()
                    ev(0.0, ev.be.asarray(X, np.float64))
                    best = min(best, time.perf_counter() - t0)
                rows.append({"task": "softmax field", "backend": be, "N": n, "d": d,
                             "seconds": best})
        B, dg = 256, 4
        atts = [Attention("softmax", rng.normal(size=(dg, dg)) / 2, rng.normal(size=(dg, dg)),
                          np.eye(dg)) for _ in range(B)]
        F = rng.normal(size=(B, dg, dg))
        t0 = time.perf_counter()
        res = gaussian.solve_batch(atts, np.zeros((B, dg)), F @ np.swapaxes(F, -1, -2) / dg,
                                   t_max=10.0, blowup_threshold=1e3, rtol=1e-8, atol=1e-10)
        rows.append({"task": "gaussian solve_batch", "backend": "numpy", "N": B, "d": dg,
                     "seconds": time.perf_counter() - t0, "status_counts": res.counts()})
        result = {"command": "bench", "quick": quick, "machine": platform.platform(),
                  "python": platform.python_version(), "cpu_count": os.cpu_count(),
                  "rows": rows}
        if outdir is not None:
            outdir.write_json("bench.json", result)
            outdir.commit()
    finally:
        if outdir is not None:
            outdir.discard()
    return result


def benchmark_scripts(root: str | Path | None = None) -> list[Path]:
    """The project's benchmark scripts (``benchmarks/*.py`` of a source checkout: ``root``,
    or the directory above the installed package)."""
    base = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    return sorted(p for p in (base / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def run_benchmark_scripts(scripts: Sequence[Path], *, full: bool = False) -> list[tuple[Path, int]]:
    """Run each benchmark script (``--quick`` unless ``full``); returns (script, status)
    pairs."""
    results = []
    for script in scripts:
        cmd = [sys.executable, str(script)] + ([] if full else ["--quick"])
        sys.stdout.write(f"$ {' '.join(cmd)}\n")
        sys.stdout.flush()
        results.append((script, subprocess.run(cmd, check=False).returncode))
    return results


def cmd_bench(args: argparse.Namespace) -> int:
    """``transformer-pde bench``: :func:`run_bench` and its table on stdout, or with
    ``--scripts`` the project's benchmark scripts (exit status 4 when one fails)."""
    if args.scripts:
        scripts = benchmark_scripts()
        if not scripts:
            raise UsageError("no benchmarks/*.py next to the package (they come "
                             "with a source checkout)")
        failed = [(p, rc) for p, rc in run_benchmark_scripts(scripts, full=args.full)
                  if rc != 0]
        if failed:
            raise RunError(", ".join(f"{p.name} exited with status {rc}" for p, rc in failed))
        return ExitCode.OK
    res = run_bench(quick=not args.full, out=args.out, backends=args.backends,
                    force=args.force)
    sys.stdout.write(f"{'task':<22s} {'backend':<8s} {'N':>7s} {'d':>3s} {'seconds':>10s}\n")
    for r in res["rows"]:
        sys.stdout.write(f"{r['task']:<22s} {r['backend']:<8s} {r['N']:>7d} {r['d']:>3d} "
                         f"{r['seconds']:>10.4f}\n")
    if args.out:
        sys.stdout.write(f"written {Path(args.out) / 'bench.json'}\n")
    return ExitCode.OK
