r"""Time integrators for the particle flow :math:`\dot X = F(t, X)`.

A solver is a small object with ``name``, ``order`` and either

* ``step(f, t, y, h) -> y_next`` (fixed-step one-step or multistep methods; multistep
  solvers keep their own history, set ``multistep = True`` and are ``reset()`` at the
  start of a run), or
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

__all__ = ["Euler", "Heun", "RK4", "AdamsBashforth", "ImplicitMidpoint", "Dopri5",
           "adams_bashforth_weights", "array_namespace",
           "PIController", "SOLVERS", "SolverNotConverged", "get_solver"]

Field = Callable[[float, Any], Any]


class _OneStep:
    """Shared part of the fixed-step one-step solvers: no history to reset."""

    adaptive = False

    def reset(self) -> None:
        pass


class Euler(_OneStep):
    r"""Explicit Euler, order 1: :math:`y_{n+1} = y_n + h F(t_n, y_n)`.

    With ``h = 1`` one step is exactly one residual attention layer
    :math:`x \leftarrow x + \mathrm{Attn}(x)`."""

    name = "euler"
    order = 1
    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        return y + h * f(t, y)


class RK4(_OneStep):
    """Classical fourth-order Runge–Kutta."""

    name = "rk4"
    order = 4
    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        k1 = f(t, y)
        k2 = f(t + 0.5 * h, y + (0.5 * h) * k1)
        k3 = f(t + 0.5 * h, y + (0.5 * h) * k2)
        k4 = f(t + h, y + h * k3)
        return y + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


class Heun(_OneStep):
    r"""Heun's method (explicit trapezoidal rule, RK2), order 2.

    .. math:: k_1 = F(t_n, y_n),\quad k_2 = F(t_n + h, y_n + h k_1),\quad
              y_{n+1} = y_n + \tfrac{h}{2}(k_1 + k_2).
    """

    name = "heun"
    order = 2
    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        k1 = f(t, y)
        k2 = f(t + h, y + h * k1)
        return y + (0.5 * h) * (k1 + k2)


def adams_bashforth_weights(steps: Any) -> np.ndarray:
    r"""Variable-step Adams–Bashforth weights.

    For the past step sizes ``steps = (h_n, h_{n-1}, ..., h_{n-k+1})`` (newest first, with
    :math:`h_n` the step about to be taken) the :math:`k`-step method is

    .. math:: y_{n+1} = y_n + h_n \sum_{i=0}^{k-1} b_i F(t_{n-i}, y_{n-i}),

    where :math:`b_i = \frac{1}{h_n}\int_{t_n}^{t_n+h_n} \ell_i(\tau)\,d\tau` and
    :math:`\ell_i` is the Lagrange basis polynomial of the nodes :math:`t_n, t_{n-1}, \dots`.
    Equivalently :math:`\sum_i b_i \tau_i^m = h_n^m/(m+1)` for :math:`m < k` with
    :math:`\tau_i = t_{n-i} - t_n`, solved here in units of :math:`h_n`.  For equal steps
    this gives the classical weights, e.g. ``(3/2, -1/2)`` and ``(23/12, -16/12, 5/12)``.
    """
    h = np.asarray(steps, dtype=float)
    k = h.size
    if k < 1 or np.any(h <= 0):
        raise ValueError(f"steps must be a non-empty sequence of positive numbers, got {steps!r}")
    # node offsets tau_i / h_n: 0, -h_{n-1}/h_n, -(h_{n-1}+h_{n-2})/h_n, ...
    tau = -np.concatenate([[0.0], np.cumsum(h[1:])]) / h[0]
    Vm = np.vander(tau, k, increasing=True).T          # row m: tau_i^m
    rhs = 1.0 / np.arange(1, k + 1)
    return np.linalg.solve(Vm, rhs)


class AdamsBashforth:
    r"""Explicit :math:`k`-step Adams–Bashforth method (order :math:`k`), variable step.

    Keeps the last :math:`k` field values; weights come from
    :func:`adams_bashforth_weights`, so the final partial step of a run (or any change
    of ``h``) keeps the order.  The first :math:`k-1` steps (and any step that does not
    continue the previous one, e.g. after :meth:`reset` or a jump in ``t``) are taken
    with :class:`RK4`, whose local error :math:`O(h^5)` does not spoil the order.

    Multistep history belongs to one trajectory: the method cannot be used inside
    operator splitting, where another flow moves the state between its steps.
    """

    adaptive = False
    multistep = True

    def __init__(self, k: int):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= 5:
            raise ValueError(f"k must be an integer in [1, 5], got {k!r}")
        self.k = int(k)
        self.order = self.k
        self.name = f"ab{self.k}"
        self._start = RK4()
        self.reset()

    def reset(self) -> None:
        self._fs: list[Any] = []     # newest first
        self._hs: list[float] = []   # sizes of the steps that led to each stored node
        self._t_next: float | None = None

    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        if self._t_next is None or abs(t - self._t_next) > 1e-12 * max(1.0, abs(t)):
            self.reset()
        fy = f(t, y)
        self._fs.insert(0, fy)
        del self._fs[self.k:]
        if len(self._fs) < self.k:
            y_new = self._start.step(f, t, y, h)
        else:
            b = adams_bashforth_weights([h] + self._hs[:self.k - 1])
            incr = b[0] * self._fs[0]
            for bi, fi in zip(b[1:], self._fs[1:]):
                incr = incr + bi * fi
            y_new = y + h * incr
        self._hs.insert(0, float(h))
        del self._hs[self.k:]
        self._t_next = t + h
        return y_new


class SolverNotConverged(RuntimeError):
    """An implicit solver's inner iteration missed its tolerance."""


class ImplicitMidpoint:
    r"""Implicit midpoint rule, order 2, solved by fixed-point iteration.

    .. math:: y_{n+1} = y_n + h\,F\big(t_n + \tfrac h2, \tfrac12(y_n + y_{n+1})\big).

    The iteration :math:`z \leftarrow y_n + h F(t_n + h/2, (y_n + z)/2)` starts from the
    explicit Euler predictor and stops when
    :math:`\|z_{new} - z\|_\infty \le \mathrm{tol}\,(1 + \|z_{new}\|_\infty)`.  It contracts
    when :math:`h L / 2 < 1` (:math:`L` the Lipschitz constant of :math:`F`).  The rule
    preserves every quadratic first integral exactly (up to ``tol``), e.g. :math:`|x|^2`
    for a field tangent to the spheres.

    Parameters
    ----------
    tol : float, default 1e-13
        Relative stopping tolerance of the fixed-point iteration.
    max_iter : int, default 100
        Raise :class:`SolverNotConverged` when exceeded.
    """

    name = "implicit_midpoint"
    order = 2
    adaptive = False

    def __init__(self, tol: float = 1e-13, max_iter: int = 100):
        if not (np.isfinite(tol) and tol > 0):
            raise ValueError(f"tol must be finite and > 0, got {tol!r}")
        if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) \
                or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        self.tol = float(tol)
        self.max_iter = int(max_iter)
        self.iterations: list[int] = []

    def reset(self) -> None:
        self.iterations = []

    def step(self, f: Field, t: float, y: Any, h: float) -> Any:
        xp = array_namespace(y)
        tm = t + 0.5 * h
        z = y + h * f(t, y)
        err = np.inf
        for it in range(1, self.max_iter + 1):
            z_new = y + h * f(tm, 0.5 * (y + z))
            err = float(xp.max(xp.abs(z_new - z)))
            scale = 1.0 + float(xp.max(xp.abs(z_new)))
            z = z_new
            if not (np.isfinite(err) and np.isfinite(scale)):
                break
            if err <= self.tol * scale:
                self.iterations.append(it)
                return z
        raise SolverNotConverged(
            f"implicit midpoint fixed-point iteration did not converge at t={t:.6g} with "
            f"h={h:.3g}: last update {err:.3g} after {it} iterations (tol={self.tol:g}); "
            "reduce dt (the iteration contracts when h * Lipschitz / 2 < 1)")


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
        xp = array_namespace(y)
        scale = self.atol + self.rtol * xp.maximum(xp.abs(y), xp.abs(y_new))
        err = float(xp.sqrt(xp.mean((err_vec / scale) ** 2)))
        return y_new, err, ks[6]


def array_namespace(a: Any) -> Any:
    """The array module of ``a``: ``cupy`` for CuPy arrays, else ``numpy``."""
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
    "heun": lambda **kw: Heun(),
    "rk2": lambda **kw: Heun(),
    "ab2": lambda **kw: AdamsBashforth(2),
    "ab3": lambda **kw: AdamsBashforth(3),
    "implicit_midpoint": lambda **kw: ImplicitMidpoint(),
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
