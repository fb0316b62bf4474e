r"""Sinkhorn attention: the entropic optimal-transport self-coupling of a token measure.

For tokens :math:`\mu = \sum_j w_j \delta_{x_j}`, scores :math:`s(x, y) = \langle \beta Q x, K y\rangle`
and regularisation :math:`\varepsilon > 0`, Sinkhorn attention (Sander et al. 2022,
"Sinkformers") replaces the row-softmax by the density

.. math:: k(x, y) = \exp\big((f(x) + g(y) + s(x, y))/\varepsilon\big)

of the entropic optimal-transport coupling :math:`\pi = k\,\mu\otimes\mu` of :math:`(\mu,\mu)` for
the cost :math:`-s`.  The potentials solve the two marginal equations

.. math:: \sum_j w_j k(x_i, x_j) = 1, \qquad \sum_i w_i k(x_i, x_j) = 1,

i.e. :math:`f = T_f(g)`, :math:`g = T_g(f)` with the soft-min operators

.. math:: T_f(g)_i = -\varepsilon\,\mathrm{LSE}_j\big(\log w_j + (g_j + s_{ij})/\varepsilon\big),\qquad
          T_g(f)_j = -\varepsilon\,\mathrm{LSE}_i\big(\log w_i + (f_i + s_{ij})/\varepsilon\big).

The velocity field is :math:`\Gamma(x) = V\sum_j w_j k(x, x_j)\, x_j`, where :math:`f(x)` is the
*out-of-sample* potential :math:`T_f(g)(x)` -- exactly the normaliser of a softmax with scores
:math:`s/\varepsilon` and per-key bias :math:`\log w_j + g_j/\varepsilon`, so the field can be
evaluated at any query point.

Modules
-------
* :mod:`~transformer_pde.sinkhorn.potentials` -- the potentials on any backend
  (:func:`sinkhorn_potentials`, :class:`SinkhornResult`), the soft-min operators over
  scores (:class:`ScoreSoftMin`, :class:`FusedSweep`) and the dense coupling of small
  problems (:func:`sinkhorn_coupling`);
* :mod:`~transformer_pde.sinkhorn.field` -- one head's field (:func:`sinkhorn_field`,
  :func:`out_of_sample_potential`), the record of a run's solves
  (:class:`SinkhornRecord`) and its summary (:func:`sinkhorn_summary`);
* :mod:`~transformer_pde.sinkhorn.warmstart` -- potentials carried along a flow
  (:class:`SinkhornWarmStart`);
* :mod:`~transformer_pde.sinkhorn.loop` -- the one Sinkhorn loop
  (:func:`sinkhorn_loop`), parametrised by its soft-min, with its options in
  :mod:`~transformer_pde.sinkhorn.options` (:class:`SoftMins`, :class:`Stopping`,
  :class:`Acceleration`, :class:`Start`, :class:`EpsilonScaling`); it also computes the
  Sinkhorn divergence of :func:`transformer_pde.diagnostics.wasserstein`;
* :mod:`~transformer_pde.sinkhorn.anderson` -- Anderson mixing (:class:`Anderson`).
"""

from ..errors import SinkhornNotConverged
from .anderson import Anderson
from .field import SinkhornRecord, out_of_sample_potential, sinkhorn_field, sinkhorn_summary
from .loop import LoopResult, sinkhorn_loop
from .options import Acceleration, EpsilonScaling, SoftMins, Start, Stopping
from .potentials import (FusedSweep, ScoreSoftMin, SinkhornResult, is_symmetric,
                         sinkhorn_coupling, sinkhorn_potentials)
from .warmstart import SinkhornWarmStart

__all__ = [
    "Acceleration",
    "Anderson",
    "EpsilonScaling",
    "FusedSweep",
    "LoopResult",
    "ScoreSoftMin",
    "SinkhornNotConverged",
    "SinkhornRecord",
    "SinkhornResult",
    "SinkhornWarmStart",
    "SoftMins",
    "Start",
    "Stopping",
    "is_symmetric",
    "out_of_sample_potential",
    "sinkhorn_coupling",
    "sinkhorn_field",
    "sinkhorn_loop",
    "sinkhorn_potentials",
    "sinkhorn_summary",
]
