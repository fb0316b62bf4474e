r"""The parts of a Transformer block and their composition :class:`Block`.

The per-token layer normalisation :func:`token_layer_norm` (the sphere's
:func:`~transformer_pde.blocks.tangent_project` and
:func:`~transformer_pde.blocks.sphere_retract` live in
:mod:`~transformer_pde.blocks.normalization`), :class:`LayerNorm`, the :class:`MLP` field,
the constraints (:class:`Constraint`, :class:`Sphere`, :class:`PostLayerNorm`) and
:class:`Block`, which gathers them for :func:`~transformer_pde.simulate` (the flow and its splittings are
described in :mod:`transformer_pde.blocks`).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from ..attention import Layers
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate.rk import array_namespace as _xp
from ..validation import choice, matrix, nonnegative, positive, real_array
from .normalization import as_normalization, sphere_retract, tangent_project

__all__ = ["Block", "Constraint", "LayerNorm", "MLP", "PostLayerNorm", "SOFTMAX_FREE_LN_EPS",
           "SPLITTINGS", "Sphere", "token_layer_norm"]

#: operator-splitting schemes of :class:`Block`
SPLITTINGS = ("strang", "lie", "none")
#: epsilon of the per-token layer normalisation of the ``galerkin`` / ``fourier`` kinds
#: (PyTorch's ``nn.LayerNorm`` default, as in Cao 2021)
SOFTMAX_FREE_LN_EPS = 1e-5

Param = Any


# --------------------------------------------------------------------------- normalisations
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


def _param(name: str, value: Any, t: float, left: bool) -> np.ndarray:
    if isinstance(value, Layers):
        return value(t, left=left)
    if callable(value):
        return matrix(name, np.atleast_2d(real_array(f"{name} (evaluated at t={t})", value(t))), t)
    return value


def _store(name: str, value: Any, *, vector: bool) -> Any:
    """Validate a constant parameter now (time-dependent ones at evaluation)."""
    _refuse_class(name, value)
    if value is None or isinstance(value, Layers) or callable(value):
        return value
    arr = matrix(name, np.atleast_2d(real_array(name, value)))
    if vector:
        if min(arr.shape) != 1:
            raise ArgumentError(f"{name} must be a vector, got shape {np.shape(value)}")
        arr = arr.ravel()
    arr = np.array(arr)
    arr.setflags(write=False)
    return arr


def _vector(name: str, value: Any, n: int, t: float, left: bool) -> np.ndarray | None:
    if value is None:
        return None
    v = np.asarray(_param(name, value, t, left), dtype=float).ravel()
    if v.shape != (n,):
        raise ArgumentError(f"{name} must have {n} entries, got {v.size} (t={t})")
    return v


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
        object.__setattr__(self, "scale", _store("scale", self.scale, vector=True))
        object.__setattr__(self, "shift", _store("shift", self.shift, vector=True))

    def __call__(self, X: Any, t: float = 0.0, *, left: bool = False) -> Any:
        """Normalise every row of ``X`` (n, d) at time ``t``."""
        xp = _xp(X)
        d = X.shape[1]
        if d < 2:
            raise ArgumentError("LayerNorm needs at least 2 features (d >= 2)")
        out = token_layer_norm(X, self.eps) * math.sqrt(self.variance)
        g = _vector("scale", self.scale, d, t, left)
        if g is not None:
            out = out * xp.asarray(g, dtype=X.dtype)
        b = _vector("shift", self.shift, d, t, left)
        if b is not None:
            out = out + xp.asarray(b, dtype=X.dtype)
        return out


# --------------------------------------------------------------------------- MLP
def _gelu(z: Any, xp: Any) -> Any:
    if xp is np:
        from scipy.special import erf  # noqa: PLC0415
    else:  # pragma: no cover - GPU only
        from cupyx.scipy.special import erf  # noqa: PLC0415
    return 0.5 * z * (1.0 + erf(z / math.sqrt(2.0)))


_ACTIVATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "relu": lambda z, xp: xp.maximum(z, 0.0),
    "gelu": _gelu,
}


@dataclass(frozen=True, eq=False)
class MLP:
    r"""Token-wise two-layer perceptron field :math:`m_t(x) = W_2\,\sigma(W_1 x + b_1) + b_2`.

    Parameters
    ----------
    W1 : array (m, d), callable ``t -> array`` or :class:`~transformer_pde.Layers`
        First layer (``m`` hidden units).
    W2 : array (d, m), callable or Layers
        Second layer.
    b1 : array (m,), callable, Layers of shape (L, 1, m), or None
    b2 : array (d,), callable, Layers of shape (L, 1, d), or None
    activation : {"gelu", "relu"}, default "gelu"
        GELU is the exact :math:`z\,\Phi(z)` (erf form).  ReLU makes the field only
        Lipschitz, which caps the observed order of high-order solvers; use GELU for
        convergence studies.

    Examples
    --------
    >>> import numpy as np
    >>> mlp = MLP(np.eye(2), np.eye(2), activation="relu")
    >>> mlp(0.0, np.array([[1.0, -1.0]])).tolist()
    [[1.0, 0.0]]
    """

    W1: Param
    W2: Param
    b1: Param | None = None
    b2: Param | None = None
    activation: str = "gelu"
    d: int = field(init=False)
    hidden: int = field(init=False)

    def __post_init__(self) -> None:
        choice("MLP: activation", self.activation, sorted(_ACTIVATIONS))
        set_ = object.__setattr__
        for name in ("W1", "W2"):
            if getattr(self, name) is None:
                raise ArgumentTypeError(f"MLP: {name} must be a matrix, a callable of t or "
                                        "Layers, got None")
            set_(self, name, _store(name, getattr(self, name), vector=False))
        for name in ("b1", "b2"):
            set_(self, name, _store(name, getattr(self, name), vector=True))
        W1, _, W2, _ = self.at(0.0)
        set_(self, "d", W1.shape[1])
        set_(self, "hidden", W1.shape[0])

    def at(self, t: float, *, left: bool = False):
        """Weights ``(W1, b1, W2, b2)`` at time ``t`` (biases ``None`` when absent)."""
        W1 = np.asarray(_param("W1", self.W1, t, left), dtype=float)
        W2 = np.asarray(_param("W2", self.W2, t, left), dtype=float)
        m, d = W1.shape
        if W2.shape != (d, m):
            raise ArgumentError(f"W2 must have shape (d, m) = {(d, m)} to match W1 {W1.shape}, "
                             f"got {W2.shape} (t={t})")
        return W1, _vector("b1", self.b1, m, t, left), W2, _vector("b2", self.b2, d, t, left)

    def __call__(self, t: float, X: Any, *, left: bool = False) -> Any:
        """The field :math:`m_t` at every row of ``X`` (n, d)."""
        xp = _xp(X)
        W1, b1, W2, b2 = self.at(t, left=left)
        z = X @ xp.asarray(W1.T, dtype=X.dtype)
        if b1 is not None:
            z = z + xp.asarray(b1, dtype=X.dtype)
        out = _ACTIVATIONS[self.activation](z, xp) @ xp.asarray(W2.T, dtype=X.dtype)
        if b2 is not None:
            out = out + xp.asarray(b2, dtype=X.dtype)
        return out


# --------------------------------------------------------------------------- constraints
@runtime_checkable
class Constraint(Protocol):
    r"""A manifold the tokens must stay on, as a projection method.

    Every field is replaced by ``tangent(X, F)`` (its tangential part at the tokens ``X``)
    and every (sub-)step ends with ``retract(X, t, left=...)`` (a map back onto the
    manifold); ``initial(X0)`` checks (and may renormalise) the initial tokens.  With an
    exact first integral of the tangential field, a solver of order :math:`p` followed by
    the retraction keeps order :math:`p` (Hairer, Lubich, Wanner, *Geometric Numerical
    Integration*, §IV.4).  :class:`Sphere` and :class:`PostLayerNorm` are the instances
    shipped; ``name`` labels the run's ``info``.
    """

    name: str

    def tangent(self, X: Any, F: Any) -> Any: ...

    def retract(self, X: Any, t: float, *, left: bool = False) -> Any: ...

    def initial(self, X0: np.ndarray) -> np.ndarray: ...


class Sphere:
    r"""Tokens on the unit sphere :math:`S^{d-1}` (Geshkovski et al.'s normalised dynamics).

    ``tangent`` is :func:`tangent_project` (:math:`|x|` is then a first integral of the
    projected field everywhere), ``retract`` is :func:`sphere_retract`; the initial
    tokens must have norm 1 to 1e-6 and are renormalised exactly."""

    name = "sphere"

    def tangent(self, X: Any, F: Any) -> Any:
        return tangent_project(X, F)

    def retract(self, X: Any, t: float, *, left: bool = False) -> Any:
        return sphere_retract(X)

    def initial(self, X0: np.ndarray) -> np.ndarray:
        r = np.sqrt((np.asarray(X0, dtype=float) ** 2).sum(axis=1))
        bad = float(np.max(np.abs(r - 1.0)))
        if bad > 1e-6:
            raise ArgumentError(
                "X0 must lie on the unit sphere for the Sphere constraint "
                f"(max | |x_i| - 1 | = {bad:.3g} > 1e-6); normalise the rows first")
        return X0 / r[:, None].astype(X0.dtype)

    def __repr__(self) -> str:
        return "Sphere()"


class PostLayerNorm:
    r"""Post-norm Transformer: the tokens are projected by a LayerNorm after each sub-flow.

    ``retract`` is the LayerNorm (with :math:`\varepsilon = 0`, :math:`\gamma = 1`,
    :math:`\delta = 0` the nearest-point projection onto its manifold, see
    :class:`LayerNorm`).  ``tangent`` leaves the fields unchanged: one Euler step of size
    1 per sub-layer is then exactly the post-norm block ``x = LN(x + Attn(x))`` (Tai et
    al.'s projection step), which is the computation this constraint reproduces.

    Parameters
    ----------
    layernorm : LayerNorm
        Its ``mode`` must be ``"post"``.
    mlp_layernorm : LayerNorm, optional
        A second post-norm LayerNorm applied instead after the MLP sub-flow (BERT's
        ``x = LN1(x + Attn x)``, ``x = LN2(x + MLP x)``: ``layernorm`` is LN1, this LN2);
        default: ``layernorm`` after both sub-flows.
    """

    name = "post_layernorm"

    def __init__(self, layernorm: "LayerNorm", mlp_layernorm: "LayerNorm | None" = None):
        for ln in (layernorm, mlp_layernorm):
            if ln is mlp_layernorm and ln is None:
                continue
            if not isinstance(ln, LayerNorm) or ln.mode != "post":
                raise ArgumentError("PostLayerNorm needs LayerNorms with mode='post', got "
                                    f"{ln!r}")
        self.layernorm = layernorm
        self.mlp_layernorm = layernorm if mlp_layernorm is None else mlp_layernorm

    @property
    def tables(self) -> list[Layers]:
        lns = (self.layernorm,) if self.mlp_layernorm is self.layernorm else \
            (self.layernorm, self.mlp_layernorm)
        return [v for ln in lns for v in vars(ln).values() if isinstance(v, Layers)]

    def tangent(self, X: Any, F: Any) -> Any:
        return F

    def retract(self, X: Any, t: float, *, left: bool = False) -> Any:
        return self.layernorm(X, t, left=left)

    def retract_mlp(self, X: Any, t: float, *, left: bool = False) -> Any:
        """The projection after the MLP sub-flow (``mlp_layernorm``)."""
        return self.mlp_layernorm(X, t, left=left)

    def initial(self, X0: np.ndarray) -> np.ndarray:
        if X0.shape[1] < 2:
            raise ArgumentError("a LayerNorm needs d >= 2 features")
        return X0

    def __repr__(self) -> str:
        if self.mlp_layernorm is self.layernorm:
            return f"PostLayerNorm({self.layernorm!r})"
        return f"PostLayerNorm({self.layernorm!r}, {self.mlp_layernorm!r})"


# --------------------------------------------------------------------------- block
def _refuse_class(name: str, value: Any) -> None:
    """A class passed where an instance is expected (``constraint=Sphere``): a clear
    :class:`ArgumentTypeError` saying what to pass instead."""
    if not isinstance(value, type):
        return
    cls = value.__name__
    if value.__module__.split(".")[0] == "transformer_pde":
        cls = f"tp.{cls}"
    try:
        needs_args = any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                         for p in inspect.signature(value).parameters.values())
    except (TypeError, ValueError):  # no signature available
        needs_args = True
    call = f"{cls}(...)" if needs_args else f"{cls}()"
    raise ArgumentTypeError(f"{name} must be an instance, got the class {cls}: pass "
                            f"{name}={call}, not {name}={cls}")


@dataclass(frozen=True, eq=False)
class Block:
    r"""The composition of a Transformer block around the attention flow.

    Parameters
    ----------
    mlp : MLP, optional
        Token-wise MLP field added to attention (a full Transformer block).
    layernorm : LayerNorm or pair of LayerNorms, optional
        A pre-norm LayerNorm (``mode="pre"``, inside both fields) or a pair
        ``(LN_attention, LN_mlp)``; a post-norm LayerNorm (``mode="post"``) is the
        constraint :class:`PostLayerNorm` (give it here or as ``constraint``); a pair of
        post-norm LayerNorms ``(LN1, LN2)`` projects with LN1 after the attention and LN2
        after the MLP sub-flow (a BERT layer with Lie splitting, Euler and ``dt = 1``; needs
        an ``mlp`` and ``splitting`` "lie" or "strang").
    constraint : Constraint or "sphere", optional
        Manifold the tokens stay on (:class:`Sphere`, :class:`PostLayerNorm`, or any
        object following :class:`Constraint`).
    splitting : {"strang", "lie", "none"}, optional
        How the attention and MLP flows are combined (see the module docstring); default
        ``"strang"``.  Only with ``mlp``.
    normalization : str or Normalization, optional
        Where the normalisation sits in the attention flow on the sphere:
        ``"post"`` (the same flow as ``constraint="sphere"``), ``"pre"``, ``"mix"``,
        ``"peri"``, ``"ngpt"``, ``"cod"``, or a
        :class:`~transformer_pde.blocks.Normalization` carrying the options of a scheme
        (``alpha``, ``switch``).  It replaces ``constraint``, ``layernorm`` and ``mlp``,
        which cannot be combined with it.

    Every option needs a fixed-step solver.  Options that do not apply are errors: a
    splitting without an MLP, a post-norm LayerNorm together with another constraint,
    a normalisation scheme together with a constraint, a LayerNorm or an MLP.
    """

    mlp: MLP | None = None
    layernorm: Any = None
    constraint: Any = None
    splitting: str | None = None
    normalization: Any = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "normalization", _normalization_option(self))
        for name in ("mlp", "layernorm", "constraint"):
            _refuse_class(name, getattr(self, name))
        if isinstance(self.layernorm, tuple):
            for i, ln in enumerate(self.layernorm):
                _refuse_class(f"layernorm[{i}]", ln)
        if self.mlp is not None and not isinstance(self.mlp, MLP):
            raise ArgumentTypeError(
                f"mlp must be a transformer_pde.blocks.MLP, got {type(self.mlp).__name__}")
        if self.splitting is not None and not isinstance(self.splitting, str):
            raise ArgumentTypeError(f"splitting must be one of {list(SPLITTINGS)}, got "
                                    f"{self.splitting!r:.60}")
        if self.splitting is not None:
            if self.mlp is None:
                raise ArgumentError(
                    f"splitting={self.splitting!r} applies only with an mlp: the attention "
                    "flow alone is not split")
            if self.splitting not in SPLITTINGS:
                raise ArgumentError(
                    f"splitting must be one of {list(SPLITTINGS)}, got {self.splitting!r}")
        constraint = self.constraint
        if isinstance(constraint, str):
            if constraint != "sphere":
                raise ArgumentError(f"constraint must be 'sphere' or a Constraint object, "
                                    f"got {constraint!r}")
            constraint = Sphere()
        elif constraint is not None and not all(
                callable(getattr(constraint, m, None)) for m in ("tangent", "retract", "initial")):
            raise ArgumentTypeError(
                "constraint must be 'sphere' or an object with tangent(X, F), "
                f"retract(X, t, left=...) and initial(X0), got {type(constraint).__name__}")
        ln = self.layernorm
        if isinstance(ln, tuple):
            modes = {getattr(x, "mode", None) for x in ln}
            if len(ln) != 2 or not all(isinstance(x, LayerNorm) for x in ln) or len(modes) != 1:
                raise ArgumentError("layernorm as a tuple must be two pre-norm or two post-norm "
                                    "LayerNorms (attention, mlp)")
            if modes == {"post"}:
                if self.mlp is None or self.splitting == "none":
                    raise ArgumentError(
                        "a pair of post-norm LayerNorms projects after the attention and after "
                        "the MLP sub-flow: it needs mlp= and splitting='lie' or 'strang'")
                if constraint is not None:
                    raise ArgumentError(
                        "post-norm LayerNorms are a constraint of their own; do not combine "
                        f"them with constraint={constraint!r}")
                constraint = PostLayerNorm(ln[0], ln[1])
        elif isinstance(ln, LayerNorm):
            if ln.mode == "post":
                if constraint is not None:
                    raise ArgumentError(
                        f"a post-norm LayerNorm is a constraint of its own; do not combine it "
                        f"with constraint={constraint!r} (the "
                        f"{getattr(constraint, 'name', type(constraint).__name__)} already "
                        "normalises the tokens)")
                constraint = PostLayerNorm(ln)
        elif ln is not None:
            raise ArgumentTypeError("layernorm must be a LayerNorm, a pair of them, or None, "
                                    f"got {type(ln).__name__}")
        set_(self, "constraint", constraint)

    @property
    def pre_norms(self) -> tuple[LayerNorm | None, LayerNorm | None]:
        """The pre-norm LayerNorms ``(of the attention field, of the MLP field)``."""
        ln = self.layernorm
        if isinstance(ln, tuple):
            return ln if ln[0].mode == "pre" else (None, None)
        if isinstance(ln, LayerNorm) and ln.mode == "pre":
            return ln, ln
        return None, None

    @property
    def tables(self) -> list[Layers]:
        """Every piecewise-constant :class:`~transformer_pde.Layers` table of the block."""
        ln_att, ln_mlp = self.pre_norms
        objs = [o for o in (self.mlp, ln_att, ln_mlp) if o is not None]
        out = [v for obj in objs for v in vars(obj).values() if isinstance(v, Layers)]
        return out + list(getattr(self.constraint, "tables", []))

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary for ``ParticleTrajectory.info``."""
        ln_att, _ = self.pre_norms
        ln = "pre" if ln_att is not None else \
            "post" if isinstance(self.constraint, PostLayerNorm) else None
        out = {"constraint": getattr(self.constraint, "name", None),
               "splitting": (self.splitting or "strang") if self.mlp is not None else "none",
               "mlp": None if self.mlp is None else self.mlp.activation, "layernorm": ln,
               "normalization": None}
        nz = self.normalization
        if nz is not None:
            out["normalization"] = nz.scheme
            for name in ("alpha", "switch"):
                if getattr(nz, name) is not None:
                    out[f"normalization_{name}"] = getattr(nz, name)
        return out

    def parameters(self) -> dict[str, Any]:
        """Everything that determines the block's flow, by dotted name.

        Values are plain scalars and strings, constant arrays (read-only),
        :class:`~transformer_pde.Layers` tables and callables of time, as the block holds
        them: ``"splitting"``, ``"mlp.W1"``, ``"mlp.activation"``, ...,
        ``"layernorm.attention.scale"``, ``"layernorm.mlp.eps"``, ``"constraint"``,
        ``"constraint.layernorm.variance"``, ..., and with a normalisation scheme
        ``"normalization"``, ``"normalization.alpha"``, ``"normalization.switch"``.  Two
        blocks with equal parameters (arrays and tables equal element for element, the
        same callables) compute the same flow; checkpoints fingerprint a run with them.  A
        constraint other than :class:`Sphere` and :class:`PostLayerNorm` is named by its
        class and ``repr``.
        """
        out: dict[str, Any] = {"splitting": (self.splitting or "strang")
                               if self.mlp is not None else "none"}
        if self.mlp is not None:
            for name in ("W1", "W2", "b1", "b2", "activation"):
                out[f"mlp.{name}"] = getattr(self.mlp, name)
        ln_att, ln_mlp = self.pre_norms
        for role, ln in (("attention", ln_att), ("mlp", ln_mlp)):
            out.update(_layernorm_parameters(f"layernorm.{role}", ln))
        c = self.constraint
        if c is None:
            out["constraint"] = None
        elif isinstance(c, Sphere):
            out["constraint"] = "sphere"
        elif isinstance(c, PostLayerNorm):
            out["constraint"] = "post_layernorm"
            out.update(_layernorm_parameters("constraint.layernorm", c.layernorm))
            out.update(_layernorm_parameters("constraint.mlp_layernorm", c.mlp_layernorm))
        else:
            cls = type(c)
            out["constraint"] = f"{cls.__module__}.{cls.__qualname__}: {c!r}"
        if self.normalization is not None:
            p = self.normalization.parameters()
            out["normalization"] = p.pop("scheme")
            out.update({f"normalization.{k}": v for k, v in p.items()})
        return out


def _normalization_option(block: "Block") -> Any:
    """``block.normalization`` as a :class:`~transformer_pde.blocks.Normalization` (or
    ``None``); an :class:`ArgumentError` if it is combined with the options it replaces."""
    _refuse_class("normalization", block.normalization)
    nz = as_normalization(block.normalization)
    if nz is None:
        return None
    if block.constraint is not None:
        raise ArgumentError(
            f"normalization={nz.scheme!r} already keeps the tokens normalised; do not combine "
            f"it with constraint={block.constraint!r} (normalization='post' is the flow of "
            "constraint='sphere': give one of them)")
    if block.layernorm is not None:
        raise ArgumentError(
            f"normalization={nz.scheme!r} places the normalisation itself; do not combine it "
            "with layernorm= (use normalization='pre' for Pre-LN on the sphere, or layernorm= "
            "without normalization= for a LayerNorm in feature space)")
    if block.mlp is not None:
        raise ArgumentError(
            f"normalization={nz.scheme!r} applies to the attention flow alone and cannot be "
            "combined with mlp=; for a block with an MLP use constraint='sphere' or "
            "layernorm= instead")
    return nz


def _layernorm_parameters(prefix: str, ln: LayerNorm | None) -> dict[str, Any]:
    if ln is None:
        return {prefix: None}
    return {f"{prefix}.{name}": getattr(ln, name)
            for name in ("mode", "variance", "eps", "scale", "shift")}
