r"""The mean-field PDE of attention dynamics, solved as a PDE.

* :mod:`~transformer_pde.meanfield.circle` — tokens on the circle :math:`S^1`: the
  continuity equation of the density of angles, pseudo-spectral in :math:`\theta` with
  automatic resolution control (:func:`solve_circle`, :class:`CircleSolution`).
* :mod:`~transformer_pde.meanfield.spectral` — its Fourier machinery (the diagonal
  convolution :math:`2\pi I_m(\beta)`, the right-hand side, the linear growth rates
  :func:`circle_growth_rate`).
* :mod:`~transformer_pde.meanfield.stationary` — noisy unnormalised attention on
  :math:`S^{d-1}`: the branch of stationary states bifurcating from the uniform state,
  their stability and free energy (:func:`stationary_branch`, :class:`StationaryBranch`).
* :mod:`~transformer_pde.meanfield.line` — tokens on the line (:func:`solve_line`,
  :class:`LineSolution`).
* :mod:`~transformer_pde.meanfield.distance` — exact Wasserstein distances on the line and
  the circle, and between particle runs and PDE solutions (:func:`distance_to_pde`).
* :mod:`~transformer_pde.meanfield.study` — particles against the PDE: :math:`W_1` versus
  :math:`N` (:func:`convergence_study`).
"""

from .circle import CircleSolution, solve_circle
from .spectral import circle_growth_rate
from .line import LineSolution, solve_line
from .stationary import StationaryBranch, stationary_branch
from .distance import circle_quantile, distance_to_pde, w1_circle, w1_line, w2_line
from .study import CircleParticleCell, ConvergenceStudy, convergence_study, fit_rate

__all__ = ["CircleParticleCell", "CircleSolution", "ConvergenceStudy", "LineSolution",
           "circle_growth_rate", "circle_quantile", "convergence_study", "distance_to_pde",
           "fit_rate", "solve_circle", "solve_line", "w1_circle", "w1_line", "w2_line"]
__all__ += ["StationaryBranch", "stationary_branch"]
