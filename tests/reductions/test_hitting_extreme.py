"""Hitting times of the equiangular flow at extreme beta: in logarithms, never a silent 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

import transformer_pde.reductions.hitting as hitting
from transformer_pde.reductions.hitting import equiangular_time


def watson(beta: float, n: int, u0: float, terms: int = 12) -> float:
    r""":math:`J = \int_0^\infty e^{-s} g(u_0 - s/\beta)\,ds = \sum_k (-1)^k g^{(k)}(u_0)
    \beta^{-k}` (Watson's lemma), :math:`g(w) = \frac{1}{2n}\big(\frac1w +
    \frac{n-1}{n-(n-1)w}\big)`, so :math:`g^{(k)}(w) = \frac{k!}{2n}\big(\frac{(-1)^k}{w^{k+1}}
    + \frac{(n-1)^{k+1}}{(n-(n-1)w)^{k+1}}\big)`; the terms fall like
    :math:`(k/(\beta u_0))^k`, below :math:`10^{-20}` after 12 terms for
    :math:`\beta u_0 \ge 5000`."""
    total = 0.0
    for k in range(terms):
        gk = math.factorial(k) / (2 * n) * ((-1) ** k / u0 ** (k + 1)
                                            + (n - 1) ** (k + 1) / (n - (n - 1) * u0) ** (k + 1))
        total += (-1) ** k * gk * (1.0 / beta) ** k
    return total


@pytest.mark.parametrize("beta", [1e4, 1e6, 1e12, 1e300])
def test_usa_time_at_huge_beta_equals_watsons_series(beta):
    # shift = beta - beta u0 + 20 makes the time n e^20 J / beta finite (the exponents are
    # summed largest first, so 20 survives at beta = 1e12); the path leaves
    # u0 = 0.5 for u = 1e-5 (beta (u0 - u) > 800: the lower end adds below e^-800)
    n, u0, u = 6, 0.5, 1e-5
    shift = beta - beta * u0 + 20.0
    t = equiangular_time(beta, n, 1 - u0, 1 - u, model="usa", shift=shift)
    lead = (shift - beta) + beta * u0      # 20, or 0 at 1e300 where the shift rounds it off
    want = n * math.exp(lead) * watson(beta, n, u0) / beta
    assert t == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("beta", [1e6, 1e12, 1e300, 1e308])
def test_sa_time_past_the_float_range_is_inf_not_zero(beta):
    # from rho0 = 0 the softmax time is ~ e^{beta}/beta: beyond the float range; the old
    # quadrature missed the peak of width 1/beta and answered 0
    t = equiangular_time(beta, 6, 0.0, [0.5, 0.9])
    assert np.all(t == math.inf)


@pytest.mark.parametrize("model", ["sa", "usa"])
@pytest.mark.parametrize("beta, u0, u", [(1700.0, 1.0, 0.5), (1700.0, 1.0, 1e-200),
                                         (2000.0, 0.9, 1e-100), (1650.0, 1.0, 0.999)])
def test_peak_form_equals_the_quadrature_where_both_hold(monkeypatch, model, beta, u0, u):
    # the quadrature in log u (with breakpoints at the peak; without them it returned 0 for
    # u = 1e-200) and the peak form in s = beta (u0 - u) agree to 1e-12 relative; shift
    # keeps the USA time finite, the SA times are compared through their logarithms
    shift = beta - beta * u0 + 20.0 if model == "usa" else 0.0
    peak = equiangular_time(beta, 6, 1 - u0, 1 - u, model=model, shift=shift)
    monkeypatch.setattr(hitting, "PEAK_FORM_MIN", math.inf)
    quad = equiangular_time(beta, 6, 1 - u0, 1 - u, model=model, shift=shift)
    if model == "usa":
        assert peak == pytest.approx(quad, rel=1e-12)
    else:
        assert peak == quad == math.inf
