"""The branch of stationary states of noisy unnormalised attention on the sphere: where it
leaves the uniform state, which way, its folds and stability, against the closed forms,
the PDE and independent quadratures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import iv

from transformer_pde.errors import ArgumentError
from transformer_pde.meanfield import solve_circle
from transformer_pde.meanfield.spectral import CircleField, as_complex, as_real
from transformer_pde.meanfield.stationary import stationary_branch
from transformer_pde.reductions.noisy import (amplitude_coefficient, critical_noise,
                                              transition_beta)

#: the circle at a continuous and a discontinuous transition, and S^2 at both
CASES = [(1.5, 2), (4.0, 2), (1.0, 3), (3.0, 3)]


@pytest.fixture(scope="module")
def branches():
    return {(beta, d): stationary_branch(beta, d, max_order=0.8, step=0.01)
            for beta, d in CASES}


@pytest.mark.parametrize(("beta", "d"), CASES)
def test_the_branch_leaves_the_uniform_state_at_K_sharp_along_the_amplitude_law(
        branches, beta, d):
    b = branches[(beta, d)]
    assert b.status == "ok"
    assert b.critical == critical_noise(beta, d, quantity="coupling")
    assert b.order[0] == 0 and b.coupling[0] == b.critical
    # K/K_# = 1 + C m^2 + E m^4 + O(m^6): a quadratic fit in m^2 on m = 0.01..0.05 leaves
    # O(m^6) ~ 2e-8, so the intercept is 1 to 1e-7 and the slope C to 1e-4 relative
    m, x = b.order[1:6], b.coupling[1:6] / b.critical
    _, slope, intercept = np.polyfit(m * m, x, 2)
    assert intercept == pytest.approx(1.0, abs=1e-7)
    assert slope == pytest.approx(amplitude_coefficient(beta, d), rel=1e-4)


@pytest.mark.parametrize("d", [2, 3])
def test_the_type_of_the_transition_switches_at_transition_beta(d):
    b_star = transition_beta(d)
    below = stationary_branch(b_star - 0.15, d, max_order=0.8, step=0.02)
    above = stationary_branch(b_star + 0.15, d, max_order=0.8, step=0.02)
    # continuous: the branch leaves towards lower noise (K > K_#), no fold, every state
    # on it stable, below the uniform state in free energy
    assert np.all(below.coupling[1:] > below.critical)
    assert math.isnan(below.fold) and math.isnan(below.coexistence)
    assert np.all(below.stable[1:]) and np.all(below.free_energy[1:] < 0)
    # discontinuous: it leaves towards higher noise, folds at K_f < K_#, and a stable state
    # on its upper part matches the uniform free energy at K_f < K_c < K_#
    assert above.coupling[1] < above.critical
    assert above.fold < above.coexistence < above.critical
    assert not above.stable[1]


@pytest.mark.parametrize(("beta", "d"), [(4.0, 2), (3.0, 3)])
def test_stability_changes_at_the_fold(branches, beta, d):
    # a gradient flow's branch changes stability where it turns (the Hessian of the free
    # energy has a zero eigenvalue at the fold): unstable from the bifurcation to the fold,
    # stable after it, to within the step of the branch
    b = branches[(beta, d)]
    fold = int(np.argmin(b.coupling))
    first_stable = int(np.argmax(b.stable))
    assert abs(first_stable - fold) <= 1
    assert not np.any(b.stable[1:fold - 1]) and np.all(b.stable[fold + 2:])


@pytest.mark.parametrize("index", [30, 70])
def test_a_gibbs_state_is_a_fixed_point_of_the_pde(branches, index):
    # the pseudo-spectral right-hand side of solve_circle (an independent discretisation:
    # Fourier modes, FFT products) at a branch state vanishes to 1e-13 (the coefficients
    # are 0.02-0.16; Newton's tolerance is 1e-12 on the Gegenbauer coefficients)
    beta = 4.0
    b = branches[(beta, 2)]
    m = 256
    theta = 2 * np.pi * np.arange(m) / m
    dens = b.density(index, np.cos(theta)) / (2 * np.pi)
    assert dens.mean() * 2 * np.pi == pytest.approx(1.0, rel=1e-13)
    c = np.fft.rfft(dens)[:64] / m
    assert abs(c[1]) * 2 * np.pi == pytest.approx(b.order[index], abs=1e-12)
    D = 0.5 / b.coupling[index]
    rhs = as_complex(CircleField(64, beta, "usa", D * math.exp(-beta))(0.0, as_real(c)))
    assert np.abs(rhs).max() < 1e-13


def test_stability_is_what_the_pde_does(branches):
    # push a state along the branch direction (mu + eps (mu - uniform)) and follow the PDE:
    # past the fold (stable) the first moment returns towards the state's; before it
    # (unstable) it moves away, in the direction of the push
    beta = 4.0
    b = branches[(beta, 2)]
    m = 128
    theta = 2 * np.pi * np.arange(m) / m
    for index in (30, 70):
        dens = b.density(index, np.cos(theta)) / (2 * np.pi)
        D = 0.5 / b.coupling[index]
        for eps in (2e-3, -2e-3):
            sol = solve_circle(dens + eps * (dens - 1 / (2 * np.pi)), beta, [0.0, 0.5, 1.5],
                               model="usa", diffusion=D, tol=1e-10)
            dm = np.abs(sol.coefficients[:, 1]) * 2 * np.pi - b.order[index]
            if b.stable[index]:
                assert abs(dm[2]) < abs(dm[1]) < abs(dm[0])
            else:
                assert np.sign(dm[2]) == np.sign(eps) and abs(dm[2]) > abs(dm[1])


def test_self_consistency_on_the_two_sphere_by_direct_quadrature(branches):
    # d = 3: (W * mu)(x) = int e^{beta <x, y>} f(<y, e>) dsigma(y) by a product rule on S^2
    # (Gauss-Legendre in the polar cosine, the trapezoid rule in the azimuth: both exact to
    # rounding for these entire integrands at 200 x 200 points), no Funk-Hecke; then
    # log f - kappa (W * mu) is the same constant at every polar angle, kappa = 2K/beta
    beta, d = 3.0, 3
    b = branches[(beta, d)]
    index = 60
    kappa = 2.0 * b.coupling[index] / beta
    s, ws = np.polynomial.legendre.leggauss(200)
    phi = 2 * np.pi * np.arange(200) / 200
    fs = b.density(index, s)
    values = []
    for t0 in (-0.9, -0.3, 0.2, 0.7, 1.0):
        # x = (sqrt(1 - t0^2), 0, t0); y = (sqrt(1 - s^2) cos phi, sqrt(1 - s^2) sin phi, s)
        dot = (math.sqrt(1 - t0 * t0) * np.sqrt(1 - s * s)[:, None] * np.cos(phi)[None, :]
               + t0 * s[:, None])
        conv = 0.5 * np.mean(np.exp(beta * dot), axis=1) @ (ws * fs)
        values.append(math.log(b.density(index, np.array([t0]))[0]) - kappa * conv)
    assert np.ptp(values) < 1e-10 * abs(values[0])


def test_the_free_energy_by_direct_quadrature_on_the_circle(branches):
    # (F(mu) - F(uniform))/D = int p log(2 pi p) - (kappa/2)(int int e^{beta cos(t - s)} p p
    # - I_0(beta)), p the density in theta, kappa = 2K/beta: the trapezoid rule on 512
    # angles is exact to rounding for these trigonometric integrands
    beta = 4.0
    b = branches[(beta, 2)]
    m = 512
    theta = 2 * np.pi * np.arange(m) / m
    dtheta = 2 * np.pi / m
    kernel = np.exp(beta * np.cos(theta[:, None] - theta[None, :]))
    for index in (20, 50, 75):
        p = b.density(index, np.cos(theta)) / (2 * np.pi)
        kappa = 2.0 * b.coupling[index] / beta
        entropy = np.sum(p * np.log(2 * np.pi * p)) * dtheta
        energy = p @ kernel @ p * dtheta ** 2 - iv(0, beta)
        assert b.free_energy[index] == pytest.approx(entropy - 0.5 * kappa * energy,
                                                     abs=1e-11)


def test_shift_scales_the_couplings_only():
    a = stationary_branch(2.0, 2, max_order=0.3, step=0.05)
    c = stationary_branch(2.0, 2, shift=2.0, max_order=0.3, step=0.05)
    np.testing.assert_allclose(c.coupling, a.coupling * math.exp(2.0), rtol=1e-13)
    np.testing.assert_array_equal(c.coefficients, a.coefficients)


def test_the_summary_names_the_branch(branches):
    text = repr(branches[(4.0, 2)])
    assert text.startswith("StationaryBranch(status='ok', beta=4, d=2")
    assert "fold" in text and "coexistence" in text


def test_bad_arguments_name_themselves():
    with pytest.raises(ArgumentError, match="max_order"):
        stationary_branch(2.0, 2, max_order=1.0)
    with pytest.raises(ArgumentError, match="degrees"):
        stationary_branch(2.0, 2, nodes=32, degrees=20)
    with pytest.raises(ArgumentError, match="beta"):
        stationary_branch(0.0, 2)
    with pytest.raises(ArgumentError, match="d"):
        stationary_branch(2.0, 1)
