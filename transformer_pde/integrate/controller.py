r"""Step-size control of embedded pairs: PI control and the initial step.

The local error of an embedded pair whose estimator has order :math:`\hat p` behaves like
:math:`C h^{\hat p + 1}`, so with :math:`k = \hat p + 1` the proportional–integral rule
(Gustafsson; Hairer & Wanner, *Solving ODEs II*, §IV.2)

.. math:: h_{new} = h \cdot \mathrm{clip}\big(s\, e_n^{-\alpha}\, e_{n-1}^{\beta},\,
          f_{min},\, f_{max}\big), \qquad \alpha = 0.7/k,\ \beta = 0.4/k,

uses the current and the previous scaled error norms :math:`e_n, e_{n-1}`
(:math:`e` floored at :math:`10^{-10}`; a non-finite error gives :math:`f_{min}`).  After
a rejected step the integral part is dropped and the step only shrinks.  The rule is
written once, for one error norm, in :func:`pi_factor` (plain scalar arithmetic, so that
compiled kernels such as the numba kernel of :func:`transformer_pde.gaussian.solve_batch`
compile this very function); :class:`PIController` applies it to one system, and
:meth:`PIController.factors` to many independent systems at once (one row each, NumPy
arrays: the NumPy path of ``solve_batch``).  Steps are
clipped to the next stop (save time, final time) and to the next jump of a
piecewise-constant parameter (:mod:`~.breakpoints`) by :func:`clip_step`.

**One protocol for both kinds of steps** (anchor: diffrax's ``ConstantStepSize`` next to
its ``PIDController``).  The time loop (:class:`~.loop.TimeLoop`) asks a controller for
the next :class:`Step` towards a *target* (the next time the steps must land on) with
``propose``, runs the solver, then reports the outcome with ``accept`` or ``reject``.
:class:`ConstantStepSize` cuts a segment of length :math:`L` into
:math:`n = \max(1, \lceil L/\Delta t - 10^{-9}\rceil)` steps (:func:`n_fixed_steps`) of
size :math:`\min(\Delta t, \text{target} - t)`, the last landing exactly on the target,
and never retries a step; :class:`PIController` sizes trial steps by the PI rule and
retries rejected ones.  In this protocol neither keeps run state of its own: what they
carry from step to step lives in the loop state (``steps_left``; ``h`` and ``err_prev``),
so a checkpoint holds it (:attr:`PIController.prev` is only the history of
:meth:`PIController.factor`, used outside the loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from ..errors import ArgumentError
from .breakpoints import next_jump

__all__ = ["ConstantStepSize", "PIController", "Step", "clip_step", "initial_step",
           "n_fixed_steps", "pi_factor"]

#: Floor of the scaled error norm in the PI rule (a zero error gives the largest step ratio).
ERR_FLOOR = 1e-10
#: a remainder of a segment below this fraction of ``dt`` is not a step of its own
STEP_TOL = 1e-9
#: an adaptive step whose error passed but whose state is not finite is retried this much shorter
NONFINITE_SHRINK = 0.2


def n_fixed_steps(length: float, dt: float) -> int:
    r"""Number of fixed steps covering a segment: :math:`\max(1, \lceil L/\Delta t - 10^{-9}\rceil)`.

    The count is decided relative to the step, so ``n_fixed_steps(1e-11, 1e-13) == 100``
    and ``n_fixed_steps(0.07, 0.01) == 7`` although ``0.07 / 0.01`` is ``7.000000000000001``
    in floating point."""
    return max(1, math.ceil(length / dt - STEP_TOL))


class Step(NamedTuple):
    """A step proposed by a controller from the loop state's time ``t``.

    Attributes
    ----------
    h : float
        Step size handed to the solver.
    t_end : float
        Time reached if the step is taken: the target itself when the step lands on it
        (never a rounded ``t + h``).
    lands : bool
        The step reaches the target.
    final : bool
        Taking the step ends the run whatever the solver returns (a constant step landing
        on ``t_max``); the step budget is not enforced on it.  An adaptive trial step is
        never final: its error is judged only after the budget check.
    """

    h: float
    t_end: float
    lands: bool
    final: bool


class ConstantStepSize:
    r"""Fixed steps of size ``dt`` (anchor: diffrax ``ConstantStepSize``).

    A segment from :math:`t` to a target takes :func:`n_fixed_steps` steps of size
    :math:`\min(\Delta t, \text{target} - t)`, the last one landing exactly on the target
    (so the last step of a run is shortened when :math:`t_{max}` is not a multiple of
    :math:`\Delta t`).  Steps are never retried: a rejected step ends the run.  The steps
    left in the segment are the loop state's ``steps_left`` (``None`` before the segment
    is started).

    Parameters
    ----------
    dt : float
        Step size (> 0).
    """

    adaptive = False

    def __init__(self, dt: float):
        self.dt = float(dt)

    def propose(self, st: Any, target: float, final: bool, tables: Iterable[Any] = ()) -> Step:
        """The next step from ``st.t`` towards ``target`` (``final``: the run's last target);
        starts the segment's count when ``st.steps_left`` is ``None``."""
        if st.steps_left is None:
            st.steps_left = n_fixed_steps(target - st.t, self.dt)
        last = st.steps_left == 1
        h = min(self.dt, target - st.t)
        return Step(h, target if last else st.t + h, last, last and final)

    def accept(self, st: Any, step: Step, err: float) -> None:
        """Count the step taken (the count restarts with the next segment)."""
        st.steps_left = None if step.lands else st.steps_left - 1

    def reject(self, st: Any, step: Step, err: float) -> float | None:
        """``None``: a constant step size cannot retry a step."""
        return None

    def __repr__(self) -> str:
        return f"ConstantStepSize(dt={self.dt!r})"


def pi_factor(err: float, prev: float, accepted: bool, alpha: float, beta: float,
              safety: float, fmin: float, fmax: float) -> tuple[float, float]:
    r"""The PI rule for one system: ``(h_new / h, e_{n-1} after this step)``.

    ``err`` is the scaled error norm of the step just tried, ``prev`` the norm of the last
    accepted step (:math:`e_{n-1}`, 1 initially), ``accepted`` whether this step is taken.
    Accepted: :math:`\mathrm{clip}(s\,e^{-\alpha} e_{n-1}^{\beta}, f_{min}, f_{max})` and
    the history becomes :math:`e`; rejected: :math:`\mathrm{clip}(s\,e^{-\alpha}, f_{min},
    1)`, history kept; non-finite ``err``: :math:`f_{min}`, history kept.  Plain scalar
    arithmetic (numba compiles it unchanged)."""
    if not math.isfinite(err):
        return fmin, prev
    e = max(err, ERR_FLOOR)
    if accepted:
        fac = safety * e ** (-alpha) * prev ** beta
        return min(fmax, max(fmin, fac)), e
    fac = safety * e ** (-alpha) * 1.0
    return min(1.0, max(fmin, fac)), prev


class PIController:
    r"""Proportional–integral step-size controller (see the module docstring).

    Parameters
    ----------
    error_order : int
        Order :math:`\hat p` of the error estimator (``ButcherTableau.error_order``).
    safety, fmin, fmax : float
        Safety factor :math:`s` and the bounds of the step-size ratio.
    """

    adaptive = True

    def __init__(self, error_order: int, safety: float = 0.9, fmin: float = 0.2,
                 fmax: float = 5.0):
        k = int(error_order) + 1
        self.alpha = 0.7 / k
        self.beta = 0.4 / k
        self.safety, self.fmin, self.fmax = safety, fmin, fmax
        self.prev = 1.0

    # .................................................................. loop protocol
    def propose(self, st: Any, target: float, final: bool, tables: Iterable[Any] = ()) -> Step:
        """The trial step from ``st.t``: ``st.h`` clipped to ``target`` and to the next jump
        of ``tables`` (:func:`clip_step`).  It lands on the target when it reaches it or
        stops within :math:`10^{-12}|\text{target}|` of it."""
        t = st.t
        h_try = clip_step(t, st.h, target, tables)
        lands = h_try >= target - t or target - (t + h_try) <= 1e-12 * abs(target)
        return Step(h_try, target if lands else t + h_try, lands, False)

    def accept(self, st: Any, step: Step, err: float) -> None:
        """Size the next trial step after an accepted one (history ``st.err_prev``); a step
        shortened by the target or a jump does not shrink the controller's step ``st.h``."""
        fac, st.err_prev = pi_factor(float(err), st.err_prev, True, self.alpha, self.beta,
                                     self.safety, self.fmin, self.fmax)
        h_next = step.h * float(fac)
        st.h = max(h_next, st.h) if step.h < st.h else h_next

    def reject(self, st: Any, step: Step, err: float) -> float | None:
        """The next trial step after a rejected one: the PI rule's shrink for an error above
        1 (or non-finite), :data:`NONFINITE_SHRINK` times the step when the error passed but
        the state came out non-finite.  The history ``st.err_prev`` is kept."""
        if err <= 1.0:
            return step.h * NONFINITE_SHRINK
        fac, st.err_prev = pi_factor(float(err), st.err_prev, False, self.alpha, self.beta,
                                     self.safety, self.fmin, self.fmax)
        return step.h * float(fac)

    def factor(self, err: float, accepted: bool) -> float:
        """Ratio :math:`h_{new}/h` after a step with scaled error ``err`` (:func:`pi_factor`;
        updates the history :attr:`prev` on accepted steps)."""
        fac, self.prev = pi_factor(float(err), self.prev, bool(accepted), self.alpha,
                                   self.beta, self.safety, self.fmin, self.fmax)
        return float(fac)

    def factors(self, err: Any, prev: Any, accepted: Any) -> tuple[np.ndarray, np.ndarray]:
        r"""The same rule for many independent systems at once (one per row).

        Parameters
        ----------
        err : array_like (B,)
            Scaled error norm of each system's trial step.
        prev : array_like (B,)
            Each system's history :math:`e_{n-1}` (start from ones); not modified.
        accepted : array_like of bool (B,)
            Whether each system takes its step.

        Returns
        -------
        factor, prev_new : ndarray (B,)
            Row ``i`` equals ``pi_factor(err[i], prev[i], accepted[i], ...)`` (elementwise
            NumPy arithmetic: the same operations as the scalar rule) and the updated
            history.  This object's own :attr:`prev` is neither read nor changed.
        """
        err = np.asarray(err, dtype=float)
        prev = np.asarray(prev, dtype=float)
        acc = np.asarray(accepted, dtype=bool)
        fin = np.isfinite(err)
        e = np.where(fin, np.maximum(err, ERR_FLOOR), 1.0)
        with np.errstate(over="ignore"):
            fac = self.safety * e ** (-self.alpha) * np.where(acc, prev ** self.beta, 1.0)
        fac = np.where(acc, np.minimum(self.fmax, np.maximum(self.fmin, fac)),
                       np.minimum(1.0, np.maximum(self.fmin, fac)))
        return np.where(fin, fac, self.fmin), np.where(fin & acc, e, prev)


def clip_step(t: float, h: float, t_stop: float, tables: Iterable[Any] = ()) -> float:
    """The trial step from ``t``: ``h`` clipped to land on ``t_stop`` and on the next
    jump of ``tables`` (an embedded pair cannot step over a discontinuity of the field
    at its tolerance)."""
    return min(h, t_stop - t, next_jump(tables, t) - t)


def initial_step(y: np.ndarray, f0: np.ndarray, rtol: float, atol: Any,
                 h_max: float = 0.1, f: Callable[[np.ndarray], np.ndarray] | None = None,
                 error_order: int | None = None) -> np.ndarray:
    r"""First trial step of each row (Hairer–Wanner's heuristic).

    With :math:`s = \mathrm{atol} + \mathrm{rtol}|y|`, :math:`d_0 = \mathrm{rms}(y/s)`,
    :math:`d_1 = \mathrm{rms}(f_0/s)`: :math:`h_0 = 0.01\,d_0/d_1`, or :math:`10^{-6}` when
    either is below :math:`10^{-5}`.  Given the field ``f`` (rows in, rows out) and the
    pair's ``error_order`` :math:`\hat p`, the second part of the heuristic follows
    (Hairer, Nørsett & Wanner, *Solving ODEs I*, §II.4): one explicit Euler step of
    :math:`h_0` estimates the second derivative, :math:`d_2 = \mathrm{rms}((f(y + h_0 f_0) -
    f_0)/s)/h_0`, and :math:`h = \min(100 h_0, (0.01/\max(d_1, d_2))^{1/(\hat p + 1)})`
    (:math:`\max(10^{-6}, 10^{-3} h_0)` when both are below :math:`10^{-15}`), a step whose
    local error is about 1 % of the tolerance instead of one sized on the first derivative
    alone.  At most ``h_max``.  ``y`` and ``f0`` are ``(B, n)`` (one row per system) or
    ``(n,)``."""
    y = np.asarray(y, dtype=float)
    f0 = np.asarray(f0, dtype=float)
    scale = atol + rtol * np.abs(y)
    d0 = np.sqrt(np.mean((y / scale) ** 2, axis=-1))
    d1 = np.sqrt(np.mean((f0 / scale) ** 2, axis=-1))
    h = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.maximum(d1, 1e-300))
    if f is not None:
        if error_order is None:
            raise ArgumentError("initial_step: f needs error_order (the pair's error order)")
        h0 = np.asarray(h)
        f1 = np.asarray(f(y + h0[..., None] * f0 if y.ndim > 1 else y + h0 * f0), dtype=float)
        with np.errstate(over="ignore", invalid="ignore"):
            d2 = np.sqrt(np.mean(((f1 - f0) / scale) ** 2, axis=-1)) / h0
            dm = np.maximum(d1, d2)
            h1 = np.where(dm <= 1e-15, np.maximum(1e-6, 1e-3 * h0),
                          (0.01 / np.where(dm > 0, dm, 1.0)) ** (1.0 / (error_order + 1)))
        # a non-finite second evaluation keeps the first part's step
        h = np.where(np.isfinite(h1), np.minimum(100.0 * h0, h1), h0)
    return np.minimum(h, h_max)
