"""The mean-field equation on the circle (:mod:`transformer_pde.meanfield.circle`) against
independent references: the particle field of the library, the exact linear growth rates,
the closed Fourier system of USA integrated by scipy, and resolution-doubled solves."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.special import iv

import transformer_pde as tp
from transformer_pde.errors import ArgumentError, ArgumentTypeError, EarlyStopWarning
from transformer_pde.meanfield.circle import initial_coefficients, solve_circle
from transformer_pde.meanfield.spectral import CircleField, circle_growth_rate, tail_share


def smooth(th):
    return (1 + 0.3 * np.cos(th) + 0.2 * np.sin(2 * th)) / (2 * np.pi)


def smooth_cdf(th):
    return (th + 0.3 * np.sin(th) + 0.1 * (1 - np.cos(2 * th))) / (2 * np.pi)


def quantile_points(n):
    """Angles at the quantiles (j + 1/2)/n of ``smooth`` (Newton on the exact CDF)."""
    u = (np.arange(n) + 0.5) / n
    grid = np.linspace(0, 2 * np.pi, 4001)
    th = np.interp(u, smooth_cdf(grid), grid)
    for _ in range(6):
        th = th - (smooth_cdf(th) - u) / smooth(th)
    return th


# ------------------------------------------------------------------ the velocity field
@pytest.mark.parametrize("kind,beta", [("softmax", 3.0), ("softmax", 0.0), ("exp", 2.0)])
def test_velocity_equals_the_particle_field_of_a_quantile_sample(kind, beta):
    # The midpoint quantile rule integrates smooth periodic functions of the sample
    # spectrally, so 2000 tokens reproduce the mean-field velocity to round-off: this pins
    # the 2 pi conventions of (K * mu)^_m = 2 pi I_m mu^_m and the 1/beta factors.
    th = quantile_points(2000)
    X = np.c_[np.cos(th), np.sin(th)]
    att = tp.Attention(kind, np.eye(2), np.eye(2), np.eye(2), beta=beta)
    c0, _ = initial_coefficients(smooth, 1e-14, 16, 4096)
    field = CircleField(c0.size, beta, "sa" if kind == "softmax" else "usa")
    q = 2 * np.pi * np.arange(field.m) / field.m
    V = tp.velocity(att, X, queries=np.c_[np.cos(q), np.sin(q)])
    tangential = -np.sin(q) * V[:, 0] + np.cos(q) * V[:, 1]
    v = field.velocity(c0) * (np.exp(beta) if kind == "exp" else 1.0)
    assert np.max(np.abs(tangential - v)) < 1e-12


# ------------------------------------------------------------------ linear theory
def exact_rate(beta, k, model):
    """k^2 I_k(b) / (b I_0(b)) (SA), k^2 I_k(b) / b (USA), straight from scipy's iv."""
    rate = k * k * iv(k, beta) / beta
    return rate / iv(0, beta) if model == "sa" else rate


@pytest.mark.parametrize("model,beta,k", [("sa", 5.0, 3), ("sa", 5.0, 1), ("sa", 200.0, 12),
                                          ("usa", 2.0, 2), ("usa", 5.0, 3)])
def test_linear_growth_rate_of_one_mode(model, beta, k):
    eps = 1e-8
    rate = exact_rate(beta, k, model) if beta < 100 else None
    rate = circle_growth_rate(beta, k, model) if rate is None else rate
    assert circle_growth_rate(beta, k, model) == pytest.approx(rate, rel=1e-13)
    try:   # the sphere reduction's rates, when that module is present
        from transformer_pde.reductions.modes import mode_growth_rate
    except ImportError:
        pass
    else:
        assert mode_growth_rate(beta, d=2, degree=k, model=model) == pytest.approx(rate,
                                                                                  rel=1e-10)
    T = 1.0 / rate
    # atol well below the perturbation's coefficients (eps / (4 pi) ~ 8e-10)
    sol = solve_circle(lambda th: 1 + eps * np.cos(k * th), beta, [0.0, T], model=model,
                       atol=1e-22)
    assert sol.status == "ok"
    a0, a1 = np.abs(sol.coefficients[:, k])
    assert a0 == pytest.approx(eps / (4 * np.pi), rel=1e-12)
    measured = np.log(a1 / a0) / T
    assert measured == pytest.approx(rate, rel=1e-6)


def test_growth_rate_at_beta_zero_is_the_limit():
    assert circle_growth_rate(0.0, 1, "sa") == pytest.approx(0.5, rel=1e-15)
    assert circle_growth_rate(0.0, 2, "usa") == 0.0
    assert circle_growth_rate(1e-8, 1, "sa") == pytest.approx(0.5, rel=1e-7)


def test_most_unstable_mode_dominates_first():
    # beta = 5: k^2 I_k(5) / (5 I_0(5)) is largest at k* = 3 among k = 1..8
    beta, eps = 5.0, 1e-8
    rates = np.array([exact_rate(beta, k, "sa") for k in range(1, 9)])
    assert np.argmax(rates) + 1 == 3
    T1, T = 1.0 / rates.max(), 6.0 / rates.max()
    sol = solve_circle(lambda th: 1 + eps * sum(np.cos(k * th) for k in range(1, 9)),
                       beta, [0.0, T1, T], atol=1e-22)
    amp = np.abs(sol.coefficients[:, 1:9])
    assert np.argmax(amp[-1]) + 1 == 3
    # the runner-up k = 4 trails by exp((rate_3 - rate_4) T) ~ 2.07
    assert amp[-1, 2] > 1.9 * np.delete(amp[-1], 2).max()
    # at T1 every mode is still nearly linear: the quadratic forcing of the slowest mode
    # (k = 8, rate 0.035) by the pairs (m, 8 - m) is ~ 8 eps / (4 pi rate) ~ 2e-6 relative
    growth = np.log(amp[1] / amp[0]) / T1
    np.testing.assert_allclose(growth, rates, rtol=1e-5)
    np.testing.assert_allclose(growth[:4], rates[:4], rtol=1e-7)


# ------------------------------------------------------------------ USA: the closed system
def usa_reference(c0, beta, t_eval, n_ref):
    """dc_k/dt = (2 pi k / b) sum_m m I_m(b) c_m c_{k-m} on |k| <= n_ref, by direct
    convolution of the full spectrum and scipy's DOP853 (independent of the FFT solver)."""
    k = np.arange(-n_ref, n_ref + 1)
    I = iv(np.abs(k), beta)
    full0 = np.zeros(2 * n_ref + 1, complex)
    full0[n_ref:n_ref + c0.size] = c0
    full0[n_ref - c0.size + 1:n_ref] = np.conj(c0[1:][::-1])

    def rhs(t, y):
        c = y[:y.size // 2] + 1j * y[y.size // 2:]
        conv = np.convolve(k * I * c, c)[n_ref:3 * n_ref + 1]
        dc = 2 * np.pi * k / beta * conv
        return np.concatenate([dc.real, dc.imag])

    y0 = np.concatenate([full0.real, full0.imag])
    out = solve_ivp(rhs, (0, t_eval[-1]), y0, method="DOP853", t_eval=t_eval, rtol=1e-13,
                    atol=1e-16)
    assert out.success
    full = out.y[:2 * n_ref + 1] + 1j * out.y[2 * n_ref + 1:]
    return full[n_ref:].T       # k = 0..n_ref


def test_usa_matches_the_closed_fourier_system():
    beta = 2.0
    ts = np.array([0.0, 0.1, 0.25, 0.5])
    d0 = lambda th: 1 + 0.4 * np.cos(th + 0.3) + 0.2 * np.cos(3 * th)  # noqa: E731
    sol = solve_circle(d0, beta, ts, model="usa")
    assert sol.status == "ok"
    n, n_ref = sol.coefficients.shape[1], 100
    assert n <= n_ref
    ref = usa_reference(sol.coefficients[0, :sol.modes[0]], beta, ts, n_ref)
    assert np.max(np.abs(sol.coefficients - ref[:, :n])) < 1e-10
    assert np.max(np.abs(ref[:, n:])) < 1e-12          # the solve kept every relevant mode
    # the density on the output grid, from the reference coefficients
    k = np.arange(-n_ref, n_ref + 1)
    full = np.concatenate([np.conj(ref[:, :0:-1]), ref], axis=1)
    dens = np.real(full @ np.exp(1j * np.outer(k, sol.theta)))
    assert np.max(np.abs(sol.density - dens)) < 1e-10


def test_usa_shift_is_a_time_scale():
    d0 = lambda th: 1 + 0.3 * np.cos(2 * th)  # noqa: E731
    a = solve_circle(d0, 3.0, [0.0, 0.4], model="usa")
    b = solve_circle(d0, 3.0, [0.0, 0.4 * np.exp(1.5)], model="usa", shift=1.5)
    assert np.max(np.abs(a.density[-1] - b.density[-1])) < 1e-10


# ------------------------------------------------------------------ SA: resolution
def test_sa_matches_a_resolution_doubled_solve_and_conserves_mass():
    d0 = lambda th: 1 + 0.5 * np.cos(3 * th) + 0.2 * np.sin(th)  # noqa: E731
    ts = np.array([0.0, 0.5, 1.0, 2.0])
    a = solve_circle(d0, 5.0, ts)
    b = solve_circle(d0, 5.0, ts, rtol=1e-12, modes=2 * a.modes.max(), tol=1e-13,
                     n_theta=a.theta.size)
    assert a.status == b.status == "ok"
    assert np.all(b.modes >= 2 * a.modes[0])
    assert np.max(np.abs(a.density - b.density)) < 1e-10
    assert np.max(np.abs(a.mass - 1)) < 1e-12
    assert np.all(a.min_density > -1e-12)
    assert np.all(a.tail <= a.tol)


def test_modes_double_as_the_density_sharpens():
    d0 = lambda th: 1 + 0.5 * np.cos(2 * th)  # noqa: E731
    sol = solve_circle(d0, 5.0, np.linspace(0, 4, 5))
    assert sol.status == "ok"
    assert np.all(np.diff(sol.modes) >= 0) and sol.modes[-1] >= 4 * sol.modes[0]
    for c, n in zip(sol.coefficients, sol.modes, strict=True):
        assert tail_share(c[:n]) <= sol.tol
        assert np.all(c[n:] == 0)
    assert np.max(np.abs(sol.mass - 1)) < 1e-12


def test_max_modes_stops_early_and_keeps_the_resolved_states():
    d0 = lambda th: 1 + 0.5 * np.cos(2 * th)  # noqa: E731
    ts = np.linspace(0, 8, 9)
    with pytest.warns(EarlyStopWarning, match="max_modes=64"):
        sol = solve_circle(d0, 5.0, ts, max_modes=64)
    assert sol.status == "failed" and not sol.success
    assert "max_modes=64" in sol.message and "concentrates" in sol.message
    with warnings.catch_warnings():   # warn=False: the status is the only report
        warnings.simplefilter("error", EarlyStopWarning)
        quiet = solve_circle(d0, 5.0, ts, max_modes=64, warn=False)
    assert quiet.status == "failed" and quiet.message == sol.message
    assert sol.times[-1] < ts[-1] and sol.modes.max() == 64
    np.testing.assert_array_equal(sol.times[:-1], ts[:sol.times.size - 1])
    assert np.all(sol.tail <= sol.tol)
    # the states kept are those of an unconstrained solve
    full = solve_circle(d0, 5.0, sol.times[:-1], n_theta=sol.theta.size)
    assert np.max(np.abs(full.density - sol.density[:-1])) < 1e-10


# ------------------------------------------------------------------ input
def test_samples_give_the_solution_of_the_callable():
    grid = 2 * np.pi * np.arange(64) / 64
    a = solve_circle(smooth, 4.0, [0.0, 0.5], n_theta=64)
    b = solve_circle(smooth(grid) * 7.0, 4.0, [0.0, 0.5], n_theta=64)  # unnormalised
    assert b.theta.size == 64
    np.testing.assert_allclose(b.density, a.density, atol=1e-12)
    np.testing.assert_allclose(a.density[0], smooth(grid), atol=1e-14)


def test_scalar_time_and_zero_time():
    sol = solve_circle(smooth, 1.0, 0.25)
    np.testing.assert_array_equal(sol.times, [0.0, 0.25])
    sol = solve_circle(smooth, 1.0, [0.0])
    assert sol.status == "ok" and sol.times.tolist() == [0.0]


@pytest.mark.parametrize("kwargs,match", [
    ({"density0": lambda th: np.cos(th)}, "non-negative"),
    ({"density0": np.r_[1.0, -0.5, 1.0, 1.0]}, "non-negative"),
    ({"density0": np.r_[1.0, np.nan, 1.0, 1.0]}, "NaN"),
    ({"density0": np.zeros(8)}, "zero everywhere"),
    ({"density0": np.ones(3)}, "at least 4"),
    ({"density0": np.ones((4, 4))}, "1-d"),
    ({"density0": lambda th: np.ones(3)}, "shape"),
    ({"density0": (np.arange(64) < 32).astype(float)}, "not resolved"),
    ({"density0": lambda th: (th < 1.0) + 0.0, "max_modes": 256}, "max_modes=256"),
    ({"beta": -1.0}, "beta"),
    ({"t": [0.0, 1.0, 0.5]}, "increasing"),
    ({"t": [-1.0, 1.0]}, ">= 0"),
    ({"model": "mlp"}, "model"),
    ({"modes": 64, "max_modes": 32}, "exceeds max_modes"),
    ({"tol": 1.5}, "tol"),
    ({"model": "usa", "beta": 800.0}, "shift=beta"),
])
def test_bad_arguments_raise_naming_them(kwargs, match):
    args = {"density0": smooth, "beta": 1.0, "t": [0.0, 1.0], **kwargs}
    with pytest.raises(ArgumentError, match=match):
        solve_circle(args.pop("density0"), args.pop("beta"), args.pop("t"), **args)


def test_wrong_types_raise():
    with pytest.raises(ArgumentTypeError):
        solve_circle("uniform", 1.0, [0.0, 1.0])
    with pytest.raises(ArgumentTypeError):
        solve_circle(smooth, 1.0, [0.0, 1.0], modes="many")


def test_large_beta_does_not_overflow():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = solve_circle(lambda th: 1 + 0.1 * np.cos(10 * th), 200.0, [0.0, 0.1])
    assert sol.status == "ok" and np.all(np.isfinite(sol.density))


def test_to_xarray():
    pytest.importorskip("xarray")
    sol = solve_circle(smooth, 2.0, [0.0, 0.1, 0.2])
    ds = sol.to_xarray()
    assert ds["density"].shape == sol.density.shape
    np.testing.assert_array_equal(ds["time"].values, sol.times)
    assert ds.attrs["status"] == "ok" and ds.attrs["model"] == "sa"
