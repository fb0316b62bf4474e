r"""Reference implementations of every attention field and backend primitive, in plain NumPy.

These functions are the yardstick the library is tested against: each is a literal
transcription of a formula of docs/conventions.md, with a Python loop over heads and
queries and NumPy sums over the keys, written for obvious correctness and not for speed
(:math:`O(MN)` work and memory per head; use them up to a few thousand tokens).  They share
no code with :mod:`transformer_pde.fields`, :mod:`transformer_pde.sinkhorn` or the
backends: they read an :class:`~transformer_pde.Attention` only through its public
attributes, evaluate its parameters at ``t`` themselves, and import NumPy and SciPy only
(not hypothesis, not the package), so that a custom attention kind can be checked
against its own reference as well.

Notation (one head, docs/conventions.md).  Tokens :math:`x_j` with weights
:math:`w_j \ge 0`, :math:`\sum_j w_j = 1`; a query :math:`y`; projected query, key and
value :math:`q = Q_h y + b_{Q,h}`, :math:`k_j = K_h x_j + b_{K,h}`,
:math:`v_j = V_h x_j + b_{V,h}`; score :math:`s_j = \beta\, q\cdot k_j`; the visible keys
:math:`J(y) = \{j : p_j \le p(y)\}` with masking (every key otherwise).  Each head
reference (:data:`REFERENCES`) returns :math:`\Gamma_h(y) = \sum_{j \in J(y)} a_j v_j` with

=========== =================================================================================
kind        coefficients :math:`a_j` (:math:`j \in J(y)`)
=========== =================================================================================
softmax     :math:`w_j e^{s_j} / \sum_{l \in J(y)} w_l e^{s_l}`
l2          :math:`w_j e^{-\beta' |q - k_j|^2} / \sum_{l \in J(y)} w_l e^{-\beta' |q - k_l|^2}`
sinkhorn    :math:`w_j e^{(g_j + s_j)/\varepsilon} / \sum_l w_l e^{(g_l + s_l)/\varepsilon}`,
            :math:`g` the column potential of the entropic self-coupling (:func:`sinkhorn_potentials`)
linear      :math:`w_j s_j`
sigmoid     :math:`w_j / (1 + e^{-s_j})`
relu        :math:`w_j \max(s_j, 0)`
exp         :math:`w_j e^{s_j}`
galerkin    :math:`w_j \beta\, q \cdot \mathrm{LN}(k_j)`, with the values :math:`\mathrm{LN}(v_j)`
fourier     :math:`w_j \beta\, \mathrm{LN}(q) \cdot \mathrm{LN}(k_j)`
=========== =================================================================================

(:math:`\mathrm{LN}` is :func:`layer_norm`).  With ALiBi slopes :math:`\lambda_h` the
exponent of ``softmax``, ``l2`` and ``exp`` loses :math:`\lambda_h |p(y) - p_j|`
(:attr:`HeadProblem.penalty`).  A query that sees no key gets 0.  The layer
concatenates its heads (head :math:`h` writes rows :math:`hk \ldots (h+1)k - 1`) and applies
:math:`W_O` and :math:`b_O`: :func:`field` from explicit matrices, :func:`velocity` from an
:class:`~transformer_pde.Attention`, as :func:`transformer_pde.velocity` does.

Precision: the formulas are evaluated in float64 as written, with the largest exponent
subtracted before exponentiating; scores must be finite (no rescaling of scores beyond
the float range) and the results carry ordinary double-precision round-off, relative
:math:`\sim 10^{-15}` times the conditioning of the sums (the Sinkhorn coupling to the
stopping tolerance of :func:`sinkhorn_potentials`).  Compare a library result with
``numpy.testing.assert_allclose`` and a stated tolerance, never bit for bit.

A custom kind is checked by adding its head reference to :data:`REFERENCES`:

>>> import numpy as np
>>> from transformer_pde.testing import references as R
>>> def tanh_head(p):                       # a_j = w_j tanh(s_j)
...     out = np.zeros((p.q.shape[0], p.v.shape[1]))
...     for i in range(p.q.shape[0]):
...         j = p.visible[i]
...         out[i] = (p.w[j] * np.tanh(p.beta * (p.k[j] @ p.q[i]))) @ p.v[j]
...     return out
>>> R.REFERENCES["tanh"] = tanh_head
>>> X = np.array([[0.0], [1.0]])
>>> R.field("tanh", X, [[1.0]], [[1.0]], [[1.0]])[:, 0].round(6).tolist()
[0.0, 0.380797]
>>> del R.REFERENCES["tanh"]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import logsumexp

__all__ = [
    "HeadProblem",
    "HeadReference",
    "LAYER_NORM_EPS",
    "REFERENCES",
    "SinkhornReferenceError",
    "exp_head",
    "field",
    "fourier_head",
    "galerkin_head",
    "l2_head",
    "layer_norm",
    "linear_head",
    "lse",
    "pointwise",
    "relu_head",
    "sigmoid_head",
    "sinkhorn_head",
    "sinkhorn_potentials",
    "softmax",
    "softmax_head",
    "velocity",
]

#: :math:`\varepsilon` of the per-token layer normalisation of the galerkin and fourier kinds
LAYER_NORM_EPS: float = 1e-5


class SinkhornReferenceError(RuntimeError):
    """The reference Sinkhorn loop did not reach its tolerance within its iterations."""


@dataclass(frozen=True, eq=False)
class HeadProblem:
    r"""Everything one head's reference needs, projections already applied.

    Attributes
    ----------
    q : ndarray (M, r)
        Projected queries :math:`Q_h y_i + b_{Q,h}`.
    k : ndarray (N, r)
        Projected keys :math:`K_h x_j + b_{K,h}`.
    v : ndarray (N, c)
        Projected values :math:`V_h x_j + b_{V,h}`.
    q_tokens : ndarray (N, r)
        The tokens projected as queries, :math:`Q_h x_j + b_{Q,h}` (the self-coupling of
        Sinkhorn attention is between the tokens, whatever the queries).
    w : ndarray (N,)
        Token weights, :math:`w_j \ge 0`, :math:`\sum_j w_j = 1` (over all tokens, visible
        or not).
    visible : ndarray (M, N) of bool
        ``visible[i, j]``: key :math:`j` is visible to query :math:`i`.
    beta, eps, l2_beta : float
        Temperature :math:`\beta`, Sinkhorn regularisation :math:`\varepsilon` and l2
        temperature :math:`\beta'`.
    shift : float
        Constant subtracted from the exponent of the ``exp`` kernel,
        :math:`w_j e^{\beta q\cdot k_j - \text{shift}}` (it cancels in the normalised kinds).
    sinkhorn_tol : float
        Stopping tolerance of :func:`sinkhorn_potentials`.
    penalty : ndarray (M, N) or None
        ALiBi: :math:`\lambda_h |p_i - p_j|`, subtracted from the exponent of the
        ``softmax``, ``l2`` and ``exp`` kernels (``None``: no ALiBi).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    q_tokens: np.ndarray
    w: np.ndarray
    visible: np.ndarray
    beta: float = 1.0
    eps: float = 1.0
    l2_beta: float = 0.5
    shift: float = 0.0
    sinkhorn_tol: float = 1e-13
    penalty: np.ndarray | None = None

    def minus_penalty(self, i: int, j: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The exponents ``s`` of query ``i`` over keys ``j`` less the ALiBi penalty."""
        return s if self.penalty is None else s - self.penalty[i, j]


#: A head reference: ``fn(problem) -> ndarray (M, c)``, the head's output at every query
HeadReference = Callable[[HeadProblem], np.ndarray]


# --------------------------------------------------------------------------- helpers
def layer_norm(u: ArrayLike, eps: float = LAYER_NORM_EPS) -> np.ndarray:
    r"""Per-token layer normalisation of each row :math:`u \in \mathbb R^k`.

    :math:`\mathrm{LN}(u) = (u - \bar u) / \sqrt{\tfrac1k \sum_l (u_l - \bar u)^2 + \varepsilon}`,
    :math:`\bar u = \tfrac1k \sum_l u_l`.
    """
    u = np.asarray(u, dtype=float)
    c = u - u.mean(axis=-1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)


def _per_query(p: HeadProblem, coefficients: Callable[[int, np.ndarray], np.ndarray],
               values: np.ndarray | None = None) -> np.ndarray:
    r"""``out[i] = sum_{j visible} a_j v_j`` with ``a = coefficients(i, visible keys)``."""
    v = p.v if values is None else values
    out = np.zeros((p.q.shape[0], v.shape[1]))
    for i in range(p.q.shape[0]):
        j = np.flatnonzero(p.visible[i])
        if j.size:                       # a query that sees no key: empty sum, field 0
            out[i] = coefficients(i, j) @ v[j]
    return out


# --------------------------------------------------------------------------- head references
def softmax_head(p: HeadProblem) -> np.ndarray:
    r"""Softmax: :math:`\sum_{j\in J} w_j e^{\beta q\cdot k_j} v_j / \sum_{j\in J} w_j e^{\beta q\cdot k_j}`."""
    def a(i, j):
        s = p.minus_penalty(i, j, p.beta * (p.k[j] @ p.q[i]))
        e = p.w[j] * np.exp(s - s.max())
        return e / e.sum()
    return _per_query(p, a)


def l2_head(p: HeadProblem) -> np.ndarray:
    r"""L2: weights :math:`\propto w_j e^{-\beta' |q - k_j|^2}` over the visible keys (``beta`` unused)."""
    def a(i, j):
        ell = p.minus_penalty(i, j, -p.l2_beta * np.sum((p.q[i] - p.k[j]) ** 2, axis=1))
        e = p.w[j] * np.exp(ell - ell.max())
        return e / e.sum()
    return _per_query(p, a)


def linear_head(p: HeadProblem) -> np.ndarray:
    r"""Linear: :math:`\sum_{j\in J} w_j\, \beta q\cdot k_j\, v_j`."""
    return _per_query(p, lambda i, j: p.w[j] * (p.beta * (p.k[j] @ p.q[i])))


def sigmoid_head(p: HeadProblem) -> np.ndarray:
    r"""Sigmoid: :math:`\sum_{j\in J} w_j / (1 + e^{-\beta q\cdot k_j})\, v_j`."""
    def a(i, j):
        with np.errstate(over="ignore"):       # e^{-s} = inf for s << 0: weight 0, exact
            return p.w[j] / (1.0 + np.exp(-p.beta * (p.k[j] @ p.q[i])))
    return _per_query(p, a)


def relu_head(p: HeadProblem) -> np.ndarray:
    r"""ReLU: :math:`\sum_{j\in J} w_j \max(\beta q\cdot k_j, 0)\, v_j`."""
    return _per_query(p, lambda i, j: p.w[j] * np.maximum(p.beta * (p.k[j] @ p.q[i]), 0.0))


def exp_head(p: HeadProblem) -> np.ndarray:
    r"""Exp (unnormalised): :math:`\sum_{j\in J} w_j e^{\beta q\cdot k_j - \text{shift}} v_j`."""
    return _per_query(p, lambda i, j: p.w[j] * np.exp(
        p.minus_penalty(i, j, p.beta * (p.k[j] @ p.q[i])) - p.shift))


def galerkin_head(p: HeadProblem) -> np.ndarray:
    r"""Galerkin (Cao 2021): :math:`\sum_{j\in J} w_j\, \beta q\cdot\mathrm{LN}(k_j)\, \mathrm{LN}(v_j)`."""
    k, v = layer_norm(p.k), layer_norm(p.v)
    return _per_query(p, lambda i, j: p.w[j] * (p.beta * (k[j] @ p.q[i])), values=v)


def fourier_head(p: HeadProblem) -> np.ndarray:
    r"""Fourier (Cao 2021): :math:`\sum_{j\in J} w_j\, \beta \mathrm{LN}(q)\cdot\mathrm{LN}(k_j)\, v_j`."""
    q, k = layer_norm(p.q), layer_norm(p.k)
    return _per_query(p, lambda i, j: p.w[j] * (p.beta * (k[j] @ q[i])))


def sinkhorn_potentials(S: ArrayLike, w: ArrayLike, eps: float, *, tol: float = 1e-13,
                        max_iter: int = 200_000) -> tuple[np.ndarray, np.ndarray]:
    r"""Potentials of the entropic self-coupling of :math:`\mu = \sum_j w_j\delta_{x_j}`.

    With the scores :math:`S_{ij} = \beta\, s(x_i, x_j)` (cost :math:`-S`), the kernel
    :math:`k_{ij} = e^{(f_i + g_j + S_{ij})/\varepsilon}` satisfies
    :math:`\sum_j w_j k_{ij} = 1` and :math:`\sum_i w_i k_{ij} = 1`.  Plain alternating
    log-domain Sinkhorn from :math:`f = g = 0`:

    .. math:: f_i \leftarrow -\varepsilon \log \sum_j w_j e^{(g_j + S_{ij})/\varepsilon},
              \qquad g_j \leftarrow -\varepsilon \log \sum_i w_i e^{(f_i + S_{ij})/\varepsilon},

    stopped when every row sum :math:`\sum_j w_j k_{ij}` (the column sums are exact after
    the :math:`g` update) is within ``tol`` of 1.

    Returns
    -------
    f, g : ndarray (N,)

    Raises
    ------
    SinkhornReferenceError
        ``tol`` not reached within ``max_iter`` sweeps.
    """
    S = np.asarray(S, dtype=float)
    w = np.asarray(w, dtype=float)
    with np.errstate(divide="ignore"):
        logw = np.log(w)                      # -inf for a zero weight: no mass, no term
    f, g = np.zeros(len(w)), np.zeros(len(w))
    for _ in range(max_iter):
        f = -eps * logsumexp(logw[None, :] + (g[None, :] + S) / eps, axis=1)
        g = -eps * logsumexp(logw[:, None] + (f[:, None] + S) / eps, axis=0)
        rows = np.exp(logsumexp(logw[None, :] + (f[:, None] + g[None, :] + S) / eps, axis=1))
        if np.max(np.abs(rows - 1.0)) <= tol:
            return f, g
    raise SinkhornReferenceError(f"reference Sinkhorn did not reach tol={tol:g} in {max_iter} "
                                 f"sweeps (eps={eps:g}): raise max_iter or tol")


def sinkhorn_head(p: HeadProblem) -> np.ndarray:
    r"""Sinkhorn: :math:`\sum_j a_j v_j`, :math:`a_j \propto w_j e^{(g_j + \beta q\cdot k_j)/\varepsilon}`.

    :math:`g` is the column potential of the self-coupling of the tokens
    (:func:`sinkhorn_potentials` with :math:`S_{ij} = \beta\, q_{\text{tok},i}\cdot k_j`);
    the denominator is :math:`e^{-f(y)/\varepsilon}`, the out-of-sample row potential, so
    at a token :math:`x_i` this is :math:`\sum_j \pi_{ij} v_j / w_i` for the optimal
    coupling :math:`\pi`.  Sinkhorn attention cannot be masked.
    """
    if not np.all(p.visible):
        raise ValueError("sinkhorn attention cannot be masked: every key must be visible")
    S = p.beta * (p.q_tokens @ p.k.T)
    _, g = sinkhorn_potentials(S, p.w, p.eps, tol=p.sinkhorn_tol)
    return _per_query(p, lambda i, j: _weights_of(g[j] + p.beta * (p.k[j] @ p.q[i]), p.w[j], p.eps))


def _weights_of(numerator: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ell = numerator / eps
    e = w * np.exp(ell - ell.max())
    return e / e.sum()


#: kind -> head reference; add an entry to check a custom kind with :func:`field` / :func:`velocity`
REFERENCES: dict[str, HeadReference] = {
    "softmax": softmax_head,
    "linear": linear_head,
    "l2": l2_head,
    "sinkhorn": sinkhorn_head,
    "sigmoid": sigmoid_head,
    "relu": relu_head,
    "exp": exp_head,
    "galerkin": galerkin_head,
    "fourier": fourier_head,
}


# --------------------------------------------------------------------------- whole fields
def _vector(b: Any) -> np.ndarray | None:
    return None if b is None else np.asarray(b, dtype=float).reshape(-1)


def _weights(weights: ArrayLike | None, n: int) -> np.ndarray:
    """``w / sum(w)`` (uniform when None), divided by ``max(w)`` first so the sum cannot overflow."""
    if weights is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(weights, dtype=float)
    u = w / w.max()
    return u / u.sum()


def field(kind: str, X: ArrayLike, Q: ArrayLike, K: ArrayLike, V: ArrayLike, *,
          weights: ArrayLike | None = None, positions: ArrayLike | None = None,
          queries: ArrayLike | None = None, query_positions: ArrayLike | None = None,
          heads: int = 1, beta: float = 1.0, eps: float = 1.0, l2_beta: float = 0.5,
          b_Q: ArrayLike | None = None, b_K: ArrayLike | None = None,
          b_V: ArrayLike | None = None, W_O: ArrayLike | None = None,
          b_O: ArrayLike | None = None, shift: float = 0.0,
          sinkhorn_tol: float = 1e-13, alibi: ArrayLike | None = None,
          masked: bool | None = None) -> np.ndarray:
    r"""The attention field :math:`\Gamma_\mu` of a layer, from explicit matrices.

    :math:`\Gamma_\mu(y) = W_O\, \mathrm{concat}_h \Gamma_h(y) + b_O`, with
    :math:`\Gamma_h` the head reference ``REFERENCES[kind]`` (module docstring).

    Parameters
    ----------
    kind : str
        A key of :data:`REFERENCES`.
    X : array (N, d)
        Tokens :math:`x_j`.
    Q, K : array (k, d) (``heads = 1``) or (d, d)
        Query and key matrices; head :math:`h` of ``H`` uses rows :math:`hk \ldots (h+1)k-1`,
        :math:`k = d/H`, of Q, K, V and of the biases b_Q, b_K, b_V.
    V : array (d, d)
        Value matrix.
    weights : array (N,), optional
        Token weights, normalised here (uniform if None).
    positions, query_positions : array, optional
        Token and query positions; when ``positions`` is given a query at position
        :math:`p` sees the tokens with :math:`p_j \le p` (masked attention) unless
        ``masked=False``.
    queries : array (M, d), optional
        Where to evaluate the field (the tokens if None; then the query positions are the
        token positions).
    heads, beta, eps, l2_beta : int, float
        As for :class:`~transformer_pde.Attention`.
    b_Q, b_K, b_V, b_O, W_O : array, optional
        Biases and output projection (none if None).
    shift : float
        As for :class:`~transformer_pde.Attention` (the ``exp`` kernel's exponent shift).
    sinkhorn_tol : float
        Stopping tolerance of :func:`sinkhorn_potentials`.
    alibi : float or array (heads,), optional
        ALiBi slopes :math:`\lambda_h` (needs ``positions``): the exponents lose
        :math:`\lambda_h |p(y) - p_j|`.
    masked : bool, optional
        Whether ``positions`` mask (default: masked when ``positions`` is given).

    Returns
    -------
    ndarray (M, d)
    """
    X = np.asarray(X, dtype=float)
    N, d = X.shape
    Q, K, V = (np.asarray(a, dtype=float) for a in (Q, K, V))
    bQ, bK, bV, bO = (_vector(b) for b in (b_Q, b_K, b_V, b_O))
    w = _weights(weights, N)
    Y = X if queries is None else np.asarray(queries, dtype=float)
    visible = np.ones((Y.shape[0], N), dtype=bool)
    slopes = dist = None
    if positions is not None:
        pos = np.asarray(positions, dtype=float)
        qpos = pos if queries is None else np.asarray(query_positions, dtype=float)
        if masked or masked is None:
            visible = pos[None, :] <= qpos[:, None]
        dist = np.abs(qpos[:, None] - pos[None, :])
    if alibi is not None:
        if dist is None:
            raise ValueError("ALiBi needs positions")
        slopes = np.broadcast_to(np.asarray(alibi, dtype=float), (heads,))
    reference = REFERENCES[kind]
    out = np.zeros((Y.shape[0], d))
    k = d // heads
    for h in range(heads):
        rows = slice(h * k, (h + 1) * k) if heads > 1 else slice(0, Q.shape[0])
        vrows = slice(h * k, (h + 1) * k) if heads > 1 else slice(0, d)

        def project(M, b, P, rows=rows):
            return P @ M[rows].T + (0.0 if b is None else b[rows])

        p = HeadProblem(q=project(Q, bQ, Y), k=project(K, bK, X),
                        v=X @ V[vrows].T + (0.0 if bV is None else bV[vrows]),
                        q_tokens=project(Q, bQ, X), w=w, visible=visible, beta=float(beta),
                        eps=float(eps), l2_beta=float(l2_beta), shift=float(shift),
                        sinkhorn_tol=sinkhorn_tol,
                        penalty=None if slopes is None else slopes[h] * dist)
        out[:, vrows] = reference(p)
    if W_O is not None:
        out = out @ np.asarray(W_O, dtype=float).T
    if bO is not None:
        out = out + bO
    return out


def _at(value: Any, t: float) -> Any:
    """A parameter at time ``t``: arrays as they are, callables and layer tables called."""
    if value is None or isinstance(value, np.ndarray):
        return value
    return np.asarray(value(t), dtype=float) if callable(value) else np.asarray(value, float)


def velocity(att: Any, X: ArrayLike, *, t: float = 0.0, weights: ArrayLike | None = None,
             positions: ArrayLike | None = None, queries: ArrayLike | None = None,
             query_positions: ArrayLike | None = None, sinkhorn_tol: float = 1e-13) -> np.ndarray:
    r"""The reference of :func:`transformer_pde.velocity`: :func:`field` of an attention at ``t``.

    Reads ``att.kind``, ``att.Q``, ``att.K``, ``att.V``, ``att.W_O``, the biases ``att.b_Q``
    ... ``att.b_O`` (each an array, a callable of ``t`` or a layer table, evaluated here at
    ``t``), ``att.heads``, ``att.masked``, ``att.beta``, ``att.eps``, ``att.l2_beta`` and
    ``att.alibi`` (ALiBi slopes).  Positions are used only when ``att.masked`` or
    ``att.alibi``.
    """
    if getattr(att, "rotary", None) is not None or getattr(att, "kv_heads", None) is not None:
        raise ValueError("the plain reference takes no rotary positions nor grouped key/value "
                         "heads (att.rotary, att.kv_heads)")
    masked = bool(att.masked)
    alibi = getattr(att, "alibi", None)
    used = masked or alibi is not None
    if used and positions is None:
        raise ValueError("masked or ALiBi attention needs positions")
    return field(att.kind, X, _at(att.Q, t), _at(att.K, t), _at(att.V, t), weights=weights,
                 positions=positions if used else None, queries=queries,
                 query_positions=query_positions if used else None, heads=att.heads,
                 alibi=alibi, masked=masked,
                 beta=att.beta, eps=att.eps, l2_beta=att.l2_beta, b_Q=_at(att.b_Q, t),
                 b_K=_at(att.b_K, t), b_V=_at(att.b_V, t), W_O=_at(att.W_O, t),
                 b_O=_at(att.b_O, t), sinkhorn_tol=sinkhorn_tol)


# --------------------------------------------------------------------------- backend primitives
def _ranges(m: int, n: int, ranges: Any) -> list[tuple[int, int]]:
    """The visible keys ``[lo_i, hi_i)`` of each query: ``ranges`` (an object with ``lo`` and
    ``hi``, e.g. a :class:`~transformer_pde.backends.ranges.KeyRanges`; read by attribute,
    so that this module stays free of the package) or all ``n`` keys for ``None``."""
    if ranges is None:
        return [(0, n)] * m
    lo, hi = np.asarray(ranges.lo).reshape(-1), np.asarray(ranges.hi).reshape(-1)
    if lo.shape != (m,) or hi.shape != (m,):
        raise ValueError(f"ranges must give one range per query: {lo.shape} and {hi.shape} "
                         f"for {m} queries")
    if np.any(lo < 0) or np.any(lo > hi) or np.any(hi > n):
        raise ValueError(f"ranges must satisfy 0 <= lo <= hi <= {n}")
    return [(int(a), int(b)) for a, b in zip(lo, hi, strict=True)]


def softmax(q: ArrayLike, k: ArrayLike, v: ArrayLike, bias: ArrayLike | None,
            ranges: Any) -> tuple[np.ndarray, np.ndarray]:
    r"""Dense reference of the backend primitive ``softmax(q, k, v, bias, ranges)``.

    For queries ``q`` (M, r), keys ``k`` (N, r), values ``v`` (N, c), a per-key bias
    :math:`b` (N,) or None and key ranges :math:`J_i = [\mathrm{lo}_i, \mathrm{hi}_i)`
    (``ranges``: a :class:`~transformer_pde.backends.ranges.KeyRanges`, or None for all
    keys): :math:`\ell_{ij} = q_i\cdot k_j + b_j`,
    :math:`\mathrm{lse}_i = \log\sum_{j\in J_i} e^{\ell_{ij}}`,
    :math:`\mathrm{out}_i = \sum_{j\in J_i} e^{\ell_{ij} - \mathrm{lse}_i} v_j`, the largest
    visible logit :math:`m_i` subtracted before exponentiating; keys outside :math:`J_i`
    are never read.  A row whose largest visible logit is not finite (no visible key, every
    visible bias :math:`-\infty`, or a visible :math:`+\infty` or NaN logit) gets
    ``out = 0`` and ``lse = -inf``, the backends' convention.  Computed in float64 whatever
    the input dtypes.

    Returns
    -------
    out : ndarray (M, c), lse : ndarray (M,)
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    b = np.zeros(k.shape[0]) if bias is None else np.asarray(bias, dtype=np.float64)
    out = np.zeros((q.shape[0], v.shape[1]))
    lse_ = np.full(q.shape[0], -np.inf)
    for i, (lo, hi) in enumerate(_ranges(q.shape[0], k.shape[0], ranges)):
        logits = k[lo:hi] @ q[i] + b[lo:hi]
        m = logits.max(initial=-np.inf)
        if not np.isfinite(m):
            continue
        e = np.exp(logits - m)
        lse_[i] = m + np.log(e.sum())
        out[i] = (e @ v[lo:hi]) / e.sum()
    return out, lse_


def lse(q: ArrayLike, k: ArrayLike, bias: ArrayLike | None, ranges: Any) -> np.ndarray:
    r"""Dense reference of the backend primitive ``lse``:
    :math:`\log\sum_{j\in J_i} e^{q_i\cdot k_j + b_j}`.

    The ``lse`` output of :func:`softmax` (same ranges; same convention for rows without a
    finite largest logit: ``-inf``).
    """
    return softmax(q, k, np.zeros((np.shape(k)[0], 0)), bias, ranges)[1]


def pointwise(phi: str, q: ArrayLike, k: ArrayLike, v: ArrayLike, w: ArrayLike,
              ranges: Any) -> np.ndarray:
    r"""Dense reference of the backend primitive ``pointwise``.

    :math:`\mathrm{out}_i = \sum_{j\in J_i} w_j\, \varphi(q_i\cdot k_j)\, v_j` with
    :math:`\varphi` = identity, :math:`\mathrm{sigmoid}(z) = 1/(1 + e^{-z})` or
    :math:`\mathrm{relu}(z) = \max(z, 0)` for ``phi`` = ``"identity"``, ``"sigmoid"``,
    ``"relu"``, and the key ranges :math:`J_i` of :func:`softmax`; keys outside
    :math:`J_i` are never read.  Computed in float64 whatever the input dtypes.
    """
    fn = {"identity": lambda z: z, "sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z)),
          "relu": lambda z: np.maximum(z, 0.0)}[phi]
    q, k, v, w = (np.asarray(a, dtype=np.float64) for a in (q, k, v, w))
    out = np.zeros((q.shape[0], v.shape[1]))
    for i, (lo, hi) in enumerate(_ranges(q.shape[0], k.shape[0], ranges)):
        with np.errstate(over="ignore"):      # e^{-z} = inf for z << 0: sigmoid 0, exact
            out[i] = (w[lo:hi] * fn(k[lo:hi] @ q[i])) @ v[lo:hi]
    return out
