"""RMSNorm: values, depth-dependent gains, pre- and post-norm blocks, records, refusals.

References are NumPy formulas written here; "rounding only" tolerances (1e-13 and below)
are used where the library and the reference do the same operations in another order.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.blocks import MLP, LayerNorm, RMSNorm
from transformer_pde.errors import ArgumentError, ArgumentTypeError


# ------------------------------------------------------------------ independent references
def rms_ref(X, gamma=1.0, eps=0.0):
    return gamma * X / np.sqrt(np.mean(X ** 2, axis=1, keepdims=True) + eps)


def causal_softmax(X, Q, K, V, beta):
    """Masked (causal) softmax attention, one head: token i averages tokens j <= i."""
    n = X.shape[0]
    L = beta * (X @ Q.T) @ (X @ K.T).T
    L = np.where(np.tril(np.ones((n, n), dtype=bool)), L, -np.inf)
    W = np.exp(L - L.max(axis=1, keepdims=True))
    return (W / W.sum(axis=1, keepdims=True)) @ (X @ V.T)


def swiglu(X, W1, W2, G):
    g = X @ G.T
    return ((g / (1.0 + np.exp(-g))) * (X @ W1.T)) @ W2.T


def positions(n):
    return np.arange(n) / n


# ------------------------------------------------------------------ values
@pytest.mark.parametrize("eps", [0.0, 1e-5])
def test_rmsnorm_values_with_and_without_gain(eps):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(6, 5)) * np.array([[1e-3], [1.0], [10.0], [1.0], [0.5], [3.0]])
    g = rng.uniform(0.5, 2.0, size=5)
    # rounding only: the same divisions, the mean taken in another order
    np.testing.assert_allclose(RMSNorm(eps=eps)(X), rms_ref(X, eps=eps), rtol=1e-14, atol=0)
    np.testing.assert_allclose(RMSNorm(eps=eps, scale=g)(X), rms_ref(X, g, eps), rtol=1e-14,
                               atol=0)
    if eps == 0.0:
        # without eps and gain: the radial projection onto the sphere of radius sqrt(d)
        np.testing.assert_allclose(np.linalg.norm(RMSNorm()(X), axis=1), np.sqrt(5), rtol=1e-14)
    else:
        # eps shrinks small tokens: |RMS(x)| < sqrt(d), noticeably for |x| ~ 1e-3
        assert np.linalg.norm(RMSNorm(eps=eps)(X)[0]) < 0.99 * np.sqrt(5)


def test_rmsnorm_time_dependent_gain_callable_and_layers_left_limit():
    X = np.array([[1.0, -2.0, 2.0], [0.5, 0.0, 1.0]])
    fn = RMSNorm(scale=lambda t: np.array([1.0 + t, 1.0, 2.0 * t]))
    np.testing.assert_allclose(fn(X, 2.0), rms_ref(X, np.array([3.0, 1.0, 4.0])), rtol=1e-14)
    g = np.array([[[1.0, 2.0, 3.0]], [[-1.0, 0.5, 4.0]], [[7.0, 8.0, 9.0]]])
    rn = RMSNorm(scale=tp.Layers(g))
    for t, left, layer in [(0.0, False, 0), (0.999, False, 0), (1.0, False, 1),
                           (1.0, True, 0), (1.5, True, 1), (2.0, True, 1), (2.0, False, 2),
                           (9.0, False, 2)]:
        # the table is right-continuous; left=True is its left limit at a boundary
        np.testing.assert_allclose(rn(X, t, left=left), rms_ref(X, g[layer, 0]), rtol=1e-14,
                                   err_msg=f"t={t}, left={left}")


def test_rmsnorm_zero_token_is_nan_without_warning_and_float32_kept():
    X = np.array([[0.0, 0.0], [3.0, 4.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = RMSNorm()(X)
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
    np.testing.assert_array_equal(RMSNorm(eps=1e-5)(X)[0], 0.0)   # eps > 0: zero stays zero
    out32 = RMSNorm(scale=[1.0, 2.0])(X[1:].astype(np.float32))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, rms_ref(X[1:], np.array([1.0, 2.0])), rtol=1e-6)


def test_rmsnorm_validation_names_the_option():
    with pytest.raises(ArgumentError, match="RMSNorm: mode"):
        RMSNorm("middle")
    with pytest.raises(ArgumentError, match="RMSNorm: eps"):
        RMSNorm(eps=-1e-5)
    with pytest.raises(ArgumentError, match="scale must be a vector"):
        RMSNorm(scale=np.ones((2, 3)))
    with pytest.raises(ArgumentTypeError, match="scale must be a real"):
        RMSNorm(scale="x")
    with pytest.raises(ArgumentError, match="scale must have 3 entries, got 2"):
        RMSNorm(scale=[1.0, 2.0])(np.ones((1, 3)))
    with pytest.raises(ArgumentError, match="scale must have 3 entries"):
        RMSNorm(scale=tp.Layers(np.ones((2, 1, 4))))(np.ones((1, 3)), 1.0)
    assert repr(RMSNorm("post", 1e-6)) == "RMSNorm(mode='post', eps=1e-06, scale=None)"


# ------------------------------------------------------------------ pre-norm decoder block
def test_pre_norm_rms_decoder_equals_layer_loop():
    # Euler, dt = 1, Lie splitting: step l is exactly layer l of a Llama-type decoder
    # x += Attn_l(RMS1_l x); x += MLP_l(RMS2_l x), with per-layer tables everywhere
    rng = np.random.default_rng(28)
    L, n, d, m, beta, eps = 3, 6, 4, 7, 0.7, 1e-5
    Qs, Ks, Vs = (0.6 * rng.normal(size=(L, d, d)) for _ in range(3))
    W1s, Gs = 0.5 * rng.normal(size=(L, m, d)), 0.5 * rng.normal(size=(L, m, d))
    W2s = 0.3 * rng.normal(size=(L, d, m))
    g1, g2 = (1.0 + 0.2 * rng.normal(size=(L, 1, d)) for _ in range(2))
    att = tp.Attention("softmax", tp.Layers(Qs), tp.Layers(Ks), tp.Layers(Vs), beta=beta,
                       masked=True)
    mlp = MLP(tp.Layers(W1s), tp.Layers(W2s), activation="silu", gate=tp.Layers(Gs))
    block = tp.Block(mlp=mlp, layernorm=(RMSNorm("pre", eps, scale=tp.Layers(g1)),
                                         RMSNorm("pre", eps, scale=tp.Layers(g2))),
                     splitting="lie")
    X0 = rng.normal(size=(n, d))
    tr = tp.simulate(att, X0, t_max=L, dt=1.0, solver="euler", positions=positions(n),
                     block=block)
    X = X0.copy()
    for ell in range(L):
        X = X + causal_softmax(rms_ref(X, g1[ell, 0], eps), Qs[ell], Ks[ell], Vs[ell], beta)
        X = X + swiglu(rms_ref(X, g2[ell, 0], eps), W1s[ell], W2s[ell], Gs[ell])
        # rounding only (same operations in another order)
        np.testing.assert_allclose(tr.states[ell + 1], X, rtol=0, atol=1e-13)
    assert tr.info["layernorm"] == "pre" and tr.info["layernorm_type"] == ["rms", "rms"]
    assert tr.info["mlp"] == "silu" and tr.info["mlp_gated"] is True
    # every table of the block is known to the stepper (multistep restarts, breakpoints)
    assert len(block.tables) == 5


def test_single_pre_rmsnorm_serves_both_fields_and_mixes_with_layernorm():
    rng = np.random.default_rng(3)
    n, d = 5, 3
    Q, K, V = (rng.normal(size=(d, d)) for _ in range(3))
    W1, W2 = rng.normal(size=(4, d)), rng.normal(size=(d, 4))
    att = tp.Attention("softmax", Q, K, V, masked=True)
    X0 = rng.normal(size=(n, d))
    run = lambda ln: tp.simulate(att, X0, t_max=2.0, dt=1.0, solver="euler",  # noqa: E731
                                 positions=positions(n), block=tp.Block(
                                     mlp=MLP(W1, W2, activation="relu"), layernorm=ln,
                                     splitting="lie")).states
    X = X0.copy()
    for _ in range(2):
        X = X + causal_softmax(rms_ref(X), Q, K, V, 1.0)
        X = X + np.maximum(rms_ref(X) @ W1.T, 0.0) @ W2.T
    np.testing.assert_allclose(run(RMSNorm())[-1], X, rtol=0, atol=1e-13)
    # a mixed pair: LayerNorm before the attention, RMSNorm before the MLP
    c = lambda Y: (Y - Y.mean(1, keepdims=True)) / (Y - Y.mean(1, keepdims=True)).std(  # noqa: E731
        1, keepdims=True)
    X = X0 + causal_softmax(c(X0), Q, K, V, 1.0)
    X = X + np.maximum(rms_ref(X) @ W1.T, 0.0) @ W2.T
    np.testing.assert_allclose(run((LayerNorm("pre"), RMSNorm("pre")))[1], X, rtol=0,
                               atol=1e-13)


# ------------------------------------------------------------------ post-norm
def test_post_rmsnorm_block_equals_layer_loop_and_projects_on_the_sphere():
    rng = np.random.default_rng(4)
    n, d = 5, 3
    Q, K, V = (rng.normal(size=(d, d)) for _ in range(3))
    W1, W2 = rng.normal(size=(4, d)), rng.normal(size=(d, 4))
    att = tp.Attention("softmax", Q, K, V, masked=True)
    X0 = rng.normal(size=(n, d))
    for ln in (RMSNorm("post"), (RMSNorm("post"), RMSNorm("post", scale=[1.0, 2.0, 0.5]))):
        tr = tp.simulate(att, X0, t_max=3.0, dt=1.0, solver="euler", positions=positions(n),
                         block=tp.Block(mlp=MLP(W1, W2, activation="silu"), layernorm=ln,
                                        splitting="lie"))
        g2 = 1.0 if isinstance(ln, RMSNorm) else np.array([1.0, 2.0, 0.5])
        X = X0.copy()
        for ell in range(3):
            X = rms_ref(X + causal_softmax(X, Q, K, V, 1.0))
            z = X @ W1.T
            X = rms_ref(X + (z / (1 + np.exp(-z))) @ W2.T, g2)
            np.testing.assert_allclose(tr.states[ell + 1], X, rtol=0, atol=1e-13)
        assert isinstance(tr.info["constraint"], str) and tr.info["layernorm"] == "post"
    # a single post RMSNorm with gain 1 and eps 0 keeps the tokens on |x| = sqrt(d)
    tr = tp.simulate(att, X0, t_max=2.0, dt=0.25, solver="rk4", positions=positions(n),
                     block=tp.Block(layernorm=RMSNorm("post")))
    np.testing.assert_allclose(np.linalg.norm(tr.states[1:], axis=2), np.sqrt(d), rtol=1e-14)
    # and the projection is the nearest point: RMS(x) = sqrt(d) x / |x|
    np.testing.assert_allclose(RMSNorm("post")(X0),
                               np.sqrt(d) * X0 / np.linalg.norm(X0, axis=1, keepdims=True),
                               rtol=1e-14)


def test_rmsnorm_works_for_one_feature_where_layernorm_cannot():
    att = tp.Attention("softmax", np.eye(1), np.eye(1), np.eye(1))
    X0 = np.array([[2.0], [-0.5]])
    tr = tp.simulate(att, X0, t_max=1.0, dt=0.5, solver="euler",
                     block=tp.Block(layernorm=RMSNorm("post")))
    np.testing.assert_array_equal(np.abs(tr.final), 1.0)
    with pytest.raises(ArgumentError, match="d >= 2"):
        tp.simulate(att, X0, t_max=1.0, dt=0.5, solver="euler",
                    block=tp.Block(layernorm=LayerNorm("pre")))


# ------------------------------------------------------------------ what the block records
def test_block_parameters_with_rmsnorm_and_layernorm_keys_unchanged():
    mlp = MLP(np.eye(2), np.eye(2))
    # the keys of a LayerNorm block are exactly those checkpoints fingerprinted before
    # RMSNorm existed (so fingerprints of such runs do not change)
    p_ln = tp.Block(mlp=mlp, layernorm=LayerNorm("pre", eps=1e-5)).parameters()
    assert sorted(p_ln) == sorted(
        ["splitting", "mlp.W1", "mlp.W2", "mlp.b1", "mlp.b2", "mlp.activation", "constraint"]
        + [f"layernorm.{r}.{k}" for r in ("attention", "mlp")
           for k in ("mode", "variance", "eps", "scale", "shift")])
    g = tp.Layers(np.ones((2, 1, 2)))
    p = tp.Block(mlp=mlp, layernorm=(RMSNorm("pre", 1e-6, scale=g), RMSNorm())).parameters()
    assert p["layernorm.attention.type"] == "rms" and p["layernorm.attention.scale"] is g
    assert p["layernorm.attention.eps"] == 1e-6 and p["layernorm.mlp.mode"] == "pre"
    assert "layernorm.mlp.variance" not in p
    post = tp.Block(layernorm=RMSNorm("post", scale=[1.0, 3.0])).parameters()
    assert post["constraint"] == "post_layernorm"
    assert post["constraint.layernorm.type"] == "rms"
    np.testing.assert_array_equal(post["constraint.layernorm.scale"], [1.0, 3.0])
    # an RMSNorm and a LayerNorm block are told apart by the records
    assert tp.Block(layernorm=LayerNorm("post")).describe().get("layernorm_type") is None
    assert tp.Block(layernorm=RMSNorm("post")).describe()["layernorm_type"] == ["rms"]


def test_rmsnorm_run_info_survives_a_save(tmp_path):
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    tr = tp.simulate(att, np.array([[1.0, 0.5], [0.2, -1.0]]), t_max=0.2, dt=0.1,
                     block=tp.Block(layernorm=RMSNorm("pre")))
    back = tp.load(tr.save(tmp_path / "r.npz"))
    assert back.info["layernorm_type"] == ["rms"]
    np.testing.assert_array_equal(back.states, tr.states)


def test_block_refuses_what_does_not_apply_to_rmsnorm():
    mlp = MLP(np.eye(2), np.eye(2))
    with pytest.raises(ArgumentError, match="two pre-norm or two post-norm"):
        tp.Block(mlp=mlp, layernorm=(RMSNorm("pre"), RMSNorm("post")))
    with pytest.raises(ArgumentError, match="post-norm RMSNorm is a constraint of its own"):
        tp.Block(layernorm=RMSNorm("post"), constraint="sphere")
    with pytest.raises(ArgumentError, match="needs mlp="):
        tp.Block(layernorm=(RMSNorm("post"), RMSNorm("post")))
    with pytest.raises(ArgumentError, match="layernorm="):
        tp.Block(layernorm=RMSNorm("pre"), normalization="pre")
    with pytest.raises(ArgumentTypeError, match=r"layernorm=tp.RMSNorm\(\)|layernorm=RMSNorm"):
        tp.Block(layernorm=RMSNorm)
    with pytest.raises(ArgumentError, match="mode='post'"):
        tp.PostLayerNorm(RMSNorm("pre"))
