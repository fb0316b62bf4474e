"""Sinkhorn attention fields: the field, warm starts along a flow, backends, the record.

References used: the dense coupling, the first-order expansion in 1/eps, the exact mean
equation alpha' = V alpha (docs/conventions.md), the Gaussian mean-field limit and the
NumPy backend as reference for the Numba backend.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde.backends import BackendNotAvailable, get_backend
from transformer_pde.fields import FieldEvaluator
from transformer_pde.sinkhorn import (
    SinkhornRecord,
    SinkhornWarmStart,
    sinkhorn_coupling,
    sinkhorn_summary,
)
from transformer_pde.testing import attention_problems

from sinkhorn_cases import A_GEN, A_SYM
from sinkhorn_cases import numba_backend as _numba
from sinkhorn_cases import weights as _weights


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
    assert traj.info["sinkhorn_stages"] == [0, 1, 2, 3] * 5
    assert sinkhorn_summary({}) == {"evaluations": 0}


def test_summary_splits_steps_by_the_recorded_stages(rng):
    # per_step is reported when every step made the same sequence of stages (a
    # fixed-step method); an adaptive run records no stage, so only the mean per step.
    # The decision reads the record, never the solver's name.
    X = rng.normal(size=(40, 2))
    att = tp.Attention("sinkhorn", A_GEN, np.eye(2), 0.5 * np.eye(2), heads=1)
    traj = tp.simulate(att, X, t_max=0.3, dt=0.1, solver="dopri5")
    info = traj.info
    assert traj.status == "ok" and set(info["sinkhorn_stages"]) == {None}
    s = sinkhorn_summary(info)
    assert "per_step" not in s
    assert s["per_step_mean"] == pytest.approx(sum(info["sinkhorn_iterations"]) / info["n_steps"])
    two = {"n_steps": 2, "sinkhorn_iterations": [3, 4, 5, 6], "sinkhorn_stages": [0, 1, 0, 1],
           "method": "dopri5"}
    assert sinkhorn_summary(two)["per_step"] == [7, 11]
    for stages in ([0, 1, 2, 0], [0, 1, 0, None], [1, 0, 1, 0], [0, 1, 0]):
        assert "per_step" not in sinkhorn_summary({**two, "sinkhorn_stages": stages}), stages
    assert "per_step" not in sinkhorn_summary({k: v for k, v in two.items()
                                               if k != "sinkhorn_stages"})


def test_record_round_trips_through_info():
    rec = SinkhornRecord()
    assert rec.as_info() == {} and SinkhornRecord.from_info({}) == rec
    rec = SinkhornRecord([5, 3], [0.0, 0.1], [0, None])
    info = rec.as_info()
    assert info == {"sinkhorn_iterations": [5, 3], "sinkhorn_times": [0.0, 0.1],
                    "sinkhorn_stages": [0, None]}
    info["sinkhorn_iterations"].append(9)        # a copy: the record is unchanged
    assert rec.iterations == [5, 3]
    assert SinkhornRecord.from_info(rec.as_info()) == rec
    with pytest.raises(ValueError, match="length"):
        SinkhornRecord.from_info({**rec.as_info(), "sinkhorn_stages": [0]})
    with pytest.raises(ValueError, match="keys"):
        SinkhornRecord.from_info({"sinkhorn_iterations": [1], "sinkhorn_times": [0.0]})


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


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_warm_started_run_matches_cold_tight_solves_along_the_trajectory(rng, backend):
    # what simulate does (per-stage prediction, reused secants, fused sweeps on numba),
    # evaluation by evaluation: every field equals the field of a cold solve to marginal
    # error 1e-13 at the same state within 1e-9 * max|V x| (tolerance 1e-9: the returned
    # pair has exact rows and column log-error < 1e-9; the field moves by at most about
    # that error times the spread of the values, measured up to 1.5e-10 * max|V x| here)
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


@pytest.mark.parametrize("partners", [True, False])
def test_stage_prediction_uses_a_partner_stage_with_alike_increments(monkeypatch, partners):
    # stage 1's increments are stage 0's (irregular: no extrapolation predicts them) plus
    # a linear drift: stage 0's latest increment plus the extrapolated difference predicts
    # stage 1 exactly, which extrapolating stage 1's own increments cannot.  Partners are
    # tried from PARTNER_MIN_PAIRS pairs on (6 tokens here: only with the threshold at 0)
    import transformer_pde.sinkhorn.warmstart as sk

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



# ------------------------------------------------------------------ wrong arguments
_RECORD = {"n_steps": 2, "sinkhorn_iterations": [3, 4, 5, 6], "sinkhorn_stages": [0, 1, 0, 1],
           "sinkhorn_times": [0.0, 0.05, 0.1, 0.15]}


@pytest.mark.parametrize("info, error, words", [
    (None, TypeError, "info must be a mapping"),
    ("sinkhorn_iterations", TypeError, "info must be a mapping"),
    ([("n_steps", 1)], TypeError, "info must be a mapping"),
    (np.arange(3), TypeError, "info must be a mapping"),
    ({"sinkhorn_iterations": None}, TypeError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": "345"}, TypeError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": 7}, TypeError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": [[1, 2], [3, 4]]}, TypeError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": np.array([3, -4])}, ValueError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": [3, True]}, TypeError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": [1.5, 2]}, ValueError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": [3, -1]}, ValueError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": [3, float("nan")]}, ValueError, "info['sinkhorn_iterations']"),
    ({"sinkhorn_iterations": [3, 1j]}, TypeError, "info['sinkhorn_iterations']"),
    ({**_RECORD, "n_steps": -2}, ValueError, "info['n_steps']"),
    ({**_RECORD, "n_steps": 1.5}, ValueError, "info['n_steps']"),
    ({**_RECORD, "n_steps": "2"}, TypeError, "info['n_steps']"),
    ({**_RECORD, "n_steps": True}, TypeError, "info['n_steps']"),
    ({**_RECORD, "sinkhorn_stages": 4}, TypeError, "info['sinkhorn_stages']"),
    ({**_RECORD, "sinkhorn_stages": [0, 1, 0, 1.5]}, ValueError, "info['sinkhorn_stages']"),
    ({**_RECORD, "sinkhorn_stages": [0, 1, 0, "1"]}, TypeError, "info['sinkhorn_stages']"),
])
def test_summary_of_a_wrong_argument_names_it(info, error, words):
    with pytest.raises(error, match=re.escape(words)):
        sinkhorn_summary(info)


def test_summary_of_a_trajectory_says_to_pass_its_info(rng):
    traj = tp.simulate(tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2)),
                       rng.normal(size=(5, 2)), t_max=0.1, dt=0.1)
    with pytest.raises(TypeError, match=r"Trajectory.*\.info"):
        sinkhorn_summary(traj)


@pytest.mark.parametrize("info, error, words", [
    (None, TypeError, "info must be a mapping"),
    ([], TypeError, "info must be a mapping"),
    ({**_RECORD, "sinkhorn_iterations": [1.5, 2, 3, 4]}, ValueError, "sinkhorn_iterations"),
    ({k: v for k, v in _RECORD.items() if k != "n_steps"} | {"sinkhorn_stages": [0, 1, 0, -1]},
     ValueError, "sinkhorn_stages"),
    ({k: v for k, v in _RECORD.items() if k != "n_steps"} | {"sinkhorn_times": [0, 1, 2, None]},
     TypeError, "sinkhorn_times"),
])
def test_record_from_a_wrong_info_names_it(info, error, words):
    with pytest.raises(error, match=re.escape(words)):
        SinkhornRecord.from_info(info)


@settings(max_examples=60)
@given(st.dictionaries(st.sampled_from(["n_steps", "sinkhorn_iterations", "sinkhorn_stages",
                                        "sinkhorn_times", "method"]),
                       st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 9),
                                              st.floats(allow_nan=True), st.text(max_size=3)),
                                    lambda inner: st.lists(inner, max_size=4), max_leaves=8)))
def test_summary_answers_or_names_the_entry(info):
    """Whatever an info mapping holds, the summary is computed from integer counts or a
    TypeError/ValueError names the entry; never another error, never a truncated count."""
    try:
        s = sinkhorn_summary(info)
    except (TypeError, ValueError) as exc:
        assert "info[" in str(exc), exc
        return
    its = info.get("sinkhorn_iterations", [])
    assert s["evaluations"] == len(its)
    if its:  # every count was an integer (2.0 counts as 2), none truncated
        assert all(float(i).is_integer() and i >= 0 for i in its), its
        assert s["total"] == sum(its)


@pytest.mark.parametrize("count", [2 ** 63, 9.223372036854776e18, 1e300])
def test_summary_refuses_counts_beyond_int64(count):
    """An integer-valued count past the int64 range the summary sums in is refused by
    name (it was an OverflowError from NumPy)."""
    with pytest.raises(ValueError, match=re.escape("info['sinkhorn_iterations'][0]")):
        sinkhorn_summary({"sinkhorn_iterations": [count]})
