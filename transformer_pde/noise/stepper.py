r"""A stochastic scheme bound to a run's noise and Brownian path: :class:`SDEStepper`.

The stepper is a fixed-step :class:`~transformer_pde.integrate.solvers.Solver`
(``step(f, t, y, h)``), so the one time loop of :mod:`transformer_pde.integrate` drives
noisy runs as it drives deterministic ones (and a
:class:`~transformer_pde.blocks.BlockStepper` wraps it for the sphere constraint: the
field and the noise are projected on the tangent space and every step is followed by the
retraction).  Each step reads its index :math:`k` from its time (:math:`t = k\Delta t`),
draws the increments of grid step :math:`k` from the :class:`~.brownian.BrownianPath`
and calls the scheme.  Nothing of the path is carried from step to step, so a resumed
run draws the same increments as an uninterrupted one; the checkpoint keeps what names
the path and the next step index.  :func:`sde_stepper` builds one from
:func:`~transformer_pde.simulate`'s arguments.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import ArgumentError
from .brownian import BrownianPath, check_grid, refinement_level
from .schemes import SDEScheme, get_sde_solver
from .spec import Noise
from .term import NoiseTerm

__all__ = ["SDEStepper", "sde_stepper"]


class SDEStepper:
    """A fixed-step solver of a noisy run (see the module docstring).

    Parameters
    ----------
    scheme : SDEScheme
    term : NoiseTerm
    path : BrownianPath
    """

    adaptive = False
    multistep = False
    stochastic = True

    def __init__(self, scheme: SDEScheme, term: NoiseTerm, path: BrownianPath):
        self.scheme, self.term, self.path = scheme, term, path
        self.name = scheme.name
        noise = term.noise
        # on the sphere the projected individual noise is multiplicative and its fields
        # P_x e_j do not commute; projected commuting matrices still commute
        additive = noise.common is None and not term.sphere
        commuting = noise.commutative() and not (term.sphere and noise.sigma > 0)
        self.order = scheme.strong_order(additive, commuting)
        self.on_sphere = term.sphere
        self._milstein = scheme.needs_commuting
        self._next = 0

    def reset(self) -> None:
        """No history to forget (the increments are read from the step's time)."""

    def step(self, f: Callable, t: float, y: Any, h: float) -> Any:
        """One step of size ``h`` (the grid step) from ``(t, y)``."""
        k = self.path.step_index(t, h)
        inc = self.term.increments(self.path.increment(k), milstein=self._milstein)
        self._next = k + 1
        return self.scheme.step(f, self.term, t, y, h, inc)

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary for a trajectory's ``info["noise"]``."""
        return {**self.term.noise.describe(), "solver": self.name,
                "strong_order": self.order, "base_dt": self.path.base_dt,
                "level": self.path.level, "sphere": self.on_sphere}

    #: version of the plain data of :meth:`get_state`
    STATE_VERSION = 1

    def get_state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the path's name (seed, path, first system, the
        systems' dimensions, base step, level) and the index of the next step."""
        return {"version": self.STATE_VERSION, "path": self.path.get_state(),
                "next_step": self._next}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` (``ValueError`` for another path or version)."""
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION \
                or set(state) != {"version", "path", "next_step"}:
            raise ValueError(f"SDE stepper state {state!r:.80} is not of version "
                             f"{self.STATE_VERSION}")
        self.path.check_state(state["path"])
        nxt = state["next_step"]
        if isinstance(nxt, bool) or not isinstance(nxt, (int, np.integer)) or nxt < 0:
            raise ValueError(f"SDE stepper state: next_step {nxt!r} is not a step index")
        self._next = int(nxt)

    def __repr__(self) -> str:
        return f"SDEStepper({self.scheme!r}, {self.term.noise!r})"


def sde_stepper(solver: Any, noise: Noise, *, sizes: Any, d: int, dt: float, t_max: float,
                ts: Any, dtype: Any, to_device: Callable[[np.ndarray], Any], xp: Any,
                sphere: bool) -> SDEStepper:
    """The stepper of a noisy :func:`~transformer_pde.simulate` run.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        ``solver`` not a stochastic scheme; ``noise.common`` of another dimension than
        ``d``; ``dt`` not ``noise.base_dt / 2**L``; ``t_max`` or a save time off the grid;
        Milstein with non-commuting matrices or on the sphere."""
    scheme = get_sde_solver(solver)
    noise.check_dimension(d)
    if scheme.needs_commuting and not noise.commutative():
        why = ("the matrices of noise.common do not commute" if not noise.commuting() else
               "individual noise (sigma > 0) and a common term do not commute")
        raise ArgumentError(
            f"solver={scheme.name!r} needs commuting noise (additive noise alone, or common "
            f"noise alone with A_k A_l = A_l A_k): {why}; use 'euler_maruyama' or "
            "'heun_stratonovich' (strong order 1/2)")
    if sphere and not scheme.on_sphere:
        raise ArgumentError(
            f"solver={scheme.name!r} is not defined on the sphere (the projected noise does "
            "not commute); use 'euler_maruyama' or 'heun_stratonovich'")
    base_dt = dt if noise.base_dt is None else noise.base_dt
    level = refinement_level(base_dt, dt)
    check_grid(t_max, dt, ts)
    term = NoiseTerm(noise, sizes, d, dtype, to_device, xp, sphere=sphere)
    path = BrownianPath(noise.seed, noise.path, term.dims, base_dt, level, noise.system)
    return SDEStepper(scheme, term, path)
