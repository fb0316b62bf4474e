r"""Hypothesis strategies for token measures, attention parameters and Gaussians.

These strategies are public so that users (and the project's own tests) can write
property-based tests of anything built on :mod:`transformer_pde`; the package
:mod:`transformer_pde.testing` re-exports every name of this module.  They need the
optional test dependency ``hypothesis`` (``pip install 'transformer-pde[test]'``); the
reference implementations of :mod:`transformer_pde.testing.references` do not.

Every strategy draws values in a range where the mathematics is **well conditioned**,
so that a property failing is a bug and not round-off:

* points have coordinates in :math:`[-r, r]` (``radius`` ``r = 1`` by default), so
  :math:`|x|_2 \le r\sqrt{d}`;
* random matrices are rescaled so that their spectral norm is at most ``scale``
  (1 by default); with both defaults a score :math:`\langle Qx, Ky\rangle` is at most
  :math:`d` in absolute value (:math:`2d` with the drawn temperatures :math:`\beta \le 2`),
  so no exponential in a field exceeds :math:`e^{8}` for :math:`d \le 4`, and Sinkhorn
  (:math:`\varepsilon \ge 1/2`) converges in a few dozen iterations;
* weights are bounded away from zero (each in :math:`[0.1, 1]` before normalisation);
* SPD matrices have eigenvalues in ``[min_eig, max_eig]`` (default ``[0.2, 2]``,
  condition number :math:`\le 10`);
* floats are never NaN, infinite or subnormal.

Dimensions and sizes are given as an ``int`` (fixed), a ``(lo, hi)`` tuple (drawn
inclusively), a hypothesis strategy, or ``None`` (the default range stated in each
docstring).

Examples
--------
>>> from hypothesis import given, settings
>>> import numpy as np, transformer_pde as tp
>>> from transformer_pde.testing import measures, attentions
>>> @settings(max_examples=5, deadline=None)
... @given(m=measures(d=2, n=(1, 5)), att=attentions(d=2, kinds=["softmax"]))
... def test_finite(m, att):
...     assert np.all(np.isfinite(tp.velocity(att, m.X, weights=m.weights)))
>>> test_finite()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence, Union

import numpy as np

try:
    from hypothesis import assume
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as exc:  # pragma: no cover - exercised only without hypothesis
    raise ImportError(
        "transformer_pde.testing.strategies needs the optional dependency 'hypothesis' "
        "(pip install 'transformer-pde[test]')") from exc

from ..attention import KINDS, Attention, Layers
from . import __all__ as _names  # listed once, in the package that re-exports them lazily

__all__ = list(_names)

#: The attention kinds of docs/conventions.md drawn by default by :func:`attentions`.  Kinds registered
#: later (with their own constraints, e.g. a minimum head width) must be asked for by name.
CORE_KINDS: tuple[str, ...] = ("softmax", "linear", "l2", "sinkhorn", "sigmoid", "relu", "exp")

SizeSpec = Union[int, tuple[int, int], st.SearchStrategy, None]


# --------------------------------------------------------------------------- values
@dataclass(frozen=True, eq=False)
class Measure:
    r"""An empirical token measure :math:`\mu = \sum_j w_j \delta_{x_j}` (positions optional).

    Attributes
    ----------
    X : ndarray (N, d)
        Token coordinates.
    weights : ndarray (N,) or None
        Normalised weights (sum 1), or ``None`` for uniform weights.
    positions : ndarray (N,) or None
        Token positions in :math:`[0, 1]` (for masked attention), or ``None``.
    """

    X: np.ndarray
    weights: np.ndarray | None = None
    positions: np.ndarray | None = None

    @property
    def n(self) -> int:
        """Number of tokens ``N``."""
        return self.X.shape[0]

    @property
    def d(self) -> int:
        """Dimension ``d``."""
        return self.X.shape[1]

    @property
    def w(self) -> np.ndarray:
        """Weights as an array (uniform ``1/N`` when ``weights`` is None)."""
        return np.full(self.n, 1.0 / self.n) if self.weights is None else self.weights

    @property
    def kwargs(self) -> dict[str, Any]:
        """``{"weights": ..., "positions": ...}`` to pass to ``velocity`` / ``simulate``."""
        return {"weights": self.weights, "positions": self.positions}


class MeanCov(NamedTuple):
    r"""Mean :math:`\alpha` (d,) and covariance :math:`\Sigma` (d, d) of a Gaussian."""

    mean: np.ndarray
    cov: np.ndarray


# --------------------------------------------------------------------------- helpers
def _size(spec: SizeSpec, default: tuple[int, int], name: str) -> st.SearchStrategy:
    if spec is None:
        spec = default
    if isinstance(spec, st.SearchStrategy):
        return spec
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"{name} must be >= 1, got {spec}")
        return st.just(int(spec))
    if isinstance(spec, tuple) and len(spec) == 2:
        lo, hi = (int(v) for v in spec)
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} range must satisfy 1 <= lo <= hi, got {spec}")
        return st.integers(lo, hi)
    raise TypeError(f"{name} must be an int, a (lo, hi) tuple, a strategy or None, got {spec!r}")


def _floats(lo: float, hi: float) -> st.SearchStrategy:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False)


def _array(shape: tuple[int, ...], lo: float, hi: float) -> st.SearchStrategy:
    return hnp.arrays(np.float64, shape, elements=_floats(lo, hi))


# --------------------------------------------------------------------------- matrices
def matrices(rows: int, cols: int | None = None, *, scale: float = 1.0) -> st.SearchStrategy:
    r"""Real ``rows x cols`` matrices with spectral norm :math:`\le` ``scale``.

    Entries are drawn in :math:`[-1, 1]` and the matrix is divided by
    :math:`\max(1, \|M\|_2/\text{scale})`.  The zero matrix is possible (hypothesis
    shrinks towards it), so properties that need invertibility should use
    :func:`spd_matrices` or :func:`rotations`.
    """
    cols = rows if cols is None else cols
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")

    def rescale(M: np.ndarray) -> np.ndarray:
        nrm = np.linalg.norm(M, 2)
        return M / max(1.0, nrm / scale)

    return _array((rows, cols), -1.0, 1.0).map(rescale)


def rotations(d: int) -> st.SearchStrategy:
    r"""Rotation matrices :math:`R \in SO(d)` (``R^T R = I``, ``det R = +1``).

    Built as a product of Givens rotations in every coordinate plane :math:`(i, j)`,
    with angles in :math:`[-\pi, \pi]`; this reaches all of :math:`SO(d)` (Euler-angle
    parametrisation) and shrinks towards the identity.  Orthogonal to machine precision.
    """
    if d < 1:
        raise ValueError(f"d must be >= 1, got {d}")
    pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]

    def build(angles: Sequence[float]) -> np.ndarray:
        R = np.eye(d)
        for (i, j), a in zip(pairs, angles, strict=True):
            G = np.eye(d)
            c, s = np.cos(a), np.sin(a)
            G[i, i] = G[j, j] = c
            G[i, j], G[j, i] = -s, s
            R = G @ R
        return R

    return st.lists(_floats(-np.pi, np.pi), min_size=len(pairs),
                    max_size=len(pairs)).map(build)


def spd_matrices(d: int, *, min_eig: float = 0.2, max_eig: float = 2.0) -> st.SearchStrategy:
    r"""Symmetric positive-definite ``d x d`` matrices :math:`R\,\mathrm{diag}(\lambda)\,R^\top`.

    Eigenvalues :math:`\lambda_i \in [\text{min\_eig}, \text{max\_eig}]` (condition number at
    most ``max_eig / min_eig``, 10 by default), eigenvectors from :func:`rotations`.  The
    result is exactly symmetric.
    """
    if not 0 < min_eig <= max_eig:
        raise ValueError(f"need 0 < min_eig <= max_eig, got {min_eig}, {max_eig}")

    def build(args: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        lam, R = args
        S = (R * lam) @ R.T
        return 0.5 * (S + S.T)

    return st.tuples(_array((d,), min_eig, max_eig), rotations(d)).map(build)


def gaussians(d: int, *, mean_scale: float = 1.0, min_eig: float = 0.2,
              max_eig: float = 2.0) -> st.SearchStrategy:
    r"""Gaussian parameters :math:`N(\alpha, \Sigma)` as a :class:`MeanCov` ``(mean, cov)``.

    :math:`\alpha \in [-\text{mean\_scale}, \text{mean\_scale}]^d`, :math:`\Sigma` from
    :func:`spd_matrices` (eigenvalues in ``[min_eig, max_eig]``).
    """
    return st.builds(MeanCov, _array((d,), -mean_scale, mean_scale),
                     spd_matrices(d, min_eig=min_eig, max_eig=max_eig))


# --------------------------------------------------------------------------- measures
@st.composite
def _measure(draw, d, n, weighted, positions, radius, ball):
    dd = draw(d)
    nn = draw(n)
    if ball:
        # points of the closed ball of radius `radius`: direction times a radius in [0, 1]
        raw = draw(_array((nn, dd), -1.0, 1.0))
        norms = np.linalg.norm(raw, axis=1, keepdims=True)
        frac = draw(_array((nn, 1), 0.0, 1.0))
        X = np.where(norms > 0, raw / np.where(norms > 0, norms, 1.0), 0.0) * frac * radius
    else:
        X = draw(_array((nn, dd), -radius, radius))
    w = None
    want_w = draw(st.booleans()) if weighted is None else bool(weighted)
    if want_w:
        raw_w = draw(_array((nn,), 0.1, 1.0))
        w = raw_w / raw_w.sum()
    p = None
    want_p = draw(st.booleans()) if positions is None else bool(positions)
    if want_p:
        # a small grid makes ties (tokens at the same position) likely
        elem = st.one_of(_floats(0.0, 1.0), st.sampled_from([0.0, 0.25, 0.5, 1.0]))
        p = np.array(draw(st.lists(elem, min_size=nn, max_size=nn)), dtype=float)
    return Measure(X, w, p)


def measures(d: SizeSpec = None, n: SizeSpec = None, *, weighted: bool | None = False,
             positions: bool | None = False, radius: float = 1.0) -> st.SearchStrategy:
    r"""Empirical measures :math:`\sum_j w_j \delta_{x_j}` as :class:`Measure` objects.

    Parameters
    ----------
    d : int, (lo, hi), strategy or None
        Dimension; default drawn in ``[1, 4]``.
    n : int, (lo, hi), strategy or None
        Number of tokens; default drawn in ``[1, 6]``.
    weighted : bool or None
        ``True``: non-uniform weights (each in ``[0.1, 1]`` before normalisation);
        ``False``: ``weights=None`` (uniform); ``None``: either.
    positions : bool or None
        ``True``: token positions in :math:`[0, 1]`, ties likely (needed for masked
        attention); ``False``: ``None``; ``None``: either.
    radius : float
        Coordinates lie in :math:`[-\text{radius}, \text{radius}]`.

    Notes
    -----
    Tokens may coincide (hypothesis shrinks towards equal points); every attention field
    is well defined there.
    """
    if not radius > 0:
        raise ValueError(f"radius must be > 0, got {radius}")
    return _measure(_size(d, (1, 4), "d"), _size(n, (1, 6), "n"), weighted, positions,
                    float(radius), False)


def compact_measures(d: SizeSpec = None, n: SizeSpec = None, *, radius: float = 1.0,
                     weighted: bool | None = False,
                     positions: bool | None = False) -> st.SearchStrategy:
    r"""Measures supported in the closed Euclidean ball :math:`\{|x|_2 \le \text{radius}\}`.

    For tests of compact-support results (e.g. the support-radius growth bound
    :math:`R(t) \le R_0 e^{\int_0^t \|V\|}` of the paper's Theorem 3.1).  Same parameters
    as :func:`measures`; every token satisfies ``np.linalg.norm(x) <= radius``.
    """
    if not radius > 0:
        raise ValueError(f"radius must be > 0, got {radius}")
    return _measure(_size(d, (1, 4), "d"), _size(n, (1, 6), "n"), weighted, positions,
                    float(radius), True)


# --------------------------------------------------------------------------- attentions
def _divisors(d: int) -> list[int]:
    return [h for h in range(1, d + 1) if d % h == 0]


@st.composite
def _attention(draw, kinds, d, heads, masked, scale, time_dependent, temperatures, w_o,
               min_k):
    kind = draw(st.sampled_from(kinds))
    if kind in ("galerkin", "fourier"):
        min_k = max(min_k, 2)   # per-token layer norm over the head's k features: k >= 2
    dd = draw(d)
    assume(dd >= min_k)
    if heads is None:
        H = draw(st.sampled_from([h for h in _divisors(dd) if dd // h >= min_k]))
    else:
        H = draw(heads)
        if dd % H or dd // H < min_k:
            H = 1  # the requested head count does not fit this d: fall back to one head
    if not KINDS[kind].maskable:
        is_masked = False
    else:
        is_masked = draw(st.booleans()) if masked is None else bool(masked)
    # Q, K (k x d with k drawn for one head; d x d for several heads), V (d x d)
    k = draw(st.integers(min_k, dd)) if H == 1 else dd
    n_layers = draw(st.integers(1, 3)) if (time_dependent or
                                           (time_dependent is None and draw(st.booleans()))) else 0

    def param(rows: int, cols: int):
        if n_layers:
            return Layers(np.stack([draw(matrices(rows, cols, scale=scale))
                                    for _ in range(n_layers)]))
        return draw(matrices(rows, cols, scale=scale))

    Q, K, V = param(k, dd), param(k, dd), param(dd, dd)
    W_O = param(dd, dd) if (w_o if w_o is not None else draw(st.booleans())) else None
    kw: dict[str, Any] = {}
    if temperatures:
        if kind == "l2":
            kw["l2_beta"] = draw(_floats(0.25, 1.0))
        else:
            kw["beta"] = draw(_floats(0.5, 2.0))
        if kind == "sinkhorn":
            kw["eps"] = draw(_floats(0.5, 2.0))
    return Attention(kind, Q, K, V, heads=H, masked=is_masked, W_O=W_O, **kw)


def attentions(kinds: Sequence[str] | None = None, d: SizeSpec = None, *,
               heads: SizeSpec = 1, masked: bool | None = False, scale: float = 1.0,
               time_dependent: bool | None = False, temperatures: bool = True,
               output_matrix: bool | None = False, min_head_dim: int = 1) -> st.SearchStrategy:
    r"""Random :class:`~transformer_pde.Attention` specifications.

    Parameters
    ----------
    kinds : sequence of str, optional
        Kinds to draw from (default: :data:`CORE_KINDS`).
    d : int, (lo, hi), strategy or None
        Dimension; default drawn in ``[1, 4]``.
    heads : int, (lo, hi), strategy or None
        Number of heads; ``None`` draws a divisor of ``d``.  A drawn value that does not
        divide ``d`` falls back to one head.  With one head, Q and K are ``k x d`` with
        ``k`` drawn in ``[1, d]`` (rank-deficient scores are exercised).
    masked : bool or None
        ``True`` masks every maskable kind (sinkhorn is then never masked -- it cannot be);
        ``None`` draws it.
    scale : float
        Spectral-norm bound of Q, K, V and W_O (see :func:`matrices`).
    time_dependent : bool or None
        ``True``: every matrix is a :class:`~transformer_pde.Layers` table of 1-3 layers
        (``layer_time = 1``); ``None``: either.
    temperatures : bool
        Draw ``beta`` in ``[0.5, 2]`` (``l2_beta`` in ``[0.25, 1]`` for l2, ``eps`` in
        ``[0.5, 2]`` for sinkhorn) instead of the defaults.
    output_matrix : bool or None
        Include an output projection ``W_O``; ``None`` draws it.
    min_head_dim : int
        Smallest head width ``k`` (rows of each head's Q and K), for kinds that need
        ``k >= 2``; head counts leaving narrower heads fall back to one head, and drawn
        dimensions ``d < min_head_dim`` are rejected (pass ``d >= min_head_dim``).

    Notes
    -----
    With ``scale = 1`` and measures of :func:`measures` (radius 1), every score is at most
    ``d * beta <= 8`` in absolute value for ``d <= 4``.
    """
    kinds = list(CORE_KINDS) if kinds is None else list(kinds)
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"unknown attention kind {k!r}; known: {sorted(KINDS)}")
    if not kinds:
        raise ValueError("kinds must not be empty")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if isinstance(min_head_dim, bool) or not isinstance(min_head_dim, (int, np.integer)) \
            or min_head_dim < 1:
        raise ValueError(f"min_head_dim must be an integer >= 1, got {min_head_dim!r}")
    heads_st = None if heads is None else _size(heads, (1, 4), "heads")
    return _attention(kinds, _size(d, (1, 4), "d"), heads_st, masked, float(scale),
                      time_dependent, bool(temperatures), output_matrix, int(min_head_dim))


@st.composite
def _problem(draw, kinds, d, n, heads, masked, weighted, scale, time_dependent, min_k):
    dd = draw(_size(d, (1, 4), "d"))
    att = draw(attentions(kinds, dd, heads=heads, masked=masked, scale=scale,
                          time_dependent=time_dependent, min_head_dim=min_k))
    m = draw(measures(dd, n, weighted=weighted, positions=att.masked))
    return att, m


def attention_problems(kinds: Sequence[str] | None = None, d: SizeSpec = None,
                       n: SizeSpec = None, *, heads: SizeSpec = 1,
                       masked: bool | None = False, weighted: bool | None = None,
                       scale: float = 1.0, time_dependent: bool | None = False,
                       min_head_dim: int = 1) -> st.SearchStrategy:
    r"""Pairs ``(att, measure)`` of matching dimension, ready for ``velocity``/``simulate``.

    The measure carries positions exactly when ``att.masked``.  Parameters as in
    :func:`attentions` and :func:`measures`.

    Examples
    --------
    >>> from hypothesis import given, settings
    >>> import transformer_pde as tp
    >>> @settings(max_examples=3, deadline=None)
    ... @given(attention_problems(kinds=["softmax", "l2"], masked=None))
    ... def test_shape(problem):
    ...     att, m = problem
    ...     assert tp.velocity(att, m.X, **m.kwargs).shape == m.X.shape
    >>> test_shape()
    """
    return _problem(kinds, d, n, heads, masked, weighted, scale, time_dependent, min_head_dim)
