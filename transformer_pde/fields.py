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
* exp:       :math:`\sum_j w_j e^{s_j} V y_j = e^{\mathrm{lse}}\cdot` (softmax average), computed in
  the log domain so it is finite whenever the true value is
* linear / sigmoid / relu: ``pointwise(phi, beta Q x, K y, V y, w)``
* sinkhorn: potentials from log-domain Sinkhorn (``lse``), then
  ``softmax(beta Q x / eps, K y, V y, log w + g / eps)`` (the out-of-sample potential
  :math:`f(x)` is exactly the softmax normaliser).

:class:`FieldEvaluator` binds an attention, a backend, weights and positions (sorted once
for masked attention) and keeps warm-start state between evaluations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .attention import Attention, AttentionParams, Head
from .backends import get_backend
from .errors import ScoreOverflowError
from .sinkhorn import (SinkhornNotConverged, SinkhornWarmStart, is_symmetric,
                       sinkhorn_field, sinkhorn_potentials)
from .blocks import token_layer_norm
from . import validation

__all__ = [
    "FieldEvaluator",
    "HEAD_FIELDS",
    "SinkhornNotConverged",
    "register_head_field",
    "sinkhorn_potentials",
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
    info: dict = field(default_factory=dict)
    stage: int | None = None     # index of the evaluation within a fixed-step solver step


HeadField = Callable[[FieldContext, AttentionParams, int, Head, Any, Any], Any]
HEAD_FIELDS: dict[str, HeadField] = {}


def register_head_field(name: str) -> Callable[[HeadField], HeadField]:
    """Decorator registering the head field of attention kind ``name``."""
    def deco(fn: HeadField) -> HeadField:
        HEAD_FIELDS[name] = fn
        return fn
    return deco


def _proj(be, X, M, b=None):
    # the affine map X M^T + b of every row; biases are applied here, in the glue, so the
    # backends' primitives (which only see projected q, k, v) need no change
    out = X @ be.asarray(M.T, X.dtype)
    if b is not None:
        out = out + be.asarray(b, X.dtype)
    return out


def _q(be, X, head):
    return _proj(be, X, head.Q, head.bQ)


def _k(be, X, head):
    return _proj(be, X, head.K, head.bK)


def _v(be, X, head):
    return _proj(be, X, head.V, head.bV)


@register_head_field("softmax")
def _softmax(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = _q(be, Xq, head) * P.beta
    return be.softmax(q, _k(be, Xk, head), _v(be, Xk, head), ctx.logw, ctx.limits)[0]


@register_head_field("l2")
def _l2(ctx, P, h, head, Xq, Xk):
    # -b|q - k|^2 = 2b q.k - b|k|^2 - b|q|^2 (the last term cancels in the softmax).  Keys
    # and queries are first moved by the keys' midrange c (|q - k| is unchanged): the
    # expansion then cancels |k - c|^2-sized terms instead of |k|^2-sized ones, which keeps
    # tokens far from the origin accurate and |k - c|^2 finite unless the keys themselves
    # are spread beyond ~1e154 (then ScoreOverflowError, never a silently dropped key).
    be = ctx.backend
    xp = be.xp
    k = _k(be, Xk, head)
    c = k.max(axis=0) * 0.5 + k.min(axis=0) * 0.5
    k = k - c
    with np.errstate(over="ignore", invalid="ignore"):
        bias = ctx.logw - P.l2_beta * (k * k).sum(axis=1)
    if not bool(xp.all(xp.isfinite(bias) | xp.isneginf(ctx.logw))):
        raise ScoreOverflowError(
            f"l2 attention scores overflow (head {h}): the projected tokens K x are spread "
            "beyond the float range of |Kx - Ky|^2; rescale the tokens or K")
    q = (_q(be, Xq, head) - c) * (2.0 * P.l2_beta)
    return be.softmax(q, k, _v(be, Xk, head), bias, ctx.limits)[0]


@register_head_field("exp")
def _exp(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = _q(be, Xq, head) * P.beta
    out, lse = be.softmax(q, _k(be, Xk, head), _v(be, Xk, head), ctx.logw, ctx.limits)
    with np.errstate(over="ignore", invalid="ignore"):
        return out * be.xp.exp(lse)[:, None]


def _pointwise(phi: str) -> HeadField:
    def fn(ctx, P, h, head, Xq, Xk):
        be = ctx.backend
        q = _q(be, Xq, head) * P.beta
        return be.pointwise(phi, q, _k(be, Xk, head), _v(be, Xk, head), ctx.w,
                            ctx.limits)
    fn.__name__ = f"_{phi}"
    return fn


HEAD_FIELDS["linear"] = _pointwise("identity")
HEAD_FIELDS["sigmoid"] = _pointwise("sigmoid")
HEAD_FIELDS["relu"] = _pointwise("relu")


@register_head_field("sinkhorn")
def _sinkhorn(ctx, P, h, head, Xq, Xk):
    # thin caller: the solver, warm start and fused kernels live in transformer_pde.sinkhorn
    be = ctx.backend
    kx = _k(be, Xk, head)
    qx = _q(be, Xk, head) * P.beta
    q_query = None if Xq is Xk else _q(be, Xq, head) * P.beta
    # with query/key biases the score <Qx + b_Q, Ky + b_K> is symmetric only in special
    # cases: use the general two-potential solve then
    symmetric = head.bQ is None and head.bK is None and is_symmetric(head.A)
    state = ctx.state.setdefault(("sinkhorn", h), SinkhornWarmStart())
    return sinkhorn_field(be, qx, kx, _v(be, Xk, head), ctx.logw, P.eps, q_query=q_query,
                          symmetric=symmetric, state=state, t=P.t, tol=ctx.sinkhorn_tol,
                          max_iter=ctx.sinkhorn_max_iter, info=ctx.info, label=f"head {h}",
                          stage=ctx.stage)[0]


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
        raise ValueError("galerkin / fourier attention normalise each token over the head's "
                         f"k features and need k >= 2, got k={head.Q.shape[0]}")
    if ctx.limits is not None:
        return be.pointwise("identity", q, k, v, ctx.w, ctx.limits)
    return q @ ((v * ctx.w[:, None]).T @ k).T


@register_head_field("galerkin")
def _galerkin(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = _q(be, Xq, head) * P.beta
    k = token_layer_norm(_k(be, Xk, head))
    v = token_layer_norm(_v(be, Xk, head))
    return _softmax_free(ctx, q, k, v, head)


@register_head_field("fourier")
def _fourier(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = token_layer_norm(_q(be, Xq, head)) * P.beta
    k = token_layer_norm(_k(be, Xk, head))
    return _softmax_free(ctx, q, k, _v(be, Xk, head), head)


# ------------------------------------------------------------------ evaluator
class FieldEvaluator:
    r"""Evaluate :math:`\Gamma_{\mu}` repeatedly for a fixed attention, weights and positions.

    Token positions never move, so for masked attention the tokens are sorted by
    position once and every query gets the length of its visible prefix.  Sinkhorn
    potentials are kept between calls (warm start) in ``state``; iteration counts are
    appended to ``info["sinkhorn_iterations"]``.

    Parameters
    ----------
    att : Attention
    n_tokens : int
    weights, positions : array_like, optional
        Token weights (normalised to sum 1; uniform by default) and positions in
        [0, 1] (required when ``att.masked``).
    backend : str or backend object, default "numpy"
    sinkhorn_tol, sinkhorn_max_iter : float, int
        Stopping rule of the inner Sinkhorn solve (log-domain marginal error).
    """

    def __init__(self, att: Attention, n_tokens: int, *, weights: Any = None,
                 positions: Any = None, backend: Any = "numpy", dtype: Any = np.float64,
                 sinkhorn_tol: float = 1e-9, sinkhorn_max_iter: int = 2000):
        if not isinstance(att, Attention):
            raise TypeError(f"att must be a transformer_pde.Attention, got {type(att).__name__}")
        sinkhorn_tol = validation.positive("sinkhorn_tol", sinkhorn_tol)
        sinkhorn_max_iter = validation.integer("sinkhorn_max_iter", sinkhorn_max_iter, minimum=1)
        self.att = att
        self.n = int(n_tokens)
        self.dtype = np.dtype(dtype)
        self.be = get_backend(backend, n_tokens=self.n)
        self.weights = validation.weights("weights", weights, self.n)
        self.positions = validation.positions("positions", positions, self.n, required=att.masked)
        be = self.be
        if att.masked:
            self.perm = np.argsort(self.positions, kind="stable")
            self.sorted_pos = self.positions[self.perm]
            lim = np.searchsorted(self.sorted_pos, self.positions, side="right")
            self._perm_be = be.asarray(self.perm)
            self._limits = be.asarray(lim.astype(np.int64))
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
    def info(self) -> dict:
        return self.ctx.info

    @property
    def state(self) -> dict:
        return self.ctx.state

    @property
    def stage(self) -> int | None:
        """Index of the next evaluation within a fixed-step solver step, or ``None``.

        Set by :func:`~transformer_pde.simulate` before each evaluation (0 for the first
        stage of every step): Sinkhorn warm starts then extrapolate each stage from the
        same stage of the previous steps (:class:`~transformer_pde.sinkhorn.SinkhornWarmStart`)."""
        return self.ctx.stage

    @stage.setter
    def stage(self, value: int | None) -> None:
        self.ctx.stage = None if value is None else int(value)

    def query_limits(self, query_positions: Any, m: int):
        qp = validation.positions("query_positions", query_positions, m, required=True)
        return self.be.asarray(
            np.searchsorted(self.sorted_pos, qp, side="right").astype(np.int64))

    def __call__(self, t: float, X: Any, queries: Any = None, query_limits: Any = None,
                 *, left: bool = False) -> Any:
        """Field of the measure with tokens ``X`` (backend array, (N, d)) at ``X`` or ``queries``.

        ``left=True`` evaluates piecewise-constant (:class:`~transformer_pde.Layers`)
        parameters by their left limit at a layer boundary (see :meth:`Attention.at`)."""
        P = self.att.at(t, left=left)
        ctx = self.ctx
        Xk = X if self._perm_be is None else X[self._perm_be]
        if queries is None:
            Xq = X
            limits = self._limits
        else:
            Xq = queries
            limits = query_limits
        saved = ctx.limits
        ctx.limits = limits
        try:
            fn = HEAD_FIELDS[P.kind]
            if P.n_heads == 1:
                out = fn(ctx, P, 0, P.heads[0], Xq, Xk)
            else:
                xp = self.be.xp
                out = xp.zeros(Xq.shape, dtype=Xq.dtype)
                for h, head in enumerate(P.heads):
                    out[:, head.rows] = fn(ctx, P, h, head, Xq, Xk)
        finally:
            ctx.limits = saved
        if P.W_O is not None:
            out = out @ self.be.asarray(P.W_O.T, out.dtype)
        if P.b_O is not None:
            out = out + self.be.asarray(P.b_O, out.dtype)
        return out


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
        query at position :math:`s` sees tokens with :math:`s_j \le s`.
    queries : array (M, d), optional
        Evaluate the field of the same measure at these points instead of at ``X``.
    query_positions : array (M,), optional
        Positions of ``queries`` (masked attention only).
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
    ValueError
        Wrong shapes, NaN/inf, negative weights, masked attention without positions.
    SinkhornNotConverged
        The Sinkhorn inner solve missed its tolerance.
    ScoreOverflowError
        ``kind="l2"`` with projected tokens spread so far apart that
        :math:`|Qx - Ky|^2` overflows (scores :math:`\langle Qx, Ky\rangle` beyond the
        float range are otherwise handled exactly: the softmax then puts all the mass on
        the largest score).
    """
    if not isinstance(att, Attention):
        raise TypeError(f"att must be a transformer_pde.Attention, got {type(att).__name__}")
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
                        sinkhorn_max_iter=sinkhorn_max_iter)
    Xb = be.asarray(Xn, dtype)
    Qb = None
    qlim = None
    if queries is not None:
        Qn = validation.points("queries", queries if isinstance(queries, (list, tuple))
                               else be.to_numpy(queries), att.d)
        Qb = be.asarray(Qn, dtype)
        if att.masked:
            qlim = ev.query_limits(query_positions, Qn.shape[0])
    elif query_positions is not None:
        raise ValueError("query_positions given without queries")
    with np.errstate(over="ignore", invalid="ignore"):
        out = ev(float(t), Xb, Qb, qlim)
    return be.to_numpy(out) if isinstance(X, np.ndarray) or be.name != "cupy" else out
