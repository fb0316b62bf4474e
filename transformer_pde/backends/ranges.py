r"""Per-query key ranges: which keys each query of a reduction sees.

Every backend primitive (:mod:`transformer_pde.backends`) reduces, for query :math:`i`, over
the keys :math:`j` of one contiguous range :math:`[\mathrm{lo}_i, \mathrm{hi}_i)` of the keys
*in the order given to the primitive* (``ranges=None``: all keys).  One such range per query
expresses every visibility pattern the package uses:

============================  ================================================================
pattern                       ranges (keys sorted as stated)
============================  ================================================================
causal mask                   :math:`[0, L_i)`, :math:`L_i` the number of keys at positions
                              :math:`\le s_i` (keys sorted by position): :meth:`KeyRanges.prefix`
ensembles / packed sequences  block-diagonal: a query of segment :math:`b` sees the keys of
                              segment :math:`b`, :math:`[o_b, o_{b+1})` (:meth:`KeyRanges.segments`)
causal inside segments        :math:`[o_b, o_b + L_i)`
sliding window of :math:`w`   :math:`[\max(o_b, h_i - w), h_i)` with :math:`h_i` the causal end
============================  ================================================================

A query with an empty range (:math:`\mathrm{lo}_i = \mathrm{hi}_i`) has no visible mass: the
softmax gives ``out = 0`` and ``lse = -inf``, a pointwise sum gives 0.

:class:`KeyRanges` is validated once, at construction (integers, one range per query,
:math:`0 \le \mathrm{lo}_i \le \mathrm{hi}_i \le N`), and holds host (NumPy) ``int64`` arrays;
a backend moves them to its device itself.  A prefix range set (every
:math:`\mathrm{lo}_i = 0`) is recorded as such (:attr:`KeyRanges.is_prefix`), so that a
kernel can keep the exact summation order of a prefix mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["KeyRanges", "check_ranges"]


def _int_vector(name: str, value: Any) -> np.ndarray:
    """``value`` as a 1-D int64 array; bool, float and object entries are refused."""
    arr = np.asarray(value)
    if arr.dtype == bool or arr.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{name} must be an array of integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ArgumentError(f"{name} must be 1-D (one entry per query), got shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ArgumentError(f"{name} has an entry beyond the int64 range")
    return np.ascontiguousarray(arr, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class KeyRanges:
    r"""Query :math:`i` sees the keys :math:`j` with :math:`\mathrm{lo}_i \le j < \mathrm{hi}_i`.

    Parameters
    ----------
    lo, hi : array of int (M,)
        Range ends, :math:`0 \le \mathrm{lo}_i \le \mathrm{hi}_i \le` ``n_keys``
        (``lo = hi``: an empty range).
    n_keys : int
        The number :math:`N` of keys the ranges index.
    name : str, default "ranges"
        How error messages name the argument.

    Raises
    ------
    ArgumentTypeError
        ``lo`` or ``hi`` not integers (bool and float refused, even integral floats).
    ArgumentError
        Not 1-D, different lengths, a range outside ``[0, n_keys]``, or decreasing
        (:math:`\mathrm{lo}_i > \mathrm{hi}_i`); the message names the first bad query.

    Examples
    --------
    >>> from transformer_pde.backends.ranges import KeyRanges
    >>> r = KeyRanges.segments([2, 3])          # two independent blocks of 2 and 3 keys
    >>> r.lo.tolist(), r.hi.tolist()
    ([0, 0, 2, 2, 2], [2, 2, 5, 5, 5])
    >>> r.mask().astype(int)[0].tolist()
    [1, 1, 0, 0, 0]
    """

    lo: np.ndarray
    hi: np.ndarray
    n_keys: int
    name: str = "ranges"
    #: every ``lo`` is 0 (a prefix mask); set at construction
    is_prefix: bool = field(init=False)

    def __post_init__(self) -> None:
        name = self.name
        if isinstance(self.n_keys, bool) or not isinstance(self.n_keys, (int, np.integer)) \
                or self.n_keys < 0:
            raise ArgumentError(f"{name}: n_keys must be an integer >= 0, got {self.n_keys!r}")
        lo = _int_vector(f"{name}.lo", self.lo)
        hi = _int_vector(f"{name}.hi", self.hi)
        if lo.shape != hi.shape:
            raise ArgumentError(f"{name}: lo and hi must have the same length (one range per "
                                f"query), got {lo.shape[0]} and {hi.shape[0]}")
        n = int(self.n_keys)
        for what, bad in (("lo < 0", lo < 0), (f"hi > n_keys = {n}", hi > n),
                          ("lo > hi (a decreasing range)", lo > hi)):
            if bad.any():
                i = int(np.argmax(bad))
                raise ArgumentError(f"{name}: query {i} has the range [{lo[i]}, {hi[i]}) with "
                                    f"{what}; ranges must satisfy 0 <= lo <= hi <= {n}")
        lo.flags.writeable = False
        hi.flags.writeable = False
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "n_keys", n)
        object.__setattr__(self, "is_prefix", not bool(lo.any()))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def prefix(cls, hi: Any, n_keys: int, *, name: str = "ranges") -> KeyRanges:
        """Prefix ranges :math:`[0, \\mathrm{hi}_i)` (a causal mask over sorted keys)."""
        hi = _int_vector(f"{name}.hi", hi)
        return cls(np.zeros_like(hi), hi, n_keys, name)

    @classmethod
    def full(cls, m: int, n_keys: int) -> KeyRanges:
        """Every one of ``m`` queries sees all ``n_keys`` keys."""
        return cls.prefix(np.full(int(m), int(n_keys), dtype=np.int64), n_keys)

    @classmethod
    def segments(cls, sizes: Sequence[int], *, name: str = "segments") -> KeyRanges:
        r"""Block-diagonal ranges: the tokens form consecutive segments of ``sizes``
        (queries = keys), each seeing exactly its own segment."""
        sz = _int_vector(name, list(sizes) if not isinstance(sizes, np.ndarray) else sizes)
        if sz.size == 0 or (sz < 1).any():
            raise ArgumentError(f"{name} must be a non-empty list of sizes >= 1, got "
                                f"{sz.tolist()[:8]}")
        ends = np.cumsum(sz)
        starts = ends - sz
        return cls(np.repeat(starts, sz), np.repeat(ends, sz), int(ends[-1]), name)

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return int(self.lo.shape[0])

    @property
    def counts(self) -> np.ndarray:
        """Number of visible keys per query, ``hi - lo``."""
        return self.hi - self.lo

    def take(self, index: Any) -> KeyRanges:
        """The ranges of the queries ``index`` (an integer array or a slice), same keys."""
        return KeyRanges(self.lo[index], self.hi[index], self.n_keys, self.name)

    def span(self, start: int = 0, stop: int | None = None) -> tuple[int, int]:
        """``(min lo, max hi)`` over the queries ``start:stop``: the keys a block of those
        queries must visit (``(0, 0)`` for no query)."""
        lo, hi = self.lo[start:stop], self.hi[start:stop]
        if lo.size == 0:
            return 0, 0
        return int(lo.min()), int(hi.max())

    def mask(self) -> np.ndarray:
        """The dense (M, N) boolean visibility matrix (reference implementations, tests)."""
        j = np.arange(self.n_keys)
        return (j[None, :] >= self.lo[:, None]) & (j[None, :] < self.hi[:, None])

    def __repr__(self) -> str:
        kind = "prefix" if self.is_prefix else "ranges"
        return f"KeyRanges({kind}, queries={len(self)}, n_keys={self.n_keys})"


def check_ranges(ranges: Any, m: int, n: int) -> KeyRanges | None:
    """``ranges`` (``None`` or :class:`KeyRanges`) checked against ``m`` queries and ``n``
    keys: the one check every backend primitive makes.

    Raises
    ------
    ArgumentTypeError
        Anything but ``None`` or a :class:`KeyRanges` (wrap prefix lengths with
        :meth:`KeyRanges.prefix`).
    ArgumentError
        ``m`` ranges not given for ``m`` queries, or ranges over another number of keys.
    """
    if ranges is None:
        return None
    if not isinstance(ranges, KeyRanges):
        raise ArgumentTypeError(
            f"ranges must be None or a transformer_pde.backends.ranges.KeyRanges, got "
            f"{type(ranges).__name__} (prefix lengths L: KeyRanges.prefix(L, n_keys))")
    if len(ranges) != m:
        raise ArgumentError(f"{ranges.name} must give one range per query: {len(ranges)} "
                            f"ranges for {m} queries")
    if ranges.n_keys != n:
        raise ArgumentError(f"{ranges.name} index {ranges.n_keys} keys, but {n} keys were given")
    return ranges
