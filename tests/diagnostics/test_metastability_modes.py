"""circle_modes and fit_mode_growth of transformer_pde.diagnostics.metastability."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde.diagnostics.metastability import (ModeGrowth, circle_modes,
                                                       fit_mode_growth)
from transformer_pde.errors import ArgumentError


def test_circle_modes_are_the_fourier_coefficients():
    # against the defining sum, with masses, and equispaced tokens (c_k = 0 unless N | k)
    rng = np.random.default_rng(1)
    theta = rng.uniform(-np.pi, np.pi, (4, 50))
    X = np.stack([np.cos(theta), np.sin(theta)], axis=-1) * 2.5   # directions only count
    w = rng.random(50)
    c = circle_modes(X, [1, 3, -2], weights=w)
    w = w / w.sum()
    ref = np.stack([(np.exp(-1j * k * theta) * w).sum(axis=1) for k in (1, 3, -2)], axis=-1)
    np.testing.assert_allclose(c, ref, rtol=0, atol=1e-14)
    ang = 2 * np.pi * np.arange(7) / 7 + 0.3
    c = circle_modes(np.column_stack([np.cos(ang), np.sin(ang)]), np.arange(8))
    np.testing.assert_allclose(np.abs(c[0]), [1, 0, 0, 0, 0, 0, 0, 1], atol=1e-14)


def test_fit_recovers_exact_exponentials_and_the_window():
    # modes c_k(t) = a_k e^{i phi} e^{lambda_k t} per draw are fitted exactly (to 1e-10);
    # the default window stops at the last time every rms amplitude is <= amplitude
    rng = np.random.default_rng(2)
    t = np.linspace(0.0, 1.0, 21)
    lam = np.array([1.0, 3.0, -0.5])
    a = 1e-3 * rng.random((6, 1, 3)) * np.exp(2j * np.pi * rng.random((6, 1, 3)))
    modes = a * np.exp(lam * t[:, None])
    fit = fit_mode_growth(t, modes, amplitude=1.0)
    assert isinstance(fit, ModeGrowth) and fit.draws == 6
    np.testing.assert_allclose(fit.rates, lam, rtol=0, atol=1e-10)
    np.testing.assert_allclose(fit.stderr, 0.0, atol=1e-9)
    rms = np.sqrt((np.abs(modes) ** 2).mean(axis=0)).max(axis=1)
    assert fit.t_end == t[rms <= 1.0][-1] and fit.points == int((rms <= 1.0).sum())
    one = fit_mode_growth(t, modes[0], t_end=0.5)
    assert one.points == 11 and one.t_end == 0.5 and np.all(np.isnan(one.stderr))
    np.testing.assert_allclose(one.rates, lam, atol=1e-10)


def test_jackknife_error_matches_the_scatter_of_the_draws():
    # noisy draws: the jackknife standard error of the pooled slope is of the size of the
    # observed spread of the fitted rate over repeated independent ensembles (within a
    # factor 2: 200 repetitions give the spread to ~5%)
    rng = np.random.default_rng(3)
    t = np.linspace(0.0, 0.5, 11)

    def ensemble():
        a = rng.standard_normal((20, 1, 1)) + 1j * rng.standard_normal((20, 1, 1))
        noise = 0.3 * (rng.standard_normal((20, 11, 1)) + 1j * rng.standard_normal((20, 11, 1)))
        return (a + noise * t[:, None]) * np.exp(2.0 * t[:, None])

    fits = [fit_mode_growth(t, ensemble(), t_end=0.5) for _ in range(200)]
    spread = np.std([f.rates[0] for f in fits])
    se = np.mean([f.stderr[0] for f in fits])
    assert 0.5 < se / spread < 2.0


def test_bad_arguments_name_the_argument():
    t = np.linspace(0, 1, 5)
    modes = np.ones((5, 2), complex)
    with pytest.raises(ArgumentError, match="d = 2"):
        circle_modes(np.ones((3, 3)), [1])
    with pytest.raises(ArgumentError, match="origin"):
        circle_modes(np.zeros((3, 2)), [1])
    with pytest.raises(ArgumentError, match="ks"):
        circle_modes(np.ones((3, 2)), [1.5])
    with pytest.raises(ArgumentError, match="times"):
        fit_mode_growth([0, 1], modes[:2])
    with pytest.raises(ArgumentError, match="modes"):
        fit_mode_growth(t, np.ones((4, 2)))
    with pytest.raises(ArgumentError, match="vanish"):
        fit_mode_growth(t, np.zeros((5, 2)))
    with pytest.raises(ArgumentError, match="amplitude"):
        fit_mode_growth(t, modes, amplitude=0.5)
    with pytest.raises(ArgumentError, match="t_end"):
        fit_mode_growth(t, modes, t_end=0.3)
