"""The optional backend method ``sinkhorn_sweep`` (the fused Sinkhorn sweep of the Numba
backend): where the protocol finds it, and the kernel alone against dense logits.

References used: dense logits reduced by ``scipy.special.logsumexp`` (float64) and the
NumPy backend's ``softmax``.  The Sinkhorn solver's use of the sweep (fallbacks, lean
passes, agreement with the two log-domain passes) is tested with the solver.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp

from transformer_pde.backends import Backend, get_backend
from transformer_pde.backends.cupy_backend import CupyBackend
from transformer_pde.backends.numba import NumbaBackend
from transformer_pde.backends.numba import sweep as kernels
from transformer_pde.backends.ranges import KeyRanges
from transformer_pde.errors import ArgumentError, ArgumentTypeError

NP = get_backend("numpy")
NB = NumbaBackend()
A_GEN = np.array([[1.0, 0.5], [-0.3, 0.8]])     # non-symmetric


def test_the_optional_method_is_found_on_numba_and_absent_elsewhere():
    # callers detect the method with getattr(be, "sinkhorn_sweep", None): present on the
    # Numba backend (also through get_backend), absent on NumPy and CuPy and not a
    # member of the protocol every backend implements
    assert callable(getattr(get_backend("numba"), "sinkhorn_sweep", None))
    assert callable(getattr(NB, "sinkhorn_sweep", None))
    assert getattr(NP, "sinkhorn_sweep", None) is None
    assert getattr(CupyBackend, "sinkhorn_sweep", None) is None
    assert "sinkhorn_sweep" not in dir(Backend)
    # the kernels are launched by the backend only: no public launcher
    assert not hasattr(NB, "launch")


def _dense_sweep(q, k, v, bias, w):
    """sinkhorn_sweep's (out, lse, col) from the dense logits (float64, scipy's logsumexp)."""
    L = q.astype(float) @ k.astype(float).T + bias.astype(float)
    lse = logsumexp(L, axis=1)
    P = np.exp(L - lse[:, None])
    out = P @ v.astype(float) if v is not None else None
    return out, lse, w @ P


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("r,c", [(1, 0), (2, 2), (3, 1), (4, 4), (2, 5), (5, 2)])
def test_sweep_against_dense_logits(monkeypatch, dtype, r, c, one_pass):
    # one-pass rows (r, c <= 4 and from ONE_PASS_MIN_PAIRS pairs: exponentials against a
    # Cauchy-Schwarz bound of the row's logits) and the general rows, including rows whose
    # bound is so far above their largest logit that they are redone against the maximum
    # (scaled rows below); float64 to 1e-13 (the sums of 500 terms round at 1e-16 each),
    # float32 to 2e-5
    monkeypatch.setattr(kernels, "ONE_PASS_MIN_PAIRS", 0 if one_pass else 2**62)
    rng = np.random.default_rng(r * 10 + c)
    n, m = 500, 300
    k = rng.normal(size=(n, r))
    q = rng.normal(size=(m, r))
    q[::7] *= 600.0 if dtype == np.float64 else 40.0   # far rows: the bound overshoots
    bias = rng.normal(size=n) - np.log(n)
    v = rng.normal(size=(n, c)) if c else None
    w = rng.uniform(0.5, 1.5, size=m) / m
    q, k, bias = q.astype(dtype), k.astype(dtype), bias.astype(dtype)
    v = None if v is None else v.astype(dtype)
    out, lse, col = NB.sinkhorn_sweep(q, k, v, bias, w)
    ref_out, ref_lse, ref_col = _dense_sweep(q, k, v, bias, w)
    assert lse.dtype == dtype and out.dtype == dtype and col.dtype == np.float64
    if one_pass and r <= 4 and c <= 4:
        # some rows are redone against their maximum (their bound overshoots by more than
        # the kept range), the others are not
        bound = bias.max() + np.linalg.norm(q.astype(float), axis=1) * np.linalg.norm(
            k.astype(float), axis=1).max()
        gap = bound - (q.astype(float) @ k.astype(float).T + bias).max(axis=1)
        far = np.exp(-gap) < kernels._TINY_SUM[np.dtype(dtype)]
        assert 0 < far.sum() < m // 2
    tol = 1e-13 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=tol, atol=tol)
    np.testing.assert_allclose(col, ref_col, rtol=tol * 10, atol=0)
    if c:
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol * np.abs(v).max() * 10)
    else:
        assert out.shape == (m, 0)


def test_sweep_does_not_depend_on_the_threads(rng):
    # rows in a fixed number of chunks with their own column sums, added in order: the
    # same bits on one thread as on all of them
    X = rng.normal(size=(400, 2))
    bias = rng.normal(size=400) * 0.1 - np.log(400)
    w = np.full(400, 1 / 400)
    one = NumbaBackend(n_threads=1).sinkhorn_sweep(X @ A_GEN.T, X, X, bias, w)
    all_ = NB.sinkhorn_sweep(X @ A_GEN.T, X, X, bias, w)
    for a, b in zip(one, all_, strict=True):
        np.testing.assert_array_equal(a, b)
    ref_out, ref_lse = NP.softmax(X @ A_GEN.T, X, X, bias, None)
    np.testing.assert_allclose(one[0], ref_out, atol=1e-14)
    np.testing.assert_allclose(one[1], ref_lse, atol=1e-13)
    logits = (X @ A_GEN.T) @ X.T + bias
    np.testing.assert_allclose(one[2], (w[:, None] * np.exp(logits - ref_lse[:, None])).sum(0),
                               rtol=1e-13)


def test_sweep_column_sums_give_the_next_column_potential(rng):
    # with q = scores / eps and bias = log w + g / eps, g'_j = g_j - eps log(col_j / w_j)
    # is the column soft-min -eps LSE_i(log w_i + (f_i + s_ij) / eps) of f = -eps lse
    n, eps = 300, 0.7
    X = rng.normal(size=(n, 2))
    logw = np.log(rng.uniform(0.5, 1.5, size=n) / n)
    logw -= logsumexp(logw)
    g = rng.normal(size=n) * 0.3
    S = (X @ A_GEN.T) @ X.T
    _, lse, col = NB.sinkhorn_sweep(X @ A_GEN.T / eps, X, None, logw + g / eps, np.exp(logw))
    f = -eps * lse
    g_next = g - eps * (np.log(col) - logw)
    want = -eps * logsumexp(logw[:, None] + (f[:, None] + S) / eps, axis=0)
    np.testing.assert_allclose(g_next, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("args, name", [
    ((np.zeros((3, 2)), np.zeros((4, 3)), None, np.zeros(4), np.ones(3)), "q and k"),
    ((np.zeros(3), np.zeros((4, 2)), None, np.zeros(4), np.ones(3)), "q and k"),
    ((np.zeros((3, 2)), np.zeros((4, 2)), np.zeros((5, 1)), np.zeros(4), np.ones(3)), "v must"),
    ((np.zeros((3, 2)), np.zeros((4, 2)), None, np.zeros(5), np.ones(3)), "bias must"),
    ((np.zeros((3, 2)), np.zeros((4, 2)), None, np.zeros(4), np.ones(4)), "w must"),
])
def test_sweep_refuses_shapes_that_do_not_match(args, name):
    with pytest.raises(ArgumentError, match=name):
        NB.sinkhorn_sweep(*args)


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sweep_over_key_ranges(monkeypatch, dtype, one_pass):
    # block-diagonal systems (independent Sinkhorn problems in one sweep) and general
    # ranges with an empty row: each row over its own keys, column j summed over the rows
    # that see it; against the dense logits restricted by the mask (float64 1e-13,
    # float32 2e-5, as above), and the block-diagonal sweep against the separate sweeps
    monkeypatch.setattr(kernels, "ONE_PASS_MIN_PAIRS", 0 if one_pass else 2**62)
    rng = np.random.default_rng(11)
    sizes = [70, 1, 129, 100]
    n = sum(sizes)
    X = rng.normal(size=(n, 2)).astype(dtype)
    q, bias = (X @ A_GEN.T).astype(dtype), (rng.normal(size=n) - 3.0).astype(dtype)
    w = rng.uniform(0.5, 1.5, size=n) / n
    seg = KeyRanges.segments(sizes)
    hi = rng.integers(0, n + 1, n)
    general = KeyRanges(rng.integers(0, hi + 1), hi, n)
    tol = 1e-13 if dtype == np.float64 else 2e-5
    for ranges in (seg, general):
        out, lse, col = NB.sinkhorn_sweep(q, X, X, bias, w, ranges=ranges)
        L = np.where(ranges.mask(), q.astype(float) @ X.astype(float).T + bias, -np.inf)
        with np.errstate(invalid="ignore"):
            ref_lse = logsumexp(L, axis=1)
        P = np.exp(L - np.where(np.isfinite(ref_lse), ref_lse, 0.0)[:, None])
        assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
        fin = np.isfinite(ref_lse)
        np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=tol, atol=tol)
        np.testing.assert_allclose(out, P @ X.astype(float), rtol=0, atol=tol * 10)
        np.testing.assert_allclose(col, w @ P, rtol=tol * 10, atol=1e-300)
    out, lse, col = NB.sinkhorn_sweep(q, X, X, bias, w, ranges=seg)
    for a, b in zip(np.cumsum(sizes) - sizes, np.cumsum(sizes), strict=True):
        o1, l1, c1 = NB.sinkhorn_sweep(q[a:b], X[a:b], X[a:b], bias[a:b], w[a:b])
        np.testing.assert_allclose(out[a:b], o1, rtol=0, atol=tol)
        np.testing.assert_allclose(lse[a:b], l1, rtol=tol)
        np.testing.assert_allclose(col[a:b], c1, rtol=tol)


def test_sweep_refuses_bad_ranges():
    q = np.zeros((3, 2))
    with pytest.raises(ArgumentTypeError, match="ranges"):
        NB.sinkhorn_sweep(q, q, None, np.zeros(3), np.ones(3), ranges=np.array([1, 2, 3]))
    with pytest.raises(ArgumentError, match="ranges"):
        NB.sinkhorn_sweep(q, q, None, np.zeros(3), np.ones(3), ranges=KeyRanges.prefix([1], 3))
