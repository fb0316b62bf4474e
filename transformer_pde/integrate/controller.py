r"""Step-size control of embedded pairs: PI control and the initial step.

The local error of an embedded pair whose estimator has order :math:`\hat p` behaves like
:math:`C h^{\hat p + 1}`, so with :math:`k = \hat p + 1` the proportional–integral rule
(Gustafsson; Hairer & Wanner, *Solving ODEs II*, §IV.2)

.. math:: h_{new} = h \cdot \mathrm{clip}\big(s\, e_n^{-\alpha}\, e_{n-1}^{\beta},\,
          f_{min},\, f_{max}\big), \qquad \alpha = 0.7/k,\ \beta = 0.4/k,

uses the current and the previous scaled error norms :math:`e_n, e_{n-1}`.  After a
rejected step the integral part is dropped and the step only shrinks.  Steps are
clipped to the next stop (save time, final time) and to the next jump of a
piecewise-constant parameter (:mod:`~.breakpoints`) by :func:`clip_step`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .breakpoints import next_jump

__all__ = ["PIController", "clip_step", "initial_step"]


class PIController:
    r"""Proportional–integral step-size controller (see the module docstring).

    Parameters
    ----------
    error_order : int
        Order :math:`\hat p` of the error estimator (``ButcherTableau.error_order``).
    safety, fmin, fmax : float
        Safety factor :math:`s` and the bounds of the step-size ratio.
    """

    def __init__(self, error_order: int, safety: float = 0.9, fmin: float = 0.2,
                 fmax: float = 5.0):
        k = int(error_order) + 1
        self.alpha = 0.7 / k
        self.beta = 0.4 / k
        self.safety, self.fmin, self.fmax = safety, fmin, fmax
        self.prev = 1.0

    def factor(self, err: float, accepted: bool) -> float:
        """Ratio :math:`h_{new}/h` after a step with scaled error ``err``."""
        if not np.isfinite(err):
            return self.fmin
        err = max(err, 1e-10)
        fac = self.safety * err ** (-self.alpha) * (self.prev ** self.beta if accepted else 1.0)
        if accepted:
            self.prev = err
            return float(min(self.fmax, max(self.fmin, fac)))
        return float(min(1.0, max(self.fmin, fac)))


def clip_step(t: float, h: float, t_stop: float, tables: Iterable[Any] = ()) -> float:
    """The trial step from ``t``: ``h`` clipped to land on ``t_stop`` and on the next
    jump of ``tables`` (an embedded pair cannot step over a discontinuity of the field
    at its tolerance)."""
    return min(h, t_stop - t, next_jump(tables, t) - t)


def initial_step(y: np.ndarray, f0: np.ndarray, rtol: float, atol: Any,
                 h_max: float = 0.1) -> np.ndarray:
    r"""First trial step of each row (Hairer–Wanner's heuristic, first part).

    With :math:`s = \mathrm{atol} + \mathrm{rtol}|y|`, :math:`d_0 = \mathrm{rms}(y/s)`,
    :math:`d_1 = \mathrm{rms}(f_0/s)`: :math:`h = 0.01\,d_0/d_1`, or :math:`10^{-6}` when
    either is below :math:`10^{-5}`; at most ``h_max``.  ``y`` and ``f0`` are
    ``(B, n)`` (one row per system) or ``(n,)``."""
    y = np.asarray(y, dtype=float)
    f0 = np.asarray(f0, dtype=float)
    scale = atol + rtol * np.abs(y)
    d0 = np.sqrt(np.mean((y / scale) ** 2, axis=-1))
    d1 = np.sqrt(np.mean((f0 / scale) ** 2, axis=-1))
    h = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.maximum(d1, 1e-300))
    return np.minimum(h, h_max)


