r"""Stochastic particle dynamics: individual and common Brownian noise in the engine.

With ``simulate(..., noise=Noise(...), solver="euler_maruyama")`` the tokens follow

.. math:: dX_i = \Gamma_{\mu_t}(X_i)\,dt + \sigma\,dW_i + \sum_k (A_k X_i)\circ dB_k

(projected on the tangent space on the sphere), integrated by the one time loop of
:mod:`transformer_pde.integrate` with fixed steps.

* :mod:`~transformer_pde.noise.spec` — :class:`Noise` (sigma, common matrices,
  convention, seed, path, base step), checked at construction.
* :mod:`~transformer_pde.noise.brownian` — :class:`BrownianPath`: counter-based (Philox),
  one stream per system, refinable by Brownian bridges, generated on the host.
* :mod:`~transformer_pde.noise.philox` — the compiled generator of the streams
  (Philox-4x64-10, Box–Muller), imported on the first draw.
* :mod:`~transformer_pde.noise.term` — :class:`NoiseTerm`: the diffusion on the backend
  (displacement, convention correction on :math:`\mathbb R^d` and the sphere, Milstein
  term).
* :mod:`~transformer_pde.noise.schemes` — :class:`EulerMaruyama`,
  :class:`HeunStratonovich`, :class:`Milstein` (:data:`SDE_SOLVERS`).
* :mod:`~transformer_pde.noise.stepper` — :class:`SDEStepper`: a scheme bound to a run's
  noise and path, a fixed-step solver of the time loop.
"""

from .brownian import BrownianPath, check_grid, refinement_level
from .schemes import (SDE_SOLVERS, EulerMaruyama, HeunStratonovich, Milstein, SDEScheme,
                      get_sde_solver, is_sde_solver)
from .spec import CONVENTIONS, Noise
from .stepper import SDEStepper, sde_stepper
from .term import Increment, NoiseTerm

__all__ = ["CONVENTIONS", "SDE_SOLVERS", "BrownianPath", "EulerMaruyama", "HeunStratonovich",
           "Increment", "Milstein", "Noise", "NoiseTerm", "SDEScheme", "SDEStepper",
           "check_grid", "get_sde_solver", "is_sde_solver", "refinement_level", "sde_stepper"]
