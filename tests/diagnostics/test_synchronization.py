"""Synchronisation on the circle: the criterion, the equilibria and their spectra.

References: closed forms (order parameter of a regular polygon, gaps of constructed
states, the triangle's eigenvalue e^{-beta/2}(1/2 + 3 beta/4)), the Jacobian of the
library's own velocity field by central finite differences (an independent computation
of the linearisation), and SciPy's DOP853 on the angle ODE (an independent integrator).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import transformer_pde as tp
from transformer_pde.diagnostics.synchronization import (
    EQUILIBRIUM, SYNCHRONISED, UNDECIDED, circle_angles, circle_clusters,
    circle_initial_states, equilibrium_spectrum, largest_gap, order_parameter,
    polygon_spectrum, synchronization_runs)
from transformer_pde.errors import ArgumentError, ArgumentTypeError


def circle(theta):
    theta = np.asarray(theta, dtype=float)
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def angular_velocity(theta, beta, kind, weights=None):
    """theta_i' from the library's velocity field: the tangent component of Gamma."""
    X = circle(theta)
    att = tp.Attention(kind, np.eye(2), np.eye(2), np.eye(2), beta=beta)
    V = tp.velocity(att, X, weights=weights, backend="numpy")
    return -np.sin(theta) * V[:, 0] + np.cos(theta) * V[:, 1]


def fd_jacobian(theta, beta, kind, weights=None, h=1e-5):
    n = theta.size
    J = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = h
        J[:, j] = (angular_velocity(theta + e, beta, kind, weights)
                   - angular_velocity(theta - e, beta, kind, weights)) / (2 * h)
    return J


# ------------------------------------------------------------------ measures of a state
def test_order_parameter_and_gap_of_constructed_states():
    same = circle(np.full(7, 0.3))
    assert order_parameter(same) == pytest.approx(1.0, abs=1e-15)
    assert largest_gap(same) == pytest.approx(2 * np.pi, abs=1e-12)
    polygon = circle(2 * np.pi * np.arange(5) / 5 + 0.1)
    assert order_parameter(polygon) == pytest.approx(0.0, abs=1e-15)
    assert largest_gap(polygon) == pytest.approx(2 * np.pi / 5, abs=1e-12)
    X = circle([0.0, 0.1, 3.0])                      # gaps 0.1, 2.9, 2 pi - 3
    assert largest_gap(X) == pytest.approx(2 * np.pi - 3.0, abs=1e-12)
    assert circle_clusters(X, gap=0.05) == 3 and circle_clusters(X, gap=0.5) == 2
    # weights: mass 1 at angle 0 and 0 elsewhere is one point
    assert order_parameter(X, weights=[1.0, 0.0, 0.0]) == pytest.approx(1.0, abs=1e-15)
    # batches: shape (..., n, 2) -> (...)
    both = np.stack([same[:3], X])
    assert largest_gap(both).shape == (2,) and order_parameter(both).shape == (2,)
    np.testing.assert_allclose(circle_angles(circle([0.5, -2.0])), [0.5, -2.0], atol=1e-15)


def test_initial_states():
    rng = np.random.default_rng(1)
    X = circle_initial_states(rng, 4, 9, "triangle", spread=0.0)
    assert X.shape == (4, 9, 2)
    np.testing.assert_allclose(np.linalg.norm(X, axis=-1), 1.0, atol=1e-15)
    # spread 0: three groups of three coincident tokens at 120 degrees
    assert np.all(circle_clusters(X) == 3)
    assert np.all(largest_gap(X) == pytest.approx(2 * np.pi / 3, abs=1e-12))
    U = circle_initial_states(rng, 2, 5)
    assert U.shape == (2, 5, 2)


# ------------------------------------------------------------------ linearisation
@pytest.mark.parametrize("beta", [-2.0, -1.0, -0.7, -0.6, -0.2, 0.0, 0.5])
def test_triangle_eigenvalue_closed_form(beta):
    mu, nu = polygon_spectrum(3, beta)
    expected = math.exp(-beta / 2) * (0.5 + 0.75 * beta)
    np.testing.assert_allclose(mu, [expected, expected], rtol=1e-13, atol=1e-15)
    # nu = -(1/3)(e^beta + 2 g'(2 pi/3)), g'(2 pi/3) = e^{-beta/2}(-1/2 - 3 beta/4)
    assert nu == pytest.approx(-(math.exp(beta) - 2 * expected) / 3, rel=1e-13)


def test_triangle_stable_exactly_below_minus_two_thirds():
    below, above = polygon_spectrum(3, -2 / 3 - 1e-9), polygon_spectrum(3, -2 / 3 + 1e-9)
    assert max(below[0].max(), below[1]) < 0
    assert above[0].max() > 0


def test_which_polygons_are_stable():
    """On a grid of beta in [-6, 0.2] (step 0.02): p = 3, 5, 7 clusters are stable below
    -2/3, about -2.11 and about -4.43 (the figures the guide quotes), p = 2, 4, 6, 8
    never."""
    def stable(p, beta):
        mu, nu = polygon_spectrum(p, beta)
        return max(mu.max(), nu) < 0
    grid = np.round(np.arange(-6.0, 0.2001, 0.02), 2)
    for p in (2, 4, 6, 8):
        assert not any(stable(p, b) for b in grid)
    for p, threshold in ((3, -2 / 3), (5, -2.11), (7, -4.43)):
        for b in grid:
            if abs(b - threshold) > 0.011:
                assert stable(p, b) == (b < threshold), (p, b)


@pytest.mark.parametrize("kind", ["exp", "softmax"])
@pytest.mark.parametrize("p,per,beta", [(3, 1, -1.0), (3, 2, -1.0), (3, 2, -0.4),
                                        (4, 2, -0.8), (5, 1, -2.5), (5, 2, 0.3)])
def test_polygon_spectrum_against_finite_differences(kind, p, per, beta):
    """p clusters of `per` tokens each: eigenvalues of the finite-difference Jacobian of the
    library's field = {0 (rotation), mu_1..mu_{p-1}, nu (n - p times)}.  Central
    differences with h = 1e-5: truncation ~h^2 |g'''| ~ 1e-9, round-off ~1e-16/h ~ 1e-11;
    tolerance 1e-7."""
    theta = np.repeat(2 * np.pi * np.arange(p) / p, per)
    J = fd_jacobian(theta, beta, kind)
    got = np.sort(np.linalg.eigvals(J).real)
    mu, nu = polygon_spectrum(p, beta, kind)
    expected = np.sort(np.r_[0.0, mu, [nu] * (p * per - p)])
    np.testing.assert_allclose(got, expected, atol=1e-7)


@pytest.mark.parametrize("kind", ["exp", "softmax"])
def test_equilibrium_spectrum_against_finite_differences(kind):
    """Two equilibria with unequal masses (an antipodal pair, and a triangle of clusters
    of unequal token weights but equal cluster masses): the spectrum without the rotation
    equals the finite-difference Jacobian's eigenvalues without one zero (tolerance as
    above)."""
    cases = [(np.array([0.0, np.pi]), np.array([0.7, 0.3]), -0.5),
             (np.repeat(2 * np.pi * np.arange(3) / 3, 2),
              np.array([0.1, 0.9, 0.5, 0.5, 0.3, 0.7]) / 3, -1.2)]
    for theta, w, beta in cases:
        assert np.abs(angular_velocity(theta, beta, kind, w)).max() < 1e-14
        spec = equilibrium_spectrum(circle(theta), beta, kind, weights=w)
        fd = np.sort(np.linalg.eigvals(fd_jacobian(theta, beta, kind, w)).real)
        drop = np.argmin(np.abs(fd))
        np.testing.assert_allclose(spec, np.delete(fd, drop), atol=1e-7)


def test_triangle_spectrum_sign_matches_polygon():
    for beta in (-1.0, -0.5):
        spec = equilibrium_spectrum(circle(np.repeat(2 * np.pi * np.arange(3) / 3, 4)), beta)
        mu, nu = polygon_spectrum(3, beta)
        assert spec[-1] == pytest.approx(max(mu.max(), nu), abs=1e-12)
        assert (spec[-1] < 0) == (beta < -2 / 3)


# ------------------------------------------------------------------ runs
def test_synchronised_state_is_certified_at_time_zero():
    X0 = circle(np.linspace(0.0, 3.0, 6))            # all in an arc of 3 < pi - margin
    r = synchronization_runs(-1.0, X0, t_max=5.0)
    assert r.verdict[0] == SYNCHRONISED and r.t_decided[0] == 0.0
    assert r.fraction() == 1.0 and r.status == ("ok",)


def test_triangle_is_a_stable_equilibrium_below_minus_two_thirds():
    """Near the three-cluster state (n = 9, angles moved by N(0, 0.05^2)): at beta = -1 the
    run stops there (stable: every eigenvalue < 0); at beta = -0.4 the triangle is unstable
    (mu = e^{0.2}(1/2 - 0.3) > 0) and the run synchronises."""
    X0 = circle_initial_states(np.random.default_rng(3), 2, 9, "triangle", spread=0.05)
    stuck = synchronization_runs(-1.0, X0, t_max=200.0, dt=0.1)
    assert np.all(stuck.verdict == EQUILIBRIUM) and np.all(stuck.clusters == 3)
    assert np.all(stuck.speed < 1e-8) and np.all(stuck.order < 1e-6)
    for X in stuck.states:
        assert equilibrium_spectrum(X, -1.0)[-1] < -0.3
    free = synchronization_runs(-0.4, X0, t_max=200.0, dt=0.1)
    assert np.all(free.verdict == SYNCHRONISED) and np.all(free.t_decided < 100)


def test_undecided_when_time_runs_out():
    X0 = circle(2 * np.pi * np.arange(4) / 4 + np.array([0.0, 0.01, -0.02, 0.03]))
    r = synchronization_runs(0.0, X0, t_max=0.5, check_every=0.25)
    assert r.verdict[0] == UNDECIDED and np.isnan(r.t_decided[0])
    assert r.speed[0] > 1e-4


def test_runs_against_scipy_and_alone_against_together():
    """The RK4 run (dt = 0.05) against SciPy's DOP853 on the angle ODE (rtol 1e-12): the
    states agree to 1e-6 at the verdicts (RK4's global error ~ dt^4 = 6e-6 times a
    constant of order 0.1 here: 2e-7 seen), far below the certificate's margin 1e-2.
    Each system's verdict and time are those of its run alone (the ensemble's segments
    are independent)."""
    beta = -0.9
    X0 = circle_initial_states(np.random.default_rng(5), 4, 5)
    together = synchronization_runs(beta, X0, t_max=20.0, check_every=0.5)
    for b in range(4):
        alone = synchronization_runs(beta, X0[b], t_max=20.0, check_every=0.5)
        assert alone.verdict[0] == together.verdict[b]
        assert alone.t_decided[0] == together.t_decided[b]
        np.testing.assert_allclose(alone.states[0], together.states[b], atol=1e-12)
        t_end = together.t_decided[b] if together.verdict[b] != UNDECIDED else 20.0
        if t_end == 0.0:
            continue

        def rhs(t, th):
            d = th[None, :] - th[:, None]
            return (np.exp(beta * np.cos(d)) * np.sin(d)).mean(axis=1)

        ref = solve_ivp(rhs, (0.0, t_end), circle_angles(X0[b]), method="DOP853",
                        rtol=1e-12, atol=1e-12).y[:, -1]
        np.testing.assert_allclose(together.states[b], circle(ref), atol=1e-6)


# ------------------------------------------------------------------ bad arguments
def test_bad_arguments():
    X0 = circle([0.0, 2.0, 4.0])
    with pytest.raises(ArgumentError, match="kind"):
        synchronization_runs(-1.0, X0, kind="l2")
    with pytest.raises(ArgumentTypeError, match="beta"):
        synchronization_runs("a", X0)
    with pytest.raises(ArgumentError, match="X0"):
        synchronization_runs(-1.0, np.ones((3, 3)))
    with pytest.raises(ArgumentError, match="unit"):
        synchronization_runs(-1.0, 2 * X0)
    with pytest.raises(ArgumentError, match="t_max"):
        synchronization_runs(-1.0, X0, t_max=0.0)
    with pytest.raises(ArgumentError, match="speed_tol"):
        synchronization_runs(-1.0, X0, speed_tol=-1.0)
    with pytest.raises(ArgumentTypeError, match="field"):
        synchronization_runs(-1.0, X0, field="numpy")
    with pytest.raises(ArgumentError, match="p"):
        polygon_spectrum(1, -1.0)
    with pytest.raises(ArgumentError, match="max_tokens"):
        equilibrium_spectrum(circle(np.zeros(10)), -1.0, max_tokens=5)
    with pytest.raises(ArgumentError, match="init"):
        circle_initial_states(np.random.default_rng(0), 1, 3, init="ring")
    with pytest.raises(ArgumentTypeError, match="rng"):
        circle_initial_states(0, 1, 3)
    with pytest.raises(ArgumentError, match="verdict"):
        synchronization_runs(-1.0, X0, t_max=0.1).fraction("maybe")
    with pytest.raises(ArgumentError, match="X"):
        largest_gap(np.zeros((3, 3)))
