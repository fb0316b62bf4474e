r"""Rotary positions: :class:`Rotary`, a rotation of queries and keys by token position.

With rotary positions the score of a query token :math:`x` at position :math:`p_x` and a
key token :math:`y` at position :math:`p_y` is

.. math:: s(x, y) = \beta\,\big\langle R(p_x)(Q_h x + b_Q),\; R(p_y)(K_h y + b_K)\big\rangle,

where :math:`R(p)` is block diagonal: on each of :math:`r/2` coordinate pairs of a head of
width :math:`m` (:math:`r \le m` even, the remaining :math:`m - r` coordinates untouched)
it rotates the plane by the angle :math:`\theta_k(p) = \sigma\,p\,\omega_k`, with
:math:`\sigma` = ``span``, :math:`\omega_k = b^{-2k/r}` (:math:`b` = ``base``),
:math:`k = 0, \dots, r/2 - 1`.  Token positions :math:`p \in [0, 1]` are the library's
``positions``; :math:`i = \sigma p` is the token index of a language model.  Since
:math:`R(p)^\top R(p') = R(p' - p)`, the score depends on the two positions only through
:math:`p_y - p_x` (see ``docs/concepts/positions-and-heads.md``).

The rotation is applied after the affine projections, in the glue of
:mod:`transformer_pde.fields`, so every backend sees rotated queries and keys.
:class:`RotaryTable` holds the cosines and sines of one set of positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import positive
from ..validation import type_name as _what

__all__ = ["PAIRINGS", "Rotary", "RotaryTable", "require_positions"]

#: coordinate pairings of :class:`Rotary`
PAIRINGS = ("interleaved", "half")


@dataclass(frozen=True)
class Rotary:
    r"""Rotary position encoding of queries and keys (rotary positional embedding, RoPE).

    Parameters
    ----------
    base : float, default 10000.0
        :math:`b` of the frequencies :math:`\omega_k = b^{-2k/r}` (> 0).
    span : float, default 1.0
        :math:`\sigma`: a token at position :math:`p \in [0, 1]` has index
        :math:`\sigma p` and pair :math:`k` is rotated by :math:`\sigma p\,\omega_k` (> 0).
        A language model with positions :math:`p_i = i / n_{ctx}` uses
        ``span`` :math:`= n_{ctx}` (a power of two keeps :math:`\sigma p_i = i` exact).
    dim : int or None, default None
        Rotated width :math:`r` of each head (even, at most the head width :math:`m`);
        ``None`` rotates the whole head (:math:`r = m`).
    pairing : {"interleaved", "half"}, default "interleaved"
        Which coordinates form pair :math:`k`: :math:`(2k, 2k + 1)` (``"interleaved"``,
        the row layout of GGUF / llama.cpp files) or :math:`(k, k + r/2)` (``"half"``,
        the layout of Hugging Face checkpoints).  A pair :math:`(u, v)` becomes
        :math:`(u\cos\theta - v\sin\theta,\; u\sin\theta + v\cos\theta)`.

    Raises
    ------
    ArgumentTypeError
        ``dim`` not an integer, ``pairing`` not a string, a number of the wrong type.
    ArgumentError
        Non-positive or non-finite ``base`` / ``span``, ``dim`` not a positive even
        integer, an unknown ``pairing``.

    Examples
    --------
    >>> import numpy as np
    >>> rot = Rotary(base=100.0, span=8.0)
    >>> rot.frequencies(4).tolist()
    [1.0, 0.1]
    >>> x = np.array([[1.0, 0.0, 1.0, 0.0]])
    >>> np.round(rot.rotate(x, [0.25]), 6).tolist()  # index 2: angles 2 and 0.2
    [[-0.416147, 0.909297, 0.980067, 0.198669]]
    """

    base: float = 10000.0
    span: float = 1.0
    dim: int | None = None
    pairing: str = "interleaved"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "base", positive("Rotary: base", self.base))
        set_(self, "span", positive("Rotary: span", self.span))
        if self.dim is not None:
            if isinstance(self.dim, (bool, np.bool_)) or \
                    not isinstance(self.dim, (int, np.integer)):
                raise ArgumentTypeError(f"Rotary: dim must be a positive even integer or "
                                        f"None, got {_what(self.dim)}")
            if self.dim < 2 or self.dim % 2:
                raise ArgumentError(f"Rotary: dim must be a positive even integer (the "
                                    f"rotated width of each head), got {self.dim}")
            set_(self, "dim", int(self.dim))
        if not isinstance(self.pairing, str):
            raise ArgumentTypeError(f"Rotary: pairing must be one of {list(PAIRINGS)}, got "
                                    f"{_what(self.pairing)}")
        if self.pairing not in PAIRINGS:
            raise ArgumentError(f"Rotary: pairing must be one of {list(PAIRINGS)}, got "
                                f"{self.pairing!r:.60}")

    def width(self, m: int) -> int:
        """The rotated width :math:`r` of a head of width ``m`` (``dim``, or ``m``).

        Raises
        ------
        ArgumentError
            ``dim`` larger than ``m``, or an odd ``m`` without ``dim``."""
        if self.dim is None:
            if m % 2:
                raise ArgumentError(f"Rotary: the head width (rows of each head's Q and K) is "
                                    f"{m}, odd: rotary pairs need an even width; pass "
                                    f"Rotary(dim=...) with an even dim < {m}")
            return m
        if self.dim > m:
            raise ArgumentError(f"Rotary: dim={self.dim} exceeds the head width {m} (rows of "
                                "each head's Q and K)")
        return self.dim

    def frequencies(self, r: int) -> np.ndarray:
        r""":math:`\omega_k = b^{-2k/r}`, :math:`k = 0, \dots, r/2 - 1` (float64)."""
        return self.base ** (-np.arange(0, r, 2, dtype=float) / r)

    def angles(self, positions: Any, r: int) -> np.ndarray:
        r"""The angles :math:`\theta_k(p_i) = (\sigma p_i)\,\omega_k`, shape (N, r/2)."""
        p = np.asarray(positions, dtype=float).reshape(-1)
        return (self.span * p)[:, None] * self.frequencies(r)[None, :]

    def table(self, positions: Any, m: int, xp: Any = np, dtype: Any = np.float64
              ) -> "RotaryTable":
        """The :class:`RotaryTable` of ``positions`` for heads of width ``m``, as arrays
        of module ``xp`` (NumPy or CuPy) and ``dtype``."""
        r = self.width(m)
        theta = self.angles(positions, r)
        return RotaryTable(xp.asarray(np.cos(theta), dtype=dtype),
                           xp.asarray(np.sin(theta), dtype=dtype), r, self.pairing)

    def rotate(self, x: Any, positions: Any) -> np.ndarray:
        """Rotate the rows of ``x`` (N, m) by the positions (N,) (NumPy, float64)."""
        x = np.asarray(x, dtype=float)
        return self.table(positions, x.shape[-1]).apply(x)


def require_positions(rotary: Rotary | None, positions: Any) -> None:
    """Raise :class:`~transformer_pde.errors.ArgumentError` naming ``positions`` when an
    attention with rotary positions (``rotary`` not None) is evaluated without them."""
    if rotary is not None and positions is None:
        raise ArgumentError("rotary attention (Attention(rotary=...)) needs positions: an "
                            "array of the token positions in [0, 1]")


@dataclass(frozen=True)
class RotaryTable:
    """Cosines and sines of the rotary angles of a fixed set of token positions.

    Attributes
    ----------
    cos, sin : array, shape (N, r/2)
        Of the angles :math:`\\theta_k(p_i)` (see :class:`Rotary`).
    r : int
        Rotated width.
    pairing : {"interleaved", "half"}
    """

    cos: Any
    sin: Any
    r: int
    pairing: str

    def apply(self, x: Any) -> Any:
        """``x`` (..., N, m) with row :math:`i` rotated by :math:`R(p_i)` (a new array)."""
        r = self.r
        if self.pairing == "interleaved":
            a, b = slice(0, r, 2), slice(1, r, 2)
        else:
            a, b = slice(0, r // 2), slice(r // 2, r)
        u, v = x[..., a], x[..., b]
        out = x.copy()
        out[..., a] = u * self.cos - v * self.sin
        out[..., b] = u * self.sin + v * self.cos
        return out
