r"""Attention specification: kinds, parameters, validation and per-layer tables.

An :class:`Attention` describes the velocity field :math:`\Gamma_\mu` of one
(possibly multi-head, possibly masked) residual attention layer, with parameters
that may depend on depth :math:`t`.  Conventions (see ``docs/conventions.md``):

* score :math:`s(x, y) = \langle Qx, Ky \rangle = y^\top A x` with :math:`A = K^\top Q`;
  no hidden :math:`1/\sqrt{d}`; a temperature ``beta`` multiplies the score.
* ``heads = H``: :math:`H` divides :math:`d`, :math:`Q, K, V` are :math:`d\times d`, head
  :math:`h` uses row block :math:`h k \dots (h+1)k-1` (:math:`k = d/H`) of each and writes
  :math:`V_h\,(\text{average})` into that same block of the output; ``W_O`` (optional,
  :math:`d\times d`) multiplies the concatenation.
* optional bias vectors make the maps affine (BERT-style layers): queries
  :math:`Qx + b_Q`, keys :math:`Ky + b_K`, values :math:`Vy + b_V`, output
  :math:`W_O(\cdot) + b_O`; with heads, head :math:`h` uses the same row block of
  :math:`b_Q, b_K, b_V` as of the matrices.
* ``kv_heads = G`` (grouped-query attention): :math:`K` and :math:`V` hold :math:`G` row
  blocks, query head :math:`h` uses block :math:`\lfloor h/(H/G)\rfloor`.
* ``rotary``: queries and keys are rotated by their tokens' positions
  (:class:`~transformer_pde.attention.Rotary`).
* ``alibi``: the score of head :math:`h` loses :math:`\lambda_h |p_i - p_j|` (ALiBi,
  :mod:`~transformer_pde.attention.alibi`).
* ``masked=True``: tokens carry positions :math:`s\in[0,1]`; a query at position
  :math:`s` only attends to tokens with :math:`s_j \le s`; ``window = w`` keeps the last
  :math:`w` of them (sliding-window attention).

Parameters ``Q``, ``K``, ``V`` and ``W_O`` are arrays, callables ``t -> array``, or
:class:`Layers` tables (piecewise constant in ``t``, one matrix per layer); the biases
``b_Q``, ``b_K``, ``b_V``, ``b_O`` are vectors, callables or :class:`Layers` tables of shape
``(L, 1, n)``.
:meth:`Attention.at` freezes everything at one time into an :class:`AttentionParams`.

The package holds one concern per module: :mod:`~transformer_pde.attention.kinds` (the
registry), :mod:`~transformer_pde.attention.layers` (per-layer tables),
:mod:`~transformer_pde.attention.heads` (parameters frozen at one time),
:mod:`~transformer_pde.attention.rotary` (rotary positions),
:mod:`~transformer_pde.attention.alibi` (ALiBi slopes),
:mod:`~transformer_pde.attention.matrix` (attention matrices),
:mod:`~transformer_pde.attention.visibility` (which keys each token sees: causal order,
segments, windows) and
:mod:`~transformer_pde.attention.spec` (the :class:`Attention` specification).
"""

from .heads import AttentionParams, Head, score_head
from .kinds import BIAS_RULES, KINDS, Kind, register_kind
from .layers import Layers
from .rotary import Rotary
from .spec import Attention

__all__ = [
    "BIAS_RULES",
    "Attention",
    "AttentionParams",
    "Head",
    "Kind",
    "KINDS",
    "Layers",
    "register_kind",
    "Rotary",
    "score_head",
]
