"""Exact Wasserstein distances on the line and the circle, against SciPy, POT and direct
numerical integration of the same measures."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.meanfield.distance import distance_to_pde, w1_circle, w1_line, w2_line

ot = pytest.importorskip("ot")

TWO_PI = 2 * np.pi
SIZES = [(1, 1), (2, 5), (37, 60), (400, 250)]


@pytest.mark.parametrize("n, m", SIZES)
def test_w1_line_samples_equals_scipy(n, m):
    # both compute the same integral of |F - G| in closed form: rounding-level agreement
    rng = np.random.default_rng(n + m)
    a, b = rng.normal(size=n), rng.normal(0.4, 1.3, size=m)
    wa, wb = rng.random(n), rng.random(m)
    assert w1_line(a, b) == pytest.approx(stats.wasserstein_distance(a, b), abs=1e-12)
    assert w1_line(a, b, weights_a=wa, weights_b=wb) == pytest.approx(
        stats.wasserstein_distance(a, b, wa, wb), abs=1e-12)


@pytest.mark.parametrize("n, m", SIZES)
def test_w2_line_samples_equals_exact_ot(n, m):
    # ot.emd2 solves the discrete transport problem exactly (network simplex)
    rng = np.random.default_rng(7 * n + m)
    a, b = rng.normal(size=n), rng.standard_t(3, size=m)
    wa, wb = rng.random(n), rng.random(m)
    ref = ot.emd2(wa / wa.sum(), wb / wb.sum(), ot.dist(a[:, None], b[:, None]))
    assert w2_line(a, b, weights_a=wa, weights_b=wb) ** 2 == pytest.approx(ref, abs=1e-12)


def test_ties_and_repeated_samples():
    a = np.array([0.0, 0.0, 1.0, 1.0, 1.0])
    b = np.array([1.0, 0.0, 0.5])
    assert w1_line(a, b) == pytest.approx(stats.wasserstein_distance(a, b), abs=1e-14)
    ref = ot.emd2(np.full(5, 0.2), np.full(3, 1 / 3), ot.dist(a[:, None], b[:, None]))
    assert w2_line(a, b) ** 2 == pytest.approx(ref, abs=1e-14)
    assert w1_line(a, a[::-1]) == 0.0


@pytest.mark.parametrize("n, m", SIZES)
def test_w1_circle_samples_equals_pot(n, m):
    # POT's wasserstein_circle works on the circle of length 1 (scale by 2 pi) and finds
    # the shift by a binary search to eps (default 1e-6: tightened here)
    rng = np.random.default_rng(3 * n + m)
    ta = rng.uniform(0, TWO_PI, n)
    tb = rng.vonmises(1.0, 2.0, m)           # in (-pi, pi]: taken modulo 2 pi
    wa, wb = rng.random(n), rng.random(m)
    ref = ot.wasserstein_circle(ta / TWO_PI, np.mod(tb, TWO_PI) / TWO_PI,
                                wa / wa.sum(), wb / wb.sum(), p=1, eps=1e-14)
    got = w1_circle(ta, tb, weights_a=wa, weights_b=wb)
    assert got == pytest.approx(TWO_PI * float(np.ravel(ref)[0]), abs=1e-10)


def test_w1_circle_equals_emd_with_geodesic_cost():
    # an independent check of the median formula: the LP with cost min(|a-b|, 2pi-|a-b|)
    rng = np.random.default_rng(11)
    ta, tb = rng.uniform(0, TWO_PI, 30), rng.uniform(0, TWO_PI, 23)
    diff = np.abs(ta[:, None] - tb[None, :])
    cost = np.minimum(diff, TWO_PI - diff)
    ref = ot.emd2(np.full(30, 1 / 30), np.full(23, 1 / 23), cost)
    assert w1_circle(ta, tb) == pytest.approx(ref, abs=1e-10)
    # points of the plane are read by their angles
    pts = np.column_stack([np.cos(ta), np.sin(ta)]) * 2.0
    assert w1_circle(pts, tb) == pytest.approx(ref, abs=1e-10)


def test_circle_distance_is_rotation_invariant_and_antipodal():
    assert w1_circle([0.0], [np.pi]) == pytest.approx(np.pi, abs=1e-14)
    rng = np.random.default_rng(2)
    ta, tb = rng.uniform(0, TWO_PI, 20), rng.uniform(0, TWO_PI, 15)
    base = w1_circle(ta, tb)
    for shift in (0.3, 2.0, 5.9):
        assert w1_circle(ta + shift, tb + shift) == pytest.approx(base, abs=1e-12)


def _pl_cdf(x, rho):
    """CDF of the normalised piecewise-linear interpolant, by adaptive quadrature."""
    total = np.trapezoid(rho, x)
    return lambda s: integrate.quad(lambda u: np.interp(u, x, rho) / total, x[0],
                                    min(max(s, x[0]), x[-1]), points=x[(x > x[0]) & (x < s)]
                                    [:50], limit=400)[0] if s > x[0] else 0.0


def test_w1_line_grid_density_against_quadrature():
    # samples against a grid density and two grid densities: int |F - G| by scipy.quad on
    # the exact CDFs of the interpolants (quad error ~1e-12)
    x = np.linspace(-3, 3, 13)
    rho = np.exp(-x ** 2) * (1 + 0.5 * np.sin(3 * x)) + 0.01
    y = np.array([-1.0, -0.2, 0.4, 0.5, 2.0])
    F = _pl_cdf(x, rho)
    brk = np.sort(np.r_[x, y])

    def G(s):
        return np.mean(y <= s)
    ref = sum(integrate.quad(lambda s: abs(F(s) - G(s)), lo, hi, epsabs=1e-13)[0]
              for lo, hi in zip(brk[:-1], brk[1:], strict=True))
    ref += integrate.quad(lambda s: abs(F(s) - 1.0), max(x[-1], y[-1]), x[-1])[0] \
        if y[-1] < x[-1] else 0.0
    assert w1_line((x, rho), y) == pytest.approx(ref, abs=1e-10)

    x2 = np.linspace(-2, 4, 9)
    rho2 = 1.0 + 0.3 * x2
    F2 = _pl_cdf(x2, rho2)
    brk = np.unique(np.r_[x, x2])
    ref = sum(integrate.quad(lambda s: abs(F(s) - F2(s)), lo, hi, epsabs=1e-13)[0]
              for lo, hi in zip(brk[:-1], brk[1:], strict=True))
    assert w1_line((x, rho), (x2, rho2)) == pytest.approx(ref, abs=1e-10)


def test_w2_line_grid_density_exact_cases():
    # uniform density on [0, 1] against its own midpoint atom: W2^2 = 1/12; against the
    # uniform on [s, 1 + s]: W2 = s (a translation); and the Gaussian limit
    x = np.linspace(0.0, 1.0, 5)
    one = np.ones(5)
    assert w2_line((x, one), [0.5]) ** 2 == pytest.approx(1 / 12, abs=1e-14)
    assert w1_line((x, one), [0.5]) == pytest.approx(0.25, abs=1e-14)
    assert w2_line((x, one), (x + 0.3, one)) == pytest.approx(0.3, abs=1e-13)
    assert w1_line((x, one), (x + 0.3, one)) == pytest.approx(0.3, abs=1e-13)
    # two Gaussians sampled finely: W2 = sqrt(dm^2 + ds^2) up to interpolation O(h^2)
    g = np.linspace(-9, 9, 4001)
    a, b = stats.norm(0, 1).pdf(g), stats.norm(0.5, 1.5).pdf(g)
    assert w2_line((g, a), (g, b)) == pytest.approx(np.hypot(0.5, 0.5), abs=1e-5)


def test_w1_circle_grid_density():
    # the uniform density against one atom: int |theta/2pi - H(theta - phi) - c| = pi / 2
    th = np.linspace(0, TWO_PI, 64, endpoint=False)
    assert w1_circle((th, np.ones(64)), [1.0]) == pytest.approx(np.pi / 2, abs=1e-12)
    # a rotated copy of a smooth density on a grid (exact rotation by one cell): the
    # distance of a rotation by s of a measure with a non-vanishing density is at most s
    rho = 1 + 0.8 * np.cos(th)
    d = w1_circle((th, rho), (th, np.roll(rho, 1)))
    assert 0 < d <= TWO_PI / 64 + 1e-12
    # against samples, by dense quadrature of the same interpolant's CDF
    y = np.array([0.5, 3.0, 4.0])
    fine = np.linspace(0, TWO_PI, 400_001)
    r = np.interp(fine, np.r_[th, TWO_PI], np.r_[rho, rho[0]])
    F = integrate.cumulative_trapezoid(r, fine, initial=0) / np.trapezoid(r, fine)
    D = F - (fine[:, None] >= y).mean(axis=1)
    ref = np.trapezoid(np.abs(D - np.median(D)), fine)   # the median of D minimises
    assert w1_circle((th, rho), y) == pytest.approx(ref, abs=2e-5)


@pytest.mark.parametrize("bad, exc", [
    ([np.nan, 1.0], ArgumentError), ("x", ArgumentTypeError), (np.ones((3, 3)), ArgumentError),
    ([], ArgumentError), ((np.array([0.0, 1.0]), np.array([1.0, -1.0])), ArgumentError),
    ((np.array([1.0, 0.0]), np.array([1.0, 1.0])), ArgumentError)])
def test_bad_measures_raise(bad, exc):
    with pytest.raises(exc, match="a"):
        w1_line(bad, [0.0])


def test_bad_weights_raise():
    with pytest.raises(ArgumentError, match="weights of a"):
        w1_line([0.0, 1.0], [0.0], weights_a=[1.0, -1.0])
    with pytest.raises(ArgumentError, match="weights of b"):
        w2_line([0.0, 1.0], [0.0], weights_b=[1.0, 1.0])
    with pytest.raises(ArgumentError, match="angles must lie"):
        w1_circle((np.array([0.0, 7.0]), np.ones(2)), [0.0])


def test_distance_to_pde_checks_its_arguments():
    with pytest.raises(ArgumentTypeError, match="traj"):
        distance_to_pde(np.zeros((2, 3, 1)), None)
