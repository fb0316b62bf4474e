"""The mean-field equation on the line: the exact Gaussian solution, the library's particle
system and its argument checks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

import transformer_pde as tp
from transformer_pde.errors import ArgumentError, ArgumentTypeError, EarlyStopWarning
from transformer_pde.gaussian.exact import exact_softmax_1d
from transformer_pde.meanfield.distance import distance_to_pde, w1_line
from transformer_pde.meanfield.line import LineSolution, solve_line

CASES = [("softmax", 1.0, 1.0, 1.0, -0.5, 2.0), ("softmax", 0.7, 1.3, -0.8, 1.0, 1.0),
         ("softmax", 1.0, 1.0, 1.0, 0.3, 1.0),          # expanding, before T* = 1/(2*0.3*0.64)
         ("l2", 1.0, 1.0, 1.0, 1.0, 1.0), ("l2", 0.6, -1.2, 0.9, 1.0, 2.0)]


@pytest.mark.parametrize("kind, q, k, v, beta, T", CASES)
def test_gaussian_start_matches_the_exact_gaussian_solution(kind, q, k, v, beta, T):
    # Gamma is affine for a Gaussian, so the solution stays Gaussian; the node quadrature
    # (trapezoid on a uniform grid, spectral) and the tail cut (1e-16) are far below the
    # time integration's tolerance (rtol 1e-11), so moments agree to 1e-9 and the density at
    # the nodes to 1e-9 relative to its maximum
    ts = np.linspace(0.0, T, 5)
    sol = solve_line(stats.norm(0.5, 0.8), ts, kind=kind, q=q, k=k, v=v, beta=beta)
    assert sol.status == "ok" and np.allclose(sol.times, ts, rtol=0, atol=1e-15)
    extra = {} if kind == "l2" else {"beta": beta}
    att = tp.Attention(kind, [[q]], [[k]], [[v]], **extra)
    ref = tp.gaussian.solve(att, [0.5], [[0.64]], t_max=T, t_eval=ts, rtol=1e-12, atol=1e-14)
    means, covs = sol.moments()
    np.testing.assert_allclose(means[:, 0], ref.means[:, 0], rtol=0, atol=1e-9)
    np.testing.assert_allclose(covs[:, 0, 0], ref.covs[:, 0, 0], rtol=0, atol=1e-9)
    if kind == "softmax":
        m_ex, v_ex = exact_softmax_1d(v, q * k, 0.5, 0.64, ts, beta=beta)
        np.testing.assert_allclose(means[:, 0], m_ex, rtol=0, atol=1e-9)
        np.testing.assert_allclose(covs[:, 0, 0], v_ex, rtol=0, atol=1e-9)
    for i in range(len(ts)):
        exact = stats.norm(ref.means[i, 0], np.sqrt(ref.covs[i, 0, 0])).pdf(sol.x[i])
        assert np.max(np.abs(sol.density[i] - exact)) <= 1e-9 * exact.max()
        # L1 of the solution (its piecewise-linear interpolant between the nodes) against
        # the exact density: the interpolation error O(h^2 max|rho''|) with h = 0.041 sigma
        fine = np.linspace(sol.x[i, 0], sol.x[i, -1], 40_001)
        ex = stats.norm(ref.means[i, 0], np.sqrt(ref.covs[i, 0, 0])).pdf(fine)
        l1 = np.trapezoid(np.abs(np.interp(fine, sol.x[i], sol.density[i]) - ex), fine)
        assert l1 < 5e-4


def test_nodes_follow_the_library_particle_system():
    # the nodes with their masses are N weighted tokens of tp.simulate (same ODE), solved
    # independently by the library's attention field: agreement to the tolerances
    x = np.linspace(-2, 2, 41)
    rho = np.exp(-4 * (x - 1) ** 2) + np.exp(-4 * (x + 1) ** 2)
    ts = np.array([0.0, 0.5, 1.0])
    sol = solve_line((x, rho), ts, v=-1.0, n_nodes=121)
    att = tp.Attention("softmax", [[1.0]], [[1.0]], [[-1.0]])
    traj = tp.simulate(att, sol.labels[:, None], t_max=1.0, dt=0.5,
                       solver=tp.integrate.Dop853(rtol=1e-11, atol=1e-13),
                       weights=sol.weights, saveat=tp.SaveAt(ts=ts))
    np.testing.assert_allclose(traj.states[:, :, 0], sol.x, rtol=0, atol=1e-9)
    # the density is rho0 / (d X / d xi): compare with a finite difference of the positions
    J = np.gradient(sol.x[-1], sol.labels, edge_order=2)
    inner = slice(5, -5)
    np.testing.assert_allclose(sol.density[-1, inner], sol.density[0, inner] / J[inner],
                               rtol=2e-3)
    # the mass is conserved: the interpolant of the density integrates to one to O(h^2)
    for i in range(3):
        assert np.trapezoid(sol.density[i], sol.x[i]) == pytest.approx(1.0, abs=2e-3)


def test_random_particles_converge_to_the_solution():
    # 1000 i.i.d. tokens from mu0 under the library's particle flow: W1 to the PDE at
    # every time is of the order N^{-1/2} (about 0.015 here), far below the distance the
    # flow moves the measure
    x = np.linspace(-2, 2, 41)
    rho = np.exp(-4 * (x - 1) ** 2) + np.exp(-4 * (x + 1) ** 2) - 2 * np.exp(-16)
    ts = np.array([0.0, 0.5, 1.0])
    sol = solve_line((x, rho), ts, v=-1.0, n_nodes=201)
    X0 = np.interp(np.random.default_rng(1).random(1000), sol.cdf, sol.labels)
    att = tp.Attention("softmax", [[1.0]], [[1.0]], [[-1.0]])
    traj = tp.simulate(att, X0[:, None], t_max=1.0, dt=0.05, solver="rk4",
                       saveat=tp.SaveAt(ts=ts))
    d1 = distance_to_pde(traj, sol)
    d2 = distance_to_pde(traj, sol, metric="w2")
    assert np.all(d1 < 0.03) and np.all(d2 < 0.04) and np.all(d1 <= d2 + 1e-12)
    moved = w1_line(sol.measure(0), sol.measure(-1))
    assert moved > 10 * d1[-1]


def test_expanding_flow_within_the_range_of_validity():
    # softmax with v a s0^2 = 0.5 > 0 blows up at T* = 1; up to t = 0.5, where
    # a sigma_t^2 = 1, the truncated quadrature still resolves the tilted measures (the
    # module docstring's criterion) and the variance is exact to 1e-8
    ts = np.array([0.0, 0.25, 0.5])
    sol = solve_line(stats.norm(0.0, 1.0), ts, beta=0.5)
    _, var = exact_softmax_1d(1.0, 1.0, 0.0, 1.0, ts, beta=0.5)
    np.testing.assert_allclose(sol.moments()[1][:, 0, 0], var, rtol=1e-8, atol=0)


def test_max_norm_stops_the_run():
    # a measure given on a grid has no cut tail: the run goes on until max_norm
    # (a blow-up is an answer: reported in the status, with no warning)
    x = np.linspace(-3.0, 3.0, 61)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EarlyStopWarning)
        sol = solve_line((x, np.exp(-x * x / 2)), 2.0, beta=0.5, n_nodes=64, max_norm=4.0)
    assert sol.status == "blowup" and sol.times[-1] < 2.0


def test_an_expanding_flow_stops_before_the_cut_tails_matter():
    # N(0, s0^2) under v a = 1 > 0 blows up at T* = 1 / (2 s0^2) = 2; the cut tails of the
    # initial Gaussian start to matter before: the run stops with status "failed" and a
    # message naming edge_tol, and every state it kept has the exact variance
    # s0^2 / (1 - 2 s0^2 t) to 1e-9 (the edge mass bounds the moments' quadrature error)
    s0 = 0.5
    ts = np.linspace(0.0, 1.98, 100)
    with pytest.warns(EarlyStopWarning, match="edge_tol"):
        sol = solve_line(stats.norm(0.0, s0), ts)
    assert sol.status == "failed" and "end node" in sol.message
    with warnings.catch_warnings():   # warn=False: the status is the only report
        warnings.simplefilter("error", EarlyStopWarning)
        quiet = solve_line(stats.norm(0.0, s0), ts, warn=False)
    assert quiet.status == "failed" and quiet.message == sol.message
    assert 1.0 < sol.times[-1] < 1.98
    _, covs = sol.moments()
    exact = s0 ** 2 / (1.0 - 2.0 * s0 ** 2 * sol.times)
    np.testing.assert_allclose(covs[:, 0, 0], exact, rtol=1e-9)


def test_to_xarray_and_measure():
    sol = solve_line(stats.norm(0.0, 1.0), [0.0, 0.1], n_nodes=32, beta=-0.25)
    assert isinstance(sol, LineSolution) and sol.success
    ds = sol.to_xarray()
    assert ds["x"].dims == ("time", "node") and ds["x"].shape == (2, 32)
    assert ds.attrs["status"] == "ok" and ds.attrs["kind"] == "softmax"
    x, rho = sol.measure(-1)
    np.testing.assert_array_equal(x, sol.x[1])
    np.testing.assert_allclose(sol.weights.sum(), 1.0, rtol=0, atol=1e-14)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"masked": True}, ArgumentError, "masked"),
    ({"masked": 1}, ArgumentTypeError, "masked"),
    ({"kind": "linear"}, ArgumentError, "kind"),
    ({"kind": "l2", "beta": 2.0}, ArgumentError, "beta"),
    ({"l2_beta": 0.0}, ArgumentError, "l2_beta"),
    ({"q": np.nan}, ArgumentError, "q"),
    ({"n_nodes": 3}, ArgumentError, "n_nodes"),
    ({"tail": 0.1}, ArgumentError, "tail"),
])
def test_bad_arguments_raise(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        solve_line(stats.norm(), 1.0, **kwargs)


def test_bad_initial_data_and_times_raise():
    with pytest.raises(ArgumentTypeError, match="density0"):
        solve_line([0.0, 1.0], 1.0)
    with pytest.raises(ArgumentError, match="density0"):
        solve_line((np.array([0.0, 1.0, 2.0]), np.array([1.0, -1.0, 1.0])), 1.0)
    with pytest.raises(ArgumentError, match="t must"):
        solve_line(stats.norm(), [0.0, 1.0, 0.5])
    with pytest.raises(ArgumentError, match="t"):
        solve_line(stats.norm(), -1.0)


@pytest.mark.parametrize("scale", [1e300, 1e308, np.finfo(float).max])
def test_a_density_near_the_float64_maximum_gives_the_normalised_solution(scale):
    # only the normalised density enters the equation: a density of values near the largest
    # float64 (whose cell masses sum to infinity) is the same initial measure; before, its
    # mass overflowed and the weights were 0 or NaN
    x = np.linspace(-2, 2, 41)
    rho = np.exp(-4 * (x - 1) ** 2) + np.exp(-4 * (x + 1) ** 2)
    ts = np.array([0.0, 0.5])
    ref = solve_line((x, rho), ts, v=-1.0, n_nodes=61)
    big = solve_line((x, rho / rho.max() * scale), ts, v=-1.0, n_nodes=61)
    # the two runs differ by the rounding of one division (relative 1e-16 in the weights),
    # which the adaptive solver at rtol 1e-11 turns into differences far below 1e-9
    np.testing.assert_allclose(big.weights, ref.weights, rtol=1e-13)
    np.testing.assert_allclose(big.x, ref.x, rtol=0, atol=1e-9)
    np.testing.assert_allclose(big.density, ref.density, rtol=1e-9)


def test_a_grid_whose_span_overflows_is_refused():
    x = np.array([-1e308, 0.0, 1e308])
    with pytest.raises(tp.errors.ArgumentError, match="span"):
        solve_line((x, np.ones(3)), [0.0, 0.1])
