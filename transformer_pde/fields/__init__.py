r"""Attention velocity fields of empirical measures, built from backend primitives.

Each attention kind is one *head field* function registered in :data:`HEAD_FIELDS`
(the kind's metadata lives in :data:`transformer_pde.attention.KINDS`).  A head field
receives the backend, the evaluation context, the frozen parameters, one head, the
query points and the token (key) points, and returns that head's output
:math:`V_h\,\bar x_h(x)` for every query.  All kinds reduce to three backend
primitives (see :mod:`transformer_pde.backends`):

* softmax:   ``softmax(beta Q x, K y, V y, log w)``
* l2:        :math:`-\beta'|Qx-Ky|^2 = 2\beta' Qx\cdot Ky - \beta'|Ky|^2 - \beta'|Qx|^2`; the last term
  cancels in the normalisation, so ``softmax(2 beta' Q x, K y, V y, log w - beta'|Ky|^2)``,
  with Qx and Ky first shifted by the keys' midrange (less cancellation)
* exp:       :math:`\sum_j w_j e^{s_j - c} V y_j = e^{\mathrm{lse} - c}\cdot` (softmax average),
  computed in the log domain so it is finite whenever the true value is (``c`` = ``shift``)
* linear / sigmoid / relu: ``pointwise(phi, beta Q x, K y, V y, w)``
* sinkhorn: potentials from log-domain Sinkhorn (``lse``), then
  ``softmax(beta Q x / eps, K y, V y, log w + g / eps)`` (the out-of-sample potential
  :math:`f(x)` is exactly the softmax normaliser).

Every primitive also takes the key range of each query
(:class:`~transformer_pde.backends.ranges.KeyRanges`): causal masks, sliding windows and
packed segments (independent token sets, ensembles) are all ranges over keys put once in
kernel order (:mod:`transformer_pde.attention.visibility`).

:class:`FieldEvaluator` (:mod:`~transformer_pde.fields.evaluator`) binds an attention, a
backend, weights, positions and segments (keys ordered and ranges built once; rotary
cosines and sines computed once) and keeps warm-start state between evaluations.  Rotary
positions rotate the projected queries and keys in the head fields
(:mod:`~transformer_pde.fields.kinds`), before any primitive.  The weights themselves:
:func:`~transformer_pde.attention.matrix.attention_matrix`.

Isotropic attention on the circle or :math:`S^2` (:math:`Q = K = I`, :math:`V = \pm I`) also
has an exact :math:`O(NK)` evaluation by its Fourier / spherical-harmonic expansion,
``FieldEvaluator(method="harmonic")`` (:mod:`~transformer_pde.fields.harmonic`).
"""

from ..attention.matrix import attention_matrix
from .evaluator import FieldEvaluator, velocity
from .kinds import HEAD_FIELDS, FieldContext, register_head_field

__all__ = [
    "FieldContext",
    "FieldEvaluator",
    "HEAD_FIELDS",
    "attention_matrix",
    "register_head_field",
    "velocity",
]
