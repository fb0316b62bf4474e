r"""Statistics of a token cloud at every saved depth: clusters, ranks, cosine similarities.

:func:`depth_statistics` summarises a stack of token states (T, N, d) -- the hidden states
of a network or the saved states of a flow -- depth by depth, in numbers that a figure or a
JSON report can carry; :func:`cosine_similarity` is the token-by-token cosine matrix it
averages.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ArgumentError
from .clustering import clusters
from .ranks import effective_rank, numerical_rank

__all__ = ["cosine_similarity", "depth_statistics"]


def cosine_similarity(X: Any) -> np.ndarray:
    r"""Matrix of cosine similarities :math:`\langle x_i, x_j\rangle / (|x_i|\,|x_j|)`
    between the rows of ``X`` (N, d), clipped to :math:`[-1, 1]` (rows must be nonzero)."""
    A = np.asarray(X, dtype=float)
    U = A / np.linalg.norm(A, axis=1, keepdims=True)
    return np.clip(U @ U.T, -1.0, 1.0)


def depth_statistics(states: Any, *, cluster_tol: float = 0.05, rank_rtol: float = 1e-6,
                     collapse_rtol: float = 1e-8) -> dict[str, list]:
    r"""Per-depth statistics of token states (T, N, d) (hidden states or a trajectory).

    For every saved depth:

    * ``n_clusters``: single-linkage clusters of the tokens with links shorter than
      ``cluster_tol`` times the cloud radius :math:`r = \max_i |x_i - \bar x|`
      (:func:`~transformer_pde.diagnostics.clusters`);
    * ``numerical_rank`` / ``effective_rank``: of the token covariance
      (:func:`~transformer_pde.diagnostics.numerical_rank` with ``rank_rtol``, and the entropy
      rank; at most :math:`N - 1`);
    * ``mean_cosine`` / ``min_cosine``: off-diagonal cosine similarities of the raw tokens
      (1 for a single token);
    * ``mean_norm`` and ``radius`` :math:`r`.

    A cloud with :math:`r \le` ``collapse_rtol`` times its mean token norm has collapsed to a
    point up to rounding: it counts as one cluster of rank 0 (without this floor, rounding
    noise would be counted as :math:`N` clusters of full rank).

    Returns
    -------
    dict of list
        One list of T numbers per statistic above (``int`` for counts and ranks).

    Raises
    ------
    ArgumentError
        ``states`` is not of shape (T, N, d) with N >= 1.
    """
    S = np.asarray(states, dtype=float)
    if S.ndim != 3 or S.shape[1] < 1:
        raise ArgumentError(f"states must have shape (T, N, d), got {S.shape}")
    n = S.shape[1]
    off = ~np.eye(n, dtype=bool)
    out: dict[str, list] = {"n_clusters": [], "numerical_rank": [], "effective_rank": [],
                            "mean_cosine": [], "min_cosine": [], "mean_norm": [],
                            "radius": []}
    for X in S:
        C = cosine_similarity(X)
        c = X - X.mean(axis=0)
        r = float(np.linalg.norm(c, axis=1).max())
        norm = float(np.linalg.norm(X, axis=1).mean())
        if r <= collapse_rtol * norm:
            k, nr, er = 1, 0, 0.0
        else:
            # the nonzero spectrum of the d x d covariance c^T c / n is that of the n x n Gram
            # matrix c c^T / n: decompose the smaller (a sentence has n << d tokens), same ranks
            cov = c.T @ c / n if n >= c.shape[1] else c @ c.T / n
            k = clusters(X, tol=cluster_tol).n_clusters
            nr = numerical_rank(cov, rtol=rank_rtol)
            er = effective_rank(cov)
        out["n_clusters"].append(int(k))
        out["numerical_rank"].append(int(nr))
        out["effective_rank"].append(float(er))
        out["mean_cosine"].append(float(C[off].mean()) if n > 1 else 1.0)
        out["min_cosine"].append(float(C[off].min()) if n > 1 else 1.0)
        out["mean_norm"].append(norm)
        out["radius"].append(r)
    return out
