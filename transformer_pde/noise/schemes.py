r"""Fixed-step schemes for the noisy particle flow: Euler–Maruyama, Stratonovich Heun,
Milstein.

Each scheme advances :math:`dX = F(t, X)\,dt + G(X)\circ dZ` (or its Itô reading) by one
step of size :math:`h` with the Brownian increments of the step, through a
:class:`~transformer_pde.noise.term.NoiseTerm` ``g`` that supplies
:math:`G(x)\Delta Z` (``g.displacement``), the convention correction :math:`\pm T(x)`
(``g.correction``) and the Milstein term :math:`\tfrac12 M^2 x` (``g.milstein``):

* :class:`EulerMaruyama` (an Itô scheme):
  :math:`X' = X + h\,(F + T_{\rm ito}) + G(X)\Delta Z`; strong order 1/2, 1 for additive
  noise; weak order 1.
* :class:`HeunStratonovich` (predictor–corrector, a Stratonovich scheme):
  :math:`\bar X = X + h\tilde F(X) + G(X)\Delta Z`,
  :math:`X' = X + \tfrac h2(\tilde F(X) + \tilde F(\bar X)) + \tfrac12(G(X) + G(\bar X))\Delta Z`
  with :math:`\tilde F = F - T_{\rm strat}`; strong order 1 for commuting noise (additive
  alone, or commuting matrices alone), 1/2 otherwise; weak order 1.
* :class:`Milstein` (Stratonovich form, for commuting noise: additive noise alone, or
  common noise alone with commuting :math:`A_k`):
  :math:`X' = X + h\tilde F + G(X)\Delta Z + \tfrac12 M^2 X`,
  :math:`M = \sum_k A_k\Delta B_k`; strong order 1.  Refused for non-commuting noise
  (non-commuting matrices, or individual and common noise together: their Lie bracket
  :math:`\sigma A_k e_j` does not vanish) and on the sphere (the projected noise does not
  commute).

Plain names select a scheme (:data:`SDE_SOLVERS`, :func:`get_sde_solver`).  A scheme is
not a :class:`~transformer_pde.integrate.solvers.Solver` by itself: a run wraps it with
its noise and Brownian path in a :class:`~transformer_pde.noise.stepper.SDEStepper`,
which is one.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["SDE_SOLVERS", "EulerMaruyama", "HeunStratonovich", "Milstein", "SDEScheme",
           "get_sde_solver", "is_sde_solver"]


class SDEScheme:
    """What the schemes share: a name, ``stochastic = True``, fixed steps, no history."""

    name = ""
    stochastic = True
    adaptive = False
    multistep = False
    #: ``"ito"`` or ``"stratonovich"``: which SDE the plain scheme approximates
    form = "ito"
    #: the scheme needs commuting noise (:meth:`~transformer_pde.noise.Noise.commutative`)
    needs_commuting = False
    #: the scheme is defined on the sphere (tangent increments and the retraction)
    on_sphere = True

    def strong_order(self, additive: bool, commuting: bool) -> float:
        """The strong order for additive noise (``additive``) or commuting noise fields
        (``commuting``)."""
        raise NotImplementedError

    def step(self, f: Callable, g: Any, t: float, y: Any, h: float, inc: Any) -> Any:
        """One step of size ``h`` from ``(t, y)`` with the increments ``inc``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _add(a: Any, b: Any) -> Any:
    return a if b is None else a + b


class EulerMaruyama(SDEScheme):
    r"""Euler–Maruyama: :math:`X' = X + h(F + T) + G(X)\Delta Z` (an Itô scheme; with
    no noise exactly the explicit Euler step)."""

    name = "euler_maruyama"
    form = "ito"

    def strong_order(self, additive: bool, commuting: bool) -> float:
        return 1.0 if additive else 0.5

    def step(self, f, g, t, y, h, inc):
        drift = _add(f(t, y), g.correction(y, self.form))
        return _add(y + h * drift, g.displacement(y, inc))


class HeunStratonovich(SDEScheme):
    r"""Stratonovich Heun (predictor–corrector, see the module docstring; with no noise
    exactly Heun's method)."""

    name = "heun_stratonovich"
    form = "stratonovich"

    def strong_order(self, additive: bool, commuting: bool) -> float:
        return 1.0 if (additive or commuting) else 0.5

    def step(self, f, g, t, y, h, inc):
        k1 = _add(f(t, y), g.correction(y, self.form))
        g1 = g.displacement(y, inc)
        y_bar = _add(y + h * k1, g1)
        k2 = _add(f(t + h, y_bar), g.correction(y_bar, self.form))
        out = y + (h / 2) * (k1 + k2)
        if g1 is None:
            return out
        return out + 0.5 * (g1 + g.displacement(y_bar, inc))


class Milstein(SDEScheme):
    r"""Milstein in Stratonovich form for commuting noise:
    :math:`X' = X + h\tilde F + G(X)\Delta Z + \tfrac12 M^2 X`."""

    name = "milstein"
    form = "stratonovich"
    needs_commuting = True
    on_sphere = False

    def strong_order(self, additive: bool, commuting: bool) -> float:
        return 1.0

    def step(self, f, g, t, y, h, inc):
        drift = _add(f(t, y), g.correction(y, self.form))
        out = _add(y + h * drift, g.displacement(y, inc))
        return _add(out, g.milstein(y, inc))


#: schemes selected by name
SDE_SOLVERS: dict[str, Callable[[], SDEScheme]] = {
    "euler_maruyama": EulerMaruyama,
    "heun_stratonovich": HeunStratonovich,
    "milstein": Milstein,
}


def is_sde_solver(solver: Any) -> bool:
    """Whether ``solver`` names or is a stochastic scheme (``stochastic = True``)."""
    if isinstance(solver, str):
        return solver in SDE_SOLVERS
    return bool(getattr(solver, "stochastic", False)) and not isinstance(solver, type)


def get_sde_solver(solver: Any, name: str = "solver") -> SDEScheme:
    """A scheme from its name (:data:`SDE_SOLVERS`) or a copy of a scheme object.

    Raises
    ------
    ArgumentError
        A name that is not a stochastic scheme (a deterministic solver with noise).
    ArgumentTypeError
        An object that is not an :class:`SDEScheme`."""
    if isinstance(solver, str):
        if solver not in SDE_SOLVERS:
            raise ArgumentError(f"{name}={solver!r} is not a stochastic solver: with noise, "
                                f"{name} must be one of {sorted(SDE_SOLVERS)} or a scheme "
                                "object (EulerMaruyama(), ...)")
        return SDE_SOLVERS[solver]()
    if isinstance(solver, type) or not isinstance(solver, SDEScheme):
        what = solver.__qualname__ if isinstance(solver, type) else type(solver).__name__
        raise ArgumentTypeError(
            f"{name}: with noise the solver must be one of {sorted(SDE_SOLVERS)} or an "
            f"instance of a stochastic scheme (EulerMaruyama(), HeunStratonovich(), "
            f"Milstein()), got {what}")
    return copy.deepcopy(solver)
