"""Tests of :mod:`transformer_pde.paper`: the paper's scalings, covariance grids and rank sweeps."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde import paper


def test_paper_attention_scalings_match_spec():
    from transformer_pde import velocity

    rng = np.random.default_rng(5)
    d = 4
    Q, K, V = rng.normal(size=(3, d, d))
    X = rng.normal(size=(7, d))

    def reference(logits):  # independent row-softmax average of V x_j
        w = np.exp(logits - logits.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        return w @ X @ V.T

    # softmax: score <Qx, Ky>/sqrt(d)
    ref = reference((X @ Q.T) @ (X @ K.T).T / np.sqrt(d))
    np.testing.assert_allclose(velocity(paper.paper_attention("softmax", Q, K, V), X), ref,
                               rtol=1e-10)
    # L2: kernel exp(-|Qx/sqrt(d) - Ky|^2)
    diff = (X @ Q.T)[:, None, :] / np.sqrt(d) - (X @ K.T)[None, :, :]
    ref = reference(-np.sum(diff ** 2, axis=-1))
    np.testing.assert_allclose(velocity(paper.paper_attention("l2", Q, K, V), X), ref, rtol=1e-10)
    # multi-head: each head's score scaled by 1/sqrt(k)
    att = paper.paper_attention("softmax", Q, K, V, heads=2)
    for head in att.at(0.0).heads:
        # rounding: the scale is applied to Q before the product (a few ulp of the largest entry)
        np.testing.assert_allclose(head.A, K[head.rows].T @ Q[head.rows] / np.sqrt(2), rtol=1e-12,
                                   atol=1e-15)
    # sinkhorn: unscaled, eps = 1
    att = paper.paper_attention("sinkhorn", Q, K, V)
    np.testing.assert_array_equal(att.at(0.0).heads[0].A, K.T @ Q)
    assert att.eps == 1.0
    with pytest.raises(ValueError, match="kind"):
        paper.paper_attention("linear", Q, K, V)


def test_slice_covariances():
    S = paper.slice_covariances(8, radius=0.6, trace=2.5)
    np.testing.assert_allclose(np.trace(S, axis1=1, axis2=2), 2.5, rtol=1e-14)
    from transformer_pde.plot import cone_coordinates

    p = cone_coordinates(S)
    np.testing.assert_allclose(np.hypot(p[:, 0], p[:, 1]) / p[:, 2], 0.6, rtol=1e-14)
    R = paper.slice_covariances(5, init="random", trace=1.0, seed=2)
    np.testing.assert_allclose(np.trace(R, axis1=1, axis2=2), 1.0, rtol=1e-14)
    assert np.all(np.linalg.eigvalsh(R) >= 0)
    with pytest.raises(ValueError, match="radius"):
        paper.slice_covariances(3, radius=1.0)


def test_rank_sweep_identity_value_blows_up_to_rank_one():
    # V = I: Sigma^-1(t) = Sigma0^-1 - t (A + A^T) becomes singular along one direction, so
    # the blow-up limit Sigma / tr Sigma is rank one (SPEC reference solution)
    sw = paper.rank_sweep("softmax", 3, value="identity", draws=6, seed=1, t_max=200.0)
    blown = sw.status == "blowup"
    assert blown.any()
    assert np.all(sw.ranks[blown] == 1)
