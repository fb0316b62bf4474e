"""Score matrices, weights and backends shared by the Sinkhorn tests (``tests/sinkhorn/``)."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde.backends import BackendNotAvailable, get_backend

NP = get_backend("numpy")
A_GEN = np.array([[1.0, 0.5], [-0.3, 0.8]])     # non-symmetric
A_SYM = np.array([[1.0, 0.3], [0.3, -0.5]])     # symmetric, indefinite


def weights(rng: np.random.Generator, n: int, zero: bool = False) -> np.ndarray:
    """Normalised masses in [0.5, 1.5] (before normalising); ``zero``: the fourth one is 0."""
    w = rng.uniform(0.5, 1.5, size=n)
    if zero:
        w[3] = 0.0
    return w / w.sum()


def numba_backend():
    """The Numba backend, or skip the test where Numba is not installed."""
    try:
        return get_backend("numba")
    except BackendNotAvailable:
        pytest.skip("numba not installed")
