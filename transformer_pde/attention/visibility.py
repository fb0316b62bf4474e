r"""Which tokens each token sees: causal order, packed segments and sliding windows.

A field evaluation reduces, for every query, over one contiguous range of keys
:math:`[\mathrm{lo}_i, \mathrm{hi}_i)` of the tokens put once in *kernel order* (see
:class:`~transformer_pde.backends.ranges.KeyRanges`).  This module computes that order and
those ranges from the model's visibility (``masked``, ``window``) and the token set's
layout (``positions``, ``segments``), as plain NumPy integers:

* ``segments`` :math:`(n_1, \dots, n_B)`: the tokens form consecutive groups of these
  sizes that never see each other (packed sequences, ensembles of systems); segment
  :math:`b` holds the tokens :math:`[o_b, o_{b+1})`, :math:`o_b = n_1 + \dots + n_{b-1}`.
  Unmasked, a token of segment :math:`b` sees the keys :math:`[o_b, o_{b+1})`.
* ``masked``: inside each segment the keys are sorted by position (stably; the order never
  crosses a segment) and a token at position :math:`s` sees the keys of its segment at
  positions :math:`\le s`: :math:`[o_b, h_i)`, :math:`h_i` the end of the keys at or before
  :math:`s` (tokens tied at one position see each other).
* ``window`` :math:`w` (masked only): the last :math:`w` of those keys,
  :math:`[\max(o_b, h_i - w), h_i)` in kernel order.  Tokens at one position see the same
  keys (with distinct positions, :math:`w = 1` is the token itself).
* ``alibi`` (:mod:`~transformer_pde.attention.alibi`): the keys are put in the causal
  order even unmasked, and every token gets its split point :math:`h_i`: unmasked, it sees
  the keys at or before it, :math:`[o_b, h_i)`, and those after it,
  :math:`[h_i, o_{b+1})`, two ranges that ALiBi reduces separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation
from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["Visibility", "query_ranges", "segment_sizes", "segment_weights", "token_visibility"]


def segment_sizes(segments: Any, n: int) -> np.ndarray | None:
    """``segments`` checked as the sizes of consecutive token groups: ``None``, or a
    sequence of integers >= 1 summing to the number of tokens ``n`` (int64 array)."""
    if segments is None:
        return None
    try:
        flat = not isinstance(segments, (str, bytes, dict)) and np.ndim(segments) == 1
    except ValueError:      # a ragged nesting
        flat = False
    if not flat:
        raise ArgumentTypeError("segments must be a sequence of integers >= 1 (the sizes of "
                                f"consecutive token groups), got {segments!r:.60}")
    sizes = np.array([validation.integer(f"segments[{i}]", s, minimum=1)
                      for i, s in enumerate(segments)], dtype=np.int64)
    if sizes.size == 0 or int(sizes.sum()) != n:
        raise ArgumentError(f"segments must be sizes summing to the number of tokens {n}, got "
                            f"{sizes.size} sizes summing to {int(sizes.sum())}")
    return sizes


def segment_weights(weights: Any, n: int, sizes: np.ndarray | None) -> np.ndarray:
    """Checked token ``weights`` (``None``: uniform) normalised to sum 1 in each segment of
    ``sizes``: each segment is its own probability measure."""
    if sizes is None or sizes.size == 1:
        return validation.weights("weights", weights, n)
    if weights is None:
        return np.repeat(1.0 / sizes, sizes)
    w = validation.weights("weights", weights, n)
    starts = np.cumsum(sizes) - sizes
    total = np.add.reduceat(w, starts)
    if not np.all(total > 0):
        b = int(np.argmin(total > 0))
        raise ArgumentError(f"weights of segment {b} (tokens {starts[b]} to "
                            f"{starts[b] + sizes[b] - 1}) are all zero: each segment is its own "
                            "measure and needs a positive total weight")
    return w / np.repeat(total, sizes)


@dataclass(frozen=True)
class Visibility:
    """The kernel order of the keys and the key range of every token (queries = tokens).

    ``perm``: key :math:`j` (kernel order) is token ``perm[j]`` (``None``: the tokens as
    given); ``lo``, ``hi`` (N,) per token in the tokens' order (``None``: every token sees
    every key); ``sorted_pos``: the positions in kernel order (``None`` unless masked);
    ``bounds``: ``[(start, end)]`` of every segment in kernel order (``None``: one);
    ``split``, ``end`` (N,): the causal end :math:`h_i` of every token and the end of its
    segment (``None`` unless unmasked with ALiBi: the keys before the token are
    ``[lo, split)``, those after it ``[split, end)``)."""

    perm: np.ndarray | None
    lo: np.ndarray | None
    hi: np.ndarray | None
    sorted_pos: np.ndarray | None
    bounds: list[tuple[int, int]] | None = None
    split: np.ndarray | None = None
    end: np.ndarray | None = None


def token_visibility(positions: np.ndarray | None, sizes: np.ndarray | None, *, masked: bool,
                     window: int | None = None, alibi: bool = False) -> Visibility:
    """The :class:`Visibility` of checked ``positions`` (required when ``masked`` or
    ``alibi``) and segment ``sizes`` (:func:`segment_sizes`; ``None``: one segment)."""
    bounds = None
    if sizes is not None and sizes.size > 1:
        ends = np.cumsum(sizes)
        bounds = list(zip((ends - sizes).tolist(), ends.tolist(), strict=True))
    if alibi and not masked:
        if positions is None:
            raise ArgumentError("ALiBi attention needs positions: an array of N token "
                                "positions in [0, 1]")
        causal = token_visibility(positions, sizes, masked=True)
        full = np.cumsum(sizes) if sizes is not None else np.array([positions.shape[0]])
        sz = sizes if sizes is not None else full
        end = np.repeat(full, sz)
        return Visibility(causal.perm, causal.lo, end, causal.sorted_pos, bounds,
                          causal.hi, end)
    if not masked:
        if bounds is None:
            return Visibility(None, None, None, None)
        return Visibility(None, np.repeat(ends - sizes, sizes), np.repeat(ends, sizes), None,
                          bounds)
    if positions is None:
        raise ArgumentError("masked attention needs positions: an array of N token positions "
                            "in [0, 1]")
    n = positions.shape[0]
    sizes = np.array([n], dtype=np.int64) if sizes is None else sizes
    seg = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    # (segment, position) as one exact integer key: the rank of each position among the
    # distinct positions, offset by the segment; a stable sort of it sorts by position
    # inside each segment (one segment: exactly argsort(positions, kind="stable"))
    distinct = np.unique(positions)
    key = seg * distinct.size + np.searchsorted(distinct, positions)
    perm = np.argsort(key, kind="stable")
    hi = np.searchsorted(key[perm], key, side="right")
    start = np.repeat(np.cumsum(sizes) - sizes, sizes)
    lo = start if window is None else np.maximum(start, hi - window)
    return Visibility(perm, lo, hi, positions[perm], bounds)


def query_ranges(sorted_pos: np.ndarray, query_positions: np.ndarray,
                 window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` of queries at checked ``query_positions`` over keys (one segment) at
    ``sorted_pos`` (kernel order): the keys at or before each query, the last ``window``
    of them when a window is set."""
    hi = np.searchsorted(sorted_pos, query_positions, side="right")
    lo = np.zeros_like(hi) if window is None else np.maximum(hi - window, 0)
    return lo, hi
