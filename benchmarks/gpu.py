"""GPU backend throughput: softmax pairs per second against torch, and the share of the machine's bound.

For N in {1e4, 1e5, 1e6}, d in {2, 4, 8, 16, 32, 64, 128} and float32 / float64 this script
times one softmax primitive (queries, keys and values of width d, a key bias, all on the
device) with

* ``cupy``: the fused streaming kernels of ``backend="cupy"`` (d <= 32; wider keys take
  the backend's dense path);
* ``chunks``: dense blocks of logits with CuPy (matmul, max, exp, matmul), the plain path
  of the backend (:func:`transformer_pde.backends.cupy_backend.plain_softmax`);
* ``torch``: ``torch.nn.functional.scaled_dot_product_attention`` (scale 1, the key bias
  as an additive mask) in the row's dtype, and ``torch_bf16`` the same in bfloat16 (float32
  rows only), on the same device, when torch is installed.

Dtypes.  Every array a row times is built in the row's dtype and checked before timing,
and so is the backend's output (:func:`check_dtypes`): under NumPy 2 (NEP 50)
``x.astype(np.float32) / np.sqrt(d)`` is float64 (``np.sqrt(d)`` is a float64 scalar), which
once made the float32 rows measure float64 and every torch float32 cell fail.

Timing.  M queries against all N keys (rate M·N / time: every query does the same work);
M starts at 1,024 and grows fourfold, beyond N where needed (up to :data:`MAX_QUERIES`,
and :data:`QUERY_BYTES` of queries), until one call lasts ``--min-time / 4``: at N = 1e4 a
call of 1e4 queries is too short to time against the per-call overhead.  The first call
of each row is not timed (it compiles the kernel specialisation, 3–4 s with NVRTC).

Bound.  On compute capability 9.0 (H100, H200: per multiprocessor and clock 128 float32
and 64 float64 FMA lanes and 16 MUFU exponentials) a float32 pair costs one exponential
and about 2d + 3 FMA-pipe operations (d for the score, d for the value sums, 3 for the
running maximum, the sum and the exponent), a float64 pair about 2d + 22 (the exponential
in software, ~19 FMAs): ``bound = SMs x clock x min(16, 128 / (2d + 3))`` pairs/s in
float32, ``SMs x clock x 64 / (2d + 22)`` in float64 (:func:`pair_bound`); the ``share``
column is the fused kernel's rate over it (none on other devices).

It also reports one full softmax field at N = 1e6, d = 2 (float32), the float32 error
against the float64 dense reference :func:`transformer_pde.testing.references.softmax` at
N = 1e5 (target: 1e-5 relative), and the wall time of one ``simulate`` RK4 step at N = 1e5
(softmax, d = 2 and 8, float32 and float64).

Usage::

    python benchmarks/gpu.py             # writes benchmarks/results/gpu.json
    python benchmarks/gpu.py --quick     # N <= 1e5, d in {2, 8, 64}: writes gpu_quick.json
    python benchmarks/gpu.py --dry-run   # no GPU: all of the above at tiny sizes on the CPU
                                         # build of the kernels; checks dtypes, writes nothing

Without a working GPU (CuPy missing, no driver, no device, kernels failing their
self-test) it prints why and exits with status 2.  Targets (H100 / H200,
float32): >= 2e12 pairs/s at d = 2, >= 1.6e12 at d = 4; float64 >= 3.2e11 at d = 2.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import transformer_pde as tp
from transformer_pde.backends.cupy_backend import CupyBackend, plain_softmax
from transformer_pde.errors import BackendNotAvailable
from transformer_pde.testing import references

RESULTS = Path(__file__).resolve().parent / "results"
NS, DS = (10_000, 100_000, 1_000_000), (2, 4, 8, 16, 32, 64, 128)
QUICK_NS, QUICK_DS = (10_000, 100_000), (2, 8, 64)
#: most queries a row times, and most bytes of queries it builds
MAX_QUERIES, QUERY_BYTES = 1 << 22, 1 << 28


def pair_bound(dtype: Any, d: int, n_sm: int, clock_hz: float,
               capability: tuple[int, int]) -> float | None:
    """Softmax pairs per second the device can do at most (see the module docstring),
    or ``None`` for a device whose per-clock rates are not written here."""
    if tuple(capability) != (9, 0):
        return None
    per_clock = (min(16.0, 128.0 / (2 * d + 3)) if np.dtype(dtype) == np.float32
                 else 64.0 / (2 * d + 22))
    return n_sm * clock_hz * per_clock


def check_dtypes(dtype: Any, *arrays: Any) -> None:
    """Refuse to time an array (NumPy, CuPy or torch) whose dtype is not the row's."""
    want = (dtype if isinstance(dtype, str) else np.dtype(dtype).name).removeprefix("torch.")
    for a in arrays:
        got = str(a.dtype).removeprefix("torch.")
        if got != want:
            raise AssertionError(f"benchmarks/gpu.py: an array of dtype {got} in a {want} row "
                                 f"(shape {tuple(a.shape)}): the row would time {got}")


def inputs(xp: Any, rng: np.random.Generator, n: int, m_max: int, d: int,
           dtype: Any) -> tuple[Any, Any, Any, Any]:
    """q (m_max, d), k, v (n, d) and bias (n,) on ``xp``'s device, in ``dtype``: scaled in
    float64 on the host, then cast once (checked)."""
    q = (rng.normal(size=(m_max, d)) / np.sqrt(d)).astype(dtype)
    k = (rng.normal(size=(n, d)) / np.sqrt(d)).astype(dtype)
    v = rng.normal(size=(n, d)).astype(dtype)
    bias = np.log(rng.uniform(0.1, 1.0, n)).astype(dtype)
    arrays = tuple(xp.asarray(a) for a in (q, k, v, bias))
    check_dtypes(dtype, *arrays)
    return arrays


def query_cap(n: int, d: int, dtype: Any, max_queries: int = MAX_QUERIES) -> int:
    """Most queries a row of N = ``n`` keys times (at least ``min(n, 1024)``)."""
    fit = QUERY_BYTES // (d * np.dtype(dtype).itemsize)
    return max(min(n, 1024), min(max_queries, fit))


def timer(fn: Callable[[], Any], min_time: float, sync: Callable[[], None],
          repeats: int = 3) -> float:
    """Best mean seconds per call of ``fn`` (synchronised) over ~``min_time``, 3 times."""
    best = np.inf
    for _ in range(repeats):
        loops, t = 0, 0.0
        start = time.perf_counter()
        while loops == 0 or t < min_time:
            fn()
            loops += 1
            sync()
            t = time.perf_counter() - start
        best = min(best, t / loops)
    return best


def rate(make_call: Callable[[int], Callable[[], Any]], n: int, m_max: int, min_time: float,
         sync: Callable[[], None]) -> dict:
    """Pairs/s of ``make_call(m)`` (m queries x n keys), m grown until a call is long."""
    m = min(m_max, 1024)
    make_call(m)()                          # compiles the specialisation: not timed
    sync()
    while True:
        call = make_call(m)
        t0 = time.perf_counter()
        call()
        sync()
        once = time.perf_counter() - t0
        if m >= m_max or once > min_time / 4:
            break
        m = min(m_max, m * 4)
    t = timer(call, min_time, sync)
    return {"queries": m, "seconds": t, "pairs_per_s": m * n / t}


def torch_sdpa(torch: Any, dtype: Any, q: Any, k: Any, v: Any, bias: Any) -> Callable[[], Any]:
    """A call of torch's SDPA on the given (device) arrays, in ``dtype`` (checked)."""
    tq, tk, tv = (torch.as_tensor(a, device="cuda").to(dtype)[None, None] for a in (q, k, v))
    tb = torch.as_tensor(bias, device="cuda").to(dtype)[None, None, None, :]
    check_dtypes(str(dtype), tq, tk, tv, tb)

    def call():
        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb,
                                                                scale=1.0)
    return call


def _guarded(torch: Any, fn: Callable[..., dict], *args: Any) -> dict:
    try:
        return fn(*args)
    except RuntimeError as exc:             # out of memory, or an unsupported kernel
        if torch is not None:
            torch.cuda.empty_cache()
        return {"error": str(exc).splitlines()[0]}


def table(be: Any, sync: Callable[[], None], torch: Any, ns, ds, min_time: float,
          bound: Callable[[Any, int], float | None], max_queries: int = MAX_QUERIES) -> list:
    """The throughput rows (printed as they come)."""
    xp = be.xp
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'N':>9} {'d':>4} {'dtype':>8} {'cupy':>9} {'share':>6} {'torch':>9} "
          f"{'bf16':>9} {'chunks':>9}   (pairs/s)")
    for n in ns:
        for d in ds:
            for dtype in (np.float32, np.float64):
                m_max = query_cap(n, d, dtype, max_queries)
                q, k, v, b = inputs(xp, rng, n, m_max, d, dtype)
                check_dtypes(dtype, *be.softmax(q[:2], k, v, b, None))
                row: dict[str, Any] = {"N": n, "d": d, "dtype": np.dtype(dtype).name}
                row["cupy"] = rate(lambda m, a=(q, k, v, b): (
                    lambda: be.softmax(a[0][:m], *a[1:], None)), n, m_max, min_time, sync)
                bnd = bound(dtype, d)
                row["bound"] = bnd
                row["share"] = None if bnd is None else row["cupy"]["pairs_per_s"] / bnd
                if n <= 100_000 or d >= 8:
                    row["chunks"] = rate(lambda m, a=(q, k, v, b): (
                        lambda: plain_softmax(xp, a[0][:m], *a[1:], None)), n, m_max,
                        min_time, sync)
                tdt = {} if torch is None else {"torch": getattr(torch, np.dtype(dtype).name)}
                if torch is not None and dtype == np.float32:
                    tdt["torch_bf16"] = torch.bfloat16
                for key, t in tdt.items():
                    row[key] = _guarded(torch, rate, lambda m, t=t, a=(q, k, v, b): torch_sdpa(
                        torch, t, a[0][:m], *a[1:]), n, m_max, min_time, sync)
                rows.append(row)

                def fmt(key, row=row):
                    r = row.get(key)
                    return f"{r['pairs_per_s']:9.3g}" if r and "pairs_per_s" in r else \
                        f"{'-' if r is None else 'error':>9}"
                share = "-" if row["share"] is None else f"{row['share']:.0%}"
                print(f"{n:>9} {d:>4} {row['dtype']:>8} {fmt('cupy')} {share:>6} "
                      f"{fmt('torch')} {fmt('torch_bf16')} {fmt('chunks')}", flush=True)
    return rows


def extras(be: Any, sync: Callable[[], None], min_time: float, n_field: int, n_acc: int,
           n_sim: int) -> dict:
    """Full field, float32 accuracy and one simulate step (see the module docstring)."""
    xp = be.xp
    rng = np.random.default_rng(1)
    out = {}
    X = xp.asarray(rng.normal(size=(n_field, 2)).astype(np.float32))
    check_dtypes(np.float32, X, *be.softmax(X[:2], X, X, None, None))
    out["full_field_seconds"] = {"N": n_field, "d": 2, "dtype": "float32",
                                 "seconds": timer(lambda: be.softmax(X, X, X, None, None),
                                                  min_time, sync, repeats=2)}
    Xh = rng.normal(size=(n_acc, 2))
    idx = rng.integers(0, n_acc, 256)
    ref = references.softmax(Xh[idx], Xh, Xh, None, None)[0]
    got = be.to_numpy(be.softmax(xp.asarray(Xh[idx], np.float32), xp.asarray(Xh, np.float32),
                                 xp.asarray(Xh, np.float32), None, None)[0])
    check_dtypes(np.float32, got)
    out[f"float32_error_{n_acc}"] = float(np.abs(got - ref).max() / np.abs(ref).max())
    steps = []
    for d in (2, 8):
        for dtype in (np.float32, np.float64):
            att = tp.Attention("softmax", *(rng.normal(size=(d, d)) / np.sqrt(d)
                                            for _ in range(3)))
            X0 = rng.normal(size=(n_sim, d)).astype(dtype)
            t0 = time.perf_counter()
            tp.simulate(att, X0, t_max=0.2, dt=0.1, solver="rk4",
                        field=tp.FieldOptions(backend=be), saveat=tp.SaveAt(every=2))
            sync()
            steps.append({"N": n_sim, "d": d, "dtype": np.dtype(dtype).name,
                          "seconds_per_step": (time.perf_counter() - t0) / 2})
    out["simulate_rk4_step"] = steps
    return out


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: tiny sizes on the CPU build of the kernels, writes nothing")
    ap.add_argument("--min-time", type=float, default=0.3)
    args = ap.parse_args(argv)
    if args.dry_run:
        from transformer_pde.backends.cuda_cpu import CpuLauncher
        be = CupyBackend(CpuLauncher(), target_blocks=1)
        rows = table(be, lambda: None, None, (200,), (2, 40), 0.0,
                     lambda dtype, d: pair_bound(dtype, d, 132, 1.98e9, (9, 0)),
                     max_queries=2048)
        extras(be, lambda: None, 0.0, 300, 300, 40)
        print(f"dry run: {len(rows)} rows, dtypes checked")
        return 0
    try:
        be = CupyBackend()
    except BackendNotAvailable as exc:
        print(f"benchmarks/gpu.py needs a working GPU: {exc}", file=sys.stderr)
        return 2
    cp = be.xp
    dev = be.launcher.device
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    att = dev.attributes                    # (CUDA 13 dropped clockRate from the properties)
    n_sm, clock = att["MultiProcessorCount"], att["ClockRate"] * 1e3
    cap = (att["ComputeCapabilityMajor"], att["ComputeCapabilityMinor"])
    torch = _torch()
    meta = {"device": props["name"].decode() if isinstance(props["name"], bytes)
            else str(props["name"]), "multiprocessors": n_sm, "clock_hz": clock,
            "capability": list(cap), "cupy": cp.__version__,
            "torch": None if torch is None else torch.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "min_time": args.min_time}
    print(f"device: {meta['device']} ({n_sm} SMs, {clock / 1e9:.2f} GHz, sm_{cap[0]}{cap[1]})"
          f"  cupy {meta['cupy']}  torch {meta['torch']}")
    rows = table(be, dev.synchronize, torch, QUICK_NS if args.quick else NS,
                 QUICK_DS if args.quick else DS, args.min_time,
                 lambda dtype, d: pair_bound(dtype, d, n_sm, clock, cap))
    extra = extras(be, dev.synchronize, args.min_time, 100_000 if args.quick else 1_000_000,
                   100_000, 100_000)
    print(json.dumps(extra, indent=1))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("gpu_quick.json" if args.quick else "gpu.json")
    out.write_text(json.dumps({"meta": meta, "rows": rows, **extra}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
