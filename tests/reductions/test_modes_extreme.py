"""Growth rates and the most unstable degree at any finite beta, against references that
use no Bessel routine: the exact finite formula of half-integer orders (odd d), Hankel's
expansion (even d, large beta), Amos's bounds of Bessel ratios, and an integer criterion
for the most unstable degree at huge beta."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import ive

from transformer_pde.errors import ArgumentError
from transformer_pde.reductions.modes import (EXHAUSTIVE_BETA, log_ive, mode_growth_rate,
                                              most_unstable_degree)

BIG = [1e3, 1e6, 1e10, 1e12, 1e100, 1e300, 1e308, float(np.finfo(float).max)]


# --------------------------------------------------------------- references
def half_order_scaled(m: int, z: float) -> Decimal:
    r""":math:`\sqrt{2\pi z}\,e^{-z} I_{m+1/2}(z)` exactly (to the decimal precision set by
    the caller): :math:`\sum_k (-1)^k c_k + (-1)^{m+1} e^{-2z}\sum_k c_k`,
    :math:`c_k = \frac{(m+k)!}{k!(m-k)!(2z)^k}` (DLMF 10.49.8), the sums in fractions."""
    zf = Fraction(z)
    minus = plus = Fraction(0)
    for k in range(m + 1):
        c = Fraction(math.factorial(m + k), math.factorial(k) * math.factorial(m - k))
        c /= (2 * zf) ** k
        minus += (-1) ** k * c
        plus += c
    tail = (Decimal(-2) * Decimal(zf.numerator) / Decimal(zf.denominator)).exp()
    return (Decimal(minus.numerator) / Decimal(minus.denominator)
            + (-1) ** (m + 1) * tail * Decimal(plus.numerator) / Decimal(plus.denominator))


def rate_odd_d(beta: float, d: int, ell: int, model: str) -> float:
    r"""Exact :math:`\lambda_\ell` for odd :math:`d = 2m+3` (:math:`\nu = m+\frac12`):
    SA :math:`\frac{L}{\beta}\frac{S_{m+\ell}}{S_m}`, USA with ``shift=beta``
    :math:`\frac{L}{\beta}\frac{(2m+1)!!}{2}\beta^{-(m+1)} S_{m+\ell}` (the
    :math:`\sqrt\pi` of :math:`\Gamma(\nu+1)` cancels), :math:`L = \ell(\ell+d-2)`,
    :math:`S_j = \sqrt{2\pi\beta}\,e^{-\beta}I_{j+1/2}(\beta)`."""
    m = (d - 3) // 2
    # the two sums cancel to ~z^(j+1) from terms ~(2j)!/(j! (2z)^j): (2j + 2) log10(2j/z)
    digits = 80 + int((2 * (m + ell) + 2) * math.log10(2 * (m + ell) / beta + 2))
    with localcontext() as ctx:
        ctx.prec = digits
        b = Decimal(Fraction(beta).numerator) / Decimal(Fraction(beta).denominator)
        front = Decimal(ell * (ell + d - 2)) / b
        top = half_order_scaled(m + ell, beta)
        if model == "sa":
            return float(front * top / half_order_scaled(m, beta))
        dfact = math.prod(range(2 * m + 1, 0, -2))
        return float(front * Decimal(dfact) / 2 / b ** (m + 1) * top)


def hankel_scaled(mu: float, beta: float, terms: int = 25) -> Fraction:
    r""":math:`\sqrt{2\pi\beta}\,e^{-\beta}I_\mu(\beta) \approx \sum_{k<K} (-1)^k a_k(\mu)
    \beta^{-k}`, :math:`a_k = \prod_{j\le k}(4\mu^2 - (2j-1)^2)/(k!\,8^k)` (DLMF 10.40.1).
    For :math:`\mu \le 20`, :math:`\beta \ge 10^3` the terms fall by at least
    :math:`(4\mu^2 + (2k)^2)/(8k\beta) < 0.3` each, so 25 terms leave below
    :math:`10^{-17}` relative, and the neglected :math:`e^{-2\beta}` part is below
    :math:`10^{-800}`."""
    m4 = Fraction(4) * Fraction(mu) ** 2
    b = Fraction(beta)
    total, term = Fraction(0), Fraction(1)
    for k in range(terms):
        total += term
        term *= -(m4 - (2 * k + 1) ** 2) / (8 * (k + 1) * b)
    return total


def amos_log_bounds(beta: float, d: int, ell: int) -> tuple[float, float]:
    r"""Bounds of :math:`\log(I_{\nu+\ell}(\beta)/I_\nu(\beta))` from Amos (1974):
    for :math:`\mu \ge 0`, :math:`\frac{\beta}{\mu+1+\sqrt{(\mu+1)^2+\beta^2}} \le
    \frac{I_{\mu+1}}{I_\mu} \le \frac{\beta}{\mu+\frac12+\sqrt{(\mu+\frac12)^2+\beta^2}}`,
    i.e. :math:`-\mathrm{asinh}((\mu+1)/\beta) \le \log\frac{I_{\mu+1}}{I_\mu} \le
    -\mathrm{asinh}((\mu+\frac12)/\beta)`, summed over :math:`\mu = \nu, \dots,
    \nu+\ell-1`."""
    nu = d / 2 - 1
    mus = nu + np.arange(ell)
    return (-float(np.sum(np.arcsinh((mus + 1) / beta))),
            -float(np.sum(np.arcsinh((mus + 0.5) / beta))))


def degree_by_integer_criterion(beta: float, d: int) -> int:
    r"""For :math:`\beta \ge 10^{30}`: with :math:`A = 2\ell+d-1`, :math:`B = \ell(\ell+d-2)`,
    :math:`\log\frac{\lambda_{\ell+1}}{\lambda_\ell} = \frac AB - \frac{A^2}{2B^2}
    - \frac{A}{2\beta} + O(\beta^{-3/2})` (Hankel: :math:`\log I_{\mu+1} - \log I_\mu =
    -\frac{2\mu+1}{2\beta} + O(\beta^{-3/2})` at :math:`\mu \sim \sqrt{2\beta}`), whose slope
    is about :math:`-2/\beta`, so the error moves the root by :math:`O(\beta^{-1/2})`:
    :math:`\ell^*` is the first :math:`\ell` with :math:`\beta(2B - A) \le B^2`, in exact
    rationals."""
    b = Fraction(beta)

    def falling(ell: int) -> bool:
        A, B = 2 * ell + d - 1, ell * (ell + d - 2)
        return b * (2 * B - A) <= B * B

    # the expansion holds where A/B ~ 2/l is small: bracket around sqrt(2 beta)
    lo, hi = math.isqrt(int(2 * b)) // 2, 2 * math.isqrt(int(2 * b)) + d
    assert not falling(lo) and falling(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if falling(mid) else (mid, hi)
    return hi


# --------------------------------------------------------------- against references
@pytest.mark.parametrize("beta", [1e-300, 1e-10, 1e-2, 0.7, 1.99, 2.01, 5.0, 59.0, 61.0, 1e3,
                                  1e6, 1e12, 1e300, 1e308])
@pytest.mark.parametrize("d", [3, 5, 9])
def test_sa_rates_equal_the_exact_half_order_formula(beta, d):
    # at beta = 1e-300 scipy's ive underflowed to 0 and the rates with it (lambda_1 is
    # (d-1)/d there); the power series in logarithms answers up to beta = 2
    # scipy's ive is good to ~3e-14 relative below the Debye radius, Debye's expansion to
    # ~1e-15 beyond: 1e-13 relative
    ells = [1, 2, 5, 17]
    got = mode_growth_rate(beta, d, ells)
    want = [rate_odd_d(beta, d, ell, "sa") for ell in ells]
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("beta", [1e-100, 1e-5, 0.7, 5.0, 61.0, 1e3, 1e6, 1e100])
@pytest.mark.parametrize("d", [3, 5])
def test_usa_rates_equal_the_exact_half_order_formula(beta, d):
    # the log of the rate is ~ -230 (m + 2) at beta = 1e100: 1e-16 of that is 1e-13
    ells = [1, 3, 12]
    got = mode_growth_rate(beta, d, ells, model="usa", shift=beta)
    want = [rate_odd_d(beta, d, ell, "usa") for ell in ells]
    np.testing.assert_allclose(got, want, rtol=2e-13)


@pytest.mark.parametrize("beta", [1e3, 1e6, 1e12, 1e300, 1e308])
@pytest.mark.parametrize("d", [2, 4, 6])
def test_even_d_rates_equal_hankels_expansion(beta, d):
    nu = d / 2 - 1
    ells = [1, 2, 7]
    want = [ell * (ell + d - 2) / beta
            * float(hankel_scaled(ell + nu, beta) / hankel_scaled(nu, beta)) for ell in ells]
    np.testing.assert_allclose(mode_growth_rate(beta, d, ells), want, rtol=1e-14)


@pytest.mark.parametrize("beta", BIG[2:])
def test_huge_beta_is_finite_and_right(beta):
    # the issue: NaN from beta ~ 1e10 on (scipy's ive); lambda_l = L/beta (1 - L/(2 beta)
    # + O((L/beta)^2)) with L = l(l + d - 2) (Hankel), here L/beta <= 7e-8
    for d in (2, 3, 64):
        ells = np.array([1, 2, 9])
        got = mode_growth_rate(beta, d, ells)
        L = ells * (ells + d - 2.0)
        assert np.all(np.isfinite(got)) and np.all(got > 0)
        np.testing.assert_allclose(got, (L / math.sqrt(beta)) / math.sqrt(beta)
                                   * (1 - L / (2 * beta)), rtol=4e-15 + 10 * (639 / beta) ** 2)


def test_log_ive_against_the_exact_half_order_formula():
    # log(e^-z I_{m+1/2}(z)) to 1e-16 times the size of the log, on both sides of the
    # Debye radius and where scipy's ive is NaN (z >~ 1e9) or underflows (m >> z)
    for z in (0.5, 20.0, 59.0, 61.0, 1e3, 1e9, 1e10, 1e15, 1e300):
        for m in (0, 3, 30, 300 if z <= 1e3 else 40):     # exact sums stay small
            digits = 60 + int(2 * m * math.log10(2 * m / z + 2))
            with localcontext() as ctx:
                ctx.prec = digits
                exact = half_order_scaled(m, z) / (2 * Decimal(math.pi) * Decimal(z)).sqrt()
                want = float(exact.ln())
            got = float(log_ive(m + 0.5, z))
            assert abs(got - want) <= 5e-14 + 1e-15 * abs(want), (z, m)   # ~4 ulps


def test_most_unstable_degree_against_all_degrees_in_floating_point():
    # beyond EXHAUSTIVE_BETA the decimal bisection; the reference compares every degree
    # up to 2 beta + 10 with scipy's ive (accurate to ~1e-16 here), where neighbours of
    # l* differ by ~1/beta >> that (the margin is checked)
    for beta in (1.7e4, 3.3e4, 1e5):
        for d in (2, 3, 10):
            nu = d / 2 - 1
            ell = np.arange(1, math.ceil(2 * beta) + 11, dtype=float)
            rates = ell * (ell + d - 2) / beta * ive(ell + nu, beta) / ive(nu, beta)
            k = int(np.argmax(rates))
            assert sorted(rates)[-2] < rates[k] * (1 - 1e-12)
            assert beta > EXHAUSTIVE_BETA
            assert most_unstable_degree(beta, d) == k + 1
            assert most_unstable_degree(beta, d, model="usa") == k + 1


@pytest.mark.parametrize("beta", [1e30, 3.7e45, 1e100, 1e300, 1e308,
                                  float(np.finfo(float).max)])
@pytest.mark.parametrize("d", [2, 3, 1000])
def test_most_unstable_degree_at_huge_beta(beta, d):
    # the issue: NumPy's "Maximum allowed size exceeded" at beta = 1e300
    got = most_unstable_degree(beta, d)
    assert isinstance(got, int)
    assert got == degree_by_integer_criterion(beta, d)


@pytest.mark.parametrize("call", [
    lambda b: mode_growth_rate(b, 3, 1), lambda b: mode_growth_rate(b, 3, [1, 2], model="usa"),
    lambda b: most_unstable_degree(b, 3)])
@pytest.mark.parametrize("beta", [math.inf, -math.inf, math.nan, -1.0, -1e300])
def test_non_finite_or_negative_beta_is_refused(call, beta):
    with pytest.raises(ArgumentError, match="beta"):
        call(beta)


# --------------------------------------------------------------- fuzz
@settings(max_examples=60, deadline=None)
@given(x=st.floats(-300.0, 308.25), d=st.integers(2, 400), ell=st.integers(1, 60),
       step=st.floats(0.01, 3.0))
def test_fuzz_rates_are_finite_bounded_and_monotone(x, d, ell, step):
    beta = min(10.0 ** x, float(np.finfo(float).max))
    lam = mode_growth_rate(beta, d, ell)
    if ell == 1:
        assert lam > 0.0      # lambda_1 is between (d-1)/beta and (d-1)/d: never underflows
    assert math.isfinite(lam) and lam >= 0.0
    log_front = math.log(ell / math.sqrt(beta)) + math.log((ell + d - 2) / math.sqrt(beta))
    lo, hi = amos_log_bounds(beta, d, ell)
    if lam > 1e-290:     # not underflowed: Amos's bounds, to rounding of the logs
        slack = 1e-13 * (1.0 + abs(log_front) + abs(lo))
        assert log_front + lo - slack <= math.log(lam) <= log_front + hi + slack
    # SA lambda_1 = (d-1) I_{nu+1}/(beta I_nu) decreases in beta
    beta2 = min(beta * 10.0 ** step, float(np.finfo(float).max))
    assert mode_growth_rate(beta2, d, 1) <= mode_growth_rate(beta, d, 1) * (1 + 1e-13)
    # USA lambda_l = L Gamma(nu+1) 2^nu I_{l+nu}(beta)/beta^{nu+1} increases in beta
    if beta2 <= 600.0:
        assert (mode_growth_rate(beta2, d, ell, model="usa")
                >= mode_growth_rate(beta, d, ell, model="usa") * (1 - 1e-13))
    # the direct formula where scipy's ive is accurate
    nu = d / 2 - 1
    if 1e-3 <= beta <= 1e3 and ell + nu <= 200:
        with np.errstate(invalid="ignore", divide="ignore", under="ignore"):
            direct = ell * (ell + d - 2) / beta * ive(ell + nu, beta) / ive(nu, beta)
        if math.isfinite(direct) and direct > 1e-290:
            assert lam == pytest.approx(direct, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(x=st.floats(-2.0, 7.0), d=st.integers(2, 300))
def test_fuzz_most_unstable_degree_is_a_maximum(x, d):
    beta = 10.0 ** x
    k = most_unstable_degree(beta, d)
    around = mode_growth_rate(beta, d, [max(k - 1, 1), k, k + 1])
    assert around[1] >= around[0] * (1 - 1e-12) and around[1] >= around[2] * (1 - 1e-12)
    if k > 1:
        assert around[1] > around[0] * (1 - 1e-12)
