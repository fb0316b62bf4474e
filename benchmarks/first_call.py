"""Benchmark: wall and CPU seconds of the first call of each main path from an empty Numba cache.

Each path runs in a fresh Python subprocess twice with the same, initially empty,
``NUMBA_CACHE_DIR``: first cold (every kernel it needs is compiled, or, with the default
``backend="auto"``, compiled in the background while NumPy answers), then warm (the
kernels are loaded from that cache).  The CPU seconds of each child (user + system, all
threads) come from ``resource.getrusage(RUSAGE_CHILDREN)``; the compilation cost of the
first call is ``cold - warm`` (imports, data and the computation itself cancel; for an
``"auto"`` path the background compilation that ran until the process ended is
included).  The paths:

* ``readme``: the README's first example (its first ``python`` block, read from README.md),
  default backend ``"auto"``: NumPy while the Numba kernels compile in the background;
* ``simulate_auto``: :func:`transformer_pde.simulate`, softmax, N = 256, d = 8, RK4, the
  default backend (``"auto"``);
* ``simulate_numba``: the same with ``FieldOptions(backend="numba")`` (compiles in the
  foreground: asked for);
* ``velocity_d64``: :func:`transformer_pde.velocity`, softmax, N = 512, d = 64, numba backend;
* ``sinkhorn``: :func:`transformer_pde.velocity` of ``kind="sinkhorn"``, N = 256, d = 4, numba;
* ``solve_batch``: :func:`transformer_pde.gaussian.solve_batch`, 8 members of the paper's
  d = 2 softmax phase grid (Fig. 2a), ``t_max = 1000``, ``blowup_threshold = 1e3``;
* ``clusters``: :func:`transformer_pde.diagnostics.clusters` of 2,000 tokens (the
  minimum-spanning-tree kernel);
* ``demo``: the command ``transformer-pde demo`` (its defaults) into a temporary folder.

Targets: the README example within 10 s of wall time, and the first call of
every path within 10 s of CPU of compilation, or not blocking on it.  ``transformer-pde
warmup`` compiles everything ahead of time.  One run takes a few minutes (the cold runs
compile); the machine may be shared, so the load average is printed and stored.

Run (from the repository root):
    PYTHONPATH=$PWD python benchmarks/first_call.py [--label after] [--paths readme clusters]
    [--quick]  (readme and simulate_numba only)
Results are merged into ``benchmarks/results/first_call.json`` under ``--label``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_COMMON = "import numpy as np, transformer_pde as tp\nrng = np.random.default_rng(0)\n"
_ROOT = Path(__file__).resolve().parent.parent


def readme_example() -> str:
    """The README's first example: its first ``python`` code block."""
    text = (_ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("```python\n", 1)[1].split("```", 1)[0]


#: The Python source of each path (run with ``python -c``); ``demo`` is a command line.
PATHS: dict[str, str | list[str]] = {
    "readme": readme_example(),
    "simulate_auto": _COMMON + (
        "d = 8\n"
        "att = tp.Attention('softmax', np.eye(d), np.eye(d), np.eye(d), beta=1.0)\n"
        "tr = tp.simulate(att, rng.standard_normal((256, d)), t_max=1.0, dt=0.1)\n"
        "assert tr.states.shape == (11, 256, d)\n"),
    "solve_batch": _COMMON + (
        "import sys; sys.path.insert(0, 'benchmarks')\n"
        "from gaussian import Q, K, cone_grid\n"
        "from transformer_pde import gaussian as g\n"
        "att = tp.Attention('softmax', Q / np.sqrt(2), K, np.eye(2))\n"
        "covs = cone_grid(6, 6)[:8]\n"
        "r = g.solve_batch(att, np.zeros((8, 2)), covs, t_max=1000.0, blowup_threshold=1e3)\n"
        "assert (r.status == 'blowup').all(), r.status\n"),
    "simulate_numba": _COMMON + (
        "d = 8\n"
        "att = tp.Attention('softmax', np.eye(d), np.eye(d), np.eye(d), beta=1.0)\n"
        "X0 = rng.standard_normal((256, d))\n"
        "tr = tp.simulate(att, X0, t_max=1.0, dt=0.1,\n"
        "                 field=tp.FieldOptions(backend='numba'))\n"
        "assert tr.states.shape == (11, 256, d)\n"),
    "velocity_d64": _COMMON + (
        "d = 64\n"
        "att = tp.Attention('softmax', np.eye(d), np.eye(d), np.eye(d), beta=0.1)\n"
        "X = rng.standard_normal((512, d))\n"
        "v = tp.velocity(att, X, backend='numba')\n"
        "assert v.shape == (512, d)\n"),
    "sinkhorn": _COMMON + (
        "d = 4\n"
        "att = tp.Attention('sinkhorn', np.eye(d), np.eye(d), np.eye(d), beta=1.0)\n"
        "X = rng.standard_normal((256, d))\n"
        "v = tp.velocity(att, X, backend='numba')\n"
        "assert v.shape == (256, d)\n"),
    "clusters": _COMMON + (
        "from transformer_pde import diagnostics as dg\n"
        "X = np.concatenate([rng.normal(c, 0.05, size=(500, 2)) for c in range(4)])\n"
        "assert dg.clusters(X).n_clusters == 4\n"),
    "demo": ["-m", "transformer_pde.cli", "demo", "--out", "{tmp}/demo"],
}


def _child_cpu(args: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, str]:
    """Run ``python args`` in a subprocess; ``(CPU s, wall s, stderr tail)``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{args[:3]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return cpu, wall, proc.stderr[-400:]


def measure(name: str, root: str) -> dict:
    """Cold then warm run of path ``name`` with a fresh cache folder."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(tmp) / "numba"),
                   PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   MPLBACKEND="Agg")
        src = PATHS[name]
        args = ([a.replace("{tmp}", tmp) for a in src] if isinstance(src, list)
                else ["-c", src])
        cold, cold_wall, err = _child_cpu(args, env, root)
        if isinstance(src, list):   # the CLI refuses an existing output folder
            args = [a.replace("/demo", "/demo2") for a in args]
        warm, warm_wall, _ = _child_cpu(args, env, root)
    notice = "compiling the Numba kernel" in err
    return {"cold_cpu_s": round(cold, 2), "warm_cpu_s": round(warm, 2),
            "compile_cpu_s": round(cold - warm, 2), "cold_wall_s": round(cold_wall, 2),
            "warm_wall_s": round(warm_wall, 2), "compile_notice_shown": notice}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="*", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--label", default="after", help="key of this run in the JSON file")
    ap.add_argument("--quick", action="store_true",
                    help="readme and simulate_numba only, under the label 'quick'")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "first_call.json"))
    args = ap.parse_args()
    if args.quick:
        args.paths, args.label = ["readme", "simulate_numba"], "quick"
    root = str(_ROOT)
    load = os.getloadavg()
    print(f"load average (1, 5, 15 min) at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"on {os.cpu_count()} cores")
    rows = {}
    print(f"{'path':<16}{'cold CPU s':>11}{'warm CPU s':>11}{'compile CPU s':>14}"
          f"{'cold wall s':>12}{'warm wall s':>12}{'notice':>8}")
    for name in args.paths:
        try:
            r = measure(name, root)
        except RuntimeError as exc:
            print(f"{name}: failed: {exc}")
            continue
        rows[name] = r
        print(f"{name:<16}{r['cold_cpu_s']:>11.2f}{r['warm_cpu_s']:>11.2f}"
              f"{r['compile_cpu_s']:>14.2f}{r['cold_wall_s']:>12.2f}{r['warm_wall_s']:>12.2f}"
              f"{'yes' if r['compile_notice_shown'] else 'no':>8}", flush=True)
    end = os.getloadavg()
    out_path = Path(args.out)
    data = json.loads(out_path.read_text()) if out_path.exists() else {}
    data[args.label] = {
        "paths": rows, "target_compile_cpu_s": 10.0, "target_readme_wall_s": 10.0,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   f"Python {platform.python_version()}",
        "command": "PYTHONPATH=$PWD python benchmarks/first_call.py --label " + args.label,
        "load_average_start_1_5_15min": list(load), "load_average_end_1_5_15min": list(end)}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(data, indent=2))
    print(f"load average at end: {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}; wrote {out_path}")


if __name__ == "__main__":
    main()
