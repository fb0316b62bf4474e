r"""The parts of a Transformer block and their composition :class:`Block`.

The :class:`MLP` field (plain or gated), the constraints (:class:`Constraint`,
:class:`Sphere`, :class:`PostLayerNorm`) and :class:`Block`, which gathers them with the
token normalisations of :mod:`~transformer_pde.blocks.norms` (:class:`LayerNorm`,
:class:`RMSNorm`) for :func:`~transformer_pde.simulate` (the flow and its splittings are
described in :mod:`transformer_pde.blocks`; the sphere's
:func:`~transformer_pde.blocks.tangent_project` and
:func:`~transformer_pde.blocks.sphere_retract` live in
:mod:`~transformer_pde.blocks.normalization`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ..attention import Layers
from ..backends import array_namespace as _xp
from ..errors import ArgumentError, ArgumentTypeError
from ..validation import choice
from .normalization import as_normalization, sphere_retract, tangent_project
from .norms import LayerNorm, RMSNorm
from .params import parameter_at, refuse_class, stored_parameter, vector_at

__all__ = ["Block", "Constraint", "MLP", "MLPWeights", "NORMS", "PostLayerNorm", "SPLITTINGS",
           "Sphere"]

#: operator-splitting schemes of :class:`Block`
SPLITTINGS = ("strang", "lie", "none")
#: the token normalisations a :class:`Block` accepts as ``layernorm``
NORMS = (LayerNorm, RMSNorm)

Param = Any

# --------------------------------------------------------------------------- MLP
def _special(name: str, xp: Any) -> Callable[[Any], Any]:
    """The special function ``name`` of SciPy, or of CuPy for the GPU namespace."""
    if xp is np:
        # deferred: SciPy takes seconds to import; only the gelu and silu activations need it
        import scipy.special as special  # noqa: PLC0415
    else:  # pragma: no cover - GPU only
        # deferred: CuPy is optional, reached only with arrays on the GPU
        import cupyx.scipy.special as special  # noqa: PLC0415
    return getattr(special, name)


def _gelu(z: Any, xp: Any) -> Any:
    return 0.5 * z * (1.0 + _special("erf", xp)(z / math.sqrt(2.0)))


def _silu(z: Any, xp: Any) -> Any:
    # expit(z) = 1 / (1 + e^{-z}) without overflow: exactly 1 for z > 37 (then silu(z) = z)
    # and underflowing to 0 for z -> -inf (then silu(z) -> -0.0), never inf * 0
    return z * _special("expit", xp)(z)


_ACTIVATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "relu": lambda z, xp: xp.maximum(z, 0.0),
    "gelu": _gelu,
    "silu": _silu,
}


class MLPWeights(NamedTuple):
    """The weights of an :class:`MLP` at one depth (``None`` where absent)."""

    W1: np.ndarray
    b1: np.ndarray | None
    W2: np.ndarray
    b2: np.ndarray | None
    gate: np.ndarray | None
    b_gate: np.ndarray | None


@dataclass(frozen=True, eq=False)
class MLP:
    r"""Token-wise perceptron field, plain or gated.

    .. math:: m_t(x) = W_2\,\sigma(W_1 x + b_1) + b_2 \quad\text{or, with a gate,}\quad
              m_t(x) = W_2\big(\sigma(G x + b_G) \odot (W_1 x + b_1)\big) + b_2 ,

    every weight possibly depending on :math:`t`.  The gated form with
    ``activation="silu"`` is SwiGLU (Llama-type decoders: ``ffn_gate`` is :math:`G`,
    ``ffn_up`` is :math:`W_1`, ``ffn_down`` is :math:`W_2`).

    Parameters
    ----------
    W1 : array (m, d), callable ``t -> array`` or :class:`~transformer_pde.Layers`
        First layer (``m`` hidden units); with a gate, the linear ("up") branch.
    W2 : array (d, m), callable or Layers
        Second layer.
    b1 : array (m,), callable, Layers of shape (L, 1, m), or None
    b2 : array (d,), callable, Layers of shape (L, 1, d), or None
    activation : {"gelu", "relu", "silu"}, default "gelu"
        GELU is the exact :math:`z\,\Phi(z)` (erf form); SiLU is
        :math:`z\,\mathrm{expit}(z) = z/(1 + e^{-z})`, evaluated without overflow (exactly
        :math:`z` for :math:`z > 37` in double precision, tending to 0 as
        :math:`z \to -\infty`).  ReLU makes the field only Lipschitz, which caps the
        observed order of high-order solvers; use GELU or SiLU for convergence studies.
    gate : array (m, d), callable or Layers, optional
        The gate :math:`G`; the activation then applies to the gate branch only.
    b_gate : array (m,), callable, Layers of shape (L, 1, m), or None
        Bias :math:`b_G` of the gate (only with ``gate``).

    Examples
    --------
    >>> import numpy as np
    >>> mlp = MLP(np.eye(2), np.eye(2), activation="relu")
    >>> mlp(0.0, np.array([[1.0, -1.0]])).tolist()
    [[1.0, 0.0]]
    >>> glu = MLP(np.eye(2), np.eye(2), activation="relu", gate=-np.eye(2))
    >>> glu(0.0, np.array([[1.0, -3.0]])).tolist()   # relu(-x) * x
    [[0.0, -9.0]]
    """

    W1: Param
    W2: Param
    b1: Param | None = None
    b2: Param | None = None
    activation: str = "gelu"
    gate: Param | None = None
    b_gate: Param | None = None
    d: int = field(init=False)
    hidden: int = field(init=False)

    def __post_init__(self) -> None:
        choice("MLP: activation", self.activation, sorted(_ACTIVATIONS))
        set_ = object.__setattr__
        for name in ("W1", "W2"):
            if getattr(self, name) is None:
                raise ArgumentTypeError(f"MLP: {name} must be a matrix, a callable of t or "
                                        "Layers, got None")
        if self.b_gate is not None and self.gate is None:
            raise ArgumentError("MLP: b_gate applies only with a gate (gate=): the bias of "
                                "the gate branch sigma(gate x + b_gate)")
        for name in ("W1", "W2", "gate"):
            set_(self, name, stored_parameter(name, getattr(self, name), vector=False))
        for name in ("b1", "b2", "b_gate"):
            set_(self, name, stored_parameter(name, getattr(self, name), vector=True))
        w = self.at(0.0)
        set_(self, "d", w.W1.shape[1])
        set_(self, "hidden", w.W1.shape[0])

    @property
    def gated(self) -> bool:
        """Whether the MLP has a gate."""
        return self.gate is not None

    def at(self, t: float, *, left: bool = False) -> MLPWeights:
        """The weights at time ``t`` (a table's left limit with ``left=True``), validated:
        ``W2`` of shape (d, m) and ``gate`` of shape (m, d) for ``W1`` of shape (m, d)."""
        W1 = np.asarray(parameter_at("W1", self.W1, t, left), dtype=float)
        W2 = np.asarray(parameter_at("W2", self.W2, t, left), dtype=float)
        m, d = W1.shape
        if W2.shape != (d, m):
            raise ArgumentError(f"W2 must have shape (d, m) = {(d, m)} to match W1 {W1.shape}, "
                                f"got {W2.shape} (t={t})")
        gate = None
        if self.gate is not None:
            gate = np.asarray(parameter_at("gate", self.gate, t, left), dtype=float)
            if gate.shape != (m, d):
                raise ArgumentError(f"gate must have shape (m, d) = {(m, d)}, the shape of W1, "
                                    f"got {gate.shape} (t={t})")
        return MLPWeights(W1, vector_at("b1", self.b1, m, t, left), W2,
                          vector_at("b2", self.b2, d, t, left), gate,
                          vector_at("b_gate", self.b_gate, m, t, left))

    def __call__(self, t: float, X: Any, *, left: bool = False) -> Any:
        """The field :math:`m_t` at every row of ``X`` (n, d)."""
        xp = _xp(X)
        w = self.at(t, left=left)

        def affine(W: np.ndarray, b: np.ndarray | None) -> Any:
            z = X @ xp.asarray(W.T, dtype=X.dtype)
            return z if b is None else z + xp.asarray(b, dtype=X.dtype)

        sigma = _ACTIVATIONS[self.activation]
        if w.gate is None:
            hidden = sigma(affine(w.W1, w.b1), xp)
        else:
            hidden = sigma(affine(w.gate, w.b_gate), xp) * affine(w.W1, w.b1)
        out = hidden @ xp.asarray(w.W2.T, dtype=X.dtype)
        if w.b2 is not None:
            out = out + xp.asarray(w.b2, dtype=X.dtype)
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

    ``retract`` is the normalisation (a :class:`LayerNorm` or an :class:`RMSNorm`; with
    :math:`\varepsilon = 0`, :math:`\gamma = 1`, :math:`\delta = 0` the nearest-point
    projection onto its manifold).  ``tangent`` leaves the fields unchanged: one Euler step
    of size 1 per sub-layer is then exactly the post-norm block ``x = LN(x + Attn(x))``
    (Tai et al.'s projection step), which is the computation this constraint reproduces.

    Parameters
    ----------
    layernorm : LayerNorm or RMSNorm
        Its ``mode`` must be ``"post"``.
    mlp_layernorm : LayerNorm or RMSNorm, optional
        A second post-norm normalisation applied instead after the MLP sub-flow (BERT's
        ``x = LN1(x + Attn x)``, ``x = LN2(x + MLP x)``: ``layernorm`` is LN1, this LN2);
        default: ``layernorm`` after both sub-flows.
    """

    name = "post_layernorm"

    def __init__(self, layernorm: "LayerNorm | RMSNorm",
                 mlp_layernorm: "LayerNorm | RMSNorm | None" = None):
        for ln in (layernorm, mlp_layernorm):
            if ln is mlp_layernorm and ln is None:
                continue
            if not isinstance(ln, NORMS) or ln.mode != "post":
                raise ArgumentError("PostLayerNorm needs LayerNorms or RMSNorms with "
                                    f"mode='post', got {ln!r}")
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
        if X0.shape[1] < 2 and any(isinstance(ln, LayerNorm)
                                   for ln in (self.layernorm, self.mlp_layernorm)):
            raise ArgumentError("a LayerNorm needs d >= 2 features")
        return X0

    def __repr__(self) -> str:
        if self.mlp_layernorm is self.layernorm:
            return f"PostLayerNorm({self.layernorm!r})"
        return f"PostLayerNorm({self.layernorm!r}, {self.mlp_layernorm!r})"


# --------------------------------------------------------------------------- block
@dataclass(frozen=True, eq=False)
class Block:
    r"""The composition of a Transformer block around the attention flow.

    Parameters
    ----------
    mlp : MLP, optional
        Token-wise MLP field added to attention (a full Transformer block).
    layernorm : LayerNorm, RMSNorm or a pair of them, optional
        A pre-norm normalisation (``mode="pre"``, inside both fields) or a pair
        ``(N_attention, N_mlp)``; a post-norm one (``mode="post"``) is the
        constraint :class:`PostLayerNorm` (give it here or as ``constraint``); a pair of
        post-norm normalisations ``(N1, N2)`` projects with N1 after the attention and N2
        after the MLP sub-flow (a BERT layer with Lie splitting, Euler and ``dt = 1``; needs
        an ``mlp`` and ``splitting`` "lie" or "strang").  :class:`LayerNorm` and
        :class:`RMSNorm` may be mixed in a pair; both must have the same ``mode``.  A
        pre-norm pair of RMSNorms with a gated SiLU ``mlp``, Lie splitting, Euler and
        ``dt = 1`` is a Llama-type decoder layer ``x += Attn(RMS1 x); x += MLP(RMS2 x)``.
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
    splitting without an MLP, a post-norm LayerNorm (or RMSNorm) together with another
    constraint, a normalisation scheme together with a constraint, a LayerNorm or an MLP.
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
            refuse_class(name, getattr(self, name))
        if isinstance(self.layernorm, tuple):
            for i, ln in enumerate(self.layernorm):
                refuse_class(f"layernorm[{i}]", ln)
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
        constraint = _norm_constraint(self, constraint)
        set_(self, "constraint", constraint)

    @property
    def pre_norms(self) -> tuple[Any, Any]:
        """The pre-norm normalisations (:class:`LayerNorm` or :class:`RMSNorm`) ``(of the
        attention field, of the MLP field)``, ``None`` where there is none."""
        ln = self.layernorm
        if isinstance(ln, tuple):
            return ln if ln[0].mode == "pre" else (None, None)
        if isinstance(ln, NORMS) and ln.mode == "pre":
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
        if self.mlp is not None and self.mlp.gated:
            out["mlp_gated"] = True
        norms = self.layernorm if isinstance(self.layernorm, tuple) else (self.layernorm,)
        if any(isinstance(x, RMSNorm) for x in norms):  # absent for LayerNorms: info unchanged
            out["layernorm_type"] = ["rms" if isinstance(x, RMSNorm) else "layer"
                                     for x in norms]
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
        ``"constraint.layernorm.variance"``, ..., with a gate ``"mlp.gate"`` and
        ``"mlp.b_gate"``, for an :class:`RMSNorm` ``"<prefix>.type"`` (``"rms"``),
        ``"<prefix>.mode"``, ``"<prefix>.eps"`` and ``"<prefix>.scale"``, and with a normalisation scheme
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
            if self.mlp.gated:  # absent without a gate: fingerprints of other MLPs unchanged
                out["mlp.gate"], out["mlp.b_gate"] = self.mlp.gate, self.mlp.b_gate
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
    refuse_class("normalization", block.normalization)
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


def _norm_constraint(block: "Block", constraint: Any) -> Any:
    """The block's constraint once its ``layernorm`` is read: a post-norm normalisation (or
    pair) becomes :class:`PostLayerNorm`; errors for what does not apply."""
    ln = block.layernorm
    if isinstance(ln, tuple):
        modes = {getattr(x, "mode", None) for x in ln}
        if len(ln) != 2 or not all(isinstance(x, NORMS) for x in ln) or len(modes) != 1:
            raise ArgumentError("layernorm as a tuple must be two pre-norm or two post-norm "
                                "LayerNorms or RMSNorms (attention, mlp), got "
                                f"{tuple(type(x).__name__ for x in ln)} with modes "
                                f"{sorted(str(m) for m in modes)}")
        if modes == {"post"}:
            if block.mlp is None or block.splitting == "none":
                raise ArgumentError(
                    "a pair of post-norm LayerNorms projects after the attention and after "
                    "the MLP sub-flow: it needs mlp= and splitting='lie' or 'strang'")
            if constraint is not None:
                raise ArgumentError(
                    "post-norm LayerNorms are a constraint of their own; do not combine "
                    f"them with constraint={constraint!r}")
            return PostLayerNorm(ln[0], ln[1])
        return constraint
    if isinstance(ln, NORMS):
        if ln.mode == "post":
            if constraint is not None:
                raise ArgumentError(
                    f"a post-norm {type(ln).__name__} is a constraint of its own; do not "
                    f"combine it with constraint={constraint!r} (the "
                    f"{getattr(constraint, 'name', type(constraint).__name__)} already "
                    "normalises the tokens)")
            return PostLayerNorm(ln)
        return constraint
    if ln is not None:
        raise ArgumentTypeError("layernorm must be a LayerNorm, an RMSNorm, a pair of them, "
                                f"or None, got {type(ln).__name__}")
    return constraint


def _layernorm_parameters(prefix: str, ln: Any) -> dict[str, Any]:
    if ln is None:
        return {prefix: None}
    if isinstance(ln, RMSNorm):
        return {f"{prefix}.type": "rms",
                **{f"{prefix}.{name}": getattr(ln, name) for name in ("mode", "eps", "scale")}}
    return {f"{prefix}.{name}": getattr(ln, name)
            for name in ("mode", "variance", "eps", "scale", "shift")}
