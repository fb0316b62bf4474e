"""The one Sinkhorn loop (transformer_pde.sinkhorn.loop) with a dense soft-min, and its options.

References: POT's independent log-domain Sinkhorn (``ot.sinkhorn(method="sinkhorn_log")``)
and the marginal equations of the plan themselves.
"""

from __future__ import annotations

import itertools

import numpy as np
import ot
import pytest
from scipy.special import logsumexp

from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.sinkhorn import (
    Acceleration,
    Anderson,
    EpsilonScaling,
    SoftMins,
    Start,
    Stopping,
    sinkhorn_loop,
)


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
    res = sinkhorn_loop(np, SoftMins(rows, cols), eps, n=b.size,
                        stopping=Stopping(1e-11, 5000), scaling=scaling,
                        acceleration=Acceleration(m, safeguard, marginals=(a, b)))
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
    res = sinkhorn_loop(np, SoftMins(rows), 0.2, n=35, stopping=Stopping(1e-11, 3000),
                        acceleration=Acceleration(m))
    assert res.converged and res.f is res.g
    assert _marginal_logerr(C, a, a, res.f, res.g, 0.2) < 1e-10
    # the alternating update finds the same plan (potentials up to the gauge f + c, g - c)
    rows, cols = _softmins(C, a, a)
    alt = sinkhorn_loop(np, SoftMins(rows, cols), 0.2, n=35, stopping=Stopping(1e-11, 3000))
    c = np.mean(alt.f - res.f)
    np.testing.assert_allclose(alt.f - c, res.f, atol=1e-9)
    np.testing.assert_allclose(alt.g + c, res.g, atol=1e-9)


def test_finish_image_is_half_a_step_further(rng):
    C, a, b = _problem(rng)
    rows, cols = _softmins(C, a, b)
    x = sinkhorn_loop(np, SoftMins(rows, cols), 0.5, n=b.size, stopping=Stopping(1e-6, 500))
    img = sinkhorn_loop(np, SoftMins(rows, cols), 0.5, n=b.size,
                        stopping=Stopping(1e-6, 500, finish="image"))
    assert x.n_iter == img.n_iter and x.err == img.err
    np.testing.assert_array_equal(img.g, cols(rows(x.g, 0.5), 0.5))


def test_budget_spent_on_the_ladder_is_reported(rng):
    C, a, b = _problem(rng)
    rows, cols = _softmins(C, a, b)
    scaling = EpsilonScaling(start=100.0, factor=0.5, stage_tol=1e-12, stage_max_iter=50)
    res = sinkhorn_loop(np, SoftMins(rows, cols), 0.01, n=b.size, stopping=Stopping(1e-9, 20),
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
    res = sinkhorn_loop(np, SoftMins(rows, cols, readout=readout), 0.25, n=b.size,
                        stopping=Stopping(1e-10, 1000), scaling=scaling)
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
    kw = {"n": b.size, "stopping": Stopping(1e-10, 2000)}
    cold = sinkhorn_loop(np, SoftMins(rows, cols), 0.1, scaling=scaling, **kw)
    assert len(cold.stages) > 1
    C2 = C * 1.001
    ops2 = SoftMins(*_softmins(C2, a, b))
    warm = sinkhorn_loop(np, ops2, 0.1, start=Start(g0=cold.g), scaling=scaling, **kw)
    assert len(warm.stages) == 1 and warm.converged
    reused = sinkhorn_loop(np, ops2, 0.1, start=Start(g0=cold.g, memory=cold.memory),
                           scaling=scaling, **kw)
    assert reused.converged and reused.memory is cold.memory
    assert reused.n_iter <= warm.n_iter < cold.n_iter
    forced = sinkhorn_loop(np, ops2, 0.1, start=Start(g0=cold.g),
                           scaling=EpsilonScaling(20.0, 0.5, 1e-2, 40, warm=True), **kw)
    assert len(forced.stages) > 1


def test_arguments_are_checked():
    def rows(h, e):
        return h

    stop = Stopping(1e-9, 5)
    with pytest.raises(ArgumentError, match="Acceleration.safeguard"):
        Acceleration(10, "none")
    with pytest.raises(ArgumentError, match="dual"):
        Acceleration(10, "dual")
    a = np.full(3, 1 / 3)
    with pytest.raises(ArgumentError, match="dual"):      # dual needs the alternating update
        sinkhorn_loop(np, SoftMins(rows), 1.0, n=3, stopping=stop,
                      acceleration=Acceleration(10, "dual", marginals=(a, a)))
    with pytest.raises(ArgumentError, match="no fused sweep"):
        sinkhorn_loop(np, SoftMins(rows, rows, sweep=lambda g, e: (g, g, None)), 1.0, n=3,
                      stopping=stop, acceleration=Acceleration(10, "dual", marginals=(a, a)))
    with pytest.raises(ArgumentError, match="SoftMins.sweep"):
        SoftMins(rows, sweep=lambda g, e: (g, g, None))
    with pytest.raises(ArgumentTypeError, match="SoftMins.g"):
        SoftMins(rows, "cols")
    with pytest.raises(ArgumentError, match="Stopping.finish"):
        Stopping(1e-9, 5, finish="last")
    for kw, name in (({"tol": 0.0}, "Stopping.tol"), ({"tol": np.nan}, "Stopping.tol"),
                     ({"max_iter": 0}, "Stopping.max_iter"), ({"expect": -1.0}, "Stopping.expect"),
                     ({"expect": np.nan}, "Stopping.expect")):
        with pytest.raises(ArgumentError, match=name):
            Stopping(**{"tol": 1e-9, "max_iter": 5, **kw})
    with pytest.raises(ArgumentTypeError, match="Stopping.max_iter"):
        Stopping(1e-9, "5")
    with pytest.raises(ArgumentTypeError, match="Stopping.next_step"):
        Stopping(1e-9, 5, next_step=1)
    with pytest.raises(ArgumentError, match="Acceleration.anderson"):
        Acceleration(-1)
    with pytest.raises(ArgumentTypeError, match="Start.memory"):
        Start(memory=object())
    with pytest.raises(ArgumentTypeError, match="stopping"):
        sinkhorn_loop(np, SoftMins(rows), 1.0, n=3, stopping={"tol": 1e-9})
    with pytest.raises(ArgumentError, match="EpsilonScaling.factor"):
        EpsilonScaling(1.0, 1.5, None, 1)
    with pytest.raises(ArgumentError, match="EpsilonScaling.stage_max_iter"):
        EpsilonScaling(1.0, 0.5, None, 0)
    with pytest.raises(ArgumentError, match="EpsilonScaling.start"):
        EpsilonScaling(0.0, 0.5, None, 1)
    with pytest.raises(ArgumentError, match="EpsilonScaling.stage_tol"):
        EpsilonScaling(1.0, 0.5, -1.0, 1)
    assert EpsilonScaling(8.0, 0.5, None, 1).ladder(1.0) == [8.0, 4.0, 2.0, 1.0]
    assert EpsilonScaling(0.5, 0.5, None, 1).ladder(1.0) == [1.0]
    res = sinkhorn_loop(np, SoftMins(lambda h, e: np.zeros(3)), 1.0, n=3,
                        stopping=Stopping(1e-9, 3))
    assert isinstance(res.memory, Anderson)
    # a memory of another size is not reused
    other = Anderson(3)
    res = sinkhorn_loop(np, SoftMins(lambda h, e: np.zeros(3)), 1.0, n=3,
                        stopping=Stopping(1e-9, 3), start=Start(memory=other))
    assert res.memory is not other and res.memory.m == 10
