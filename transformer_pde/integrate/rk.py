r"""One explicit Runge–Kutta stepper, driven by a :class:`~.tableaux.ButcherTableau`.

The state ``y`` is any backend array (NumPy, CuPy: the arithmetic is written with
operators only, the namespace is :func:`~transformer_pde.backends.array_namespace` of the
array), ``f(t, y)`` the field.

:func:`rk_step` takes a step of a fixed-step method; :func:`rk_attempt` a trial step of
an embedded pair, returning the new state, the scaled error norm (accept when
:math:`\le 1`) and the field at the new point (first-same-as-last).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import array_namespace
from .tableaux import ButcherTableau

__all__ = ["error_norm", "rk_attempt", "rk_step"]

Field = Callable[[float, Any], Any]


@functools.lru_cache(maxsize=None)
def _plan(tab: ButcherTableau) -> tuple:
    """The non-zero coefficients of ``tab`` as Python floats (read once per tableau)."""
    rows = tuple(tuple((j, float(tab.A[i, j])) for j in range(i) if tab.A[i, j] != 0.0)
                 for i in range(tab.n_stages))
    c = tuple(float(x) for x in tab.c)
    if tab.b_den:
        b = tuple((j, float(x)) for j, x in enumerate(tab.b_num) if x != 0.0)
    else:
        b = tuple((j, float(x)) for j, x in enumerate(tab.b) if x != 0.0)
    e = None if tab.e is None else tuple((j, float(x)) for j, x in enumerate(tab.e) if x != 0.0)
    ea = None if tab.e_aux is None else \
        tuple((j, float(x)) for j, x in enumerate(tab.e_aux) if x != 0.0)
    return rows, c, b, e, ea


def _stages(tab: ButcherTableau, f: Field, t: float, y: Any, h: float, k0: Any) -> list:
    """The stage derivatives :math:`k_1..k_s` (``k0``: :math:`k_1` when already known)."""
    rows, c, _, _, _ = _plan(tab)
    ks = [f(t, y) if k0 is None else k0]
    for i in range(1, tab.n_stages):
        yi = y
        for j, a in rows[i]:
            yi = yi + (h * a) * ks[j]
        ks.append(f(t + c[i] * h, yi))
    return ks


def _combine(tab: ButcherTableau, y: Any, h: float, ks: list) -> Any:
    b = _plan(tab)[2]
    if tab.b_den:
        acc = None
        for j, bj in b:
            term = ks[j] if bj == 1.0 else bj * ks[j]
            acc = term if acc is None else acc + term
        return y + (h / tab.b_den) * acc
    out = y
    for j, bj in b:
        out = out + (h * bj) * ks[j]
    return out


def rk_step(tab: ButcherTableau, f: Field, t: float, y: Any, h: float) -> Any:
    r""":math:`y_{n+1} = y_n + h\sum_i b_i k_i` (one step of the tableau's method).

    With ``tab.b_den = D`` the update is formed as :math:`y_n + (h/D)\sum_i (D b_i) k_i`."""
    return _combine(tab, y, h, _stages(tab, f, t, y, h, None))


def error_norm(tab: ButcherTableau, ks: list, h: float, y: Any, y_new: Any,
               rtol: float, atol: float) -> float:
    r"""Scaled norm of the local error estimate of an embedded pair.

    With :math:`s_j = \mathrm{atol} + \mathrm{rtol}\max(|y_j|, |y^{new}_j|)` and
    :math:`E = h\sum_i e_i k_i`: the RMS norm of :math:`E/s`; with a second estimate
    ``e_aux`` (DOP853) :math:`\|E_5/s\|^2 / \sqrt{n(\|E_5/s\|^2 + 0.01\|E_3/s\|^2)}`."""
    xp = array_namespace(y)
    scale = atol + rtol * xp.maximum(xp.abs(y), xp.abs(y_new))
    _, _, _, e, ea = _plan(tab)
    if ea is None:
        err_vec = 0.0
        for j, ej in e:
            err_vec = err_vec + (h * ej) * ks[j]
        return float(xp.sqrt(xp.mean((err_vec / scale) ** 2)))
    e5 = 0.0
    e3 = 0.0
    for j, ej in e:
        e5 = e5 + ej * ks[j]
    for j, ej in ea:
        e3 = e3 + ej * ks[j]
    n5 = float(xp.sum((e5 / scale) ** 2))
    n3 = float(xp.sum((e3 / scale) ** 2))
    if n5 == 0.0 and n3 == 0.0:
        return 0.0
    return abs(h) * n5 / float(np.sqrt((n5 + 0.01 * n3) * scale.size))


def rk_attempt(tab: ButcherTableau, f: Field, t: float, y: Any, h: float, fy: Any,
               rtol: float, atol: float) -> tuple[Any, float, Any]:
    """Trial step of an embedded FSAL pair from ``(t, y)`` with ``fy = f(t, y)``.

    Returns ``(y_new, err, f_new)``: ``err`` from :func:`error_norm`, ``f_new`` the field
    at ``(t + h, y_new)`` (the next step's first stage)."""
    if not tab.adaptive:
        raise ValueError(f"{tab.name} has no error estimate (not an embedded pair)")
    ks = _stages(tab, f, t, y, h, fy)
    y_new = _combine(tab, y, h, ks)
    f_new = f(t + h, y_new)
    ks.append(f_new)
    return y_new, error_norm(tab, ks, h, y, y_new, rtol, atol), f_new
