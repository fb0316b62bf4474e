"""Transformer-sized heads against the machine's limit: the softmax field as a % of GEMM.

For each precision, head width d and key count N this script times the Numba backend's
softmax primitive with its automatic kernel choice (``NumbaBackend().softmax(q, k, v)``
with queries, keys and values of width d: one evaluation of the softmax attention field
``transformer_pde.velocity`` makes, all cores) and, interleaved with it (before and
after each row), the machine's GEMM rate: ``numpy.dot`` of two square matrices of
the same precision (OpenBLAS, all cores), multiply-adds per CPU-second.  A softmax pair
costs 2·d multiply-adds (d for its logit, d for its value sum), so

    % of GEMM = pairs per CPU-second × 2 d / GEMM multiply-adds per CPU-second.

Rates are per CPU-second (pairs over the CPU time of all the process's threads), which
depends far less on what else runs on a shared machine than wall time; the load average
is recorded before and after.  Each row is timed on M = min(N, --queries) queries against
all N keys (every query does the same work).

With ``--parts`` it also splits one thread's time per pair into the tiled kernel's parts
(:mod:`transformer_pde.backends.numba.tiled`): the logit product, the value product
(each timed alone over the same tiles and key blocks), the row pass (bias, maximum,
exponential, sums, online rescaling: the rest of the kernel's time) and the packing of
the operands (``tiled_layout``), all in nanoseconds per pair.

Usage::

    python benchmarks/heads.py                       # d = 64, 128; N = 4096, 16384
    python benchmarks/heads.py --dims 32,64,128 --ns 4096 --parts
    python benchmarks/heads.py --out benchmarks/results/heads.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_time(fn, min_time: float, repeats: int = 3) -> float:
    """Best (over ``repeats``) mean CPU seconds of ``fn`` over loops of ~``min_time``."""
    fn()
    best = np.inf
    for _ in range(repeats):
        c0 = time.process_time()
        loops = 0
        while True:
            fn()
            loops += 1
            if time.process_time() - c0 >= min_time:
                break
        best = min(best, (time.process_time() - c0) / loops)
    return best


def _gemm_rate(dtype, size: int, min_time: float) -> float:
    """Multiply-adds per CPU-second of ``numpy.dot`` of two size×size matrices."""
    rng = np.random.default_rng(1)
    a = rng.random((size, size)).astype(dtype)
    b = rng.random((size, size)).astype(dtype)
    return size ** 3 / _cpu_time(lambda: np.dot(a, b), min_time)


def _parts(q, k, v, min_time: float) -> dict:
    """One thread's nanoseconds per pair: whole kernel, logit product, value product,
    row pass (the rest) and packing."""
    from numba import njit

    from transformer_pde.backends.numba import NumbaBackend, tiled

    @njit
    def logits_only(qpk, kpk, n, nr, S):
        m_q = qpk.shape[0] * tiled.MR
        qt = S.shape[0]
        spans = np.zeros((qt // tiled.MR, 2), dtype=np.int64)
        for i0 in range(0, m_q, qt):
            nt = min(qt, m_q - i0)
            for j0 in range(0, n, tiled.KBLOCK):
                nbp = (min(tiled.KBLOCK, n - j0) + nr - 1) // nr * nr
                spans[:, 1] = nbp             # every group sees the whole block
                tiled._tile_logits(S, qpk, i0, nt, kpk, j0, nbp, nr, spans)

    @njit
    def values_only(m_q, vpk, n, nr, cv, S, acc):
        qt = S.shape[0]
        spans = np.zeros((qt // tiled.MR, 2), dtype=np.int64)
        for i0 in range(0, m_q, qt):
            nt = min(qt, m_q - i0)
            for j0 in range(0, n, tiled.KBLOCK):
                nbp = (min(tiled.KBLOCK, n - j0) + nr - 1) // nr * nr
                spans[:, 1] = nbp             # every group sees the whole block
                tiled._tile_values(acc, nt, S, vpk, j0, nr, cv, spans)

    one = NumbaBackend(n_threads=1)
    m, n = q.shape[0], k.shape[0]
    lo, hi = np.zeros(m, dtype=np.int64), np.full(m, n, dtype=np.int64)
    bias = np.zeros(n, dtype=q.dtype)
    layout = tiled.tiled_layout(q.dtype, q, k, v, bias, lo, hi)
    _, qpk, kpk, vpk, _, lop, _, nr = layout
    qt = tiled.query_tile(lop.shape[0], 1)
    S = np.random.default_rng(2).random((qt, tiled.KBLOCK)).astype(q.dtype)
    acc = np.zeros((qt, vpk.shape[0] * nr))
    pairs = m * n
    t_all = _cpu_time(lambda: one.softmax(q, k, v, None, None), min_time)
    t_log = _cpu_time(lambda: logits_only(qpk, kpk, n, nr, S), min_time)
    t_val = _cpu_time(lambda: values_only(lop.shape[0], vpk, n, nr, v.shape[1], S, acc),
                      min_time)
    t_pack = _cpu_time(lambda: tiled.tiled_layout(q.dtype, q, k, v, bias, lo, hi), min_time)
    ns = 1e9 / pairs
    return {"kernel_1thread_ns": t_all * ns, "logits_ns": t_log * ns, "values_ns": t_val * ns,
            "row_pass_ns": (t_all - t_log - t_val - t_pack) * ns, "packing_ns": t_pack * ns}


def run(dims, ns, dtypes, queries: int, gemm_size: int, min_time: float, parts: bool) -> dict:
    from transformer_pde.backends.numba import NumbaBackend

    try:
        from transformer_pde.backends.numba import tiled
        vbits = tiled.VECTOR_BITS
    except (ImportError, AttributeError):
        vbits = None
    be = NumbaBackend()
    rng = np.random.default_rng(0)
    rows = []
    for dt in dtypes:
        for d in dims:
            for n in ns:
                m = min(n, queries)
                q = (rng.normal(size=(m, d)) / np.sqrt(d)).astype(dt)
                k = rng.normal(size=(n, d)).astype(dt)
                v = rng.normal(size=(n, d)).astype(dt)
                be.softmax(q[:8], k, v, None, None)            # load the compiled kernel
                load = _load()
                g0 = _gemm_rate(dt, gemm_size, min_time)
                t = _cpu_time(lambda q=q, k=k, v=v: be.softmax(q, k, v, None, None), min_time)
                g1 = _gemm_rate(dt, gemm_size, min_time)
                gemm = (g0 + g1) / 2
                pairs = m * n / t
                row = {"dtype": np.dtype(dt).name, "d": d, "N": n, "queries": m,
                       "kernel": be.kernel_for(d, dt), "pairs_per_cpu_s": pairs,
                       "ns_per_pair_cpu": 1e9 / pairs, "gemm_madds_per_cpu_s": gemm,
                       "pct_of_gemm": 100 * pairs * 2 * d / gemm, "load": load}
                if parts and row["kernel"] == "tiled":
                    row["parts"] = _parts(q, k, v, min_time)
                rows.append(row)
                msg = (f"{row['dtype']:>7} d={d:<4} N={n:<6} {pairs / 1e9:7.3f} G pairs/CPU-s "
                       f"{1e9 / pairs:7.2f} ns  GEMM {gemm / 1e9:5.1f} G madd/CPU-s  "
                       f"{row['pct_of_gemm']:5.1f} % of GEMM  load {load[0]}")
                if "parts" in row:
                    p = row["parts"]
                    msg += ("\n" + " " * 8 + "1 thread ns/pair: kernel {kernel_1thread_ns:.2f} = "
                            "logits {logits_ns:.2f} + values {values_ns:.2f} + row pass "
                            "{row_pass_ns:.2f} + packing {packing_ns:.2f}").format(**p)
                print(msg, flush=True)
    return {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "cpu": _cpu_name(), "vector_bits": vbits, "load_end": _load(), "rows": rows}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128", help="head widths, comma-separated")
    ap.add_argument("--ns", default="4096,16384", help="key counts N, comma-separated")
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--queries", type=int, default=2048, help="queries timed per row (<= N)")
    ap.add_argument("--gemm-size", type=int, default=2048)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per timing loop")
    ap.add_argument("--parts", action="store_true", help="one-thread split of the kernel")
    ap.add_argument("--out", default=str(RESULTS / "heads.json"))
    args = ap.parse_args()
    res = run([int(x) for x in args.dims.split(",")], [int(x) for x in args.ns.split(",")],
              [np.dtype(x).type for x in args.dtypes.split(",")], args.queries,
              args.gemm_size, args.min_time, args.parts)
    print(f"machine: {res['cpu']} ({os.cpu_count()} cores), micro-kernel "
          f"{res['vector_bits']}-bit; load at the end {res['load_end']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
