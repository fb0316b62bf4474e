r"""Wasserstein distances on the line and on the circle, computed exactly from distribution
functions, and the distance between a particle run and a mean-field solution.

A measure on :math:`\mathbb R` (or on the circle :math:`[0, 2\pi)`) is given either by
**samples** (an array of points, optionally weighted: the empirical measure) or by a
**density on a grid**, the tuple ``(x, density)`` of increasing nodes and non-negative
values, read as the piecewise-linear interpolant of the values (zero outside the nodes on
the line, periodic on the circle), normalised to mass one.  Both have piecewise-polynomial
distribution functions :math:`F`: piecewise constant with jumps for samples, piecewise
quadratic for a grid density, so the distances below are integrals of piecewise
polynomials, evaluated in closed form (roots of quadratics where a sign changes).

On the line,

.. math::

    W_1(\mu, \nu) = \int_{\mathbb R} |F(x) - G(x)|\,dx, \qquad
    W_2^2(\mu, \nu) = \int_0^1 |F^{-1}(m) - G^{-1}(m)|^2\,dm .

On the circle :math:`\mathbb T = [0, 2\pi)`, with :math:`F, G` the distribution functions
counted from the angle 0, the optimal transport cost :math:`|\theta - \phi|` along the
circle gives (Rabin, Delon & Gousseau; Cabrelli & Molter)

.. math::

    W_1(\mu, \nu) = \min_{c\in\mathbb R} \int_0^{2\pi} |F(\theta) - G(\theta) - c|\,d\theta,

whose minimiser :math:`c` is a median of :math:`F - G` under the Lebesgue measure on
:math:`[0, 2\pi)`; it is found by bisection on the exactly computed measure of
:math:`\{F - G < c\}`.

:func:`distance_to_pde` measures a particle trajectory against a mean-field solution at
each of the particle run's saved times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..results import ResultKind, require_kind
from ..validation import choice, finite_array, normalize_weights

__all__ = ["circle_quantile", "distance_to_pde", "w1_circle", "w1_line", "w2_line"]

TWO_PI = 2.0 * math.pi


# ------------------------------------------------------------------ representation
@dataclass(frozen=True)
class _CDF:
    """A distribution function, quadratic on each piece ``[x[k], x[k+1]]``.

    ``F(x) = c[k, 0] + c[k, 1] s + c[k, 2] s^2`` with ``s = x - x[k]`` inside piece ``k``;
    ``F = 0`` left of ``x[0]`` and ``F = 1`` right of ``x[-1]`` (jumps at the nodes are
    allowed: samples).  ``atoms`` says whether the measure is empirical."""

    x: np.ndarray
    c: np.ndarray
    atoms: bool


def _samples_cdf(name: str, values: np.ndarray, weights: Any) -> _CDF:
    n = values.shape[0]
    if n == 0:
        raise ArgumentError(f"{name} has no samples")
    if weights is None:
        w = np.full(n, 1.0 / n)
    else:
        w = finite_array(f"weights of {name}", weights).ravel()
        if w.shape != (n,):
            raise ArgumentError(f"weights of {name} must have shape ({n},), got {w.shape}")
        if np.any(w < 0) or not w.max() > 0:
            raise ArgumentError(f"weights of {name} must be >= 0 with a positive sum")
        w = normalize_weights(w)
    order = np.argsort(values, kind="stable")
    xs, ws = values[order], w[order]
    ux, start = np.unique(xs, return_index=True)
    cum = np.cumsum(ws)[np.r_[start[1:] - 1, n - 1]]
    c = np.zeros((ux.size - 1, 3))
    c[:, 0] = cum[:-1]
    return _CDF(ux, c, True)


def _grid_cdf(name: str, x: np.ndarray, rho: np.ndarray) -> _CDF:
    """Piecewise-linear density through ``(x, rho)``, normalised: a piecewise-quadratic CDF.

    ``rho`` is first divided by its maximum (the result depends on the normalised density
    only), so values of any scale give the same CDF (values near the largest float made
    the trapezoid masses overflow)."""
    if not rho.max() > 0:
        raise ArgumentError(f"the density of {name} has zero mass")
    rho = rho / rho.max()
    h = np.diff(x)
    mass = 0.5 * (rho[:-1] + rho[1:]) * h
    total = mass.sum()
    if not total > 0:
        raise ArgumentError(f"the density of {name} has zero mass")
    r = rho / total
    c = np.empty((h.size, 3))
    c[:, 0] = np.r_[0.0, np.cumsum(mass[:-1]) / total]
    c[:, 1] = r[:-1]
    c[:, 2] = (r[1:] - r[:-1]) / (2.0 * h)
    return _CDF(x.copy(), c, False)


def _grid_arrays(name: str, value: tuple) -> tuple[np.ndarray, np.ndarray]:
    x = finite_array(f"{name}[0] (grid nodes)", value[0]).ravel()
    rho = finite_array(f"{name}[1] (density values)", value[1]).ravel()
    if x.size < 2 or rho.shape != x.shape:
        raise ArgumentError(f"{name} as (x, density) needs two arrays of the same length >= 2, "
                            f"got lengths {x.size} and {rho.size}")
    if np.any(np.diff(x) <= 0):
        raise ArgumentError(f"{name}: the grid nodes must be strictly increasing")
    if not np.isfinite(x[-1] - x[0]):
        raise ArgumentError(f"{name}: the grid nodes span {x[0]!r} to {x[-1]!r}, a length "
                            f"beyond the floating-point range")
    if np.any(rho < 0):
        raise ArgumentError(f"{name}: the density must be >= 0 (min {rho.min():.3g})")
    return x, rho


def _is_grid(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(
        np.ndim(v) == 1 for v in value)


def _line_measure(name: str, value: Any, weights: Any) -> _CDF:
    if _is_grid(value):
        if weights is not None:
            raise ArgumentError(f"weights of {name} apply to samples, not to a grid density")
        return _grid_cdf(name, *_grid_arrays(name, value))
    pts = finite_array(name, value)
    if pts.ndim == 2 and pts.shape[1] == 1:
        pts = pts[:, 0]
    if pts.ndim != 1:
        raise ArgumentError(f"{name} must be samples of shape (N,) or (N, 1), or a tuple "
                            f"(x, density), got shape {pts.shape}")
    return _samples_cdf(name, pts, weights)


def _circle_measure(name: str, value: Any, weights: Any) -> _CDF:
    if _is_grid(value):
        if weights is not None:
            raise ArgumentError(f"weights of {name} apply to samples, not to a grid density")
        th, rho = _grid_arrays(name, value)
        if th[0] < 0 or th[-1] >= TWO_PI:
            raise ArgumentError(f"{name}: the grid angles must lie in [0, 2 pi)")
        # periodic piecewise-linear interpolant, cut at 0 and 2 pi
        gap = th[0] + TWO_PI - th[-1]
        r0 = rho[-1] + (rho[0] - rho[-1]) * (TWO_PI - th[-1]) / gap
        x = np.r_[0.0, th, TWO_PI] if th[0] > 0 else np.r_[th, TWO_PI]
        r = np.r_[r0, rho, r0] if th[0] > 0 else np.r_[rho, rho[0]]
        return _grid_cdf(name, x, r)
    pts = finite_array(name, value)
    if pts.ndim == 2 and pts.shape[1] == 2:
        pts = np.arctan2(pts[:, 1], pts[:, 0])
    elif pts.ndim == 2 and pts.shape[1] == 1:
        pts = pts[:, 0]
    if pts.ndim != 1:
        raise ArgumentError(f"{name} must be angles of shape (N,), points of the circle of "
                            f"shape (N, 2), or a tuple (theta, density), got shape {pts.shape}")
    return _samples_cdf(name, np.mod(pts, TWO_PI), weights)


# ------------------------------------------------------------------ piecewise algebra
def _on_pieces(F: _CDF, u: np.ndarray) -> np.ndarray:
    """Coefficients of ``F`` on each interval ``[u[l], u[l+1]]`` in ``s = x - u[l]``
    (``u`` contains every node of ``F``)."""
    mid = 0.5 * (u[:-1] + u[1:])
    out = np.zeros((mid.size, 3))
    k = np.searchsorted(F.x, mid, side="right") - 1
    out[k >= F.x.size - 1, 0] = 1.0
    inside = (k >= 0) & (k < F.x.size - 1)
    kk = k[inside]
    d = u[:-1][inside] - F.x[kk]
    c0, c1, c2 = F.c[kk, 0], F.c[kk, 1], F.c[kk, 2]
    out[inside] = np.stack([c0 + c1 * d + c2 * d * d, c1 + 2.0 * c2 * d, c2], axis=1)
    return out


def _splits(p: np.ndarray, L: np.ndarray) -> np.ndarray:
    """Points ``0 <= r1 <= r2 <= L`` cutting ``[0, L]`` where the quadratic ``p`` may change
    sign (shape (K, 4): ``0, r1, r2, L``)."""
    a, b, c = p[:, 2], p[:, 1], p[:, 0]
    roots = np.full((p.shape[0], 2), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        lin = np.abs(a) * L <= 1e-14 * (np.abs(b) + np.abs(a) * L)
        roots[lin, 0] = -c[lin] / b[lin]
        q = ~lin
        disc = b[q] ** 2 - 4.0 * a[q] * c[q]
        sq = np.sqrt(np.where(disc >= 0, disc, np.nan))
        t = -0.5 * (b[q] + np.copysign(sq, b[q]))
        roots[q, 0] = t / a[q]
        roots[q, 1] = c[q] / t
    roots = np.where(np.isfinite(roots), roots, 0.0)
    roots = np.sort(np.clip(roots, 0.0, L[:, None]), axis=1)
    return np.column_stack([np.zeros_like(L), roots, L])


def _poly_int(p: np.ndarray, s0: np.ndarray, s1: np.ndarray) -> np.ndarray:
    def prim(s):
        return s * (p[:, 0] + s * (p[:, 1] / 2.0 + s * p[:, 2] / 3.0))
    return prim(s1) - prim(s0)


def _abs_integral(p: np.ndarray, L: np.ndarray) -> float:
    """Sum over intervals of ``int_0^L |p(s)| ds`` (exact: split at the roots)."""
    r = _splits(p, L)
    return float(sum(np.abs(_poly_int(p, r[:, i], r[:, i + 1])).sum() for i in range(3)))


def _below(p: np.ndarray, L: np.ndarray, c: float) -> float:
    """Lebesgue measure of ``{s in [0, L]: p(s) < c}`` summed over the intervals."""
    q = p.copy()
    q[:, 0] -= c
    r = _splits(q, L)
    total = 0.0
    for i in range(3):
        s = 0.5 * (r[:, i] + r[:, i + 1])
        val = q[:, 0] + s * (q[:, 1] + s * q[:, 2])
        total += float(np.sum((r[:, i + 1] - r[:, i])[val < 0]))
    return total


def _w1(F: _CDF, G: _CDF, lo: float | None = None, hi: float | None = None,
        circle: bool = False) -> float:
    parts = [F.x, G.x] + ([np.array([lo, hi])] if circle else [])
    u = np.unique(np.concatenate(parts))
    if u.size < 2:
        return 0.0
    p = _on_pieces(F, u) - _on_pieces(G, u)
    L = np.diff(u)
    if not circle:
        return _abs_integral(p, L)
    vals = np.r_[p[:, 0], p[:, 0] + L * (p[:, 1] + L * p[:, 2])]
    a, b = float(vals.min()), float(vals.max())
    half = 0.5 * float(L.sum())
    for _ in range(200):        # bisection for a median of F - G under d theta
        m = 0.5 * (a + b)
        if _below(p, L, m) < half:
            a = m
        else:
            b = m
        if b - a <= 4e-16 * max(1.0, abs(m)):
            break
    p[:, 0] -= 0.5 * (a + b)
    return _abs_integral(p, L)


# ------------------------------------------------------------------ quantiles (W2)
def _levels(F: _CDF) -> np.ndarray:
    """The masses where ``F``'s pieces begin and end (jumps included)."""
    end = F.c[:, 0] + np.diff(F.x) * (F.c[:, 1] + np.diff(F.x) * F.c[:, 2])
    return np.concatenate([[0.0, 1.0], F.c[:, 0], end])


def _locate(F: _CDF, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For masses ``m`` strictly inside intervals of the merged levels: the continuous
    piece holding them (-1 when none), and otherwise the node whose jump holds them."""
    starts = F.c[:, 0]
    ends = _levels(F)[2 + starts.size:]
    k = np.searchsorted(starts, m, side="right") - 1
    cont = (k >= 0) & (m < ends[np.maximum(k, 0)]) if starts.size else np.zeros(m.shape, bool)
    node = np.searchsorted(ends, m, side="right")
    return np.where(cont, k, -1), np.where(cont, -1, node)


def _inverse(F: _CDF, k: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Position in piece ``k`` where ``F = m`` (the root of the quadratic in [0, h])."""
    c0, c1, c2 = F.c[k, 0], F.c[k, 1], F.c[k, 2]
    h = F.x[k + 1] - F.x[k]
    d = m - c0
    disc = np.maximum(c1 * c1 + 4.0 * c2 * d, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.where(c1 + np.sqrt(disc) > 0, 2.0 * d / (c1 + np.sqrt(disc)), 0.0)
    return F.x[k] + np.clip(s, 0.0, h)


def _w2(F: _CDF, G: _CDF) -> float:
    ms = np.unique(np.clip(np.concatenate([_levels(F), _levels(G)]), 0.0, 1.0))
    ml, mr = ms[:-1], ms[1:]
    keep = mr > ml
    ml, mr = ml[keep], mr[keep]
    mid = 0.5 * (ml + mr)
    kf, jf = _locate(F, mid)
    kg, jg = _locate(G, mid)
    total = 0.0
    cont_f, cont_g = kf >= 0, kg >= 0
    # both constant on the interval (inside jumps): exact
    both = ~cont_f & ~cont_g
    total += float(np.sum((F.x[jf[both]] - G.x[jg[both]]) ** 2 * (mr - ml)[both]))
    # one continuous piece against a constant y: int (x - y)^2 dF(x) over x, exact
    for A, B, ka, jb in ((F, G, kf, jg), (G, F, kg, jf)):
        sel = (ka >= 0) & (jb >= 0)
        if np.any(sel):
            k = ka[sel]
            y = B.x[jb[sel]]
            x0, x1 = _inverse(A, k, ml[sel]), _inverse(A, k, mr[sel])
            total += float(np.sum(_moment2(A, k, x0, x1, y)))
    # two continuous pieces: Gauss-Legendre in m (16 nodes per interval)
    sel = cont_f & cont_g
    if np.any(sel):
        z, w = np.polynomial.legendre.leggauss(16)
        a, b = ml[sel][:, None], mr[sel][:, None]
        mm = 0.5 * (a + b) + 0.5 * (b - a) * z[None, :]
        qf = _inverse(F, np.broadcast_to(kf[sel][:, None], mm.shape), mm)
        qg = _inverse(G, np.broadcast_to(kg[sel][:, None], mm.shape), mm)
        total += float(np.sum(0.5 * (b - a) * w[None, :] * (qf - qg) ** 2))
    return math.sqrt(max(total, 0.0))


def _moment2(A: _CDF, k: np.ndarray, x0: np.ndarray, x1: np.ndarray, y: np.ndarray
             ) -> np.ndarray:
    r"""``int_{x0}^{x1} (x - y)^2 F'(x) dx`` inside piece ``k`` (``F' = c1 + 2 c2 s``)."""
    xk = A.x[k]
    c1, c2 = A.c[k, 1], A.c[k, 2]
    e = xk - y     # (x - y) = s + e

    def prim(s):   # int (s + e)^2 (c1 + 2 c2 s) ds
        return (c1 * (s ** 3 / 3 + e * s ** 2 + e * e * s)
                + 2 * c2 * (s ** 4 / 4 + 2 * e * s ** 3 / 3 + e * e * s ** 2 / 2))
    return prim(x1 - xk) - prim(x0 - xk)


# ------------------------------------------------------------------ public
def w1_line(a: Any, b: Any, *, weights_a: Any = None, weights_b: Any = None) -> float:
    r""":math:`W_1` between two measures on :math:`\mathbb R`, exactly from their CDFs.

    .. math:: W_1(\mu, \nu) = \int_{\mathbb R} |F_\mu(x) - F_\nu(x)|\,dx

    Parameters
    ----------
    a, b : array_like (N,) or (N, 1), or tuple ``(x, density)``
        Samples (the empirical measure, weighted by ``weights_a`` / ``weights_b``,
        uniform by default) or a density on strictly increasing nodes ``x``, read as its
        piecewise-linear interpolant (zero outside ``[x[0], x[-1]]``) normalised to
        mass one.
    weights_a, weights_b : array_like (N,), optional
        Non-negative, finite sample weights with a positive sum, of any scale: only the
        normalised weights :math:`w_i / \sum_j w_j` matter (divided by the largest
        weight first where the sum overflows or is subnormal:
        :func:`~transformer_pde.validation.normalize_weights`).

    Returns
    -------
    float
        Exact for these measures (piecewise-polynomial CDFs integrated in closed form).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Non-finite, badly shaped or negative input, or weights (a density) all zero,
        naming the argument (``weights of a``, ``a[1] (density values)``, ...).
    """
    return _w1(_line_measure("a", a, weights_a), _line_measure("b", b, weights_b))


def w2_line(a: Any, b: Any, *, weights_a: Any = None, weights_b: Any = None) -> float:
    r""":math:`W_2` between two measures on :math:`\mathbb R` from their quantile functions.

    .. math:: W_2^2(\mu, \nu) = \int_0^1 |F_\mu^{-1}(m) - F_\nu^{-1}(m)|^2\,dm

    Exact (closed form) when at least one of the measures is empirical; between two grid
    densities the integral over each interval of :math:`m` on which both quantile functions
    are smooth uses 16-point Gauss–Legendre quadrature (their quantile functions are
    square roots of quadratics there; the error is at rounding level unless a density
    vanishes at a node).  Arguments as in :func:`w1_line`.
    """
    return _w2(_line_measure("a", a, weights_a), _line_measure("b", b, weights_b))


def w1_circle(a: Any, b: Any, *, weights_a: Any = None, weights_b: Any = None) -> float:
    r""":math:`W_1` on the circle :math:`[0, 2\pi)` (geodesic cost), exactly from the CDFs.

    .. math::

        W_1(\mu, \nu) = \min_{c} \int_0^{2\pi} |F_\mu(\theta) - F_\nu(\theta) - c|\,d\theta

    with :math:`c` a median of :math:`F_\mu - F_\nu` for :math:`d\theta`.

    Parameters
    ----------
    a, b : array_like (N,), array_like (N, 2), or tuple ``(theta, density)``
        Angles (any real values, taken modulo :math:`2\pi`), points of the plane (their
        angles ``atan2(y, x)``), or a density at strictly increasing angles in
        :math:`[0, 2\pi)`, read as its periodic piecewise-linear interpolant normalised to
        mass one.
    weights_a, weights_b : array_like (N,), optional
        Non-negative, finite sample weights with a positive sum, of any scale (only the
        normalised weights matter, as in :func:`w1_line`).

    Returns
    -------
    float
        The distance in radians (at most :math:`\pi`).
    """
    return _w1(_circle_measure("a", a, weights_a), _circle_measure("b", b, weights_b),
               0.0, TWO_PI, circle=True)


def circle_quantile(theta: Any, density: Any, m: Any) -> np.ndarray:
    r"""Angles :math:`F^{-1}(m)` of the density ``(theta, density)`` on the circle (periodic
    piecewise-linear interpolant, as :func:`w1_circle` reads it; :math:`F` counted from
    the angle 0), for masses ``m`` in :math:`[0, 1]`: the inverse-CDF map that draws
    samples (``m`` uniform) or places tokens at quantiles.

    Raises
    ------
    ArgumentError
        A bad density (as :func:`w1_circle`) or masses outside :math:`[0, 1]`.
    """
    F = _circle_measure("density", (theta, density), None)
    mm = finite_array("m", m)
    if np.any(mm < 0) or np.any(mm > 1):
        raise ArgumentError("m must lie in [0, 1]")
    flat = mm.ravel()
    k = np.clip(np.searchsorted(F.c[:, 0], flat, side="right") - 1, 0, F.c.shape[0] - 1)
    return _inverse(F, k, flat).reshape(mm.shape)


def _solution_slices(solution: Any) -> tuple[str, np.ndarray, Any]:
    """``(geometry, times, slice(i) -> measure argument)`` of a mean-field solution."""
    times = getattr(solution, "times", None)
    if times is None:
        raise ArgumentTypeError(f"solution must be a mean-field solution (solve_line or "
                                f"solve_circle), got {type(solution).__name__}")
    if hasattr(solution, "theta"):
        th = np.asarray(solution.theta, float)
        dens = np.asarray(solution.density, float)
        return "circle", np.asarray(times, float), lambda i: (th, np.maximum(dens[i], 0.0))
    if hasattr(solution, "measure"):
        return "line", np.asarray(times, float), solution.measure
    raise ArgumentTypeError(f"solution must be a mean-field solution (solve_line or "
                            f"solve_circle), got {type(solution).__name__}")


def distance_to_pde(traj: Any, solution: Any, *, metric: str = "w1") -> np.ndarray:
    r"""Wasserstein distance between a particle run and a mean-field solution at each of the
    run's saved times.

    Parameters
    ----------
    traj : ParticleTrajectory
        A run of :func:`~transformer_pde.simulate` keeping its states: ``d = 1`` (tokens on
        the line) or ``d = 2`` (tokens on the unit circle, measured by their angles
        ``atan2``); the token weights are used.
    solution : LineSolution or CircleSolution
        The PDE solution; each saved time of ``traj`` must be one of ``solution.times``
        (to a relative :math:`10^{-9}`): no interpolation in time is made.
    metric : {"w1", "w2"}
        ``"w2"`` on the line only.  On the line the solution is measured through its
        node density (:meth:`~transformer_pde.meanfield.line.LineSolution.measure`), on the circle
        through its grid density (periodic piecewise-linear interpolant).

    Returns
    -------
    ndarray (T,)
        The distance at ``traj.times``.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Wrong types, dimensions that do not match the solution, a saved time that is not a
        solution time, ``metric="w2"`` on the circle.
    """
    require_kind(traj, "traj", (ResultKind.PARTICLES,))
    metric = choice("metric", metric, ("w1", "w2"))
    geometry, stimes, slice_of = _solution_slices(solution)
    if traj.states is None:
        raise ArgumentError("traj keeps no states (it was run with SaveAt(fn=...))")
    d = traj.states.shape[-1]
    if (geometry, d) not in (("line", 1), ("circle", 2)):
        raise ArgumentError(f"traj has tokens in dimension d = {d}; a {geometry} solution "
                            f"needs d = {1 if geometry == 'line' else 2}")
    if geometry == "circle" and metric == "w2":
        raise ArgumentError("metric='w2' is available on the line only")
    out = np.empty(len(traj.times))
    for i, t in enumerate(np.asarray(traj.times, float)):
        j = int(np.argmin(np.abs(stimes - t)))
        if abs(stimes[j] - t) > 1e-9 * max(1.0, abs(t)):
            raise ArgumentError(f"traj saved t={t:.6g}, which is not a time of the solution "
                                "(solve it with these times)")
        X = np.asarray(traj.states[i], float)
        if geometry == "circle":
            out[i] = w1_circle(X, slice_of(j), weights_a=traj.weights)
        else:
            fn = w1_line if metric == "w1" else w2_line
            out[i] = fn(X[:, 0], slice_of(j), weights_a=traj.weights)
    return out
