r"""The scalings of the paper's figures (Castin, Ablin, Carrillo & Peyré, arXiv:2501.18322).

The paper's code passes the score scalings explicitly; :func:`paper_attention` builds the
:class:`~transformer_pde.Attention` that reproduces them (see ``docs/conventions.md`` for the
library's own conventions, which have no hidden :math:`1/\sqrt d`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["paper_attention"]


def paper_attention(kind: str, Q: Any, K: Any, V: Any, *, heads: int = 1, eps: float = 1.0) -> Any:
    r"""An :class:`~transformer_pde.Attention` with the scalings of the paper's figures.

    * ``softmax``: score :math:`\langle Qx, Ky\rangle/\sqrt d`, i.e. :math:`A = K^\top Q/\sqrt d`;
      with ``heads = H > 1`` each head is scaled by :math:`1/\sqrt k`, :math:`k = d/H`;
    * ``l2``: kernel :math:`\exp(-|Qx/\sqrt d - Ky|^2)`: ``l2_beta = 1`` with :math:`Q/\sqrt d`;
    * ``sinkhorn``: :math:`A = K^\top Q` unscaled, :math:`\varepsilon` = ``eps`` (1 in the paper).

    Parameters
    ----------
    kind : {"softmax", "l2", "sinkhorn"}
    Q, K, V : array (d, d)
    heads : int
        Number of heads (softmax only).
    eps : float
        Sinkhorn regularisation.
    """
    from ..attention import Attention  # noqa: PLC0415

    Q = np.asarray(Q, dtype=float)
    d = Q.shape[1]
    if kind == "softmax":
        k = d // heads if heads > 1 else d
        return Attention("softmax", Q / math.sqrt(k), K, V, heads=heads)
    if heads != 1:
        raise ValueError(f"heads must be 1 for kind={kind!r}, got {heads}")
    if kind == "l2":
        return Attention("l2", Q / math.sqrt(d), K, V, l2_beta=1.0)
    if kind == "sinkhorn":
        return Attention("sinkhorn", Q, K, V, eps=eps)
    raise ValueError(f"kind must be 'softmax', 'l2' or 'sinkhorn', got {kind!r}")
