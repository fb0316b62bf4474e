"""Metastability on the circle against Bruno, Pasqualotto & Agazzi (arXiv 2410.23228):
the normalisation of their growth rates, the most unstable mode, and the rates measured
from the library's particles.

Their particles move by d theta_i/dt = -(1/N) sum_j e^{beta cos(theta_i - theta_j)}
sin(theta_i - theta_j) (unnormalised attention, Q = K = V = I, no shift) and their rates are
gamma_k = k^2 I_k(beta) / (pi beta)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import iv

import transformer_pde as tp
from transformer_pde.diagnostics.metastability import circle_modes, fit_mode_growth
from transformer_pde.integrate import Dop853
from transformer_pde.meanfield.spectral import circle_growth_rate
from transformer_pde.particles.ensemble import simulate_ensemble
from transformer_pde.reductions.modes import mode_growth_rate, most_unstable_degree

I2 = np.eye(2)


def gamma(k, beta):
    """The published gamma_k, with scipy's I_k (an independent Bessel evaluation)."""
    k = np.asarray(k, dtype=float)
    return k * k * iv(k, beta) / (np.pi * beta)


@pytest.mark.parametrize("beta", [1.0, 5.0, 7.0, 20.0])
def test_published_rates_are_the_library_rates_over_pi(beta):
    # pi gamma_k = k^2 I_k(beta)/beta is the library's USA rate (shift 0) and its SA rate
    # times I_0(beta); agreement to 1e-6 relative is what the comparison needs (both are
    # accurate to ~1e-14: this is a check of the mapping, not of the Bessel functions).
    ks = np.arange(1, 13)
    usa = mode_growth_rate(beta, 2, ks, model="usa")
    np.testing.assert_allclose(np.pi * gamma(ks, beta), usa, rtol=1e-6)
    np.testing.assert_allclose(usa, [circle_growth_rate(beta, int(k), "usa") for k in ks],
                               rtol=1e-6)
    sa = mode_growth_rate(beta, 2, ks, model="sa")
    np.testing.assert_allclose(np.pi * gamma(ks, beta) / iv(0, beta), sa, rtol=1e-6)


def test_most_unstable_mode_is_3_at_beta_5_and_4_at_beta_7():
    # the notebook's two experiments: three clusters at beta = 5, four at beta = 7
    ks = np.arange(1, 30)
    for beta, kstar in [(5.0, 3), (7.0, 4)]:
        assert int(ks[np.argmax(gamma(ks, beta))]) == kstar
        assert most_unstable_degree(beta, 2, model="usa") == kstar
        assert most_unstable_degree(beta, 2, model="sa") == kstar   # same ordering


def test_library_field_is_the_published_velocity():
    # exp attention with Q = K = V = I on the unit circle, tangential part, equals the
    # notebook's F(theta) to round-off (same time scale, no 1/beta, no softmax)
    rng = np.random.default_rng(0)
    beta, theta = 5.0, rng.uniform(0, 2 * np.pi, 300)
    X = np.column_stack([np.cos(theta), np.sin(theta)])
    v = tp.velocity(tp.Attention("exp", I2, I2, I2, beta=beta), X, backend="numpy")
    tangential = -np.sin(theta) * v[:, 0] + np.cos(theta) * v[:, 1]
    d = theta[:, None] - theta[None, :]
    F = -(np.exp(beta * np.cos(d)) * np.sin(d)).mean(axis=1)
    np.testing.assert_allclose(tangential, F, rtol=0, atol=1e-12 * np.abs(F).max())


def test_particle_growth_rates_match_the_formula():
    # 32 independent draws of N = 400 i.i.d. uniform tokens, beta = 5, DOP853 on the circle
    # to t = 0.04 (the linear phase: the rms |c_k| stays below ~0.1).  The rates fitted by
    # fit_mode_growth (pooled |c_k|^2, jackknife standard error over the draws) must lie
    # within 4 standard errors of k^2 I_k(beta)/beta for k = 1..4 (a 4-sigma band: a correct
    # implementation fails with probability ~6e-5 per mode for an unlucky seed; the seed is
    # fixed), and the standard errors must be below 5% of the rate, so that the published
    # gamma_k (a factor pi smaller) or the softmax rate (a factor I_0(5) = 27 smaller) would
    # fail by more than 13 standard errors.
    beta, N, D, ks = 5.0, 400, 32, np.arange(1, 5)
    rng = np.random.default_rng(7)
    theta = rng.uniform(0, 2 * np.pi, (D, N))
    X0 = np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    ts = np.linspace(0.0, 0.04, 9)
    ens = simulate_ensemble(tp.Attention("exp", I2, I2, I2, beta=beta), X0, t_max=0.04,
                            dt=0.005, solver=Dop853(rtol=1e-8, atol=1e-10), block="sphere",
                            saveat=tp.SaveAt(ts=ts))
    states = np.asarray(ens.states)
    modes = np.stack([circle_modes(states[:, b], ks) for b in range(D)])
    fit = fit_mode_growth(ens.times, modes, t_end=0.04)
    rates = mode_growth_rate(beta, 2, ks, model="usa")
    assert fit.draws == D and fit.points == 9
    assert np.all(fit.stderr < 0.05 * rates)
    assert np.all(np.abs(fit.rates - rates) <= 4 * fit.stderr), (fit.rates, fit.stderr)
