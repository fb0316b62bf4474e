r"""Time integration: Butcher tableaux, Runge–Kutta steppers, step-size control, time loop.

* :mod:`~transformer_pde.integrate.tableaux` — explicit Runge–Kutta methods as data
  (:class:`ButcherTableau`: Euler, Heun, RK4, Dopri5, DOP853).
* :mod:`~transformer_pde.integrate.breakpoints` — jump times of piecewise-constant
  parameters (layer boundaries), which steps must not cross.
"""

from __future__ import annotations

from .breakpoints import is_jump, jump_times, layer_tables, next_jump
from .tableaux import CLASSICAL_RK4, DOP853, DOPRI5, EULER, HEUN, TABLEAUX, ButcherTableau

__all__ = ["CLASSICAL_RK4", "DOP853", "DOPRI5", "EULER", "HEUN", "TABLEAUX", "ButcherTableau",
           "is_jump", "jump_times", "layer_tables", "next_jump"]
