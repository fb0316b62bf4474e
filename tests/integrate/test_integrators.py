"""Orders of convergence and invariants of the fixed-step integrators (issue 9)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import solve_ivp

import transformer_pde as tp
from transformer_pde.testing import references
from transformer_pde.integrate.solvers import (SOLVERS, AdamsBashforth, ImplicitMidpoint,
                                              SolverNotConverged, adams_bashforth_weights,
                                              get_solver)


def _problem():
    rng = np.random.default_rng(3)
    d, n = 2, 6
    Q = rng.normal(size=(d, d)) * 0.8
    K = rng.normal(size=(d, d)) * 0.8
    V = rng.normal(size=(d, d)) * 0.6
    att = tp.Attention("softmax", Q, K, V)
    X0 = rng.normal(size=(n, d))
    return att, X0


T_END = 1.05  # not a multiple of the steps below: the last step is a partial one


@pytest.fixture(scope="module")
def reference():
    att, X0 = _problem()
    sol = solve_ivp(lambda t, y: references.velocity(att, y.reshape(X0.shape)).ravel(),
                    (0.0, T_END), X0.ravel(), method="DOP853", rtol=1e-13, atol=1e-14)
    assert sol.success
    return att, X0, sol.y[:, -1].reshape(X0.shape)


def observed_order(errors, dts):
    """Least-squares slope of log(error) against log(dt)."""
    return float(np.polyfit(np.log(dts), np.log(errors), 1)[0])


# step sizes chosen so that every error lies in the asymptotic range yet stays
# >= 1e-11, far above the DOP853 reference error (~1e-13)
CASES = [
    ("euler", 1, [0.1, 0.05, 0.025, 0.0125]),
    ("heun", 2, [0.1, 0.05, 0.025, 0.0125]),
    ("ab2", 2, [0.1, 0.05, 0.025, 0.0125]),
    ("ab3", 3, [0.1, 0.05, 0.025, 0.0125]),
    ("implicit_midpoint", 2, [0.1, 0.05, 0.025, 0.0125]),
    ("rk4", 4, [0.15, 0.075, 0.0375]),
]


@pytest.mark.parametrize("method,order,dts", CASES)
def test_observed_order(reference, method, order, dts):
    att, X0, ref = reference
    errs = []
    for dt in dts:
        tr = tp.simulate(att, X0, t_max=T_END, dt=dt, solver=method,
                         saveat=tp.SaveAt(every=10_000))
        assert tr.status == "ok"
        assert tr.t_final == pytest.approx(T_END)
        errs.append(np.abs(tr.final - ref).max())
    assert min(errs) > 1e-11
    # tolerance +-0.3 on the fitted slope, as required by issue 9
    assert abs(observed_order(errs, dts) - order) < 0.3, (method, errs)


def test_registry_and_attributes():
    for name, order in [("heun", 2), ("rk2", 2), ("ab2", 2), ("ab3", 3),
                        ("implicit_midpoint", 2)]:
        s = get_solver(name)
        assert s.order == order and not s.adaptive
        assert name in SOLVERS
    assert get_solver("ab3").multistep
    with pytest.raises(ValueError, match="solver must be one of"):
        get_solver("ab9")
    with pytest.raises(ValueError, match="k must"):
        AdamsBashforth(0)
    with pytest.raises(ValueError, match="tol"):
        ImplicitMidpoint(tol=-1.0)
    with pytest.raises(ValueError, match="max_iter"):
        ImplicitMidpoint(max_iter=0)
    with pytest.raises(ValueError, match="steps"):
        adams_bashforth_weights([1.0, -1.0])


def test_ab_classical_weights():
    np.testing.assert_allclose(adams_bashforth_weights([1, 1]), [1.5, -0.5], atol=1e-15)
    np.testing.assert_allclose(adams_bashforth_weights([0.1, 0.1, 0.1]) * 12, [23, -16, 5],
                               atol=1e-12)
    # variable-step AB2: 1 + r/2, -r/2 with r = h_n / h_{n-1}
    np.testing.assert_allclose(adams_bashforth_weights([0.5, 1.0]), [1.25, -0.25], atol=1e-15)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.01, 0.3), min_size=6, max_size=12), st.sampled_from([2, 3]))
def test_ab_exact_on_polynomials_with_variable_steps(steps, k):
    # y' = p(t) with deg p = k - 1 is integrated exactly by AB_k for any step sequence
    # (after the RK4 start, itself exact for such p); tolerance: rounding only.
    c = np.array([0.7, -1.3, 0.4])[:k]
    p = np.polynomial.Polynomial(c)
    P = p.integ()
    solver = AdamsBashforth(k)
    solver.reset()
    t, y = 0.0, np.zeros(1)
    for h in steps:
        y = solver.step(lambda s, z: np.array([p(s)]), t, y, h)
        t += h
    assert abs(y[0] - (P(t) - P(0.0))) < 1e-12 * max(1.0, abs(P(t)))


def test_ab_restarts_on_time_jump():
    s = AdamsBashforth(2)
    f = lambda t, y: -y  # noqa: E731
    y1 = s.step(f, 0.0, np.ones(1), 0.1)
    # a step that does not continue the previous one must not use stale history:
    # it restarts with RK4, so it equals a fresh solver's first step
    a = s.step(f, 5.0, y1, 0.1)
    b = AdamsBashforth(2).step(f, 5.0, y1, 0.1)
    assert np.array_equal(a, b)


def test_implicit_midpoint_conserves_quadratic_invariant():
    # y' = S y with S skew-symmetric: |y| is a quadratic first integral.  Implicit midpoint
    # keeps it to the fixed-point tolerance (1e-13 relative per step); RK4 drifts.
    S = np.array([[0.0, 2.0, -1.0], [-2.0, 0.0, 0.5], [1.0, -0.5, 0.0]])
    f = lambda t, y: y @ S.T  # noqa: E731
    y0 = np.array([[1.0, 0.2, -0.3]])
    r0 = np.linalg.norm(y0)
    im, rk = ImplicitMidpoint(), get_solver("rk4")
    a = b = y0
    for i in range(200):
        a = im.step(f, 0.1 * i, a, 0.1)
        b = rk.step(f, 0.1 * i, b, 0.1)
    assert abs(np.linalg.norm(a) - r0) < 1e-11
    assert abs(np.linalg.norm(b) - r0) > 1e-6   # the explicit method does drift


def test_implicit_midpoint_failure_is_reported():
    # h L / 2 = 25 > 1: the fixed-point iteration diverges; simulate stops cleanly
    att = tp.Attention("linear", np.eye(1), np.eye(1), -50.0 * np.eye(1))
    with pytest.raises(SolverNotConverged, match="reduce dt"):
        ImplicitMidpoint().step(lambda t, y: -50.0 * y, 0.0, np.ones((1, 1)), 1.0)
    X0 = np.array([[1.0], [2.0]])
    tr = tp.simulate(att, X0, t_max=2.0, dt=1.0, solver="implicit_midpoint")
    assert tr.status == "failed" and "implicit midpoint" in tr.message
    assert tr.states.shape[0] == 1   # only the initial state was computed


@pytest.mark.parametrize("method,order", [("ab2", 2), ("ab3", 3)])
def test_multistep_restarts_at_layer_boundaries(method, order):
    # per-layer V (Layers, layer_time 0.5): the field jumps at t = 0.5.  The history is
    # restarted there, so the order is kept (interpolating across the jump would lose
    # one order).  Reference: DOP853 on each layer interval separately.
    att0, X0 = _problem()
    P = att0.at(0.0).heads[0]
    Vs = np.stack([P.V, -0.7 * P.V.T])
    att = tp.Attention("softmax", P.Q, P.K, tp.Layers(Vs, layer_time=0.5))
    y = X0.ravel()
    for ell, (a, b) in enumerate([(0.0, 0.5), (0.5, T_END)]):
        layer = tp.Attention("softmax", P.Q, P.K, Vs[ell])
        y = solve_ivp(lambda t, z, layer=layer: references.velocity(layer, z.reshape(X0.shape)).ravel(),
                      (a, b), y, method="DOP853", rtol=1e-13, atol=1e-14).y[:, -1]
    ref = y.reshape(X0.shape)
    dts = [0.1, 0.05, 0.025, 0.0125]
    errs = [np.abs(tp.simulate(att, X0, t_max=T_END, dt=dt, solver=method).final - ref).max()
            for dt in dts]
    assert abs(observed_order(errs, dts) - order) < 0.3, errs


# ------------------------------------------------------------------ the one RK stepper
def _field(t, y):
    return np.sin(y) * (1.0 + t) - 0.3 * y[::-1]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tableau_stepper_is_the_classical_formulas_bit_for_bit(dtype):
    from transformer_pde.integrate import CLASSICAL_RK4, EULER, HEUN, rk_step
    y = np.linspace(-1.0, 2.0, 12).reshape(6, 2).astype(dtype)
    t, h = 0.3, 0.1
    f = _field
    k1 = f(t, y)
    k2 = f(t + 0.5 * h, y + (0.5 * h) * k1)
    k3 = f(t + 0.5 * h, y + (0.5 * h) * k2)
    k4 = f(t + h, y + h * k3)
    rk4 = y + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
    heun = y + (0.5 * h) * (k1 + f(t + h, y + h * k1))
    for tab, want in ((CLASSICAL_RK4, rk4), (HEUN, heun), (EULER, y + h * k1)):
        got = rk_step(tab, f, t, y, h)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)


def test_embedded_steps_match_scipy():
    # test-only use of scipy's private single-step helpers: same tableau, same error norm
    from scipy.integrate._ivp import rk as srk
    from transformer_pde.integrate import DOP853, DOPRI5, rk_attempt
    y = np.linspace(-1.0, 2.0, 8)
    t, h, rtol, atol = 0.2, 0.05, 1e-6, 1e-9
    fun = lambda tt, yy: _field(tt, yy.reshape(4, 2)).ravel()  # noqa: E731
    for tab, cls in ((DOPRI5, srk.RK45), (DOP853, srk.DOP853)):
        y_new, err, f_new = rk_attempt(tab, fun, t, y, h, fun(t, y), rtol, atol)
        K = np.empty((cls.n_stages + 1, y.size))
        y_ref, f_ref = srk.rk_step(fun, t, y, fun(t, y), h, cls.A, cls.B, cls.C, K)
        np.testing.assert_allclose(y_new, y_ref, rtol=1e-15, atol=1e-15)
        np.testing.assert_array_equal(f_new, fun(t + h, y_new))
        solver = cls.__new__(cls)       # only the attributes _estimate_error_norm reads
        solver.K, solver.n = K, y.size
        if cls is srk.RK45:
            solver.E = cls.E
        scale = atol + rtol * np.maximum(np.abs(y), np.abs(y_ref))
        ref = solver._estimate_error_norm(K, h, scale) if cls is srk.DOP853 else \
            np.linalg.norm(K.T @ cls.E * h / scale) / np.sqrt(y.size)
        assert err == pytest.approx(ref, rel=1e-10)


def test_controller_and_initial_step():
    from transformer_pde.integrate import PIController, clip_step, get_solver, initial_step
    c5 = get_solver("dopri5").controller()
    assert (c5.alpha, c5.beta) == pytest.approx((0.7 / 5, 0.4 / 5))      # error order 4
    c8 = get_solver("dop853").controller()
    assert (c8.alpha, c8.beta) == pytest.approx((0.7 / 8, 0.4 / 8))      # error order 7
    ctrl = PIController(4)
    assert ctrl.factor(np.inf, False) == 0.2 and ctrl.factor(1e-20, True) == 5.0
    assert ctrl.factor(4.0, False) < 1.0
    tabs = [tp.Layers(np.zeros((3, 1, 1)), layer_time=0.5)]
    assert clip_step(0.2, 1.0, 2.0, tabs) == pytest.approx(0.3)         # next jump at 0.5
    assert clip_step(0.2, 1.0, 0.4, tabs) == pytest.approx(0.2)         # the stop first
    assert clip_step(1.2, 1.0, 2.0, tabs) == pytest.approx(0.8)         # no jump after 1.0
    y = np.array([[1.0, 2.0], [0.0, 0.0]])
    f0 = np.array([[0.5, 0.5], [1.0, 1.0]])
    h = initial_step(y, f0, 1e-6, 1e-9)
    d0 = np.sqrt(np.mean((y[0] / (1e-9 + 1e-6 * np.abs(y[0]))) ** 2))
    d1 = np.sqrt(np.mean((f0[0] / (1e-9 + 1e-6 * np.abs(y[0]))) ** 2))
    assert h[0] == pytest.approx(min(0.1, 0.01 * d0 / d1)) and h[1] == 1e-6
