"""GPU backend throughput: softmax pair interactions per second against torch and CuPy.

For N in {1e4, 1e5, 1e6}, d in {2, 4, 8, 16} and float32 / float64 this script times one
softmax primitive (queries, keys and values of width d, a key bias, all on the device)
with

* ``cupy``: the fused streaming kernels of ``backend="cupy"``;
* ``torch_sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (scale 1, no
  bias: it does less work) on the same device, when torch is installed;
* ``cupy_chunks``: dense blocks of logits with CuPy (matmul, max, exp, matmul), the
  plain path of the backend (:func:`transformer_pde.backends.cupy_backend.plain_softmax`).

Large N are timed on M <= N queries against all N keys (rate M·N / time: every query
does the same work), M growing until a call takes ``--min-time`` seconds.  It also
reports one full softmax field at N = 1e6, d = 2 (float32), the float32 error against
the float64 dense reference :func:`transformer_pde.testing.references.softmax` at
N = 1e5 (target: 1e-5 relative), and the wall time
of one ``simulate`` RK4 step at N = 1e5 (softmax, d = 2 and 8, float32 and float64).

Usage::

    python benchmarks/gpu.py            # writes benchmarks/results/gpu.json
    python benchmarks/gpu.py --quick    # N <= 1e5, d in {2, 8}: writes gpu_quick.json

Without a working GPU (CuPy missing, no driver, no device, kernels failing their
self-test) it prints why and exits with status 2.  Targets (H100, float32):
>= 1e12 pairs/s at d <= 4, >= 5e11 at d = 8, >= 3x torch SDPA at d = 8, one
softmax field at N = 1e6, d = 2 under 1 s.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

import transformer_pde as tp
from transformer_pde.backends.cupy_backend import CupyBackend, plain_softmax
from transformer_pde.errors import BackendNotAvailable
from transformer_pde.testing import references

RESULTS = Path(__file__).resolve().parent / "results"


def _timer(cp, fn, min_time: float, repeats: int = 3) -> float:
    """Best mean seconds per call of ``fn`` (device-synchronised) over ~``min_time``."""
    fn()
    cp.cuda.Device().synchronize()
    best = np.inf
    for _ in range(repeats):
        loops, t = 0, 0.0
        start = time.perf_counter()
        while t < min_time:
            fn()
            loops += 1
            cp.cuda.Device().synchronize()
            t = time.perf_counter() - start
        best = min(best, t / loops)
    return best


def _rate(cp, make_call, n: int, min_time: float) -> dict:
    """Pairs/s of ``make_call(m)`` (m queries x n keys), m grown until a call is long."""
    m = min(n, 1024)
    while True:
        call = make_call(m)
        t0 = time.perf_counter()
        call()
        cp.cuda.Device().synchronize()
        once = time.perf_counter() - t0
        if m == n or once > min_time / 4:
            break
        m = min(n, m * 4)
    t = _timer(cp, call, min_time)
    return {"queries": m, "seconds": t, "pairs_per_s": m * n / t}


def _torch_sdpa(torch, q, k, v, bias):
    tq, tk, tv = (torch.as_tensor(a, device="cuda")[None, None] for a in (q, k, v))
    tb = torch.as_tensor(bias, device="cuda")[None, None, None, :]

    def call():
        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb,
                                                                scale=1.0)
    return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--min-time", type=float, default=0.3)
    args = ap.parse_args(argv)
    try:
        be = CupyBackend()
    except BackendNotAvailable as exc:
        print(f"benchmarks/gpu.py needs a working GPU: {exc}", file=sys.stderr)
        return 2
    cp = be.xp
    try:
        import torch
        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    ns = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    ds = [2, 8] if args.quick else [2, 4, 8, 16]
    rng = np.random.default_rng(0)
    props = cp.cuda.runtime.getDeviceProperties(be.launcher.device.id)
    meta = {"device": props["name"].decode() if isinstance(props["name"], bytes)
            else str(props["name"]),
            "cupy": cp.__version__, "torch": None if torch is None else torch.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "min_time": args.min_time}
    rows = []
    print(f"device: {meta['device']}  cupy {meta['cupy']}  torch {meta['torch']}")
    print(f"{'N':>9} {'d':>3} {'dtype':>8} {'cupy':>10} {'torch':>10} {'chunks':>10}"
          "   (pairs/s)")
    for n in ns:
        for d in ds:
            for dtype in (np.float32, np.float64):
                q = rng.normal(size=(n, d)).astype(dtype) / np.sqrt(d)
                k = rng.normal(size=(n, d)).astype(dtype) / np.sqrt(d)
                v = rng.normal(size=(n, d)).astype(dtype)
                bias = np.log(rng.uniform(0.1, 1.0, n)).astype(dtype)
                qd, kd, vd, bd = (cp.asarray(a) for a in (q, k, v, bias))
                row = {"N": n, "d": d, "dtype": np.dtype(dtype).name}
                dev = (qd, kd, vd, bd)
                row["cupy"] = _rate(
                    cp, lambda m, a=dev: (lambda: be.softmax(a[0][:m], *a[1:], None)), n,
                    args.min_time)
                if n <= 100_000 or d >= 8:
                    row["cupy_chunks"] = _rate(
                        cp, lambda m, a=dev: (lambda: plain_softmax(cp, a[0][:m], *a[1:], None)),
                        n, args.min_time)
                if torch is not None:
                    try:
                        row["torch_sdpa"] = _rate(
                            cp, lambda m, a=(q, k, v, bias): _torch_sdpa(torch, a[0][:m], *a[1:]),
                            n, args.min_time)
                    except RuntimeError as exc:        # out of memory
                        row["torch_sdpa"] = {"error": str(exc).splitlines()[0]}
                        torch.cuda.empty_cache()
                rows.append(row)

                def fmt(key, row=row):
                    r = row.get(key)
                    return f"{r['pairs_per_s']:10.3g}" if r and "pairs_per_s" in r else \
                        f"{'-' if r is None else 'error':>10}"
                print(f"{n:>9} {d:>3} {row['dtype']:>8} {fmt('cupy')} {fmt('torch_sdpa')} "
                      f"{fmt('cupy_chunks')}", flush=True)
    extra = {}
    # one full softmax field at N = 1e6, d = 2, float32 (target < 1 s)
    n = 100_000 if args.quick else 1_000_000
    X = cp.asarray(rng.normal(size=(n, 2)).astype(np.float32))
    extra["full_field_seconds"] = {"N": n, "d": 2, "dtype": "float32",
                                   "seconds": _timer(cp, lambda: be.softmax(X, X, X, None, None),
                                                     args.min_time, repeats=2)}
    # float32 accuracy at N = 1e5 against the float64 reference (target 1e-5 relative)
    n = 100_000
    Xh = rng.normal(size=(n, 2))
    idx = rng.integers(0, n, 256)
    ref = references.softmax(Xh[idx], Xh, Xh, None, None)[0]
    got = be.to_numpy(be.softmax(cp.asarray(Xh[idx], np.float32),
                                 cp.asarray(Xh, np.float32), cp.asarray(Xh, np.float32),
                                 None, None)[0])
    extra["float32_error_1e5"] = float(np.abs(got - ref).max() / np.abs(ref).max())
    # one simulate step (RK4: four field evaluations) at N = 1e5
    steps = []
    for d in (2, 8):
        for dtype in (np.float32, np.float64):
            att = tp.Attention("softmax", *(rng.normal(size=(d, d)) / np.sqrt(d)
                                            for _ in range(3)))
            X0 = rng.normal(size=(n, d)).astype(dtype)
            t0 = time.perf_counter()
            tp.simulate(att, X0, t_max=0.2, dt=0.1, solver="rk4",
                        field=tp.FieldOptions(backend=be), saveat=tp.SaveAt(every=2))
            cp.cuda.Device().synchronize()
            steps.append({"N": n, "d": d, "dtype": np.dtype(dtype).name,
                          "seconds_per_step": (time.perf_counter() - t0) / 2})
    extra["simulate_rk4_step"] = steps
    print(json.dumps(extra, indent=1))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("gpu_quick.json" if args.quick else "gpu.json")
    out.write_text(json.dumps({"meta": meta, "rows": rows, **extra}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
