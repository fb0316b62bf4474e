r"""Pair statistics of tokens on the sphere: :func:`pair_fraction` and
:func:`component_clusters`.

Both read the inner products :math:`G_{ij} = \langle x_i, x_j\rangle` of unit tokens and
call a pair *close* when

.. math:: G_{ij} \ge 1 - \varepsilon
          \qquad\Big(\text{for unit vectors: } |x_i - x_j| \le \sqrt{2\varepsilon}\Big).

:func:`pair_fraction` is the fraction of close pairs :math:`i < j`;
:func:`component_clusters` counts the connected components of the graph of close pairs.
They take token arrays of shape ``(n, d)``, ``(B, n, d)`` or ``(T, B, n, d)`` (any
number of leading axes), or, with ``gram=True``, Gram matrices ``(..., n, n)`` such as
those of :func:`transformer_pde.reductions.gram_flow`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from .. import validation
from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["component_clusters", "gram_of", "pair_fraction"]


def gram_of(X: Any, *, gram: bool = False, name: str = "X") -> np.ndarray:
    r"""The Gram matrices :math:`G_{ij} = \langle x_i, x_j\rangle` of ``X`` (``(..., n, d)``),
    or ``X`` itself checked as Gram matrices ``(..., n, n)`` when ``gram=True``.

    Raises
    ------
    ArgumentTypeError
        ``X`` is not a real array, or ``gram`` not a bool.
    ArgumentError
        Fewer than 2 axes, NaN or inf, a non-square Gram matrix, or fewer than 2 tokens
        (no pairs).
    """
    if not isinstance(gram, (bool, np.bool_)):
        raise ArgumentTypeError(f"gram must be a bool, got {gram!r:.60}")
    A = validation.finite_array(name, X)
    if A.ndim < 2:
        raise ArgumentError(f"{name} must have shape (..., n, {'n' if gram else 'd'}), got "
                            f"{A.shape}")
    if gram and A.shape[-1] != A.shape[-2]:
        raise ArgumentError(f"{name} with gram=True must hold square Gram matrices "
                            f"(..., n, n), got shape {A.shape}")
    if A.shape[-2] < 2:
        raise ArgumentError(f"{name} must hold at least 2 tokens (pairs), got shape {A.shape}")
    return A if gram else A @ np.swapaxes(A, -1, -2)


def _close_pairs(X: Any, eps: Any, gram: bool) -> tuple[np.ndarray, tuple, int]:
    r"""``(close, (i, j), n)``: whether :math:`\langle x_i, x_j\rangle \ge 1 - \varepsilon`
    for each pair :math:`i < j` (last axis, in :func:`numpy.triu_indices` order), the pairs
    and the number of tokens."""
    e = validation.nonnegative("eps", eps)
    G = gram_of(X, gram=gram)
    n = G.shape[-1]
    iu = np.triu_indices(n, k=1)
    return G[..., iu[0], iu[1]] >= 1.0 - e, iu, n


def _scalar_or_array(a: np.ndarray, ndim: int) -> Any:
    return a.item() if ndim == 2 else a


def pair_fraction(X: Any, eps: float, *, gram: bool = False) -> float | np.ndarray:
    r"""Fraction of token pairs :math:`i < j` with :math:`\langle x_i, x_j\rangle \ge 1 - \varepsilon`.

    .. math:: p_\varepsilon(X) = \binom n2^{-1}\,
              \#\{i < j:\ \langle x_i, x_j\rangle \ge 1 - \varepsilon\}.

    It is 1 exactly when every pair is close (one cluster of diameter
    :math:`\le\sqrt{2\varepsilon}` on the sphere) and 0 when no pair is.

    Parameters
    ----------
    X : array (..., n, d)
        Tokens (meant to be unit vectors); the last two axes are reduced, so ``(n, d)``
        gives a number, ``(B, n, d)`` an array ``(B,)``, ``(T, B, n, d)`` one ``(T, B)``.
    eps : float
        Closeness threshold :math:`\varepsilon \ge 0`.
    gram : bool, default False
        ``X`` holds Gram matrices ``(..., n, n)`` instead of tokens (only entries
        :math:`i < j` are read).

    Returns
    -------
    float or ndarray of shape ``X.shape[:-2]``

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> round(pair_fraction(X, 1e-3), 6)
    0.333333
    """
    close, _, _ = _close_pairs(X, eps, gram)
    return _scalar_or_array(close.mean(axis=-1), np.ndim(X))


def component_clusters(X: Any, eps: float, *, gram: bool = False) -> int | np.ndarray:
    r"""Number of clusters: connected components of the graph of close pairs.

    The graph has the tokens as vertices and an edge :math:`i \sim j` when
    :math:`\langle x_i, x_j\rangle \ge 1 - \varepsilon`; its connected components
    (:func:`scipy.sparse.csgraph.connected_components`) are the clusters.  Closeness is not
    transitive: in a chain of tokens with consecutive pairs close but the end pair not,
    the chain is one cluster (one component), whereas the rank of the thresholded Gram
    matrix, or counting distinct rows, would see more.

    Parameters
    ----------
    X : array (..., n, d)
        Tokens (meant to be unit vectors), any leading axes.
    eps : float
        Closeness threshold :math:`\varepsilon \ge 0`.
    gram : bool, default False
        ``X`` holds Gram matrices ``(..., n, n)`` (only entries :math:`i < j` are read).

    Returns
    -------
    int or ndarray of int, shape ``X.shape[:-2]``
        Between 1 (every token linked to every other through close pairs) and :math:`n`.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.radians([0.0, 2.0, 4.0])               # consecutive angles of 2 degrees
    >>> X = np.stack([np.cos(a), np.sin(a)], axis=1)
    >>> component_clusters(X, 1 - np.cos(np.radians(3.0)))   # 3-degree threshold
    1
    """
    close, iu, n = _close_pairs(X, eps, gram)
    flat = close.reshape(-1, iu[0].size)
    out = np.empty(flat.shape[0], dtype=np.int64)
    for m, row in enumerate(flat):
        if row.all():
            out[m] = 1
            continue
        graph = csr_matrix((np.ones(int(row.sum())), (iu[0][row], iu[1][row])), shape=(n, n))
        out[m] = connected_components(graph, directed=False)[0]
    out = out.reshape(close.shape[:-1])
    return int(out) if np.ndim(X) == 2 else out
