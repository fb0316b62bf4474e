"""The closed-form hitting time of the post-LN equiangular flow."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad

from transformer_pde.errors import ArgumentError
from transformer_pde.reductions.equiangular_flow import equiangular
from transformer_pde.reductions.hitting import equiangular_time

ORACLE = {"sa": {0.5: 5.220213, 2.0: 5.458394, 5.0: 9.544329, 9.0: 178.730930},
          "usa": {0.5: 3.804596, 2.0: 1.880417, 5.0: 0.974607, 9.0: 0.685988}}


@pytest.mark.parametrize("model", ["sa", "usa"])
@pytest.mark.parametrize("beta", [0.5, 2.0, 5.0, 9.0])
def test_oracle_values(model, beta):
    # six decimals, as the values are quoted
    t = equiangular_time(beta, 32, 0.0, 1 - 1e-3, model=model)
    assert abs(t - ORACLE[model][beta]) <= 5e-7


def rate(rho, beta, n, model):
    """The post-LN rho' written directly from its definition (no rescaling)."""
    num = math.exp(beta * rho) * (1 - rho) * (1 + (n - 1) * rho)
    den = math.exp(beta) + (n - 1) * math.exp(beta * rho) if model == "sa" else n
    return 2 * num / den


@pytest.mark.parametrize("model", ["sa", "usa"])
@pytest.mark.parametrize("n, beta, rho0, rho", [(3, 1.0, -0.4, 0.2), (16, 6.0, 0.0, 0.9),
                                                (8, 3.0, 0.5, 0.999), (2, 2.0, -0.9, 0.0)])
def test_equals_quadrature_of_the_ode(model, n, beta, rho0, rho):
    # an independent reference: t = int drho / rho' by adaptive quadrature (rel. 1e-12)
    ref, _ = quad(lambda r: 1.0 / rate(r, beta, n, model), rho0, rho, epsabs=0, epsrel=1e-13,
                  limit=200)
    assert equiangular_time(beta, n, rho0, rho, model=model) == pytest.approx(ref, rel=1e-11)


def test_beta_zero_law_vectorised():
    n, rho0 = 5, -0.1
    rho = np.array([[0.0, 0.5], [0.9, 1 - 1e-9]])
    t = equiangular_time(0.0, n, rho0, rho)
    assert t.shape == rho.shape
    want = 0.5 * np.log(((1 + (n - 1) * rho) / (1 - rho)) / ((1 + (n - 1) * rho0) / (1 - rho0)))
    np.testing.assert_allclose(t, want, rtol=1e-14)
    np.testing.assert_allclose(equiangular_time(0.0, n, rho0, rho, model="usa"), want, rtol=1e-14)


def test_shift_scales_usa_time():
    t0 = equiangular_time(4.0, 8, 0.0, 0.9, model="usa")
    t1 = equiangular_time(4.0, 8, 0.0, 0.9, model="usa", shift=2.0)
    assert t1 == pytest.approx(math.exp(2.0) * t0, rel=1e-13)


def test_cancellation_falls_back_to_quadrature():
    # rho just above rho0: t = (rho - rho0) / rho'(rho0) to first order
    beta, n, rho0, d = 5.0, 8, 0.2, 1e-10
    t = equiangular_time(beta, n, rho0, rho0 + d)
    assert t == pytest.approx(d / rate(rho0 + d / 2, beta, n, "sa"), rel=1e-6)


def test_large_beta_uses_quadrature_and_matches_the_ode():
    beta, n, rho0 = 700.0, 4, 0.99
    rho = np.array([0.995, 0.999, 1 - 1e-8])
    t = equiangular_time(beta, n, rho0, rho, model="usa", shift=beta)
    sol = equiangular(beta, n, rho0, t, model="usa", shift=beta)
    np.testing.assert_allclose(sol.rho, rho, rtol=0, atol=1e-12)
    sa = equiangular_time(beta, n, rho0, rho)       # SA: same rate near rho = 1, finite
    assert np.all(np.isfinite(sa)) and np.all(np.diff(sa) > 0)


def test_special_values():
    assert equiangular_time(2.0, 4, 0.3, 0.3) == 0.0
    assert equiangular_time(2.0, 4, 0.3, 1.0) == math.inf
    assert equiangular_time(2.0, 4, -1 / 3, 0.0) == math.inf
    assert equiangular_time(2.0, 4, 1.0, 1.0) == 0.0
    assert equiangular_time(1e4, 4, 0.0, 0.5) == math.inf       # beyond the float range


@pytest.mark.parametrize("args, kwargs, name", [
    ((2.0, 4, 0.3, 0.2), {}, "rho"), ((2.0, 4, 0.3, 1.5), {}, "rho"),
    ((2.0, 4, 0.3, float("nan")), {}, "rho"), ((2.0, 4, -0.5, 0.2), {}, "rho0"),
    ((-2.0, 4, 0.3, 0.5), {}, "beta"), ((2.0, 1, 0.3, 0.5), {}, "n"),
    ((2.0, 4, 0.3, 0.5), {"model": "x"}, "model"), ((2.0, 4, 0.3, 0.5), {"shift": 1.0}, "shift"),
])
def test_argument_errors(args, kwargs, name):
    with pytest.raises(ArgumentError, match=name):
        equiangular_time(*args, **kwargs)
