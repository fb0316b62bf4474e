r"""Clusters of a token cloud: :func:`clusters` and :func:`cluster_counts` along a run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation

__all__ = ["Clusters", "cluster_counts", "clusters"]


@dataclass
class Clusters:
    """Clusters of a token cloud (see :func:`clusters`).

    Attributes
    ----------
    labels : ndarray (N,) of int
        Cluster of each token, clusters numbered by decreasing mass.
    centres : ndarray (K, d)
        Weighted mean of each cluster.
    masses : ndarray (K,)
        Total weight of each cluster.
    scale : float
        The distance threshold used (``tol`` times the cloud radius).
    """

    labels: np.ndarray
    centres: np.ndarray
    masses: np.ndarray
    scale: float

    @property
    def n_clusters(self) -> int:
        return int(self.masses.shape[0])


def clusters(X: Any, *, tol: float = 1e-2, weights: Any = None) -> Clusters:
    r"""Single-linkage clusters of a token cloud at a scale relative to the cloud.

    Two tokens are in the same cluster when a chain of tokens joins them with every link
    shorter than :math:`h = \mathrm{tol}\cdot\max_i |x_i - \bar x|` (``tol`` times the
    cloud's radius about its weighted mean :math:`\bar x`).  This is single-linkage
    clustering cut at height :math:`h`, computed as the connected components of the
    :math:`h`-neighbour graph (k-d tree; :math:`O(N \log N)` for well-separated clusters).
    The count is invariant under rotations, translations, scaling and permutations of the
    tokens.  A cloud of one point, or of identical points, is one cluster.
    """
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components  # noqa: PLC0415
    from scipy.spatial import cKDTree  # noqa: PLC0415

    Xa = validation.points("X", X, column=True, keep_float32=False)
    w = validation.weights("weights", weights, Xa.shape[0])
    tol = validation.positive("tol", tol)
    n = Xa.shape[0]
    centre = w @ Xa
    h = float(tol) * float(np.max(np.linalg.norm(Xa - centre, axis=1)))
    if h == 0.0:
        labels = np.zeros(n, dtype=int)
    else:
        pairs = cKDTree(Xa).query_pairs(h, output_type="ndarray")
        graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
        _, labels = connected_components(graph, directed=False)
    masses = np.bincount(labels, weights=w)
    # number clusters by decreasing mass (ties: by first token) for reproducible output
    first = np.full(masses.shape[0], n)
    np.minimum.at(first, labels, np.arange(n))
    order = np.lexsort((first, -masses))
    relabel = np.empty_like(order)
    relabel[order] = np.arange(order.size)
    labels = relabel[labels]
    masses = masses[order]
    # weighted sums of all clusters in one O(N d) pass (a loop over clusters is O(N K))
    sums = np.stack([np.bincount(labels, weights=w * x) for x in Xa.T], axis=1)
    centres = sums / masses[:, None]
    return Clusters(labels, centres, masses, h)


def cluster_counts(traj: Any, *, tol: float = 1e-2) -> np.ndarray:
    """Number of :func:`clusters` at every saved time of a particle trajectory
    (-1 for non-finite states)."""
    if not hasattr(traj, "states"):
        raise TypeError(f"traj must be a ParticleTrajectory, got {type(traj).__name__}")
    out = []
    for X in traj.states:
        out.append(clusters(X, tol=tol, weights=traj.weights).n_clusters
                   if np.all(np.isfinite(X)) else -1)
    return np.asarray(out, dtype=int)
