"""The kinetic retrieval profile of causal ALiBi attention on the circle
(:mod:`transformer_pde.reductions.lost_in_middle`).

References, independent of the module's Bessel-function evaluation:

* psi: its power series summed in 50-digit decimal arithmetic, for positive and negative
  c (relative 1e-13: the Bessel route rounds a few times, each ~1e-16 times the size of
  the exponent 2 sqrt(c y) <= 200 here);
* the Green function: the linear causal equation
  d/dt G(t, u) = a [w(u, s) + int_s^u w(u, v) G(t, v) dv], G(0, .) = 0, solved by the
  method of lines (trapezoidal rule on 201 and 401 nodes in u, RK45 at rtol 1e-10 in t)
  and Richardson extrapolation (the trapezoidal error is a series in h^2): 1e-6 relative
  (measured 1e-11 to 5e-8);
* the critical time: the root in t of a second-order one-sided difference of S_t at s = 1
  (step 1e-4: truncation ~1e-8, rounding ~1e-12), found by brentq, agreement 1e-6;
* the formulas as written in the authors' script (series for I_n and psi in float): 1e-13.

The particle side (regression estimator) is checked on synthetic data whose kernel is known,
and against a small particle run (see the tolerance there).
"""

from __future__ import annotations

import math

import decimal

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.optimize import brentq
from scipy.special import iv

import transformer_pde as tp
from transformer_pde.errors import ArgumentError
from transformer_pde.integrate import SaveAt
from transformer_pde.particles.ensemble import simulate_ensemble
from transformer_pde.reductions.lost_in_middle import (critical_time, measure_retrieval,
                                                       mode_rates, mode_response, psi,
                                                       retrieval_profile, soft_weights)


def psi_mp(c, y):
    """The power series in 50-digit decimal arithmetic (the floats c, y converted exactly)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 50
        c, y = decimal.Decimal(c), decimal.Decimal(y)
        term = total = c
        k = 0
        while term != 0 and abs(term) > abs(total) * decimal.Decimal(10) ** -45:
            term = term * c * y / ((k + 1) * (k + 2))
            total += term
            k += 1
        return float(total)


@pytest.mark.parametrize("c, y", [(1.0, 2.0), (1e-3, 1.0), (50.0, 40.0), (3.0, 0.0),
                                  (1e-8, 1e-8), (-2.0, 3.0), (-40.0, 5.0), (0.0, 7.0),
                                  (200.0, 49.0)])
def test_psi_is_its_power_series(c, y):
    ref = psi_mp(c, y)
    np.testing.assert_allclose(psi(c, y), ref, rtol=1e-13, atol=1e-300)


def test_psi_is_finite_up_to_the_float_range():
    big = psi(1e4, 1e4)                         # I_1(2e4) ~ e^{2e4}: beyond the range
    assert np.isinf(big)
    assert np.isfinite(psi(8e4, 1.0))           # e^{566}: representable


def _green_by_lines(t, s, a, lam, nodes):
    """G(t, 1) of the linear causal equation from a source at s, by the method of lines."""
    u = np.linspace(s, 1.0, nodes)
    h = u[1] - u[0]

    def w(uu, v):
        return lam * np.exp(-lam * (uu - v)) / (-np.expm1(-lam * uu))

    W = w(u[:, None], u[None, :]) * np.tril(np.ones((nodes, nodes)))
    W[:, 0] *= 0.5                                   # trapezoid weights on [s, u_i]
    W[np.arange(nodes), np.arange(nodes)] *= 0.5
    W[0, 0] = 0.0
    W *= h
    src = w(u, s)                                    # G(t, s+) = a t w(s, s) + ...

    def rhs(_, G):
        return a * (src + W @ G)

    sol = solve_ivp(rhs, (0.0, t), np.zeros(nodes), rtol=1e-10, atol=1e-12, method="RK45")
    return sol.y[-1, -1]


@pytest.mark.parametrize("t, s, a, lam", [(1.0, 0.3, 0.57, 1.0), (2.5, 0.05, 0.54, 1.0),
                                          (1.5, 0.6, 1.2, 4.0), (0.7, 0.2, 0.8, 1e-9)])
def test_the_profile_kernel_is_the_green_function_of_the_causal_equation(t, s, a, lam):
    got = float(mode_response(t, s, a, lam))
    coarse, fine = (_green_by_lines(t, s, a, lam, k) for k in (201, 401))
    np.testing.assert_allclose(got, (4.0 * fine - coarse) / 3.0, rtol=1e-6)   # Richardson


def test_the_critical_time_is_where_the_right_end_slope_changes_sign():
    for beta, lam in [(1.0, 1.0), (2.0, 1.0), (0.5, 3.0)]:
        tc = critical_time(beta, lam)

        def slope(t, beta=beta, lam=lam):
            h = 1e-4                 # one-sided, second order: truncation ~1e-8
            f = retrieval_profile(t, np.array([1.0, 1.0 - h, 1.0 - 2 * h]), beta, lam)
            return (3.0 * f[0] - 4.0 * f[1] + f[2]) / (2.0 * h)

        root = brentq(slope, 0.2 * tc, 5.0 * tc, xtol=1e-12)
        assert abs(root - tc) < 1e-6 * tc
        assert slope(0.5 * tc) > 0 > slope(2.0 * tc)  # recency before, none after


def _authors_script(s, beta, t, lam, M, n_max):
    # the formulas as their script writes them: series for I_n and psi_c, in float
    def bessel(n, x):
        term = (x / 2.0) ** n / math.factorial(n)
        total = term
        for k in range(10000):
            term *= (x * x / 4.0) / ((k + 1) * (k + n + 1))
            total += term
            if abs(term) <= 1e-17 * abs(total):
                break
        return total

    def psi_c(c, y):
        term = total = c
        for k in range(10000):
            term *= c * y / ((k + 1) * (k + 2))
            total += term
            if abs(term) <= 1e-17 * abs(total):
                break
        return total

    y = math.log(math.expm1(lam) / math.expm1(lam * s))
    coeff = lam * math.exp(lam * s) / math.expm1(lam)
    return sum(math.exp(-0.5 * (math.pi * n / M) ** 2) * coeff
               * psi_c(n * n * bessel(n, beta) * t, y) for n in range(1, n_max + 1))


def test_the_profile_matches_the_authors_formulas():
    s = np.linspace(0.02, 0.98, 13)
    for beta, t in [(1.0, 0.25), (1.0, 2.0), (2.0, 5.0), (4.8, 0.5)]:
        ref = [_authors_script(x, beta, t, 1.0, 8.0, 20) for x in s]
        np.testing.assert_allclose(retrieval_profile(t, s, beta, 1.0), ref, rtol=1e-13)


def test_their_critical_times():
    # the values their script prints for lambda = 1, M = 8, n_max = 20
    for beta, printed in [(1.0, 2.457489), (2.0, 0.600716), (3.0, 0.174018)]:
        assert abs(critical_time(beta, 1.0) - printed) < 5e-7


def test_rates_models_and_limits():
    n = np.arange(1, 6)
    np.testing.assert_allclose(mode_rates(1.3, 5), n ** 2 * iv(n, 1.3), rtol=1e-14)
    np.testing.assert_allclose(mode_rates(1.3, 5, model="sa"), n ** 2 * iv(n, 1.3) / iv(0, 1.3),
                               rtol=1e-14)
    assert critical_time(0.0, 1.0) == math.inf
    # lambda -> 0: prefactor 1 and Y = log(1/s), continuous
    s = np.array([0.1, 0.5, 0.9])
    np.testing.assert_allclose(retrieval_profile(1.0, s, 1.0, 1e-12),
                               retrieval_profile(1.0, s, 1.0, 0.0), rtol=1e-10)
    np.testing.assert_allclose(mode_response(2.0, s, 0.7, 0.0),
                               psi(1.4, np.log(1.0 / s)), rtol=1e-14)
    # a large slope: lambda e^{-lambda (1 - s)} psi(a t, ~lambda (1 - s)), finite
    assert np.all(np.isfinite(retrieval_profile(1.0, s, 1.0, 500.0)))
    np.testing.assert_allclose(soft_weights(3, 8.0), np.exp(-np.pi ** 2 * np.arange(1, 4) ** 2
                                                            / 128.0), rtol=1e-15)
    np.testing.assert_array_equal(mode_response(0.0, s, 1.0, 1.0), 0.0)


@pytest.mark.parametrize("call, match", [
    (lambda: retrieval_profile(1.0, 0.0, 1.0, 1.0), "s must lie"),
    (lambda: retrieval_profile(1.0, 1.5, 1.0, 1.0), "s must lie"),
    (lambda: retrieval_profile(-1.0, 0.5, 1.0, 1.0), "t must"),
    (lambda: retrieval_profile(1.0, 0.5, -1.0, 1.0), "beta"),
    (lambda: retrieval_profile(1.0, 0.5, 1.0, -1.0), "lam"),
    (lambda: retrieval_profile(1.0, 0.5, 1.0, 1.0, M=0.0), "M"),
    (lambda: retrieval_profile(1.0, 0.5, 1.0, 1.0, n_max=0), "n_max"),
    (lambda: psi(1.0, -1.0), "y must"),
    (lambda: critical_time(1.0, 1.0, model="x"), "model"),
])
def test_refusals_name_the_argument(call, match):
    with pytest.raises(ArgumentError, match=match):
        call()


# ------------------------------------------------------------------ the particle estimator
def test_the_regression_recovers_a_known_kernel():
    # synthetic runs: Z_n = (1/N) sum_k g_n(u_k) e^{i n theta_k} + noise of size 1/N,
    # probes built to have exactly that law (first mode only matters per n)
    rng = np.random.default_rng(0)
    R, N, P, nm = 200, 400, 64, 3
    u = np.arange(1, N + 1) / N
    edges = np.linspace(0.0, 1.0, 5)
    g = np.stack([0.05 * (n + 1.0) * (1.0 + u) for n in range(nm)])   # g_n(u)
    th0 = rng.uniform(0, 2 * np.pi, (R, N))
    Z = np.stack([(np.exp(1j * n * th0) * g[n - 1]).mean(axis=1) for n in range(1, nm + 1)])
    Z = Z + 0.05 * (rng.normal(size=Z.shape) + 1j * rng.normal(size=Z.shape)) / N
    # probes: P equally spaced angles moved by delta_p = sum_n (2/n) Im(Z_n e^{-i n b_p}),
    # whose n-th moment is i n c_n = Z_n to first order (|delta| ~ 1e-2: second order 1e-4)
    base = 2 * np.pi * np.arange(P) / P
    shift = np.zeros((R, P))
    for n in range(1, nm + 1):
        shift += (2.0 / n) * (Z[n - 1][:, None] * np.exp(-1j * n * base)).imag
    probes = base + shift
    G, se = measure_retrieval(th0, probes, u, edges, n_max=nm)
    for n in range(1, nm + 1):
        ref = 0.05 * n * (1.0 + 0.5 * (edges[:-1] + edges[1:]))
        # 5 standard errors, plus the probes' second-order moments (|delta|^2 ~ 1e-4)
        np.testing.assert_allclose(G[n - 1], ref, atol=5 * se[n - 1].max() + 1e-3)
    with pytest.raises(ArgumentError, match="2R > B"):
        measure_retrieval(th0[:2], probes[:2], u, np.linspace(0, 1, 6))


def _particles(n, runs, t, edges, seed=0, probes=16):
    """S_t on the bins of ``edges`` from ``runs`` prompts of ``n`` tokens (softmax with
    alibi=1, V = beta I_0(beta) I, on the circle; zero-weight probes at the last position),
    and its standard error (the construction of examples/lost_in_the_middle.py)."""
    rng = np.random.default_rng(seed)
    theta0 = rng.uniform(0, 2 * np.pi, (runs, n))
    probe = rng.uniform(0, 2 * np.pi / probes, (runs, 1)) + 2 * np.pi * np.arange(probes) / probes
    ang = np.concatenate([theta0, probe], axis=1)
    X0 = np.stack([np.cos(ang), np.sin(ang)], axis=-1)
    pos = np.concatenate([np.arange(1, n + 1) / n, np.ones(probes)])
    w = np.concatenate([np.ones(n), np.zeros(probes)])
    att = tp.Attention("softmax", np.eye(2), np.eye(2), iv(0, 1.0) * np.eye(2), beta=1.0,
                       masked=True, alibi=1.0)
    ens = simulate_ensemble(att, X0, t_max=t, dt=0.125, saveat=SaveAt(ts=[t]), weights=w,
                            positions=pos, block="sphere")
    final = np.arctan2(ens.states[-1, ..., 1], ens.states[-1, ..., 0])[:, n:]
    G, se = measure_retrieval(theta0, final, pos[:n], edges)
    om = soft_weights(20, 8.0)
    return om @ G, np.sqrt((om ** 2) @ (se ** 2))


def _kinetic_bins(t, edges, lam=1.0):
    x, wq = np.polynomial.legendre.leggauss(64)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        v = 0.5 * (x + 1.0)
        s, jac = lo + (hi - lo) * v ** 2, (hi - lo) * v * wq    # sqrt map: log end at 0
        out.append(np.sum(retrieval_profile(t, s, 1.0, lam) * jac) / (hi - lo))
    return np.array(out)


def _check_particles(n, runs, t, edges):
    # tolerance: 5 standard errors of the regression plus a finite-N bias of 4/N (measured
    # about 2.5/N in the first bin, smaller elsewhere: examples/lost_in_the_middle.py)
    S, se = _particles(n, runs, t, edges)
    ref = _kinetic_bins(t, edges)
    tol = 5.0 * se + 4.0 / n
    assert np.all(np.abs(S - ref) <= tol), (S, ref, tol)
    # the check can fail: without ALiBi the kinetic profile is farther than the tolerance
    assert np.any(np.abs(S - _kinetic_bins(t, edges, lam=1e-9)) > tol)


def test_particles_agree_with_the_kinetic_profile_small():
    _check_particles(120, 40, 0.5, np.linspace(0.0, 1.0, 5))


@pytest.mark.slow
def test_particles_agree_with_the_kinetic_profile():
    _check_particles(1000, 100, 1.0, np.linspace(0.0, 1.0, 11))
