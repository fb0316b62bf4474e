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
* ``masked=True``: tokens carry positions :math:`s\in[0,1]`; a query at position
  :math:`s` only attends to tokens with :math:`s_j \le s`.

Parameters ``Q``, ``K``, ``V`` and ``W_O`` are arrays, callables ``t -> array``, or
:class:`Layers` tables (piecewise constant in ``t``, one matrix per layer); the biases
``b_Q``, ``b_K``, ``b_V``, ``b_O`` are vectors, callables or :class:`Layers` tables of shape
``(L, 1, n)``.
:meth:`Attention.at` freezes everything at one time into an :class:`AttentionParams`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from dataclasses import replace as _dc_replace
from typing import Any, Callable, Union

import numpy as np

from .errors import ArgumentError, ArgumentTypeError
from .validation import matrix, positive, real_array, scalar
from .validation import type_name as _what

__all__ = [
    "BIAS_RULES",
    "Attention",
    "AttentionParams",
    "Head",
    "Kind",
    "KINDS",
    "Layers",
    "register_kind",
    "score_head",
]

ArrayLike = Any
#: names of the optional bias vectors of an :class:`Attention`
_BIASES = ("b_Q", "b_K", "b_V", "b_O")
#: values of :attr:`Kind.bias_rule`
BIAS_RULES = ("keep", "drop_key", "drop_both", "difference")
Param = Union[np.ndarray, Callable[[float], ArrayLike], "Layers"]


# --------------------------------------------------------------------------- kinds
@dataclass(frozen=True)
class Kind:
    r"""Registry entry describing one attention variant.

    Attributes
    ----------
    name : str
        Registry key, e.g. ``"softmax"``.
    normalized : bool
        Whether each query's attention weights sum to one (a single token with
        ``V = I`` is then a fixed point).
    affine_on_gaussians : bool
        Whether the field of a Gaussian measure is affine in ``x`` (so the
        Gaussian module has closed-form moment ODEs for it).
    maskable : bool
        Whether a causal (masked) version is defined.
    description : str
        One line with the formula.
    bias_rule : {"keep", "drop_key", "drop_both", "difference"}, default "keep"
        Which parts of the query and key biases the kind's weights cannot see; they are
        removed exactly before the scores are formed (:func:`score_head`), so that a huge
        bias that cancels mathematically cannot spoil the field by rounding.  With the
        biased score :math:`\langle Qx + b_Q, Ky + b_K\rangle = \langle Qx + b_Q, Ky\rangle
        + \langle Qx + b_Q, b_K\rangle`:

        * ``"keep"``: both biases are used as given (no cancellation assumed).
        * ``"drop_key"``: the weights are invariant under adding to the score any function
          of the query alone (a kernel :math:`e^{\beta s}` normalised per query row:
          softmax); :math:`\langle Qx + b_Q, b_K\rangle` is such a term, so ``b_K`` is dropped.
        * ``"drop_both"``: invariant under adding a function of the query alone *and* one of
          the key alone (the Sinkhorn coupling: they are absorbed by the two potentials);
          :math:`\langle b_Q, Ky + b_K\rangle` is a function of the key, so ``b_Q`` and
          ``b_K`` are both dropped.
        * ``"difference"``: the kernel depends on :math:`(Qx + b_Q) - (Ky + b_K)` only
          (``l2``); ``b_Q - b_K`` replaces ``b_Q`` and ``b_K`` is dropped.
    """

    name: str
    normalized: bool
    affine_on_gaussians: bool
    maskable: bool
    description: str
    bias_rule: str = "keep"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ArgumentTypeError(f"Kind: name must be a string, got {self.name!r:.60}")
        if not self.name:
            raise ArgumentError("Kind: name must be a non-empty string")
        for flag in ("normalized", "affine_on_gaussians", "maskable"):
            value = getattr(self, flag)
            if not isinstance(value, (bool, np.bool_)):
                raise ArgumentTypeError(f"Kind {self.name!r}: {flag} must be a bool, got "
                                        f"{value!r:.60}")
            object.__setattr__(self, flag, bool(value))
        if not isinstance(self.description, str):
            raise ArgumentTypeError(f"Kind {self.name!r}: description must be a string, got "
                                    f"{type(self.description).__name__}")
        if not isinstance(self.bias_rule, str) or self.bias_rule not in BIAS_RULES:
            raise ArgumentError(f"Kind {self.name!r}: bias_rule must be one of "
                                f"{list(BIAS_RULES)}, got {self.bias_rule!r:.60}")


#: The registry of attention kinds, name -> :class:`Kind` (:func:`register_kind` adds one).
KINDS: dict[str, Kind] = {}
#: Names of the kinds shipped with the package (:func:`register_kind` never replaces them).
_BUILTIN: set[str] = set()


def register_kind(kind: Kind | str, spec: Kind | None = None, *,
                  replace: bool = False) -> Kind:
    """Add an attention variant to the registry.

    Its head field goes in :data:`transformer_pde.fields.HEAD_FIELDS` under the same name
    (:func:`transformer_pde.fields.register_head_field`).

    Parameters
    ----------
    kind : Kind or str
        The entry (``register_kind(Kind("mine", ...))``), or its name followed by the entry
        (``register_kind("mine", Kind("mine", ...))``; the names must agree).
    spec : Kind, optional
        The entry, when ``kind`` is its name.
    replace : bool, default False
        Allow replacing a kind registered earlier by the user.  Registering an entry equal
        to the one already registered is always a no-op.

    Returns
    -------
    Kind
        The registered entry.

    Raises
    ------
    ArgumentTypeError
        The entry is not a :class:`Kind` (or the name not a string).
    ArgumentError
        The name is a kind shipped with the package (these are never replaced), the name
        is taken and ``replace`` is False, or the name and ``Kind.name`` differ.
    """
    if not isinstance(replace, (bool, np.bool_)):
        raise ArgumentTypeError(f"register_kind: replace must be a bool, got {replace!r:.60}")
    if isinstance(kind, str):
        if not isinstance(spec, Kind):
            raise ArgumentTypeError(
                f"register_kind({kind!r}, spec): spec must be a transformer_pde.Kind, got "
                f"{_what(spec)}")
        if spec.name != kind:
            raise ArgumentError(f"register_kind: the name {kind!r} differs from the Kind's "
                                f"name {spec.name!r}")
        kind = spec
    elif spec is not None:
        raise ArgumentTypeError("register_kind: pass a Kind, or a name and a Kind "
                                f"(the first argument is a {type(kind).__name__})")
    if not isinstance(kind, Kind):
        raise ArgumentTypeError(f"register_kind: kind must be a transformer_pde.Kind, got "
                                f"{_what(kind)}")
    old = KINDS.get(kind.name)
    if old is not None and old != kind:
        if kind.name in _BUILTIN:
            raise ArgumentError(f"register_kind: {kind.name!r} is a built-in attention kind "
                                "and cannot be replaced; register yours under another name")
        if not replace:
            raise ArgumentError(f"register_kind: kind {kind.name!r} is already registered; "
                                "pass replace=True to replace it")
    KINDS[kind.name] = kind
    return kind


for _k in (
    Kind("softmax", True, True, True,
         "sum_j w_j e^{b s(x,x_j)} V x_j / sum_j w_j e^{b s(x,x_j)}", "drop_key"),
    Kind("linear", False, True, True, "sum_j w_j b s(x,x_j) V x_j"),
    Kind("l2", True, True, True,
         "kernel exp(-l2_beta |Qx - Ky|^2), normalised like softmax", "difference"),
    Kind("sinkhorn", True, True, False,
         "doubly stochastic entropic-OT self-coupling density, cost -b s, regularisation eps",
         "drop_both"),
    Kind("sigmoid", False, False, True, "sum_j w_j sigmoid(b s(x,x_j)) V x_j"),
    Kind("relu", False, False, True, "sum_j w_j relu(b s(x,x_j)) V x_j"),
    Kind("exp", False, False, True, "sum_j w_j exp(b s(x,x_j)) V x_j (unnormalised)"),
):
    register_kind(_k)

# softmax-free kinds of Cao 2021, "Choose a Transformer: Fourier or Galerkin";
# head fields in fields.py, per-token layer norm LN with eps = blocks.SOFTMAX_FREE_LN_EPS
register_kind(Kind("galerkin", False, False, True,
                   "sum_j w_j b <Qx, LN(K x_j)> LN(V x_j)  (LN per token over k features)"))
register_kind(Kind("fourier", False, False, True,
                   "sum_j w_j b <LN(Qx), LN(K x_j)> V x_j  (LN per token over k features)"))
_BUILTIN.update(KINDS)


# --------------------------------------------------------------------------- layers
class Layers:
    r"""Piecewise-constant table of per-layer matrices, usable as ``Q``, ``K``, ``V`` or ``W_O``.

    ``Layers(values, layer_time=h, t0=t0)`` is the function of time
    :math:`t \mapsto \text{values}[\ell]` for :math:`t \in [t_0 + \ell h, t_0 + (\ell+1) h)`,
    clamped to the first / last layer outside :math:`[t_0, t_0 + L h)`.  With the default
    ``layer_time = 1`` and Euler steps of size 1, step ``l`` uses layer ``l``: a stack of
    ``L`` distinct residual attention layers.

    Parameters
    ----------
    values : array_like, shape (L, r, c)
        One matrix per layer.
    layer_time : float, default 1.0
        Duration of each layer (> 0).
    t0 : float, default 0.0
        Start time of layer 0.

    Examples
    --------
    >>> import numpy as np
    >>> Qs = Layers(np.stack([np.eye(2), 2 * np.eye(2)]))
    >>> [float(Qs(t)[0, 0]) for t in (0.5, 1.0, 7.0)]  # layer 1 from t = 1; clamped after t = 2
    [1.0, 2.0, 2.0]
    >>> Qs.index(1.0), Qs.index(1.0, left=True)  # right-continuous; the left limit is layer 0
    (1, 0)
    """

    # tolerance so that t = l * layer_time computed in floating point maps to layer l
    _TOL = 1e-9

    def __init__(self, values: ArrayLike, *, layer_time: float = 1.0, t0: float = 0.0):
        arr = np.array(real_array("Layers: values", values), dtype=float)
        if arr.ndim != 3 or arr.shape[0] < 1:
            raise ArgumentError(
                f"Layers: values must have shape (L, rows, cols) with L >= 1, got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ArgumentError("Layers: values contain NaN or inf")
        layer_time = positive("Layers: layer_time", layer_time)
        t0 = scalar("Layers: t0", t0)
        arr.setflags(write=False)
        self.values = arr
        self.layer_time = layer_time
        self.t0 = t0

    @property
    def n_layers(self) -> int:
        """Number of layers ``L``."""
        return self.values.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of one layer's matrix."""
        return self.values.shape[1:]  # type: ignore[return-value]

    def index(self, t: float, *, left: bool = False) -> int:
        """Layer index in use at time ``t``.

        The table is right-continuous: at a boundary ``t = t0 + l h`` layer ``l`` is used.
        ``left=True`` gives the left limit instead (layer ``l - 1`` at that boundary); the
        integrators use it for stages evaluated at the right end of a step, so that a step
        over ``[l h, (l+1) h]`` only ever sees layer ``l``.
        """
        u = (float(t) - self.t0) / self.layer_time
        if left:
            i = math.ceil(u - self._TOL) - 1
        else:
            i = math.floor(u + self._TOL)
        return min(max(i, 0), self.n_layers - 1)

    def __call__(self, t: float, *, left: bool = False) -> np.ndarray:
        return self.values[self.index(t, left=left)]

    def __repr__(self) -> str:
        return (f"Layers(L={self.n_layers}, shape={self.shape}, "
                f"layer_time={self.layer_time}, t0={self.t0})")


# --------------------------------------------------------------------------- frozen params
@dataclass(frozen=True)
class Head:
    r"""One attention head frozen at a time.

    Attributes
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices (score :math:`\langle Qx, Ky\rangle`; temperature not included).
    V : ndarray, shape (c, d)
        Value matrix; the head writes :math:`V\,(\text{average})` into ``rows``.
    rows : slice
        Output coordinates this head writes (``slice(0, d)`` for a single head).
    bQ, bK : ndarray, shape (k,), or None
        Query and key biases: the score is :math:`\langle Qx + b_Q, Ky + b_K\rangle`.
    bV : ndarray, shape (c,), or None
        Value bias: the head averages :math:`Vy + b_V`.
    """

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    rows: slice
    bQ: np.ndarray | None = None
    bK: np.ndarray | None = None
    bV: np.ndarray | None = None

    @property
    def has_bias(self) -> bool:
        """Whether any of the query, key or value maps is affine rather than linear."""
        return self.bQ is not None or self.bK is not None or self.bV is not None

    @property
    def A(self) -> np.ndarray:
        r""":math:`A_h = K_h^\top Q_h` (d×d), so that :math:`s(x, y) = y^\top A_h x`."""
        return self.K.T @ self.Q


def score_head(kind: Kind | str, head: Head) -> Head:
    r"""``head`` with the bias parts that the weights of ``kind`` cannot see removed exactly.

    The biased score is
    :math:`\langle Qx + b_Q, Ky + b_K\rangle = \langle Qx + b_Q, Ky\rangle + \langle Qx + b_Q, b_K\rangle`,
    and, by :attr:`Kind.bias_rule`:

    * ``"drop_key"`` (softmax): the second term depends on the query only and cancels in the
      per-query normalisation, so ``b_K`` is dropped;
    * ``"drop_both"`` (sinkhorn): terms depending on the query only or on the key only are
      absorbed by the two Sinkhorn potentials; :math:`\langle b_Q, Ky + b_K\rangle` depends on
      the key only, so ``b_Q`` and ``b_K`` are both dropped;
    * ``"difference"`` (l2): the kernel sees :math:`(Qx + b_Q) - (Ky + b_K)` only, so ``b_Q``
      becomes :math:`b_Q - b_K` and ``b_K`` is dropped (the head is returned unchanged if
      that difference overflows);
    * ``"keep"``: ``head`` itself.

    The field is mathematically unchanged; numerically, a huge cancelling bias (say
    :math:`|b_K| = 10^{16}`) no longer swamps :math:`Ky` by rounding.  Every head field
    receives heads prepared by this function (:attr:`AttentionParams.score_heads`), so
    every backend sees the same scores.
    """
    entry = KINDS[kind] if isinstance(kind, str) else kind
    rule = entry.bias_rule
    if rule == "keep" or (head.bQ is None and head.bK is None):
        return head
    if rule == "drop_key":
        bQ = head.bQ
    elif rule == "drop_both":
        bQ = None
    else:  # "difference"
        if head.bK is None:
            return head
        with np.errstate(over="ignore"):
            bQ = -head.bK if head.bQ is None else head.bQ - head.bK
        if not np.all(np.isfinite(bQ)):
            return head
    return _dc_replace(head, bQ=bQ, bK=None)


@dataclass(frozen=True)
class AttentionParams:
    """All parameters of an :class:`Attention` evaluated at one time ``t``.

    ``heads`` holds one :class:`Head` per head; ``W_O`` is ``None`` for the identity.
    The field is ``W_O @ concat_h(head_h output) + b_O`` (``b_O`` ``None`` for no bias).
    """

    kind: str
    d: int
    heads: tuple[Head, ...]
    W_O: np.ndarray | None
    beta: float
    eps: float
    l2_beta: float
    masked: bool
    t: float = 0.0
    b_O: np.ndarray | None = None

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    @property
    def has_bias(self) -> bool:
        """Whether any head map or the output map carries a bias vector."""
        return self.b_O is not None or any(h.has_bias for h in self.heads)

    @property
    def score_heads(self) -> tuple[Head, ...]:
        """The heads prepared for evaluation: :func:`score_head` of each, for this kind."""
        entry = KINDS[self.kind]
        return tuple(score_head(entry, h) for h in self.heads)


# --------------------------------------------------------------------------- validation
def _check_vector(name: str, value: ArrayLike, t: float | None = None) -> np.ndarray:
    """A finite real bias vector; shapes (n,), (1, n) and (n, 1) are accepted and flattened."""
    where = "" if t is None else f" (evaluated at t={t})"
    if isinstance(value, type):
        raise ArgumentTypeError(f"{name}{where} must be a real vector, got {_what(value)}")
    arr = real_array(f"{name}{where}", value, what="vector")
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.ravel()
    if arr.ndim != 1 or arr.size == 0:
        raise ArgumentError(f"{name}{where} must be a non-empty vector, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ArgumentError(f"{name}{where} contains NaN or inf")
    return arr


def _check_scores(Q: np.ndarray, K: np.ndarray, t: float, head: int | None) -> None:
    r"""Refuse finite Q, K whose product :math:`K^\top Q` overflows (infinite scores).

    Cheap bound first (:math:`|K^\top Q|_{ij} \le k\,\max|K|\,\max|Q|`): the product is
    formed only when that bound passes 1e300."""
    with np.errstate(over="ignore", invalid="ignore"):
        bound = float(np.abs(Q).max()) * float(np.abs(K).max()) * Q.shape[0]
        if bound < 1e300:
            return
        A = K.T @ Q
    if not np.all(np.isfinite(A)):
        which = "" if head is None else f" of head {head}"
        raise ArgumentError(
            f"Q and K{which} (t={t}) are finite but K^T Q overflows float64 (entries beyond "
            "1.8e308): every score <Qx, Ky> would be infinite; rescale Q and K")


# --------------------------------------------------------------------------- Attention
@dataclass(frozen=True, eq=False)
class Attention:
    r"""Specification of an attention velocity field :math:`\Gamma_\mu`.

    Parameters
    ----------
    kind : {"softmax", "linear", "l2", "sinkhorn", "sigmoid", "relu", "exp", "galerkin", "fourier"}
        Attention variant (see :data:`KINDS`).  With :math:`s = \beta\langle Qx, Ky\rangle`:

        * ``softmax``: :math:`\Gamma(x) = \sum_j w_j e^{s(x,x_j)} V x_j / \sum_j w_j e^{s(x,x_j)}`
        * ``linear``: :math:`\sum_j w_j s(x,x_j) V x_j`
        * ``l2``: kernel :math:`e^{-\beta' |Qx - Kx_j|^2}` (:math:`\beta'` = ``l2_beta``), normalised
          like softmax; ``beta`` must stay 1 (``l2_beta`` is this kind's temperature)
        * ``sinkhorn``: density of the entropic OT self-coupling of :math:`\mu` for cost
          :math:`-s` and regularisation ``eps`` (doubly stochastic)
        * ``sigmoid`` / ``relu`` / ``exp``: :math:`\sum_j w_j \varphi(s(x,x_j)) V x_j`, unnormalised
        * ``galerkin`` / ``fourier``: softmax-free attention of Cao (2021), linear attention with
          per-token layer normalisation of keys and values (Galerkin) or queries and keys
          (Fourier), layer-norm epsilon 1e-5 (see :mod:`transformer_pde.fields`)
    Q, K : array (k, d), callable ``t -> array`` or :class:`Layers`
        Query and key matrices.  With ``heads > 1`` they must be d×d.
    V : array (d, d), callable or :class:`Layers`
        Value matrix.
    heads : int, default 1
        Number of heads :math:`H`; must divide :math:`d`.
    masked : bool, default False
        Causal attention over token positions (not available for ``sinkhorn``).
    beta : float, default 1.0
        Temperature multiplying the score.
    eps : float, default 1.0
        Entropic regularisation of ``sinkhorn`` (> 0).
    l2_beta : float, default 0.5
        :math:`\beta'` of the ``l2`` kernel (> 0).
    W_O : array (d, d), callable, :class:`Layers` or None
        Output projection applied to the concatenated heads (identity if None).
    b_Q, b_K : array (k,), callable, :class:`Layers` of shape (L, 1, k), or None
        Query and key biases (``k`` = rows of ``Q``; ``d`` with heads): the score becomes
        :math:`\beta\langle Qx + b_Q, Ky + b_K\rangle`.  ``b_K`` only adds
        :math:`\beta\langle Qx + b_Q, b_K\rangle`, the same for every key: for softmax it
        cancels, for sinkhorn ``b_Q`` cancels too, and l2 sees only :math:`b_Q - b_K`.  The
        cancelling parts are removed exactly before any score is formed
        (:attr:`Kind.bias_rule`, :func:`score_head`), so a huge cancelling bias cannot spoil
        the field by rounding; the parameters themselves are kept as given.
    b_V : array (d,), callable, :class:`Layers` or None
        Value bias: each head averages :math:`V_h y + b_{V,h}`.
    b_O : array (d,), callable, :class:`Layers` or None
        Output bias added after ``W_O``.  A BERT self-attention sub-layer is ``kind="softmax"``,
        ``heads=H``, ``beta=1/sqrt(d/H)`` with all four biases (see docs/conventions.md).

    Raises
    ------
    ArgumentTypeError
        A parameter of the wrong type: ``None`` for ``Q``, ``K`` or ``V``, strings,
        complex matrices, biases or numbers, a bool where a number is expected, a class
        where an instance or array is expected.
    ArgumentError
        On unknown kind, malformed or non-finite matrices or biases, biases of the wrong
        length, heads not dividing ``d``, non-positive ``eps`` / ``l2_beta``, masked
        sinkhorn, finite ``Q``, ``K`` whose product overflows.

    Examples
    --------
    >>> import numpy as np
    >>> att = Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=2.0)
    >>> att.d, att.at(0.0).heads[0].A.tolist()
    (2, [[1.0, 0.0], [0.0, 1.0]])
    """

    kind: str
    Q: Param
    K: Param
    V: Param
    heads: int = 1
    masked: bool = False
    beta: float = 1.0
    eps: float = 1.0
    l2_beta: float = 0.5
    W_O: Param | None = None
    b_Q: Param | None = None
    b_K: Param | None = None
    b_V: Param | None = None
    b_O: Param | None = None
    d: int = field(init=False)
    time_dependent: bool = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise ArgumentTypeError(
                f"kind must be one of {sorted(KINDS)}, got {_what(self.kind)}")
        if self.kind not in KINDS:
            raise ArgumentError(
                f"kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if isinstance(self.heads, (bool, np.bool_)) or \
                not isinstance(self.heads, (int, np.integer)):
            raise ArgumentTypeError(f"heads must be a positive integer, got {self.heads!r:.60}")
        if self.heads < 1:
            raise ArgumentError(f"heads must be >= 1, got {self.heads}")
        if not isinstance(self.masked, (bool, np.bool_)):
            raise ArgumentTypeError(f"masked must be a bool, got {self.masked!r:.60}")
        set_ = object.__setattr__
        set_(self, "heads", int(self.heads))
        set_(self, "masked", bool(self.masked))
        set_(self, "beta", scalar("beta", self.beta))
        set_(self, "eps", positive("eps", self.eps))
        set_(self, "l2_beta", positive("l2_beta", self.l2_beta))
        if self.masked and not KINDS[self.kind].maskable:
            raise ArgumentError(
                f"masked=True is not defined for kind={self.kind!r}: no doubly-stochastic "
                "masked coupling exists; use an unmasked sinkhorn or a maskable kind")
        if self.kind == "l2" and self.beta != 1.0:
            raise ArgumentError(
                "beta must be 1.0 for kind='l2'; its temperature is l2_beta "
                f"(kernel exp(-l2_beta |Qx - Ky|^2)), got beta={self.beta}")
        dynamic = False
        for name in ("Q", "K", "V", "W_O"):
            value = getattr(self, name)
            if value is None:
                if name != "W_O":
                    raise ArgumentTypeError(f"{name} must be a matrix, a callable of t or "
                                            "Layers, got None")
                continue
            if isinstance(value, type):
                raise ArgumentTypeError(f"{name} must be a matrix, a callable of t or Layers, "
                                        f"got {_what(value)}")
            if isinstance(value, Layers) or callable(value):
                dynamic = True
            else:
                set_(self, name, _readonly(matrix(name, value)))
        for name in _BIASES:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, type):
                raise ArgumentTypeError(f"{name} must be a vector, a callable of t or Layers, "
                                        f"got {_what(value)}")
            if isinstance(value, Layers) or callable(value):
                dynamic = True
            else:
                set_(self, name, _readonly(_check_vector(name, value)))
        set_(self, "time_dependent", dynamic)
        Q0 = self._matrix("Q", 0.0)
        set_(self, "d", Q0.shape[1])
        P0 = self.at(0.0)  # validates shapes at t = 0
        if self.kind in ("galerkin", "fourier") and P0.heads[0].Q.shape[0] < 2:
            raise ArgumentError(
                f"kind={self.kind!r} normalises each token over the head's k features and "
                f"needs k >= 2, got k={P0.heads[0].Q.shape[0]} (Q has shape {Q0.shape}"
                f"{f', heads={self.heads}' if self.heads > 1 else ''})")

    # ------------------------------------------------------------------ evaluation
    def _matrix(self, name: str, t: float, left: bool = False) -> np.ndarray:
        value = getattr(self, name)
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, Layers):
            return value(t, left=left)
        return matrix(name, value(t), t)

    def _bias(self, name: str, n: int, t: float, left: bool) -> np.ndarray | None:
        value = getattr(self, name)
        if value is None:
            return None
        if isinstance(value, Layers):
            v = value(t, left=left)
            if v.shape[0] != 1:
                raise ArgumentError(f"{name}: a Layers table of biases must have shape "
                                    f"(L, 1, n), got {value.values.shape}")
            v = v[0]
        elif isinstance(value, np.ndarray):
            v = value
        else:
            v = _check_vector(name, value(t), t)
        if v.shape != (n,):
            raise ArgumentError(f"{name} must have {n} entries, got shape {v.shape} (t={t})")
        return v

    @property
    def has_bias(self) -> bool:
        """Whether any of ``b_Q``, ``b_K``, ``b_V``, ``b_O`` is set (affine attention maps)."""
        return any(getattr(self, n) is not None for n in _BIASES)

    @property
    def tables(self) -> list[Layers]:
        """Every piecewise-constant :class:`Layers` parameter (matrices and biases)."""
        return [v for n in ("Q", "K", "V", "W_O") + _BIASES
                if isinstance(v := getattr(self, n), Layers)]

    def at(self, t: float = 0.0, *, left: bool = False) -> AttentionParams:
        """Freeze every parameter at time ``t`` (validating shapes) into :class:`AttentionParams`.

        ``left=True`` takes left limits of :class:`Layers` tables at layer boundaries
        (callables are assumed continuous and simply evaluated at ``t``)."""
        t = scalar("t", t)
        Q = self._matrix("Q", t, left)
        K = self._matrix("K", t, left)
        V = self._matrix("V", t, left)
        d = Q.shape[1]
        if getattr(self, "d", d) != d:
            raise ArgumentError(f"Q at t={t} has {d} columns but the attention was built with d={self.d}")
        if K.shape != Q.shape:
            raise ArgumentError(f"K must have the shape of Q {Q.shape}, got {K.shape} (t={t})")
        if V.shape != (d, d):
            raise ArgumentError(f"V must have shape (d, d) = {(d, d)}, got {V.shape} (t={t})")
        H = self.heads
        if H > 1:
            if d % H:
                raise ArgumentError(f"heads={H} must divide the dimension d={d}")
            if Q.shape != (d, d):
                raise ArgumentError(
                    f"with heads={H}, Q and K must be d x d = {(d, d)}, got {Q.shape}")
        bQ = self._bias("b_Q", Q.shape[0], t, left)
        bK = self._bias("b_K", Q.shape[0], t, left)
        bV = self._bias("b_V", d, t, left)
        b_O = self._bias("b_O", d, t, left)
        if H > 1:
            k = d // H

            def blk(v, h):
                return None if v is None else v[h * k:(h + 1) * k]

            heads = tuple(
                Head(Q[h * k:(h + 1) * k], K[h * k:(h + 1) * k], V[h * k:(h + 1) * k],
                     slice(h * k, (h + 1) * k), blk(bQ, h), blk(bK, h), blk(bV, h))
                for h in range(H))
        else:
            heads = (Head(Q, K, V, slice(0, d), bQ, bK, bV),)
        for h, head in enumerate(heads):
            _check_scores(head.Q, head.K, t, h if H > 1 else None)
        W_O = None
        if self.W_O is not None:
            W_O = self._matrix("W_O", t, left)
            if W_O.shape != (d, d):
                raise ArgumentError(f"W_O must have shape (d, d) = {(d, d)}, got {W_O.shape}")
        return AttentionParams(self.kind, d, heads, W_O, self.beta, self.eps,
                               self.l2_beta, self.masked, float(t), b_O)

    def replace(self, **changes: Any) -> "Attention":
        """A copy with some constructor arguments changed (validated again)."""
        args = {n: getattr(self, n) for n in
                ("kind", "Q", "K", "V", "heads", "masked", "beta", "eps", "l2_beta", "W_O")
                + _BIASES}
        args.update(changes)
        return Attention(**args)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain description (scalars and arrays) for saving; callables become ``None``
        with ``"serialisable": False``; :class:`Layers` are stored with their table."""
        out: dict[str, Any] = {"kind": self.kind, "heads": self.heads, "masked": self.masked,
                               "beta": self.beta, "eps": self.eps, "l2_beta": self.l2_beta,
                               "serialisable": True}
        for name in ("Q", "K", "V", "W_O") + _BIASES:
            v = getattr(self, name)
            if v is None and name in _BIASES:
                continue  # absent biases are not stored (files without them stay as they were)
            if v is None or isinstance(v, np.ndarray):
                out[name] = v
            elif isinstance(v, Layers):
                out[name] = {"layers": v.values, "layer_time": v.layer_time, "t0": v.t0}
            else:
                out[name] = None
                out["serialisable"] = False
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Attention":
        """Inverse of :meth:`to_dict` (raises if the spec held callables)."""
        if not data.get("serialisable", True):
            raise ArgumentError("this attention held callables of time and cannot be rebuilt")
        kw = {}
        for name in ("Q", "K", "V", "W_O") + _BIASES:
            v = data.get(name)
            if isinstance(v, dict):
                v = Layers(v["layers"], layer_time=v["layer_time"], t0=v["t0"])
            kw[name] = v
        return cls(data["kind"], kw["Q"], kw["K"], kw["V"], heads=int(data["heads"]),
                   masked=bool(data["masked"]), beta=float(data["beta"]),
                   eps=float(data["eps"]), l2_beta=float(data["l2_beta"]), W_O=kw["W_O"],
                   **{n: kw[n] for n in _BIASES})

    def __repr__(self) -> str:
        extra = "" if not self.time_dependent else ", time-dependent"
        if self.has_bias:
            extra += ", biases=" + "/".join(n for n in _BIASES if getattr(self, n) is not None)
        return (f"Attention(kind={self.kind!r}, d={self.d}, heads={self.heads}, "
                f"masked={self.masked}, beta={self.beta}, eps={self.eps}, "
                f"l2_beta={self.l2_beta}{extra})")


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=float)
    a.setflags(write=False)
    return a
