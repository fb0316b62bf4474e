r"""The :class:`Attention` specification: parameters, their validation and :meth:`Attention.at`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Union

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..validation import integer, matrix, positive, real_array, scalar
from ..validation import type_name as _what
from .heads import AttentionParams, Head
from .kinds import KINDS
from .alibi import alibi_slopes, check_alibi
from .layers import Layers
from .rotary import Rotary

__all__ = ["Attention"]

ArrayLike = Any
#: names of the optional bias vectors of an :class:`Attention`
_BIASES = ("b_Q", "b_K", "b_V", "b_O")
#: kinds whose kernel is exponential in the score, where ``shift`` is defined
SHIFT_KINDS = ("exp", "softmax", "l2", "sinkhorn")
#: kinds where a shift is an exact constant factor of the field (unnormalised kernel)
SCALED_BY_SHIFT = ("exp",)
#: kinds that normalise projected queries or keys per token, where rotary is not defined
NO_ROTARY_KINDS = ("galerkin", "fourier")
Param = Union[np.ndarray, Callable[[float], ArrayLike], "Layers"]


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
    window : int or None, default None
        Sliding-window causal attention (requires ``masked=True``): a token sees only the
        ``window`` keys ending at its causal end, the last ``window`` tokens at or before
        its position, in position order inside its segment (itself included; tokens at
        one position see the same keys).  ``None``: every earlier token
        (:mod:`~transformer_pde.attention.visibility`).
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
    shift : float, default 0.0
        Constant subtracted from the exponent of exponential kernels:
        :math:`e^{s} \to e^{s - c}` with :math:`c` = ``shift``.  For ``exp`` the field is
        multiplied by :math:`e^{-c}` exactly (the same trajectories, time rescaled by
        :math:`e^{c}`), computed inside the exponent so that it stays finite where
        :math:`e^{s}` alone would overflow: on the unit sphere with :math:`Q = K = I`,
        ``shift=beta`` keeps every kernel value in :math:`[e^{-2\beta}, 1]`.  For the
        normalised kinds ``softmax``, ``l2`` and ``sinkhorn`` a constant shift cancels in
        the normalisation: it is accepted and changes nothing.  The other kinds have no
        exponential kernel and refuse a non-zero shift.
    rotary : Rotary or None, default None
        Rotary positions (:class:`~transformer_pde.attention.Rotary`): the projected
        queries and keys of each head are rotated by their tokens' positions, the score
        becomes :math:`\beta\langle R(p_x)(Q_h x + b_Q), R(p_y)(K_h y + b_K)\rangle` and
        depends on the positions through :math:`p_y - p_x` only.  Every field evaluation
        then needs ``positions``.  With rotary no bias cancels (the rotation of
        :math:`b_K` depends on the key's position): all biases are kept.  Not defined for
        ``galerkin`` / ``fourier`` (they normalise the projections per token).
    kv_heads : int or None, default None
        Grouped key/value heads :math:`G` (grouped-query attention): :math:`G` divides
        ``heads`` :math:`= H`, ``K`` and ``V`` (and ``b_K``, ``b_V``) have :math:`G m`
        rows (:math:`m = d/H`), and query head :math:`h` uses key/value head
        :math:`\lfloor h / (H/G) \rfloor` (consecutive query heads share one).  ``None``
        means :math:`G = H` (one key/value head per query head); :meth:`at` expands the
        shared maps, so every kind and backend supports it.
    alibi : float, array (H,) or None, default None
        ALiBi slopes :math:`\lambda_h \ge 0` (Press, Smith & Lewis, arXiv 2108.12409):
        one for every head, or one per query head.  The score of head :math:`h` becomes
        :math:`\beta\langle Q_h x_i + b_Q, K_h x_j + b_K\rangle - \lambda_h |p_i - p_j|`
        with the token positions :math:`p \in [0, 1]` (then required by every field
        evaluation, as for masks): the kernel gains the factor
        :math:`e^{-\lambda_h |p_i - p_j|}`.  Defined for ``softmax``, ``exp`` and ``l2``;
        combines with ``masked``, ``window``, heads, ``kv_heads``, biases, ``rotary``,
        segments and weights, on every backend, exact to round-off however large
        :math:`\lambda` (:mod:`~transformer_pde.attention.alibi`).

    Raises
    ------
    ArgumentTypeError
        A parameter of the wrong type: ``None`` for ``Q``, ``K`` or ``V``, strings,
        complex matrices, biases or numbers, a bool where a number is expected, a class
        where an instance or array is expected.
    ArgumentError
        On unknown kind, malformed or non-finite matrices or biases, biases of the wrong
        length, heads not dividing ``d``, non-positive ``eps`` / ``l2_beta``, masked
        sinkhorn, finite ``Q``, ``K`` whose product overflows, a non-finite ``shift`` or a
        non-zero one for a kind without an exponential kernel, ``kv_heads`` not dividing
        ``heads`` or ``K`` / ``V`` without its :math:`G m` rows, ``rotary`` with a kind
        that normalises its projections or a head width it cannot rotate, ``window`` below
        1, not an integer or without ``masked=True``, ``alibi`` with a kind other than
        ``softmax``, ``exp``, ``l2``, negative or not one slope per head.

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
    shift: float = 0.0
    rotary: Rotary | None = None
    kv_heads: int | None = None
    window: int | None = None
    alibi: float | ArrayLike | None = None
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
        if self.window is not None:
            set_(self, "window", integer("window", self.window, minimum=1))
            if not self.masked:
                raise ArgumentError(f"window={self.window} is a sliding causal window and "
                                    "needs masked=True")
        set_(self, "beta", scalar("beta", self.beta))
        set_(self, "eps", positive("eps", self.eps))
        set_(self, "l2_beta", positive("l2_beta", self.l2_beta))
        set_(self, "shift", scalar("shift", self.shift) + 0.0)  # -0.0 -> 0.0
        if self.shift != 0.0 and self.kind not in SHIFT_KINDS:
            raise ArgumentError(
                f"shift={self.shift:g} is defined only for the exponential kernels "
                f"{list(SHIFT_KINDS)}; kind={self.kind!r} has none (use shift=0)")
        self._check_groups()
        set_(self, "alibi", check_alibi(self.alibi, self.kind, self.heads))
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

    def _check_groups(self) -> None:
        """Validate ``rotary`` and ``kv_heads`` (types, kinds, divisibility)."""
        if self.rotary is not None:
            if not isinstance(self.rotary, Rotary):
                raise ArgumentTypeError(f"rotary must be a transformer_pde.attention.Rotary or "
                                        f"None, got {_what(self.rotary)}")
            if self.kind in NO_ROTARY_KINDS:
                raise ArgumentError(
                    f"rotary is not defined for kind={self.kind!r}: it normalises the projected "
                    "queries or keys per token; use a kind whose score is <q, k>")
        G = self.kv_heads
        if G is None:
            return
        if isinstance(G, (bool, np.bool_)) or not isinstance(G, (int, np.integer)):
            raise ArgumentTypeError(f"kv_heads must be a positive integer or None, got "
                                    f"{G!r:.60}")
        if G < 1 or self.heads % G:
            raise ArgumentError(f"kv_heads={G} must be a positive divisor of heads="
                                f"{self.heads} (each key/value head serves heads/kv_heads "
                                "query heads)")
        object.__setattr__(self, "kv_heads", int(G))

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
        (callables are assumed continuous and simply evaluated at ``t``).  With
        ``kv_heads`` every query head gets its group's key and value maps (and biases),
        so the heads of the result look like those of an attention without groups."""
        t = scalar("t", t)
        Q = self._matrix("Q", t, left)
        K = self._matrix("K", t, left)
        V = self._matrix("V", t, left)
        d = Q.shape[1]
        if getattr(self, "d", d) != d:
            raise ArgumentError(f"Q at t={t} has {d} columns but the attention was built with d={self.d}")
        H = self.heads
        if H > 1:
            if d % H:
                raise ArgumentError(f"heads={H} must divide the dimension d={d}")
            if Q.shape != (d, d):
                which = "Q and K" if self.kv_heads is None else "Q"
                raise ArgumentError(
                    f"with heads={H}, {which} must be d x d = {(d, d)}, got {Q.shape}")
        kv_rows = self._check_kv_shapes(Q, K, V, t)
        bQ = self._bias("b_Q", Q.shape[0], t, left)
        bK = self._bias("b_K", kv_rows, t, left)
        bV = self._bias("b_V", V.shape[0], t, left)
        b_O = self._bias("b_O", d, t, left)
        if H > 1:
            k = d // H
            per = H // (self.kv_heads or H)     # query heads per key/value head

            def blk(v, h):
                return None if v is None else v[h * k:(h + 1) * k]

            heads = tuple(
                Head(blk(Q, h), blk(K, h // per), blk(V, h // per), slice(h * k, (h + 1) * k),
                     blk(bQ, h), blk(bK, h // per), blk(bV, h // per))
                for h in range(H))
        else:
            heads = (Head(Q, K, V, slice(0, d), bQ, bK, bV),)
        for h, head in enumerate(heads):
            _check_scores(head.Q, head.K, t, h if H > 1 else None)
        if self.rotary is not None:
            self.rotary.width(heads[0].Q.shape[0])   # the head width can be rotated
        W_O = None
        if self.W_O is not None:
            W_O = self._matrix("W_O", t, left)
            if W_O.shape != (d, d):
                raise ArgumentError(f"W_O must have shape (d, d) = {(d, d)}, got {W_O.shape}")
        return AttentionParams(self.kind, d, heads, W_O, self.beta, self.eps,
                               self.l2_beta, self.masked, float(t), b_O, self.shift,
                               self.rotary, alibi_slopes(self.alibi, H))

    def _check_kv_shapes(self, Q: np.ndarray, K: np.ndarray, V: np.ndarray, t: float) -> int:
        """Check the shapes of ``K`` and ``V`` against ``Q``; return the rows of ``K``."""
        d, H, G = Q.shape[1], self.heads, self.kv_heads
        if G is None or H == 1:
            if K.shape != Q.shape:
                raise ArgumentError(f"K must have the shape of Q {Q.shape}, got {K.shape} (t={t})")
            if V.shape != (d, d):
                raise ArgumentError(f"V must have shape (d, d) = {(d, d)}, got {V.shape} (t={t})")
            return K.shape[0]
        rows = G * (d // H)
        for name, M in (("K", K), ("V", V)):
            if M.shape != (rows, d):
                raise ArgumentError(
                    f"with heads={H} and kv_heads={G}, {name} must have kv_heads * d/heads = "
                    f"{G} * {d // H} rows: shape {(rows, d)}, got {M.shape} (t={t})")
        return rows

    def replace(self, **changes: Any) -> "Attention":
        """A copy with some constructor arguments changed (validated again)."""
        args = {n: getattr(self, n) for n in
                ("kind", "Q", "K", "V", "heads", "masked", "beta", "eps", "l2_beta", "W_O")
                + _BIASES + ("shift", "rotary", "kv_heads", "window", "alibi")}
        args.update(changes)
        return Attention(**args)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain description (scalars and arrays) for saving; callables become ``None``
        with ``"serialisable": False``; :class:`Layers` are stored with their table.
        ``shift`` is stored only when it is not zero, ``rotary`` (as
        ``{"base", "span", "dim", "pairing"}``), ``kv_heads``, ``window`` and ``alibi`` (a
        float or an array of slopes) only when set: the
        descriptions of attentions without them, and the run fingerprints built from them,
        stay as they were."""
        out: dict[str, Any] = {"kind": self.kind, "heads": self.heads, "masked": self.masked,
                               "beta": self.beta, "eps": self.eps, "l2_beta": self.l2_beta,
                               "serialisable": True}
        if self.shift != 0.0:
            out["shift"] = self.shift
        if self.rotary is not None:
            r = self.rotary
            out["rotary"] = {"base": r.base, "span": r.span, "dim": r.dim, "pairing": r.pairing}
        for name in ("kv_heads", "window", "alibi"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
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
        """Inverse of :meth:`to_dict` (raises if the spec held callables); a description
        without ``shift`` has ``shift=0``, one without ``rotary`` / ``kv_heads`` /
        ``window`` / ``alibi`` has ``None``."""
        if not data.get("serialisable", True):
            raise ArgumentError("this attention held callables of time and cannot be rebuilt")
        kw = {}
        for name in ("Q", "K", "V", "W_O") + _BIASES:
            v = data.get(name)
            if isinstance(v, dict):
                v = Layers(v["layers"], layer_time=v["layer_time"], t0=v["t0"])
            kw[name] = v
        rot = data.get("rotary")
        if rot is not None:
            if not isinstance(rot, dict) or set(rot) != {"base", "span", "dim", "pairing"}:
                raise ArgumentError(f"rotary: expected a description with base, span, dim "
                                    f"and pairing, got {rot!r:.80}")
            rot = Rotary(float(rot["base"]), float(rot["span"]),
                         None if rot["dim"] is None else int(rot["dim"]), rot["pairing"])
        kv, window = data.get("kv_heads"), data.get("window")
        return cls(data["kind"], kw["Q"], kw["K"], kw["V"], heads=int(data["heads"]),
                   masked=bool(data["masked"]), beta=float(data["beta"]),
                   eps=float(data["eps"]), l2_beta=float(data["l2_beta"]), W_O=kw["W_O"],
                   shift=data.get("shift", 0.0), rotary=rot,
                   kv_heads=None if kv is None else int(kv),
                   window=None if window is None else int(window), alibi=data.get("alibi"),
                   **{n: kw[n] for n in _BIASES})

    def __repr__(self) -> str:
        extra = "" if not self.time_dependent else ", time-dependent"
        if self.has_bias:
            extra += ", biases=" + "/".join(n for n in _BIASES if getattr(self, n) is not None)
        if self.shift != 0.0:
            extra += f", shift={self.shift}"
        if self.kv_heads is not None:
            extra += f", kv_heads={self.kv_heads}"
        if self.window is not None:
            extra += f", window={self.window}"
        if self.rotary is not None:
            extra += f", rotary={self.rotary!r}"
        if self.alibi is not None:
            a = self.alibi
            extra += f", alibi={a if isinstance(a, float) else a.tolist()}"
        return (f"Attention(kind={self.kind!r}, d={self.d}, heads={self.heads}, "
                f"masked={self.masked}, beta={self.beta}, eps={self.eps}, "
                f"l2_beta={self.l2_beta}{extra})")


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=float)
    a.setflags(write=False)
    return a
