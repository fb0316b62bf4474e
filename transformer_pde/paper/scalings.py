r"""The scalings of the paper's figures (Castin, Ablin, Carrillo & Peyré, arXiv:2501.18322).

The paper's code passes the score scalings explicitly; :func:`paper_attention` builds the
:class:`~transformer_pde.Attention` that reproduces them (see ``docs/conventions.md`` for the
library's own conventions, which have no hidden :math:`1/\sqrt d`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..attention import Attention

__all__ = ["pad_rows", "paper_attention"]


def pad_rows(M: Any, d: int) -> np.ndarray:
    """``M`` (r, d) completed with zero rows to shape (d, d) (``r <= d``)."""
    M = np.asarray(M, dtype=float)
    if M.ndim != 2 or M.shape[0] > d:
        raise ValueError(f"expected a matrix with at most {d} rows, got shape {M.shape}")
    return np.vstack([M, np.zeros((d - M.shape[0], M.shape[1]))])


def paper_attention(kind: str, Q: Any, K: Any, V: Any, *, heads: int = 1, eps: float = 1.0) -> Any:
    r"""An :class:`~transformer_pde.Attention` with the scalings of the paper's figures.

    * ``softmax``: score :math:`\langle Qx, Ky\rangle/\sqrt d`, i.e. :math:`A = K^\top Q/\sqrt d`;
      with ``heads = H > 1`` each head is scaled by :math:`1/\sqrt k`, :math:`k = d/H`;
    * ``l2``: kernel :math:`\exp(-|Qx/\sqrt d - Ky|^2)`: ``l2_beta = 1`` with :math:`Q/\sqrt d`;
    * ``sinkhorn``: :math:`A = K^\top Q` unscaled, :math:`\varepsilon` = ``eps`` (1 in the paper).

    Parameters
    ----------
    kind : {"softmax", "l2", "sinkhorn"}
    Q, K, V : array
        :math:`Q, K` of shape :math:`(r, d)` (:math:`r \le d` rows), :math:`V` of shape
        :math:`(d, d)`.  With ``heads = H > 1``, head :math:`h` takes rows
        :math:`hk \dots (h+1)k-1` of :math:`Q`, :math:`K`, :math:`V` (:math:`k = d/H`); rows
        of :math:`Q, K` past :math:`r` count as zero, so such a head has :math:`A_h = 0`, as
        in the paper's code.
    heads : int
        Number of heads (softmax only).
    eps : float
        Sinkhorn regularisation.
    """
    Q = np.asarray(Q, dtype=float)
    d = Q.shape[1]
    if kind == "softmax":
        k = d // heads if heads > 1 else d
        if heads > 1 and Q.shape[0] < d:
            # the paper slices rows h*k ... (h+1)*k - 1 of Q and K for head h: a head past
            # the last row gets none, i.e. A_h = 0 (the "plane" figure: 1 row, 2 heads)
            Q, K = pad_rows(Q, d), pad_rows(K, d)
        return Attention("softmax", Q / math.sqrt(k), K, V, heads=heads)
    if heads != 1:
        raise ValueError(f"heads must be 1 for kind={kind!r}, got {heads}")
    if kind == "l2":
        return Attention("l2", Q / math.sqrt(d), K, V, l2_beta=1.0)
    if kind == "sinkhorn":
        return Attention("sinkhorn", Q, K, V, eps=eps)
    raise ValueError(f"kind must be 'softmax', 'l2' or 'sinkhorn', got {kind!r}")
