"""Particles against the PDE on the circle: the convergence study on the sweep engine."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde.errors import ArgumentError
from transformer_pde.meanfield.distance import circle_quantile
from transformer_pde.meanfield.study import convergence_study, fit_rate

pytest.importorskip("xarray")


def _density(th):
    return 1.0 + 0.5 * np.cos(th) + 0.3 * np.sin(2 * th)


def test_random_tokens_converge_at_rate_one_half():
    # i.i.d. tokens: W1(mu^N_t, mu_t) ~ N^{-1/2} (the sampling error carried by a flow that
    # is Lipschitz in W1); the fit of 6 runs (N = 100, 400, 2000; 2 draws, fixed seed)
    # has a standard error near 0.1, so the slope is checked against -1/2 within 0.1 and
    # within three standard errors
    res = convergence_study(_density, 1.0, 0.5, Ns=(100, 400, 2000), seeds=2, seed=0,
                            sampling="random", dt=0.1)
    assert res.w1.shape == (3, 2) and np.all(np.isfinite(res.w1))
    assert abs(res.slope + 0.5) < 0.1 and abs(res.slope + 0.5) < 3 * res.slope_se
    assert set(np.unique(res.results["cell_status"].values)) == {1}


def test_quantile_tokens_converge_faster():
    # tokens at the quantiles (i + 1/2)/N start at W1 = 2 pi / (4 N) from mu0 (each token
    # is the median of its cell of mass 1/N, cost 2 pi/(4N) on the circle up to O(N^-2));
    # the flow keeps that order: slope -1
    res = convergence_study(_density, 1.0, 0.5, Ns=(100, 400, 2000), seeds=2,
                            sampling="quantile", dt=0.1)
    assert res.slope < -0.9
    np.testing.assert_allclose(res.w1[:, 0], 2 * np.pi / (4 * res.Ns), rtol=0.05)


def test_usa_model_runs():
    res = convergence_study(_density, 1.0, 0.2, Ns=(50, 200), seeds=2, model="usa",
                            sampling="quantile", dt=0.05)
    assert np.all(np.isfinite(res.w1)) and res.slope < -0.8


def test_fit_rate_recovers_an_exact_power_law():
    N = np.array([10, 100, 1000, 10, 100, 1000], float)
    slope, se = fit_rate(N, 3.0 * N ** -0.5)
    assert slope == pytest.approx(-0.5, abs=1e-12) and se < 1e-12
    rng = np.random.default_rng(0)
    noisy = 3.0 * N ** -0.5 * np.exp(0.1 * rng.normal(size=N.size))
    slope, se = fit_rate(N, noisy)
    # ordinary least squares reference
    A = np.column_stack([np.ones(N.size), np.log(N)])
    coef, res, *_ = np.linalg.lstsq(A, np.log(noisy), rcond=None)
    cov = res[0] / (N.size - 2) * np.linalg.inv(A.T @ A)
    assert slope == pytest.approx(coef[1], abs=1e-12)
    assert se == pytest.approx(np.sqrt(cov[1, 1]), rel=1e-10)


def test_circle_quantile_inverts_the_cdf():
    th = np.linspace(0, 2 * np.pi, 32, endpoint=False)
    rho = _density(th)
    m = np.linspace(0, 1, 101)
    ang = circle_quantile(th, rho, m)
    assert np.all(np.diff(ang) >= 0) and ang[0] == 0 and ang[-1] == pytest.approx(2 * np.pi)
    # the uniform density: F^{-1}(m) = 2 pi m
    np.testing.assert_allclose(circle_quantile(th, np.ones(32), m), 2 * np.pi * m,
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    ({"Ns": (100,)}, "Ns"), ({"Ns": (100, 100)}, "Ns"), ({"Ns": (1, 10)}, "Ns"),
    ({"sampling": "grid"}, "sampling"), ({"model": "relu"}, "model"), ({"dt": 0.0}, "dt"),
    ({"refine": 0}, "refine"), ({"seeds": 0}, "seeds")])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        convergence_study(_density, 1.0, 0.5, **kwargs)


@pytest.mark.parametrize("model", ["sa", "usa"])
def test_the_harmonic_field_gives_the_direct_study(model):
    # the same draws (same grid seed) run with the exact harmonic field and with the direct
    # sum.  On the circle the two fields agree to harmonic_tol = 1e-12; at the RK4 stage
    # points off it the harmonic field is the field at the radial projection, so the two
    # runs are two RK4 discretisations of one flow on the circle and differ by O(dt^4)
    # (measured: max token difference 2e-12 at dt = 0.0125, 16x more at each doubling of
    # dt).  W1 is 1-Lipschitz in the tokens: the W1 values (~1e-1) agree to 1e-10, which a
    # wrong mode or sign in the harmonic field (an O(1) field error) could not meet
    from transformer_pde import FieldOptions

    kw = dict(Ns=(40, 160), seeds=2, seed=3, model=model, sampling="random", dt=0.0125)
    direct = convergence_study(_density, 1.0, 0.3, field=FieldOptions(backend="numpy"), **kw)
    harmonic = convergence_study(_density, 1.0, 0.3, **kw,
                                 field=FieldOptions(method="harmonic", harmonic_tol=1e-12))
    assert np.all(direct.w1 > 1e-3)
    np.testing.assert_allclose(harmonic.w1, direct.w1, rtol=0, atol=1e-10)
    # ... and the runs did use another field: the values are not bit-for-bit the same
    assert np.any(harmonic.w1 != direct.w1)
    assert harmonic.slope == pytest.approx(direct.slope, abs=1e-8)



def test_the_field_method_is_part_of_the_cell_identity():
    # a sweep store of the harmonic study is not resumed as the direct one; without field
    # options the identity is the one of studies written before the option existed
    from transformer_pde import FieldOptions
    from transformer_pde.meanfield.study import CircleParticleCell

    base = CircleParticleCell((1.0, 1.0), (1.0, 1.0), 1.0, 0.5, 0.1)
    harmonic = CircleParticleCell((1.0, 1.0), (1.0, 1.0), 1.0, 0.5, 0.1,
                                  field=FieldOptions(method="harmonic"))
    assert "field" not in base.config()
    assert harmonic.config()["field"] == {"method": "harmonic", "harmonic_tol": None,
                                          "dtype": None}
    numba = CircleParticleCell((1.0, 1.0), (1.0, 1.0), 1.0, 0.5, 0.1,
                               field=FieldOptions(backend="numba"))
    assert numba.config()["field"]["method"] == "direct"


def test_a_bad_field_is_refused():
    from transformer_pde import FieldOptions
    from transformer_pde.errors import ArgumentTypeError

    with pytest.raises(ArgumentTypeError, match="field"):
        convergence_study(_density, 1.0, 0.5, field="harmonic")
    # kind="softmax" refuses Sinkhorn options before any run
    with pytest.raises(ArgumentError, match="sinkhorn_tol"):
        convergence_study(_density, 1.0, 0.5, field=FieldOptions(sinkhorn_tol=1e-6))
