r"""The options of the one Sinkhorn loop, as small frozen records.

:func:`~transformer_pde.sinkhorn.sinkhorn_loop` takes the operators it iterates
(:class:`SoftMins`), when to stop (:class:`Stopping`), how to accelerate
(:class:`Acceleration`), where to start (:class:`Start`) and the
:math:`\varepsilon`-scaling ladder of a cold start (:class:`EpsilonScaling`).  Each record
checks its own fields when it is made (an :class:`~transformer_pde.errors.ArgumentError`
or :class:`~transformer_pde.errors.ArgumentTypeError` naming the field, as
``Stopping.tol``);
the loop checks only the combinations that involve two of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation
from ..errors import ArgumentError, ArgumentTypeError
from .anderson import Anderson

__all__ = ["Acceleration", "DEFAULT_MAX_ITER", "DEFAULT_TOL", "EpsilonScaling", "Readout",
           "SoftMin", "SoftMins", "Start", "Stopping", "Sweep"]

#: the default stopping rule of every Sinkhorn solve of the package: the log-domain
#: marginal error below which a solve has converged, and the most iterations it may take
DEFAULT_TOL = 1e-9
DEFAULT_MAX_ITER = 2000

#: ``softmin(h, eps) -> potential``: :math:`-\varepsilon\log\sum_j b_j e^{(h_j - C_{ij})/\varepsilon}`
#: for every row :math:`i` (any array namespace).
SoftMin = Callable[[Any, float], Any]
#: ``readout(g, eps) -> (f, by-product)``: the row soft-min and a by-product of its pass.
Readout = Callable[[Any, float], tuple[Any, Any]]
#: ``sweep(g, eps) -> (f, g', by-product)``: one whole alternating iteration in one pass.
Sweep = Callable[[Any, float], tuple[Any, Any, Any]]


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a bool, got {value!r:.60}")
    return bool(value)


@dataclass(frozen=True, eq=False)
class SoftMins:
    r"""The soft-min(s) the loop iterates, and the passes that stand in for them at the
    target :math:`\varepsilon`.

    Attributes
    ----------
    f : SoftMin
        ``f(g, eps)``: the row potentials from the column ones.  Alone (``g=None``): the
        map :math:`T` of the symmetric update :math:`f = T(f)`.
    g : SoftMin, optional
        ``g(f, eps)``: the column potentials from the row ones (alternating update).
    readout : Readout, optional
        ``readout(g, eps) -> (f, by-product)``: used instead of ``f`` at the target
        :math:`\varepsilon` on a pass that may be the last; the by-product of the last
        call is returned as :attr:`LoopResult.out
        <transformer_pde.sinkhorn.LoopResult.out>`.
    sweep : Sweep, optional
        ``sweep(g, eps) -> (f, g', by-product)``: one whole alternating iteration
        (:math:`f = \mathrm{softmin}_f(g)`, :math:`g' = \mathrm{softmin}_g(f)`) in one
        pass, used at the target :math:`\varepsilon` instead of ``readout``/``f`` and
        ``g``.  Its optional attribute ``lean`` is the same iteration without the
        by-product, run on passes that are not expected to be the last.  Needs ``g``.
    """

    f: SoftMin
    g: SoftMin | None = None
    readout: Readout | None = None
    sweep: Sweep | None = None

    def __post_init__(self) -> None:
        for name in ("f", "g", "readout", "sweep"):
            value = getattr(self, name)
            if (name == "f" or value is not None) and not callable(value):
                raise ArgumentTypeError(f"SoftMins.{name} must be callable, got "
                                        f"{type(value).__name__}")
        if self.sweep is not None and self.g is None:
            raise ArgumentError("SoftMins.sweep (a fused sweep) needs the alternating update "
                                "(SoftMins.g)")

    @property
    def symmetric(self) -> bool:
        """Whether the update is the symmetric one (no column soft-min)."""
        return self.g is None


@dataclass(frozen=True)
class Stopping:
    r"""When the loop stops and what it hands on.

    Attributes
    ----------
    tol : float
        Marginal log-error tolerance at the target :math:`\varepsilon` (> 0): stop when
        :math:`\|T(x) - x\|_\infty/\varepsilon <` ``tol``.
    max_iter : int
        Iteration budget (>= 1), all :math:`\varepsilon` stages together.
    expect : float, optional
        The marginal error the start is expected to have (>= 0, ``inf`` allowed), which
        decides whether the first pass reads the by-product out (see **Lean passes** in
        :mod:`transformer_pde.sinkhorn.loop`).  ``None`` (unknown): it does not.
    finish : {"input", "image"}
        Which point a stopped stage hands on (and the loop returns as ``g``): the last
        iterate :math:`x` (its error is the reported one) or its image :math:`T(x)`
        (half a Sinkhorn step further).
    next_step : bool
        On convergence, also compute the accelerated step after the last iterate
        (:attr:`LoopResult.g_next <transformer_pde.sinkhorn.LoopResult.g_next>`,
        for warm starts); the secant memory is not changed by it.
    """

    tol: float
    max_iter: int
    expect: float | None = None
    finish: str = "input"
    next_step: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "tol", validation.positive("Stopping.tol", self.tol))
        object.__setattr__(self, "max_iter",
                           validation.integer("Stopping.max_iter", self.max_iter, minimum=1))
        if self.expect is not None:
            expect = validation.scalar("Stopping.expect", self.expect, finite=False)
            if not expect >= 0.0:
                raise ArgumentError(f"Stopping.expect must be >= 0 (a marginal error), got "
                                    f"{self.expect!r}")
            object.__setattr__(self, "expect", expect)
        validation.choice("Stopping.finish", self.finish, ("input", "image"))
        object.__setattr__(self, "next_step", _flag("Stopping.next_step", self.next_step))


@dataclass(frozen=True, eq=False)
class Acceleration:
    r"""Anderson mixing of the fixed-point map and its safeguard.

    Attributes
    ----------
    anderson : int
        Anderson memory (>= 0; 0: the plain iteration, i.e. the symmetric averaging or
        plain alternating Sinkhorn).
    safeguard : {"residual", "dual"}
        ``"residual"``: restart from the best plain iterate when the error grows tenfold.
        ``"dual"`` (alternating update only): reject an extrapolation that decreases the
        dual objective; needs ``marginals``.
    marginals : (a, b), optional
        The marginal weights, for the ``"dual"`` safeguard.
    """

    anderson: int = 10
    safeguard: str = "residual"
    marginals: tuple[Any, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "anderson",
                           validation.integer("Acceleration.anderson", self.anderson, minimum=0))
        validation.choice("Acceleration.safeguard", self.safeguard, ("residual", "dual"))
        if self.marginals is not None and (not isinstance(self.marginals, tuple)
                                           or len(self.marginals) != 2):
            raise ArgumentTypeError("Acceleration.marginals must be a pair (a, b) of weight "
                                    f"arrays, got {type(self.marginals).__name__}")
        if self.safeguard == "dual" and self.marginals is None:
            raise ArgumentError("Acceleration.safeguard='dual' needs the marginals (a, b)")


@dataclass(frozen=True, eq=False)
class Start:
    r"""Where the loop starts.

    Attributes
    ----------
    g0 : array, optional
        The iterated potential (``g``; ``f`` on the symmetric update).
    f0 : array, optional
        Used when ``g0`` is absent: the symmetric update starts from it, the alternating
        one from :math:`g = \mathrm{softmin}_g(f_0)`.  Neither: zeros (a cold start).
    memory : Anderson, optional
        Secant memory of a previous solve of a nearby problem (its pairs model the new
        Jacobian well); used when its size ``m`` equals :attr:`Acceleration.anderson`.
    dtype : dtype, optional
        Of the cold start's zeros and of the warm start (default float64).
    """

    g0: Any = None
    f0: Any = None
    memory: Anderson | None = None
    dtype: Any = None

    def __post_init__(self) -> None:
        if self.memory is not None and not isinstance(self.memory, Anderson):
            raise ArgumentTypeError(f"Start.memory must be an Anderson memory, got "
                                    f"{type(self.memory).__name__}")

    @property
    def cold(self) -> bool:
        """Whether no starting potential is given."""
        return self.g0 is None and self.f0 is None


@dataclass(frozen=True)
class EpsilonScaling:
    r"""The :math:`\varepsilon`-scaling ladder of a cold start.

    Stages :math:`\varepsilon_k = \varepsilon_0\,\theta^k` for as long as
    :math:`\varepsilon_k > \varepsilon(1 + \text{margin})`, then the target
    :math:`\varepsilon`.

    Parameters
    ----------
    start : float
        :math:`\varepsilon_0 > 0`, where the problem is nearly solved by one iteration (a
        multiple of the cost range).  No ladder when it is not above the target.
    factor : float
        Ratio :math:`\theta \in (0, 1)` of consecutive stages.
    stage_tol : float or None
        Tolerance of the coarse stages (their own marginal error, > 0).  ``None``: no
        stopping test, ``stage_max_iter`` plain sweeps per stage (the symmetric
        averaging, or a plain alternating sweep).
    stage_max_iter : int
        Iteration budget of one coarse stage (>= 1; always bounded by what is left of
        the total budget).
    margin : float
        Relative margin (>= 0): a stage within ``eps * (1 + margin)`` of the target is
        skipped.
    warm : bool
        Also walk the ladder when the loop is warm-started (default: only cold starts).
    """

    start: float
    factor: float
    stage_tol: float | None
    stage_max_iter: int
    margin: float = 0.0
    warm: bool = False

    def __post_init__(self) -> None:
        validation.positive("EpsilonScaling.start", self.start)
        factor = validation.scalar("EpsilonScaling.factor", self.factor)
        if not 0.0 < factor < 1.0:
            raise ArgumentError(f"EpsilonScaling.factor must be in (0, 1), got {self.factor!r}")
        if self.stage_tol is not None:
            validation.positive("EpsilonScaling.stage_tol", self.stage_tol)
        object.__setattr__(self, "stage_max_iter", validation.integer(
            "EpsilonScaling.stage_max_iter", self.stage_max_iter, minimum=1))
        validation.nonnegative("EpsilonScaling.margin", self.margin)
        object.__setattr__(self, "warm", _flag("EpsilonScaling.warm", self.warm))

    def ladder(self, eps: float) -> list[float]:
        """The stages down to ``eps`` (the last entry is ``eps`` itself)."""
        stages = []
        e = float(self.start)
        stop = eps * (1.0 + self.margin)
        while e > stop:
            stages.append(e)
            e *= self.factor
        return stages + [eps]
