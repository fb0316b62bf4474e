r"""Attention matrices: :func:`attention_matrix`, the weights each query token puts on each key.

For a normalised kind the field of head :math:`h` at token :math:`x_i` is an average,

.. math:: \Gamma^h(x_i) = \sum_j P^h_{ij}\,(V_h x_j + b_{V,h}), \qquad \sum_j P^h_{ij} = 1,

and :math:`P^h` is the row-stochastic attention matrix.  For ``softmax``

.. math:: P^h_{ij} = \frac{w_j\, e^{s_{ij}}\,[p_j \le p_i]}
                          {\sum_l w_l\, e^{s_{il}}\,[p_l \le p_i]},
          \qquad s_{ij} = \beta\,\big\langle R(p_i)(Q_h x_i + b_{Q,h}),\,
                                             R(p_j)(K_h x_j + b_{K,h})\big\rangle,

with the token weights :math:`w_j`, the causal indicator :math:`[p_j \le p_i]` only for
masked attention and the rotation :math:`R(p)` only with rotary positions
(:class:`~transformer_pde.attention.Rotary`); ``l2`` uses
:math:`s_{ij} = -\beta'|R(p_i)(Q_h x_i + b_{Q,h}) - R(p_j)(K_h x_j + b_{K,h})|^2` instead.
With ALiBi slopes :math:`\lambda_h` the scores lose :math:`\lambda_h |p_i - p_j|`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import validation
from ..errors import ArgumentError, ArgumentTypeError, ScoreOverflowError
from ..validation import type_name as _what
from .alibi import require_alibi_positions
from .heads import AttentionParams, Head
from .rotary import require_positions
from .spec import Attention
from .visibility import token_visibility

__all__ = ["MATRIX_KINDS", "attention_matrix", "float_dtype"]

#: kinds whose attention weights form a row-stochastic matrix computed here
MATRIX_KINDS = ("softmax", "l2")


def float_dtype(dtype: Any, name: str = "dtype") -> np.dtype:
    """``dtype`` as ``float64`` or ``float32`` (the dtypes the backends compute in); else an
    error naming ``name``."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ArgumentTypeError(f"{name} must be float64 or float32, got {dtype!r:.60}") from None
    if dt not in (np.float64, np.float32):
        raise ArgumentError(f"{name} must be float64 or float32, got {dt}")
    return dt


def attention_matrix(att: Attention, X: Any, *, t: float = 0.0, weights: Any = None,
                     positions: Any = None, dtype: Any = np.float64) -> np.ndarray:
    r"""The attention matrix :math:`P^h_{ij}` of every head of ``att`` for the tokens ``X``.

    Row :math:`i` holds the weights that query token :math:`i` puts on each token
    :math:`j` (see the module docstring): rows sum to one, masked entries are exactly 0,
    and with the identity output map the field of head :math:`h` is
    ``P[h] @ (X @ V_h.T + b_V_h)`` (``V_h`` the value rows of head :math:`h`, its
    group's with ``kv_heads``).

    Parameters
    ----------
    att : Attention
        Of a kind in :data:`MATRIX_KINDS` (``"softmax"``, ``"l2"``); any heads, grouped
        key/value heads, biases, masking, rotary positions and ALiBi.
    X : array (N, d)
        Tokens.
    t : float, default 0.0
        Time at which time-dependent parameters are evaluated.
    weights : array (N,), optional
        Token masses :math:`w_j` (normalised; uniform by default).
    positions : array (N,), optional
        Token positions in [0, 1], required for masked, rotary or ALiBi attention.
    dtype : {numpy.float64, numpy.float32}
        Floating type of the computation and of the result.

    Returns
    -------
    ndarray, shape (H, N, N)
        ``P[h, i, j]``, rows and columns in the order of ``X``.

    Raises
    ------
    ArgumentTypeError, ArgumentError
        Not an :class:`Attention`, another kind, malformed tokens, weights or positions,
        missing positions, a query that sees no token of positive weight.
    ScoreOverflowError
        Scores beyond the float range.

    Examples
    --------
    >>> import numpy as np, transformer_pde as tp
    >>> att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), masked=True)
    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> np.round(attention_matrix(att, X, positions=[0.0, 0.5])[0], 4).tolist()
    [[1.0, 0.0], [0.2689, 0.7311]]
    """
    if not isinstance(att, Attention):
        raise ArgumentTypeError(f"att must be a transformer_pde.Attention, got {_what(att)}")
    if att.kind not in MATRIX_KINDS:
        raise ArgumentError(f"attention_matrix is defined for the normalised kinds "
                            f"{list(MATRIX_KINDS)}, got kind={att.kind!r}")
    dt = float_dtype(dtype)
    Xn = validation.points("X", X, att.d).astype(dt)
    n = Xn.shape[0]
    w = validation.weights("weights", weights, n)
    require_positions(att.rotary, positions)
    require_alibi_positions(att.alibi, positions)
    pos = validation.positions("positions", positions, n, required=att.masked)
    P = att.at(validation.scalar("t", t))
    with np.errstate(divide="ignore"):
        logw = np.log(w).astype(dt)
    hidden = None
    if att.masked:      # keys outside each token's range (causal, and its window if any)
        vis = token_visibility(pos, None, masked=True, window=att.window)
        j = np.arange(n)
        seen = np.zeros((n, n), dtype=bool)
        seen[:, vis.perm] = (j >= vis.lo[:, None]) & (j < vis.hi[:, None])
        hidden = ~seen
    out = np.empty((P.n_heads, n, n), dtype=dt)
    with np.errstate(over="ignore", invalid="ignore"):
        for h, head in enumerate(P.score_heads):
            out[h] = _head_matrix(P, head, Xn, pos, logw, hidden, h)
    return out


def _head_matrix(P: AttentionParams, head: Head, X: np.ndarray, pos: np.ndarray | None,
                 logw: np.ndarray, hidden: np.ndarray | None, h: int) -> np.ndarray:
    """One head's row-stochastic matrix (see :func:`attention_matrix`)."""
    dt = X.dtype
    q = X @ head.Q.T.astype(dt)
    k = X @ head.K.T.astype(dt)
    if head.bQ is not None:
        q = q + head.bQ.astype(dt)
    if head.bK is not None:
        k = k + head.bK.astype(dt)
    if P.rotary is not None:
        table = P.rotary.table(pos, q.shape[1], np, dt)
        q, k = table.apply(q), table.apply(k)
    if P.kind == "softmax":
        logits = (P.beta * q) @ k.T
    else:   # l2: -b'|q - k|^2 = 2b' q.k - b'|k|^2 - b'|q|^2, the last term cancels per row
        c = k.max(axis=0) * 0.5 + k.min(axis=0) * 0.5
        q, k = q - c, k - c
        logits = (2.0 * P.l2_beta * q) @ k.T - P.l2_beta * (k * k).sum(axis=1)
    if not np.all(np.isfinite(logits)):
        raise ScoreOverflowError(f"attention_matrix: the scores of head {h} overflow the "
                                 f"float range in {dt}; lower beta or rescale Q, K or the "
                                 "tokens")
    if P.alibi is not None and P.alibi[h] > 0.0:
        logits = logits - (P.alibi[h] * np.abs(pos[:, None] - pos[None, :])).astype(dt)
    logits = logits + logw
    if hidden is not None:
        logits[hidden] = -np.inf
    mx = logits.max(axis=1, keepdims=True)
    if not np.all(np.isfinite(mx)):
        i = int(np.flatnonzero(~np.isfinite(mx[:, 0]))[0])
        raise ArgumentError(f"attention_matrix: query token {i} sees no token of positive "
                            "weight (its attention row is undefined)")
    p = np.exp(logits - mx)
    return p / p.sum(axis=1, keepdims=True)
