r"""Laws of noisy runs against exact moments: Ornstein–Uhlenbeck tokens, the uniform law
on the sphere, the Laplace–Beltrami convention, isotropic common matrix noise.

Every member of an ensemble is an independent path, so a run of :math:`B` one-token
members gives :math:`B` independent samples.  Monte-Carlo tolerances are 5.5 standard
errors (a correct implementation fails a check with probability below
:math:`4\cdot 10^{-8}`; all checks together below :math:`10^{-6}`), the standard errors
computed from the exact variances (or bounded, as stated).  The runs are seeded.

Where the exact law of the *scheme* is known in closed form (linear SDEs; the mean of
Euler–Maruyama on the sphere, a one-dimensional integral), the samples are compared with
it, which tests the implementation without a discretisation bias; the distance from the
scheme's law to the SDE's is then computed exactly and shown to be of weak order 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import transformer_pde as tp
from transformer_pde import Noise, simulate_ensemble

Z = 5.5


def _att(d, V):
    return tp.Attention("softmax", np.eye(d), np.eye(d), V)


def _run(d, V, x0, B, T, dt, solver, noise, sphere=False):
    X0 = np.tile(np.asarray(x0, dtype=float), (B, 1, 1))
    ens = simulate_ensemble(_att(d, V), X0, t_max=T, dt=dt, solver=solver, noise=noise,
                            block="sphere" if sphere else None, backend="numpy",
                            saveat=tp.SaveAt(ts=[T]))
    assert str(ens.status) == "ok"
    return ens.last[:, 0]


# ------------------------------------------------------------------ Ornstein–Uhlenbeck
LAM, SIG, T_OU, B_OU = 1.0, 0.8, 1.0, 20000
X0_OU = np.array([1.0, -0.5])


def _ou_scheme(solver, h):
    """Per-step factor a and noise factor b of the scheme on dx = -lam x dt + sig dW:
    x' = a x + b dW (Euler–Maruyama and Milstein: a = 1 - lam h, b = sig; Heun:
    a = 1 - lam h + (lam h)^2/2, b = sig (1 - lam h / 2))."""
    if solver == "heun_stratonovich":
        return 1 - LAM * h + (LAM * h) ** 2 / 2, SIG * (1 - LAM * h / 2)
    return 1 - LAM * h, SIG


def _ou_moments(solver, h, n):
    a, b = _ou_scheme(solver, h)
    return a ** n * X0_OU, b * b * h * sum(a ** (2 * k) for k in range(n))


def _ou_exact(t):
    return np.exp(-LAM * t) * X0_OU, SIG ** 2 * (1 - np.exp(-2 * LAM * t)) / (2 * LAM)


@pytest.mark.parametrize("solver", ["euler_maruyama", "heun_stratonovich", "milstein"])
def test_ornstein_uhlenbeck_tokens_have_the_schemes_gaussian_law(solver):
    """One token of softmax attention feels Gamma(x) = V x: with V = -lam I and additive
    noise it is an Ornstein–Uhlenbeck process; the scheme's mean and variance are closed
    forms (a linear recursion)."""
    dt = 0.05
    n = round(T_OU / dt)
    X = _run(2, -LAM * np.eye(2), X0_OU, B_OU, T_OU, dt, solver, Noise(sigma=SIG, seed=1))
    mean, var = _ou_moments(solver, dt, n)
    assert np.all(np.abs(X.mean(axis=0) - mean) <= Z * np.sqrt(var / B_OU))
    # sample variance of a Gaussian: standard error var sqrt(2 / (B - 1))
    assert np.all(np.abs(X.var(axis=0, ddof=1) - var) <= Z * var * np.sqrt(2 / (B_OU - 1)))
    # independent coordinates: the sample covariance is within its standard error var/sqrt(B)
    assert abs(np.cov(X.T)[0, 1]) <= Z * var / np.sqrt(B_OU - 1)


@pytest.mark.parametrize("solver, order", [("euler_maruyama", 1), ("heun_stratonovich", 2),
                                           ("milstein", 1)])
def test_the_schemes_law_converges_to_the_sde_at_its_weak_order(solver, order):
    """The exact bias of the scheme's mean and variance (whose law the test above ties to
    the implementation) shrinks by 2^order when dt halves: weak order 1 (Heun: 2, for
    additive noise), the ratios within 10 % of 2^order."""
    mean_x, var_x = _ou_exact(T_OU)
    bias = []
    for dt in (0.1, 0.05, 0.025, 0.0125):
        m, v = _ou_moments(solver, dt, round(T_OU / dt))
        bias.append((np.abs(m - mean_x).max(), abs(v - var_x)))
    bias = np.array(bias)
    ratios = bias[:-1] / bias[1:]
    assert np.all(np.abs(ratios / 2 ** order - 1) < 0.1), ratios


# ------------------------------------------------------------------ the sphere
D, SIG_S = 3, 1.0
E1 = np.eye(D)[0]


def _em_sphere_factor(h, sigma=SIG_S, d=D):
    """Euler–Maruyama on the sphere with zero field contracts the mean by
    m = E[(1 + sigma^2 h chi2_{d-1})^(-1/2)] per step (the tangent increment is
    sigma P_x dW, |P_x dW|^2 ~ h chi2_{d-1}, and the retraction divides by the norm;
    the tangential part averages to zero)."""
    return stats.chi2(d - 1).expect(lambda u: (1 + sigma ** 2 * h * u) ** -0.5)


def _matrix_noise(sigma, d=D):
    """The d^2 matrices sigma E_ab: an isotropic matrix Brownian motion."""
    A = np.zeros((d * d, d, d))
    for a in range(d):
        for b in range(d):
            A[a * d + b, a, b] = sigma
    return A


NOISES = {"individual": Noise(sigma=SIG_S, seed=2),
          "matrix-stratonovich": Noise(common=_matrix_noise(SIG_S), seed=3),
          "matrix-ito": Noise(common=_matrix_noise(SIG_S), convention="ito", seed=4)}


@pytest.mark.parametrize("kind", sorted(NOISES))
def test_euler_maruyama_on_the_sphere_has_the_schemes_mean(kind):
    """E[x_n] = m^n x0 for Euler–Maruyama (individual noise).  The isotropic matrix noise
    sigma E_ab moves a unit token by an increment of the same law as sigma dW, and its
    Itô–Stratonovich correction on the sphere vanishes, so both its readings have the
    same mean.  Standard error: Var(x . e) <= 1 per sample."""
    B, T, dt = 10000, 0.5, 0.05
    X = _run(D, np.zeros((D, D)), E1, B, T, dt, "euler_maruyama", NOISES[kind], sphere=True)
    m = _em_sphere_factor(dt) ** round(T / dt)
    assert np.all(np.abs(X.mean(axis=0) - m * E1) <= Z / np.sqrt(B))


def test_the_sphere_mean_is_the_laplace_beltrami_one_at_weak_order_one():
    r"""The individual noise generates (sigma^2/2) Laplace–Beltrami: E[x(t)] =
    exp(-(d-1) sigma^2 t / 2) x0 (x is a degree-1 harmonic, eigenvalue -(d-1)).  The
    scheme's exact mean (quadrature, tied to the implementation above) converges to it at
    weak order 1."""
    T = 0.5
    exact = np.exp(-(D - 1) * SIG_S ** 2 * T / 2)
    bias = [abs(_em_sphere_factor(dt) ** round(T / dt) - exact) for dt in (0.05, 0.025, 0.0125)]
    assert np.all(np.abs(np.array(bias[:-1]) / bias[1:] - 2) < 0.2), bias


@pytest.mark.parametrize("solver", ["euler_maruyama", "heun_stratonovich"])
@pytest.mark.parametrize("kind", ["individual", "matrix-stratonovich"])
def test_one_token_on_the_sphere_becomes_uniform(solver, kind):
    """Zero field, isotropic noise: the chain is rotation-equivariant, so its invariant law
    is the uniform law on the sphere (no discretisation bias), E[x] = 0, E[x x^T] = I/d.
    At t = 6 the transient is below e^{-6} = 0.0025 for the SDE (allowance 0.01 for the
    scheme's slightly different rate).  Standard errors: Var(x_a) = 1/3, Var(x_a^2) =
    4/45, Var(x_a x_b) = 1/15 for the uniform law on S^2."""
    B, T, dt = 8000, 6.0, 0.1
    X = _run(D, np.zeros((D, D)), E1, B, T, dt, solver, NOISES[kind], sphere=True)
    assert np.all(np.abs(X.mean(axis=0)) <= Z * np.sqrt(1 / 3 / B) + 0.01)
    S = X.T @ X / B
    off = S[~np.eye(D, dtype=bool)]
    assert np.all(np.abs(np.diag(S) - 1 / D) <= Z * np.sqrt(4 / 45 / B) + 0.01)
    assert np.all(np.abs(off) <= Z * np.sqrt(1 / 15 / B) + 0.01)


# ------------------------------------------------------------------ matrix noise in R^d
@pytest.mark.parametrize("solver, convention, factor", [
    ("euler_maruyama", "ito", lambda h: 1.0),
    ("euler_maruyama", "stratonovich", lambda h: 1 + SIG_M ** 2 * h / 2),
    ("heun_stratonovich", "stratonovich", lambda h: 1 + SIG_M ** 2 * h / 2)])
def test_isotropic_matrix_noise_in_rd_has_the_schemes_mean(solver, convention, factor):
    r"""dx = sigma dXi x with the non-commuting matrices sigma E_ab: Itô, x is a martingale
    (E-M's mean is exactly x0); Stratonovich, the Itô drift is (sigma^2/2) x
    (sum_ab E_ab E_ab = I) and E-M and Heun multiply the mean by exactly
    1 + sigma^2 h / 2 per step (E[M] = 0, E[M^2] = sigma^2 h I).  Standard error from
    E|x(T)|^2 <= |x0|^2 e^{(d+1) sigma^2 T} (a bound of the second moment)."""
    B, T, dt = 10000, 1.0, 0.05
    X = _run(D, np.zeros((D, D)), E1, B, T, dt, solver,
             Noise(common=_matrix_noise(SIG_M), convention=convention, seed=5))
    mean = factor(dt) ** round(T / dt) * E1
    se = np.sqrt(np.exp((D + 1) * SIG_M ** 2 * T) / B)
    assert np.all(np.abs(X.mean(axis=0) - mean) <= Z * se)


SIG_M = 0.5


@pytest.mark.parametrize("solver", ["euler_maruyama", "heun_stratonovich"])
@pytest.mark.parametrize("kind", ["individual", "matrix-ito"])
def test_richardson_extrapolated_sphere_means_are_laplace_beltrami(solver, kind):
    r"""Both schemes have weak order 1, so on the same paths the extrapolation
    2 x_{h/2}(T) - x_h(T) has the mean exp(-(d-1) sigma^2 T/2) x0 up to O(h^2)
    (below 1e-3 here, measured from the E-M quadrature above).  The standard error is
    that of the per-path extrapolations (sample standard deviation / sqrt(B)); tolerance
    5.5 of them plus 2e-3."""
    B, T, h = 10000, 0.5, 0.025
    base = Noise(sigma=SIG_S, seed=6, base_dt=h) if kind == "individual" else \
        Noise(common=_matrix_noise(SIG_S), convention="ito", seed=7, base_dt=h)
    X = [_run(D, np.zeros((D, D)), E1, B, T, dt, solver, base, sphere=True) @ E1
         for dt in (h, h / 2)]
    extrap = 2 * X[1] - X[0]
    exact = np.exp(-(D - 1) * SIG_S ** 2 * T / 2)
    se = extrap.std(ddof=1) / np.sqrt(B)
    assert abs(extrap.mean() - exact) <= Z * se + 2e-3, (extrap.mean(), exact, se)
