r"""Token normalisations of a block: :class:`LayerNorm`, :class:`RMSNorm`, :func:`token_layer_norm`.

Both normalisations act on each token (each row) separately and come in two modes: inside
the fields (``mode="pre"``, a pre-norm Transformer: the fields see normalised tokens, the
residual stream is not normalised) or as a projection after each sub-flow
(``mode="post"``, a post-norm Transformer; :class:`~transformer_pde.blocks.PostLayerNorm`
is that constraint).  Their gains (and LayerNorm's shift) may depend on depth: a constant
vector, a callable of :math:`t` or a :class:`~transformer_pde.Layers` table of shape
(L, 1, d) (see :mod:`transformer_pde.blocks.params`).

* LayerNorm centres and rescales, :math:`\gamma\odot s(x - \bar x\mathbf 1)/
  \sqrt{\operatorname{var}(x) + \varepsilon} + \delta`;
* RMSNorm only rescales, :math:`\gamma\odot x/\sqrt{\tfrac1d|x|^2 + \varepsilon}` (the
  normalisation of Llama-type decoders): with :math:`\varepsilon = 0` and :math:`\gamma = 1`
  it is the radial projection onto the sphere of radius :math:`\sqrt d`, so a pre-norm
  field sees only the directions :math:`x/|x|` of the tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends import array_namespace as _xp
from ..errors import ArgumentError
from ..validation import choice, nonnegative, positive
from .params import stored_parameter, vector_at

__all__ = ["LayerNorm", "RMSNorm", "SOFTMAX_FREE_LN_EPS", "token_layer_norm"]

#: epsilon of the per-token layer normalisation of the ``galerkin`` / ``fourier`` kinds
#: (PyTorch's ``nn.LayerNorm`` default, as in Cao 2021)
SOFTMAX_FREE_LN_EPS = 1e-5

Param = Any


def token_layer_norm(x: Any, eps: float = SOFTMAX_FREE_LN_EPS) -> Any:
    r"""Per-token layer normalisation without affine parameters.

    For each row :math:`u \in \mathbb R^k` of ``x``,

    .. math:: \tilde u = \frac{u - \bar u\,\mathbf 1}{\sqrt{\tfrac1k\sum_l (u_l - \bar u)^2 + \varepsilon}},
              \qquad \bar u = \tfrac1k \textstyle\sum_l u_l .

    Parameters
    ----------
    x : array (n, k)
        Rows to normalise (NumPy or CuPy).
    eps : float, default :data:`SOFTMAX_FREE_LN_EPS`
        Added to the variance (:math:`\varepsilon \ge 0`).
    """
    xp = _xp(x)
    c = x - x.mean(axis=1, keepdims=True)
    return c / xp.sqrt((c * c).mean(axis=1, keepdims=True) + eps)


@dataclass(frozen=True, eq=False)
class LayerNorm:
    r"""Layer normalisation of tokens, as a projection or inside the fields.

    .. math:: \mathrm{LN}_t(x) = \gamma(t) \odot s\,\frac{x - \bar x\mathbf 1}
              {\sqrt{\tfrac1d\sum_l (x_l-\bar x)^2 + \varepsilon}} + \delta(t),

    with :math:`s^2` the target variance.  With :math:`\varepsilon = 0`, :math:`\gamma = 1`,
    :math:`\delta = 0` this is the exact (nearest-point) projection onto the manifold
    :math:`\{x:\ \bar x = 0,\ \tfrac1d|x|^2 = s^2\}`, a sphere of radius :math:`s\sqrt d` in
    the hyperplane :math:`\mathbf 1^\perp` (centring is the orthogonal projection onto the
    hyperplane, radial rescaling the nearest point of the sphere inside it).

    Parameters
    ----------
    mode : {"pre", "post"}, default "pre"
        ``"pre"``: the fields see normalised tokens, :math:`\dot x = \Gamma_{\mathrm{LN}_\#\mu}
        (\mathrm{LN}\,x) + m(\mathrm{LN}\,x)` (pre-norm Transformer; the residual stream is
        not normalised).  ``"post"``: tokens are projected by :math:`\mathrm{LN}` after each
        sub-flow (post-norm Transformer, Tai et al.'s projection step).
    variance : float, default 1.0
        Target variance :math:`s^2 > 0`.
    eps : float, default 0.0
        :math:`\varepsilon \ge 0` (0: exact projection; PyTorch uses 1e-5).
    scale, shift : array (d,), callable ``t -> array``, :class:`~transformer_pde.Layers` or None
        Optional time-dependent :math:`\gamma(t)` and :math:`\delta(t)` (a ``Layers`` table of
        shape (L, 1, d)).
    """

    mode: str = "pre"
    variance: float = 1.0
    eps: float = 0.0
    scale: Param | None = None
    shift: Param | None = None

    def __post_init__(self) -> None:
        choice("LayerNorm: mode", self.mode, ("pre", "post"))
        object.__setattr__(self, "variance", positive("LayerNorm: variance", self.variance))
        object.__setattr__(self, "eps", nonnegative("LayerNorm: eps", self.eps))
        object.__setattr__(self, "scale", stored_parameter("scale", self.scale, vector=True))
        object.__setattr__(self, "shift", stored_parameter("shift", self.shift, vector=True))

    def __call__(self, X: Any, t: float = 0.0, *, left: bool = False) -> Any:
        """Normalise every row of ``X`` (n, d) at time ``t``."""
        xp = _xp(X)
        d = X.shape[1]
        if d < 2:
            raise ArgumentError("LayerNorm needs at least 2 features (d >= 2)")
        out = token_layer_norm(X, self.eps) * math.sqrt(self.variance)
        g = vector_at("scale", self.scale, d, t, left)
        if g is not None:
            out = out * xp.asarray(g, dtype=X.dtype)
        b = vector_at("shift", self.shift, d, t, left)
        if b is not None:
            out = out + xp.asarray(b, dtype=X.dtype)
        return out


@dataclass(frozen=True, eq=False)
class RMSNorm:
    r"""Root-mean-square normalisation of tokens, as a projection or inside the fields.

    .. math:: \mathrm{RMS}_t(x) = \gamma(t) \odot \frac{x}
              {\sqrt{\tfrac1d\sum_l x_l^2 + \varepsilon}} .

    Unlike :class:`LayerNorm` it does not centre the token.  With :math:`\varepsilon = 0`
    and :math:`\gamma = 1` it is the radial projection :math:`x \mapsto \sqrt d\,x/|x|`,
    the nearest point of the sphere of radius :math:`\sqrt d`; a pre-norm field then sees
    only the directions of the tokens.  A zero token with :math:`\varepsilon = 0` gives a
    row of NaN (a run then stops as non-finite).

    Parameters
    ----------
    mode : {"pre", "post"}, default "pre"
        ``"pre"``: inside the fields, :math:`\dot x = \Gamma_{\mathrm{RMS}_\#\mu}
        (\mathrm{RMS}\,x) + m(\mathrm{RMS}\,x)` (Llama-type decoders); ``"post"``: the tokens
        are projected by :math:`\mathrm{RMS}` after each sub-flow.
    eps : float, default 0.0
        :math:`\varepsilon \ge 0` added to the mean square (Llama models use 1e-5 or 1e-6).
    scale : array (d,), callable ``t -> array``, :class:`~transformer_pde.Layers` or None
        Optional time-dependent gain :math:`\gamma(t)` (a ``Layers`` table of shape
        (L, 1, d): one gain vector per layer).

    Examples
    --------
    >>> import numpy as np
    >>> RMSNorm()(np.array([[3.0, 4.0]])).round(12).tolist()   # sqrt(2) x / |x|
    [[0.848528137424, 1.131370849898]]
    """

    mode: str = "pre"
    eps: float = 0.0
    scale: Param | None = None

    def __post_init__(self) -> None:
        choice("RMSNorm: mode", self.mode, ("pre", "post"))
        object.__setattr__(self, "eps", nonnegative("RMSNorm: eps", self.eps))
        object.__setattr__(self, "scale", stored_parameter("scale", self.scale, vector=True))

    def __call__(self, X: Any, t: float = 0.0, *, left: bool = False) -> Any:
        """Normalise every row of ``X`` (n, d) at time ``t`` (the gain's left limit at a
        layer boundary with ``left=True``)."""
        xp = _xp(X)
        g = vector_at("scale", self.scale, X.shape[1], t, left)
        with np.errstate(invalid="ignore", divide="ignore"):  # a zero row: NaN, no warning
            out = X / xp.sqrt((X * X).mean(axis=1, keepdims=True) + self.eps)
        if g is not None:
            out = out * xp.asarray(g, dtype=X.dtype)
        return out
