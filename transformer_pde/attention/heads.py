r"""Attention frozen at one time: :class:`Head`, :class:`AttentionParams` and :func:`score_head`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import replace as _dc_replace
from typing import Any

import numpy as np

from .kinds import KINDS, Kind
from .rotary import Rotary

__all__ = ["AttentionParams", "Head", "score_head"]


@dataclass(frozen=True)
class Head:
    r"""One attention head frozen at a time.

    Attributes
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices (score :math:`\langle Qx, Ky\rangle`; temperature not included).
    V : ndarray, shape (c, d)
        Value matrix; the head writes :math:`V\,(\text{average})` into ``rows``.
    rows : slice
        Output coordinates this head writes (``slice(0, d)`` for a single head).
    bQ, bK : ndarray, shape (k,), or None
        Query and key biases: the score is :math:`\langle Qx + b_Q, Ky + b_K\rangle`.
    bV : ndarray, shape (c,), or None
        Value bias: the head averages :math:`Vy + b_V`.
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    rows: slice
    bQ: np.ndarray | None = None
    bK: np.ndarray | None = None
    bV: np.ndarray | None = None

    @property
    def has_bias(self) -> bool:
        """Whether any of the query, key or value maps is affine rather than linear."""
        return self.bQ is not None or self.bK is not None or self.bV is not None

    @property
    def A(self) -> np.ndarray:
        r""":math:`A_h = K_h^\top Q_h` (d×d), so that :math:`s(x, y) = y^\top A_h x`."""
        return self.K.T @ self.Q


def score_head(kind: Kind | str, head: Head) -> Head:
    r"""``head`` with the bias parts that the weights of ``kind`` cannot see removed exactly.

    The biased score is
    :math:`\langle Qx + b_Q, Ky + b_K\rangle = \langle Qx + b_Q, Ky\rangle + \langle Qx + b_Q, b_K\rangle`,
    and, by :attr:`Kind.bias_rule`:

    * ``"drop_key"`` (softmax): the second term depends on the query only and cancels in the
      per-query normalisation, so ``b_K`` is dropped;
    * ``"drop_both"`` (sinkhorn): terms depending on the query only or on the key only are
      absorbed by the two Sinkhorn potentials; :math:`\langle b_Q, Ky + b_K\rangle` depends on
      the key only, so ``b_Q`` and ``b_K`` are both dropped;
    * ``"difference"`` (l2): the kernel sees :math:`(Qx + b_Q) - (Ky + b_K)` only, so ``b_Q``
      becomes :math:`b_Q - b_K` and ``b_K`` is dropped (the head is returned unchanged if
      that difference overflows);
    * ``"keep"``: ``head`` itself.

    The field is mathematically unchanged; numerically, a huge cancelling bias (say
    :math:`|b_K| = 10^{16}`) no longer swamps :math:`Ky` by rounding.  Every head field
    receives heads prepared by this function (:attr:`AttentionParams.score_heads`), so
    every backend sees the same scores.
    """
    entry = KINDS[kind] if isinstance(kind, str) else kind
    rule = entry.bias_rule
    if rule == "keep" or (head.bQ is None and head.bK is None):
        return head
    if rule == "drop_key":
        bQ = head.bQ
    elif rule == "drop_both":
        bQ = None
    else:  # "difference"
        if head.bK is None:
            return head
        with np.errstate(over="ignore"):
            bQ = -head.bK if head.bQ is None else head.bQ - head.bK
        if not np.all(np.isfinite(bQ)):
            return head
    return _dc_replace(head, bQ=bQ, bK=None)


@dataclass(frozen=True)
class AttentionParams:
    """All parameters of an :class:`Attention` evaluated at one time ``t``.

    ``heads`` holds one :class:`Head` per head; ``W_O`` is ``None`` for the identity.
    The field is ``W_O @ concat_h(head_h output) + b_O`` (``b_O`` ``None`` for no bias).
    ``shift`` is the constant :math:`c` of the exponential kernels :math:`e^{s - c}` (see
    :class:`~transformer_pde.Attention`; only the unnormalised ``exp`` field depends on it).
    ``rotary`` is the attention's :class:`~transformer_pde.attention.Rotary` (or ``None``):
    the head fields rotate the projected queries and keys by their tokens' positions.
    ``alibi`` holds the ALiBi slope of every query head (``None``: no
    ALiBi; :mod:`~transformer_pde.attention.alibi`).
    """

    kind: str
    d: int
    heads: tuple[Head, ...]
    W_O: np.ndarray | None
    beta: float
    eps: float
    l2_beta: float
    masked: bool
    t: float = 0.0
    b_O: np.ndarray | None = None
    shift: float = 0.0
    rotary: Rotary | None = None
    alibi: np.ndarray | None = None

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    @property
    def has_bias(self) -> bool:
        """Whether any head map or the output map carries a bias vector."""
        return self.b_O is not None or any(h.has_bias for h in self.heads)

    @property
    def score_heads(self) -> tuple[Head, ...]:
        """The heads prepared for evaluation: :func:`score_head` of each, for this kind.

        With ``rotary`` the heads are returned as they are: the rotation of a bias depends
        on its token's position, so no bias term is the same for every key (or query)."""
        if self.rotary is not None:
            return self.heads
        entry = KINDS[self.kind]
        return tuple(score_head(entry, h) for h in self.heads)

    def overflow_message(self, h: int | None, dtype: Any) -> str:
        """Why the field of these parameters can fail to be finite for finite tokens, with
        advice: of head ``h``, or after the output map ``W_O``, ``b_O`` when ``h`` is
        None, computed in ``dtype``."""
        dtype = np.dtype(dtype)
        where = "" if self.n_heads == 1 and h is not None else \
            (f" (head {h})" if h is not None else " (after the output map W_O, b_O)")
        head = (f"the {self.kind!r} attention field at t={self.t:g} with beta={self.beta:g}"
                f"{where} is not finite in {dtype} for finite tokens: ")
        log_max = math.log(float(np.finfo(dtype).max))
        f64 = ", compute in float64" if dtype == np.float32 else ""
        advice = "lower beta, rescale Q, K, V or the tokens" + f64
        if h is None:
            why = "the output projection overflows the float range"
            advice = "rescale W_O, b_O, V or the tokens" + f64.replace(", c", ", or c")
        elif self.kind == "exp":
            why = (f"the unnormalised kernel e^(beta <Qx + b_Q, Ky + b_K> - shift) (shift="
                   f"{self.shift:g}) overflows once beta * score - shift exceeds about "
                   f"{log_max:.1f} (plus the log of the averaged values)")
            advice = ("pass Attention(..., shift=c) with c near beta * max score (shift=beta "
                      "for unit tokens and Q = K = I): the same flow with time rescaled by "
                      "e^c; or use the normalised kind 'softmax'; or " + advice)
        elif KINDS[self.kind].normalized:
            why = ("the averaged values V y + b_V (the attention weights sum to one) exceed "
                   "the float range")
            advice = "rescale V, b_V or the tokens" + f64.replace(", c", ", or c")
        else:
            why = ("the unnormalised field sum_j w_j phi(beta * score) (V y_j + b_V) exceeds "
                   "the float range: the scores times the values are too large")
        return f"{head}{why}; {advice}"
