"""Sinkhorn potentials: the solver, the dense coupling, lean passes, failure modes.

References used: POT's independent log-domain Sinkhorn, the exact marginal identities
(double stochasticity) and the loop's own stopping quantity recomputed from the returned
potentials.
"""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.backends import get_backend
from transformer_pde.sinkhorn import (
    ScoreSoftMin,
    SinkhornNotConverged,
    SinkhornWarmStart,
    out_of_sample_potential,
    sinkhorn_coupling,
    sinkhorn_field,
    sinkhorn_potentials,
)

from sinkhorn_cases import A_GEN, A_SYM, NP
from sinkhorn_cases import weights as _weights


def _solve(X, A, w, eps=1.0, **kw):
    with np.errstate(divide="ignore"):
        logw = np.log(w)
    sym = bool(np.allclose(A, A.T))
    return sinkhorn_potentials(NP, X @ A.T, X, logw, eps, symmetric=kw.pop("symmetric", sym), **kw)


# ------------------------------------------------------------------ the coupling
@pytest.mark.parametrize("A", [A_GEN, A_SYM], ids=["general", "symmetric"])
@pytest.mark.parametrize("zero", [False, True], ids=["w>0", "one-w=0"])
def test_coupling_doubly_stochastic(rng, A, zero):
    X = rng.normal(size=(70, 2))
    w = _weights(rng, 70, zero)
    pi, res = sinkhorn_coupling(X, A, weights=w, eps=0.7)
    assert res.converged and res.err < 1e-9
    assert res.symmetric == bool(np.allclose(A, A.T))
    # log-domain marginal error < 1e-9 means each marginal is within a factor e^{±1e-9}
    # of w; 2e-9 relative leaves room for the final summation's round-off.
    np.testing.assert_allclose(pi.sum(axis=1), w, rtol=2e-9, atol=1e-300)
    np.testing.assert_allclose(pi.sum(axis=0), w, rtol=2e-9, atol=1e-300)
    assert np.all(pi >= 0)


@pytest.mark.parametrize("A", [A_GEN, A_SYM], ids=["general", "symmetric"])
@pytest.mark.parametrize("eps", [1.0, 0.2])
def test_matches_pot_sinkhorn_log(rng, A, eps):
    ot = pytest.importorskip("ot")
    X = rng.normal(size=(50, 2))
    w = _weights(rng, 50)
    pi, res = sinkhorn_coupling(X, A, weights=w, eps=eps, tol=1e-12)
    M = -(X @ A.T) @ X.T            # cost -s(x_i, x_j) = -x_j^T A x_i
    pi_pot = ot.sinkhorn(w, w, M, eps, method="sinkhorn_log", numItermax=200_000,
                         stopThr=1e-13)
    assert np.abs(pi_pot.sum(axis=1) - w).max() < 1e-12  # POT itself converged
    # Both solve the same strictly convex problem to marginal errors ~1e-12; the entropic
    # coupling is Lipschitz in the marginals with a constant of order 1/eps, so 1e-9 of
    # the largest entry is a comfortable bound.
    np.testing.assert_allclose(pi, pi_pot, rtol=0, atol=1e-9 * pi.max())


def test_symmetric_path_equals_general_path(rng):
    X = rng.normal(size=(60, 2))
    w = _weights(rng, 60)
    r_sym = _solve(X, A_SYM, w, symmetric=True)
    r_gen = _solve(X, A_SYM, w, symmetric=False)
    assert r_sym.converged and r_gen.converged
    assert r_sym.f is r_sym.g
    # the general path fixes the gauge by equal weighted means; the symmetric solution
    # is the unique one with f = g, which satisfies it, so the potentials agree
    np.testing.assert_allclose(r_gen.f, r_sym.f, atol=1e-8)
    np.testing.assert_allclose(r_gen.g, r_sym.f, atol=1e-8)


@pytest.mark.parametrize("A", [A_GEN, A_SYM], ids=["general", "symmetric"])
def test_anderson_and_eps_scaling_do_not_change_the_answer(rng, A):
    X = rng.normal(size=(50, 2)) * 2.0
    w = _weights(rng, 50)
    plain = _solve(X, A, w, eps=0.3, anderson=0, eps_scaling=False, max_iter=20_000)
    fast = _solve(X, A, w, eps=0.3)
    scaled = _solve(X, A, w, eps=0.3, eps_scaling=True)
    for r in (plain, fast, scaled):
        assert r.converged
    assert fast.n_iter < plain.n_iter       # acceleration pays off
    for r in (fast, scaled):
        # potentials are unique up to the gauge fixed on exit; 1e-9 log-error -> ~eps*1e-8
        np.testing.assert_allclose(r.f, plain.f, atol=1e-8)
        np.testing.assert_allclose(r.g, plain.g, atol=1e-8)


def test_out_of_sample_potential_at_tokens_is_f(rng):
    X = rng.normal(size=(40, 2))
    w = _weights(rng, 40)
    r = _solve(X, A_GEN, w)
    f_oos = out_of_sample_potential(NP, X @ A_GEN.T, X, np.log(w), r.g, 1.0)
    # rows are exact for (T_f(g), g): f equals the out-of-sample potential up to rounding
    np.testing.assert_allclose(f_oos, r.f, atol=1e-12)


def test_huge_costs_small_eps_stay_finite():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 2)) * 30.0       # scores up to ~3e3, eps = 1e-3: |s|/eps ~ 1e6
    pi, res = sinkhorn_coupling(X, A_GEN, eps=1e-3, max_iter=5000)
    assert np.all(np.isfinite(pi)) and np.all(np.isfinite(res.f)) and np.all(np.isfinite(res.g))
    # the requested 1e-9 is below the float64 rounding floor u*|s|/eps ~ 1e-9, so the
    # solver raises the tolerance to 8 * floor and says so in res.tol
    assert res.tol > 1e-9 and res.err < res.tol < 1e-6
    w = np.full(40, 1 / 40)
    np.testing.assert_allclose(pi.sum(axis=1), w, rtol=2 * res.tol)
    np.testing.assert_allclose(pi.sum(axis=0), w, rtol=2 * res.tol)
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), np.eye(2), eps=1e-3)
    v = tp.velocity(att, X, sinkhorn_max_iter=5000)
    assert np.all(np.isfinite(v))
    # the field is a convex combination of the V x_j: inside their bounding box
    assert np.all(v <= X.max(axis=0) + 1e-9) and np.all(v >= X.min(axis=0) - 1e-9)


def test_huge_costs_slow_convergence_is_reported():
    # non-uniform weights at eps = 1e-3: the coupling is close to a sparse optimal plan
    # with split masses, where Sinkhorn converges extremely slowly.  What matters: every
    # number stays finite and the failure is reported, not returned.
    rng = np.random.default_rng(20250122)
    X = rng.normal(size=(40, 2)) * 30.0
    w = _weights(rng, 40)
    r = _solve(X, A_GEN, w, eps=1e-3, max_iter=300)
    # the budget runs out on the epsilon ladder: no error at the target eps to report
    assert not r.converged and not r.reached_eps and r.err == np.inf
    assert "ladder" in r.failure()
    assert np.all(np.isfinite(r.f)) and np.all(np.isfinite(r.g))
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), np.eye(2), eps=1e-3)
    with pytest.raises(SinkhornNotConverged, match="eps=0.001"):
        tp.velocity(att, X, weights=w, sinkhorn_max_iter=300)


def test_float32_uses_rounding_floor(rng):
    X = rng.normal(size=(50, 2)).astype(np.float32)
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), np.eye(2))
    v32 = tp.velocity(att, X)
    v64 = tp.velocity(att, X.astype(np.float64))
    assert v32.dtype == np.float32
    # float32 round-off (~1e-7) times |s|/eps ~ 10 and a few summations
    np.testing.assert_allclose(v32, v64, atol=2e-5)


# ------------------------------------------------------------------ failure modes
def test_non_convergence_is_never_silent(rng):
    X = rng.normal(size=(50, 2))
    w = _weights(rng, 50)
    r = _solve(X, A_GEN, w, max_iter=2, values=X)
    assert not r.converged and r.err >= r.tol and r.out is None
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), np.eye(2))
    with pytest.raises(SinkhornNotConverged, match="sinkhorn_max_iter"):
        tp.velocity(att, X, sinkhorn_max_iter=2)
    with pytest.raises(SinkhornNotConverged):
        sinkhorn_coupling(X, A_GEN, max_iter=2)
    state = SinkhornWarmStart()
    with pytest.raises(SinkhornNotConverged, match="head 3"):
        sinkhorn_field(NP, X @ A_GEN.T, X, X, np.log(w), 1.0, state=state, max_iter=2,
                       label="head 3")
    assert state.predict(0.0, 50) == (None, None)    # no stale potentials kept
    traj = tp.simulate(att, X, t_max=1.0, dt=0.1, field=tp.FieldOptions(sinkhorn_max_iter=2))
    assert traj.status == "failed" and "Sinkhorn did not converge" in traj.message
    assert len(traj.times) == 1                  # nothing computed from a bad field


def test_masked_sinkhorn_refused():
    with pytest.raises(ValueError, match="sinkhorn"):
        tp.Attention("sinkhorn", np.eye(2), np.eye(2), np.eye(2), masked=True)


@pytest.mark.parametrize("kw, match", [({"eps": 0.0}, "eps"), ({"eps": np.nan}, "eps"),
                                       ({"tol": -1.0}, "tol"), ({"max_iter": 0}, "max_iter")])
def test_bad_arguments(rng, kw, match):
    X = rng.normal(size=(5, 2))
    args = {"eps": 1.0, **kw}
    eps = args.pop("eps")
    with pytest.raises(ValueError, match=match):
        sinkhorn_potentials(NP, X, X, np.full(5, -np.log(5)), eps, **args)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_g_next_is_closer_than_the_verified_iterate(symmetric, backend):
    # g_next (what the warm start remembers) is the accelerated step after the converged
    # iterate: its marginal error, measured here by one more Sinkhorn iteration, is below
    # the reported one, and the verified (f, g) and their error are what the solve returns
    be = get_backend(backend)
    rng = np.random.default_rng(3)
    n, eps = 300, 0.5
    X = rng.normal(size=(n, 2))
    A = np.array([[1.0, 0.3], [0.3, -0.5]]) if symmetric else np.array([[1.0, 0.5],
                                                                        [-0.3, 0.8]])
    qx, kx = X @ A.T, X
    logw = np.full(n, -np.log(n))
    res = sinkhorn_potentials(be, qx, kx, logw, eps, tol=1e-6, symmetric=symmetric)
    assert res.converged and res.g_next is not None
    rows = ScoreSoftMin(be, qx, kx, logw)

    def err(g):
        if symmetric:
            return float(np.max(np.abs(rows(g, eps) - g))) / eps
        return float(np.max(np.abs(ScoreSoftMin(be, kx, qx, logw)(rows(g, eps), eps) - g))) / eps

    assert err(res.g) == pytest.approx(res.err, rel=1e-6)
    assert err(res.g_next) < 0.5 * res.err
    if symmetric:
        assert res.f is res.g
    failed = sinkhorn_potentials(be, qx, kx, logw, eps, tol=1e-12, max_iter=2,
                                 symmetric=symmetric)
    assert not failed.converged and failed.g_next is None


class _Counting:
    """A backend that counts the passes of each kind (softmax with values, lse alone)."""

    def __init__(self, be):
        self._be, self.calls = be, []

    def __getattr__(self, name):
        return getattr(self._be, name)

    def softmax(self, *a):
        self.calls.append("softmax")
        return self._be.softmax(*a)

    def lse(self, *a):
        self.calls.append("lse")
        return self._be.lse(*a)


def _lean_problem(symmetric):
    rng = np.random.default_rng(5)
    n, eps = 200, 0.5
    X = rng.normal(size=(n, 2))
    A = A_SYM if symmetric else A_GEN
    return X @ A.T, X, X @ np.array([[0.5, -0.5], [0.5, 0.2]]).T, np.full(n, -np.log(n)), eps


@pytest.mark.parametrize("symmetric", [True, False])
def test_lean_passes_average_values_only_where_the_solve_may_end(symmetric):
    qx, kx, vx, logw, eps = _lean_problem(symmetric)
    be = _Counting(NP)
    res = sinkhorn_potentials(be, qx, kx, logw, eps, values=vx, symmetric=symmetric,
                              eps_scaling=False)
    assert res.converged and res.n_iter >= 4
    rows = be.calls if symmetric else be.calls[0::2]   # the row passes (then a column lse)
    assert len(rows) == res.n_iter
    # the values are averaged on the last few passes only (a pass predicted to end the
    # solve that does not: about an eighth of a pass lost), and on the last one
    assert rows[-1] == "softmax" and rows.count("softmax") <= 3
    assert rows[:res.n_iter - 3] == ["lse"] * (res.n_iter - 3)
    # the result is the value average of the returned potentials (to rounding: the
    # alternating solve's potentials are shifted to a common gauge after the last pass)
    ref = NP.softmax(qx * (1.0 / eps), kx, vx, logw + res.g * (1.0 / eps), None)[0]
    np.testing.assert_allclose(res.out, ref, rtol=0, atol=1e-14)
    # and the solve is the one that averages values on every pass, up to rounding
    be.calls.clear()
    full = sinkhorn_potentials(be, qx, kx, logw, eps, values=vx, symmetric=symmetric,
                               eps_scaling=False, expect=0.0)
    assert full.n_iter == res.n_iter
    np.testing.assert_allclose(full.out, res.out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_lean_pass_that_converges_reads_the_values_out_once(symmetric):
    qx, kx, vx, logw, eps = _lean_problem(symmetric)
    ref = sinkhorn_potentials(NP, qx, kx, logw, eps, values=vx, symmetric=symmetric, tol=1e-12)
    be = _Counting(NP)
    # warm start at the solution: the first (lean, nothing expected) pass converges
    res = sinkhorn_potentials(be, qx, kx, logw, eps, values=vx, symmetric=symmetric,
                              g0=ref.g, tol=1e-9)
    assert res.converged and res.n_iter == 1
    assert be.calls == (["lse", "softmax"] if symmetric else ["lse", "lse", "softmax"])
    np.testing.assert_allclose(res.out, ref.out, rtol=0, atol=1e-10)
    # expected to converge: the first pass averages the values at once
    be.calls.clear()
    again = sinkhorn_potentials(be, qx, kx, logw, eps, values=vx, symmetric=symmetric,
                                g0=ref.g, tol=1e-9, expect=1e-10)
    assert again.n_iter == 1
    assert be.calls == (["softmax"] if symmetric else ["softmax", "lse"])
    assert np.array_equal(again.out, res.out)


def test_expect_is_checked_and_named():
    from transformer_pde.errors import ArgumentError, ArgumentTypeError

    qx, kx, vx, logw, eps = _lean_problem(True)
    for bad, err in (("small", ArgumentTypeError), (-1e-9, ArgumentError),
                     (float("nan"), ArgumentError), ([1e-9, 1e-9], ArgumentTypeError)):
        with pytest.raises(err, match="expect"):
            sinkhorn_potentials(NP, qx, kx, logw, eps, symmetric=True, expect=bad)
    # inf is allowed (a start known to be far off): the first pass is then lean
    res = sinkhorn_potentials(NP, qx, kx, logw, eps, symmetric=True, values=vx,
                              expect=float("inf"))
    assert res.converged and res.out is not None
