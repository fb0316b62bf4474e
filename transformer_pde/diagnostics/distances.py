r"""Distances between token measures: :func:`wasserstein` (exact, sliced or a debiased
Sinkhorn divergence), :func:`bures_wasserstein` between Gaussians and
:func:`conditional_wasserstein` between masked states."""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation
from ..errors import ArgumentError, ConvergenceWarning, SinkhornNotConverged
from ..sinkhorn.loop import sinkhorn_loop
from ..sinkhorn.options import Acceleration, EpsilonScaling, SoftMins, Stopping
from .common import weighted_moments

__all__ = ["EXACT_MAX_PAIRS", "EXACT_ROUND_UNITS", "WassersteinResult", "bures_wasserstein",
           "conditional_wasserstein", "token_distance", "wasserstein", "wasserstein_result"]

logger = logging.getLogger(__name__)


#: ``method="auto"`` in :func:`wasserstein` uses exact optimal transport while
#: ``N * M`` is at most this (about 2000 x 2000 tokens: a few seconds and 32 MB of
#: cost matrix), and the sliced distance beyond.
EXACT_MAX_PAIRS = 4_000_000

@dataclass(frozen=True)
class WassersteinResult:
    r"""A :math:`W_2` distance with what its method knows about its accuracy.

    Attributes
    ----------
    value : float
        :math:`W_2` (not squared), the value :func:`wasserstein` returns.
    method : str
        The method used (``"auto"`` resolved).
    resolution : float or None
        Exact method: absolute error bound from float64 rounding (see :func:`wasserstein`).
    reg : float or None
        Sinkhorn method: the absolute :math:`\varepsilon`.
    n_iter, err : tuple or None
        Sinkhorn method: iterations and final marginal error of the cross term and of the
        two self terms.
    converged : bool or None
        Sinkhorn method: all three problems reached ``tol``.
    divergence : float or None
        Sinkhorn method: :math:`S_\varepsilon` itself, possibly negative
        (``value`` is :math:`\sqrt{\max(S_\varepsilon, 0)}`).
    """

    value: float
    method: str
    resolution: float | None = None
    reg: float | None = None
    n_iter: tuple[int, int, int] | None = None
    err: tuple[float, float, float] | None = None
    converged: bool | None = None
    divergence: float | None = None


def wasserstein(X: Any, Y: Any, *, weights_x: Any = None, weights_y: Any = None,
                method: str = "exact", n_projections: int = 500, seed: int = 0,
                reg: float | None = None, rel_reg: float = 1e-2, max_iter: int = 1000,
                tol: float = 1e-3) -> float:
    r"""2-Wasserstein distance between empirical measures :math:`\sum_i a_i\delta_{x_i}`
    and :math:`\sum_j b_j \delta_{y_j}` (squared Euclidean cost).

    Parameters
    ----------
    X : array (N, d)
    Y : array (M, d)
    weights_x, weights_y : array, optional
        Non-negative masses (normalised; uniform by default).
    method : {"exact", "sliced", "sinkhorn", "auto"}
        * ``"exact"``: linear-programming optimal transport (``ot.emd2``), exact to round-off.
          The clouds are centred first, :math:`W_2^2 = |m_\mu - m_\nu|^2 +
          W_2^2(\tilde\mu, \tilde\nu)` (exact for any two measures; :math:`\tilde\mu,
          \tilde\nu` centred), and the costs formed from the centred tokens, scaled by a
          power of two: no cancellation for clouds translated far from the origin or very
          close to each other, no under/overflow for tiny or huge ones.  Resolution
          (absolute error bound from float64 rounding):
          :data:`EXACT_ROUND_UNITS` :math:`\epsilon\,(\sqrt d\,R + |m_\mu - m_\nu|)`,
          :math:`R` the largest centred coordinate, :math:`\epsilon = 2^{-52}`; returned
          as ``info["resolution"]``.  The input coordinates carry their own rounding,
          :math:`\epsilon\max|x|`, which no method can undo.
          Cost :math:`O(NM)` memory and roughly cubic time; practical up to a few thousand
          points (:data:`EXACT_MAX_PAIRS`).
        * ``"sliced"``: :math:`\sqrt{d}\,SW_2` with ``n_projections`` random directions drawn
          with the fixed ``seed`` (``ot.sliced_wasserstein_distance``).  Since
          :math:`E_\theta[\theta\theta^\top] = I/d`, projecting an optimal plan gives
          :math:`d\,SW_2^2 \le W_2^2`: the returned value is a **lower bound** of
          :math:`W_2` up to the Monte-Carlo error over directions (relative standard error
          about :math:`\sqrt{2/n_{proj}}` on the square), with equality in expectation for
          translates (:math:`\nu = \mu + \delta`) and exact equality in ``d = 1``.  Cost
          :math:`O(n_{proj}(N\log N + M\log M))`.
        * ``"sinkhorn"``: debiased Sinkhorn divergence
          :math:`S_\varepsilon = L_\varepsilon(\mu,\nu) - \tfrac12 L_\varepsilon(\mu,\mu) -
          \tfrac12 L_\varepsilon(\nu,\nu)`, with :math:`L_\varepsilon` the transport cost
          :math:`\langle P_\varepsilon, C\rangle` of the entropic plan, returned as
          :math:`\sqrt{\max(S_\varepsilon, 0)}`.  Log-domain Sinkhorn with
          :math:`\varepsilon`-scaling and Anderson acceleration (see ``_sinkhorn_cost``),
          computed in blocks of the cost matrix: memory :math:`O(N + M)` plus a fixed 1 MB
          block, never the :math:`N \times M` matrix.  Time :math:`O(NM)` per iteration; at
          the default ``rel_reg`` about 50--150 iterations (1.5 s at N = M = 2000 in 2-D
          on one core, 2.6 s for clustered clouds; see ``benchmarks/wasserstein.py``).
          Because :math:`P_\varepsilon` minimises :math:`\langle P, C\rangle - \varepsilon H(P)`
          and couplings have :math:`\max(H(a), H(b)) \le H(P) \le H(a) + H(b)`, it satisfies
          the guaranteed bracket (up to the Sinkhorn tolerance)

          .. math:: W_2^2 - \tfrac{\varepsilon}{2}(H(a) + H(b)) \le S_\varepsilon
                    \le W_2^2 + \varepsilon \min(H(a), H(b)),

          (:math:`H(a) = \log N` for uniform weights); "up to the tolerance" because each
          of the three plans is exact for marginals within a relative error ``tol`` of
          ``a``, ``b``.  In practice the debiased value is much closer (measured
          :math:`|S_\varepsilon - W_2^2|/W_2^2` of 1.5--3e-3 at the default ``rel_reg`` for
          2-D Gaussian clouds of 500--5000 points, 2--3e-2 for clustered ones), and it is
          exact for translates.
        * ``"auto"``: exact while ``N * M <= EXACT_MAX_PAIRS``, sliced beyond (the
          Sinkhorn divergence needs :math:`O(NM)` work per iteration and about 100
          iterations at ``rel_reg = 1e-2``: about a minute on one core at N = 10^4; ask for
          it explicitly when its error bracket is wanted).
    n_projections, seed : int
        Sliced method: number of directions and their random seed.
    reg : float, optional
        Sinkhorn :math:`\varepsilon` (absolute).  Default ``rel_reg`` times
        :math:`E_{\mu\otimes\nu}|x - y|^2` (the cost of the independent coupling), which
        makes the result scale invariant.
    max_iter, tol : int, float
        Sinkhorn stopping rule, for each of the three problems: the largest relative
        marginal error :math:`\max_j |\log((P^\top 1)_j / b_j)|` is below ``tol`` (the
        other marginal is exact), within ``max_iter`` iterations (annealing included);
        a warning is logged otherwise.

    Returns
    -------
    float
        :math:`W_2` (not squared).  :func:`wasserstein_result` takes the same arguments
        and returns a :class:`WassersteinResult`: the value with the exact method's
        rounding bound or the Sinkhorn method's :math:`\varepsilon`, iterations,
        marginal errors and divergence.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 2))
    >>> round(wasserstein(X, X + [3.0, 4.0]), 9)
    5.0
    """
    return wasserstein_result(X, Y, weights_x=weights_x, weights_y=weights_y, method=method,
                              n_projections=n_projections, seed=seed, reg=reg, rel_reg=rel_reg,
                              max_iter=max_iter, tol=tol).value


def wasserstein_result(X: Any, Y: Any, *, weights_x: Any = None, weights_y: Any = None,
                       method: str = "exact", n_projections: int = 500, seed: int = 0,
                       reg: float | None = None, rel_reg: float = 1e-2, max_iter: int = 1000,
                       tol: float = 1e-3) -> WassersteinResult:
    """:func:`wasserstein` with its accuracy information: a :class:`WassersteinResult`.

    The arguments are those of :func:`wasserstein`; ``result.value`` is its return value.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 2))
    >>> r = wasserstein_result(X, X + [3.0, 4.0])
    >>> round(r.value, 9), r.method, r.resolution < 1e-13
    (5.0, 'exact', True)
    """
    Xa = validation.points("X", X, column=True, keep_float32=False)
    Ya = validation.points("Y", Y, Xa.shape[1], column=True, keep_float32=False, d_from="X")
    a = validation.weights("weights_x", weights_x, Xa.shape[0])
    b = validation.weights("weights_y", weights_y, Ya.shape[0])
    method = validation.choice("method", method, ("exact", "sliced", "sinkhorn", "auto"))
    if method == "auto":
        method = "exact" if Xa.shape[0] * Ya.shape[0] <= EXACT_MAX_PAIRS else "sliced"
    import ot  # noqa: PLC0415 (POT is heavy to import)

    if method == "exact":
        val, res = _exact_w2(ot, Xa, Ya, a, b)
        return WassersteinResult(val, method, resolution=res)
    if method == "sliced":
        # the projections are held at once: d * n_projections floats
        n_projections = validation.integer("n_projections", n_projections, minimum=1,
                                           maximum=max(1, 10**8 // Xa.shape[1]))
        seed = validation.integer("seed", seed)
        d = Xa.shape[1]
        if d == 1:
            # every direction is +-1: one projection is exact
            n_projections = 1
        # a common translation (invariance) keeps the projections free of cancellation
        ref = Xa[0]
        sw = float(ot.sliced_wasserstein_distance(Xa - ref, Ya - ref, a, b, n_projections=int(n_projections),
                                                  p=2, seed=int(seed)))
        return WassersteinResult(math.sqrt(d) * sw, method)
    if method == "sinkhorn":
        if reg is None:
            ma, Ca = weighted_moments(Xa, a)
            mb, Cb = weighted_moments(Ya, b)
            scale = float(np.trace(Ca) + np.trace(Cb) + np.sum((ma - mb) ** 2))
            if scale == 0.0:
                return WassersteinResult(0.0, method, reg=0.0, n_iter=(0, 0, 0), err=(0.0, 0.0, 0.0),
                                         converged=True, divergence=0.0)
            reg = validation.positive("rel_reg", rel_reg) * scale
            if not math.isfinite(reg):
                raise ArgumentError(f"rel_reg={rel_reg!r} times the cost scale {scale:.3g} "
                                    "overflows: pass a smaller rel_reg or an absolute reg")
        else:
            reg = validation.positive("reg", reg)
        max_iter = validation.integer("max_iter", max_iter, minimum=1)
        tol = validation.positive("tol", tol)
        runs = (_sinkhorn_cost(Xa, Ya, a, b, reg, int(max_iter), tol),
                _sinkhorn_cost(Xa, Xa, a, a, reg, int(max_iter), tol, True),
                _sinkhorn_cost(Ya, Ya, b, b, reg, int(max_iter), tol, True))
        val = runs[0].cost - 0.5 * runs[1].cost - 0.5 * runs[2].cost
        if not math.isfinite(val):
            raise SinkhornNotConverged(
                f"wasserstein(method='sinkhorn'): the divergence is not finite (reg={reg:.3g}); "
                "the points or reg are beyond the float range of the solver")
        return WassersteinResult(math.sqrt(max(val, 0.0)), method, reg=float(reg),
                                 n_iter=tuple(r.n_iter for r in runs), err=tuple(r.err for r in runs),
                                 converged=all(r.converged for r in runs), divergence=float(val))
    raise AssertionError(method)  # pragma: no cover (validated above)


#: Relative rounding bound of :func:`wasserstein` (``method="exact"``), in units of the
#: float64 epsilon: the centring, the differences and squares of the cost and the
#: linear program's sums (see ``_exact_w2``).
EXACT_ROUND_UNITS = 16.0


def _exact_w2(ot: Any, X: np.ndarray, Y: np.ndarray, a: np.ndarray,
              b: np.ndarray) -> tuple[float, float]:
    r"""``(W2, resolution)`` of the exact method, free of cancellation.

    For any coupling :math:`\pi` of :math:`\mu, \nu` with means :math:`m_\mu, m_\nu`,
    :math:`E_\pi|x - y|^2 = |m_\mu - m_\nu|^2 + E_\pi|\tilde x - \tilde y|^2` (the cross
    term :math:`2(m_\mu - m_\nu)\cdot E_\pi[\tilde x - \tilde y]` vanishes), so
    :math:`W_2^2 = |m_\mu - m_\nu|^2 + W_2^2(\tilde\mu, \tilde\nu)` exactly, with
    :math:`\tilde\mu, \tilde\nu` the centred measures.  The means are taken about a common
    reference token (differences first, so a far translation does not round them away),
    the centred tokens are scaled by a power of two (exact) into the unit ball before the
    squared differences are formed (no under/overflow for tiny or huge clouds) and the
    linear program solves the centred problem.  ``resolution`` bounds the absolute error
    from float64 rounding, :data:`EXACT_ROUND_UNITS` :math:`\epsilon\,(R + |m_\mu - m_\nu|)`
    with :math:`R` the larger radius of the centred clouds (the tokens' own rounding, at
    :math:`\epsilon |x|`, is the caller's).
    """
    ref = X[0]
    Xc = X - ref
    Yc = Y - ref
    dm = a @ Xc - b @ Yc
    Xc = Xc - a @ Xc
    Yc = Yc - b @ Yc
    r = max(float(np.max(np.abs(Xc))), float(np.max(np.abs(Yc))))
    big = float(np.max(np.abs(dm)))
    # |dm|: scaled by its largest component (no under/overflow of the squares)
    mean_part = big * math.sqrt(float(np.sum((dm / big) ** 2))) if big > 0 else 0.0
    centred = 0.0
    if r > 0:
        ex = math.frexp(r)[1]
        Xs, Ys = np.ldexp(Xc, -ex), np.ldexp(Yc, -ex)
        M = np.sum((Xs[:, None, :] - Ys[None, :, :]) ** 2, axis=2)
        val = float(ot.emd2(a, b, M, numItermax=max(100_000, 50 * M.size)))
        centred = math.ldexp(math.sqrt(max(val, 0.0)), ex)
    w2 = math.hypot(mean_part, centred)
    rad = math.sqrt(Xc.shape[1]) * r
    return w2, EXACT_ROUND_UNITS * float(np.finfo(float).eps) * (rad + mean_part)


#: Entries of one cost block in the Sinkhorn passes: 1 MB blocks stay in cache (measured
#: 2.5x faster than 16 MB blocks at N = M = 2000) and bound the working memory.
_BLOCK = 131_072
#: Anderson memory of the final-epsilon Sinkhorn iterations.
_ANDERSON = 20
#: Epsilon-scaling: ratio of consecutive epsilons while annealing to the target.
_EPS_RATIO = 0.5
#: Cross-term annealing stages stop at this marginal error or after this many iterations.
_STAGE_TOL = 0.01
_STAGE_ITER = 40


def _sqdist(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    C = (X * X).sum(1)[:, None] + (Y * Y).sum(1)[None, :] - 2.0 * (X @ Y.T)
    return np.maximum(C, 0.0)


def _softmin(X: np.ndarray, Y: np.ndarray, logw: np.ndarray, h: np.ndarray,
             eps: float) -> np.ndarray:
    r""":math:`-\varepsilon \log \sum_j w_j \exp((h_j - |x_i - y_j|^2)/\varepsilon)` for every row
    of ``X``, in row blocks of at most ``_BLOCK`` cost entries (memory O(N + M)).

    Expanding :math:`|x - y|^2 = |x|^2 - 2x\cdot y + |y|^2`, the exponent up to the row
    constant :math:`|x_i|^2/\varepsilon` is one matrix product of :math:`(x_i, 1)` with
    :math:`(2y_j/\varepsilon, \log w_j + (h_j - |y_j|^2)/\varepsilon)`: five passes over a block
    (product, max, shift, exp, sum), 2.3x faster than forming the squared distances.  The
    rounding error is about :math:`10^{-16}\max|x|^2/\varepsilon` in units of
    :math:`\varepsilon`; :func:`_sinkhorn_cost` centres the points first.
    """
    n, m = X.shape[0], Y.shape[0]
    Yt = np.empty((Y.shape[1] + 1, m))
    Yt[:-1] = Y.T * (2.0 / eps)
    Yt[-1] = logw + (h - (Y * Y).sum(1)) / eps
    Xa = np.ones((n, X.shape[1] + 1))
    Xa[:, :-1] = X
    step = max(1, _BLOCK // max(1, m))
    buf = np.empty((min(step, n), m))
    out = np.empty(n)
    for i in range(0, n, step):
        Z = buf[:min(step, n - i)]
        np.matmul(Xa[i:i + step], Yt, out=Z)
        mx = Z.max(axis=1)
        Z -= mx[:, None]
        np.exp(Z, out=Z)
        out[i:i + step] = -eps * (mx + np.log(Z.sum(axis=1)))
    return out + (X * X).sum(1)


@dataclass
class _SinkhornRun:
    """Outcome of one entropic transport solve (internal)."""

    cost: float  # <P, C> of the entropic plan
    n_iter: int  # Sinkhorn iterations (alternating: one pass f, one pass g)
    err: float  # final max_j |log((P^T 1)_j / b_j)|, the stopping quantity
    converged: bool


def _sinkhorn_cost(X: np.ndarray, Y: np.ndarray, a: np.ndarray, b: np.ndarray, reg: float,
                   max_iter: int, tol: float, symmetric: bool = False) -> _SinkhornRun:
    r"""Transport cost :math:`\langle P_\varepsilon, C\rangle` of the entropic plan
    :math:`P_{ij} = a_i b_j e^{(f_i + g_j - |x_i - y_j|^2)/\varepsilon}`.

    Log-domain Sinkhorn on the dual potentials with :math:`\varepsilon`-scaling:
    :math:`\varepsilon_0` = squared diameter of both clouds (where one iteration nearly
    solves the problem), multiplied by ``_EPS_RATIO`` at every stage down to ``reg``, each
    stage warm-started from the last.  The stopping quantity is
    :math:`\max_j |\log((P^\top 1)_j / b_j)|`, the largest relative error of a marginal
    (the other marginal is exact after the last half-step), below ``tol``; ``max_iter``
    counts all iterations.

    Both are :func:`transformer_pde.sinkhorn.sinkhorn_loop` with the soft-min
    :func:`_softmin` (dense blocks of squared distances):

    * Cross term: at every stage, Anderson-accelerated alternating iterations
      (safeguarded by the dual objective) until the error is below
      ``_STAGE_TOL`` or ``_STAGE_ITER`` iterations (tracking the solution closely matters
      on clustered clouds: one iteration per stage left the cluster-level mass balance
      hundreds of iterations away), then to ``tol`` at ``reg``.
    * ``symmetric`` (``X = Y``, ``a = b``: the debiasing terms, whose potentials are
      equal): one averaged update :math:`f \leftarrow (f + Tf)/2` per stage (plain
      :math:`T` oscillates on the constant mode), then Anderson on :math:`T` itself at
      ``reg``, restarted from the best averaged iterate if the error grows tenfold (the
      residual safeguard, as in the Sinkhorn attention solver); one pass per iteration
      (measured 15--20 iterations in all cases tried).

    A stopped stage hands on the last image (``finish="image"``: half a Sinkhorn step past
    the iterate whose error was measured).

    Memory :math:`O(N + M)` plus one block of ``_BLOCK`` cost entries.
    """
    keep_a, keep_b = a > 0, b > 0  # zero-mass points would give log(0)
    X, a = X[keep_a], a[keep_a]
    Y, b = Y[keep_b], b[keep_b]
    la, lb = np.log(a), np.log(b)
    lo = np.minimum(X.min(0), Y.min(0))
    hi = np.maximum(X.max(0), Y.max(0))
    X, Y = X - 0.5 * (lo + hi), Y - 0.5 * (lo + hi)  # costs are translation invariant
    start = max(float(np.sum((hi - lo) ** 2)), reg)
    if symmetric:
        # one averaged sweep f <- (f + T f)/2 per coarse stage, then Anderson on T itself
        # at reg with the residual safeguard; the last image T f is returned
        res = sinkhorn_loop(np, SoftMins(lambda h, e: _softmin(X, X, la, h, e)), reg,
                            n=X.shape[0], stopping=Stopping(tol, max_iter, finish="image"),
                            acceleration=Acceleration(_ANDERSON),
                            scaling=EpsilonScaling(start, _EPS_RATIO, None, 1))
        f = g = res.g
    else:
        # every stage: alternating iterations, Anderson with the dual safeguard; coarse
        # stages to _STAGE_TOL within _STAGE_ITER iterations, then to tol at reg
        res = sinkhorn_loop(np, SoftMins(lambda h, e: _softmin(X, Y, lb, h, e),
                                         lambda h, e: _softmin(Y, X, la, h, e)), reg,
                            n=Y.shape[0], stopping=Stopping(tol, max_iter, finish="image"),
                            acceleration=Acceleration(_ANDERSON, "dual", marginals=(a, b)),
                            scaling=EpsilonScaling(start, _EPS_RATIO, _STAGE_TOL, _STAGE_ITER))
        g = res.g
        f = _softmin(X, Y, lb, g, reg)  # exact row marginals for the returned plan
    it, err = res.n_iter, res.err
    converged = bool(err < tol)
    if not converged:
        warnings.warn(f"wasserstein(method='sinkhorn'): not converged after {it} iterations "
                      f"(marginal error {err:.3g} > tol = {tol:.3g}); increase max_iter or reg",
                      ConvergenceWarning, stacklevel=4)
    # cost of the plan, in row blocks
    total = 0.0
    step = max(1, _BLOCK // max(1, Y.shape[0]))
    for i in range(0, X.shape[0], step):
        C = _sqdist(X[i:i + step], Y)
        logP = la[i:i + step, None] + lb[None, :] + (f[i:i + step, None] + g[None, :] - C) / reg
        total += float(np.sum(np.exp(logP) * C))
    return _SinkhornRun(cost=total, n_iter=it, err=err, converged=converged)


def bures_wasserstein(m1: Any, S1: Any, m2: Any, S2: Any) -> float:
    r"""2-Wasserstein distance between the Gaussians :math:`N(m_1, S_1)` and :math:`N(m_2, S_2)`.

    .. math:: W_2^2 = |m_1 - m_2|^2 + \operatorname{tr} S_1 + \operatorname{tr} S_2
              - 2\,\big\| S_2^{1/2} S_1^{1/2} \big\|_*

    where :math:`\|\cdot\|_*` (sum of singular values) equals
    :math:`\operatorname{tr}(S_1^{1/2} S_2 S_1^{1/2})^{1/2}`.  Square roots come from the
    eigen-decompositions with negative round-off eigenvalues clipped to zero, and the
    nuclear norm from an SVD, so singular (even zero) covariances give the finite, correct
    value -- e.g. between two Dirac masses the distance of their centres.  The result is
    also the :math:`W_2` distance between any two measures with these means and
    covariances that are images of each other by a linear map (it is always a lower
    bound of :math:`W_2` for arbitrary measures with these moments; Gelbrich bound).
    It is evaluated as :math:`|m_1-m_2|^2 + \min_U \|S_1^{1/2} - S_2^{1/2} U\|_F^2` over
    orthogonal :math:`U` (the minimiser comes from the SVD of :math:`S_2^{1/2} S_1^{1/2}`,
    and the minimum is the trace expression above), so the square is a sum of squares of
    a residual formed directly, without the cancellation of the trace difference: nearly
    coincident Gaussians get absolute accuracy about :math:`\epsilon_{mach}` times the
    scale of :math:`S^{1/2}` (only directions of near-zero variance, where the square root
    itself is ill-conditioned, keep an error up to
    :math:`\sqrt{\epsilon_{mach}\,\operatorname{tr}S}`).
    """
    from ..gaussian.affine import psd_factor  # noqa: PLC0415 (symmetric PSD square root)

    a = np.atleast_1d(validation.finite_array("m1", m1))
    b = np.atleast_1d(validation.finite_array("m2", m2))
    if a.ndim != 1 or b.shape != a.shape:
        raise ArgumentError(f"m1 and m2 must be vectors of the same length, got {a.shape}, "
                            f"{b.shape}")
    d = a.shape[0]
    # one rule for covariances (validation.covariance): symmetric and PSD up to round-off
    A = validation.covariance("S1", np.atleast_2d(validation.real_array("S1", S1)), d)
    B = validation.covariance("S2", np.atleast_2d(validation.real_array("S2", S2)), d)
    # W2^2 = |a - b|^2 + min_U ||F1 - F2 U||_F^2 over orthogonal U (F = S^{1/2}); the
    # minimiser is U = P Q^T from the SVD F2^T F1 = P diag(s) Q^T, and the minimum equals
    # tr S1 + tr S2 - 2 sum(s).  Forming the residual F1 - F2 U avoids the cancellation of
    # that trace difference when the two Gaussians nearly coincide.
    F1, F2 = psd_factor(A), psd_factor(B)
    P, _, Qt = np.linalg.svd(F2.T @ F1)
    resid = F1 - F2 @ (P @ Qt)
    return math.sqrt(float(np.sum((a - b) ** 2) + np.sum(resid * resid)))


def conditional_wasserstein(X: Any, Y: Any, positions_x: Any, positions_y: Any = None, *,
                            weights_x: Any = None, weights_y: Any = None,
                            atol: float = 1e-12) -> float:
    r"""Conditional 2-Wasserstein distance between masked states (positions never move).

    States live on :math:`[0,1]\times\mathbb{R}^d`; admissible plans keep positions, so
    both measures must have the same position marginal and

    .. math:: W_{2,\mathrm{cond}}^2(\mu, \nu) = \sum_s \lambda(s)\, W_2^2(\mu_s, \nu_s),

    with :math:`\lambda(s)` the mass at position :math:`s` and :math:`\mu_s, \nu_s` the
    (normalised) conditional measures of the tokens at that position (exact optimal
    transport within each position).  With one token per position this is the matched
    :math:`L^2` distance :math:`(\sum_i w_i |x_i - y_i|^2)^{1/2}` after sorting by position.

    Parameters
    ----------
    X, Y : array (N, d), (M, d)
    positions_x, positions_y : array (N,), (M,)
        Token positions in [0, 1]; ``positions_y`` defaults to ``positions_x`` (same tokens).
    weights_x, weights_y : array, optional
        Token masses (normalised; uniform by default).
    atol : float
        Tolerance on the equality of the mass at each position.

    Raises
    ------
    ValueError
        If the two position marginals differ (no position-preserving plan exists).
    """
    Xa = validation.points("X", X, column=True, keep_float32=False)
    Ya = validation.points("Y", Y, Xa.shape[1], column=True, keep_float32=False, d_from="X")
    px = np.asarray(positions_x, dtype=float)
    py = px if positions_y is None else np.asarray(positions_y, dtype=float)
    if px.shape != (Xa.shape[0],):
        raise ValueError(f"positions_x must have shape ({Xa.shape[0]},), got {px.shape}")
    if py.shape != (Ya.shape[0],):
        raise ValueError(f"positions_y must have shape ({Ya.shape[0]},), got {py.shape}")
    a = validation.weights("weights_x", weights_x, Xa.shape[0])
    b = validation.weights("weights_y", weights_y, Ya.shape[0])
    ux, inv_x = np.unique(px, return_inverse=True)
    uy, inv_y = np.unique(py, return_inverse=True)
    mass_x = np.bincount(inv_x, weights=a)
    mass_y = np.bincount(inv_y, weights=b)
    # positions carrying zero mass do not count
    ux, mass_x = ux[mass_x > atol], mass_x[mass_x > atol]
    uy, mass_y = uy[mass_y > atol], mass_y[mass_y > atol]
    if ux.shape != uy.shape or not np.array_equal(ux, uy) or \
            not np.allclose(mass_x, mass_y, rtol=0, atol=atol):
        raise ValueError("the two measures have different position marginals: no plan keeps "
                         "positions (positions_x/positions_y and weights must agree)")
    total = 0.0
    for s, lam in zip(ux, mass_x, strict=True):
        ix = np.flatnonzero(px == s)
        iy = np.flatnonzero(py == s)
        if ix.size == 1 and iy.size == 1:
            w2 = float(np.sum((Xa[ix[0]] - Ya[iy[0]]) ** 2))
        else:
            w2 = wasserstein(Xa[ix], Ya[iy], weights_x=a[ix], weights_y=b[iy]) ** 2
        total += lam * w2
    return math.sqrt(total)


def token_distance(X: Any, Y: Any, wx: Any, wy: Any, positions: Any, method: str) -> float:
    """:func:`conditional_wasserstein` when ``positions`` is given, else
    :func:`wasserstein` with ``method`` (the distance between two token states)."""
    if positions is not None:
        return conditional_wasserstein(X, Y, positions, weights_x=wx, weights_y=wy)
    return wasserstein(X, Y, weights_x=wx, weights_y=wy, method=method)
