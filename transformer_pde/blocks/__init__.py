r"""Full Transformer blocks as flows: MLP field, LayerNorm, RMSNorm, sphere constraint, splitting.

A residual Transformer block alternates an attention sub-layer, a token-wise MLP
sub-layer and layer normalisation.  Read as a flow in depth :math:`t`, the tokens obey

.. math:: \dot x_i = \Gamma_{\mu_t}(x_i) + m_t(x_i), \qquad
          m_t(x) = W_2(t)\,\sigma(W_1(t) x + b_1(t)) + b_2(t)

(or the gated :math:`m_t(x) = W_2\,(\sigma(G x + b_G)\odot(W_1 x + b_1)) + b_2`, SwiGLU
with :math:`\sigma` = SiLU), and the normalisation (:class:`LayerNorm` or
:class:`RMSNorm`) enters either *inside* the fields (pre-norm:
:math:`\Gamma_{\mathrm{LN}_\#\mu}(\mathrm{LN}\,x)` and :math:`m(\mathrm{LN}\,x)`) or as an
exact *projection* step after each sub-flow (post-norm, the view of Tai et al., "A
mathematical explanation of Transformers").

:class:`Block` gathers these options (``simulate(..., block=Block(mlp=..., layernorm=...,
constraint=..., splitting=...))``); :class:`BlockStepper` wraps any fixed-step solver of
:mod:`transformer_pde.integrate.solvers` and advances one step of size :math:`h` by operator splitting of the
attention flow
:math:`\mathcal A` and the MLP flow :math:`\mathcal M` (each sub-flow integrated by the
wrapped solver, followed by the projections :math:`\mathcal P`):

* ``"lie"`` (Lie–Trotter, order 1): :math:`\mathcal P\mathcal M_h\,\mathcal P\mathcal A_h`.
  With ``solver="euler"`` and ``dt=1`` one step is exactly one Transformer block
  ``x += Attn(LN1 x); x += MLP(LN2 x)`` (pre-norm; with RMSNorms and a gated SiLU MLP,
  a Llama-type decoder layer) or
  ``x = LN(x + Attn x); x = LN(x + MLP x)`` (post-norm).
* ``"strang"`` (order 2): :math:`\mathcal P\mathcal A_{h/2}\,\mathcal P\mathcal M_h\,\mathcal P\mathcal A_{h/2}`.
* ``"none"``: the wrapped solver integrates the sum field, then :math:`\mathcal P`.

Time-dependent weights follow the augmented-system convention: the attention flow
carries the clock, so the MLP sub-flow is frozen at :math:`t_n` (Lie) or
:math:`t_n + h/2` (Strang), which keeps Strang second order for time-dependent weights.

``Block(constraint="sphere")`` (:class:`Sphere`; a :class:`Constraint` is a tangent
projection plus a retraction) runs the normalised dynamics of Geshkovski, Letrouit,
Polyanskiy and Rigollet ("A mathematical perspective on Transformers"): tokens live on
:math:`S^{d-1}` and every field is replaced by its tangential part

.. math:: \dot x = P^\perp_x F(x), \qquad P^\perp_x = I - \frac{x x^\top}{|x|^2}.

Because :math:`x^\top P^\perp_x F = 0` for *every* :math:`x`, :math:`|x|` is a first integral
of this extended field, so any solver of order :math:`p` followed by the radial
retraction :math:`x \mapsto x/|x|` after every (sub-)step is a standard projection method
of order :math:`p` (Hairer, Lubich, Wanner, *Geometric Numerical Integration*, §IV.4),
and the tokens sit on the sphere to rounding (:math:`\le 10^{-15}`) after every step.

``Block(normalization=...)`` (:class:`Normalization`) places the normalisation of the
attention flow on the sphere: Post-LN (the sphere constraint), Pre-LN, Mix-LN, Peri-LN,
nGPT or LN-Scaling; :func:`speed_factors` reports the factor by which each scheme scales
the angular speed of the tokens along a run.
"""

from .block import MLP, SPLITTINGS, Block, Constraint, MLPWeights, PostLayerNorm, Sphere
from .normalization import (NORMALIZATIONS, Normalization, speed_factors, sphere_retract,
                            tangent_project)
from .norms import SOFTMAX_FREE_LN_EPS, LayerNorm, RMSNorm, token_layer_norm
from .stepper import BlockStepper

__all__ = [
    "Block",
    "BlockStepper",
    "Constraint",
    "LayerNorm",
    "MLP",
    "MLPWeights",
    "NORMALIZATIONS",
    "Normalization",
    "PostLayerNorm",
    "RMSNorm",
    "SOFTMAX_FREE_LN_EPS",
    "SPLITTINGS",
    "Sphere",
    "speed_factors",
    "sphere_retract",
    "tangent_project",
    "token_layer_norm",
]
