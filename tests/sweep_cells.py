"""Cell functions for tests/sweep/test_sweep.py, importable by Dask worker processes."""

import os
import time
from pathlib import Path

import numpy as np


def noisy_mean(params, rng):
    """A cell whose value depends on its seed: any seeding or scheduling bug shows."""
    x = rng.normal(loc=params["mu"], scale=params.get("sigma", 1.0), size=50)
    return {"mean": float(x.mean()), "head": x[:3].copy(), "count": int(np.sum(x > 0))}


def slow_logged(params, rng):
    """Sleeps, then appends its cell key to $TPDE_SWEEP_LOG (one file per call)."""
    time.sleep(float(os.environ.get("TPDE_SWEEP_SLEEP", "0.05")))
    log = os.environ.get("TPDE_SWEEP_LOG")
    value = float(rng.normal(loc=params["mu"]))
    if log:
        Path(log).mkdir(parents=True, exist_ok=True)
        with open(Path(log) / f"{os.getpid()}-{time.time_ns()}", "w") as fh:
            fh.write(f"{params['mu']}:{value!r}")
    return {"value": value}


def flaky(params, rng):
    if params["mu"] == 1.0:
        raise RuntimeError("this cell always fails")
    return {"value": float(rng.uniform())}
