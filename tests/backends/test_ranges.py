"""Per-query key ranges (``KeyRanges``) in the backend primitives, against the dense reference.

Every backend the ``backend`` fixture gives (numpy, numba, cupy on a GPU machine; on Numba
both kernel families, streaming and tiled) reduces query :math:`i` over the keys
:math:`[\\mathrm{lo}_i, \\mathrm{hi}_i)`.  Hypothesis draws the ranges: every query a
different range (empty, single keys, ranges that start and end inside and across the
kernels' key blocks of 128 and 256), block-diagonal segments, causal prefixes inside
segments, sliding windows; biases with :math:`-\\infty` entries (zero-weight keys the
Numba backend removes, recounting both range ends) and finite key biases.

Reference: :mod:`transformer_pde.testing.references` (float64, one query at a time, the
visible keys sliced out).  Tolerances, and why: float64 ``1e-12`` relative to the
largest visible value (softmax outputs are convex combinations of the :math:`v_j`;
logits here are below ~30, so their rounding adds nothing), ``lse`` ``1e-12`` relative;
float32 ``2e-5`` on the same scales (float32 logits of size up to ~8 round at
:math:`5\\cdot 10^{-7}`; float64 totals).  Pointwise: relative to
:math:`\\sum_{j\\in J_i} w_j(|\\varphi(s_{ij})| + \\sum_a |q_{ia}k_{ja}|)|v_j|`, the scale of
the sum and of the rounding of each score.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_pde.backends import get_backend
from transformer_pde.backends.numba import NumbaBackend
from transformer_pde.backends.ranges import KeyRanges, check_ranges
from transformer_pde.errors import ArgumentError, ArgumentTypeError
from transformer_pde.testing import references as R

PHIS = ("identity", "sigmoid", "relu")
TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 2e-5}


def _engines(name: str) -> list:
    """The backend ``name``; for Numba each kernel family (the auto choice depends on r)."""
    if name == "numba":
        return [NumbaBackend(kernel="streaming"), NumbaBackend(kernel="tiled")]
    return [get_backend(name)]


def _segment_sizes(rng: np.random.Generator, n: int) -> list[int]:
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, int(rng.integers(0, 5))),
                              replace=False)) if n > 1 else np.array([], dtype=int)
    return np.diff(np.concatenate(([0], cuts, [n]))).tolist()


@st.composite
def ranged_problems(draw, dtype=np.float64):
    """``(q, k, v, bias, w, ranges)`` with one of the range patterns of the module docstring."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pattern = draw(st.sampled_from(["random", "segments", "causal segments", "window"]))
    n = draw(st.sampled_from([1, 7, 130, 300, 600]))     # one key; across 128/256 blocks
    if pattern == "random":
        m = draw(st.integers(1, 40))
        lo = rng.integers(0, n + 1, m)
        hi = lo + rng.integers(0, n - lo + 1)
        special = [(0, 0), (n, n), (n // 2, n // 2), (0, 1), (n - 1, n), (0, n),
                   (min(127, n - 1), min(129, n)), (min(255, n), min(257, n))]
        for i, (a, b) in enumerate(special[:m]):        # lo = hi, single keys, full, edges
            if draw(st.booleans()):
                lo[i], hi[i] = a, b
        ranges = KeyRanges(lo, hi, n)
    else:                                               # self-attention: queries = keys
        m = n
        seg = KeyRanges.segments(_segment_sizes(rng, n))
        lo, hi = seg.lo, seg.hi
        if pattern != "segments":
            hi = np.arange(1, n + 1)                    # causal: up to and with itself
            if pattern == "window":
                lo = np.maximum(lo, hi - draw(st.sampled_from([1, 3, 200])))
        ranges = KeyRanges(lo, hi, n)
    r = draw(st.sampled_from([2, 9]))
    c = draw(st.sampled_from([1, 3]))
    scale = draw(st.sampled_from([0.0, 1.0, 8.0]))
    q = rng.normal(size=(m, r)) * np.sqrt(scale / r)
    k = rng.normal(size=(n, r)) * np.sqrt(scale)
    v = rng.normal(size=(n, c))
    bias = np.log(rng.uniform(0.1, 1.0, n))             # key biases (log weights)
    if draw(st.booleans()):                             # zero weights
        bias[rng.random(n) < draw(st.sampled_from([0.2, 0.9]))] = -np.inf
    w = np.exp(bias)
    cast = [a.astype(dtype) for a in (q, k, v, bias, w)]
    return (*cast, ranges)


def _check_softmax(be, p):
    q, k, v, bias, _, ranges = p
    tol = TOL[q.dtype]
    out, lse = be.softmax(*[be.asarray(a) for a in (q, k, v, bias)], ranges)
    out, lse = be.to_numpy(out), be.to_numpy(lse)
    assert out.dtype == lse.dtype == q.dtype
    ref_out, ref_lse = R.softmax(q, k, v, bias, ranges)
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol * np.abs(v).max())
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=tol, atol=tol)
    lse_only = be.to_numpy(be.lse(be.asarray(q), be.asarray(k), be.asarray(bias), ranges))
    np.testing.assert_allclose(lse_only[fin], ref_lse[fin], rtol=tol, atol=tol)
    assert np.array_equal(np.isneginf(lse_only), np.isneginf(ref_lse))


def _check_pointwise(be, p, phi):
    q, k, v, _, w, ranges = p
    out = be.to_numpy(be.pointwise(phi, *[be.asarray(a) for a in (q, k, v, w)], ranges))
    assert out.dtype == q.dtype
    f64 = [a.astype(np.float64) for a in (q, k, v, w)]
    ref = R.pointwise(phi, *f64, ranges)
    s = f64[0] @ f64[1].T
    mag = {"identity": np.abs(s), "sigmoid": 1 / (1 + np.exp(-np.clip(s, -700, 700))),
           "relu": np.maximum(s, 0)}[phi] + np.abs(f64[0]) @ np.abs(f64[1]).T
    scale = (np.where(ranges.mask(), mag, 0.0) * f64[3]) @ np.abs(f64[2])
    tiny = np.finfo(q.dtype).tiny * (1.0 + f64[3] @ np.abs(f64[2]))
    assert np.all(np.abs(out - ref) <= TOL[q.dtype] * scale + tiny)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@settings(max_examples=25)
@given(data=st.data())
def test_softmax_and_lse_over_ranges(backend, dtype, data):
    p = data.draw(ranged_problems(dtype))
    for be in _engines(backend):
        _check_softmax(be, p)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@settings(max_examples=12)
@given(data=st.data())
def test_pointwise_over_ranges(backend, dtype, data):
    p = data.draw(ranged_problems(dtype))
    for be in _engines(backend):
        for phi in PHIS:
            _check_pointwise(be, p, phi)


@pytest.mark.parametrize("sizes", [[5, 300, 1, 170], [130] * 5, [7] * 3])
def test_segments_equal_separate_runs(backend, rng, sizes):
    """Block-diagonal ranges: each segment's result is the one of that segment alone (to
    rounding: a segment alone is reduced with other blocks and tiles).  Equal segments
    (an ensemble) are the NumPy reference's batched (B, s, s) products and, at 130, cross
    the Numba kernels' key blocks of 128."""
    n = sum(sizes)
    q, k, v = rng.normal(size=(n, 9)) / 3, rng.normal(size=(n, 9)), rng.normal(size=(n, 2))
    bias = rng.normal(size=n)
    seg = KeyRanges.segments(sizes)
    for be in _engines(backend):
        out, lse = (be.to_numpy(a) for a in be.softmax(q, k, v, bias, seg))
        pw = be.to_numpy(be.pointwise("sigmoid", q, k, v, np.exp(bias), seg))
        for a, b in zip(seg.lo[np.cumsum(sizes) - 1], seg.hi[np.cumsum(sizes) - 1], strict=True):
            o1, l1 = (be.to_numpy(x) for x in be.softmax(q[a:b], k[a:b], v[a:b], bias[a:b],
                                                          None))
            np.testing.assert_allclose(out[a:b], o1, rtol=0, atol=1e-13)
            np.testing.assert_allclose(lse[a:b], l1, rtol=1e-13)
            p1 = be.to_numpy(be.pointwise("sigmoid", q[a:b], k[a:b], v[a:b], np.exp(bias[a:b]),
                                          None))
            np.testing.assert_allclose(pw[a:b], p1, rtol=1e-12, atol=1e-13)


def test_prefix_ranges_are_none_when_full(backend, rng):
    """``KeyRanges.full`` and ``None`` give the same bits (both: every key)."""
    q, k, v = rng.normal(size=(40, 3)), rng.normal(size=(300, 3)), rng.normal(size=(300, 2))
    for be in _engines(backend):
        a = [be.to_numpy(x) for x in be.softmax(q, k, v, None, None)]
        b = [be.to_numpy(x) for x in be.softmax(q, k, v, None, KeyRanges.full(40, 300))]
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("make, err", [
    (lambda: KeyRanges(np.array([2, 0]), np.array([1, 3]), 4), ArgumentError),     # decreasing
    (lambda: KeyRanges(np.array([-1, 0]), np.array([1, 3]), 4), ArgumentError),    # lo < 0
    (lambda: KeyRanges(np.array([0, 0]), np.array([1, 5]), 4), ArgumentError),     # hi > n
    (lambda: KeyRanges(np.array([0, 0, 0]), np.array([1, 3]), 4), ArgumentError),  # lengths
    (lambda: KeyRanges(np.zeros((2, 1), int), np.ones((2, 1), int), 4), ArgumentError),
    (lambda: KeyRanges(np.array([0.0, 1.0]), np.array([1, 3]), 4), ArgumentTypeError),
    (lambda: KeyRanges(np.array([0, 0]), np.array([True, True]), 4), ArgumentTypeError),
    (lambda: KeyRanges.prefix(np.array([1.5, 2.0]), 4), ArgumentTypeError),
    (lambda: KeyRanges.segments([2, 0, 1]), ArgumentError),
])
def test_bad_ranges_are_refused_at_construction(make, err):
    with pytest.raises(err, match="ranges|segments"):
        make()


@pytest.mark.parametrize("ranges, err", [
    (np.array([1, 2, 3]), ArgumentTypeError),              # raw prefix lengths
    ([0, 1, 2], ArgumentTypeError),
    (KeyRanges.prefix([1, 2], 4), ArgumentError),          # two ranges for three queries
    (KeyRanges.prefix([1, 2, 3], 5), ArgumentError),       # over five keys, four given
])
def test_primitives_refuse_ranges_that_do_not_fit(backend, ranges, err):
    q, k, v = np.zeros((3, 2)), np.zeros((4, 2)), np.zeros((4, 1))
    for be in _engines(backend):
        with pytest.raises(err, match="ranges"):
            be.softmax(q, k, v, None, ranges)
        with pytest.raises(err, match="ranges"):
            be.lse(q, k, None, ranges)
        with pytest.raises(err, match="ranges"):
            be.pointwise("relu", q, k, v, np.ones(4), ranges)
    with pytest.raises(err, match="ranges"):
        check_ranges(ranges, 3, 4)
