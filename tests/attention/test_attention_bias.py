"""Affine query/key/value maps and an output bias on Attention.

The field with biases is

    Gamma(x) = W_O concat_h( sum_j a_h(x, x_j) (V_h x_j + b_V,h) ) + b_O,
    score s_h(x, y) = beta <Q_h x + b_Q,h, K_h y + b_K,h>,

for every kind, with heads, masking and every backend: it matches the loop transcription
of :mod:`transformer_pde.testing.references`, and an independent identity (an affine map
on R^d is a linear map on the augmented tokens (x, 1) in R^{d+1}).
"""

from __future__ import annotations

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.attention import KINDS, Layers
from transformer_pde.blocks import MLP, LayerNorm
from transformer_pde.errors import ArgumentError
from transformer_pde.testing import references

def problem(seed, d, heads):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(7, d))
    Q, K, V, W_O = (0.5 * rng.normal(size=(d, d)) for _ in range(4))
    bQ, bK, bV, bO = (rng.normal(size=d) for _ in range(4))
    pos = rng.uniform(size=7)
    return X, Q, K, V, W_O, bQ, bK, bV, bO, pos


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_biased_field_matches_loop_reference(kind, heads, masked, backend):
    if masked and not KINDS[kind].maskable:
        pytest.skip(f"{kind} is not maskable")
    X, Q, K, V, W_O, bQ, bK, bV, bO, pos = problem(3, 4, heads)
    beta = 1.0 if kind == "l2" else 0.7
    att = tp.Attention(kind, Q, K, V, heads=heads, masked=masked, beta=beta, W_O=W_O,
                       b_Q=bQ, b_K=bK, b_V=bV, b_O=bO)
    got = tp.velocity(att, X, positions=pos if masked else None, backend=backend)
    want = references.field(kind, X, Q, K, V, b_Q=bQ, b_K=bK, b_V=bV, heads=heads, beta=beta,
                            W_O=W_O, b_O=bO, positions=pos if masked else None)
    # double precision on O(1) values (a few thousand roundings at most);
    # sinkhorn: the library's 1e-9 inner stopping rule
    tol = 1e-8 if kind == "sinkhorn" else 1e-11
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["softmax", "l2", "sinkhorn", "linear", "relu", "exp"])
def test_affine_maps_equal_linear_maps_on_augmented_tokens(kind):
    """Independent route: (x, 1) in R^{d+1} with Q~ = [Q | b_Q], K~ = [K | b_K] and
    V~ = [[V, b_V], [0, 0]] gives the biased field in the first d coordinates (the
    library's unbiased code path)."""
    d = 3
    X, Q, K, V, _, bQ, bK, bV, _, _ = problem(5, d, 1)
    Qr, Kr = Q[:2], K[:2]  # k = 2 < d: rectangular queries and keys
    att = tp.Attention(kind, Qr, Kr, V, b_Q=bQ[:2], b_K=bK[:2], b_V=bV)
    Xa = np.hstack([X, np.ones((X.shape[0], 1))])
    Va = np.zeros((d + 1, d + 1))
    Va[:d, :d], Va[:d, d] = V, bV
    aug = tp.Attention(kind, np.hstack([Qr, bQ[:2, None]]), np.hstack([Kr, bK[:2, None]]), Va)
    got = tp.velocity(att, X)
    want = tp.velocity(aug, Xa)
    assert np.all(want[:, d] == 0)   # the zero last row of V~ multiplies to exact zeros
    tol = 1e-8 if kind == "sinkhorn" else 1e-12
    np.testing.assert_allclose(got, want[:, :d], rtol=tol, atol=tol)


def test_key_bias_cancels_for_softmax_but_not_for_linear():
    X, Q, K, V, _, bQ, bK, bV, _, _ = problem(1, 3, 1)
    for kind, cancels in (("softmax", True), ("linear", False)):
        a = tp.velocity(tp.Attention(kind, Q, K, V, b_K=bK), X)
        b = tp.velocity(tp.Attention(kind, Q, K, V), X)
        assert np.allclose(a, b, atol=1e-12) == cancels


def test_zero_biases_give_the_unbiased_field():
    X, Q, K, V, W_O, *_ = problem(2, 4, 2)
    att = tp.Attention("softmax", Q, K, V, heads=2, W_O=W_O)
    assert not att.has_bias and not att.at(0.0).has_bias
    zero = tp.Attention("softmax", Q, K, V, heads=2, W_O=W_O, b_Q=np.zeros(4),
                        b_K=np.zeros(4), b_V=np.zeros(4), b_O=np.zeros(4))
    assert zero.has_bias
    np.testing.assert_allclose(tp.velocity(zero, X), tp.velocity(att, X), rtol=0, atol=1e-15)


def test_bias_tables_and_callables_follow_time():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(5, 2))
    b0, b1 = rng.normal(size=2), rng.normal(size=2)
    tab = Layers(np.stack([b0, b1])[:, None, :])
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), b_V=tab,
                       b_O=lambda t: t * np.ones(2))
    assert att.time_dependent and att.tables == [tab]
    for t, bv in ((0.2, b0), (1.5, b1)):
        want = tp.velocity(tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), b_V=bv,
                                        b_O=t * np.ones(2)), X)
        np.testing.assert_allclose(tp.velocity(att, X, t=t), want, atol=1e-14)
    # the left limit at a layer boundary is the previous layer's bias
    np.testing.assert_allclose(att.at(1.0, left=True).heads[0].bV, b0)
    np.testing.assert_allclose(att.at(1.0).heads[0].bV, b1)


def test_bias_validation():
    I2 = np.eye(2)
    with pytest.raises(ValueError, match="b_Q must have 2 entries"):
        tp.Attention("softmax", I2, I2, I2, b_Q=np.ones(3))
    with pytest.raises(ValueError, match="b_V contains NaN"):
        tp.Attention("softmax", I2, I2, I2, b_V=[np.nan, 0.0])
    with pytest.raises(ValueError, match="b_O must be a non-empty vector"):
        tp.Attention("softmax", I2, I2, I2, b_O=np.ones((2, 2)))
    with pytest.raises(TypeError, match="b_K must be a real vector"):
        tp.Attention("softmax", I2, I2, I2, b_K=["a", "b"])
    with pytest.raises(ValueError, match=r"shape \(L, 1, n\)"):
        tp.Attention("softmax", I2, I2, I2, b_Q=Layers(np.ones((2, 2, 2))))
    # rectangular Q (k x d): b_Q and b_K have k entries, b_V and b_O have d
    att = tp.Attention("softmax", np.ones((1, 2)), np.ones((1, 2)), I2, b_Q=[1.0], b_K=[2.0],
                       b_V=[0.0, 1.0])
    assert att.at(0.0).heads[0].bQ.shape == (1,)


def test_bias_roundtrip_and_trajectory_file(tmp_path):
    X, Q, K, V, W_O, bQ, bK, bV, bO, _ = problem(6, 4, 2)
    att = tp.Attention("softmax", Q, K, V, heads=2, W_O=W_O, b_Q=bQ, b_K=bK,
                       b_V=Layers(np.stack([bV, -bV])[:, None]), b_O=bO)
    again = tp.Attention.from_dict(att.to_dict())
    np.testing.assert_array_equal(tp.velocity(again, X, t=1.5), tp.velocity(att, X, t=1.5))
    assert "biases=b_Q/b_K/b_V/b_O" in repr(att)
    np.testing.assert_array_equal(att.replace(beta=2.0).b_O, att.b_O)
    tr = tp.simulate(att, X, t_max=2.0, dt=0.5, solver="rk4")
    path = tr.save(tmp_path / "t.npz")
    back = tp.load(path)
    np.testing.assert_array_equal(tp.velocity(back.attention, X, t=1.5),
                                  tp.velocity(att, X, t=1.5))
    # no biases: nothing new is stored
    assert "b_Q" not in tp.Attention("softmax", Q, K, V).to_dict()


def test_gaussian_module_and_stability_bound_refuse_biases():
    from transformer_pde import gaussian
    from transformer_pde.diagnostics import stability_bound
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), b_V=np.ones(2))
    with pytest.raises(ArgumentError, match="bias vectors"):
        gaussian.affine_field(att, np.zeros(2), np.eye(2))
    with pytest.raises(ArgumentError, match="bias"):
        stability_bound(att, 1.0, [0.0, 1.0])


def test_post_norm_pair_is_a_bert_layer():
    """layernorm=(LN1, LN2) post-norm: x = LN1(x + Attn x); x = LN2(x + MLP x)."""
    rng = np.random.default_rng(9)
    d, n, m = 4, 5, 6
    X0 = rng.normal(size=(n, d))
    Q, K, V, W_O = (0.6 * rng.normal(size=(d, d)) for _ in range(4))
    bQ, bK, bV, bO = (rng.normal(size=d) for _ in range(4))
    W1, b1, W2, b2 = rng.normal(size=(m, d)), rng.normal(size=m), rng.normal(size=(d, m)), \
        rng.normal(size=d)
    g1, s1, g2, s2 = (rng.normal(size=d) for _ in range(4))
    att = tp.Attention("softmax", Q, K, V, heads=2, beta=0.5, W_O=W_O, b_Q=bQ, b_K=bK,
                       b_V=bV, b_O=bO)
    ln1 = LayerNorm("post", eps=1e-12, scale=g1, shift=s1)
    ln2 = LayerNorm("post", eps=1e-12, scale=g2, shift=s2)
    tr = tp.simulate(att, X0, t_max=3.0, dt=1.0, solver="euler",
                     block=tp.Block(mlp=MLP(W1, W2, b1, b2), layernorm=(ln1, ln2),
                                    splitting="lie"))
    assert tr.info["layernorm"] == "post"

    def ln(x, g, s):
        c = x - x.mean(1, keepdims=True)
        return c / np.sqrt((c ** 2).mean(1, keepdims=True) + 1e-12) * g + s

    from scipy.special import erf
    X = X0
    for ell in range(3):
        a = references.field("softmax", X, Q, K, V, b_Q=bQ, b_K=bK, b_V=bV, heads=2, beta=0.5,
                             W_O=W_O, b_O=bO)
        X = ln(X + a, g1, s1)
        z = X @ W1.T + b1
        X = ln(X + (0.5 * z * (1 + erf(z / np.sqrt(2)))) @ W2.T + b2, g2, s2)
        np.testing.assert_allclose(tr.states[ell + 1], X, rtol=0, atol=1e-11)
    with pytest.raises(ArgumentError, match="needs mlp="):
        tp.Block(layernorm=(ln1, ln2))
    with pytest.raises(ArgumentError, match="needs mlp="):
        tp.Block(mlp=MLP(W1, W2), layernorm=(ln1, ln2), splitting="none")
    with pytest.raises(ArgumentError, match="two pre-norm or two post-norm"):
        tp.Block(mlp=MLP(W1, W2), layernorm=(ln1, LayerNorm("pre")))
    with pytest.raises(ArgumentError, match="constraint of their own"):
        tp.Block(mlp=MLP(W1, W2), layernorm=(ln1, ln2), constraint="sphere")
    # Strang with the pair: LN1 after each attention half, LN2 after the MLP
    st = tp.simulate(att, X0, t_max=1.0, dt=1.0, solver="euler",
                     block=tp.Block(mlp=MLP(W1, W2, b1, b2), layernorm=(ln1, ln2),
                                    splitting="strang"))
    assert st.status == "ok"
