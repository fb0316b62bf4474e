"""The fused Sinkhorn sweep (a backend's ``sinkhorn_sweep``): the same iteration as two
log-domain passes, its fallbacks and its lean passes.  The kernel alone (against dense
logits, thread independence) is tested with the backend, ``tests/backends/test_numba_sweep.py``.

References used: the NumPy backend's two log-domain passes.
"""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde.sinkhorn import FusedSweep, ScoreSoftMin, sinkhorn_potentials

from sinkhorn_cases import A_GEN, A_SYM, NP
from sinkhorn_cases import numba_backend as _numba
from sinkhorn_cases import weights as _weights


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_sweep_is_the_alternating_iteration(rng, dtype):
    # the Numba backend does a whole iteration in one pass (column update from the plan's
    # column sums); same potentials and field as the NumPy backend's two log-domain
    # passes, to rounding (float64: 1e-12; float32: its own rounding floor, 1e-4)
    nb = _numba()
    X = rng.normal(size=(300, 2)).astype(dtype)
    w = _weights(rng, 300)
    logw = np.log(w).astype(dtype)
    V = (X @ np.array([[0.5, -0.5], [0.5, 0.2]]).T).astype(dtype)
    qx = X @ A_GEN.T.astype(dtype)
    assert FusedSweep.applies(nb, logw) and not FusedSweep.applies(NP, logw)
    ref = sinkhorn_potentials(NP, qx.astype(float), X.astype(float), logw.astype(float), 0.7,
                              values=V.astype(float))
    res = sinkhorn_potentials(nb, qx, X, logw, 0.7, values=V)
    assert res.converged and ref.converged
    tol = 1e-12 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(res.out, ref.out, atol=tol * np.abs(V).max())
    np.testing.assert_allclose(res.g, ref.g, atol=10 * tol)
    if dtype == np.float64:
        assert abs(res.n_iter - ref.n_iter) <= 1


def test_fused_sweep_falls_back_where_columns_underflow():
    # a cold start at small eps: some columns receive no representable mass in the first
    # iterations, so their update must come from the log-domain pass; the answer is that
    # of the NumPy backend
    nb = _numba()
    rng = np.random.default_rng(4)
    X = rng.normal(size=(200, 2)) * 3.0
    logw = np.full(200, -np.log(200.0))
    qx = X @ A_GEN.T
    rows, cols = ScoreSoftMin(nb, qx, X, logw), ScoreSoftMin(nb, X, qx, logw)
    sweep = FusedSweep(nb, rows, cols, None)
    _, g1, out = sweep(np.zeros(200), 0.001)
    assert sweep.fallbacks == 1 and out is None
    np.testing.assert_array_equal(g1, cols(rows(np.zeros(200), 0.001), 0.001))
    res = sinkhorn_potentials(nb, qx, X, logw, 1.0)
    ref = sinkhorn_potentials(NP, qx, X, logw, 1.0)
    assert res.converged and ref.converged
    np.testing.assert_allclose(res.g, ref.g, atol=1e-9)


def _lean_problem(symmetric):
    rng = np.random.default_rng(5)
    n, eps = 200, 0.5
    X = rng.normal(size=(n, 2))
    A = A_SYM if symmetric else A_GEN
    return X @ A.T, X, X @ np.array([[0.5, -0.5], [0.5, 0.2]]).T, np.full(n, -np.log(n)), eps


class _SpySweep:
    """A backend whose ``sinkhorn_sweep`` records whether each call averaged values."""

    def __init__(self, be):
        self._be, self.seen = be, []

    def __getattr__(self, name):
        return getattr(self._be, name)

    def sinkhorn_sweep(self, q, k, v, bias, w):
        self.seen.append(v is not None)
        return self._be.sinkhorn_sweep(q, k, v, bias, w)


def test_fused_sweep_is_found_by_the_backend_protocol():
    # any backend with a sinkhorn_sweep method gets the fused pass (positive weights only);
    # one without it, the two log-domain passes
    logw = np.full(4, -np.log(4.0))
    assert not FusedSweep.applies(NP, logw)
    assert FusedSweep.applies(_SpySweep(NP), logw)
    assert not FusedSweep.applies(_SpySweep(NP), np.array([0.0, -np.inf, 0.0, 0.0]))


def test_fused_sweep_is_lean_except_near_the_end():
    qx, kx, vx, logw, eps = _lean_problem(False)
    be = _SpySweep(_numba())
    seen = be.seen
    res = sinkhorn_potentials(be, qx, kx, logw, eps, values=vx, eps_scaling=False)
    assert res.converged and len(seen) == res.n_iter >= 4
    assert seen[-1] and sum(seen) <= 3 and not any(seen[:res.n_iter - 3])
    ref = NP.softmax(qx * (1.0 / eps), kx, vx, logw + res.g * (1.0 / eps), None)[0]
    np.testing.assert_allclose(res.out, ref, rtol=0, atol=1e-13)
