"""Pair statistics: pair_fraction and component_clusters against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_pde.diagnostics.pairs import component_clusters, gram_of, pair_fraction
from transformer_pde.errors import ArgumentError, ArgumentTypeError


def unit(angles_deg):
    a = np.radians(np.asarray(angles_deg, dtype=float))
    return np.stack([np.cos(a), np.sin(a)], axis=-1)


def brute_fraction(X, eps):
    n = len(X)
    close = [X[i] @ X[j] >= 1 - eps for i in range(n) for j in range(i + 1, n)]
    return sum(close) / len(close)


def brute_components(X, eps):
    # union-find over the close pairs: an independent count of the components
    n = len(X)
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if X[i] @ X[j] >= 1 - eps:
                parent[find(i)] = find(j)
    return len({find(i) for i in range(n)})


def test_chain_is_one_component_not_the_rank_of_the_thresholded_gram():
    # consecutive angles 2 degrees, threshold 3 degrees: pairs (0,1), (1,2) close, (0,2) not
    X = unit([0.0, 2.0, 4.0])
    eps = 1 - np.cos(np.radians(3.0))
    assert component_clusters(X, eps) == 1
    T = (X @ X.T >= 1 - eps).astype(float)
    assert np.linalg.matrix_rank(T) == 3      # the rank would report three clusters
    assert pair_fraction(X, eps) == pytest.approx(2 / 3, abs=1e-15)
    # a wider threshold closes the triangle; a narrower one leaves three singletons
    assert component_clusters(X, 1 - np.cos(np.radians(5.0))) == 1
    assert pair_fraction(X, 1 - np.cos(np.radians(5.0))) == 1.0
    assert component_clusters(X, 1 - np.cos(np.radians(1.0))) == 3
    assert pair_fraction(X, 1 - np.cos(np.radians(1.0))) == 0.0


def test_two_clusters_and_exact_threshold():
    X = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    assert component_clusters(X, 0.0) == 2          # exact inner products 1: close at eps 0
    assert pair_fraction(X, 0.0) == pytest.approx(4 / 10)
    assert component_clusters(X, 1.0) == 1          # <x, y> = 0 >= 1 - 1
    assert isinstance(component_clusters(X, 0.0), int)
    assert isinstance(pair_fraction(X, 0.0), float)


@pytest.mark.parametrize("eps", [0.05, 0.3, 1.0])
def test_batched_shapes_match_brute_force(rng, eps):
    T, B, n, d = 3, 4, 7, 3
    X = rng.normal(size=(T, B, n, d))
    X[:, :, : n // 2] = X[:, :, :1] + 0.1 * X[:, :, : n // 2]   # some close pairs
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    frac = pair_fraction(X, eps)
    comp = component_clusters(X, eps)
    assert frac.shape == (T, B) and comp.shape == (T, B) and comp.dtype.kind == "i"
    for t in range(T):
        for b in range(B):
            assert frac[t, b] == pytest.approx(brute_fraction(X[t, b], eps), abs=1e-15)
            assert comp[t, b] == brute_components(X[t, b], eps)
            assert pair_fraction(X[t, b], eps) == frac[t, b]
    np.testing.assert_array_equal(pair_fraction(X[0], eps), frac[0])
    assert len(np.unique(comp)) > 1 or eps == 1.0   # the cases differ


def test_gram_input_equals_token_input(rng):
    X = rng.normal(size=(5, 6, 4))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    G = gram_of(X)
    # the Gram matrices themselves, to rounding (matmul and einsum sum differently)
    np.testing.assert_allclose(G, np.einsum("bnd,bmd->bnm", X, X), rtol=0, atol=1e-15)
    for eps in (0.2, 0.8):
        np.testing.assert_array_equal(pair_fraction(G, eps, gram=True), pair_fraction(X, eps))
        np.testing.assert_array_equal(component_clusters(G, eps, gram=True),
                                      component_clusters(X, eps))
    assert gram_of(G, gram=True) is G


def test_pairs_refusals():
    X = unit([0.0, 10.0])
    with pytest.raises(ArgumentError, match="eps"):
        pair_fraction(X, -0.1)
    with pytest.raises(ArgumentError, match="eps"):
        component_clusters(X, float("nan"))
    with pytest.raises(ArgumentError, match="at least 2 tokens"):
        pair_fraction(X[:1], 0.1)
    with pytest.raises(ArgumentError, match="square"):
        component_clusters(np.ones((3, 2)), 0.1, gram=True)
    with pytest.raises(ArgumentError, match=r"shape \(\.\.\., n, d\)"):
        pair_fraction(np.ones(3), 0.1)
    with pytest.raises(ArgumentError, match="NaN"):
        pair_fraction(np.array([[1.0, np.nan], [1.0, 0.0]]), 0.1)
    with pytest.raises(ArgumentTypeError, match="gram"):
        pair_fraction(X, 0.1, gram="yes")
    with pytest.raises(ArgumentTypeError):
        component_clusters("tokens", 0.1)
