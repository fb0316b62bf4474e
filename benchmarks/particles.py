"""Particle-engine throughput: attention pair interactions per second, and peak memory.

One field evaluation of N tokens costs N² query–key pair interactions (masked attention
skips about half of them; its rate is still quoted per N², the work an unmasked
evaluation would do, so that rows compare wall time).  For each kind (softmax, l2,
masked softmax), N and d this script times ``transformer_pde.velocity`` with the Numba
backend (float64 and, for softmax, float32; where it picks its tiled kernels, d >= 8,
also its streaming kernels forced, ``NumbaBackend(kernel="streaming")``, to show the
crossover),
the NumPy reference (the chunked BLAS-logits, exp, BLAS-values computation of
``transformer_pde.backends.numpy_backend``) and, when installed, pykeops on the CPU
(softmax and l2 only: KeOps has no prefix masking).

The machine's multiply-add peak is measured in the same run as the best of three
float64 products of two 2048×2048 matrices with NumPy (OpenBLAS, all cores): 2048³
multiply-adds over the wall time, and over the process CPU time.  A softmax pair costs
2·d multiply-adds (d for its logit, d for its value sum), so the "% DGEMM" column is
numba f64 pairs per CPU-second × 2d over the DGEMM's multiply-adds per CPU-second.

Large N are timed on a subset of M ≥ max(1024, 32 d) queries against all N keys (the
rate M·N / time is what a full evaluation achieves: every query does the same work, and
the per-call O(N d²) key and value projections, d/M of the pair work, stay ≤ 3 %),
growing M until a call takes ``--min-time`` seconds.  Peak memory is the
``tracemalloc`` peak of one timed call (NumPy allocations; the kernels' own per-thread
buffers are a few KB).
The full run also evaluates one complete softmax field at N = 1e5, d = 8 in a child
process and reports its ``tracemalloc`` peak and resident-set growth.

Usage::

    python benchmarks/particles.py            # full grid, writes benchmarks/results/particles.json
    python benchmarks/particles.py --quick    # N <= 2e4, d <= 8: writes particles_quick.json
    python benchmarks/particles.py --ns 20000 --dims 2,8,32,64,128   # the table of docs/benchmarks.md
    python benchmarks/particles.py --ns 20000 --dims 32,64,128 --kinds softmax \
        --out benchmarks/results/particles_heads.json   # head widths only (1-2 min idle)

The machine may be shared: the load average before and after is recorded.  The table
gives the Numba wall-clock rate, then rates per CPU-second (pairs divided by the CPU time
of all the process's threads), which depend far less on what else runs; the ratios are
taken between those, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

import transformer_pde as tp

RESULTS = Path(__file__).resolve().parent / "results"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _attention(kind: str, d: int, rng: np.random.Generator) -> tp.Attention:
    Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    base = "softmax" if kind == "masked softmax" else kind
    return tp.Attention(base, Q, K, V, masked=kind == "masked softmax")


def _time_call(fn, min_time: float, repeats: int = 3) -> tuple[float, float]:
    """Best (over ``repeats``) mean wall and CPU time of ``fn`` over ~``min_time`` loops.

    Short calls are looped: on a loaded machine one preempted thread stalls a whole
    parallel call, and a single millisecond call would measure that, not the kernel.
    The CPU time (all threads of this process) is what the work costs whatever the
    load: pairs per CPU-second times the number of cores is the rate of an idle machine.
    """
    t0 = time.perf_counter()
    fn()
    single = time.perf_counter() - t0
    loops = max(1, int(np.ceil(min_time / max(single, 1e-6))))
    best, best_cpu = np.inf, np.inf
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops)
        best_cpu = min(best_cpu, (time.process_time() - c0) / loops)
        if best * loops * repeats > 4 * min_time:
            break
    return best, best_cpu


def _measure(call, n: int, min_time: float, m0: int = 1024):
    """Grow the number of queries M (up to N) until one call takes ``min_time``.

    M starts at ``m0`` = max(1024, 32 d) so that the O(N d^2) projections and copies of
    a call stay a few per cent of its O(M N d) pair work (at d = 128 and M = 1024 they
    were 12 %, and diluted the ratio between backends).
    """
    m = min(n, m0)
    call(m)  # warm-up (compilation is cached, but the first call loads it)
    while True:
        t0 = time.perf_counter()
        call(m)
        t = time.perf_counter() - t0
        if t >= min_time or m == n:
            break
        m = min(n, max(2 * m, int(m * 1.2 * min_time / max(t, 1e-9))))
    t, t_cpu = _time_call(lambda: call(m), min_time)
    tracemalloc.start()
    tracemalloc.reset_peak()
    call(m)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"queries": m, "seconds": t, "pairs_per_s": m * n / t, "cpu_seconds": t_cpu,
            "pairs_per_cpu_s": m * n / max(t_cpu, 1e-9), "peak_mb": peak / 2**20}


def dgemm_peak(n: int = 2048, repeats: int = 3) -> dict:
    """Multiply-adds per second of NumPy's float64 matrix product (n×n by n×n)."""
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n)), rng.random((n, n))
    a @ b
    best, best_cpu = np.inf, np.inf
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        a @ b
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    return {"n": n, "fma_per_s": n**3 / best, "fma_per_cpu_s": n**3 / best_cpu}


def _velocity_call(att, X, pos, backend, dtype):
    Xd = X.astype(dtype)

    def call(m):
        kw = {}
        if pos is not None:
            kw = {"positions": pos, "query_positions": pos[:m]}
        tp.velocity(att, Xd, queries=Xd[:m], backend=backend, **kw)
    return call


def _keops_call(att, X, dtype):
    from pykeops.numpy import LazyTensor

    P = att.at(0.0)
    head = P.heads[0]
    Xd = X.astype(dtype)
    k = Xd @ head.K.T.astype(dtype)
    v = Xd @ head.V.T.astype(dtype)
    if att.kind == "l2":
        q = (Xd @ head.Q.T.astype(dtype)) * (2 * P.l2_beta)
        b = (np.log(1.0 / len(X)) - P.l2_beta * (k * k).sum(1)).astype(dtype)
    else:
        q = (Xd @ head.Q.T.astype(dtype)) * P.beta
        b = np.full(len(X), np.log(1.0 / len(X)), dtype=dtype)
    kj = LazyTensor(k[None, :, :])
    vj = LazyTensor(v[None, :, :])
    bj = LazyTensor(b[None, :, None])

    def call(m):
        qi = LazyTensor(np.ascontiguousarray(q[:m])[:, None, :])
        ((qi | kj) + bj).sumsoftmaxweight(vj, axis=1, backend="CPU")
    return call


def _have_keops() -> bool:
    try:
        import pykeops  # noqa: F401
        from pykeops.numpy import LazyTensor  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or a broken compiler setup
        return False
    return True


def run(quick: bool, min_time: float, numpy_max_n: int, ns=None, ds=None, kinds=None) -> dict:
    import numba

    from transformer_pde.backends.numba import NumbaBackend

    rng = np.random.default_rng(0)
    ns = ns or ([1000, 4000, 20000] if quick else [1000, 4000, 20000, 100000])
    ds = ds or ([2, 8] if quick else [2, 8, 32, 64, 128])
    kinds = kinds or (["softmax", "masked softmax"] if quick
                      else ["softmax", "l2", "masked softmax"])
    keops = _have_keops()
    streaming = NumbaBackend(kernel="streaming")
    auto = NumbaBackend()
    rows = []
    for kind in kinds:
        for d in ds:
            att = _attention(kind, d, rng)
            for n in ns:
                if d >= 64 and n > 20000:          # minutes per row on 2 cores
                    continue
                X = rng.normal(size=(n, d))
                pos = rng.random(n) if att.masked else None
                backends = [("numba", np.float64)]
                if kind == "softmax":
                    backends.append(("numba", np.float32))
                if auto.kernel_for(d) == "tiled":
                    backends.append(("numba-streaming", np.float64))
                if n <= numpy_max_n:
                    backends.append(("numpy", np.float64))
                if keops and not att.masked:
                    backends.append(("keops", np.float64))
                for be, dtype in backends:
                    if be == "keops":
                        call = _keops_call(att, X, dtype)
                    elif be == "numba-streaming":
                        call = _velocity_call(att, X, pos, streaming, dtype)
                    else:
                        call = _velocity_call(att, X, pos, be, dtype)
                    res = _measure(call, n, min_time, m0=max(1024, 32 * d))
                    res.update(kind=kind, n=n, d=d, backend=be, dtype=np.dtype(dtype).name)
                    rows.append(res)
                    print(f"{kind:15s} N={n:6d} d={d:3d} {be:15s} {res['dtype']:8s} "
                          f"M={res['queries']:6d} {res['pairs_per_s']:9.3g} pairs/s "
                          f"({res['pairs_per_cpu_s']:9.3g} per CPU-s) "
                          f"peak {res['peak_mb']:7.2f} MB", flush=True)
    return {"rows": rows, "numba_threads": numba.get_num_threads(), "keops": keops}


def memory_child(n: int, d: int) -> dict:
    """One full softmax field evaluation at N tokens (run in a fresh process)."""
    rng = np.random.default_rng(1)
    att = _attention("softmax", d, rng)
    tp.velocity(att, rng.normal(size=(500, d)), backend="numba")  # load kernels
    X = rng.normal(size=(n, d))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tracemalloc.start()
    t0 = time.perf_counter()
    out = tp.velocity(att, X, backend="numba")
    dt = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert np.all(np.isfinite(out))
    return {"n": n, "d": d, "seconds": dt, "pairs_per_s": n * n / dt,
            "tracemalloc_peak_mb": peak, "maxrss_before_mb": rss0, "maxrss_after_mb": rss1,
            "maxrss_growth_mb": rss1 - rss0}


def _table(rows: list[dict], peak: dict | None = None) -> str:
    """Markdown table: numba wall rate, then per-CPU-second rates and their ratios."""
    by = {}
    for r in rows:
        by.setdefault((r["kind"], r["n"], r["d"]), {})[(r["backend"], r["dtype"])] = r
    keops = any(r["backend"] == "keops" for r in rows)
    head = ("| kind | N | d | numba f64 wall | numba f64 | numba f32 | streaming f64 | NumPy "
            + ("| pykeops " if keops else "")
            + "| numba/NumPy | " + ("numba/keops | " if keops else "")
            + "f32/f64 | % DGEMM | peak MB numba f64 |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def rate(cell):
        return f"{cell['pairs_per_cpu_s']:.3g}" if cell else "–"

    def ratio(a, b):
        return f"{a['pairs_per_cpu_s'] / b['pairs_per_cpu_s']:.1f}×" if a and b else "–"

    for (kind, n, d), c in by.items():
        nb, nb32 = c.get(("numba", "float64")), c.get(("numba", "float32"))
        ref, ko = c.get(("numpy", "float64")), c.get(("keops", "float64"))
        st = c.get(("numba-streaming", "float64"))
        pct = "–"
        if peak and kind != "masked softmax":   # masked rates are quoted per N², not per pair
            pct = f"{100 * nb['pairs_per_cpu_s'] * 2 * d / peak['fma_per_cpu_s']:.0f}%"
        lines.append(f"| {kind} | {n} | {d} | {nb['pairs_per_s']:.3g} | {rate(nb)} | "
                     f"{rate(nb32)} | {rate(st)} | {rate(ref)} | "
                     + (f"{rate(ko)} | " if keops else "")
                     + f"{ratio(nb, ref)} | " + (f"{ratio(nb, ko)} | " if keops else "")
                     + f"{ratio(nb32, nb)} | {pct} | {nb['peak_mb']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small subset (N <= 2e4, d <= 8, softmax and masked softmax)")
    ap.add_argument("--min-time", type=float, default=None,
                    help="seconds per timed call (default 0.3, quick 0.1)")
    ap.add_argument("--numpy-max-n", type=int, default=100_000,
                    help="largest N timed with the NumPy reference")
    ap.add_argument("--memory-n", type=int, default=None,
                    help="N of the full-evaluation memory check (default 1e5; quick: skipped)")
    ap.add_argument("--ns", type=lambda t: [int(float(x)) for x in t.split(",")], default=None,
                    help="comma-separated token counts N (default: the grid's)")
    ap.add_argument("--dims", type=lambda t: [int(x) for x in t.split(",")], default=None,
                    help="comma-separated dimensions d (default 2,8,32,64,128; quick 2,8)")
    ap.add_argument("--kinds", type=lambda t: t.split(","), default=None,
                    help="comma-separated kinds among softmax,l2,masked softmax")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--memory-child", nargs=2, type=int, metavar=("N", "D"),
                    help="only evaluate one full softmax field of N tokens in dimension D "
                         "and print its time and memory as JSON (what the full run does "
                         "in a child process)")
    args = ap.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(*args.memory_child)))
        return 0
    min_time = args.min_time if args.min_time is not None else (0.1 if args.quick else 0.3)
    import numba

    meta = {"command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
            "machine": platform.platform(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "numba": numba.__version__, "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "loadavg_before": _load()}
    peak = dgemm_peak()
    meta["dgemm_peak"] = peak
    print(f"load average {meta['loadavg_before']}; float64 DGEMM 2048^3 (NumPy): "
          f"{peak['fma_per_s'] / 1e9:.1f} GFMA/s wall, "
          f"{peak['fma_per_cpu_s'] / 1e9:.1f} GFMA per CPU-s", flush=True)
    res = run(args.quick, min_time, args.numpy_max_n, args.ns, args.dims, args.kinds)
    grid = args.ns or args.dims or args.kinds
    mem_n = args.memory_n if args.memory_n is not None else (
        0 if args.quick or grid else 100_000)
    mem = None
    if mem_n:
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(mem_n), "8"],
                             capture_output=True, text=True, check=True)
        mem = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"full softmax evaluation N={mem_n} d=8: {mem['seconds']:.1f} s, "
              f"{mem['pairs_per_s']:.3g} pairs/s, tracemalloc peak "
              f"{mem['tracemalloc_peak_mb']:.1f} MB, max RSS {mem['maxrss_after_mb']:.0f} MB "
              f"(+{mem['maxrss_growth_mb']:.0f} MB during the evaluation)")
    meta["loadavg_after"] = _load()
    table = _table(res["rows"], peak)
    print()
    print(table)
    print(f"\nnumba threads: {res['numba_threads']}; load average before/after: "
          f"{meta['loadavg_before']} / {meta['loadavg_after']}; pykeops: "
          f"{'yes' if res['keops'] else 'not installed'}")
    default = ("particles_quick.json" if args.quick
               else "particles_grid.json" if grid else "particles.json")
    out_path = args.out or RESULTS / default
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"meta": meta, **res, "memory_check": mem, "table": table},
                                   indent=1))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
