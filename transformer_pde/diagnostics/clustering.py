r"""Clusters of a token cloud: :func:`clusters` and :func:`cluster_counts` along a run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation
from ..errors import ArgumentError
from ..results import ResultKind, require_kind

__all__ = ["EXACT_MST_MAX", "GAP_RATIO", "Clusters", "cluster_counts", "clusters"]


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
        The distance threshold used (``tol`` times the cloud radius, or the height of the
        largest-gap cut; 0 for one cluster found without ``tol``).
    """

    labels: np.ndarray
    centres: np.ndarray
    masses: np.ndarray
    scale: float

    @property
    def n_clusters(self) -> int:
        return int(self.masses.shape[0])


#: :func:`clusters` without ``tol``: the cut of the single-linkage tree must separate the
#: groups by at least this factor more than the links inside them (and than the median
#: link).  Measured on single Gaussian clouds (N = 5..300, d = 1..5): largest ratio 2--6
#: (heavy-tailed t(3) clouds up to 12, an outlier split off); three blobs 10--30 standard
#: deviations apart: 8--200.
GAP_RATIO = 10.0
#: :func:`clusters` forms all pairwise distances (exact minimum spanning tree) up to this
#: many tokens; beyond, the tree of a k-nearest-neighbour graph joined by exact nearest
#: pairs between its components (Boruvka).
EXACT_MST_MAX = 2000


def _mst_edges(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Euclidean minimum spanning tree of the rows of ``X``: ``(i, j, length)`` of its
    ``N - 1`` edges (zero-length edges of coincident points included)."""
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components, minimum_spanning_tree  # noqa: PLC0415
    from scipy.spatial import cKDTree  # noqa: PLC0415
    from scipy.spatial.distance import pdist, squareform  # noqa: PLC0415

    n = X.shape[0]
    if n <= EXACT_MST_MAX:
        D = squareform(pdist(X))
        # minimum_spanning_tree drops zero entries: offset every distance (the tree of D + c
        # off the diagonal is the tree of D) and remove the offset again
        off = D + 1.0
        np.fill_diagonal(off, 0.0)
        T = minimum_spanning_tree(off).tocoo()
        return T.row, T.col, D[T.row, T.col]
    tree = cKDTree(X)
    k = min(n - 1, 10)
    dist, idx = tree.query(X, k=k + 1)
    rows = np.repeat(np.arange(n), k)
    cols = idx[:, 1:].ravel()
    lens = dist[:, 1:].ravel()
    while True:
        g = coo_matrix((lens + 1.0, (rows, cols)), shape=(n, n))
        T = minimum_spanning_tree(g).tocoo()
        m, comp = connected_components(T, directed=False)
        if m == 1:
            lens_t = np.sqrt(np.sum((X[T.row] - X[T.col]) ** 2, axis=1))
            return T.row, T.col, lens_t
        # Boruvka step: join every component to its nearest point outside it
        new_r, new_c, new_l = [T.row], [T.col], [T.data - 1.0]
        for c in range(m):
            inside = np.flatnonzero(comp == c)
            outside = np.flatnonzero(comp != c)
            d_c, j_c = cKDTree(X[outside]).query(X[inside], k=1)
            best = int(np.argmin(d_c))
            new_r.append(inside[best:best + 1])
            new_c.append(outside[j_c[best]:j_c[best] + 1])
            new_l.append(np.array([d_c[best]]))
        rows, cols, lens = (np.concatenate(new_r), np.concatenate(new_c),
                            np.concatenate(new_l))


def _gap_cut(lengths: np.ndarray) -> tuple[float, float]:
    """``(height, ratio)``: cut of the single-linkage tree at its largest relative gap.

    With the tree's edge lengths sorted, cutting the ``K - 1`` longest edges gives ``K``
    groups; its ratio is the shortest cut edge over the longest kept edge (floored at the
    median edge, so that a few coincident points do not count as a group).  The best ratio
    wins (ties: fewer groups); ``height`` is a threshold between the kept and cut edges, or
    0 when no cut reaches :data:`GAP_RATIO` (one group).
    """
    e = np.sort(lengths)
    if e.size < 2 or e[-1] <= 0:  # two tokens: no link inside a group to compare with
        return 0.0, 1.0
    med = float(np.median(e))
    kept = np.maximum(e[:-1], med)  # longest kept edge when cutting e[k+1:]
    with np.errstate(divide="ignore"):
        ratio = np.where(kept > 0, e[1:] / np.where(kept > 0, kept, 1.0), np.inf)
    # fewer groups first on ties: scan from the longest edge down
    k = ratio.size - 1 - int(np.argmax(ratio[::-1]))
    if not ratio[k] >= GAP_RATIO:
        return 0.0, float(ratio[k])
    lo, hi = float(e[k]), float(e[k + 1])
    return (math.sqrt(lo * hi) if lo > 0 else 0.5 * hi), float(ratio[k])


def clusters(X: Any, *, tol: float | None = None, weights: Any = None) -> Clusters:
    r"""Single-linkage clusters of a token cloud.

    Two tokens are in the same cluster when a chain of tokens joins them with every link
    shorter than a height :math:`h` (single-linkage clustering cut at :math:`h`: the
    connected components of the :math:`h`-neighbour graph).

    * ``tol=None`` (default): well-separated groups, whatever their spread.  The
      single-linkage tree (the Euclidean minimum spanning tree) is cut at its **largest
      relative gap**: cutting its :math:`K-1` longest edges is accepted when the shortest
      cut edge is at least :data:`GAP_RATIO` times the longest kept one (and the median
      edge); otherwise the cloud is one cluster.  So three blobs far apart compared with
      their own spread are three clusters at any spread, a single Gaussian cloud is one,
      and tokens collapsed onto a few points (the clustering of attention dynamics) are
      as many clusters as points.
    * ``tol`` given: a fixed scale, :math:`h = \mathrm{tol}\cdot\max_i |x_i - \bar x|`
      (``tol`` times the cloud's radius about its weighted mean :math:`\bar x`).

    Both are invariant under rotations, translations, scaling and permutations of the
    tokens.  A cloud of one point, or of identical points, is one cluster.  The weights
    only enter the masses and centres.  Cost: :math:`O(N^2)` time and memory up to
    :data:`EXACT_MST_MAX` tokens (exact tree), :math:`O(N\log N)` beyond (k-nearest-neighbour
    tree joined exactly between its components) with ``tol=None``; :math:`O(N \log N)` for
    well-separated clusters with ``tol``.
    """
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components  # noqa: PLC0415
    from scipy.spatial import cKDTree  # noqa: PLC0415

    Xa = validation.points("X", X, column=True, keep_float32=False)
    w = validation.weights("weights", weights, Xa.shape[0])
    n = Xa.shape[0]
    if tol is None:
        if n == 1:
            h = 0.0
            labels = np.zeros(1, dtype=int)
        else:
            i, j, lengths = _mst_edges(Xa)
            h, _ = _gap_cut(lengths)
            keep = lengths <= h if h > 0 else np.zeros(lengths.shape, bool)
            if h == 0.0:
                labels = np.zeros(n, dtype=int)
            else:
                graph = coo_matrix((np.ones(int(keep.sum())), (i[keep], j[keep])), shape=(n, n))
                _, labels = connected_components(graph, directed=False)
    else:
        tol = validation.positive("tol", tol)
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


def cluster_counts(traj: Any, *, tol: float | None = None) -> np.ndarray:
    """Number of :func:`clusters` (with ``tol``; default: the largest-gap cut) at every
    saved time of a particle trajectory (-1 for non-finite states)."""
    require_kind(traj, "traj", (ResultKind.PARTICLES,))
    if traj.states is None:
        raise ArgumentError("traj holds no states (it was saved with SaveAt(fn=...)); count "
                            "clusters in the statistic instead")
    out = []
    for X in traj.states:
        out.append(clusters(X, tol=tol, weights=traj.weights).n_clusters
                   if np.all(np.isfinite(X)) else -1)
    return np.asarray(out, dtype=int)
