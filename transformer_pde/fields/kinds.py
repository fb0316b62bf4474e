r"""The head field of every attention kind (:data:`HEAD_FIELDS`), built from the backend
primitives on the key ranges of :class:`FieldContext` (see :mod:`transformer_pde.fields`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..attention import AttentionParams, Head
from ..blocks import token_layer_norm
from ..errors import ArgumentError, ArgumentTypeError, ScoreOverflowError
from ..sinkhorn import SinkhornRecord, SinkhornWarmStart, is_symmetric, sinkhorn_field
from ..sinkhorn.options import DEFAULT_MAX_ITER, DEFAULT_TOL
from ..validation import type_name as _what
from .alibi import alibi_softmax

__all__ = ["FieldContext", "HEAD_FIELDS", "register_head_field"]

@dataclass
class FieldContext:
    """What a head field needs besides the points: backend arrays and settings."""

    backend: Any
    w: Any                       # (N,) weights on the backend, keys in kernel order
    logw: Any                    # (N,) log-weights (-inf for zero weight)
    ranges: Any                  # KeyRanges of the queries over the keys, or None (all keys)
    sinkhorn_tol: float = DEFAULT_TOL
    sinkhorn_max_iter: int = DEFAULT_MAX_ITER
    state: dict = field(default_factory=dict)
    sinkhorn: SinkhornRecord = field(default_factory=SinkhornRecord)
    stage: int | None = None     # index of the evaluation within a fixed-step solver step
    rot_q: Any = None            # RotaryTable of the query positions (rotary attention)
    rot_k: Any = None            # RotaryTable of the key positions, in kernel order
    segments: Any = None         # [(start, end)] of each segment of the tokens, or None
    alibi: Any = None            # AlibiRanges of the queries (ALiBi attention), or None


HeadField = Callable[[FieldContext, AttentionParams, int, Head, Any, Any], Any]
HEAD_FIELDS: dict[str, HeadField] = {}


#: kinds whose head fields ship with the package (filled at the end of the built-ins)
BUILTIN_FIELDS: set[str] = set()


def register_head_field(name: str, *, replace: bool = False) -> Callable[[HeadField], HeadField]:
    """Decorator registering the head field of attention kind ``name``.

    A head field must reduce each query over its key range only, ``ctx.ranges``
    (:class:`~transformer_pde.backends.ranges.KeyRanges`, ``None``: every key), as the
    backend primitives do when given it: causal masks, windows and segments are all
    expressed there, and a field that sums over every key would mix segments.

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
    if name in BUILTIN_FIELDS:
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


def _reduce(ctx, P, h, q, k, v, bias):
    # the softmax primitive over each query's keys; with ALiBi (slope of head h > 0) its
    # before / after passes (transformer_pde.fields.alibi)
    lam = 0.0 if P.alibi is None else float(P.alibi[h])
    if ctx.alibi is None or lam == 0.0:
        return ctx.backend.softmax(q, k, v, bias, ctx.ranges)
    return alibi_softmax(ctx.backend, ctx.alibi, lam, q, k, v, bias)


@register_head_field("softmax")
def _softmax(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = _q(ctx, Xq, head) * P.beta
    return _reduce(ctx, P, h, q, _k(ctx, Xk, head), _v(be, Xk, head), ctx.logw)[0]


@register_head_field("l2")
def _l2(ctx, P, h, head, Xq, Xk):
    # -b|q - k|^2 = 2b q.k - b|k|^2 - b|q|^2 (the last term cancels in the softmax).  Keys
    # and queries are first moved by the keys' midrange c (|q - k| is unchanged): the
    # expansion then cancels |k - c|^2-sized terms instead of |k|^2-sized ones, which keeps
    # tokens far from the origin accurate and |k - c|^2 finite unless the keys themselves
    # are spread beyond ~1e154 (then ScoreOverflowError, never a silently dropped key).
    # In segments each segment takes its own midrange (its tokens see only its keys), so a
    # segment is as accurate as alone however far from the others it lies.
    be = ctx.backend
    xp = be.xp
    k, q = _k(ctx, Xk, head), _q(ctx, Xq, head)

    def midrange(a):
        return a.max(axis=0) * 0.5 + a.min(axis=0) * 0.5

    if ctx.segments is None:
        c = midrange(k)
        k, q = k - c, q - c
    else:                   # queries = tokens (segments refuse other queries)
        cs = [(s, e, midrange(k[s:e])) for s, e in ctx.segments]
        k, q = (xp.concatenate([a[s:e] - c for s, e, c in cs]) for a in (k, q))
    with np.errstate(over="ignore", invalid="ignore"):
        bias = ctx.logw - P.l2_beta * (k * k).sum(axis=1)
    if not bool(xp.all(xp.isfinite(bias) | xp.isneginf(ctx.logw))):
        raise ScoreOverflowError(
            f"l2 attention scores overflow (head {h}): the projected tokens K x are spread "
            "beyond the float range of |Kx - Ky|^2; rescale the tokens or K")
    return _reduce(ctx, P, h, q * (2.0 * P.l2_beta), k, _v(be, Xk, head), bias)[0]


@register_head_field("exp")
def _exp(ctx, P, h, head, Xq, Xk):
    be = ctx.backend
    q = _q(ctx, Xq, head) * P.beta
    out, lse = _reduce(ctx, P, h, q, _k(ctx, Xk, head), _v(be, Xk, head), ctx.logw)
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
                            ctx.ranges)
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
    v = _v(be, Xk, head)

    def solve(key, label, part=slice(None)):
        # segments (never masked, so the tokens are in their own order): each segment is
        # its own doubly stochastic problem, with its own warm start
        state = ctx.state.setdefault(key, SinkhornWarmStart())
        out, res = sinkhorn_field(be, qx[part], kx[part], v[part], ctx.logw[part], P.eps,
                                  q_query=q_query, symmetric=symmetric, state=state, t=P.t,
                                  tol=ctx.sinkhorn_tol, max_iter=ctx.sinkhorn_max_iter,
                                  label=label, stage=ctx.stage)
        ctx.sinkhorn.add(res, P.t, ctx.stage)
        return out

    if ctx.segments is None:
        return solve(("sinkhorn", h), f"head {h}")
    return be.xp.concatenate([solve(("sinkhorn", h, b), f"head {h}, segment {b}", slice(s, e))
                              for b, (s, e) in enumerate(ctx.segments)])


# ------------------------------------------------------------------ softmax-free kinds
# Cao 2021, "Choose a Transformer: Fourier or Galerkin".  With LN the per-token layer
# normalisation over a head's k features (transformer_pde.blocks.token_layer_norm,
# eps = SOFTMAX_FREE_LN_EPS), s = beta <q, k>:
#   galerkin: Gamma(x) = sum_j w_j beta <Q x, LN(K x_j)> LN(V x_j)
#   fourier:  Gamma(x) = sum_j w_j beta <LN(Q x), LN(K x_j)> V x_j
# Both are linear in the (normalised) query, so unmasked they cost O(N k^2):
# Gamma(x) = (sum_j w_j v_j k_j^T) q.  Masked or in segments, the sums over each query's
# keys go through the backend's pointwise("identity") primitive on the key ranges (O(M N),
# O(sum_b n_b^2) for segments on backends that skip the keys outside a block's span).
def _softmax_free(ctx, q, k, v, head):
    be = ctx.backend
    if head.Q.shape[0] < 2:
        raise ArgumentError("galerkin / fourier attention normalise each token over the "
                            f"head's k features and need k >= 2, got k={head.Q.shape[0]}")
    if ctx.ranges is not None:   # masks and segments: sums over each query's own keys
        return be.pointwise("identity", q, k, v, ctx.w, ctx.ranges)
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


BUILTIN_FIELDS.update(HEAD_FIELDS)
