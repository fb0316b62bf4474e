r"""Per-layer tables: :class:`Layers`, a piecewise-constant matrix (or vector) of depth :math:`t`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..validation import positive, real_array, scalar

__all__ = ["Layers"]

ArrayLike = Any


class Layers:
    r"""Piecewise-constant table of per-layer matrices, usable as ``Q``, ``K``, ``V`` or ``W_O``.

    ``Layers(values, layer_time=h, t0=t0)`` is the function of time
    :math:`t \mapsto \text{values}[\ell]` for :math:`t \in [t_0 + \ell h, t_0 + (\ell+1) h)`,
    clamped to the first / last layer outside :math:`[t_0, t_0 + L h)`.  With the default
    ``layer_time = 1`` and Euler steps of size 1, step ``l`` uses layer ``l``: a stack of
    ``L`` distinct residual attention layers.

    Parameters
    ----------
    values : array_like, shape (L, r, c)
        One matrix per layer.
    layer_time : float, default 1.0
        Duration of each layer (> 0).
    t0 : float, default 0.0
        Start time of layer 0.

    Examples
    --------
    >>> import numpy as np
    >>> Qs = Layers(np.stack([np.eye(2), 2 * np.eye(2)]))
    >>> [float(Qs(t)[0, 0]) for t in (0.5, 1.0, 7.0)]  # layer 1 from t = 1; clamped after t = 2
    [1.0, 2.0, 2.0]
    >>> Qs.index(1.0), Qs.index(1.0, left=True)  # right-continuous; the left limit is layer 0
    (1, 0)
    """

    # tolerance so that t = l * layer_time computed in floating point maps to layer l
    _TOL = 1e-9

    def __init__(self, values: ArrayLike, *, layer_time: float = 1.0, t0: float = 0.0):
        arr = np.array(real_array("Layers: values", values), dtype=float)
        if arr.ndim != 3 or arr.shape[0] < 1:
            raise ArgumentError(
                f"Layers: values must have shape (L, rows, cols) with L >= 1, got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ArgumentError("Layers: values contain NaN or inf")
        layer_time = positive("Layers: layer_time", layer_time)
        t0 = scalar("Layers: t0", t0)
        arr.setflags(write=False)
        self.values = arr
        self.layer_time = layer_time
        self.t0 = t0

    @property
    def n_layers(self) -> int:
        """Number of layers ``L``."""
        return self.values.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of one layer's matrix."""
        return self.values.shape[1:]  # type: ignore[return-value]

    def index(self, t: float, *, left: bool = False) -> int:
        """Layer index in use at time ``t``.

        The table is right-continuous: at a boundary ``t = t0 + l h`` layer ``l`` is used.
        ``left=True`` gives the left limit instead (layer ``l - 1`` at that boundary); the
        integrators use it for stages evaluated at the right end of a step, so that a step
        over ``[l h, (l+1) h]`` only ever sees layer ``l``.
        """
        u = (float(t) - self.t0) / self.layer_time
        if left:
            i = math.ceil(u - self._TOL) - 1
        else:
            i = math.floor(u + self._TOL)
        return min(max(i, 0), self.n_layers - 1)

    def __call__(self, t: float, *, left: bool = False) -> np.ndarray:
        return self.values[self.index(t, left=left)]

    def __repr__(self) -> str:
        return (f"Layers(L={self.n_layers}, shape={self.shape}, "
                f"layer_time={self.layer_time}, t0={self.t0})")

