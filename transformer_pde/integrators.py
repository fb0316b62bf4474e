r"""Time integrators for the particle flow :math:`\dot X = F(t, X)`.

A solver is a small object with ``name``, ``order`` and either

* ``step(f, t, y, h) -> y_next`` (fixed-step one-step or multistep methods; multistep
  solvers keep their own history and are ``reset()`` at the start of a run), or
* ``attempt(f, t, y, h, fy) -> (y_next, err, f_next)`` for adaptive embedded pairs
  (``adaptive = True``), where ``err`` is the scaled error norm (accept if ``<= 1``) and
  ``f_next`` the field at the new point (first-same-as-last).

The step-size controller (:class:`PIController`) and the saving policy live in
:func:`transformer_pde.particles.simulate`, separate from the solvers (as in diffrax).
Register new solvers in :data:`SOLVERS`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["Euler", "RK4", "Dopri5", "PIController", "SOLVERS", "get_solver"]

Field = Callable[[float, Any], Any]


class Euler:
    r"""Explicit Euler, order 1: :math:`y_{n+1} = y_n + h F(t_n, y_n)`.

    With ``h = 1`` one step is exactly one residual attention layer
    :math:`x \leftarrow x + \mathrm{Attn}(x)`."""

    name = "euler"
    order = 1
    adaptive = False

    def reset(self) -> None:
        pass

    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        return y + h * f(t, y)


class RK4:
    """Classical fourth-order Runge–Kutta."""

    name = "rk4"
    order = 4
    adaptive = False

    def reset(self) -> None:
        pass

    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        k1 = f(t, y)
        k2 = f(t + 0.5 * h, y + (0.5 * h) * k1)
        k3 = f(t + 0.5 * h, y + (0.5 * h) * k2)
        k4 = f(t + h, y + h * k3)
        return y + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


class Dopri5:
    r"""Dormand–Prince 5(4) embedded pair with first-same-as-last.

    The error estimate is the difference between the 5th- and 4th-order solutions,
    scaled componentwise by :math:`\mathrm{atol} + \mathrm{rtol}\max(|y_n|, |y_{n+1}|)`
    and measured in the RMS norm.
    """

    name = "dopri5"
    order = 5
    adaptive = True

    C = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
    A = (
        (),
        (1 / 5,),
        (3 / 40, 9 / 40),
        (44 / 45, -56 / 15, 32 / 9),
        (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
        (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
        (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
    )
    # 5th-order weights are the last row of A; E = b5 - b4
    E = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)

    def __init__(self, rtol: float = 1e-6, atol: float = 1e-9):
        if not (rtol > 0 and atol >= 0):
            raise ValueError(f"rtol must be > 0 and atol >= 0, got rtol={rtol}, atol={atol}")
        self.rtol = float(rtol)
        self.atol = float(atol)

    def reset(self) -> None:
        pass

    def attempt(self, f: Field, t: float, y: Any, h: float, fy: Any):
        ks = [fy]
        for i in range(1, 7):
            yi = y
            for a, k in zip(self.A[i], ks):
                if a != 0.0:
                    yi = yi + (h * a) * k
            ks.append(f(t + self.C[i] * h, yi))
            if i == 6:
                y_new = yi
        err_vec = 0.0
        for e, k in zip(self.E, ks):
            if e != 0.0:
                err_vec = err_vec + (h * e) * k
        xp = _namespace(y)
        scale = self.atol + self.rtol * xp.maximum(xp.abs(y), xp.abs(y_new))
        err = float(xp.sqrt(xp.mean((err_vec / scale) ** 2)))
        return y_new, err, ks[6]


def _namespace(a: Any) -> Any:
    mod = type(a).__module__.split(".")[0]
    if mod == "cupy":
        import cupy  # noqa: PLC0415
        return cupy
    return np


class PIController:
    r"""Proportional–integral step-size controller for embedded pairs.

    :math:`h_{new} = h \cdot \mathrm{clip}(s\, e_n^{-\alpha} e_{n-1}^{\beta}, f_{min}, f_{max})`
    with :math:`\alpha = 0.7/p`, :math:`\beta = 0.4/p` (Hairer–Wanner), safety
    :math:`s = 0.9`.
    """

    def __init__(self, order: int, safety: float = 0.9, fmin: float = 0.2, fmax: float = 5.0):
        self.alpha = 0.7 / order
        self.beta = 0.4 / order
        self.safety, self.fmin, self.fmax = safety, fmin, fmax
        self.prev = 1.0

    def factor(self, err: float, accepted: bool) -> float:
        if not np.isfinite(err):
            return self.fmin
        err = max(err, 1e-10)
        fac = self.safety * err ** (-self.alpha) * (self.prev ** self.beta if accepted else 1.0)
        if accepted:
            self.prev = err
            return float(min(self.fmax, max(self.fmin, fac)))
        return float(min(1.0, max(self.fmin, fac)))


SOLVERS: dict[str, Callable[..., Any]] = {
    "euler": lambda **kw: Euler(),
    "rk4": lambda **kw: RK4(),
    "dopri5": lambda rtol=1e-6, atol=1e-9, **kw: Dopri5(rtol, atol),
}


def get_solver(method: Any, *, rtol: float = 1e-6, atol: float = 1e-9) -> Any:
    """Solver by name (see :data:`SOLVERS`) or pass-through of a solver object."""
    if not isinstance(method, str):
        return method
    if method not in SOLVERS:
        raise ValueError(f"method must be one of {sorted(SOLVERS)}, got {method!r}")
    return SOLVERS[method](rtol=rtol, atol=atol)
