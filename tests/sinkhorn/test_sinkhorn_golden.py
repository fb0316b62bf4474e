"""The Sinkhorn solvers reproduce stored outputs bit for bit.

``tests/data/sinkhorn_golden.npz`` holds, on fixed inputs, the potentials, iteration counts
and value averages of :func:`~transformer_pde.sinkhorn.sinkhorn_potentials` (cold, with the
epsilon ladder, warm-started with reused secants; NumPy and Numba backends), Sinkhorn
attention fields, short ``simulate`` runs (RK4 and Euler, warm starts along the run) and
debiased Sinkhorn divergences (:func:`~transformer_pde.diagnostics.wasserstein`).  A change
that keeps the mathematics must keep every bit and every iteration count; a change of the
mathematics regenerates the file (``tests/data/make_sinkhorn_golden.py``) and says so.

Bits depend on the primitives underneath (BLAS, libm, the Numba kernels): the file also
keeps "canaries", those primitives on fixed inputs.  Where a canary differs on the machine
running the test, the outputs built on it are compared to a relative 1e-10 instead (the
solvers stop at marginal errors of 1e-9 or below, so a last-bit change of a primitive
moves the outputs far less than that), and iteration counts by at most one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = np.load(DATA / "sinkhorn_golden.npz")


def _generator():
    spec = importlib.util.spec_from_file_location("make_sinkhorn_golden",
                                                  DATA / "make_sinkhorn_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _generator()


def _canaries_equal(names) -> bool:
    now = GEN.canaries()
    return all(np.array_equal(now[k], GOLDEN[k]) for k in names)


def _compare(new: dict, exact: bool) -> None:
    for key, val in new.items():
        ref = GOLDEN[key]
        val = np.asarray(val)
        assert val.shape == ref.shape, key
        if key.endswith(("_it", "_its")):
            if exact:
                np.testing.assert_array_equal(val, ref, err_msg=key)
            else:
                assert np.all(np.abs(val - ref) <= 1), key
        elif exact:
            # bit for bit (NaN/inf positions included)
            assert np.array_equal(val, ref, equal_nan=True), \
                f"{key}: max |diff| {np.nanmax(np.abs(val - ref)):.3g}"
        else:
            np.testing.assert_allclose(val, ref, rtol=1e-10, atol=1e-10, err_msg=key)


def test_canaries_are_reproducible():
    """The canaries themselves are deterministic on this machine (two runs agree)."""
    a, b = GEN.canaries(), GEN.canaries()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("part", ["potentials_cases", "field_cases", "trajectory_cases",
                                  "w2_cases"])
def test_outputs_match_stored(part):
    exact = _canaries_equal([k for k in GOLDEN["__canaries__"]])
    _compare(getattr(GEN, part)(), exact)
