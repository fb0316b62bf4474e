"""The critical noise of noisy unnormalised attention on the sphere, the transition
temperature beta* and the amplitude coefficient, against independent references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.special import gamma, iv

from transformer_pde.errors import ArgumentError
from transformer_pde.reductions.modes import mode_growth_rate
from transformer_pde.reductions.noisy import (amplitude_coefficient, critical_noise,
                                              noisy_mode_growth_rate, transition_beta,
                                              transition_kind)


def _bessel_series(nu: float, x: float) -> float:
    """I_nu(x) by its power series (DLMF 10.25.2), 60 terms: for x <= 5 the terms fall
    below 1e-40 of the sum; an evaluation independent of scipy's Bessel routines."""
    return sum(math.exp((2 * k + nu) * math.log(x / 2) - math.lgamma(k + 1)
                        - math.lgamma(k + nu + 1)) for k in range(60))


def _ratio(d: int, beta: float) -> float:
    return _bessel_series(d / 2 + 1, beta) / _bessel_series(d / 2, beta)


@pytest.mark.parametrize(("d", "quoted"), [(2, 2.446918), (3, 1.816155)])
def test_transition_beta_to_the_quoted_digits_and_to_1e_10(d, quoted):
    b = transition_beta(d)
    assert b == pytest.approx(quoted, abs=5e-7)          # six decimals, as quoted
    # the root to 1e-10: the ratio, by its own power series, crosses 1/d between
    # b - 1e-10 and b + 1e-10 (its slope there is about 0.2, so the residual of each
    # side is ~2e-11, far above the ~1e-16 rounding of the series)
    assert _ratio(d, b - 1e-10) < 1 / d < _ratio(d, b + 1e-10)


@pytest.mark.parametrize("d", [2, 3, 4, 7])
def test_the_amplitude_coefficient_changes_sign_at_transition_beta(d):
    b = transition_beta(d)
    assert abs(amplitude_coefficient(b, d)) < 1e-12
    assert amplitude_coefficient(b - 1e-3, d) > 0 > amplitude_coefficient(b + 1e-3, d)
    assert amplitude_coefficient(0.0, d) == pytest.approx(d / (d + 2), rel=1e-15)
    assert transition_kind(b - 1e-6, d) == "continuous"
    assert transition_kind(b + 1e-6, d) == "discontinuous"


@pytest.mark.parametrize("d", [2, 3, 5])
@pytest.mark.parametrize("beta", [0.5, 2.0, 4.0, 9.0])
def test_critical_coupling_is_the_papers_formula(beta, d):
    # K_# = beta^{d/2} / (2^{d/2} Gamma(d/2) I_{d/2}(beta)) with scipy's iv and gamma: the
    # library's kernel at shift 0 and sigma^2 = 1/K; 1e-13 relative (rounding of both)
    want = beta ** (d / 2) / (2 ** (d / 2) * gamma(d / 2) * iv(d / 2, beta))
    assert critical_noise(beta, d, quantity="coupling") == pytest.approx(want, rel=1e-13)
    s = critical_noise(beta, d)
    assert s * s == pytest.approx(1 / want, rel=1e-13)
    assert critical_noise(beta, d, quantity="diffusion") == pytest.approx(s * s / 2, rel=1e-15)
    # a shift c multiplies the interaction by e^{-c}: K_# by e^{c}
    assert critical_noise(beta, d, shift=beta, quantity="coupling") == pytest.approx(
        want * math.exp(beta), rel=1e-13)


@pytest.mark.parametrize("d", [2, 3, 4])
@pytest.mark.parametrize("beta", [0.0, 1.0, 2.446918, 6.0])
def test_critical_noise_is_the_root_of_the_first_modes_rate(beta, d):
    # the root in sigma of lambda_1 - sigma^2 (d-1)/2 by Brent's method on the rates:
    # agreement to 1e-12 relative (the root's tolerance); every higher degree decays there
    s = critical_noise(beta, d)
    root = brentq(lambda x: noisy_mode_growth_rate(beta, d, 1, x), 1e-3, 10 * s + 10,
                  xtol=1e-14, rtol=1e-14)
    assert root == pytest.approx(s, rel=1e-12)
    higher = noisy_mode_growth_rate(beta, d, np.arange(2, 12), s)
    assert np.all(higher < 0)
    assert noisy_mode_growth_rate(beta, d, 1, 0.99 * s) > 0 > noisy_mode_growth_rate(
        beta, d, 1, 1.01 * s)


def test_the_small_beta_limit():
    # beta -> 0: lambda_1 = (d-1)/d, so K_# = d/2 (the paper's formula's limit)
    for d in (2, 3, 6):
        assert critical_noise(0.0, d, quantity="coupling") == pytest.approx(d / 2, rel=1e-15)
        assert critical_noise(1e-8, d, quantity="coupling") == pytest.approx(d / 2, rel=1e-7)


def test_rates_without_noise_are_the_rates_of_modes():
    ell = np.arange(1, 6)
    for model in ("sa", "usa"):
        np.testing.assert_array_equal(noisy_mode_growth_rate(3.0, 3, ell, 0.0, model=model),
                                      mode_growth_rate(3.0, 3, ell, model=model))
    # the circle: k^2 (I_k/beta - sigma^2/2)
    k = np.arange(1, 5)
    want = k ** 2 * (iv(k, 2.5) / 2.5 - 0.7 ** 2 / 2)
    np.testing.assert_allclose(noisy_mode_growth_rate(2.5, 2, k, 0.7), want, rtol=1e-13)


def test_bad_arguments_name_themselves():
    with pytest.raises(ArgumentError, match="sigma"):
        noisy_mode_growth_rate(1.0, 2, 1, -0.5)
    with pytest.raises(ArgumentError, match="quantity"):
        critical_noise(1.0, 2, quantity="temperature")
    with pytest.raises(ArgumentError, match="d"):
        transition_beta(1)
    with pytest.raises(ArgumentError, match="beta"):
        amplitude_coefficient(-1.0, 2)
    with pytest.raises(ArgumentError, match="shift"):
        critical_noise(800.0, 2)            # e^{beta} out of range without a shift
