"""The compiled exact spanning tree of :func:`~transformer_pde.diagnostics.clustering.clusters`
gives the same clusters as the dense scipy tree it replaced (kept here as the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.spatial.distance import pdist, squareform

import transformer_pde as tp
from transformer_pde.diagnostics import clustering
from transformer_pde.diagnostics.clustering import cluster_counts, clusters


def _dense_reference(X):
    """The exact tree as the package formed it before: scipy's minimum spanning tree of
    the dense distance matrix (offset by 1 so that zero distances are kept)."""
    D = squareform(pdist(X))
    off = D + 1.0
    np.fill_diagonal(off, 0.0)
    T = minimum_spanning_tree(off).tocoo()
    return T.row, T.col, D[T.row, T.col]


def _configurations():
    rng = np.random.default_rng(7)
    out = {}
    for d in (1, 2, 3, 6):
        out[f"gauss-d{d}"] = rng.normal(size=(300, d))
        centres = 25.0 * rng.normal(size=(4, d))
        out[f"blobs-d{d}"] = np.repeat(centres, 75, axis=0) + rng.normal(size=(300, d))
    t = np.sort(rng.uniform(0, 10, 200))
    out["chain"] = np.stack([t, np.sin(t) + 1e-3 * rng.normal(size=200)], axis=1)
    gaps = np.concatenate([np.zeros(100), np.full(100, 30.0)])
    out["two-chains"] = np.stack([np.linspace(0, 5, 200) + gaps, np.zeros(200)], axis=1)
    sphere = rng.normal(size=(3, 3))
    sphere = np.repeat(sphere / np.linalg.norm(sphere, axis=1, keepdims=True), 80, axis=0)
    sphere += 1e-3 * rng.normal(size=sphere.shape)
    out["sphere-clusters"] = sphere / np.linalg.norm(sphere, axis=1, keepdims=True)
    dup = rng.normal(size=(5, 2))
    out["coincident"] = np.repeat(dup, 40, axis=0)          # exact duplicates: zero edges
    out["lattice"] = np.stack(np.meshgrid(np.arange(12.0), np.arange(12.0)), -1).reshape(-1, 2)
    out["tiny-scale"] = 1e-200 * out["blobs-d2"]
    return out


CONFIGS = _configurations()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_labels_equal_those_of_the_dense_tree(name, monkeypatch):
    X = CONFIGS[name]
    new = clusters(X)
    monkeypatch.setattr(clustering, "_mst_edges", lambda Z: _dense_reference(Z))
    ref = clusters(X)
    np.testing.assert_array_equal(new.labels, ref.labels)
    assert new.scale == ref.scale and new.n_clusters == ref.n_clusters
    np.testing.assert_array_equal(new.masses, ref.masses)


@pytest.mark.parametrize("d", [1, 2, 3, 8, 17])
def test_tree_lengths_are_pdist_values_and_a_minimum_tree(d):
    # the lengths are pdist's distances of the edges, and the sorted lengths those of the
    # dense tree (the weights of a minimum spanning tree are unique); to a few units in the
    # last place, not bit for bit: the compiled kernel and scipy's C loop are two
    # computations, and CPUs (AVX2, AVX-512) may round them differently
    rng = np.random.default_rng(d)
    X = rng.normal(size=(257, d))
    X[10] = X[3]                                              # a zero-length edge
    i, j, L = clustering._mst_edges(X)
    D = squareform(pdist(X))
    np.testing.assert_allclose(L, D[i, j], rtol=1e-15, atol=0)
    _, _, Lref = _dense_reference(X)
    np.testing.assert_allclose(np.sort(L), np.sort(Lref), rtol=1e-15, atol=0)
    # a spanning tree: n - 1 edges joining everything
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    g = coo_matrix((np.ones(L.size), (i, j)), shape=(257, 257))
    assert L.size == 256 and connected_components(g, directed=False)[0] == 1


def test_interpreted_and_compiled_trees_agree():
    prim = clustering._prim_tree
    if not hasattr(prim, "py_func"):
        pytest.skip("numba is not installed: the dense tree is used")
    X = np.random.default_rng(3).normal(size=(60, 3))
    # the same edges; their lengths to a few units in the last place (the compiled kernel
    # and its Python original are two computations)
    for a, b in zip(prim(X), prim.py_func(X), strict=True):
        if np.issubdtype(np.asarray(a).dtype, np.integer):
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-15, atol=0)


def test_cluster_counts_of_a_run_equal_the_dense_ones(monkeypatch):
    rng = np.random.default_rng(0)
    X0 = rng.normal(size=(120, 3))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), beta=9.0)
    traj = tp.simulate(att, X0, t_max=12.0, dt=0.1, saveat=tp.SaveAt(every=10),
                       block=tp.Block(constraint="sphere"))
    counts = cluster_counts(traj)
    monkeypatch.setattr(clustering, "_mst_edges", lambda Z: _dense_reference(Z))
    np.testing.assert_array_equal(counts, cluster_counts(traj))
    assert counts[0] == 1 and counts[-1] > 1     # one cloud becomes separate clusters


@pytest.mark.parametrize("name", ["blobs-d2", "coincident", "lattice"])
def test_clusters_while_the_kernel_compiles_equal_the_compiled_ones(name, monkeypatch):
    # a cold cache: clusters() does not wait for the compiler, it takes scipy's dense tree
    # (the same exact minimum spanning tree) while the kernel compiles in the background
    X = CONFIGS[name]
    ref = clusters(X)
    monkeypatch.setattr(clustering, "_prim_tree_ready", lambda: False)
    monkeypatch.setattr(clustering, "_prim_tree", None)      # must not be called
    new = clusters(X)
    np.testing.assert_array_equal(new.labels, ref.labels)
    assert new.scale == ref.scale and new.n_clusters == ref.n_clusters
