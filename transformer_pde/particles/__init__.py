r"""Interacting-particle engine: evolve empirical token measures under an attention flow.

For tokens :math:`X_i(t)` with weights :math:`w_i`, :func:`simulate` integrates

.. math:: \dot X_i = \Gamma_{\mu_t}(X_i), \qquad \mu_t = \sum_j w_j \delta_{X_j(t)},

where :math:`\Gamma` is the attention velocity field (:func:`velocity`; conventions in
``docs/conventions.md``).  Depth is time: one explicit Euler step of size 1 is one
residual attention layer.  The options of a run are grouped by concern: the solver
object (:mod:`transformer_pde.integrate`), what to save (:class:`SaveAt`), the block
composition (:class:`~transformer_pde.blocks.Block`), the field evaluation
(:class:`FieldOptions`), when to stop (:class:`Limits`) and reporting / checkpoints
(:class:`Monitor`).  The result is a :class:`ParticleTrajectory` that can be saved to
and loaded from NPZ, netCDF or Zarr (:mod:`transformer_pde.io.trajectory`).

=====================  ==================================================================
module                 holds
=====================  ==================================================================
:mod:`.options`        :class:`FieldOptions`
:mod:`.trajectory`     :class:`ParticleTrajectory`, :func:`weighted_moments`, :func:`load`
:mod:`.simulation`     :func:`simulate`, assembled from its parts (arguments, solver,
                       field evaluator, saver, loop, checkpoint, result)
:mod:`.identity`       :func:`~.identity.run_identity`: what a checkpoint compares to
                       resume a particle run
:mod:`.ensemble`       :func:`simulate_ensemble`: B independent systems of n tokens, one
                       :func:`simulate` over B segments (:class:`EnsembleTrajectory`)
=====================  ==================================================================
"""

from ..fields import velocity
from ..integrate.loop import Limits, Monitor, SaveAt
from ..io.trajectory import NPZ_FORMAT_VERSION
from .options import FieldOptions
from .ensemble import EnsembleTrajectory, ensemble_moments, simulate_ensemble
from .simulation import simulate
from .trajectory import ParticleTrajectory, load, weighted_moments

__all__ = ["EnsembleTrajectory", "FieldOptions", "Limits", "Monitor", "NPZ_FORMAT_VERSION",
           "ParticleTrajectory", "SaveAt", "ensemble_moments", "load", "simulate",
           "simulate_ensemble", "velocity", "weighted_moments"]
