r"""Exact reductions of attention dynamics on the sphere.

Symmetric configurations and linearisations turn the particle flow of tokens on
:math:`S^{d-1}` into small, exactly solvable systems:

* :mod:`~transformer_pde.reductions.equiangular_flow` — :math:`n` equiangular tokens: one ODE
  for the common inner product :math:`\rho` (and a radius :math:`r`), for the post-LN
  flow and five other normalisation schemes (:func:`equiangular`).
* :mod:`~transformer_pde.reductions.hitting` — the hitting time of the post-LN equiangular
  flow in closed form, with the exponential integral (:func:`equiangular_time`).
* :mod:`~transformer_pde.reductions.gram` — the :math:`n\times n` Gram-matrix flow,
  independent of the dimension (:func:`gram_flow`, :func:`gram_from_tokens`,
  :func:`random_gram`).
* :mod:`~transformer_pde.reductions.modes` — growth rates of spherical-harmonic
  perturbations of the uniform measure (:func:`mode_growth_rate`,
  :func:`most_unstable_degree`).
* :mod:`~transformer_pde.reductions.noisy` — noisy unnormalised attention: the critical
  noise of the uniform state, the transition temperature :math:`\beta_*` and the type of
  the transition (:func:`critical_noise`, :func:`transition_beta`,
  :func:`noisy_mode_growth_rate`, :func:`amplitude_coefficient`).
* :mod:`~transformer_pde.reductions.limits` — one softmax layer over a long equiangular
  context (:func:`long_context_cosine`, :func:`long_context_limit`).
* :mod:`~transformer_pde.reductions.pairs` — the causal pair and the pairing angle
  (:func:`causal_pair`, :func:`pairing_angle`).
* :mod:`~transformer_pde.reductions.common_noise` — two tokens driven by a common matrix
  noise: the diffusion of their cosine and the probability that they end antipodal
  (:func:`antipodal_probability`, :func:`critical_beta`).
* :mod:`~transformer_pde.reductions.lost_in_middle` — the kinetic retrieval profile of
  causal ALiBi attention on the circle and its critical time (:func:`retrieval_profile`,
  :func:`critical_time`), and its estimate from particle runs.
* :mod:`~transformer_pde.reductions.args` — the argument checks they share.

The derivations are on the documentation page *Exact reductions on the sphere*.
"""

from .common_noise import (antipodal_probability, common_noise_matrices, critical_beta,
                           pair_coefficients, scale_exponents)
from .equiangular_flow import SCHEMES, EquiangularSolution, equiangular, equiangular_rates
from .gram import GramFlow, gram_field, gram_flow, gram_from_tokens, random_gram
from .hitting import equiangular_time
from .limits import long_context_cosine, long_context_limit
from .modes import mode_growth_rate, most_unstable_degree
from .noisy import (amplitude_coefficient, critical_noise, noisy_mode_growth_rate,
                    transition_beta, transition_kind)
from .pairs import CausalPair, causal_pair, pairing_angle

__all__ = ["CausalPair", "EquiangularSolution", "GramFlow", "SCHEMES", "causal_pair",
           "equiangular", "equiangular_rates", "equiangular_time", "gram_field", "gram_flow",
           "gram_from_tokens", "long_context_cosine", "long_context_limit",
           "mode_growth_rate", "most_unstable_degree", "pairing_angle", "random_gram"]
__all__ += ["amplitude_coefficient", "critical_noise", "noisy_mode_growth_rate",
            "transition_beta", "transition_kind"]
__all__ += ["antipodal_probability", "common_noise_matrices", "critical_beta",
            "pair_coefficients", "scale_exponents"]
