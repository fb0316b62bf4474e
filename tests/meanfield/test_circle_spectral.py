"""The Fourier machinery of the circle solver (:mod:`transformer_pde.meanfield.spectral`)
against direct sums."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import iv

from transformer_pde.meanfield.spectral import (CircleField, as_complex, as_real, evaluate,
                                                kernel_coefficients, pad, tail_share)


def random_coefficients(rng, n, rows=()):
    c = rng.normal(size=(*rows, n)) + 1j * rng.normal(size=(*rows, n))
    c *= np.exp(-0.5 * np.arange(n))
    c[..., 0] = 1 / (2 * np.pi)
    return c


@pytest.mark.parametrize("m", [5, 12, 19, 20, 64])
def test_evaluate_is_the_trigonometric_sum_on_any_grid(rng, m):
    # m < 2n - 1 folds the modes above the Nyquist frequency onto the grid
    c = random_coefficients(rng, 10, (3,))
    th = 2 * np.pi * np.arange(m) / m
    k = np.arange(1, 10)
    direct = c[:, :1].real + 2 * np.real(c[:, 1:] @ np.exp(1j * np.outer(k, th)))
    np.testing.assert_allclose(evaluate(c, m), direct, atol=1e-13)


def test_pad_is_exact_interpolation(rng):
    c = random_coefficients(rng, 12)
    fine = evaluate(pad(c, 48), 96)
    np.testing.assert_allclose(fine[::2], evaluate(c, 48), atol=1e-13)


def test_tail_share():
    c = np.zeros(30, complex)
    c[0] = 1.0
    assert tail_share(c) == 0.0
    c[20] = 1e-6            # in the top third of 30 modes (k >= 20)
    assert tail_share(c) == pytest.approx(np.sqrt(2e-12 / (1 + 2e-12)), rel=1e-12)
    assert tail_share(c, 40) == pytest.approx(0.0, abs=0)   # k = 20 is below 2 * 40 / 3
    assert tail_share(np.zeros(4)) == np.inf


def test_real_view_round_trip(rng):
    c = random_coefficients(rng, 7)
    np.testing.assert_array_equal(as_complex(as_real(c)), c)


def test_kernel_coefficients_scale_out_exp_beta():
    w, a = kernel_coefficients(3.0, 6)
    np.testing.assert_allclose(w * np.exp(3.0), 2 * np.pi * iv(np.arange(6), 3.0), rtol=1e-14)
    np.testing.assert_allclose(a, w / 3.0, rtol=1e-15)
    w0, a0 = kernel_coefficients(0.0, 4)
    np.testing.assert_array_equal(w0, [2 * np.pi, 0, 0, 0])
    np.testing.assert_array_equal(a0, [0, np.pi, 0, 0])


def test_usa_field_is_the_quadratic_sum(rng):
    # d mu_k / d tau = (2 pi k / b) sum_m m ive_m mu_m mu_{k-m}, summed over |m| < n directly
    n, beta = 12, 1.7
    c = random_coefficients(rng, n)
    full = {k: (c[k] if k >= 0 else np.conj(c[-k])) for k in range(-n + 1, n)}
    ive = {m: iv(abs(m), beta) * np.exp(-beta) for m in full}
    ref = np.array([2 * np.pi * k / beta * sum(m * ive[m] * full[m] * full[k - m]
                                               for m in full if k - m in full)
                    for k in range(n)])
    got = as_complex(CircleField(n, beta, "usa")(0.0, as_real(c)))
    assert got[0] == 0.0
    np.testing.assert_allclose(got, ref, atol=1e-15)


def test_sa_field_conserves_mass_exactly(rng):
    c = random_coefficients(rng, 16)
    out = as_complex(CircleField(16, 4.0, "sa")(0.0, as_real(c)))
    assert out[0] == 0.0 and np.all(np.isfinite(out))
