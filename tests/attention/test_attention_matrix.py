"""Attention matrices (``transformer_pde.fields.attention_matrix``).

Rows are probability vectors (sum 1 to 1e-15 per row, entries in [0, 1]), masked entries
and zero-weight tokens exactly 0, and the matrix reproduces the library's field: with the
identity output map, head ``h`` of the field is ``P[h] @ (X V_h^T + b_V_h)`` to 1e-13
relative (the field sums the same terms in another order, blockwise with a running
maximum).  Checked for softmax and l2 with every bias, masks, grouped heads, rotary
positions and non-uniform weights; also against a dense loop reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from rotary_reference import expand_groups, rotation

import transformer_pde as tp
from transformer_pde.attention import Rotary
from transformer_pde.errors import ArgumentError, ArgumentTypeError, ScoreOverflowError
from transformer_pde.fields import attention_matrix

D, H, G = 8, 4, 2
M = D // H


def setup(seed=0, n=9):
    rng = np.random.default_rng(seed)
    kw = dict(Q=0.8 * rng.normal(size=(D, D)), K=0.8 * rng.normal(size=(G * M, D)),
              V=rng.normal(size=(G * M, D)), b_Q=rng.normal(size=D),
              b_K=rng.normal(size=G * M), b_V=rng.normal(size=G * M))
    X = rng.normal(size=(n, D))
    pos = rng.permutation(n) / 16.0
    w = rng.uniform(0.1, 1.0, size=n)
    w[3] = 0.0
    return kw, X, pos, w


CASES = [dict(), dict(masked=True), dict(rotary=Rotary(span=16.0)),
         dict(masked=True, rotary=Rotary(span=16.0, dim=2, pairing="half"))]


@pytest.mark.parametrize("kind", ["softmax", "l2"])
@pytest.mark.parametrize("opts", CASES)
def test_rows_are_probabilities_and_reproduce_the_field(kind, opts):
    kw, X, pos, w = setup()
    att = tp.Attention(kind, heads=H, kv_heads=G, beta=1.0 if kind == "l2" else 0.6,
                       **opts, **kw)
    P = attention_matrix(att, X, weights=w, positions=pos)
    assert P.shape == (H, 9, 9) and P.dtype == np.float64
    assert np.all((P >= 0) & (P <= 1))
    np.testing.assert_allclose(P.sum(axis=2), 1.0, rtol=0, atol=1e-15)
    assert np.all(P[:, :, 3] == 0.0)                         # a token of weight 0
    if opts.get("masked"):
        hidden = pos[None, :] > pos[:, None]
        assert np.all(P[:, hidden] == 0.0) and np.all(P[:, ~hidden & (w > 0)] > 0)
    field = tp.velocity(att, X, weights=w, positions=pos)
    Vx = X @ expand_groups(kw["V"], H, G, M).T + expand_groups(kw["b_V"], H, G, M)
    for h in range(H):
        rows = slice(h * M, (h + 1) * M)
        np.testing.assert_allclose(P[h] @ Vx[:, rows], field[:, rows], rtol=0,
                                   atol=1e-13 * np.abs(field).max())


def test_matrix_matches_a_dense_loop_reference():
    kw, X, pos, w = setup(seed=1, n=6)
    att = tp.Attention("softmax", heads=H, kv_heads=G, masked=True, beta=0.9,
                       rotary=Rotary(span=16.0, base=20.0), **kw)
    P = attention_matrix(att, X, weights=w, positions=pos)
    for h in range(H):
        g = h // (H // G)
        q_rows, k_rows = slice(h * M, (h + 1) * M), slice(g * M, (g + 1) * M)
        for i in range(6):
            Ri = rotation(pos[i], M, M, 20.0, 16.0, "interleaved")
            q = Ri @ (kw["Q"][q_rows] @ X[i] + kw["b_Q"][q_rows])
            a = np.array([w[j] * np.exp(0.9 * q @ (
                rotation(pos[j], M, M, 20.0, 16.0, "interleaved")
                @ (kw["K"][k_rows] @ X[j] + kw["b_K"][k_rows])))
                if pos[j] <= pos[i] else 0.0 for j in range(6)])
            np.testing.assert_allclose(P[h, i], a / a.sum(), rtol=0, atol=1e-14)


def test_rows_follow_the_callers_token_order():
    kw, X, pos, w = setup(seed=2)
    att = tp.Attention("softmax", heads=H, kv_heads=G, masked=True,
                       rotary=Rotary(span=16.0), **kw)
    P = attention_matrix(att, X, weights=w, positions=pos)
    order = np.argsort(pos)
    Ps = attention_matrix(att, X[order], weights=w[order], positions=pos[order])
    np.testing.assert_allclose(Ps, P[:, order][:, :, order], rtol=0, atol=1e-15)


def test_float32_and_time_dependent_parameters():
    kw, X, pos, w = setup(seed=3)
    Q = tp.Layers(np.stack([kw["Q"], 2 * kw["Q"]]))
    att = tp.Attention("softmax", Q, kw["K"], kw["V"], heads=H, kv_heads=G)
    P32 = attention_matrix(att, X, t=1.0, dtype=np.float32)
    assert P32.dtype == np.float32
    P1 = attention_matrix(att, X, t=1.0)
    np.testing.assert_allclose(P32, P1, rtol=0, atol=1e-5)
    assert np.abs(P1 - attention_matrix(att, X, t=0.0)).max() > 1e-3


def test_large_scores_give_the_limit_and_overflow_is_refused():
    X = np.array([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=1e5)
    P = attention_matrix(att, X)[0]
    np.testing.assert_array_equal(np.diag(P), [1.0, 1.0, 1.0])
    with pytest.raises(ScoreOverflowError, match="overflow"):
        attention_matrix(att.replace(beta=1e308), X * 1e10)


def test_errors():
    I2 = np.eye(2)
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    for kind in ("exp", "linear", "sinkhorn", "galerkin"):
        with pytest.raises(ArgumentError, match="normalised kinds"):
            attention_matrix(tp.Attention(kind, I2, I2, I2), X)
    with pytest.raises(ArgumentTypeError, match="att"):
        attention_matrix("softmax", X)
    masked = tp.Attention("softmax", I2, I2, I2, masked=True)
    with pytest.raises(ArgumentError, match="positions"):
        attention_matrix(masked, X)
    with pytest.raises(ArgumentError, match="rotary.*positions"):
        attention_matrix(tp.Attention("softmax", I2, I2, I2, rotary=Rotary()), X)
    with pytest.raises(ArgumentError, match="query token 0 sees no token"):
        attention_matrix(masked, X, positions=[0.0, 1.0], weights=[0.0, 1.0])
    with pytest.raises(ArgumentError, match="X must have shape"):
        attention_matrix(masked, np.ones((2, 3)), positions=[0.0, 1.0])
    with pytest.raises(ArgumentError, match="dtype"):
        attention_matrix(tp.Attention("softmax", I2, I2, I2), X, dtype=np.int64)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_matrix_of_a_sliding_window_is_the_field_s(window):
    # softmax with V = I and no W_O: the field is A @ X exactly, A the matrix; ties in the
    # positions see each other (the window ends at the query's causal end)
    rng = np.random.default_rng(1)
    n = 9
    X = rng.normal(size=(n, 2))
    pos = rng.random(n)
    pos[3] = pos[5]
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True, window=window)
    A = attention_matrix(att, X, positions=pos)
    A = A[0] if A.ndim == 3 else A
    np.testing.assert_allclose(A @ X, tp.velocity(att, X, positions=pos, backend="numpy"),
                               rtol=0, atol=1e-14)
    if window is not None:      # each row has at most `window` keys, plus ties
        assert ((A > 0).sum(axis=1) <= window + 1).all()
