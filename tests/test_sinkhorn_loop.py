"""The one Sinkhorn loop (transformer_pde.sinkhorn_loop) with a dense soft-min.

References: POT's independent log-domain Sinkhorn (``ot.sinkhorn(method="sinkhorn_log")``)
and the marginal equations of the plan themselves.
"""

from __future__ import annotations

import itertools

import numpy as np
import ot
import pytest
from scipy.special import logsumexp

from transformer_pde.anderson import Anderson
from transformer_pde.sinkhorn_loop import EpsilonScaling, sinkhorn_loop


def _problem(rng, n=40, m=30):
    X = rng.normal(size=(n, 2))
    Y = 0.8 * rng.normal(size=(m, 2)) + [0.5, -0.2]
    a = rng.uniform(0.5, 1.5, n)
    b = rng.uniform(0.5, 1.5, m)
    C = ((X[:, None] - Y[None]) ** 2).sum(-1)
    return C, a / a.sum(), b / b.sum()


def _softmins(C, a, b):
    """Dense soft-mins: rows f_i = -eps LSE_j(log b_j + (g_j - C_ij)/eps), and columns."""
    la, lb = np.log(a), np.log(b)

    def rows(g, eps):
        return -eps * logsumexp(lb[None] + (g[None] - C) / eps, axis=1)

    def cols(f, eps):
        return -eps * logsumexp(la[:, None] + (f[:, None] - C) / eps, axis=0)
    return rows, cols


def _marginal_logerr(C, a, b, f, g, eps):
    logP = np.log(a)[:, None] + np.log(b)[None] + (f[:, None] + g[None] - C) / eps
    P = np.exp(logP)
    return max(np.abs(np.log(P.sum(1) / a)).max(), np.abs(np.log(P.sum(0) / b)).max())


@pytest.mark.parametrize("safeguard", ["residual", "dual"])
@pytest.mark.parametrize("scaled", [False, True], ids=["no-ladder", "ladder"])
@pytest.mark.parametrize("m", [0, 10])
def test_alternating_matches_pot(rng, safeguard, scaled, m):
    C, a, b = _problem(rng)
    eps = 0.3
    rows, cols = _softmins(C, a, b)
    scaling = EpsilonScaling(start=float(C.max()), factor=0.5, stage_tol=1e-2,
                             stage_max_iter=40) if scaled else None
    res = sinkhorn_loop(np, rows, eps, n=b.size, softmin_g=cols, tol=1e-11, max_iter=5000,
                        anderson=m, scaling=scaling, safeguard=safeguard,
                        marginals=(a, b))
    assert res.converged and res.reached_target and res.err < 1e-11
    # the returned pair: exact rows, column log-error err (the stopping rule is exact)
    assert _marginal_logerr(C, a, b, res.f, res.g, eps) < 1e-10
    P = np.exp(np.log(a)[:, None] + np.log(b)[None] + (res.f[:, None] + res.g[None] - C) / eps)
    P_pot = ot.sinkhorn(a, b, C, eps, method="sinkhorn_log", numItermax=100_000, stopThr=1e-13)
    np.testing.assert_allclose(P, P_pot, atol=1e-9 * P.max())
    if scaled:
        eps_run = [s[0] for s in res.stages]
        assert eps_run[-1] == eps and all(x > y for x, y in itertools.pairwise(eps_run))


@pytest.mark.parametrize("m", [0, 10])
def test_symmetric_update_solves_the_self_coupling(rng, m):
    X = rng.normal(size=(35, 2))
    a = rng.uniform(0.5, 1.5, 35)
    a /= a.sum()
    C = ((X[:, None] - X[None]) ** 2).sum(-1)
    rows, _ = _softmins(C, a, a)
    res = sinkhorn_loop(np, rows, 0.2, n=35, tol=1e-11, max_iter=3000, anderson=m)
    assert res.converged and res.f is res.g
    assert _marginal_logerr(C, a, a, res.f, res.g, 0.2) < 1e-10
    # the alternating update finds the same plan (potentials up to the gauge f + c, g - c)
    rows, cols = _softmins(C, a, a)
    alt = sinkhorn_loop(np, rows, 0.2, n=35, softmin_g=cols, tol=1e-11, max_iter=3000)
    c = np.mean(alt.f - res.f)
    np.testing.assert_allclose(alt.f - c, res.f, atol=1e-9)
    np.testing.assert_allclose(alt.g + c, res.g, atol=1e-9)


def test_finish_image_is_half_a_step_further(rng):
    C, a, b = _problem(rng)
    rows, cols = _softmins(C, a, b)
    kw = {"n": b.size, "softmin_g": cols, "tol": 1e-6, "max_iter": 500}
    x = sinkhorn_loop(np, rows, 0.5, **kw)
    img = sinkhorn_loop(np, rows, 0.5, finish="image", **kw)
    assert x.n_iter == img.n_iter and x.err == img.err
    np.testing.assert_array_equal(img.g, cols(rows(x.g, 0.5), 0.5))


def test_budget_spent_on_the_ladder_is_reported(rng):
    C, a, b = _problem(rng)
    rows, cols = _softmins(C, a, b)
    scaling = EpsilonScaling(start=100.0, factor=0.5, stage_tol=1e-12, stage_max_iter=50)
    res = sinkhorn_loop(np, rows, 0.01, n=b.size, softmin_g=cols, tol=1e-9, max_iter=20,
                        scaling=scaling)
    assert not res.converged and not res.reached_target and res.err == np.inf
    assert res.n_iter == 20 and res.out is None


def test_plain_sweeps_per_stage_and_readout(rng):
    C, a, b = _problem(rng)
    rows, cols = _softmins(C, a, b)
    V = rng.normal(size=(b.size, 3))
    calls = []

    def readout(g, eps):
        calls.append(eps)
        f = rows(g, eps)
        P = np.exp(np.log(b)[None] + (f[:, None] + g[None] - C) / eps)
        return f, P @ V

    scaling = EpsilonScaling(start=16.0, factor=0.5, stage_tol=None, stage_max_iter=2)
    res = sinkhorn_loop(np, rows, 0.25, n=b.size, softmin_g=cols, tol=1e-10, max_iter=1000,
                        scaling=scaling, readout=readout)
    assert res.converged
    assert [s[1] for s in res.stages[:-1]] == [2] * (len(res.stages) - 1)
    assert set(calls) == {0.25}            # the readout runs at the target eps only
    # its by-product is that of the returned f: the row-normalised plan applied to V
    P = np.exp(np.log(b)[None] + (res.f[:, None] + res.g[None] - C) / 0.25)
    np.testing.assert_allclose(res.out, P @ V, rtol=1e-12, atol=1e-14)


def test_warm_start_skips_the_ladder_and_reuses_secants(rng):
    C, a, b = _problem(rng)
    rows, cols = _softmins(C, a, b)
    scaling = EpsilonScaling(start=20.0, factor=0.5, stage_tol=1e-2, stage_max_iter=40)
    kw = {"n": b.size, "softmin_g": cols, "tol": 1e-10, "max_iter": 2000, "scaling": scaling}
    cold = sinkhorn_loop(np, rows, 0.1, **kw)
    assert len(cold.stages) > 1
    C2 = C * 1.001
    rows2, cols2 = _softmins(C2, a, b)
    kw2 = {**kw, "softmin_g": cols2}
    warm = sinkhorn_loop(np, rows2, 0.1, g0=cold.g, **kw2)
    assert len(warm.stages) == 1 and warm.converged
    reused = sinkhorn_loop(np, rows2, 0.1, g0=cold.g, memory=cold.memory, **kw2)
    assert reused.converged and reused.memory is cold.memory
    assert reused.n_iter <= warm.n_iter < cold.n_iter
    forced = sinkhorn_loop(np, rows2, 0.1, g0=cold.g,
                           **{**kw2, "scaling": EpsilonScaling(20.0, 0.5, 1e-2, 40, warm=True)})
    assert len(forced.stages) > 1


def test_arguments_are_checked():
    def rows(h, e):
        return h

    with pytest.raises(ValueError, match="safeguard"):
        sinkhorn_loop(np, rows, 1.0, n=3, tol=1e-9, max_iter=5, safeguard="none")
    with pytest.raises(ValueError, match="dual"):
        sinkhorn_loop(np, rows, 1.0, n=3, tol=1e-9, max_iter=5, safeguard="dual")
    with pytest.raises(ValueError, match="finish"):
        sinkhorn_loop(np, rows, 1.0, n=3, tol=1e-9, max_iter=5, finish="last")
    with pytest.raises(ValueError, match="factor"):
        EpsilonScaling(1.0, 1.5, None, 1)
    with pytest.raises(ValueError, match="stage_max_iter"):
        EpsilonScaling(1.0, 0.5, None, 0)
    assert EpsilonScaling(8.0, 0.5, None, 1).ladder(1.0) == [8.0, 4.0, 2.0, 1.0]
    assert EpsilonScaling(0.5, 0.5, None, 1).ladder(1.0) == [1.0]
    assert isinstance(sinkhorn_loop(np, lambda h, e: np.zeros(3), 1.0, n=3, tol=1e-9,
                                    max_iter=3).memory, Anderson)
