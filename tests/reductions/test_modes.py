"""Growth rates of harmonic perturbations of the uniform measure on the sphere."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import eval_legendre

import transformer_pde as tp
from transformer_pde.errors import ArgumentError
from transformer_pde.reductions.modes import mode_growth_rate, most_unstable_degree


def test_oracle_values_on_the_circle():
    # six significant digits, as quoted
    assert mode_growth_rate(4.0, 2, 3) == pytest.approx(0.664389, rel=1e-6)
    assert mode_growth_rate(4.0, 2, 3, model="usa") == pytest.approx(7.508871, rel=1e-6)
    assert [most_unstable_degree(b, 2) for b in (1, 2, 4, 5, 9, 20)] == [1, 2, 3, 3, 4, 6]


@pytest.mark.parametrize("beta", [0.3, 2.0, 7.5, 40.0])
def test_funk_hecke_quadrature_d3(beta):
    # S^2: lambda_l = l(l+1)/beta * (1/2) int e^{beta s} P_l(s) ds (USA), over the same
    # integral with P_0 (SA); quadrature to 1e-11 relative (1e-14 absolute), of e^{beta(s-1)} to avoid overflow
    ell = np.arange(1, 9)
    for model in ("sa", "usa"):
        want = []
        z, _ = quad(lambda s: 0.5 * math.exp(beta * (s - 1)), -1, 1, epsabs=0, epsrel=1e-11)
        for deg in ell:
            m, _ = quad(lambda s, k=deg: 0.5 * math.exp(beta * (s - 1)) * eval_legendre(k, s), -1, 1,
                        epsabs=1e-14, epsrel=1e-11, limit=200)
            val = deg * (deg + 1) / beta * m
            want.append(val / z if model == "sa" else val * math.exp(beta))
        got = mode_growth_rate(beta, 3, ell, model=model)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11 * max(want))


def test_beta_zero_limit_and_shift():
    assert mode_growth_rate(0.0, 5, 1) == pytest.approx(4 / 5, rel=1e-15)
    assert mode_growth_rate(0.0, 5, 2) == 0.0
    assert mode_growth_rate(1e-7, 5, 1) == pytest.approx(4 / 5, rel=1e-6)
    big = mode_growth_rate(1e4, 3, [1, 40], model="usa")
    assert np.all(np.isinf(big))              # e^{10000}: beyond the float range
    scaled = mode_growth_rate(1e4, 3, [1, 40], model="usa", shift=1e4)
    sa = mode_growth_rate(1e4, 3, [1, 40])
    assert np.all(np.isfinite(scaled)) and np.all(scaled > 0)
    # SA = e^{-beta} USA / (Gamma(nu+1)(2/b)^nu ive(nu, b)); nu = 1/2, ive(1/2, b) =
    # sqrt(2/(pi b)) (1 - e^{-2b})/2
    norm = math.gamma(1.5) * math.sqrt(2 / 1e4) * 0.5 * math.sqrt(2 / (math.pi * 1e4))
    np.testing.assert_allclose(scaled / norm, sa, rtol=1e-10)
    assert most_unstable_degree(1e4, 3) == most_unstable_degree(1e4, 3, model="usa")


def fourier_growth(model, beta, k, N=2000, eps=1e-5, t_max=0.4):
    """Growth rate of the k-th Fourier coefficient of N quantile-placed particles on the
    circle displaced by eps cos(k theta), run by the library (RK4, dt = 0.02)."""
    theta = 2 * np.pi * (np.arange(N) + 0.5) / N
    theta = theta + eps * np.cos(k * theta)
    X0 = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    att = tp.Attention("softmax" if model == "sa" else "exp", np.eye(2), np.eye(2), np.eye(2),
                       beta=beta)
    traj = tp.simulate(att, X0, t_max=t_max, dt=0.02, solver="rk4",
                       block=tp.Block(constraint="sphere"), saveat=tp.SaveAt(ts=[0.0, t_max]))
    ang = np.arctan2(traj.states[..., 1], traj.states[..., 0])
    c = np.abs(np.exp(-1j * k * ang).mean(axis=1))
    return math.log(c[1] / c[0]) / t_max


@pytest.mark.parametrize("model, beta, k", [("sa", 4.0, 3), ("usa", 4.0, 3), ("sa", 5.0, 1)])
def test_particles_on_the_circle(model, beta, k):
    # N = 2000 quantile points integrate the analytic kernel to rounding (trapezoid rule on
    # a periodic integrand); eps = 1e-5 makes the nonlinear terms ~1e-5 relative; RK4 with
    # lambda dt <= 0.15 adds < 1e-5.  So 1e-3 relative is a safe bound.
    assert fourier_growth(model, beta, k) == pytest.approx(mode_growth_rate(beta, 2, k, model=model),
                                                           rel=1e-3)


def test_most_unstable_degree_on_the_circle_at_beta_5():
    rates = mode_growth_rate(5.0, 2, np.arange(1, 12))
    assert most_unstable_degree(5.0, 2) == 3 == 1 + int(np.argmax(rates))


@pytest.mark.parametrize("call, name", [
    (lambda: mode_growth_rate(-1.0, 2, 1), "beta"), (lambda: mode_growth_rate(1.0, 1, 1), "d"),
    (lambda: mode_growth_rate(1.0, 2, 0), "degree"), (lambda: mode_growth_rate(1.0, 2, 1.5), "degree"),
    (lambda: mode_growth_rate(1.0, 2, 1, model="x"), "model"),
    (lambda: mode_growth_rate(1.0, 2, 1, shift=2.0), "shift"),
    (lambda: most_unstable_degree(1.0, 0), "d"), (lambda: most_unstable_degree(-2.0, 3), "beta"),
])
def test_argument_errors(call, name):
    with pytest.raises(ArgumentError, match=name):
        call()
