"""Wasserstein distances depend on the normalised weights only: any scale of the weights
(or of a grid density) gives the same distance, including scales whose sum overflows or
whose values are tiny; non-finite or negative weights are refused naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy import stats

from transformer_pde.errors import ArgumentError
from transformer_pde.meanfield.distance import w1_circle, w1_line, w2_line

TWO_PI = 2 * np.pi


def _quantile_w2(a, wa, b, wb):
    """W2 between two weighted empirical measures on the line from their quantile
    functions, computed independently of the library: both quantile functions are step
    functions of the mass m, constant between the merged cumulative masses, so
    W2^2 = sum over those intervals of (qa - qb)^2 times the interval's length.  The
    weights are normalised here in float64 after dividing by their maximum."""
    def steps(x, w):
        order = np.argsort(x, kind="stable")
        w = np.asarray(w, float)[order] / np.max(w)
        return np.asarray(x, float)[order], np.cumsum(w) / np.sum(w)
    xa, ca = steps(a, wa)
    xb, cb = steps(b, wb)
    cuts = np.unique(np.r_[0.0, ca, cb, 1.0].clip(0.0, 1.0))
    mid = 0.5 * (cuts[:-1] + cuts[1:])
    qa = xa[np.minimum(np.searchsorted(ca, mid), xa.size - 1)]
    qb = xb[np.minimum(np.searchsorted(cb, mid), xb.size - 1)]
    return float(np.sqrt(np.sum((qa - qb) ** 2 * np.diff(cuts))))


def _case(seed=4, n=7, m=5):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=n), rng.uniform(0.5, 1.5, n), rng.normal(0.3, 1.2, size=m),
            rng.uniform(0.5, 1.5, m))


@pytest.mark.parametrize("scale", [1e308, 1e300, 1.0, 1e-300, 5e-324 * 2 ** 40])
def test_weights_of_any_scale_give_the_distance(scale):
    # 1e308 each: the sum overflows to inf (today's bug returned 0); the references get
    # the weights divided by their maximum (the distances depend on normalised weights
    # only).  Rounding-level agreement: both sides integrate the same step functions.
    a, wa, b, wb = _case()
    ref1 = stats.wasserstein_distance(a, b, wa / wa.max(), wb / wb.max())
    ref2 = _quantile_w2(a, wa, b, wb)
    big_a, big_b = wa / wa.max() * scale, wb / wb.max() * scale
    assert w1_line(a, b, weights_a=big_a, weights_b=big_b) == pytest.approx(ref1, rel=1e-12)
    assert w2_line(a, b, weights_a=big_a, weights_b=big_b) == pytest.approx(ref2, rel=1e-12)
    # one measure scaled, the other not
    assert w1_line(a, b, weights_a=big_a, weights_b=wb) == pytest.approx(ref1, rel=1e-12)
    assert w2_line(a, b, weights_a=wa, weights_b=big_b) == pytest.approx(ref2, rel=1e-12)


def test_quantile_reference_agrees_with_scipy_for_w1_in_one_dimension():
    # sanity of the independent W2 reference: for measures whose quantile functions are
    # ordered (b a translate of a), W1 = W2 = the shift
    a, wa, _, _ = _case()
    assert _quantile_w2(a, wa, a + 0.7, wa) == pytest.approx(0.7, rel=1e-14)


def test_circle_weights_of_any_scale():
    rng = np.random.default_rng(9)
    ta, tb = rng.uniform(0, TWO_PI, 9), rng.uniform(0, TWO_PI, 6)
    wa, wb = rng.uniform(0.5, 1.5, 9), rng.uniform(0.5, 1.5, 6)
    ref = w1_circle(ta, tb, weights_a=wa, weights_b=wb)
    assert ref > 0
    for scale in (1e308, 1e-300):
        got = w1_circle(ta, tb, weights_a=wa / wa.max() * scale,
                        weights_b=wb / wb.max() * scale)
        assert got == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("scale", [1e308, 1e-300])
def test_grid_densities_of_any_scale(scale):
    # a grid density is normalised to mass one: its scale cannot matter (1e308: the
    # trapezoid masses overflowed)
    x = np.linspace(-2.0, 2.0, 9)
    rho = np.exp(-x ** 2)
    rho /= rho.max()
    y = np.array([-0.5, 0.1, 1.2])
    for fn in (w1_line, w2_line):
        assert fn((x, rho * scale), y) == pytest.approx(fn((x, rho), y), rel=1e-12)
    th = np.linspace(0, TWO_PI, 16, endpoint=False)
    rc = 1 + 0.5 * np.cos(th)
    rc /= rc.max()
    assert w1_circle((th, rc * scale), y) == pytest.approx(w1_circle((th, rc), y), rel=1e-12)


@pytest.mark.parametrize("bad", [[np.inf, 1.0, 1.0], [np.nan, 1.0, 1.0],
                                 [1.0, -1e-300, 1.0], [0.0, 0.0, 0.0], [-np.inf, 1.0, 1.0]])
@pytest.mark.parametrize("fn", [w1_line, w2_line, w1_circle])
@pytest.mark.parametrize("side", ["a", "b"])
def test_bad_weights_are_refused_naming_the_argument(fn, bad, side):
    pts = np.array([0.1, 0.5, 2.0])
    with pytest.raises(ArgumentError, match=f"weights of {side}"):
        fn(pts, pts[::-1], **{f"weights_{side}": bad})


@pytest.mark.parametrize("bad", [[1e308, np.inf], [1.0, np.nan]])
def test_bad_grid_density_is_refused_naming_the_argument(bad):
    with pytest.raises(ArgumentError, match=r"a\[1\]"):
        w1_line((np.array([0.0, 1.0]), np.array(bad)), [0.5])


@given(ea=st.floats(-300, 308), eb=st.floats(-300, 308), seed=st.integers(0, 2 ** 16),
       n=st.integers(1, 12), m=st.integers(1, 12))
@example(ea=308.0, eb=0.0, seed=1, n=6, m=4)      # sum of the weights of a overflows
@example(ea=-300.0, eb=308.0, seed=2, n=3, m=12)
def test_fuzz_scale_invariance(ea, eb, seed, n, m):
    """Scaling the weights by 10**e for e in [-300, 308] (sums overflowing for the large
    scales) never changes the distances beyond rounding: the weights are normalised
    after dividing by their maximum, so the scaled and unscaled inputs are normalised to
    within a few ulps of each other."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=n), rng.normal(0.2, 1.5, size=m)
    wa, wb = rng.uniform(0.01, 1.0, n), rng.uniform(0.01, 1.0, m)
    sa, sb = wa * 10.0 ** ea, wb * 10.0 ** eb
    assert np.all(np.isfinite(sa)) and np.all(sa > 0) and np.all(np.isfinite(sb))
    for fn in (w1_line, w2_line, w1_circle):
        ref = fn(a, b, weights_a=wa, weights_b=wb)
        got = fn(a, b, weights_a=sa, weights_b=sb)
        assert got == pytest.approx(ref, rel=1e-12, abs=1e-14), fn.__name__
    assert w1_line(a, b, weights_a=sa, weights_b=sb) == pytest.approx(
        stats.wasserstein_distance(a, b, wa, wb), rel=1e-12, abs=1e-14)
