"""The gated MLP (SwiGLU and friends) and the SiLU activation.

References are NumPy / ``math`` formulas written here; tolerances are rounding only.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.special import erf

import transformer_pde as tp
from transformer_pde.blocks import MLP, MLPWeights
from transformer_pde.errors import ArgumentError, ArgumentTypeError


def silu_ref(z):
    """z / (1 + e^{-z}) in exact-enough double precision for moderate |z|."""
    return np.array([v / (1.0 + math.exp(-v)) if v > -700 else v * math.exp(v) / (1.0 + math.exp(v))
                     for v in np.ravel(z)]).reshape(np.shape(z))


def weights(rng, m=5, d=3):
    return (rng.normal(size=(m, d)), rng.normal(size=(d, m)), rng.normal(size=(m, d)),
            rng.normal(size=m), rng.normal(size=d), rng.normal(size=m))


def test_swiglu_against_the_hand_formula():
    rng = np.random.default_rng(0)
    W1, W2, G, b1, b2, bg = weights(rng)
    X = rng.normal(size=(4, 3))
    mlp = MLP(W1, W2, b1, b2, activation="silu", gate=G, b_gate=bg)
    g = X @ G.T + bg
    expect = ((g / (1.0 + np.exp(-g))) * (X @ W1.T + b1)) @ W2.T + b2
    np.testing.assert_allclose(mlp(0.0, X), expect, rtol=1e-14, atol=1e-14)
    # without biases: W2 (silu(G x) * (W1 x))
    g = X @ G.T
    np.testing.assert_allclose(MLP(W1, W2, activation="silu", gate=G)(0.0, X),
                               ((g / (1.0 + np.exp(-g))) * (X @ W1.T)) @ W2.T, rtol=1e-14,
                               atol=1e-14)
    assert mlp.gated and not MLP(W1, W2).gated and (mlp.d, mlp.hidden) == (3, 5)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_other_gated_activations(activation):
    rng = np.random.default_rng(1)
    W1, W2, G, b1, b2, bg = weights(rng)
    X = rng.normal(size=(4, 3))
    g = X @ G.T + bg
    sig = np.maximum(g, 0) if activation == "relu" else 0.5 * g * (1 + erf(g / np.sqrt(2)))
    np.testing.assert_allclose(
        MLP(W1, W2, b1, b2, activation=activation, gate=G, b_gate=bg)(0.0, X),
        (sig * (X @ W1.T + b1)) @ W2.T + b2, rtol=1e-13, atol=1e-13)


def test_plain_silu_mlp_and_its_large_arguments():
    rng = np.random.default_rng(2)
    W1, W2 = rng.normal(size=(5, 3)), rng.normal(size=(3, 5))
    X = rng.normal(size=(4, 3))
    np.testing.assert_allclose(MLP(W1, W2, activation="silu")(0.0, X),
                               silu_ref(X @ W1.T) @ W2.T, rtol=1e-13, atol=1e-14)
    # the activation alone: an identity MLP on one feature maps z to silu(z)
    ident = MLP(np.eye(1), np.eye(1), activation="silu")
    z = np.array([[-1e300], [-1e5], [-800.0], [-700.0], [-30.0], [-1.0], [0.0], [1e-300],
                  [2.5], [37.0], [40.0], [1e5], [1e300]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # no overflow in exp, no inf * 0
        out = ident(0.0, z)
    assert np.isfinite(out).all()
    # exact limits: silu(z) = z once expit(z) rounds to 1, and -0.0 once it underflows
    np.testing.assert_array_equal(out[[10, 11, 12]], z[[10, 11, 12]])
    np.testing.assert_array_equal(out[[0, 1, 2]], 0.0)
    assert out[6, 0] == 0.0 and out[7, 0] == 0.5e-300
    # moderate arguments against the formula (relative rounding only)
    idx = [3, 4, 5, 8, 9]
    np.testing.assert_allclose(out[idx], silu_ref(z[idx]), rtol=1e-15)
    out32 = ident(0.0, np.array([[-1e30], [1e30], [-3.0]], dtype=np.float32))
    assert out32.dtype == np.float32 and np.isfinite(out32).all() and out32[1, 0] == 1e30


def test_gate_as_layers_switches_at_layer_boundaries():
    rng = np.random.default_rng(3)
    L, m, d = 3, 4, 2
    W1, W2, G = rng.normal(size=(L, m, d)), rng.normal(size=(L, d, m)), rng.normal(size=(L, m, d))
    bg = rng.normal(size=(L, 1, m))
    mlp = MLP(tp.Layers(W1), tp.Layers(W2), activation="silu", gate=tp.Layers(G),
              b_gate=tp.Layers(bg))
    X = rng.normal(size=(3, d))
    for t, left, ell in [(0.5, False, 0), (1.0, False, 1), (1.0, True, 0), (2.0, True, 1),
                         (2.0, False, 2)]:
        w = mlp.at(t, left=left)
        assert isinstance(w, MLPWeights)
        np.testing.assert_array_equal(w.gate, G[ell])
        np.testing.assert_array_equal(w.b_gate, bg[ell, 0])
        g = X @ G[ell].T + bg[ell, 0]
        np.testing.assert_allclose(mlp(t, X, left=left),
                                   (silu_ref(g) * (X @ W1[ell].T)) @ W2[ell].T, rtol=1e-13,
                                   atol=1e-14, err_msg=f"t={t}, left={left}")
    assert len(tp.Block(mlp=mlp).tables) == 4


def test_gate_validation_names_the_argument():
    W1, W2 = np.ones((4, 2)), np.ones((2, 4))
    with pytest.raises(ArgumentError, match=r"gate must have shape \(m, d\) = \(4, 2\)"):
        MLP(W1, W2, gate=np.ones((2, 4)))
    with pytest.raises(ArgumentError, match="b_gate must have 4 entries"):
        MLP(W1, W2, gate=np.ones((4, 2)), b_gate=np.ones(3))
    with pytest.raises(ArgumentError, match="b_gate applies only with a gate"):
        MLP(W1, W2, b_gate=np.ones(4))
    with pytest.raises(ArgumentTypeError, match="gate must be a real"):
        MLP(W1, W2, gate="x")
    with pytest.raises(ArgumentError, match="activation"):
        MLP(W1, W2, activation="swish")
    # a table is checked layer by layer where it is evaluated
    bad = MLP(W1, W2, gate=tp.Layers(np.stack([np.ones((4, 2)), np.ones((4, 2))])))
    assert bad.at(1.0).gate.shape == (4, 2)
    with pytest.raises(ArgumentError, match=r"gate .*\(t=0\.5\)"):
        MLP(W1, W2, gate=lambda t: np.ones((4, 2)) if t == 0.0 else np.ones((3, 2))).at(0.5)


def test_gate_enters_the_parameters_only_when_present():
    W1, W2, G = np.ones((4, 2)), np.ones((2, 4)), np.eye(4, 2)
    plain = tp.Block(mlp=MLP(W1, W2)).parameters()
    assert "mlp.gate" not in plain and "mlp.b_gate" not in plain   # fingerprints unchanged
    gated = tp.Block(mlp=MLP(W1, W2, activation="silu", gate=G, b_gate=np.zeros(4))).parameters()
    np.testing.assert_array_equal(gated["mlp.gate"], G)
    np.testing.assert_array_equal(gated["mlp.b_gate"], np.zeros(4))
    assert gated["mlp.activation"] == "silu"
    assert tp.Block(mlp=MLP(W1, W2)).describe().get("mlp_gated") is None


def test_config_mlp_takes_silu_and_names_the_gate_it_does_not_build():
    from transformer_pde.cli.builders import build_mlp
    from transformer_pde.cli.config import ConfigError
    assert build_mlp({"activation": "silu", "hidden": 4}, 3).activation == "silu"
    # a gate is not built from a configuration file: refused with its key, never ignored
    with pytest.raises(ConfigError, match="block.mlp.gate: unknown key"):
        build_mlp({"gate": {"random": "normal"}}, 3)
