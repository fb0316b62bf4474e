r"""ALiBi in the head fields: one or two passes of the backend's ``softmax`` primitive.

For query :math:`i` at position :math:`p_i` and the keys sorted by position (kernel order),
head :math:`h` with slope :math:`\lambda` reduces

* the keys at or before the query (:math:`p_j \le p_i`, range ``before``) with the key
  bias :math:`\lambda p_j` added to the log-weights, then subtracts :math:`\lambda p_i`
  from the pass's log-sum-exp;
* unmasked only, the keys after it (:math:`p_j > p_i`, range ``after``) with the key bias
  :math:`-\lambda p_j`, then adds :math:`\lambda p_i` to the log-sum-exp;

and merges the two passes by log-sum-exp (:func:`merge_passes`).  Each pass's exponents
differ from the plain scores by at most :math:`\lambda` (positions in :math:`[0, 1]`), and
:math:`\pm\lambda(p_j - p_i)` is formed in the log domain, so nothing overflows and the
result carries the round-off of the plain field plus :math:`O(\lambda\,\epsilon)` in the
exponents.  The normalised kinds use the merged average, ``exp`` multiplies it by
:math:`e^{\mathrm{lse}}` (:mod:`~transformer_pde.fields.kinds`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.ranges import KeyRanges

__all__ = ["AlibiRanges", "alibi_softmax", "merge_passes"]


@dataclass(frozen=True)
class AlibiRanges:
    """The two key ranges of every query and the positions ALiBi needs.

    ``key_pos`` (N,): the key positions in kernel order (backend array, the field's dtype);
    ``query_pos`` (M,): the query positions (backend array); ``before``: the keys at or
    before each query that it sees (the causal range, its window if any); ``after``: the
    keys after it (``None`` for masked attention)."""

    key_pos: Any
    query_pos: Any
    before: KeyRanges
    after: KeyRanges | None


def merge_passes(xp: Any, out1: Any, lse1: Any, out2: Any, lse2: Any) -> tuple[Any, Any]:
    r"""The softmax over the union of two disjoint key sets from each set's
    ``(out, lse)``: :math:`\mathrm{lse} = \log(e^{\mathrm{lse}_1} + e^{\mathrm{lse}_2})`,
    :math:`\mathrm{out} = \sum_k e^{\mathrm{lse}_k - \mathrm{lse}}\,\mathrm{out}_k`.

    An empty pass (``lse = -inf``) has weight 0; two empty passes give ``out = 0``,
    ``lse = -inf`` (the primitives' convention).  When both normalisers overflow
    (``lse = +inf`` twice) the share of each is unknown: the row is NaN, so the field's
    finiteness check reports it rather than a wrong average."""
    m = xp.maximum(lse1, lse2)
    fin = xp.isfinite(m)
    ref = xp.where(fin, m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        # the larger pass weighs 1, the other e^{lse_k - m} (0 when m = +inf)
        a1 = xp.where(lse1 == m, 1.0, xp.where(fin, xp.exp(lse1 - ref), 0.0))
        a2 = xp.where(lse2 == m, 1.0, xp.where(fin, xp.exp(lse2 - ref), 0.0))
        a1 = xp.where(xp.isneginf(lse1), 0.0, a1)
        a2 = xp.where(xp.isneginf(lse2), 0.0, a2)
        s = a1 + a2
        both_inf = xp.isposinf(lse1) & xp.isposinf(lse2)
        s_safe = xp.where(s > 0, s, 1.0)
        out = out1 * (a1 / s_safe)[:, None] + out2 * (a2 / s_safe)[:, None]
        out = xp.where(both_inf[:, None], xp.nan, out)
        lse = xp.where(fin, ref + xp.log(s_safe), m)
    return out.astype(out1.dtype, copy=False), lse.astype(lse1.dtype, copy=False)


def alibi_softmax(be: Any, alibi: AlibiRanges, lam: float, q: Any, k: Any, v: Any,
                  bias: Any) -> tuple[Any, Any]:
    r"""``(out, lse)`` of the softmax primitive with the ALiBi term
    :math:`-\lambda|p_i - p_j|` added to every logit :math:`q_i\cdot k_j + b_j`.

    ``bias`` (N,) is the per-key bias in kernel order (log-weights, the ``l2`` kind's
    :math:`-\beta'|k|^2`); ``lam`` :math:`\ge 0` the head's slope."""
    xp = be.xp
    kp, qp = alibi.key_pos, alibi.query_pos
    out, lse = be.softmax(q, k, v, bias + lam * kp, alibi.before)
    lse = lse - lam * qp
    if alibi.after is None:
        return out, lse
    out2, lse2 = be.softmax(q, k, v, bias - lam * kp, alibi.after)
    return merge_passes(xp, out, lse, out2, lse2 + lam * qp)
