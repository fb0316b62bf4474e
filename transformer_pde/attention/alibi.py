r"""ALiBi: attention with linear biases in the token positions (Press, Smith & Lewis,
arXiv 2108.12409).

With slopes :math:`\lambda_h \ge 0` (one per query head) and token positions
:math:`p \in [0, 1]`, the score of head :math:`h` becomes

.. math:: s_h(x_i, x_j) = \beta\langle Q_h x_i + b_Q, K_h x_j + b_K\rangle
          - \lambda_h |p_i - p_j|,

so that the exponential kernels gain the factor :math:`e^{-\lambda_h |p_i - p_j|}`
(``softmax``, ``exp``, ``l2``; the other kinds have no exponential kernel and refuse it).

How the field evaluates it without a kernel of its own: inside each segment the keys are
sorted by position.  For the keys at or before the query,
:math:`-\lambda(p_i - p_j) = \lambda p_j - \lambda p_i`: a per-key bias
:math:`\lambda p_j` (bounded by :math:`\lambda`) and a per-query constant
:math:`-\lambda p_i`, which cancels in the normalised kinds and is the factor
:math:`e^{-\lambda p_i}` of ``exp``, applied to the log-sum-exp.  For the keys after it the
signs flip.  A causal query sees one range of keys, an unmasked one two (before and
after), reduced separately and merged by log-sum-exp: every exponent stays within
:math:`\lambda` of the plain scores, and the result is exact to round-off.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import real_array
from ..validation import type_name as _what

__all__ = ["ALIBI_KINDS", "alibi_slopes", "check_alibi", "require_alibi_positions"]

#: kinds with an exponential kernel, where ALiBi's factor :math:`e^{-\lambda |p_i - p_j|}` is defined
ALIBI_KINDS = ("softmax", "exp", "l2")


def check_alibi(alibi: Any, kind: str, heads: int) -> float | np.ndarray | None:
    """``alibi`` checked: ``None``, a float >= 0 (every head) or an array of ``heads``
    slopes >= 0 (read-only float64 copy), for a kind of :data:`ALIBI_KINDS`."""
    if alibi is None:
        return None
    if isinstance(alibi, (bool, np.bool_, str, bytes, type)) or alibi is Ellipsis:
        raise ArgumentTypeError(f"alibi must be a slope >= 0 or an array of {heads} slopes "
                                f"(one per query head), got {_what(alibi)}")
    if kind not in ALIBI_KINDS:
        why = ("its doubly stochastic coupling has no per-query key ranges to split"
               if kind == "sinkhorn" else "it has no exponential kernel")
        raise ArgumentError(
            f"alibi is defined only for the kinds {list(ALIBI_KINDS)}, whose kernel it "
            f"multiplies by e^(-lambda |p_i - p_j|); kind={kind!r} refuses it: {why}")
    arr = real_array("alibi", alibi, what="slope or array of slopes")
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != heads):
        raise ArgumentError(f"alibi must be a slope or an array of heads={heads} slopes (one "
                            f"per query head), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ArgumentError(f"alibi slopes must be finite and >= 0 (the score loses "
                            f"lambda |p_i - p_j|), got {arr.tolist()}")
    if arr.ndim == 0:
        return float(arr) + 0.0
    out = np.array(arr, dtype=np.float64) + 0.0
    out.setflags(write=False)
    return out


def alibi_slopes(alibi: float | np.ndarray | None, heads: int) -> np.ndarray | None:
    """The slopes of checked ``alibi`` as a read-only (heads,) array (``None``: no ALiBi)."""
    if alibi is None:
        return None
    out = np.broadcast_to(np.asarray(alibi, dtype=np.float64), (heads,)).copy()
    out.setflags(write=False)
    return out


def require_alibi_positions(alibi: Any, positions: Any, name: str = "positions") -> None:
    """Raise :class:`~transformer_pde.errors.ArgumentError` naming ``name`` when an
    attention with ALiBi (``alibi`` not None) is evaluated without positions."""
    if alibi is not None and positions is None:
        raise ArgumentError(f"ALiBi attention (Attention(alibi=...)) needs {name}: an array "
                            "of the token positions in [0, 1]")
