r"""Argument checks shared by the reductions of :mod:`transformer_pde.reductions`.

Each check returns the argument in the form the reductions compute with, or raises
:class:`~transformer_pde.errors.ArgumentError` /
:class:`~transformer_pde.errors.ArgumentTypeError` with a message naming the argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..validation import choice, integer, nonnegative, real_array, scalar

__all__ = ["MODELS", "OVERFLOW_EXPONENT", "check_beta", "check_model", "check_n", "check_rho",
           "check_shift", "check_times", "lower_rho"]

#: the attention models of the reductions: softmax (``"sa"``) and unnormalised (``"usa"``)
MODELS = ("sa", "usa")
#: largest exponent :math:`\beta - \mathrm{shift}` of the unnormalised kernel accepted where
#: the rate is proportional to :math:`e^{\beta - \mathrm{shift}}` (``exp(709.8)`` overflows)
OVERFLOW_EXPONENT = 700.0


def check_model(model: Any) -> str:
    """``"sa"`` or ``"usa"``."""
    return choice("model", model, MODELS)


def check_beta(beta: Any) -> float:
    """A finite inverse temperature :math:`\\beta \\ge 0`."""
    return nonnegative("beta", beta)


def check_n(n: Any) -> int:
    """A number of tokens :math:`n \\ge 2`."""
    return integer("n", n, minimum=2)


def check_shift(shift: Any, model: str) -> float:
    """A finite ``shift``; non-zero only for ``model="usa"`` (it cancels in softmax)."""
    s = scalar("shift", shift) + 0.0
    if s != 0.0 and model != "usa":
        raise ArgumentError(f"shift={s:g} applies only to model='usa': a constant shift of the "
                            "exponent cancels in softmax (use shift=0)")
    return s


def lower_rho(n: int) -> float:
    r"""Smallest pairwise inner product of :math:`n` equiangular unit vectors,
    :math:`-1/(n-1)` (the vertices of a regular simplex)."""
    return -1.0 / (n - 1)


def check_rho(name: str, rho: Any, n: int) -> float:
    r"""An inner product :math:`\rho \in [-1/(n-1), 1]` realisable by :math:`n` equiangular
    unit vectors (values below :math:`-1/(n-1)` by at most 8 rounding units are read as
    :math:`-1/(n-1)`)."""
    r = scalar(name, rho)
    lo = lower_rho(n)
    if r < lo * (1.0 + 8 * np.finfo(float).eps) or r > 1.0:
        raise ArgumentError(f"{name} must lie in [-1/(n-1), 1] = [{lo:.6g}, 1] (n={n} "
                            f"equiangular unit vectors), got {rho!r}")
    return max(r, lo)


def check_times(t: Any, name: str = "t") -> tuple[np.ndarray, bool]:
    """Times: a finite scalar or 1-D array, non-decreasing, ``>= 0``.  Returns the 1-D
    array and whether a scalar was given."""
    arr = real_array(name, t)
    scalar_in = arr.ndim == 0
    arr = np.atleast_1d(arr).astype(float)
    if arr.ndim != 1 or arr.size == 0:
        raise ArgumentError(f"{name} must be a time or a non-empty 1-D array of times, got "
                            f"shape {np.shape(t)}")
    if not np.all(np.isfinite(arr)):
        raise ArgumentError(f"{name} contains NaN or inf")
    if np.any(arr < 0):
        raise ArgumentError(f"{name} must be >= 0, got min {arr.min():g}")
    if np.any(np.diff(arr) < 0):
        raise ArgumentError(f"{name} must be non-decreasing")
    return arr, scalar_in
