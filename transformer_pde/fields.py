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

:class:`FieldEvaluator` binds an attention, a backend, weights and positions (sorted once
for masked attention; their rotary cosines and sines computed once) and keeps warm-start
state between evaluations.  Rotary positions rotate the projected queries and keys in this
glue, before any primitive.  The weights themselves:
:func:`~transformer_pde.attention.matrix.attention_matrix`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import validation
from .attention import Attention, AttentionParams, Head
from .attention.matrix import attention_matrix
from .attention.rotary import require_positions
from .backends import get_backend
from .backends.ranges import KeyRanges
from .blocks import token_layer_norm
from .errors import ArgumentError, ArgumentTypeError, ScoreOverflowError
from .sinkhorn import SinkhornRecord, SinkhornWarmStart, is_symmetric, sinkhorn_field
from .validation import type_name as _what

__all__ = [
    "FieldContext",
    "FieldEvaluator",
    "HEAD_FIELDS",
    "attention_matrix",
    "register_head_field",
    "velocity",
]

@dataclass
class FieldContext:
    """What a head field needs besides the points: backend arrays and settings."""

    backend: Any
    w: Any                       # (N,) weights on the backend, keys in kernel order
    logw: Any                    # (N,) log-weights (-inf for zero weight)
    limits: Any                  # (M,) visible prefix per query, or None
    sinkhorn_tol: float = 1e-9
    sinkhorn_max_iter: int = 2000
    state: dict = field(default_factory=dict)
    sinkhorn: SinkhornRecord = field(default_factory=SinkhornRecord)
    stage: int | None = None     # index of the evaluation within a fixed-step solver step
    rot_q: Any = None            # RotaryTable of the query positions (rotary attention)
    rot_k: Any = None            # RotaryTable of the key positions, in kernel order


HeadField = Callable[[FieldContext, AttentionParams, int, Head, Any, Any], Any]
HEAD_FIELDS: dict[str, HeadField] = {}


#: kinds whose head fields ship with the package (filled at the end of the built-ins)
_BUILTIN_FIELDS: set[str] = set()


def register_head_field(name: str, *, replace: bool = False) -> Callable[[HeadField], HeadField]:
    """Decorator registering the head field of attention kind ``name``.

    The head fields shipped with the package are never replaced
    (:class:`~transformer_pde.errors.ArgumentError`); a field registered earlier by the
    user is replaced only with ``replace=True``.  ``name`` must be a string and the
    decorated object callable (:class:`~transformer_pde.errors.ArgumentTypeError`).
    """
    if not isinstance(name, str):
        raise ArgumentTypeError(f"register_head_field: name must be a string, got {_what(name)}")
    if not isinstance(replace, (bool, np.bool_)):
        raise ArgumentTypeError(f"register_head_field: replace must be a bool, got "
                                f"{replace!r:.60}")
    if name in _BUILTIN_FIELDS:
        raise ArgumentError(f"register_head_field: {name!r} is a built-in attention kind and "
                            "its head field cannot be replaced; register yours under another "
                            "name")

    def deco(fn: HeadField) -> HeadField:
        if not callable(fn) or isinstance(fn, type):
            raise ArgumentTypeError(f"register_head_field({name!r}): the head field must be a "
                                    f"function, got {_what(fn)}")
        old = HEAD_FIELDS.get(name)
        if old is not None and old is not fn and not replace:
            raise ArgumentError(f"register_head_field: a head field for {name!r} is already "
                                "registered; pass replace=True to replace it")
        HEAD_FIELDS[name] = fn
        return fn
    return deco


def _proj(be, X, M, b=None):
    # the affine map X M^T + b of every row; biases (and rotary positions, _q / _k) are
    # applied here, in the glue, so the backends' primitives (which only see projected
    # q, k, v) need no change
    out = X @ be.asarray(M.T, X.dtype)
    if b is not None:
        out = out + be.asarray(b, X.dtype)
    return out


def _q(ctx, X, head, keys=False):
    # queries of X: of the query points, or of the tokens (keys=True: rotated by the keys'
    # positions, in kernel order)
    out = _proj(ctx.backend, X, head.Q, head.bQ)
    rot = ctx.rot_k if keys else ctx.rot_q
    return out if rot is None else rot.apply(out)


def _k(ctx, X, head):
    out = _proj(ctx.backend, X, head.K, head.bK)
    return out if ctx.rot_k is None else ctx.rot_k.apply(out)


def _v(be, X, head):
    return _proj(be, X, head.V, head.bV)


@register_head_field("softmax")
def _softmax(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = _q(ctx, Xq, head) * P.beta
    return be.softmax(q, _k(ctx, Xk, head), _v(be, Xk, head), ctx.logw, ctx.limits)[0]


@register_head_field("l2")
def _l2(ctx, P, h, head, Xq, Xk):
    # -b|q - k|^2 = 2b q.k - b|k|^2 - b|q|^2 (the last term cancels in the softmax).  Keys
    # and queries are first moved by the keys' midrange c (|q - k| is unchanged): the
    # expansion then cancels |k - c|^2-sized terms instead of |k|^2-sized ones, which keeps
    # tokens far from the origin accurate and |k - c|^2 finite unless the keys themselves
    # are spread beyond ~1e154 (then ScoreOverflowError, never a silently dropped key).
    be = ctx.backend
    xp = be.xp
    k = _k(ctx, Xk, head)
    c = k.max(axis=0) * 0.5 + k.min(axis=0) * 0.5
    k = k - c
    with np.errstate(over="ignore", invalid="ignore"):
        bias = ctx.logw - P.l2_beta * (k * k).sum(axis=1)
    if not bool(xp.all(xp.isfinite(bias) | xp.isneginf(ctx.logw))):
        raise ScoreOverflowError(
            f"l2 attention scores overflow (head {h}): the projected tokens K x are spread "
            "beyond the float range of |Kx - Ky|^2; rescale the tokens or K")
    q = (_q(ctx, Xq, head) - c) * (2.0 * P.l2_beta)
    return be.softmax(q, k, _v(be, Xk, head), bias, ctx.limits)[0]


@register_head_field("exp")
def _exp(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = _q(ctx, Xq, head) * P.beta
    out, lse = be.softmax(q, _k(ctx, Xk, head), _v(be, Xk, head), ctx.logw, ctx.limits)
    return _times_exp(be.xp, out, lse - P.shift if P.shift else lse)  # e^{-shift}, exactly


def _times_exp(xp, out, lse):
    r"""``out * exp(lse)[:, None]``, finite whenever the product is.

    :math:`e^{\mathrm{lse}}` alone overflows from :math:`\mathrm{lse} \approx 709.8` (88.7
    in float32) while the product may not (small averages).  Rows whose ``lse`` is above
    ``_EXP_SPLIT`` of the dtype are multiplied as :math:`2^e\,(\text{out}\; e^{r})` with
    :math:`\mathrm{lse} = e \ln 2 + r` (``ldexp``: exact scaling); other rows get the
    plain product, bit for bit."""
    split = _EXP_SPLIT[np.dtype(out.dtype).itemsize == 4]
    fin = xp.isfinite(lse)
    big = fin & (lse > split)
    e = xp.where(big, xp.floor(xp.where(big, lse, 0.0) / math.log(2.0)), 0.0)
    e = xp.minimum(e, 2100.0)
    with np.errstate(over="ignore", invalid="ignore"):
        r = xp.where(big, lse - e * math.log(2.0), lse).astype(out.dtype)
        prod = out * xp.exp(r)[:, None]
        return xp.ldexp(prod, e.astype(xp.int32)[:, None])


#: lse above which :func:`_times_exp` splits the exponential (float64, float32)
_EXP_SPLIT = {False: 700.0, True: 80.0}


def _pointwise(phi: str) -> HeadField:
    def fn(ctx, P, h, head, Xq, Xk):
        be = ctx.backend
        q = _q(ctx, Xq, head) * P.beta
        return be.pointwise(phi, q, _k(ctx, Xk, head), _v(be, Xk, head), ctx.w,
                            ctx.limits)
    fn.__name__ = f"_{phi}"
    return fn


HEAD_FIELDS["linear"] = _pointwise("identity")
HEAD_FIELDS["sigmoid"] = _pointwise("sigmoid")
HEAD_FIELDS["relu"] = _pointwise("relu")


@register_head_field("sinkhorn")
def _sinkhorn(ctx, P, h, head, Xq, Xk):
    # thin caller: the solver, warm start and fused sweep live in transformer_pde.sinkhorn
    be = ctx.backend
    kx = _k(ctx, Xk, head)
    qx = _q(ctx, Xk, head, keys=True) * P.beta
    q_query = None if Xq is Xk else _q(ctx, Xq, head) * P.beta
    # with query/key biases or rotary positions the score is symmetric only in special
    # cases: use the general two-potential solve then
    symmetric = head.bQ is None and head.bK is None and P.rotary is None and \
        is_symmetric(head.A)
    state = ctx.state.setdefault(("sinkhorn", h), SinkhornWarmStart())
    out, res = sinkhorn_field(be, qx, kx, _v(be, Xk, head), ctx.logw, P.eps, q_query=q_query,
                              symmetric=symmetric, state=state, t=P.t, tol=ctx.sinkhorn_tol,
                              max_iter=ctx.sinkhorn_max_iter, label=f"head {h}",
                              stage=ctx.stage)
    ctx.sinkhorn.add(res, P.t, ctx.stage)
    return out


# ------------------------------------------------------------------ softmax-free kinds
# Cao 2021, "Choose a Transformer: Fourier or Galerkin".  With LN the per-token layer
# normalisation over a head's k features (transformer_pde.blocks.token_layer_norm,
# eps = SOFTMAX_FREE_LN_EPS), s = beta <q, k>:
#   galerkin: Gamma(x) = sum_j w_j beta <Q x, LN(K x_j)> LN(V x_j)
#   fourier:  Gamma(x) = sum_j w_j beta <LN(Q x), LN(K x_j)> V x_j
# Both are linear in the (normalised) query, so unmasked they cost O(N k^2):
# Gamma(x) = (sum_j w_j v_j k_j^T) q.  Masked, the prefix sums go through the backend's
# pointwise("identity") primitive (O(M N)).
def _softmax_free(ctx, q, k, v, head):
    be = ctx.backend
    if head.Q.shape[0] < 2:
        raise ArgumentError("galerkin / fourier attention normalise each token over the "
                            f"head's k features and need k >= 2, got k={head.Q.shape[0]}")
    if ctx.limits is not None:
        return be.pointwise("identity", q, k, v, ctx.w, ctx.limits)
    return q @ ((v * ctx.w[:, None]).T @ k).T


@register_head_field("galerkin")
def _galerkin(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = _q(ctx, Xq, head) * P.beta
    k = token_layer_norm(_k(ctx, Xk, head))
    v = token_layer_norm(_v(be, Xk, head))
    return _softmax_free(ctx, q, k, v, head)


@register_head_field("fourier")
def _fourier(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = token_layer_norm(_q(ctx, Xq, head)) * P.beta
    k = token_layer_norm(_k(ctx, Xk, head))
    return _softmax_free(ctx, q, k, _v(be, Xk, head), head)


_BUILTIN_FIELDS.update(HEAD_FIELDS)


# ------------------------------------------------------------------ evaluator
def _float_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as ``float64`` or ``float32`` (the dtypes the backends compute in)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ArgumentTypeError(f"dtype must be float64 or float32, got {dtype!r:.60}") from None
    if dt not in (np.float64, np.float32):
        raise ArgumentError(f"dtype must be float64 or float32, got {dt}")
    return dt


class FieldEvaluator:
    r"""Evaluate :math:`\Gamma_{\mu}` repeatedly for a fixed attention, weights and positions.

    Token positions never move, so for masked attention the tokens are sorted by
    position once and every query gets the length of its visible prefix.  Sinkhorn
    potentials are kept between calls (warm start) in ``state``; every Sinkhorn solve is
    recorded (:attr:`info`).

    Parameters
    ----------
    att : Attention
    n_tokens : int
    weights, positions : array_like, optional
        Token weights (normalised to sum 1; uniform by default) and positions in
        [0, 1] (required when ``att.masked`` or ``att.rotary``).
    backend : str or backend object, default "numpy"
    sinkhorn_tol, sinkhorn_max_iter : float, int
        Stopping rule of the inner Sinkhorn solve (log-domain marginal error).
    dtype : {numpy.float64, numpy.float32}
        Floating type of the backend arrays.
    check_finite : bool, default False
        Raise :class:`~transformer_pde.errors.ScoreOverflowError` (naming the kind, the
        head, ``beta`` and the dtype) when the field of the tokens is not finite, instead
        of returning it.  :func:`velocity` sets it.  :func:`~transformer_pde.simulate`
        leaves it off: its time loop checks every step and stops with status
        ``nonfinite`` (or shrinks an adaptive step), an explicit outcome of its own.

    Every head field receives the heads of :attr:`AttentionParams.score_heads
    <transformer_pde.attention.AttentionParams.score_heads>`: query and key biases that
    cancel for the kind are removed exactly before any score is formed.
    """

    def __init__(self, att: Attention, n_tokens: int, *, weights: Any = None,
                 positions: Any = None, backend: Any = "numpy", dtype: Any = np.float64,
                 sinkhorn_tol: float = 1e-9, sinkhorn_max_iter: int = 2000,
                 check_finite: bool = False):
        if not isinstance(att, Attention):
            raise ArgumentTypeError(f"att must be a transformer_pde.Attention, got "
                                    f"{_what(att)}")
        sinkhorn_tol = validation.positive("sinkhorn_tol", sinkhorn_tol)
        sinkhorn_max_iter = validation.integer("sinkhorn_max_iter", sinkhorn_max_iter, minimum=1)
        if not isinstance(check_finite, (bool, np.bool_)):
            raise ArgumentTypeError(f"check_finite must be a bool, got {check_finite!r:.60}")
        self.att = att
        self.n = validation.integer("n_tokens", n_tokens, minimum=1)
        self.dtype = _float_dtype(dtype)
        self.check_finite = bool(check_finite)
        self.be = get_backend(backend, n_tokens=self.n)
        self.weights = validation.weights("weights", weights, self.n)
        require_positions(att.rotary, positions)
        if att.rotary is not None and att.kind not in _BUILTIN_FIELDS:
            raise ArgumentError(f"rotary: the head field registered for kind {att.kind!r} does "
                                "not rotate queries and keys (built-in kinds only)")
        self.positions = validation.positions("positions", positions, self.n, required=att.masked)
        self._rot_tables: dict[int, tuple] = {}
        be = self.be
        if att.masked:
            self.perm = np.argsort(self.positions, kind="stable")
            self.sorted_pos = self.positions[self.perm]
            lim = np.searchsorted(self.sorted_pos, self.positions, side="right")
            self._perm_be = be.asarray(self.perm)
            self._limits = KeyRanges.prefix(lim, self.n)
            w_sorted = self.weights[self.perm]
        else:
            self.perm = None
            self._perm_be = None
            self._limits = None
            w_sorted = self.weights
        with np.errstate(divide="ignore"):
            logw = np.log(w_sorted)
        self.ctx = FieldContext(be, be.asarray(w_sorted, self.dtype), be.asarray(logw, self.dtype),
                                self._limits, float(sinkhorn_tol),
                                int(sinkhorn_max_iter))

    @property
    def info(self) -> dict[str, list]:
        """The Sinkhorn solves so far, one entry per head and evaluation:
        ``{"sinkhorn_iterations", "sinkhorn_times", "sinkhorn_stages"}`` (a copy of
        :meth:`SinkhornRecord.as_info <transformer_pde.sinkhorn.SinkhornRecord.as_info>`;
        ``{}`` before any, and for every other kind)."""
        return self.ctx.sinkhorn.as_info()

    @property
    def state(self) -> dict:
        return self.ctx.state

    @property
    def stage(self) -> int | None:
        """Index of the next evaluation within a fixed-step solver step, or ``None``.

        Set by :func:`~transformer_pde.simulate` before each evaluation (0 for the first
        stage of every step): Sinkhorn warm starts then extrapolate each stage from the
        same stage of the previous steps
        (:class:`~transformer_pde.sinkhorn.SinkhornWarmStart`)."""
        return self.ctx.stage

    @stage.setter
    def stage(self, value: int | None) -> None:
        self.ctx.stage = None if value is None else int(value)

    #: version of the plain data of :meth:`get_state`
    STATE_VERSION = 1

    def get_state(self) -> dict[str, Any]:
        """The warm-start memory and the counters, as plain versioned data.

        Returns ``{"version": 1, "warm_starts": [...], "info": {...}}``: one entry per
        Sinkhorn head, ``{"head": h, **SinkhornWarmStart.get_state()}`` (options,
        potentials history, per-stage increments, start errors and Anderson secant memory;
        see :meth:`~transformer_pde.sinkhorn.SinkhornWarmStart.get_state`), and
        :attr:`info` (the record of the Sinkhorn solves).  :meth:`set_state` restores it
        exactly.
        """
        warm = []
        for key, ws in self.state.items():
            if not (isinstance(key, tuple) and len(key) == 2 and key[0] == "sinkhorn"
                    and isinstance(ws, SinkhornWarmStart)):
                raise TypeError(f"cannot checkpoint the field state entry {key!r} "
                                f"({type(ws).__name__})")
            warm.append({"head": int(key[1]), **ws.get_state()})
        return {"version": self.STATE_VERSION, "warm_starts": warm, "info": self.info}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s data (replacing the warm starts and the record).

        Raises
        ------
        ValueError
            Data of another version or of another shape (the message names the entry).
        """
        if not isinstance(state, dict) or state.get("version") != self.STATE_VERSION \
                or set(state) != {"version", "warm_starts", "info"}:
            raise ValueError(f"field evaluator state {str(state)[:80]} is not of version "
                             f"{self.STATE_VERSION}")
        new: dict = {}
        for w in state["warm_starts"]:
            try:
                new[("sinkhorn", int(w["head"]))] = SinkhornWarmStart.from_state(w)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"field evaluator state: bad warm start entry ({exc!r})") from None
        if not isinstance(state["info"], dict):
            raise ValueError("field evaluator state: 'info' is not a mapping")
        try:
            record = SinkhornRecord.from_info(state["info"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"field evaluator state: bad 'info' ({exc})") from None
        self.state.clear()
        self.state.update(new)
        self.ctx.sinkhorn = record

    def query_limits(self, query_positions: Any, m: int):
        qp = validation.positions("query_positions", query_positions, m, required=True)
        return KeyRanges.prefix(np.searchsorted(self.sorted_pos, qp, side="right"), self.n)

    def _rotary(self, P: AttentionParams, queries: Any, query_positions: Any) -> tuple:
        """The rotary tables (queries, keys in kernel order) of ``P``, or ``(None, None)``."""
        if P.rotary is None:
            return None, None
        m = P.heads[0].Q.shape[0]
        if m not in self._rot_tables:
            keys = self.positions if self.perm is None else self.sorted_pos
            self._rot_tables[m] = tuple(P.rotary.table(p, m, self.be.xp, self.dtype)
                                        for p in (self.positions, keys))
        rq, rk = self._rot_tables[m]
        if queries is not None:
            if query_positions is None:
                raise ArgumentError("rotary attention (Attention(rotary=...)) evaluated at "
                                    "queries needs query_positions: their positions in [0, 1]")
            qp = validation.positions("query_positions", query_positions, queries.shape[0],
                                      required=True)
            rq = P.rotary.table(qp, m, self.be.xp, self.dtype)
        return rq, rk

    def __call__(self, t: float, X: Any, queries: Any = None, query_limits: Any = None,
                 *, left: bool = False, query_positions: Any = None) -> Any:
        """Field of the measure with tokens ``X`` (backend array, (N, d)) at ``X`` or ``queries``.

        ``left=True`` evaluates piecewise-constant (:class:`~transformer_pde.Layers`)
        parameters by their left limit at a layer boundary (see :meth:`Attention.at`).
        ``query_limits`` (:meth:`query_limits`) are the visible prefixes of ``queries``
        for masked attention; ``query_positions`` their positions, required with rotary."""
        P = self.att.at(t, left=left)
        ctx = self.ctx
        Xk = X if self._perm_be is None else X[self._perm_be]
        Xq, limits = (X, self._limits) if queries is None else (queries, query_limits)
        rot = self._rotary(P, queries, query_positions)
        saved = ctx.limits, ctx.rot_q, ctx.rot_k
        ctx.limits, (ctx.rot_q, ctx.rot_k) = limits, rot
        check = self._check if self.check_finite else None
        try:
            fn = HEAD_FIELDS[P.kind]
            heads = P.score_heads
            if P.n_heads == 1:
                out = fn(ctx, P, 0, heads[0], Xq, Xk)
                if check is not None:
                    check(out, P, 0)
            else:
                xp = self.be.xp
                out = xp.zeros(Xq.shape, dtype=Xq.dtype)
                for h, head in enumerate(heads):
                    out[:, head.rows] = part = fn(ctx, P, h, head, Xq, Xk)
                    if check is not None:
                        check(part, P, h)
        finally:
            ctx.limits, ctx.rot_q, ctx.rot_k = saved
        if P.W_O is not None:
            out = out @ self.be.asarray(P.W_O.T, out.dtype)
        if P.b_O is not None:
            out = out + self.be.asarray(P.b_O, out.dtype)
        if check is not None and (P.W_O is not None or P.b_O is not None):
            check(out, P, None)
        return out

    def _check(self, out: Any, P: AttentionParams, h: int | None) -> None:
        """Raise :class:`ScoreOverflowError` if ``out`` (head ``h``'s output, or the whole
        field after ``W_O`` / ``b_O`` when ``h`` is None) holds NaN or inf."""
        xp = self.be.xp
        if bool(xp.all(xp.isfinite(out))):
            return
        raise ScoreOverflowError(P.overflow_message(h, np.dtype(out.dtype)))


def velocity(att: Attention, X: Any, *, weights: Any = None, positions: Any = None,
             queries: Any = None, query_positions: Any = None, t: float = 0.0,
             backend: Any = "numpy", sinkhorn_tol: float = 1e-9,
             sinkhorn_max_iter: int = 2000) -> Any:
    r"""Attention velocity field :math:`\Gamma_{\mu}` of :math:`\mu = \sum_j w_j \delta_{X_j}`.

    Evaluates, at each row of ``X`` (or of ``queries``),

    .. math:: \Gamma_\mu(x) = W_O\,\mathrm{concat}_h\Big( V_h \sum_j P^h_j(x)\, X_j \Big)

    (with bias vectors, :math:`\sum_j P^h_j(x)(V_h X_j + b_{V,h})` and :math:`+\,b_O`; the
    scores use :math:`Q_h x + b_{Q,h}` and :math:`K_h X_j + b_{K,h}`)

    with :math:`P^h_j(x)` the attention weights of kind ``att.kind`` (softmax:
    :math:`w_j e^{\beta\langle Q_h x, K_h X_j\rangle}/\sum_l w_l e^{\beta\langle Q_h x, K_h X_l\rangle}`,
    etc.; see :class:`~transformer_pde.Attention`).  Normalised kinds are computed with a
    running maximum (log-sum-exp), so logits of any size give finite, correct output.

    Parameters
    ----------
    att : Attention
    X : array (N, d)
        Token positions in feature space.
    weights : array (N,), optional
        Non-negative masses (normalised to sum 1; uniform by default).
    positions : array (N,), optional
        Token positions :math:`s_j \in [0,1]`; required for masked attention, where a
        query at position :math:`s` sees tokens with :math:`s_j \le s`, and for rotary
        attention (``Attention(rotary=...)``), which rotates queries and keys by them.
    queries : array (M, d), optional
        Evaluate the field of the same measure at these points instead of at ``X``.
    query_positions : array (M,), optional
        Positions of ``queries`` (masked or rotary attention).
    t : float
        Time (depth) at which time-dependent parameters are evaluated.
    backend : {"numpy", "numba", "cupy", "auto"}
    sinkhorn_tol, sinkhorn_max_iter : float, int
        Inner-solve controls for ``kind="sinkhorn"``.

    Returns
    -------
    ndarray (N, d) or (M, d)
        Same floating dtype as ``X`` (float32 stays float32).

    Raises
    ------
    ArgumentTypeError
        An argument of the wrong type (not an :class:`Attention`, complex or non-numeric
        arrays, a bool or a string where a number is expected).
    ArgumentError
        Wrong shapes, NaN/inf, negative weights, masked attention without positions.
    SinkhornNotConverged
        The Sinkhorn inner solve missed its tolerance.
    ScoreOverflowError
        The field of the finite tokens is beyond the float range: ``kind="exp"`` with
        :math:`\beta\,\langle Qx, Ky\rangle - c` above about 709 (88 in float32;
        ``shift`` :math:`= c` of :class:`~transformer_pde.Attention` removes it), the other
        unnormalised kinds with scores times values beyond the range, or ``kind="l2"``
        with projected tokens spread so far apart that :math:`|Qx - Ky|^2` overflows.
        (Scores beyond the float range are otherwise handled exactly by the normalised
        kinds: the softmax then puts all the mass on the largest score.)

    Notes
    -----
    The result is always finite: a field that is not finite for the finite tokens
    given raises :class:`~transformer_pde.errors.ScoreOverflowError` instead of being
    returned (its message names the kind, ``beta``, the head and the dtype).  Query and
    key biases that cancel for the kind (``b_K`` for softmax, both for sinkhorn, all but
    :math:`b_Q - b_K` for l2; see
    :attr:`Kind.bias_rule <transformer_pde.attention.Kind.bias_rule>`) are removed exactly
    before the scores are formed, so a huge cancelling bias does not spoil the field.
    """
    if not isinstance(att, Attention):
        raise ArgumentTypeError(f"att must be a transformer_pde.Attention, got {_what(att)}")
    t = validation.scalar("t", t)
    try:
        n_tokens = len(X)
    except TypeError:
        n_tokens = None
    be = get_backend(backend, n_tokens=n_tokens)
    Xn = validation.points("X", X if isinstance(X, (list, tuple)) else be.to_numpy(X), att.d)
    dtype = Xn.dtype if Xn.dtype in (np.float32, np.float64) else np.float64
    ev = FieldEvaluator(att, Xn.shape[0], weights=weights, positions=positions, backend=be,
                        dtype=dtype, sinkhorn_tol=sinkhorn_tol,
                        sinkhorn_max_iter=sinkhorn_max_iter, check_finite=True)
    Xb = be.asarray(Xn, dtype)
    Qb = None
    qlim = None
    if queries is not None:
        Qn = validation.points("queries", queries if isinstance(queries, (list, tuple))
                               else be.to_numpy(queries), att.d)
        Qb = be.asarray(Qn, dtype)
        if att.masked:
            qlim = ev.query_limits(query_positions, Qn.shape[0])
        else:   # used by rotary only, but always checked like positions
            validation.positions("query_positions", query_positions, Qn.shape[0])
    elif query_positions is not None:
        raise ArgumentError("query_positions given without queries")
    with np.errstate(over="ignore", invalid="ignore"):
        out = ev(float(t), Xb, Qb, qlim, query_positions=query_positions)
    return be.to_numpy(out) if isinstance(X, np.ndarray) or be.name != "cupy" else out
