"""Two tokens under a common matrix noise: the cosine's diffusion and the antipodal probability."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp

from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.reductions.common_noise import (antipodal_probability,
                                                     common_noise_matrices, critical_beta,
                                                     pair_coefficients, scale_exponents)

RHO0 = np.array([-0.999, -0.9, -0.5, -0.1, 0.0, 0.3, 0.7, 0.95, 0.9999])


def pair(rho, d):
    x1 = np.zeros(d)
    x1[0] = 1.0
    x2 = np.zeros(d)
    x2[0], x2[1] = rho, math.sqrt(1.0 - rho * rho)
    return x1, x2


def attention_average(x1, x2, beta, model):
    rho = x1 @ x2
    if model == "sa":
        p = 1.0 / (1.0 + math.exp(-beta * (1.0 - rho)))
        q = 1.0 - p
    else:
        p, q = math.exp(beta) / 2, math.exp(beta * rho) / 2
    return p * x1 + q * x2, q * x1 + p * x2


# ------------------------------------------------------------------ the SDE of rho
@pytest.mark.parametrize("beta, d, sigma, drift, rho, model",
                         [(1.0, 3, 0.7, 1.0, 0.3, "sa"), (4.0, 5, 1.3, 2.0, -0.6, "sa"),
                          (0.0, 2, 0.5, 1.0, 0.8, "sa"), (1.5, 4, 0.9, 0.5, -0.2, "usa")])
def test_token_coefficients_from_the_projected_stratonovich_fields(beta, d, sigma, drift, rho,
                                                                   model):
    # Ito's formula applied to the engine's SDE dX_i = P_{X_i}(lambda A_i dt + sum_ab
    # sigma E_ab X_i o dB_ab), computed from the vector fields: Ito drift = f + 1/2 sum_k
    # DV_k V_k (central differences, step 1e-5: error ~1e-10), then
    # b = <mu_1, x_2> + <x_1, mu_2> + sum_k <V_k^1, V_k^2>, a = sum_k (<V_k^1, x_2> + <x_1, V_k^2>)^2
    x1, x2 = pair(rho, d)
    mats = common_noise_matrices(d, sigma)

    def proj(x, v):
        return v - (x @ v) * x

    def field(k, y1, y2):
        return proj(y1, mats[k] @ y1), proj(y2, mats[k] @ y2)

    a1, a2 = attention_average(x1, x2, beta, model)
    mu1, mu2 = drift * proj(x1, a1), drift * proj(x2, a2)
    b_num = a_num = 0.0
    eps = 1e-5
    for k in range(d * d):
        v1, v2 = field(k, x1, x2)
        p1, p2 = field(k, x1 + eps * v1, x2 + eps * v2)
        m1, m2 = field(k, x1 - eps * v1, x2 - eps * v2)
        mu1 = mu1 + 0.5 * (p1 - m1) / (2 * eps)
        mu2 = mu2 + 0.5 * (p2 - m2) / (2 * eps)
        b_num += v1 @ v2
        a_num += (v1 @ x2 + x1 @ v2) ** 2
    b_num += mu1 @ x2 + x1 @ mu2
    b, a = pair_coefficients(rho, beta, d, sigma, drift=drift, model=model)
    assert abs(b - b_num) < 1e-8 and abs(a - a_num) < 1e-12


@pytest.mark.parametrize("placement, beta, d, sigma, drift, rho",
                         [("token", 2.0, 3, 0.8, 1.0, 0.4), ("value", 2.0, 3, 0.8, 1.0, 0.4),
                          ("value", 0.5, 6, 1.0, 0.0, -0.5), ("value", 3.0, 4, 0.6, 2.0, 0.1)])
def test_coefficients_are_the_limit_of_the_normalised_layer(placement, beta, d, sigma, drift,
                                                            rho):
    # one residual layer x <- (x + delta) / |x + delta|, delta_i = h lambda A_i + sqrt(h)
    # sigma G c_i (G a standard Gaussian matrix shared by both tokens, c_i = x_i or A_i):
    # E[d rho] = b h + O(h^2), E[(linear part)^2] = a h exactly.  M = 400k samples; the
    # linear part (mean 0) is subtracted from d rho as a control variate, so the mean's
    # standard error is O(h); tolerance 6 standard errors (false fail < 1e-8) plus the
    # O(h) bias, bounded by 20 h = 2e-3 (the bias measured at h = 1e-3 is below 4 h).
    rng = np.random.default_rng(12)
    h, M = 1e-4, 400_000
    x1, x2 = pair(rho, d)
    a1, a2 = attention_average(x1, x2, beta, "sa")
    c1, c2 = (x1, x2) if placement == "token" else (a1, a2)
    G = rng.standard_normal((M, d, d))
    d1 = h * drift * a1 + math.sqrt(h) * sigma * (G @ c1)
    d2 = h * drift * a2 + math.sqrt(h) * sigma * (G @ c2)
    y1 = (x1 + d1) / np.linalg.norm(x1 + d1, axis=1, keepdims=True)
    y2 = (x2 + d2) / np.linalg.norm(x2 + d2, axis=1, keepdims=True)
    drho = np.einsum("mi,mi->m", y1, y2) - rho
    lin = math.sqrt(h) * sigma * ((G @ c1) @ (x2 - rho * x1) + (G @ c2) @ (x1 - rho * x2))
    b, a = pair_coefficients(rho, beta, d, sigma, placement=placement, drift=drift)
    rest = (drho - lin) / h
    assert abs(rest.mean() - b) <= 6 * rest.std() / math.sqrt(M) + 20 * h
    sq = lin ** 2 / h
    assert abs(sq.mean() - a) <= 6 * sq.std() / math.sqrt(M)


def test_coefficient_closed_forms():
    r = np.linspace(-1, 1, 11)
    b, a = pair_coefficients(r, 2.0, 3, 0.5, drift=0.0)
    assert np.allclose(b, -0.25 * r * (1 - r ** 2), atol=1e-15)
    assert np.allclose(a, 0.5 * (1 - r ** 2) ** 2, atol=1e-15)
    # value placement at beta = 0: p = q = 1/2, b = sigma^2 (1 - r^2)(d - 2 - r)/2
    b, a = pair_coefficients(r, 0.0, 5, 1.0, placement="value", drift=0.0)
    assert np.allclose(b, (1 - r ** 2) * (3 - r) / 2, atol=1e-15)
    assert np.allclose(a, (1 - r ** 2) ** 2, atol=1e-15)


# ------------------------------------------------------------------ the probability
def scale_function_ratio(beta, d, rho0, sigma, **kw):
    """P from the definition, computed another way: phi = int_0^r 2b/a by DOP853 (rtol
    1e-12) up to delta = 1e-6 from the ends, s' = e^{-phi} by QUADPACK's QAGS, and the two
    tails from the local power law s' ~ (1 -+ r)^{...} with the exponent read off 2b/a at
    the cut (relative error O(delta))."""
    delta = 1e-6

    def f(r):
        b, a = pair_coefficients(r, beta, d, sigma, **kw)
        return float(2 * b / a)

    sols = [solve_ivp(lambda r, y: [f(r)], (0.0, end), [0.0], method="DOP853", rtol=1e-12,
                      atol=1e-14, dense_output=True).sol for end in (1 - delta, -1 + delta)]

    def ds(r):
        return math.exp(-sols[0 if r >= 0 else 1](r)[0])

    lo, hi = -1 + delta, 1 - delta
    c_minus, c_plus = delta * f(lo), delta * f(hi)
    left = (quad(ds, lo, rho0, epsabs=0, epsrel=1e-11, limit=500)[0]
            + ds(lo) * delta / (1 - c_minus))
    right = (quad(ds, rho0, hi, epsabs=0, epsrel=1e-11, limit=500)[0]
             + ds(hi) * delta / (1 + c_plus))
    return right / (left + right)


@pytest.mark.parametrize("beta, d, sigma, kw", [
    (1.0, 3, 1.2, {}), (3.0, 3, 0.5, {}), (0.5, 4, 2.0, {"drift": 0.3}),
    (2.5, 6, 1.0, {"placement": "value", "drift": 0.0}),
    (4.0, 3, 0.7, {"placement": "value", "drift": 1.0}),
    (1.0, 3, 1.5, {"model": "usa", "shift": 1.0}),
    (8.0, 3, 0.02, {}),                                   # c_+ = 1250: Jacobi weights in logs
    (6.0, 1000, 1.0, {"placement": "value", "drift": 0.0})])
def test_against_the_scale_function_by_adaptive_quadrature(beta, d, sigma, kw):
    # an independent evaluation (an ODE for log s', adaptive quadrature, power-law tails):
    # agreement 1e-5 relative, the accuracy of the reference's tails (O(delta) = 1e-6 times
    # the scales of 2b/a), not that of the oracle
    for rho0 in (-0.6, 0.0, 0.5):
        ref = scale_function_ratio(beta, d, rho0, sigma, **kw)
        got = antipodal_probability(beta, d, rho0, sigma, **kw)
        assert got == pytest.approx(ref, rel=1e-5, abs=1e-13)


def test_without_attention_the_probability_is_angle_over_pi():
    # drift 0 (token placement): s' = (1 - r^2)^{-1/2}, P = arccos(rho0)/pi for every beta,
    # d, sigma (the probability that a uniform random hyperplane separates the two tokens)
    exact = np.arccos(RHO0) / math.pi
    for beta, d, sigma in [(0.0, 2, 1.0), (3.0, 7, 0.1), (1.0, 3, 40.0)]:
        got = antipodal_probability(beta, d, RHO0, sigma, drift=0.0)
        assert np.allclose(got, exact, rtol=1e-12, atol=1e-15)
    # value placement at beta = 0 in d = 2: the same law
    got = antipodal_probability(0.0, 2, RHO0, 0.7, placement="value", drift=0.0)
    assert np.allclose(got, exact, rtol=1e-12, atol=1e-15)


def test_limits_in_sigma_and_beta():
    exact = np.arccos(RHO0) / math.pi
    # sigma -> infinity (drift / sigma^2 -> 0): angle / pi, the gap O(1/sigma^2)
    gaps = [np.max(np.abs(antipodal_probability(1.0, 3, RHO0, s) - exact)) for s in (10, 100)]
    assert gaps[1] < gaps[0] / 50 and gaps[1] < 1e-3
    # beta -> infinity: the attention weight on the other token vanishes; the gap shrinks
    gaps = [np.max(np.abs(antipodal_probability(b, 3, RHO0, 1.0) - exact))
            for b in (10.0, 100.0, 1000.0)]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-2
    # sigma -> 0: P = 0 once sigma^2 (1 + e^{2 beta}) <= 2 drift
    edge = math.sqrt(2 / (1 + math.e ** 2))
    assert np.all(antipodal_probability(1.0, 3, RHO0, edge * (1 - 1e-9)) == 0)
    assert np.all(antipodal_probability(1.0, 3, RHO0[:-1], edge * (1 + 1e-6)) > 0)
    # the value placement without drift does not depend on sigma (a time change)
    p1 = antipodal_probability(3.0, 5, RHO0, 0.3, placement="value", drift=0.0)
    p2 = antipodal_probability(3.0, 5, RHO0, 3.0, placement="value", drift=0.0)
    assert np.allclose(p1, p2, rtol=1e-12, atol=1e-300)


def test_large_exponents_stay_finite():
    # sigma = 0.01: c_+ = (drift / sigma^2 - 1)/2 ~ 5000, the Jacobi rule's mass 2^{5001}/5001
    # overflows a float (it is kept in logarithms); P stays a probability, decreasing in rho0
    assert scale_exponents(8.0, 3, 0.01)[1] > 4000
    p = antipodal_probability(8.0, 3, np.array([-0.999999, -0.99, -0.5, 0.0]), 0.01)
    assert np.all(np.isfinite(p)) and np.all(np.diff(p) < 0) and 0 < p[-1] < p[0] < 1


def test_bounds_monotonicity_and_ends():
    rho = np.linspace(-1, 1, 201)
    for kw in [{}, {"placement": "value", "drift": 0.0}, {"model": "usa"}]:
        p = antipodal_probability(2.0, 4, rho, 1.1, **kw)
        assert p[0] == 1.0 and p[-1] == 0.0
        assert np.all((p >= 0) & (p <= 1)) and np.all(np.diff(p) < 0)
    # drift 0: P(rho0) + P(-rho0) = 1 (the law of rho is symmetric)
    p = antipodal_probability(2.0, 4, RHO0, 1.0, drift=0.0)
    q = antipodal_probability(2.0, 4, -RHO0, 1.0, drift=0.0)
    assert np.allclose(p + q, 1.0, atol=1e-14)
    # more attention or a larger dimension (value placement) favour merging
    assert np.all(antipodal_probability(2.0, 3, RHO0, 1.0, drift=2.0)
                  < antipodal_probability(2.0, 3, RHO0, 1.0, drift=1.0))
    p4, p8 = (antipodal_probability(4.0, d, RHO0[1:-1], 1.0, placement="value", drift=0.0)
              for d in (4, 8))
    assert np.all(p8 < p4)


def test_critical_beta_closed_forms_and_the_transition():
    # token, softmax: c_- = 1/2 + lambda / (sigma^2 (1 + e^{2 beta})), beta_c = log(2 lambda /
    # sigma^2 - 1) / 2; value, drift 0: beta_c = arccosh(d - 2) / 2 (d >= 3), 0 for d = 2
    for sigma, drift in [(0.5, 1.0), (0.3, 2.0)]:
        bc = critical_beta(3, sigma, drift=drift)
        assert bc == pytest.approx(0.5 * math.log(2 * drift / sigma ** 2 - 1), abs=1e-12)
        assert antipodal_probability(bc * (1 - 1e-6), 3, 0.0, sigma, drift=drift) == 0.0
        assert antipodal_probability(bc * (1 + 1e-3), 3, 0.0, sigma, drift=drift) > 0.0
    assert critical_beta(3, 1.5) == 0.0                    # sigma^2 >= drift: always possible
    for d in (3, 4, 10, 100):
        bc = critical_beta(d, placement="value", drift=0.0)
        assert bc == pytest.approx(0.5 * math.acosh(d - 2), abs=1e-12)
    assert critical_beta(2, placement="value", drift=0.0) == 0.0
    assert scale_exponents(0.0, 3, 1.0, placement="value", drift=0.0) == (1.0, 0.0)
    assert antipodal_probability(0.0, 3, 0.5, placement="value", drift=0.0) == 0.0


def test_near_the_threshold_the_probability_vanishes_continuously():
    # P ~ (1 - c_-) as c_- -> 1 from below: the ratio P / (1 - c_-) has a finite limit
    bc = critical_beta(3, 0.5)
    ratios = []
    for eps in (1e-2, 1e-3, 1e-4):
        beta = bc + eps
        c = scale_exponents(beta, 3, 0.5)[0]
        ratios.append(antipodal_probability(beta, 3, 0.0, 0.5) / (1 - c))
    assert abs(ratios[2] / ratios[1] - 1) < abs(ratios[1] / ratios[0] - 1) < 0.1


def test_engine_matrices():
    A = common_noise_matrices(3, 0.5)
    x = np.array([0.3, -1.0, 2.0])
    G = np.arange(9.0).reshape(3, 3)
    # sum_ab (sigma E_ab x) G_ab = sigma G x
    assert np.allclose(np.einsum("kij,j,k->i", A, x, G.ravel()), 0.5 * G @ x)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ArgumentError, match="sigma"):
        antipodal_probability(1.0, 3, 0.0, 0.0)
    with pytest.raises(ArgumentError, match="rho"):
        antipodal_probability(1.0, 3, 1.5)
    with pytest.raises(ArgumentError, match="d"):
        antipodal_probability(1.0, 1, 0.0)
    with pytest.raises(ArgumentError, match="placement"):
        antipodal_probability(1.0, 3, 0.0, placement="query")
    with pytest.raises(ArgumentError, match="drift"):
        antipodal_probability(1.0, 3, 0.0, drift=-1.0)
    with pytest.raises(ArgumentError, match="beta"):
        antipodal_probability(-1.0, 3, 0.0)
    with pytest.raises(ArgumentTypeError, match="beta"):
        antipodal_probability("1", 3, 0.0)
    with pytest.raises(ArgumentError, match="shift"):
        antipodal_probability(1.0, 3, 0.0, shift=1.0)
    with pytest.raises(ArgumentError, match="panels for beta=1e"):   # scales below 1e-5
        antipodal_probability(1e6, 3, 0.0)
