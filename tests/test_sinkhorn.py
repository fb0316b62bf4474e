"""Sinkhorn attention: the solver, the field, warm starts, failure modes.

References used: POT's independent log-domain Sinkhorn, the exact marginal identities
(double stochasticity), the first-order expansion in 1/eps, the exact mean equation
alpha' = V alpha (docs/conventions.md), and the NumPy backend as reference for the Numba backend.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings

import transformer_pde as tp
from transformer_pde.backends import BackendNotAvailable, get_backend
from transformer_pde.fields import FieldEvaluator
from transformer_pde.testing import attention_problems
from transformer_pde.sinkhorn import (
    SinkhornNotConverged,
    SinkhornWarmStart,
    out_of_sample_potential,
    sinkhorn_coupling,
    sinkhorn_field,
    sinkhorn_potentials,
    sinkhorn_summary,
)

NP = get_backend("numpy")
A_GEN = np.array([[1.0, 0.5], [-0.3, 0.8]])     # non-symmetric
A_SYM = np.array([[1.0, 0.3], [0.3, -0.5]])     # symmetric, indefinite


def _weights(rng, n, zero=False):
    w = rng.uniform(0.5, 1.5, size=n)
    if zero:
        w[3] = 0.0
    return w / w.sum()


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


# ------------------------------------------------------------------ the field
def _field_reference(X, w, head_A, Vh, eps):
    pi, _ = sinkhorn_coupling(X, head_A, weights=w, eps=eps, tol=1e-12)
    return (pi / w[:, None]) @ X @ Vh.T


def test_field_matches_dense_coupling_multihead(rng):
    d, H = 4, 2
    X = rng.normal(size=(50, d))
    w = _weights(rng, 50)
    Q, K, V = (rng.normal(size=(d, d)) * 0.5 for _ in range(3))
    att = tp.Attention("sinkhorn", Q, K, V, heads=H, eps=0.8)
    v = tp.velocity(att, X, weights=w)
    ref = np.zeros_like(X)
    for h in range(H):
        rows = slice(2 * h, 2 * h + 2)
        ref[:, rows] = _field_reference(X, w, K[rows].T @ Q[rows], V[rows], 0.8)
    # one Sinkhorn problem per head; both sides at marginal error <= 1e-9
    np.testing.assert_allclose(v, ref, atol=1e-8)


def test_queries_use_out_of_sample_potential(rng):
    X = rng.normal(size=(60, 2))
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), np.eye(2))
    v = tp.velocity(att, X)
    vq = tp.velocity(att, X, queries=X.copy())
    np.testing.assert_allclose(vq, v, atol=1e-12)
    Y = rng.normal(size=(7, 2)) * 3.0
    vY = tp.velocity(att, X, queries=Y)
    # out-of-sample kernel rows sum to one: the field is a convex combination of the x_j
    assert np.all(vY <= X.max(axis=0) + 1e-12) and np.all(vY >= X.min(axis=0) - 1e-12)


@pytest.mark.parametrize("A", [A_GEN, A_SYM], ids=["general", "symmetric"])
def test_mean_obeys_alpha_prime_equals_V_alpha(rng, A):
    # sum_i w_i Gamma(x_i) = V sum_j (sum_i pi_ij) x_j = V alpha by double stochasticity
    X = rng.normal(size=(80, 2)) + np.array([1.0, -0.5])
    w = _weights(rng, 80)
    V = np.array([[0.4, -0.2], [0.3, 0.1]])
    WO = np.array([[1.0, 0.2], [0.0, 0.7]])
    att = tp.Attention("sinkhorn", A, np.eye(2), V, eps=0.5, W_O=WO)
    v = tp.velocity(att, X, weights=w)
    alpha = w @ X
    np.testing.assert_allclose(w @ v, WO @ V @ alpha, atol=1e-9)
    # along the flow: alpha(t) = expm(t W_O V) alpha(0); RK4 with dt=0.05 on a linear ODE
    # has a global error ~ (|W_O V| dt)^4 ~ 1e-8 at t=1
    traj = tp.simulate(att, X, weights=w, t_max=1.0, dt=0.05)
    assert traj.status == "ok"
    np.testing.assert_allclose(w @ traj.final, scipy.linalg.expm(WO @ V) @ alpha, atol=1e-8)


def test_large_eps_first_order_expansion(rng):
    # k(x_i, x_j) = 1 + (s_ij - s_i. - s_.j + s..)/eps + O(eps^-2) (s_i. row mean, s_.j
    # column mean); for a centred measure s_.j = s.. = 0 and this is the first-order term
    # of softmax with score s/eps, so the two fields differ by O(eps^-2).
    X = rng.normal(size=(60, 2))
    w = _weights(rng, 60)
    X = X - w @ X
    att_sk = lambda e: tp.Attention("sinkhorn", A_GEN, np.eye(2), np.eye(2), eps=e)  # noqa: E731
    att_sm = lambda e: tp.Attention("softmax", A_GEN, np.eye(2), np.eye(2), beta=1 / e)  # noqa: E731
    errs = []
    for e in (40.0, 80.0, 160.0):
        d = tp.velocity(att_sk(e), X, weights=w) - tp.velocity(att_sm(e), X, weights=w)
        errs.append(np.abs(d).max())
    ratios = np.array(errs[:-1]) / np.array(errs[1:])
    # second order: doubling eps divides the gap by 4 (3.6..4.6 allows the O(eps^-3) term,
    # measured 4.4 and 4.2 here)
    assert np.all((ratios > 3.6) & (ratios < 4.6)), ratios
    # and the first-order expansion itself, uncentred measure
    Y = rng.normal(size=(60, 2)) + 1.0
    S = (Y @ A_GEN.T) @ Y.T
    rm, cm, m = S @ w, w @ S, w @ S @ w
    for e in (40.0, 80.0):
        first = Y.T @ w + ((S - rm[:, None] - cm[None, :] + m) * w[None, :]) @ Y / e
        gap = np.abs(tp.velocity(att_sk(e), Y, weights=w) - first).max()
        assert gap < 30.0 / e**2, gap


# ------------------------------------------------------------------ warm starts
@pytest.mark.parametrize("A", [A_GEN, A_SYM], ids=["general", "symmetric"])
def test_warm_and_cold_give_the_same_field(rng, A):
    X = rng.normal(size=(80, 2))
    att = tp.Attention("sinkhorn", A, np.eye(2), 0.5 * np.eye(2))
    ev = FieldEvaluator(att, 80)
    Y = X.copy()
    for k in range(6):                       # walk along the flow, warm-starting each time
        vw = ev(0.1 * k, Y)
        vc = tp.velocity(att, Y)             # fresh evaluator: cold start
        # both at marginal error <= 1e-9: the fields agree to ~1e-9 * max|Vx|
        np.testing.assert_allclose(vw, vc, atol=1e-8)
        Y = Y + 0.1 * vw
    its = ev.info["sinkhorn_iterations"]
    assert len(its) == 6 and max(its[1:]) < its[0]   # warm solves are shorter


def test_warm_start_extrapolates_linearly():
    ws = SinkhornWarmStart()
    assert ws.predict(0.0, 3) == (None, None)
    ws.update(0.0, np.zeros(3), np.zeros(3))
    ws.update(1.0, np.ones(3), 2 * np.ones(3))
    f, g = ws.predict(1.5, 3)
    np.testing.assert_allclose(f, 1.5)
    np.testing.assert_allclose(g, 3.0)
    f, g = ws.predict(1.0, 3)                # repeated time (RK4 middle stages): last value
    np.testing.assert_allclose(g, 2.0)
    assert ws.predict(1.0, 4) == (None, None)   # token count changed: cold start
    # with three times, degree-2 extrapolation is exact on a quadratic in t
    q = lambda t: (1.0 + 2.0 * t - 3.0 * t * t) * np.ones(3)  # noqa: E731
    ws = SinkhornWarmStart(order=2)
    for t in (0.0, 0.5, 0.5, 1.0):                    # repeated time replaces the entry
        ws.update(t, q(t), q(t) + 1.0)
    f, g = ws.predict(1.5, 3)
    np.testing.assert_allclose(f, q(1.5), rtol=1e-14)
    np.testing.assert_allclose(g, q(1.5) + 1.0, rtol=1e-14)
    ws0 = SinkhornWarmStart(order=0)
    ws0.update(0.0, np.zeros(3), np.zeros(3))
    ws0.update(1.0, np.ones(3), np.ones(3))
    np.testing.assert_allclose(ws0.predict(1.5, 3)[1], 1.0)
    with pytest.raises(ValueError, match="order"):
        SinkhornWarmStart(order=-1)


def test_warm_start_per_stage_increments_are_exact_on_polynomials():
    # stage i of step m holds P_i(t_m) with cubic P_i: every per-stage increment is a cubic
    # in the stage time t_m + c_i h, so degree 3 predicts exactly once 4 increments are
    # known, and the back-test picks degree 3 once a fifth shows that it predicted the
    # latest exactly (rtol 1e-10: Lagrange weights of size ~10 on values of size ~10)
    c = (0.0, 0.5, 0.5, 1.0)
    h = 0.1
    coef = np.array([[1.0, -2.0, 0.5, 3.0], [0.3, 1.0, -1.0, 2.0],
                     [-0.7, 0.2, 4.0, -1.0], [2.0, 0.0, -3.0, 1.5]])

    def P(i, t):
        return np.polyval(coef[i], t) * np.arange(1.0, 4.0)

    for order in (3, 5):
        ws = SinkhornWarmStart(stage_order=order)
        for m in range(7):
            for i in range(4):
                t = m * h + c[i] * h
                if m >= 6:
                    f, g = ws.predict(t, 3, stage=i)
                    np.testing.assert_allclose(g, P(i, 0.1 * m), rtol=1e-10)
                    np.testing.assert_allclose(f, -P(i, 0.1 * m), rtol=1e-10)
                ws.update(t, -P(i, 0.1 * m), P(i, 0.1 * m), stage=i)
    ws = SinkhornWarmStart(stage_order=3)
    for m in range(6):
        for i in range(4):
            t = m * h + c[i] * h
            if m >= 5 and i > 0:
                f, g = ws.predict(t, 3, stage=i)
                np.testing.assert_allclose(g, P(i, 0.1 * m), rtol=1e-10)
                np.testing.assert_allclose(f, -P(i, 0.1 * m), rtol=1e-10)
            ws.update(t, -P(i, 0.1 * m), P(i, 0.1 * m), stage=i)
    # the stage-less prediction mixes stages: it is not exact here
    assert not np.allclose(ws.predict(0.65, 3)[1], P(1, 0.6))
    ws.clear()
    assert ws.predict(0.0, 3, stage=0) == (None, None)
    with pytest.raises(ValueError, match="stage_order"):
        SinkhornWarmStart(stage_order=-1)


def test_per_stage_warm_start_matches_cold_and_saves_iterations(rng):
    # simulate passes the RK4 stage index: same trajectory as cold solves (every solve
    # reaches marginal error 1e-9, so the fields agree to ~1e-9 |Vx| and 8 RK4 steps of
    # a Lipschitz-1 flow keep the states within 1e-7), and fewer iterations than the
    # stage-less warm start (measured about 4 vs 5.5 per evaluation after step 3)
    from transformer_pde.fields import FieldEvaluator
    from transformer_pde.integrate import RK4
    X = rng.normal(size=(150, 2))
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), 0.5 * np.eye(2))
    traj = tp.simulate(att, X, t_max=0.8, dt=0.1)
    assert traj.status == "ok"
    runs = {}
    for mode in ("cold", "stageless"):
        ev = FieldEvaluator(att, 150)

        def field(t, y, ev=ev, mode=mode):
            if mode == "cold":
                ev.state.clear()
            return ev(t, y)

        y, t = X.copy(), 0.0
        for _ in range(8):
            y = RK4().step(field, t, y, 0.1)
            t += 0.1
        runs[mode] = (y, ev.info["sinkhorn_iterations"])
    np.testing.assert_allclose(traj.states[-1], runs["cold"][0], atol=1e-7)
    new = traj.info["sinkhorn_iterations"]
    assert len(new) == len(runs["stageless"][1]) == 32
    # compare after the start-up steps (the first step of both is the same)
    assert sum(new[12:]) < 0.85 * sum(runs["stageless"][1][12:])


def test_simulate_reports_iterations(rng):
    X = rng.normal(size=(60, 2))
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), 0.5 * np.eye(2))
    traj = tp.simulate(att, X, t_max=0.5, dt=0.1)
    assert traj.status == "ok"
    its = traj.info["sinkhorn_iterations"]
    assert len(its) == 4 * 5 and len(traj.info["sinkhorn_times"]) == 20   # RK4: 4 per step
    s = sinkhorn_summary(traj.info)
    assert s["evaluations"] == 20 and s["per_step_mean"] == pytest.approx(sum(its) / 5)
    assert s["per_step"] == [sum(its[4 * k:4 * k + 4]) for k in range(5)]
    assert sinkhorn_summary({}) == {"evaluations": 0}


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


# ------------------------------------------------------------------ other backends
def test_numba_backend_matches_numpy(rng):
    try:
        get_backend("numba")
    except BackendNotAvailable:
        pytest.skip("numba not installed")
    X = rng.normal(size=(300, 2))
    for A in (A_GEN, A_SYM):
        att = tp.Attention("sinkhorn", A, np.eye(2), np.eye(2))
        # both backends solve to marginal error 1e-9 (reduction orders differ)
        np.testing.assert_allclose(tp.velocity(att, X, backend="numba"),
                                   tp.velocity(att, X), atol=1e-8)


def test_mean_field_limit_matches_gaussian_affine_field():
    # Independent reference: for mu = N(alpha, S) the Sinkhorn field is affine, M x + b
    # (docs/conventions.md; transformer_pde.gaussian.affine_field).  N = 1000 samples whitened to the exact
    # mean and covariance; the empirical potentials converge like N^{-1/2}: measured max
    # errors 0.021 / 0.009 / 0.0045 at N = 500 / 2000 / 8000, so 0.045 at N = 1000 is a
    # 3x margin for the sampling noise (seeds 5-8: 0.009-0.023) while a wrong coupling
    # (softmax with score/eps is off by 0.4-0.6 here) fails.
    from transformer_pde.gaussian import affine_field
    rng = np.random.default_rng(5)
    alpha = np.array([0.5, -0.3])
    S = np.array([[0.8, 0.3], [0.3, 0.5]])
    L = np.linalg.cholesky(S)
    V = np.array([[0.5, -0.5], [0.5, 0.2]])
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), V, eps=0.7)
    Z = rng.normal(size=(1000, 2))
    Z -= Z.mean(axis=0)
    Z = Z @ np.linalg.inv(np.linalg.cholesky(np.cov(Z.T, bias=True))).T
    X = alpha + Z @ L.T
    Y = alpha + 0.8 * rng.normal(size=(10, 2)) @ L.T
    M, b = affine_field(att, alpha, S)
    v = tp.velocity(att, X, queries=Y)
    assert np.abs(v - (Y @ M.T + b)).max() < 0.045
    soft = tp.velocity(tp.Attention("softmax", A_GEN, np.eye(2), V, beta=1 / 0.7), X, queries=Y)
    assert np.abs(soft - (Y @ M.T + b)).max() > 0.1     # the test can tell the kinds apart


@settings(max_examples=25, deadline=None)
@given(attention_problems(kinds=["sinkhorn"], heads=None, weighted=None))
def test_property_mean_equation_any_measure(problem):
    # alpha' = V alpha for every measure, any dimension / heads / rank-deficient Q, K,
    # weights (zero weights included): a consequence of double stochasticity per head.
    att, m = problem
    v = tp.velocity(att, m.X, **m.kwargs)
    assert np.all(np.isfinite(v))
    P = att.at(0.0)
    Vfull = np.zeros((att.d, att.d))
    for head in P.heads:
        Vfull[head.rows] = head.V
    lhs = m.w @ v
    rhs = Vfull @ (m.w @ m.X)
    if P.W_O is not None:
        rhs = P.W_O @ rhs
    # marginal log-errors <= 1e-9 move each weight sum by a relative 1e-9
    scale = 1.0 + np.abs(Vfull).sum() * np.abs(m.X).max()
    np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-8 * scale)


# ------------------------------------------------------------------ fused sweep, warm runs
def _numba():
    try:
        return get_backend("numba")
    except BackendNotAvailable:
        pytest.skip("numba not installed")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fused_sweep_is_the_alternating_iteration(rng, dtype):
    # the Numba backend does a whole iteration in one pass (column update from the plan's
    # column sums); same potentials and field as the NumPy backend's two log-domain
    # passes, to rounding (float64: 1e-12; float32: its own rounding floor, 1e-4)
    from transformer_pde.sinkhorn import FusedSweep
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
    from transformer_pde.sinkhorn import FusedSweep, ScoreSoftMin
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


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_warm_started_run_matches_cold_tight_solves_along_the_trajectory(rng, backend):
    # what simulate does (per-stage prediction, reused secants, fused sweeps on numba),
    # evaluation by evaluation: every field equals the field of a cold solve to marginal
    # error 1e-13 at the same state within 1e-9 * max|V x| (tolerance 1e-9: the returned
    # pair has exact rows and column log-error < 1e-9; the field moves by at most about
    # that error times the spread of the values, measured up to 1.5e-10 * max|V x| here)
    from transformer_pde.fields import FieldEvaluator
    from transformer_pde.integrate import RK4
    if backend == "numba":
        _numba()
    X = rng.normal(size=(200, 2))
    V = np.array([[0.5, -0.5], [0.5, 0.2]])
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), V)
    ev = FieldEvaluator(att, 200, backend=backend, sinkhorn_tol=1e-9)
    seen = []

    def field(t, y):
        v = ev(t, y)
        seen.append((t, np.array(y), np.array(v)))
        ev.stage += 1
        return v

    y, t = X.copy(), 0.0
    for _ in range(10):
        ev.stage = 0
        y = RK4().step(field, t, y, 0.1)
        t += 0.1
    its = ev.info["sinkhorn_iterations"]
    assert len(seen) == 40 and np.mean(its[24:]) < 5    # warm: a few iterations each
    for t_k, y_k, v_k in seen[::3]:
        cold = tp.velocity(att, y_k, t=t_k, sinkhorn_tol=1e-13)
        scale = np.abs(y_k @ V.T).max()
        np.testing.assert_allclose(v_k, cold, atol=1e-9 * scale)


def test_fused_sweep_does_not_depend_on_the_threads(rng):
    from transformer_pde.backends.numba_backend import NumbaBackend
    from transformer_pde.sinkhorn_kernels import fused_sweep
    _numba()
    X = rng.normal(size=(400, 2))
    bias = rng.normal(size=400) * 0.1 - np.log(400)
    w = np.full(400, 1 / 400)
    one = fused_sweep(NumbaBackend(n_threads=1), X @ A_GEN.T, X, X, bias, w)
    all_ = fused_sweep(NumbaBackend(), X @ A_GEN.T, X, X, bias, w)
    for a, b in zip(one, all_, strict=True):
        np.testing.assert_array_equal(a, b)
    ref_out, ref_lse = NP.softmax(X @ A_GEN.T, X, X, bias, None)
    np.testing.assert_allclose(one[0], ref_out, atol=1e-14)
    np.testing.assert_allclose(one[1], ref_lse, atol=1e-13)
    logits = (X @ A_GEN.T) @ X.T + bias
    np.testing.assert_allclose(one[2], (w[:, None] * np.exp(logits - ref_lse[:, None])).sum(0),
                               rtol=1e-13)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_g_next_is_closer_than_the_verified_iterate(symmetric, backend):
    # g_next (what the warm start remembers) is the accelerated step after the converged
    # iterate: its marginal error, measured here by one more Sinkhorn iteration, is below
    # the reported one, and the verified (f, g) and their error are what the solve returns
    from transformer_pde.sinkhorn import ScoreSoftMin

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


def test_fused_sweep_is_lean_except_near_the_end(monkeypatch):
    import transformer_pde.sinkhorn_kernels as kernels

    qx, kx, vx, logw, eps = _lean_problem(False)
    seen = []
    orig = kernels.fused_sweep

    def spy(be, q, k, v, bias, w):
        seen.append(v is not None)
        return orig(be, q, k, v, bias, w)

    monkeypatch.setattr(kernels, "fused_sweep", spy)
    be = get_backend("numba")
    res = sinkhorn_potentials(be, qx, kx, logw, eps, values=vx, eps_scaling=False)
    assert res.converged and len(seen) == res.n_iter >= 4
    assert seen[-1] and sum(seen) <= 3 and not any(seen[:res.n_iter - 3])
    ref = NP.softmax(qx * (1.0 / eps), kx, vx, logw + res.g * (1.0 / eps), None)[0]
    np.testing.assert_allclose(res.out, ref, rtol=0, atol=1e-13)


def _dense_sweep(q, k, v, bias, w):
    """fused_sweep's (out, lse, col) from the dense logits (float64, scipy's logsumexp)."""
    from scipy.special import logsumexp

    L = q.astype(float) @ k.astype(float).T + bias.astype(float)
    lse = logsumexp(L, axis=1)
    P = np.exp(L - lse[:, None])
    out = P @ v.astype(float) if v is not None else None
    return out, lse, w @ P


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("r,c", [(1, 0), (2, 2), (3, 1), (4, 4), (2, 5), (5, 2)])
def test_fused_sweep_kernel_against_dense_logits(monkeypatch, dtype, r, c, one_pass):
    # one-pass rows (r, c <= 4 and from ONE_PASS_MIN_PAIRS pairs: exponentials against a
    # Cauchy-Schwarz bound of the row's logits) and the general rows, including rows whose
    # bound is so far above their largest logit that they are redone against the maximum
    # (scaled rows below); float64 to 1e-13 (the sums of 500 terms round at 1e-16 each),
    # float32 to 2e-5
    import transformer_pde.sinkhorn_kernels as kernels
    from transformer_pde.sinkhorn_kernels import fused_sweep

    monkeypatch.setattr(kernels, "ONE_PASS_MIN_PAIRS", 0 if one_pass else 2**62)
    nb = _numba()
    rng = np.random.default_rng(r * 10 + c)
    n, m = 500, 300
    k = rng.normal(size=(n, r))
    q = rng.normal(size=(m, r))
    q[::7] *= 600.0 if dtype == np.float64 else 40.0   # far rows: the bound overshoots
    bias = rng.normal(size=n) - np.log(n)
    v = rng.normal(size=(n, c)) if c else None
    w = rng.uniform(0.5, 1.5, size=m) / m
    q, k, bias = q.astype(dtype), k.astype(dtype), bias.astype(dtype)
    v = None if v is None else v.astype(dtype)
    out, lse, col = fused_sweep(nb, q, k, v, bias, w)
    ref_out, ref_lse, ref_col = _dense_sweep(q, k, v, bias, w)
    if one_pass and r <= 4 and c <= 4:
        # some rows are redone against their maximum (their bound overshoots by more than
        # the kept range), the others are not
        bound = bias.max() + np.linalg.norm(q.astype(float), axis=1) * np.linalg.norm(
            k.astype(float), axis=1).max()
        gap = bound - (q.astype(float) @ k.astype(float).T + bias).max(axis=1)
        far = np.exp(-gap) < kernels._TINY_SUM[np.dtype(dtype)]
        assert 0 < far.sum() < m // 2
    tol = 1e-13 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=tol, atol=tol)
    np.testing.assert_allclose(col, ref_col, rtol=tol * 10, atol=0)
    if c:
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol * np.abs(v).max() * 10)
    else:
        assert out.shape == (m, 0)


@pytest.mark.parametrize("partners", [True, False])
def test_stage_prediction_uses_a_partner_stage_with_alike_increments(monkeypatch, partners):
    # stage 1's increments are stage 0's (irregular: no extrapolation predicts them) plus
    # a linear drift: stage 0's latest increment plus the extrapolated difference predicts
    # stage 1 exactly, which extrapolating stage 1's own increments cannot.  Partners are
    # tried from PARTNER_MIN_PAIRS pairs on (6 tokens here: only with the threshold at 0)
    import transformer_pde.sinkhorn as sk

    if partners:
        monkeypatch.setattr(sk, "PARTNER_MIN_PAIRS", 0)
    rng = np.random.default_rng(8)
    v, w = rng.normal(size=6), rng.normal(size=6)
    r = rng.normal(size=12)
    state = SinkhornWarmStart()
    g = np.zeros(6)
    for m in range(12):
        t = 0.1 * m
        g = g + r[m] * v
        state.update(t, g, g, stage=0)
        want = g + r[m] * v + (1.0 + 0.3 * m) * w
        if m >= 5:
            f_hat, g_hat = state.predict(t + 0.05, 6, stage=1)
            assert f_hat is g_hat
            if partners:
                np.testing.assert_allclose(g_hat, want, rtol=0, atol=1e-12)
            else:
                assert np.abs(g_hat - want).max() > 1e-3
        g = want
        state.update(t + 0.05, g, g, stage=1)


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
