"""Cost of drawing the Brownian increments: one stream per system, against one NumPy call.

A noisy run draws, per coarse step, the standard normals of every system's own Philox
stream (:class:`transformer_pde.noise.BrownianPath`, one compiled pass).  The table gives,
for B systems of n tokens in d = 3 with K = 2 common Brownian motions, the milliseconds per
coarse step of that draw at refinement level 0 and 3, next to one NumPy ``Philox``
generator drawing as many normals with ``standard_normal`` (what a single stream for the
whole run costs), and the seconds per step of ``simulate_ensemble`` with Euler–Maruyama
(individual and common noise) next to the explicit Euler step of the same field.

Usage::

    python benchmarks/noise_draw.py                  # writes results/noise_draw.json
    python benchmarks/noise_draw.py --repeats 3 --out /tmp/n.json

The machine may be shared: the load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

import transformer_pde as tp
from transformer_pde.noise import BrownianPath

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = [(1024, 2), (1024, 64), (1, 100_000)]
D, K = 3, 2


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _best(fn, repeats: int, number: int) -> float:
    fn()
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def draw_row(B: int, n: int, repeats: int) -> dict:
    """Milliseconds per coarse step: the per-system streams at levels 0 and 3, one NumPy
    generator for the same number of normals."""
    dims = [K + n * D] * B
    total = sum(dims)
    key = np.random.SeedSequence([0, 0]).generate_state(2, np.uint64)
    out = {}
    for level in (0, 3):
        path = BrownianPath(0, 0, dims, 0.08, level)
        steps = iter(range(10**9))   # a new coarse step every call (no cached step)
        out[f"streams_L{level}_ms"] = 1e3 * _best(
            lambda p=path, it=steps: p.coarse_increments(next(it)), repeats, 5)

    def one_generator() -> None:
        gen = np.random.Generator(np.random.Philox(key=key, counter=np.zeros(4, np.uint64)))
        gen.standard_normal((1, total))
    out["one_numpy_generator_L0_ms"] = 1e3 * _best(one_generator, repeats, 5)
    return out


def step_row(B: int, n: int, repeats: int, backend: str) -> dict:
    """Seconds per step of the ensemble run, Euler and Euler–Maruyama."""
    rng = np.random.default_rng(0)
    X0 = rng.normal(size=(B, n, D))
    att = tp.Attention("softmax", np.eye(D), np.eye(D), np.eye(D), beta=1.0)
    noise = tp.Noise(sigma=0.3, common=0.2 * rng.normal(size=(K, D, D)))
    steps = 10
    out = {}
    for name, kw in (("euler", {"solver": "euler"}),
                     ("euler_maruyama", {"solver": "euler_maruyama", "noise": noise})):
        run = dict(t_max=steps * 0.01, dt=0.01, saveat=tp.SaveAt(ts=[steps * 0.01]),
                   backend=backend, **kw)
        out[f"{name}_s_per_step"] = _best(lambda r=run: tp.simulate_ensemble(att, X0, **r),
                                          repeats, 1) / steps
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", default="numba")
    p.add_argument("--out", default=str(RESULTS / "noise_draw.json"))
    a = p.parse_args(argv)
    load_before = _load()
    rows = {}
    print(f"d = {D}, K = {K}, best of {a.repeats}; ensemble steps on {a.backend}")
    print(f"{'B x n':<14}{'streams L0 ms':>15}{'streams L3 ms':>15}{'1 generator ms':>16}"
          f"{'Euler s/step':>14}{'EM s/step':>12}")
    for B, n in SHAPES:
        row = draw_row(B, n, a.repeats)
        if B > 1:
            row.update(step_row(B, n, a.repeats, a.backend))
        rows[f"{B}x{n}"] = row
        print(f"{f'{B} x {n}':<14}{row['streams_L0_ms']:>15.3f}{row['streams_L3_ms']:>15.3f}"
              f"{row['one_numpy_generator_L0_ms']:>16.3f}"
              f"{row.get('euler_s_per_step', np.nan):>14.5f}"
              f"{row.get('euler_maruyama_s_per_step', np.nan):>12.5f}")
    result = {"benchmark": "noise_draw", "d": D, "K": K, "backend": a.backend,
              "repeats": a.repeats, "rows": rows, "machine": platform.machine(),
              "cpus": os.cpu_count(), "load_before": load_before, "load_after": _load()}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
