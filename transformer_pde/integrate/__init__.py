r"""Time integration: Butcher tableaux, Runge–Kutta steppers, step-size control, time loop.

* :mod:`~transformer_pde.integrate.tableaux` — explicit Runge–Kutta methods as data
  (:class:`ButcherTableau`: Euler, Heun, RK4, Dopri5, DOP853).
* :mod:`~transformer_pde.integrate.rk` — one explicit Runge–Kutta stepper over backend
  arrays, driven by a tableau (fixed steps and embedded trial steps).
* :mod:`~transformer_pde.integrate.solvers` — the :class:`Solver` and
  :class:`AdaptiveSolver` protocols and the solver objects carrying their options
  (``Dopri5(rtol=..., atol=...)``), Adams–Bashforth, implicit midpoint.
* :mod:`~transformer_pde.integrate.controller` — step-size controllers with one protocol
  (:class:`ConstantStepSize` for fixed steps, :class:`PIController` for embedded pairs),
  the fixed-step count :func:`n_fixed_steps`, initial step, clipping to stops and jumps.
* :mod:`~transformer_pde.integrate.plan` — the steps and saves a run takes
  (:func:`planned_steps`, :func:`planned_saves`) and the checks before it starts
  (:func:`preflight`).
* :mod:`~transformer_pde.integrate.breakpoints` — jump times of piecewise-constant
  parameters (layer boundaries), which steps must not cross.
* :mod:`~transformer_pde.integrate.loop` — the time loop with its options
  (:class:`SaveAt`, :class:`Limits`, :class:`Monitor`) and the rule of which exceptions a
  run owns (:func:`owned`; the others pass through it).
* :mod:`~transformer_pde.integrate.state` — where a run stands (:class:`LoopState`) and
  the checks a state restored from a checkpoint must pass (:func:`check_resumed`).
* :mod:`~transformer_pde.integrate.checkpoint` — versioned, checksummed checkpoint files
  and the identity of a run they are compared by.
"""

from .breakpoints import is_jump, jump_times, layer_tables, next_jump
from .controller import (ConstantStepSize, PIController, Step, clip_step, initial_step,
                         n_fixed_steps)
from .loop import Limits, Monitor, SaveAt, TimeLoop, owned
from .plan import (check_step_budget, physical_memory, planned_saves, planned_steps,
                   preflight, segment_stops)
from .rk import error_norm, rk_attempt, rk_step
from .solvers import (SOLVERS, AdamsBashforth, AdaptiveSolver, Dop853, Dopri5,
                      EmbeddedRungeKutta, Euler, ExplicitRungeKutta, Heun, ImplicitMidpoint, RK4,
                      Solver, adams_bashforth_weights, check_solver, get_solver)
from .state import LoopState, check_resumed
from .tableaux import CLASSICAL_RK4, DOP853, DOPRI5, EULER, HEUN, TABLEAUX, ButcherTableau

__all__ = ["CLASSICAL_RK4", "DOP853", "DOPRI5", "EULER", "HEUN", "RK4", "SOLVERS", "TABLEAUX",
           "AdamsBashforth", "AdaptiveSolver", "ButcherTableau", "ConstantStepSize", "Dop853", "Dopri5",
           "EmbeddedRungeKutta", "Euler", "ExplicitRungeKutta", "Heun", "ImplicitMidpoint",
           "Limits", "LoopState", "Monitor", "PIController", "SaveAt", "Solver", "Step", "TimeLoop",
           "adams_bashforth_weights", "check_resumed", "check_solver", "check_step_budget",
           "clip_step", "error_norm", "get_solver", "initial_step", "is_jump", "jump_times",
           "layer_tables", "n_fixed_steps", "next_jump", "owned", "physical_memory",
           "planned_saves", "planned_steps", "preflight", "rk_attempt", "rk_step",
           "segment_stops"]
