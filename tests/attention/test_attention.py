"""Attention specification: validation, per-layer tables, frozen parameters, serialisation,
and the public hypothesis strategies of :mod:`transformer_pde.testing`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde.attention import KINDS, Layers
from transformer_pde.testing import (CORE_KINDS, attention_problems, attentions,
                                     compact_measures, gaussians, matrices, measures, rotations,
                                     spd_matrices)

I2 = np.eye(2)


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(kind="softmx"), ValueError, "kind must be one of"),
    (dict(kind=3), TypeError, "kind must be one of"),  # a wrong type
    (dict(heads=0), ValueError, "heads must be >= 1"),
    (dict(heads=True), TypeError, "heads must be a positive integer"),
    (dict(heads=1.5), TypeError, "heads must be a positive integer"),
    (dict(Q=np.eye(3), K=np.eye(3), V=np.eye(3), heads=2), ValueError, "heads=2 must divide"),
    (dict(Q=np.ones((1, 2)), K=np.ones((1, 2)), heads=2), ValueError, "Q and K must be d x d"),
    (dict(eps=0.0), ValueError, "eps must be > 0"),
    (dict(eps=-1.0), ValueError, "eps must be > 0"),
    (dict(eps=np.nan), ValueError, "eps must be finite"),
    (dict(l2_beta=0.0), ValueError, "l2_beta must be > 0"),
    (dict(beta=np.inf), ValueError, "beta must be finite"),
    (dict(beta="hot"), TypeError, "beta must be a real number"),
    (dict(kind="sinkhorn", masked=True), ValueError, "masked=True is not defined for kind='sinkhorn'"),
    (dict(kind="l2", beta=2.0), ValueError, "beta must be 1.0 for kind='l2'"),
    (dict(masked="yes"), TypeError, "masked must be a bool"),
    (dict(Q=np.array([[np.nan, 0], [0, 1]])), ValueError, "Q contains NaN"),
    (dict(V=np.array([[1.0, np.inf], [0, 1]])), ValueError, "V contains NaN"),
    (dict(Q=np.ones(2)), ValueError, "Q must be a 2-D matrix"),
    (dict(Q=np.zeros((0, 2)), K=np.zeros((0, 2))), ValueError, "Q must not be empty"),
    (dict(Q=[["a", "b"]]), TypeError, "Q must be a real matrix"),
    (dict(K=np.ones((1, 2))), ValueError, "K must have the shape of Q"),
    (dict(V=np.ones((2, 3))), ValueError, r"V must have shape \(d, d\)"),
    (dict(W_O=np.ones((3, 3))), ValueError, r"W_O must have shape \(d, d\)"),
])
def test_attention_validation(kwargs, exc, msg):
    args = dict(kind="softmax", Q=I2, K=I2, V=I2)
    args.update(kwargs)
    with pytest.raises(exc, match=msg):
        tp.Attention(**args)


def test_time_dependent_parameters_are_validated_when_evaluated():
    def Q(t):
        return np.eye(2) if t < 1 else np.eye(3)

    att = tp.Attention("softmax", Q, I2, I2)  # fine at t = 0
    assert att.time_dependent and att.d == 2
    with pytest.raises(ValueError, match="t=2"):
        att.at(2.0)
    bad = tp.Attention("softmax", lambda t: I2 * (np.nan if t > 1 else 1.0), I2, I2)
    with pytest.raises(ValueError, match=r"Q \(evaluated at t=3"):
        bad.at(3.0)
    with pytest.raises(ValueError, match=r"V must have shape"):
        tp.Attention("softmax", I2, I2, Layers(np.ones((2, 2, 3))))


def test_attention_is_immutable_and_copies_its_inputs():
    Q = np.eye(2)
    att = tp.Attention("softmax", Q, I2, I2)
    Q[0, 0] = 5.0  # the spec keeps its own copy
    assert att.Q[0, 0] == 1.0
    with pytest.raises(ValueError):
        att.Q[0, 0] = 2.0  # read-only
    with pytest.raises(AttributeError):
        att.kind = "linear"
    changed = att.replace(kind="linear", beta=2.0)
    assert (changed.kind, changed.beta, att.kind, att.beta) == ("linear", 2.0, "softmax", 1.0)
    with pytest.raises(ValueError, match="masked=True is not defined"):
        att.replace(kind="sinkhorn", masked=True)


def test_kinds_registry_metadata():
    assert set(CORE_KINDS) <= set(KINDS)
    normalised = {k for k in CORE_KINDS if KINDS[k].normalized}
    assert normalised == {"softmax", "l2", "sinkhorn"}
    assert {k for k in CORE_KINDS if not KINDS[k].maskable} == {"sinkhorn"}
    assert {k for k in CORE_KINDS if KINDS[k].affine_on_gaussians} == \
        {"softmax", "linear", "l2", "sinkhorn"}


# --------------------------------------------------------------------------- frozen params
def test_at_splits_heads_into_row_blocks(rng):
    Q, K, V, W = rng.normal(size=(4, 4, 4))
    P = tp.Attention("softmax", Q, K, V, heads=2, beta=0.5, W_O=W).at(0.3)
    assert (P.kind, P.d, P.n_heads, P.beta, P.t) == ("softmax", 4, 2, 0.5, 0.3)
    for h, head in enumerate(P.heads):
        rows = slice(2 * h, 2 * h + 2)
        np.testing.assert_array_equal(head.Q, Q[rows])
        np.testing.assert_array_equal(head.K, K[rows])
        np.testing.assert_array_equal(head.V, V[rows])
        assert head.rows == rows
        np.testing.assert_allclose(head.A, K[rows].T @ Q[rows], rtol=1e-15)
    np.testing.assert_array_equal(P.W_O, W)
    single = tp.Attention("linear", Q[:3], K[:3], V).at()
    assert single.n_heads == 1 and single.heads[0].rows == slice(0, 4) and single.W_O is None
    assert single.heads[0].Q.shape == (3, 4)  # rank-3 score in d = 4


# --------------------------------------------------------------------------- Layers
def test_layers_table_lookup():
    vals = np.arange(3)[:, None, None] * np.ones((3, 2, 2))
    tab = Layers(vals, layer_time=0.1, t0=0.5)
    assert tab.n_layers == 3 and tab.shape == (2, 2)
    cases = [(-4.0, 0), (0.5, 0), (0.59, 0), (0.6, 1), (0.75, 2), (0.8, 2), (100.0, 2)]
    for t, layer in cases:
        assert tab.index(t) == layer, t
        np.testing.assert_array_equal(tab(t), vals[layer])
    # boundaries reached by accumulating steps in floating point (0.1 * 3 = 0.30000000000000004,
    # 0.1 + 0.1 + 0.1 + ... drifts below k / 10) still select layer k
    many = Layers(np.arange(10.0)[:, None, None], layer_time=0.1)
    t = 0.0
    for k in range(10):
        assert many.index(t) == k and many.index(k * 0.1) == k, (k, t)
        t += 0.1
    # left limits at boundaries: layer l - 1; inside a layer: unchanged
    assert tab.index(0.6, left=True) == 0 and tab.index(0.65, left=True) == 1
    assert tab.index(0.5, left=True) == 0  # clamped
    with pytest.raises(ValueError):
        tab.values[0, 0, 0] = 1.0  # read-only


def test_layers_validation():
    with pytest.raises(ValueError, match=r"shape \(L, rows, cols\)"):
        Layers(np.eye(2))
    with pytest.raises(ValueError, match=r"shape \(L, rows, cols\)"):
        Layers(np.zeros((0, 2, 2)))
    with pytest.raises(ValueError, match="NaN"):
        Layers(np.full((1, 2, 2), np.nan))
    with pytest.raises(ValueError, match="layer_time must be > 0"):
        Layers(np.zeros((1, 2, 2)), layer_time=0.0)
    with pytest.raises(ValueError, match="t0 must be finite"):
        Layers(np.zeros((1, 2, 2)), t0=np.inf)


# --------------------------------------------------------------------------- serialisation
def test_to_dict_from_dict_roundtrip(rng):
    Qs = Layers(rng.normal(size=(3, 4, 4)), layer_time=0.5, t0=1.0)
    att = tp.Attention("l2", Qs, rng.normal(size=(4, 4)), rng.normal(size=(4, 4)), heads=2,
                       masked=True, l2_beta=0.7, W_O=rng.normal(size=(4, 4)))
    back = tp.Attention.from_dict(att.to_dict())
    for t in (0.0, 1.2, 1.7, 9.0):
        a, b = att.at(t), back.at(t)
        assert (a.kind, a.beta, a.eps, a.l2_beta, a.masked) == \
            (b.kind, b.beta, b.eps, b.l2_beta, b.masked)
        for ha, hb in zip(a.heads, b.heads, strict=True):
            for name in ("Q", "K", "V"):
                np.testing.assert_array_equal(getattr(ha, name), getattr(hb, name))
        np.testing.assert_array_equal(a.W_O, b.W_O)
    spec = tp.Attention("softmax", lambda t: I2, I2, I2).to_dict()
    assert spec["serialisable"] is False and spec["Q"] is None
    with pytest.raises(ValueError, match="callables"):
        tp.Attention.from_dict(spec)


# --------------------------------------------------------------------------- strategies
@given(R=rotations(3), S=spd_matrices(3, min_eig=0.5, max_eig=3.0), g=gaussians(2),
       M=matrices(2, 3, scale=0.5))
def test_matrix_strategies(R, S, g, M):
    np.testing.assert_allclose(R.T @ R, np.eye(3), atol=1e-13)
    assert np.linalg.det(R) == pytest.approx(1.0, abs=1e-12)
    assert np.array_equal(S, S.T)
    lam = np.linalg.eigvalsh(S)
    assert lam.min() >= 0.5 - 1e-12 and lam.max() <= 3.0 + 1e-12
    mean, cov = g
    assert mean.shape == (2,) and np.all(np.abs(mean) <= 1.0)
    assert np.linalg.eigvalsh(cov).min() >= 0.2 - 1e-12
    assert M.shape == (2, 3) and np.linalg.norm(M, 2) <= 0.5 + 1e-12


@given(m=measures(d=(2, 3), n=(1, 5), weighted=True, positions=True, radius=2.0),
       c=compact_measures(d=3, n=4, radius=0.5))
def test_measure_strategies(m, c):
    assert 2 <= m.d <= 3 and 1 <= m.n <= 5
    assert np.all(np.abs(m.X) <= 2.0)
    assert m.weights.sum() == pytest.approx(1.0) and np.all(m.weights > 0)
    assert m.positions.shape == (m.n,) and np.all((m.positions >= 0) & (m.positions <= 1))
    assert m.kwargs == {"weights": m.weights, "positions": m.positions}
    assert c.X.shape == (4, 3) and np.all(np.linalg.norm(c.X, axis=1) <= 0.5 + 1e-12)
    assert c.weights is None and np.allclose(c.w, 0.25)


@given(att=attentions(kinds=["softmax", "sinkhorn", "l2"], d=4, heads=None, masked=True,
                      time_dependent=True),
       problem=attention_problems(d=st.just(2), masked=None))
def test_attention_strategies(att, problem):
    assert att.kind in ("softmax", "sinkhorn", "l2") and att.d == 4
    assert 4 % att.heads == 0
    assert att.masked == (att.kind != "sinkhorn")
    assert att.time_dependent and isinstance(att.Q, Layers)
    if att.kind == "l2":
        assert att.beta == 1.0 and 0.25 <= att.l2_beta <= 1.0
    for t in (0.0, 1.0, 2.0):
        for head in att.at(t).heads:
            assert np.linalg.norm(head.V, 2) <= 1.0 + 1e-12
    a, m = problem
    assert a.d == m.d == 2 and (m.positions is not None) == a.masked


def test_strategy_argument_errors():
    with pytest.raises(ValueError, match="unknown attention kind"):
        attentions(kinds=["nope"])
    with pytest.raises(ValueError, match="kinds must not be empty"):
        attentions(kinds=[])
    with pytest.raises(ValueError, match="d range"):
        measures(d=(3, 2))
    with pytest.raises(ValueError, match="n must be >= 1"):
        measures(n=0)
    with pytest.raises(TypeError, match="d must be an int"):
        measures(d="2")
    with pytest.raises(ValueError, match="radius must be > 0"):
        compact_measures(radius=0)
    with pytest.raises(ValueError, match="min_eig"):
        spd_matrices(2, min_eig=0)


# --------------------------------------------------------------------------- docs and examples
ROOT = Path(__file__).resolve().parents[2]


def test_clustering_example_runs(tmp_path, monkeypatch):
    # the example as a plain script, in its fast configuration, writing into tmp_path
    monkeypatch.setenv("TRANSFORMER_PDE_FAST", "1")
    monkeypatch.setenv("TRANSFORMER_PDE_OUT", str(tmp_path))
    spec = importlib.util.spec_from_file_location("clustering_2d",
                                                  ROOT / "examples" / "clustering_2d.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (tmp_path / "clustering_2d.png").stat().st_size > 10_000
    # three well-separated groups are three clusters, one group is one
    Z = np.concatenate([np.zeros((3, 2)), np.ones((3, 2)), [[5.0, 0.0]]])
    assert tp.diagnostics.clusters(Z, tol=mod.CLUSTER_TOL).labels.max() + 1 == 3
    assert tp.diagnostics.clusters(np.zeros((4, 2)), tol=mod.CLUSTER_TOL).labels.max() == 0


@given(problem=attention_problems(d=(2, 4), heads=None, min_head_dim=2))
def test_min_head_dim(problem):
    att, m = problem
    assert all(head.Q.shape[0] >= 2 for head in att.at(0.0).heads)
    with pytest.raises(ValueError, match="min_head_dim"):
        attentions(min_head_dim=0)
