"""Cost of a stochastic step against the deterministic one: Euler–Maruyama vs Euler.

N = 10 000 tokens in d = 3, softmax attention (Q, K, V random with entries of variance
1/d, beta = 1), the Numba backend, a fixed number of steps, only the last state saved.
Rows: the explicit Euler step, Euler–Maruyama with individual noise, with individual and
common noise (K = 2 matrices), Heun and Stratonovich Heun with both noises, and
Euler–Maruyama on the sphere.  The table gives the wall and CPU seconds per step (best of
``--repeats`` after a warm-up run) and the ratio to the deterministic step of the same
field evaluations (Euler for Euler–Maruyama, Heun for Stratonovich Heun): what the noise
costs (drawing N d + K normals on the host, moving them to the backend, the projection
and the retraction on the sphere) next to the N^2 field.

Usage::

    python benchmarks/sde_step.py                  # writes results/sde_step.json
    python benchmarks/sde_step.py --n 2000 --steps 5 --out /tmp/s.json

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

RESULTS = Path(__file__).resolve().parent / "results"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cases(d: int) -> dict[str, dict]:
    """The runs of the table: solver, noise and block of each."""
    A = np.random.default_rng(1).normal(size=(2, d, d)) / np.sqrt(d)
    both = tp.Noise(sigma=0.3, common=0.2 * A)
    sphere = tp.Block(constraint=tp.Sphere())
    return {
        "euler": {"solver": "euler"},
        "euler_maruyama sigma": {"solver": "euler_maruyama", "noise": tp.Noise(sigma=0.3)},
        "euler_maruyama sigma+common": {"solver": "euler_maruyama", "noise": both},
        "heun": {"solver": "heun"},
        "heun_stratonovich sigma+common": {"solver": "heun_stratonovich", "noise": both},
        "euler sphere": {"solver": "euler", "block": sphere},
        "euler_maruyama sphere sigma+common": {"solver": "euler_maruyama", "noise": both,
                                               "block": sphere},
    }


def time_case(att, X0, steps, dt, repeats, backend, **kw) -> dict:
    """Best wall and CPU seconds per step of one run (after a warm-up run)."""
    run = dict(t_max=steps * dt, dt=dt, saveat=tp.SaveAt(every=steps),
               field=tp.FieldOptions(backend=backend), **kw)
    tp.simulate(att, X0, **run)
    best, best_cpu = np.inf, np.inf
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        traj = tp.simulate(att, X0, **run)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
    assert traj.success and traj.info["n_steps"] == steps, traj.status
    return {"seconds_per_step": best / steps, "cpu_seconds_per_step": best_cpu / steps}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--d", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--backend", default="numba")
    p.add_argument("--out", default=str(RESULTS / "sde_step.json"))
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    Q, K, V = (rng.normal(size=(a.d, a.d)) / np.sqrt(a.d) for _ in range(3))
    att = tp.Attention("softmax", Q, K, V, beta=1.0)
    X0 = rng.normal(size=(a.n, a.d))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    load_before = _load()
    rows = {name: time_case(att, X0, a.steps, 0.01, a.repeats, a.backend, **kw)
            for name, kw in cases(a.d).items()}
    base = {"euler_maruyama": "euler", "heun_stratonovich": "heun"}
    print(f"N = {a.n}, d = {a.d}, {a.backend}, {a.steps} steps, best of {a.repeats}")
    print(f"{'run':<38}{'s/step':>10}{'CPU s/step':>12}{'x deterministic':>17}")
    for name, r in rows.items():
        solver = name.split()[0]
        ref = base.get(solver, solver) + (" sphere" if "sphere" in name else "")
        r["ratio"] = r["seconds_per_step"] / rows[ref]["seconds_per_step"]
        print(f"{name:<38}{r['seconds_per_step']:>10.4f}{r['cpu_seconds_per_step']:>12.4f}"
              f"{r['ratio']:>17.2f}")
    result = {"benchmark": "sde_step", "n": a.n, "d": a.d, "backend": a.backend,
              "steps": a.steps, "repeats": a.repeats, "rows": rows,
              "machine": platform.machine(), "cpus": os.cpu_count(),
              "load_before": load_before, "load_after": _load()}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
