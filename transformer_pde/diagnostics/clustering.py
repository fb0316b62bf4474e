r"""Clusters of a token cloud: :func:`clusters` and :func:`cluster_counts` along a run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree
from scipy.spatial import cKDTree
from scipy.spatial.distance import pdist, squareform

from .. import results_display as display
from .. import validation
from ..backends import compile_notice
from ..errors import ArgumentError
from ..results import ResultKind, require_kind

try:  # numba is optional: without it the interpreter runs the same tree (much slower)
    import numba as _nb
except ImportError:  # pragma: no cover
    _nb = None

__all__ = ["EXACT_MST_MAX", "ROUND_UNITS", "SEPARATION", "Clusters", "cluster_counts",
           "clusters"]


@dataclass(repr=False)
class Clusters(display.Summarised):
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
        The distance threshold used (``tol`` times the cloud radius, or a height between
        the longest kept and the shortest cut edge of the separated cut; 0 for one cluster
        found without ``tol``).
    """

    labels: np.ndarray
    centres: np.ndarray
    masses: np.ndarray
    scale: float

    @property
    def n_clusters(self) -> int:
        return int(self.masses.shape[0])

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        m = np.sort(np.asarray(self.masses, dtype=float))[::-1]
        shown = ", ".join(display.number(v) for v in m[:8]) + (", …" if m.size > 8 else "")
        return (f"Clusters(n_clusters={self.n_clusters}, N={np.shape(self.labels)[0]})",
                [("masses", shown or "—"), ("centres", display.array_summary(self.centres)),
                 ("scale", display.number(self.scale))])


#: :func:`clusters` without ``tol``: a cut of the single-linkage tree is accepted when the
#: groups it makes are at least this many times farther apart than the diameter of the
#: widest group (Dunn's index; above 1 every token is closer to all tokens of its own group
#: than to any token of another).  The margin over 1 rejects the ties of symmetric
#: configurations (equilateral triangles, lattices), where rounding would decide.  Measured:
#: no cut of 540 single Gaussian clouds (N = 20..1000, d = 1..10) reaches it; three
#: Gaussian blobs of N = 10..300 tokens each, d = 1..5, centres 20 standard deviations apart:
#: all found (at 2.0, 60 % of the N = 300 cases in 1-D and 2-D were missed).
SEPARATION = 1.5
#: :func:`clusters` forms the exact minimum spanning tree (Prim's algorithm over all
#: pairwise distances, :math:`O(N^2)` time and :math:`O(N)` memory, compiled by numba) up
#: to this many tokens; beyond, the tree of a k-nearest-neighbour graph joined by exact
#: nearest pairs between its components (Boruvka).  Clusters of more tokens than this use
#: the bound twice their radius about their centre for their diameter.
EXACT_MST_MAX = 2000
#: Resolution of :func:`clusters`: tokens closer than this many units of float64 rounding of
#: the largest coordinate (times :math:`\sqrt d`) are the same point.
ROUND_UNITS = 16.0


def _normalise(X: np.ndarray) -> tuple[np.ndarray, int, float]:
    """``(Z, e, floor)``: the tokens centred on their bounding box and scaled by a power of
    two into the unit cube, ``X = 2**e * Z + c`` (the scaling is exact, the centring rounds
    at the level of the coordinates of ``X``), and the rounding resolution in ``Z`` units."""
    big = float(np.max(np.abs(X)))
    if big == 0.0:
        return np.zeros_like(X), 0, 0.0
    e0 = math.frexp(big)[1]
    Y = np.ldexp(X, -e0)
    Z = Y - (0.5 * Y.max(axis=0) + 0.5 * Y.min(axis=0))
    r = float(np.max(np.abs(Z)))
    if r == 0.0:
        return Z, e0, 0.0
    e1 = math.frexp(r)[1]
    Z = np.ldexp(Z, -e1)
    floor = ROUND_UNITS * math.sqrt(X.shape[1]) * np.finfo(float).eps * math.ldexp(1.0, -e1)
    return Z, e0 + e1, floor


def _prim_tree(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact Euclidean minimum spanning tree of the rows of ``X`` (n >= 2) by Prim's
    algorithm on squared distances: ``(i, j, length)`` of its ``n - 1`` edges.

    :math:`O(n^2 d)` time, :math:`O(n d)` memory (the coordinates of the tokens not yet in
    the tree are kept packed).  A distance is the square root of the sum of the squared
    coordinate differences taken in order, the same float64 value as
    :func:`scipy.spatial.distance.pdist` gives; the tree of the squared distances is a
    tree of the distances (the square root is monotone)."""
    n, d = X.shape
    m = n - 1
    rest = X[1:].T.copy()                 # (d, m): tokens not yet in the tree, packed
    idx = np.arange(1, n)
    best = np.full(m, np.inf)             # squared distance of each to the tree
    parent = np.zeros(m, np.int64)
    sq = np.empty(m)
    src = np.empty(n - 1, np.int64)
    dst = np.empty(n - 1, np.int64)
    length = np.empty(n - 1)
    c = X[0].copy()
    cur = 0
    for step in range(n - 1):
        # squared distances to the token added last, one coordinate at a time (the loops
        # over the packed tokens vectorise; each sum still runs over k in order)
        for p in range(m):
            t = c[0] - rest[0, p]
            sq[p] = t * t
        for k in range(1, d):
            for p in range(m):
                t = c[k] - rest[k, p]
                sq[p] += t * t
        for p in range(m):
            if sq[p] < best[p]:
                best[p] = sq[p]
                parent[p] = cur
        near = np.inf
        pos = 0
        for p in range(m):
            if best[p] < near:
                near = best[p]
                pos = p
        cur = idx[pos]
        src[step], dst[step], length[step] = parent[pos], cur, math.sqrt(near)
        for k in range(d):
            c[k] = rest[k, pos]
        m -= 1                                # move the last packed token into the gap
        idx[pos], best[pos], parent[pos] = idx[m], best[m], parent[m]
        for k in range(d):
            rest[k, pos] = rest[k, m]
    return src, dst, length


if _nb is not None:
    _prim_tree = _nb.njit(cache=True)(_prim_tree)


def _compile_prim_tree() -> None:
    """Compile (or load from the cache) :func:`_prim_tree` for float64 points."""
    _prim_tree(np.zeros((2, 2)))


def _prim_tree_ready() -> bool:
    """Whether :func:`_prim_tree` runs without compiling now; if not, it is compiled on the
    package's background thread meanwhile (the caller takes the dense tree, the same exact
    minimum spanning tree, so the clusters do not depend on it)."""
    return compile_notice.ready_or_background("clusters kernel", [(_prim_tree, "float64")],
                                              _compile_prim_tree)


def _dense_tree(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tree of :func:`_prim_tree` without numba: scipy's minimum spanning tree of the
    dense distance matrix (:math:`O(n^2)` memory, slower)."""

    D = squareform(pdist(X))
    # minimum_spanning_tree drops zero entries: offset every distance (the tree of D + c
    # off the diagonal is the tree of D) and remove the offset again
    off = D + 1.0
    np.fill_diagonal(off, 0.0)
    T = minimum_spanning_tree(off).tocoo()
    return T.row, T.col, D[T.row, T.col]


def _mst_edges(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Euclidean minimum spanning tree of the rows of ``X``: ``(i, j, length)`` of its
    ``N - 1`` edges (zero-length edges of coincident points included)."""

    n = X.shape[0]
    if n <= EXACT_MST_MAX:
        if _nb is None or not _prim_tree_ready():
            return _dense_tree(X)
        return _prim_tree(np.ascontiguousarray(X, dtype=np.float64))
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


def _diameters(Z: np.ndarray, labels: np.ndarray, k: int, need: float) -> float:
    """Largest diameter of the ``k`` groups ``labels`` of the rows of ``Z`` (exact, or twice
    the radius about the group's centre for groups above :data:`EXACT_MST_MAX` tokens);
    groups whose bound ``2 * radius`` is at most ``need`` are not measured."""

    cnt = np.bincount(labels, minlength=k)
    cen = np.stack([np.bincount(labels, weights=z, minlength=k) for z in Z.T], axis=1)
    cen /= np.maximum(cnt, 1)[:, None]
    rad = np.zeros(k)
    np.maximum.at(rad, labels, np.sqrt(np.sum((Z - cen[labels]) ** 2, axis=1)))
    best = float(max(need, rad.max()))  # the diameter is between the radius and twice it
    for c in np.flatnonzero((2.0 * rad > best) & (cnt > 1)).tolist():
        if cnt[c] > EXACT_MST_MAX:
            best = max(best, 2.0 * float(rad[c]))
        else:
            best = max(best, float(pdist(Z[labels == c]).max()))
    return best


def _separated_cut(Z: np.ndarray, i: np.ndarray, j: np.ndarray, lengths: np.ndarray,
                   floor: float) -> tuple[float, np.ndarray | None]:
    """``(height, labels)`` of the best separated cut of the single-linkage tree of ``Z``.

    With the tree's edges sorted, keeping the ``k + 1`` shortest gives ``n - k - 1`` groups,
    ``gap = e[k+1]`` apart (for single linkage, the shortest cut edge is the smallest
    distance between two groups) and its index is ``gap / max(widest diameter, median edge,
    floor)``; the median edge stops a partition of mostly lone tokens from counting (their
    diameter is 0), ``floor`` is the rounding resolution (shorter edges are zero).  The cut
    with the largest index at least :data:`SEPARATION` wins (ties: fewer groups); ``labels``
    is None when there is none (one group).  The diameter is at least the longest kept
    edge, so ``e[k+1] / max(e[k], median, floor)`` bounds the index: cuts are measured in
    decreasing order of that bound until it falls below the best index found.
    """

    n = Z.shape[0]
    L = np.where(lengths > floor, lengths, 0.0)
    order = np.argsort(L, kind="stable")
    e = L[order]
    if e.size < 2 or e[-1] <= 0.0:
        return 0.0, None
    base = max(float(np.median(e)), floor)
    bound = e[1:] / np.maximum(e[:-1], base)      # bound[k]: keep e[0..k], cut e[k+1..]
    cand = np.flatnonzero((bound >= SEPARATION) & (e[1:] > floor))
    # decreasing bound; ties: fewer groups (more kept edges) first
    cand = cand[np.lexsort((-cand, -bound[cand]))]
    best, best_k, best_labels = SEPARATION, -1, None
    for k in cand.tolist():
        if bound[k] < best or (bound[k] == best and best_k >= 0):
            break
        keep = order[:k + 1]
        graph = coo_matrix((np.ones(k + 1), (i[keep], j[keep])), shape=(n, n))
        m, labels = connected_components(graph, directed=False)
        idx = float(e[k + 1]) / _diameters(Z, labels, m, base)
        if idx > best or (idx == best and best_k < 0):
            best, best_k, best_labels = idx, k, labels
    if best_labels is None:
        return 0.0, None
    lo, hi = float(e[best_k]), float(e[best_k + 1])
    return (math.sqrt(lo * hi) if lo > 0 else 0.5 * hi), best_labels


def clusters(X: Any, *, tol: float | None = None, weights: Any = None) -> Clusters:
    r"""Single-linkage clusters of a token cloud.

    Two tokens are in the same cluster when a chain of tokens joins them with every link
    shorter than a height :math:`h` (single-linkage clustering cut at :math:`h`: the
    connected components of the :math:`h`-neighbour graph).

    * ``tol=None`` (default): well-separated groups, whatever their spread and scale.
      Among the cuts of the single-linkage tree (the Euclidean minimum spanning tree), the
      one whose groups are farthest apart relative to their size is taken, provided that

      .. math:: \min_{a \ne b}\ \min_{x\in C_a,\, y \in C_b} |x - y| \;\ge\;
                s \, \max\bigl(\max_a \operatorname{diam} C_a,\ \ell_{1/2}\bigr),

      with :math:`s` = :data:`SEPARATION` (Dunn's index of the partition is at least
      :math:`s`; at :math:`s > 1` every token is closer to each token of its own group
      than to any token of another) and :math:`\ell_{1/2}` the median edge of the tree
      (so that a partition in which most tokens are alone, diameter 0, does not count:
      at most about :math:`N/2` groups); otherwise the cloud is one cluster.  So
      :math:`k` blobs of diameter :math:`D` whose centres are at least
      :math:`(1 + s)D` apart (and no coarser grouping of the blobs better separated) are
      :math:`k` clusters at any scale (the tokens are centred
      and scaled by a power of two before any distance is formed, so :math:`10^{-300}`
      and :math:`10^{300}` work as well as 1); a single Gaussian cloud of 20 tokens or more
      is one (none of 540 sampled clouds, N = 20..1000, d = 1..10, had a cut with an
      index above 1.5; with 3--10 tokens a few percent do, in 1-D up to 40 %: so few
      tokens cannot tell a gap from chance); tokens collapsed onto a few points
      are as many clusters as points.  Tokens closer than the rounding resolution
      :data:`ROUND_UNITS` :math:`\sqrt d\,\epsilon \max|x|` (``epsilon`` the float64
      machine epsilon; the coordinates themselves are only known to about this) count as
      one point.  Cost: :math:`O(N^2)` time and :math:`O(N)` memory up to
      :data:`EXACT_MST_MAX` tokens (exact tree, compiled by numba: about 20 ms at
      :math:`N = 2000`), :math:`O(N\log N)` beyond (k-nearest-neighbour tree joined
      between its components) plus the diameters of the candidate groups (exact up to
      :data:`EXACT_MST_MAX` tokens, twice the radius about the centre beyond: an upper
      bound, which can only merge groups).
    * ``tol`` given: a fixed scale, :math:`h = \mathrm{tol}\cdot\max_i |x_i - \bar x|`
      (``tol`` times the cloud's radius about its weighted mean :math:`\bar x`);
      :math:`O(N \log N)` for well-separated clusters.

    Both are invariant under rotations, translations, scaling and permutations of the
    tokens.  A cloud of one point, or of identical points, or of two tokens (no distance
    inside a group to compare with), is one cluster without ``tol``.  The weights only
    enter the masses and centres.

    Parameters
    ----------
    X : array_like (N, d)
        Finite real tokens.
    tol : float, optional
        Fixed cut, relative to the cloud's radius (finite, > 0).
    weights : array_like (N,), optional
        Non-negative masses (normalised; uniform by default).

    Returns
    -------
    Clusters
        ``scale`` is the cut height in the units of ``X`` (0 for one cluster found
        without ``tol``).
    """

    Xa = validation.points("X", X, column=True, keep_float32=False)
    w = validation.weights("weights", weights, Xa.shape[0])
    n = Xa.shape[0]
    Z, ex, floor = _normalise(Xa)
    if tol is None:
        labels = None
        h = 0.0
        if n > 2:
            i, j, lengths = _mst_edges(Z)
            h, labels = _separated_cut(Z, i, j, lengths, floor)
        if labels is None:
            labels = np.zeros(n, dtype=int)
    else:
        tol = validation.positive("tol", tol)
        centre = w @ Z
        h = float(tol) * float(np.max(np.linalg.norm(Z - centre, axis=1)))
        if h == 0.0:
            labels = np.zeros(n, dtype=int)
        else:
            pairs = cKDTree(Z).query_pairs(h, output_type="ndarray")
            graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
            _, labels = connected_components(graph, directed=False)
    with np.errstate(over="ignore"):  # a huge tol: the height is inf, as tol * radius
        h = float(np.ldexp(h, ex))
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
    """Number of :func:`clusters` (with ``tol``, or the separated cut by default) at every
    saved time of a particle trajectory (-1 for non-finite states).

    The default is the separated cut of :func:`clusters` (see there)."""
    require_kind(traj, "traj", (ResultKind.PARTICLES,))
    if traj.states is None:
        raise ArgumentError("traj holds no states (it was saved with SaveAt(fn=...)); count "
                            "clusters in the statistic instead")
    out = []
    for X in traj.states:
        out.append(clusters(X, tol=tol, weights=traj.weights).n_clusters
                   if np.all(np.isfinite(X)) else -1)
    return np.asarray(out, dtype=int)
