"""Scores that overflow the float range.

Finite tokens and matrices can give logits beyond 1.8e308.  The rule, on every backend:
the field is right (computed exactly by a power-of-two rescaling of the logits), or
the true value itself overflows (``velocity`` then raises ScoreOverflowError), or a clear
error is raised — never a silently zero / NaN / inf field, never a run that reports ``ok`` with frozen tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.backends.numba import NumbaBackend
from transformer_pde.backends.numpy_backend import NumpyBackend, overflow_scale
from transformer_pde.backends.ranges import KeyRanges
from transformer_pde.errors import ArgumentError, ScoreOverflowError

ONE = [[1.0]]


def test_softmax_of_overflowing_scores_is_right(backend):
    att = tp.Attention("softmax", ONE, ONE, ONE)
    X = np.array([[1e155], [2e155], [3e155]])
    # logits x_i x_j ~ 1e310: every query puts all its mass on the largest token (the other
    # weights are e^(-1e310) = 0 in floating point, so at most one rounding remains)
    np.testing.assert_allclose(tp.velocity(att, X, backend=backend), np.full((3, 1), 3e155),
                               rtol=1e-15)


@pytest.mark.parametrize("scale", [1e150, 1e154, 1e160, 1e200])
def test_softmax_huge_tokens_match_the_exact_limit(backend, scale, rng):
    # 1-D, Q = K = V = 1: x_i > 0 attends (in the limit) to max_j x_j; x_i < 0 to min_j x_j
    x = rng.uniform(-3, 3, 40)
    x[np.abs(x) < 0.1] = 0.5
    X = (x * scale)[:, None]
    got = tp.velocity(tp.Attention("softmax", ONE, ONE, ONE), X, backend=backend)[:, 0]
    want = np.where(x > 0, x.max(), x.min()) * scale
    np.testing.assert_allclose(got, want, rtol=1e-14)


@pytest.mark.parametrize("kind,want", [
    ("sigmoid", "mean_pos"),       # sigma(+huge) = 1, sigma(-huge) = 0
    ("linear", "inf"), ("relu", "inf"), ("exp", "inf"),
])
def test_pointwise_and_exp_kinds_are_right(kind, want, backend):
    att = tp.Attention(kind, ONE, ONE, ONE)
    X = np.array([[1e155], [2e155], [3e155]])
    if want == "inf":              # the true field exceeds the float range: never returned
        with pytest.raises(ScoreOverflowError, match=f"'{kind}' attention field"):
            tp.velocity(att, X, backend=backend)
        return
    # sigmoid(+-1e310) is exactly 1 or 0: the mean of the tokens, to a rounding or two
    np.testing.assert_allclose(tp.velocity(att, X, backend=backend), np.full((3, 1), 2e155),
                               rtol=1e-15)


def test_l2_far_from_origin_is_right(backend):
    # |k|^2 ~ 1e320 overflows, |k - c|^2 does not: every token attends to itself
    att = tp.Attention("l2", ONE, ONE, ONE, l2_beta=1.0)
    X = np.array([[1e160], [1e160 + 1e146], [1e160 + 3e146]])
    np.testing.assert_allclose(tp.velocity(att, X, backend=backend), X, rtol=1e-15)


def test_l2_spread_beyond_float_range_raises(backend):
    att = tp.Attention("l2", ONE, ONE, ONE)
    X = np.array([[1e155], [2e155], [-3e155]])
    with pytest.raises(ScoreOverflowError, match="l2 attention scores overflow"):
        tp.velocity(att, X, backend=backend)


def test_attention_refuses_finite_q_k_with_overflowing_product():
    with pytest.raises(ArgumentError, match="K\\^T Q overflows"):
        tp.Attention("softmax", [[1e200]], [[1e200]], ONE)
    with pytest.raises(ValueError, match="head 1"):
        big = np.eye(4)
        big[2:, 2:] *= 1e160
        tp.Attention("softmax", big, big, np.eye(4), heads=2)
    with pytest.raises(ArgumentError, match="t=2"):
        big = tp.Layers([[[1.0]], [[1.0]], [[1e200]]])
        tp.Attention("softmax", big, big, ONE).at(2.0)
    tp.Attention("softmax", [[1e150]], [[1e150]], ONE)     # 1e300: finite, accepted


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_primitives_with_overflowing_logits_agree(dtype, rng):
    big = np.finfo(dtype).max ** 0.5
    q = (rng.normal(size=(20, 3)) * big).astype(dtype)
    k = (rng.normal(size=(30, 3)) * big).astype(dtype)
    v = rng.normal(size=(30, 2)).astype(dtype)
    assert overflow_scale(q, k, None) > 1.0
    raw = (q.astype(np.float64) / big) @ (k.astype(np.float64) / big).T
    want_idx = raw.argmax(axis=1)          # the softmax concentrates on the largest logit
    hi = rng.integers(1, 31, 20)
    limits = KeyRanges(rng.integers(0, hi), hi, 30)      # general non-empty key ranges
    ref = NumpyBackend()
    # different kernels, the same rescaled logits: the weights concentrate on one key, so
    # the outputs agree to the dtype's rounding (and in their infinities and NaNs)
    tol = {np.float64: 1e-12, np.float32: 1e-5}[dtype]
    for be in (ref, NumbaBackend(), NumbaBackend(kernel="tiled")):
        out, lse = be.softmax(q, k, v, None, None)
        np.testing.assert_allclose(out, v[want_idx], rtol=1e-6)
        assert np.all(lse > 0) and not np.any(np.isnan(lse))
        o2, _ = be.softmax(q, k, v, None, limits)
        np.testing.assert_allclose(o2, ref.softmax(q, k, v, None, limits)[0], rtol=tol, atol=0)
        np.testing.assert_allclose(be.lse(q, k, None, limits), ref.lse(q, k, None, limits),
                                   rtol=tol, atol=0)
        for phi in ("identity", "sigmoid", "relu"):
            with np.errstate(over="ignore", invalid="ignore"):
                np.testing.assert_allclose(
                    be.pointwise(phi, q, k, v, np.ones(30, dtype), limits),
                    ref.pointwise(phi, q, k, v, np.ones(30, dtype), limits), rtol=tol, atol=0)


def test_rescaling_is_exact_when_nothing_overflows(rng):
    # just below the threshold the rescaled path would give the same bits: check the
    # unscaled path is taken and numba agrees with it
    q, k, v = rng.normal(size=(5, 2)) * 1e100, rng.normal(size=(7, 2)) * 1e100, rng.normal(size=(7, 2))
    assert overflow_scale(q, k, None) == 1.0
    np.testing.assert_allclose(NumbaBackend().softmax(q, k, v, None, None)[0],
                               NumpyBackend().softmax(q, k, v, None, None)[0], rtol=1e-12)


def test_simulate_from_huge_tokens_moves_or_stops_with_a_status(backend):
    att = tp.Attention("softmax", ONE, ONE, ONE)
    X0 = np.array([[1e160], [2e160]])
    run = tp.simulate(att, X0, t_max=1.0, dt=0.1, solver="euler",
                      field=tp.FieldOptions(backend=backend))
    # the field at 1e160 is 2e160 (all mass on the larger token): the tokens move
    assert not np.array_equal(run.states[-1], X0)
    assert run.status == "blowup" and "max_norm" in run.message
    np.testing.assert_allclose(run.states[1], X0 + 0.1 * 2e160, rtol=1e-14)
