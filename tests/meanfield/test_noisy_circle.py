"""solve_circle with diffusion: the McKean–Vlasov equation of noisy tokens on the circle."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import iv

from transformer_pde.errors import ArgumentError
from transformer_pde.meanfield import circle_growth_rate, solve_circle
from transformer_pde.reductions.noisy import critical_noise


@pytest.mark.parametrize("model", ["sa", "usa"])
@pytest.mark.parametrize(("beta", "D", "k"), [(2.0, 0.5, 1), (4.0, 1.0, 2), (1.0, 0.3, 3),
                                             (5.0, 0.05, 4)])
def test_linear_rates_drop_by_the_diffusion(model, beta, D, k):
    # mu = (1 + eps cos k theta)/(2 pi), eps = 1e-6: mode k grows at circle_growth_rate - D k^2
    # (the nonlinear terms are eps^2 = 1e-12 relative; DOP853 at rtol 1e-12 on
    # coefficients of 1e-7 with atol 1e-20): agreement to 1e-9 relative to the larger of
    # the rate and D k^2
    lam = circle_growth_rate(beta, k, model)
    eps, t = 1e-6, min(0.5, 1.0 / abs(lam - D * k * k))    # growth by at most e
    sol = solve_circle(lambda th: 1 + eps * np.cos(k * th), beta, [0.0, t], model=model,
                       diffusion=D, atol=1e-20, rtol=1e-12)
    assert sol.status == "ok" and sol.diffusion == D
    c = sol.coefficients[:, k]
    rate = math.log(abs(c[1]) / abs(c[0])) / t
    assert rate == pytest.approx(lam - D * k * k, abs=1e-9 * max(abs(lam), D * k * k))


def test_pure_diffusion_is_the_heat_kernel():
    # at beta = 0 the USA velocity is built from the first Fourier mode alone
    # (2 pi I_k(beta)/beta -> pi delta_k1); a density without a first mode keeps none, and
    # the equation is the heat equation d mu/dt = D mu''
    D, t = 0.7, 0.8
    sol = solve_circle(lambda th: 1 + 0.4 * np.cos(2 * th) + 0.2 * np.sin(6 * th), 0.0,
                       [0.0, t], model="usa", diffusion=D, rtol=1e-12)
    c = sol.coefficients
    # exact: mu_k(t) = mu_k(0) e^{-D k^2 t}; 1e-10 absolute on coefficients of size 0.06
    np.testing.assert_allclose(c[1, 2], c[0, 2] * math.exp(-4 * D * t), atol=1e-10)
    np.testing.assert_allclose(c[1, 6], c[0, 6] * math.exp(-36 * D * t), atol=1e-10)
    assert abs(c[1, 1]) < 1e-14


def test_below_and_above_the_critical_noise():
    # USA, beta = 1.5 (continuous transition): a first-mode perturbation decays above
    # D_# = I_1(beta)/beta and grows below it, at the closed-form rates
    beta = 1.5
    Dc = critical_noise(beta, 2, quantity="diffusion")
    assert Dc == pytest.approx(iv(1, beta) / beta, rel=1e-13)
    for D, sign in ((1.2 * Dc, -1), (0.8 * Dc, 1)):
        sol = solve_circle(lambda th: 1 + 1e-6 * np.cos(th), beta, [0.0, 1.0], model="usa",
                           diffusion=D, atol=1e-20, rtol=1e-12)
        growth = abs(sol.coefficients[1, 1]) / abs(sol.coefficients[0, 1])
        assert np.sign(math.log(growth)) == sign
        assert math.log(growth) == pytest.approx(iv(1, beta) / beta - D, rel=1e-8)


def test_diffusion_is_recorded_and_checked():
    sol = solve_circle(lambda th: 1 + 0.1 * np.cos(th), 2.0, 0.1, model="usa", diffusion=0.3)
    assert "diffusion=0.3" in repr(sol)
    with pytest.raises(ArgumentError, match="diffusion"):
        solve_circle(lambda th: 1 + 0.1 * np.cos(th), 2.0, 0.1, diffusion=-1.0)
