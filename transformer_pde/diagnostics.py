r"""Diagnostics of attention flows: distances, stability, rank collapse, blow-up, clusters.

What users measure on a run of :func:`transformer_pde.simulate` (a
:class:`~transformer_pde.ParticleTrajectory`) or of :func:`transformer_pde.gaussian.solve`
(a Gaussian trajectory with ``times``, ``means``, ``covs``):

* **Distances** -- :func:`wasserstein` between empirical measures (exact optimal transport
  or sliced, through POT; or a debiased Sinkhorn divergence, log-domain and blocked, solved
  here), :func:`bures_wasserstein`
  between Gaussians (finite and correct for singular covariances) and
  :func:`conditional_wasserstein` between masked states (plans that keep token positions).
* **Stability** -- :func:`stability_profile` runs the flows of two initial measures and
  returns :math:`W_2(\mu_t, \nu_t)/W_2(\mu_0, \nu_0)` with an a-priori bound of the form of
  the paper's Theorem 3.1 (softmax, compact support; constants derived in
  :func:`stability_bound`); :func:`gaussian_stability_profile` does the same for two
  Gaussians with the Bures--Wasserstein distance.
* **Rank** -- :func:`numerical_rank`, :func:`effective_rank`, :func:`stable_rank` of a
  covariance, :func:`rank_profile` along a trajectory and :func:`rank_collapse`.
* **Blow-up** -- :func:`classify` a run as converged / finite-time blow-up (with
  :math:`T^*`) / diverging / undecided, with the fitted evidence.
* **Clusters** -- :func:`clusters` (single linkage at a scale relative to the cloud) and
  :func:`cluster_counts` along a trajectory.
* **Kinetic energy** -- :func:`kinetic_energy`:
  :math:`\int_0^T\!\int |\Gamma_{\mu_t}|^2 d\mu_t\,dt \ge W_2^2(\mu_0,\mu_T)/T` (Benamou--Brenier).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .attention import Attention
from .errors import ArgumentError
from .fields import check_weights, velocity
from .sinkhorn import _Anderson, _fixed_point

__all__ = [
    "Classification",
    "Clusters",
    "KineticEnergy",
    "RankCollapse",
    "RankProfile",
    "StabilityProfile",
    "EXACT_MAX_PAIRS",
    "bures_wasserstein",
    "classify",
    "cluster_counts",
    "clusters",
    "conditional_wasserstein",
    "effective_rank",
    "gaussian_stability_profile",
    "kinetic_energy",
    "numerical_rank",
    "rank_collapse",
    "rank_profile",
    "stability_bound",
    "stability_profile",
    "stable_rank",
    "wasserstein",
]

logger = logging.getLogger(__name__)

#: ``method="auto"`` in :func:`wasserstein` uses exact optimal transport while
#: ``N * M`` is at most this (about 2000 x 2000 tokens: a few seconds and 32 MB of
#: cost matrix), and the sliced distance beyond.
EXACT_MAX_PAIRS = 4_000_000


# =========================================================================== helpers
def _points(name: str, X: Any, d: int | None = None) -> np.ndarray:
    arr = np.asarray(X, dtype=float)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"{name} must have shape (N, d) with N >= 1, got {np.shape(X)}")
    if d is not None and arr.shape[1] != d:
        raise ValueError(f"{name} must have d={d} columns, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _weights(name: str, w: Any, n: int) -> np.ndarray:
    try:
        return check_weights(w, n)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _sym(name: str, S: Any, d: int | None = None) -> np.ndarray:
    arr = np.asarray(S, dtype=float)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.size == 0:
        raise ValueError(f"{name} must be a square (d, d) matrix, got shape {arr.shape}")
    if d is not None and arr.shape[0] != d:
        raise ValueError(f"{name} must be {d} x {d}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return 0.5 * (arr + arr.T)


def _weighted_moments(X: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = w @ X
    Y = X - m
    C = (Y * w[:, None]).T @ Y
    return m, 0.5 * (C + C.T)


def _entropy(w: np.ndarray) -> float:
    p = w[w > 0]
    return float(-(p * np.log(p)).sum())


# =========================================================================== distances
def wasserstein(X: Any, Y: Any, *, weights_x: Any = None, weights_y: Any = None,
                method: str = "exact", n_projections: int = 500, seed: int = 0,
                reg: float | None = None, rel_reg: float = 1e-2, max_iter: int = 1000,
                tol: float = 1e-3, info: dict | None = None) -> float:
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
    info : dict, optional
        Sinkhorn method: filled with ``reg`` (the absolute :math:`\varepsilon`),
        ``n_iter`` and ``err`` (iterations and final marginal error of the cross term and
        the two self terms), ``converged`` (all three below ``tol``) and ``divergence``
        (:math:`S_\varepsilon`, possibly negative).

    Returns
    -------
    float
        :math:`W_2` (not squared).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).normal(size=(50, 2))
    >>> round(wasserstein(X, X + [3.0, 4.0]), 9)
    5.0
    """
    Xa = _points("X", X)
    Ya = _points("Y", Y, Xa.shape[1])
    a = _weights("weights_x", weights_x, Xa.shape[0])
    b = _weights("weights_y", weights_y, Ya.shape[0])
    if method == "auto":
        method = "exact" if Xa.shape[0] * Ya.shape[0] <= EXACT_MAX_PAIRS else "sliced"
    import ot  # noqa: PLC0415 (POT is heavy to import)

    if method == "exact":
        M = ot.dist(Xa, Ya, metric="sqeuclidean")
        val = float(ot.emd2(a, b, M, numItermax=max(100_000, 50 * M.size)))
        return math.sqrt(max(val, 0.0))
    if method == "sliced":
        if int(n_projections) < 1:
            raise ValueError(f"n_projections must be >= 1, got {n_projections!r}")
        d = Xa.shape[1]
        if d == 1:
            # every direction is +-1: one projection is exact
            n_projections = 1
        sw = float(ot.sliced_wasserstein_distance(Xa, Ya, a, b, n_projections=int(n_projections),
                                                  p=2, seed=int(seed)))
        return math.sqrt(d) * sw
    if method == "sinkhorn":
        if reg is None:
            ma, Ca = _weighted_moments(Xa, a)
            mb, Cb = _weighted_moments(Ya, b)
            scale = float(np.trace(Ca) + np.trace(Cb) + np.sum((ma - mb) ** 2))
            if scale == 0.0:
                if info is not None:
                    info.update(reg=0.0, n_iter=(0, 0, 0), err=(0.0, 0.0, 0.0),
                                converged=True, divergence=0.0)
                return 0.0
            if not (np.isfinite(rel_reg) and rel_reg > 0):
                raise ValueError(f"rel_reg must be > 0, got {rel_reg!r}")
            reg = rel_reg * scale
        elif not (np.isfinite(reg) and reg > 0):
            raise ValueError(f"reg must be finite and > 0, got {reg!r}")
        if int(max_iter) < 1 or not (np.isfinite(tol) and tol > 0):
            raise ValueError(f"max_iter must be >= 1 and tol > 0, got {max_iter!r}, {tol!r}")
        runs = (_sinkhorn_cost(Xa, Ya, a, b, reg, int(max_iter), tol),
                _sinkhorn_cost(Xa, Xa, a, a, reg, int(max_iter), tol, True),
                _sinkhorn_cost(Ya, Ya, b, b, reg, int(max_iter), tol, True))
        val = runs[0].cost - 0.5 * runs[1].cost - 0.5 * runs[2].cost
        if info is not None:
            info.update(reg=float(reg), n_iter=tuple(r.n_iter for r in runs),
                        err=tuple(r.err for r in runs),
                        converged=all(r.converged for r in runs), divergence=float(val))
        return math.sqrt(max(val, 0.0))
    raise ValueError(f"method must be 'exact', 'sliced', 'sinkhorn' or 'auto', got {method!r}")


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


def _cross_stage(X: np.ndarray, Y: np.ndarray, a: np.ndarray, b: np.ndarray, g: np.ndarray,
                 eps: float, tol: float, max_iter: int, m: int
                 ) -> tuple[np.ndarray, np.ndarray, int, float]:
    r"""Alternating Sinkhorn at one ``eps`` from ``g``, Anderson-accelerated and safeguarded
    by the dual objective; returns ``(f, g, iterations, err)``.

    After :math:`f = T_f(g)` (exact row marginals) the dual objective
    :math:`\langle a, f\rangle + \langle b, g\rangle - \varepsilon\langle a\otimes b,
    e^{(f\oplus g - C)/\varepsilon}\rangle + \varepsilon` equals
    :math:`\langle a, f\rangle + \langle b, g\rangle`, for free.  Plain Sinkhorn increases
    it at every step; an Anderson extrapolation that decreases it is rejected (memory
    cleared, plain step from the last accepted point instead).  Hence no cycling: the worst
    case is plain Sinkhorn, which converges.  Measured on clustered clouds, where unguarded
    Anderson diverged or cycled.  ``err`` is :math:`\|T_g(f) - g\|_\infty/\varepsilon`, the
    log-marginal error of the columns.
    """
    la, lb = np.log(a), np.log(b)
    acc = _Anderson(m)
    inv = 1.0 / eps
    best, plain_next = -np.inf, g
    f, err, it = g[:0], np.inf, 0
    while it < max_iter:
        it += 1
        f = _softmin(X, Y, lb, g, eps)
        dual = float(a @ f + b @ g)
        if dual < best - 1e-13 * (abs(best) + eps):
            acc.reset()
            g = plain_next
            continue
        best = dual
        g_new = _softmin(Y, X, la, f, eps)
        err = float(np.max(np.abs(g_new - g))) * inv
        if err < tol or not np.isfinite(err):
            g = g_new
            break
        plain_next = g_new
        g = eps * acc.step(np, g * inv, (g_new - g) * inv)
    return f, g, it, err


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

    * Cross term: at every stage, Anderson-accelerated alternating iterations
      (:func:`_cross_stage`, safeguarded by the dual objective) until the error is below
      ``_STAGE_TOL`` or ``_STAGE_ITER`` iterations (tracking the solution closely matters
      on clustered clouds: one iteration per stage left the cluster-level mass balance
      hundreds of iterations away), then to ``tol`` at ``reg``.
    * ``symmetric`` (``X = Y``, ``a = b``: the debiasing terms, whose potentials are
      equal): one averaged update :math:`f \leftarrow (f + Tf)/2` per stage (plain
      :math:`T` oscillates on the constant mode), then Anderson on :math:`T` itself at
      ``reg``, restarted from the best averaged iterate if the error grows tenfold (the
      safeguarded loop of the Sinkhorn attention solver, ``sinkhorn._fixed_point``); one
      pass per iteration (measured 15--20 iterations in all cases tried).

    Memory :math:`O(N + M)` plus one block of ``_BLOCK`` cost entries.
    """
    keep_a, keep_b = a > 0, b > 0  # zero-mass points would give log(0)
    X, a = X[keep_a], a[keep_a]
    Y, b = Y[keep_b], b[keep_b]
    la, lb = np.log(a), np.log(b)
    lo = np.minimum(X.min(0), Y.min(0))
    hi = np.maximum(X.max(0), Y.max(0))
    X, Y = X - 0.5 * (lo + hi), Y - 0.5 * (lo + hi)  # costs are translation invariant
    eps = max(float(np.sum((hi - lo) ** 2)), reg)
    it, err = 0, np.inf
    if symmetric:
        f = np.zeros(X.shape[0])
        while eps > reg and it < max_iter:
            it += 1
            f = 0.5 * (f + _softmin(X, X, la, f, eps))
            eps = max(_EPS_RATIO * eps, reg)

        def T(f):
            Tf = _softmin(X, X, la, f, reg)
            return Tf, Tf

        f, Tf, err, k = _fixed_point(np, T, f, reg, tol, max_iter - it, _Anderson(_ANDERSON),
                                     plain=lambda f, Tf: 0.5 * (f + Tf))
        it += k
        if k and (err < tol or not np.isfinite(err)):
            f = Tf  # stopped: return the last evaluation, whose error was measured
        g = f
    else:
        g = np.zeros(Y.shape[0])
        while eps > reg and it < max_iter:
            _, g, k, _ = _cross_stage(X, Y, a, b, g, eps, _STAGE_TOL,
                                      min(_STAGE_ITER, max_iter - it), _ANDERSON)
            it += k
            eps = max(_EPS_RATIO * eps, reg)
        if it < max_iter:
            _, g, k, err = _cross_stage(X, Y, a, b, g, reg, tol, max_iter - it, _ANDERSON)
            it += k
        f = _softmin(X, Y, lb, g, reg)  # exact row marginals for the returned plan
    converged = bool(err < tol)
    if not converged:
        logger.warning("wasserstein(method='sinkhorn'): not converged after %d iterations "
                       "(marginal error %.3g > tol = %.3g); increase max_iter or reg", it,
                       err, tol)
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
    from .gaussian.affine import psd_factor as _psd_factor  # noqa: PLC0415

    a = np.atleast_1d(np.asarray(m1, dtype=float))
    b = np.atleast_1d(np.asarray(m2, dtype=float))
    if a.ndim != 1 or b.shape != a.shape:
        raise ValueError(f"m1 and m2 must be vectors of the same length, got {a.shape}, {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("m1 / m2 contain NaN or inf")
    d = a.shape[0]
    A = _sym("S1", np.atleast_2d(S1), d)
    B = _sym("S2", np.atleast_2d(S2), d)
    for name, S in (("S1", A), ("S2", B)):
        lam = np.linalg.eigvalsh(S)
        if lam[0] < -1e-8 * max(1.0, abs(lam[-1])):
            raise ValueError(f"{name} must be positive semi-definite (eigenvalue {lam[0]:.3g})")
    # W2^2 = |a - b|^2 + min_U ||F1 - F2 U||_F^2 over orthogonal U (F = S^{1/2}); the
    # minimiser is U = P Q^T from the SVD F2^T F1 = P diag(s) Q^T, and the minimum equals
    # tr S1 + tr S2 - 2 sum(s).  Forming the residual F1 - F2 U avoids the cancellation of
    # that trace difference when the two Gaussians nearly coincide.
    F1, F2 = _psd_factor(A), _psd_factor(B)
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
    Xa = _points("X", X)
    Ya = _points("Y", Y, Xa.shape[1])
    px = np.asarray(positions_x, dtype=float)
    py = px if positions_y is None else np.asarray(positions_y, dtype=float)
    if px.shape != (Xa.shape[0],):
        raise ValueError(f"positions_x must have shape ({Xa.shape[0]},), got {px.shape}")
    if py.shape != (Ya.shape[0],):
        raise ValueError(f"positions_y must have shape ({Ya.shape[0]},), got {py.shape}")
    a = _weights("weights_x", weights_x, Xa.shape[0])
    b = _weights("weights_y", weights_y, Ya.shape[0])
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
    for s, lam in zip(ux, mass_x):
        ix = np.flatnonzero(px == s)
        iy = np.flatnonzero(py == s)
        if ix.size == 1 and iy.size == 1:
            w2 = float(np.sum((Xa[ix[0]] - Ya[iy[0]]) ** 2))
        else:
            w2 = wasserstein(Xa[ix], Ya[iy], weights_x=a[ix], weights_y=b[iy]) ** 2
        total += lam * w2
    return math.sqrt(total)


def _distance(X, Y, wx, wy, positions, method):
    if positions is not None:
        return conditional_wasserstein(X, Y, positions, weights_x=wx, weights_y=wy)
    return wasserstein(X, Y, weights_x=wx, weights_y=wy, method=method)


# =========================================================================== stability
@dataclass
class StabilityProfile:
    r"""Output of :func:`stability_profile` / :func:`gaussian_stability_profile`.

    Attributes
    ----------
    times : ndarray (T,)
    w2 : ndarray (T,)
        :math:`W_2(\mu_t, \nu_t)` (Bures--Wasserstein for Gaussians, conditional for masked).
    ratio : ndarray (T,)
        ``w2 / w2[0]``.
    bound : ndarray (T,) or None
        A-priori bound on ``ratio`` (:func:`stability_bound`); None where no bound is
        available (kinds other than unmasked softmax, Gaussians).
    radius_bound : ndarray (T,) or None
        A-priori support radius :math:`R(t)` used in the bound.
    radius : ndarray (T,) or None
        Observed support radius :math:`\max_i |x_i(t)|` of both clouds (particles only).
    traj_x, traj_y : trajectory
        The two runs.
    info : dict
        Constants and method used.
    """

    times: np.ndarray
    w2: np.ndarray
    ratio: np.ndarray
    bound: np.ndarray | None
    radius_bound: np.ndarray | None
    radius: np.ndarray | None
    traj_x: Any
    traj_y: Any
    info: dict = field(default_factory=dict)

    @property
    def max_ratio_over_bound(self) -> float:
        """``max_t ratio(t) / bound(t)``: at most 1 when the bound holds (nan without bound)."""
        if self.bound is None:
            return float("nan")
        return float(np.max(self.ratio / self.bound))


def _softmax_constants(P, R: float) -> tuple[float, float, float]:
    """(v, L_x, L_mu) of Theorem 3.1's derivation at frozen parameters P and radius R."""
    wo = 1.0 if P.W_O is None else float(np.linalg.norm(P.W_O, 2))
    v2 = lx2 = lm2 = 0.0
    for head in P.heads:
        nv = float(np.linalg.norm(head.V, 2))
        ah = abs(P.beta) * float(np.linalg.norm(head.A, 2)) * R * R
        v2 += nv * nv
        lx2 += (nv * ah) ** 2
        if nv > 0 and ah > 300.0:  # e^{2 a_h} overflows: the bound is infinite from here on
            lm2 = math.inf
        else:
            lm2 += (nv * math.exp(ah) * (1.0 + ah)) ** 2
    return wo * math.sqrt(v2), wo * math.sqrt(lx2), wo * math.sqrt(lm2)


def stability_bound(att: Attention, R0: float, times: Any, *, n_sub: int = 8
                    ) -> tuple[np.ndarray, np.ndarray]:
    r"""A-priori bound on :math:`W_2(\mu_t,\nu_t)/W_2(\mu_0,\nu_0)` for softmax attention
    and measures supported in the ball :math:`B(0, R_0)`.

    **Statement.**  If :math:`\mu_0, \nu_0` are supported in :math:`B(0, R_0)`, then for the
    softmax flow (any number of heads, temperature :math:`\beta`, output matrix :math:`W_O`)

    .. math:: W_2(\mu_t, \nu_t) \le \exp\Big(\int_0^t L(s)\,ds\Big)\, W_2(\mu_0, \nu_0),
              \qquad L = L_x + L_\mu ,

    with, writing :math:`\|\cdot\|` for spectral norms, :math:`A_h = K_h^\top Q_h` and
    :math:`a_h(s) = |\beta|\,\|A_h\| R(s)^2`,

    .. math::
        v &= \|W_O\| \big(\textstyle\sum_h \|V_h\|^2\big)^{1/2}, \qquad
        R(t) = R_0 \exp\Big(\int_0^t v(s)\,ds\Big), \\
        L_x &= \|W_O\| \big(\textstyle\sum_h \|V_h\|^2 a_h^2\big)^{1/2}, \qquad
        L_\mu = \|W_O\| \big(\textstyle\sum_h \|V_h\|^2 e^{2 a_h} (1 + a_h)^2\big)^{1/2}.

    **Derivation.**  (i) *Support.*  Head :math:`h` outputs :math:`V_h m_h(x)` with
    :math:`m_h(x)` a convex combination of tokens, so :math:`|\Gamma_\mu(x)| \le v R` when
    :math:`\mathrm{supp}\,\mu \subset B(0,R)`; then :math:`r(t) = \max_i |x_i(t)|` obeys
    :math:`D^+ r \le v r` and stays below :math:`R(t)` (the SPEC's radius growth).
    (ii) *Lipschitz in x.*  :math:`\partial_x m_h = \beta\, \mathrm{Cov}_{P_x}(y)\, A_h`
    where :math:`P_x` is the attention distribution on :math:`B(0,R)`, whose covariance has
    norm at most :math:`R^2`; stacking heads gives :math:`L_x`.
    (iii) *Lipschitz in the measure.*  Let :math:`\pi` couple :math:`(\mu, \nu)` (both on
    :math:`B(0,R)`), :math:`D_\pi^2 = \int|y - y'|^2 d\pi`, and interpolate
    :math:`y_\theta = y + \theta\Delta`, :math:`\Delta = y' - y`, :math:`\theta\in[0,1]`
    (still in the ball).  With :math:`k(z) = e^{\beta z^\top A_h x}` and :math:`E_\theta` the
    expectation under :math:`k(y_\theta)\,d\pi / Z_\theta`, the head average
    :math:`m(\theta)` of :math:`\mathrm{law}(y_\theta)` satisfies
    :math:`m'(\theta) = E_\theta[\Delta] + \beta E_\theta[(y_\theta - m)(A_h x)^\top\Delta]`.
    The exponent of :math:`k` varies by at most :math:`2a_h` on the ball, so
    :math:`k/Z_\theta \le e^{2a_h}` and, by Cauchy--Schwarz with :math:`E_\pi[k/Z_\theta] = 1`,
    :math:`E_\theta|\Delta| \le (E_\theta|\Delta|^2)^{1/2} \le e^{a_h} D_\pi`; with
    :math:`E_\theta|y_\theta - m|^2 \le R^2` and :math:`|A_h x| \le \|A_h\| R` this gives
    :math:`|m_{h,\mu}(x) - m_{h,\nu}(x)| \le e^{a_h}(1 + a_h)\,D_\pi`; stacking heads gives
    :math:`L_\mu`.
    (iv) *Grönwall.*  Push the optimal coupling :math:`\pi_0` of :math:`(\mu_0,\nu_0)` forward
    by the two flows: :math:`\pi_t` couples :math:`(\mu_t,\nu_t)`, and
    :math:`D(t)^2 = \int |x - y|^2 d\pi_t \ge W_2^2(\mu_t,\nu_t)` satisfies
    :math:`\tfrac{d}{dt} D^2 = 2\int (x - y)\cdot(\Gamma_{\mu_t}(x) - \Gamma_{\nu_t}(y))\,d\pi_t
    \le 2 D\,(L_x D + L_\mu D)`, using (ii), (iii) (with :math:`\pi = \pi_t`) and
    Cauchy--Schwarz with the common
    radius :math:`R(t)` of both supports.  So :math:`D(t) \le e^{\int L} D(0)` and
    :math:`D(0) = W_2(\mu_0,\nu_0)`.  The argument holds for any measures, empirical ones
    included, with any weights; it is tight for :math:`A = 0, V = vI` and translated
    measures (ratio :math:`e^{vt}` exactly), and very loose when :math:`a_h \gtrsim 1`
    (the factor :math:`e^{a_h}` comes from the worst-case concentration of the attention
    weights, and :math:`R(t)` grows whether or not the tokens do, so :math:`a_h` grows like
    :math:`e^{2\int v}`).

    **Quadrature.**  Each interval between consecutive ``times`` is split into ``n_sub``
    pieces; :math:`\int v` uses the parameters at each piece's midpoint (exact for constant
    parameters and for :class:`~transformer_pde.Layers` whose boundaries fall on piece ends),
    and :math:`\int L` uses the same parameters with the radius at the piece's right end
    (an upper sum, since :math:`R` is non-decreasing).

    Parameters
    ----------
    att : Attention
        Unmasked softmax attention.
    R0 : float
        Radius of a ball centred at 0 containing both initial supports.
    times : array (T,)
        Increasing times starting at 0.
    n_sub : int
        Quadrature pieces per interval.

    Returns
    -------
    bound : ndarray (T,)
        :math:`\exp(\int_0^t L)` (``inf`` once it overflows).
    radius : ndarray (T,)
        :math:`R(t)`.
    """
    if not isinstance(att, Attention):
        raise TypeError(f"att must be a transformer_pde.Attention, got {type(att).__name__}")
    if att.kind != "softmax" or att.masked:
        raise ValueError("stability_bound is derived for unmasked softmax attention only, got "
                         f"kind={att.kind!r}, masked={att.masked}")
    if att.has_bias:
        raise ArgumentError("stability_bound is derived for linear query/key/value maps; att has "
                            "bias vectors (b_Q/b_K/b_V/b_O), for which the bound does not hold")
    R0 = float(R0)
    if not (np.isfinite(R0) and R0 >= 0):
        raise ValueError(f"R0 must be finite and >= 0, got {R0!r}")
    t = np.asarray(times, dtype=float)
    if t.ndim != 1 or t.size == 0 or t[0] != 0.0 or np.any(np.diff(t) <= 0):
        raise ValueError("times must be a strictly increasing 1-D array starting at 0")
    if int(n_sub) < 1:
        raise ValueError(f"n_sub must be >= 1, got {n_sub!r}")
    int_v = 0.0
    int_L = 0.0
    bound = [1.0]
    radius = [R0]
    for t0, t1 in zip(t[:-1], t[1:]):
        edges = np.linspace(t0, t1, int(n_sub) + 1)
        for s0, s1 in zip(edges[:-1], edges[1:]):
            P = att.at(0.5 * (s0 + s1))
            v, _, _ = _softmax_constants(P, 0.0)
            int_v += v * (s1 - s0)
            R1 = R0 * math.exp(min(int_v, 700.0))
            _, lx, lm = _softmax_constants(P, R1)
            int_L += (lx + lm) * (s1 - s0)
        with np.errstate(over="ignore"):
            bound.append(float(np.exp(int_L)))
            radius.append(float(R0 * np.exp(int_v)))
    return np.asarray(bound), np.asarray(radius)


def stability_profile(att: Attention, X0: Any, Y0: Any, *, t_max: float, dt: float = 0.05,
                      weights_x: Any = None, weights_y: Any = None, positions: Any = None,
                      method: Any = "rk4", w2_method: str = "exact", n_sub: int = 8,
                      **simulate_kwargs: Any) -> StabilityProfile:
    r"""Run the particle flows of :math:`\mu_0` (tokens ``X0``) and :math:`\nu_0` (``Y0``) and
    compare :math:`W_2(\mu_t,\nu_t)/W_2(\mu_0,\nu_0)` with the a-priori bound.

    Both runs use the same saving times, so the ratio is available at every saved time.
    For unmasked softmax attention the bound of :func:`stability_bound` (the paper's
    Theorem 3.1 for compactly supported data) is returned with :math:`R_0` the largest
    initial token norm; it bounds the exact flow, and the time-stepping error of the
    integrator (RK4 by default) is far below it for moderate ``dt``.  For masked attention
    (``positions`` given, shared by both clouds) the distance is
    :func:`conditional_wasserstein` and no bound is given.

    Parameters
    ----------
    att : Attention
    X0, Y0 : array (N, d), (M, d)
        Initial tokens of the two measures (different from each other).
    t_max, dt, method
        Passed to :func:`~transformer_pde.simulate` (``save_every`` too, via kwargs).
    weights_x, weights_y : array, optional
        Token masses.
    positions : array (N,), optional
        Token positions (masked attention; ``N = M`` with the same positions).
    w2_method : str
        ``method`` of :func:`wasserstein`.
    n_sub : int
        Quadrature pieces per saved interval for the bound.
    **simulate_kwargs
        Further arguments of :func:`~transformer_pde.simulate` (``backend``, ...).

    Returns
    -------
    StabilityProfile
    """
    from .particles import simulate  # noqa: PLC0415

    if not isinstance(att, Attention):
        raise TypeError(f"att must be a transformer_pde.Attention, got {type(att).__name__}")
    Xa = _points("X0", X0, att.d)
    Ya = _points("Y0", Y0, att.d)
    wx = _weights("weights_x", weights_x, Xa.shape[0])
    wy = _weights("weights_y", weights_y, Ya.shape[0])
    w2_0 = _distance(Xa, Ya, wx, wy, positions, w2_method)
    if w2_0 == 0.0:
        raise ValueError("X0 and Y0 define the same measure (W2 = 0): the ratio is undefined")
    common = dict(t_max=t_max, dt=dt, method=method, positions=positions, **simulate_kwargs)
    tx = simulate(att, Xa, weights=wx, **common)
    ty = simulate(att, Ya, weights=wy, **common)
    n = min(len(tx.times), len(ty.times))
    if not np.allclose(tx.times[:n], ty.times[:n]):
        raise RuntimeError("the two runs saved at different times")  # pragma: no cover
    if tx.status != "ok" or ty.status != "ok":
        logger.warning("stability_profile: a run stopped early (%s / %s); profile truncated",
                       tx.message, ty.message)
    times = tx.times[:n]
    w2 = np.array([w2_0] + [_distance(tx.states[k], ty.states[k], wx, wy, positions, w2_method)
                            for k in range(1, n)])
    radius = np.maximum(np.linalg.norm(tx.states[:n], axis=2).max(axis=1),
                        np.linalg.norm(ty.states[:n], axis=2).max(axis=1))
    bound = radius_bound = None
    info: dict[str, Any] = {"w2_method": "conditional" if positions is not None else w2_method,
                            "dt": dt, "method": str(method)}
    if att.kind == "softmax" and not att.masked:
        bound, radius_bound = stability_bound(att, float(radius[0]), times, n_sub=n_sub)
        info["R0"] = float(radius[0])
        info["bound"] = "Theorem 3.1 (softmax, compact support): see stability_bound"
    else:
        info["bound"] = f"no a-priori bound implemented for kind={att.kind!r}, masked={att.masked}"
    return StabilityProfile(times, w2, w2 / w2_0, bound, radius_bound, radius, tx, ty, info)


def gaussian_stability_profile(att: Attention, gauss0: Sequence[Any], gauss1: Sequence[Any], *,
                               t_max: float, n_times: int = 101,
                               **solve_kwargs: Any) -> StabilityProfile:
    r"""Bures--Wasserstein stability of the Gaussian moment flow.

    Solves the mean/covariance ODEs (:func:`transformer_pde.gaussian.solve`) from
    ``gauss0 = (mean0, cov0)`` and ``gauss1 = (mean1, cov1)`` and returns
    :math:`BW(\mu_t,\nu_t)/BW(\mu_0,\nu_0)` on ``n_times`` equally spaced times in
    :math:`[0, t_{max}]`, as far as both runs go (a run stops at a blow-up or when it
    has converged).  Gaussians are
    not compactly supported, so Theorem 3.1 does not apply and ``bound`` is None.
    """
    from . import gaussian  # noqa: PLC0415

    m0, S0 = gauss0
    m1, S1 = gauss1
    w0 = bures_wasserstein(m0, S0, m1, S1)
    if w0 == 0.0:
        raise ValueError("the two Gaussians coincide (BW = 0): the ratio is undefined")
    if int(n_times) < 2:
        raise ValueError(f"n_times must be >= 2, got {n_times!r}")
    grid = np.linspace(0.0, float(t_max), int(n_times))
    ta = gaussian.solve(att, m0, S0, t_max=t_max, t_eval=grid, **solve_kwargs)
    tb = gaussian.solve(att, m1, S1, t_max=t_max, t_eval=grid, **solve_kwargs)
    (ma, Sa), (mb, Sb) = _on_grid(ta, grid), _on_grid(tb, grid)
    n = min(len(ma), len(mb))  # a run may stop early at a blow-up
    times = grid[:n]
    w2 = np.array([bures_wasserstein(ma[k], Sa[k], mb[k], Sb[k]) for k in range(n)])
    return StabilityProfile(times, w2, w2 / w0, None, None, None, ta, tb,
                            {"w2_method": "bures_wasserstein",
                             "bound": "none: Gaussians are not compactly supported"})


def _on_grid(traj: Any, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Moments of a Gaussian run saved at ``grid``; a run that stopped because it
    converged is continued by its (stationary) final state."""
    n = len(traj.times)
    if not np.allclose(traj.times, grid[:n]):
        raise RuntimeError("gaussian.solve did not save at t_eval")  # pragma: no cover
    means, covs = np.asarray(traj.means), np.asarray(traj.covs)
    if n < len(grid) and traj.status == "converged":
        pad = len(grid) - n
        means = np.concatenate([means, np.repeat(means[-1:], pad, axis=0)])
        covs = np.concatenate([covs, np.repeat(covs[-1:], pad, axis=0)])
    return means, covs


# =========================================================================== rank
def _spectrum(S: Any) -> np.ndarray:
    lam = np.linalg.eigvalsh(_sym("S", S))
    return np.clip(lam, 0.0, None)[::-1]


def numerical_rank(S: Any, rtol: float = 1e-6, atol: float = 0.0) -> int:
    r"""Number of eigenvalues of the PSD matrix ``S`` above ``max(rtol * lambda_max, atol)``.

    Zero for the zero matrix.  Invariant under :math:`S \mapsto c\,U S U^\top` (scaling,
    rotation) when ``atol = 0``; ``atol`` is an absolute floor for covariances that are
    pure round-off (e.g. of coincident tokens far from the origin)."""
    if not (np.isfinite(rtol) and 0 <= rtol < 1):
        raise ValueError(f"rtol must be in [0, 1), got {rtol!r}")
    if not (np.isfinite(atol) and atol >= 0):
        raise ValueError(f"atol must be finite and >= 0, got {atol!r}")
    lam = _spectrum(S)
    if lam[0] <= atol:
        return 0
    return int(np.sum(lam > max(rtol * lam[0], atol)))


def effective_rank(S: Any) -> float:
    r"""Entropy (effective) rank :math:`\exp(-\sum_i p_i \log p_i)` with
    :math:`p_i = \lambda_i / \sum_j \lambda_j` (Roy & Vetterli 2007).

    Between 1 (rank one) and :math:`d` (isotropic); 0 for the zero matrix."""
    lam = _spectrum(S)
    total = lam.sum()
    if total <= 0:
        return 0.0
    return float(math.exp(_entropy(lam / total)))


def stable_rank(S: Any) -> float:
    r"""Stable rank :math:`\operatorname{tr} S / \lambda_{\max}(S)` of a covariance ``S``.

    Equals :math:`\|Y\|_F^2 / \|Y\|_2^2` for the centred data matrix :math:`Y` whose
    covariance is ``S``; between 1 and :math:`d`; 0 for the zero matrix."""
    lam = _spectrum(S)
    if lam[0] <= 0:
        return 0.0
    return float(lam.sum() / lam[0])


def _moments(traj: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, means (T, d), covs (T, d, d)) of a particle or Gaussian trajectory."""
    if hasattr(traj, "covs") and hasattr(traj, "means"):
        return (np.asarray(traj.times, dtype=float), np.asarray(traj.means, dtype=float),
                np.asarray(traj.covs, dtype=float))
    if hasattr(traj, "states"):
        states = np.asarray(traj.states, dtype=float)
        w = np.asarray(traj.weights, dtype=float)
        means = np.einsum("n,tnd->td", w, states)
        Y = states - means[:, None, :]
        covs = np.einsum("n,tni,tnj->tij", w, Y, Y)
        return np.asarray(traj.times, dtype=float), means, 0.5 * (covs + covs.transpose(0, 2, 1))
    raise TypeError("traj must be a ParticleTrajectory (times, states, weights) or a Gaussian "
                    f"trajectory (times, means, covs), got {type(traj).__name__}")


@dataclass
class RankProfile:
    """Ranks of the token covariance at each saved time (see :func:`rank_profile`)."""

    times: np.ndarray
    numerical: np.ndarray
    effective: np.ndarray
    stable: np.ndarray


def rank_profile(traj: Any, rtol: float = 1e-6) -> RankProfile:
    """:func:`numerical_rank` (with ``rtol``), :func:`effective_rank` and :func:`stable_rank`
    of the covariance of the tokens (particles, weighted) or of :math:`\\Sigma(t)` (Gaussian)
    at every saved time.  Non-finite saved states give NaN / -1.

    For particles, covariance eigenvalues below :math:`(10^3\\epsilon_{mach})^2 E|x|^2` are
    round-off of the centring and count as zero (a cloud collapsed to one point has rank 0).
    """
    times, means, covs = _moments(traj)
    floors = np.zeros(len(times))
    if hasattr(traj, "states"):
        m2 = np.trace(covs, axis1=1, axis2=2) + np.sum(means ** 2, axis=1)
        floors = (1e3 * np.finfo(float).eps) ** 2 * m2
    num, eff, stb = [], [], []
    for S, floor in zip(covs, floors):
        if not np.all(np.isfinite(S)):
            num.append(-1)
            eff.append(np.nan)
            stb.append(np.nan)
            continue
        if np.linalg.eigvalsh(_sym("S", S))[-1] <= floor:
            S = np.zeros_like(S)
        num.append(numerical_rank(S, rtol))
        eff.append(effective_rank(S))
        stb.append(stable_rank(S))
    return RankProfile(times, np.asarray(num, dtype=int), np.asarray(eff), np.asarray(stb))


@dataclass
class RankCollapse:
    """When the numerical rank of the token covariance drops (see :func:`rank_collapse`).

    Attributes
    ----------
    collapsed : bool
        Whether the final rank is below the initial rank.
    time : float or None
        First saved time at which the rank is below the initial rank.
    initial_rank, final_rank : int
    min_effective_rank : float
        Smallest effective rank seen.
    events : list of (float, int)
        Every saved time at which the numerical rank changes, with the new rank.
    profile : RankProfile
    """

    collapsed: bool
    time: float | None
    initial_rank: int
    final_rank: int
    min_effective_rank: float
    events: list
    profile: RankProfile


def rank_collapse(traj: Any, rtol: float = 1e-6) -> RankCollapse:
    r"""Detect rank collapse of the token cloud along a trajectory.

    The numerical rank (eigenvalues above ``rtol`` times the largest, so insensitive to
    the overall growth or shrinking of the cloud) is tracked over the saved times; the
    result says when it first drops below its initial value, to what, and lists every
    change.  Rank one is the paper's Lemma 4.3 attractor for diverging covariances.
    """
    prof = rank_profile(traj, rtol)
    ranks = prof.numerical
    ok = ranks >= 0
    if not np.any(ok):
        raise ValueError("traj has no finite saved state")
    r = ranks[ok]
    t = prof.times[ok]
    events = [(float(t[k]), int(r[k])) for k in range(1, len(r)) if r[k] != r[k - 1]]
    below = np.flatnonzero(r < r[0])
    return RankCollapse(bool(r[-1] < r[0]), float(t[below[0]]) if below.size else None,
                        int(r[0]), int(r[-1]), float(np.nanmin(prof.effective[ok])),
                        events, prof)


# =========================================================================== blow-up
@dataclass
class Classification:
    r"""Outcome of a run (see :func:`classify`).

    Attributes
    ----------
    kind : {"converged", "blowup", "diverging", "undecided"}
    blowup_time : float or None
        Estimated :math:`T^*` for ``"blowup"``.
    evidence : dict
        ``growth_rate`` (d log s/dt at the end, :math:`s = \operatorname{tr}\Sigma + |\alpha|^2`),
        ``trace_growth_rate`` (d log tr Σ/dt at the end), ``exp_rate`` and ``exp_residual``
        (fit log s = λ t + c), ``blowup_fit_time`` and ``blowup_residual`` (fit
        s = c / (T* − t)), ``change`` (relative change over the final window),
        ``status`` of the run, ``message``.
    """

    kind: str
    blowup_time: float | None
    evidence: dict

    def __str__(self) -> str:
        extra = f" at T* ~ {self.blowup_time:.6g}" if self.blowup_time is not None else ""
        return f"{self.kind}{extra}: {self.evidence.get('message', '')}"


def classify(traj: Any, *, window: float = 0.3, conv_tol: float = 1e-3,
             growth_tol: float = 0.5, min_points: int = 5) -> Classification:
    r"""Classify a Gaussian or particle run as converged, finite-time blow-up, diverging
    (:math:`t\to\infty`) or undecided, from the saved moments.

    With :math:`s(t) = \operatorname{tr}\Sigma(t) + |\alpha(t)|^2` (second moment; token
    mean and covariance for particles) on the final ``window`` fraction of the saved times (at least ``min_points`` points):

    * **growing** when :math:`s` increases on the window by a factor at least
      ``1 + growth_tol``, or the run stopped early with status ``blowup``/``nonfinite``.
      Two laws are fitted by least squares: exponential :math:`\log s = \lambda t + c` and
      finite-time blow-up :math:`s = c/(T^* - t)` (linear fit of :math:`1/s`, the law of
      the 1-D softmax solution :math:`\sigma_0/(1 - 2va\sigma_0 t)` and of the leading
      eigenvalue in general).  Residuals are compared in :math:`\log s`: the blow-up law
      wins (``"blowup"``, :math:`T^*` from the fit, never earlier than the last finite
      time) when its residual is smaller and :math:`T^*` is finite; else ``"diverging"``.
      A run that stopped at a blow-up with too few points to fit is ``"blowup"`` with the
      solver's ``blowup_time`` if it has one.
    * **converged** when mean and covariance change by less than ``conv_tol`` over the
      window, relative to their largest size along the run (covers convergence to a
      Dirac mass).
    * otherwise **undecided** (still moving at the end: run longer).

    Evidence (rates, fitted :math:`T^*`, residuals) is returned either way.
    """
    if not 0 < window <= 1:
        raise ValueError(f"window must be in (0, 1], got {window!r}")
    if int(min_points) < 3:
        raise ValueError(f"min_points must be >= 3, got {min_points!r}")
    times, means, covs = _moments(traj)
    status = str(getattr(traj, "status", "ok"))
    finite = np.array([np.all(np.isfinite(c)) and np.all(np.isfinite(m))
                       for m, c in zip(means, covs)])
    n = int(np.argmin(finite)) if not finite.all() else len(times)
    times, means, covs = times[:n], means[:n], covs[:n]
    stopped = status in ("blowup", "nonfinite") or not finite.all()
    ev: dict[str, Any] = {"status": status, "n_points": n}
    solver_T = getattr(traj, "blowup_time", None)
    if solver_T is not None and not np.isfinite(solver_T):
        solver_T = None  # Gaussian solver: nan unless it detected a blow-up
    if n < min_points:
        if stopped and solver_T is not None:
            ev["message"] = "too few points to fit; the solver reported a blow-up"
            return Classification("blowup", float(solver_T), ev)
        ev["message"] = f"only {n} finite saved points (need {min_points})"
        return Classification("undecided", None, ev)
    trace = np.trace(covs, axis1=1, axis2=2)
    s = trace + np.sum(means ** 2, axis=1)  # second moment E|x|^2: the mean may diverge too
    t_start = times[-1] - window * (times[-1] - times[0])
    i0 = min(int(np.searchsorted(times, t_start)), n - int(min_points))
    tw, sw = times[i0:], s[i0:]
    # relative change over the window
    cov_scale = max(float(np.max(np.linalg.norm(covs, axis=(1, 2)))), 1e-300)
    mean_scale = max(float(np.max(np.linalg.norm(means, axis=1))), math.sqrt(float(s.max())),
                     1e-300)
    change = max(float(np.max(np.linalg.norm(covs[i0:] - covs[-1], axis=(1, 2)))) / cov_scale,
                 float(np.max(np.linalg.norm(means[i0:] - means[-1], axis=1))) / mean_scale)
    ev["change"] = change
    pos = sw > 0
    if pos.sum() >= 3:
        g = np.diff(np.log(sw[pos])) / np.diff(tw[pos])
        ev["growth_rate"] = float(g[-1])
    trw = trace[i0:]
    if np.all(trw > 0):
        ev["trace_growth_rate"] = float(np.log(trw[-1] / trw[-2]) / (tw[-1] - tw[-2]))
    growing = (sw[0] > 0 and sw[-1] >= (1.0 + growth_tol) * sw[0]
               and np.all(np.diff(sw) > 0)) or stopped
    if growing and pos.sum() >= 3:
        tp_, sp = tw[pos], sw[pos]
        ls = np.log(sp)
        lam, c = np.polyfit(tp_, ls, 1)
        res_exp = float(np.sqrt(np.mean((ls - (lam * tp_ + c)) ** 2)))
        ev.update(exp_rate=float(lam), exp_residual=res_exp)
        b, a = np.polyfit(tp_, 1.0 / sp, 1)
        res_blow = math.inf
        T_fit = None
        if b < 0:
            T_fit = -a / b
            pred = a + b * tp_
            if np.all(pred > 0):
                res_blow = float(np.sqrt(np.mean((ls + np.log(pred)) ** 2)))
        ev.update(blowup_fit_time=T_fit, blowup_residual=res_blow)
        if T_fit is not None and res_blow < res_exp:
            T = max(float(T_fit), float(times[-1]))
            ev["message"] = (f"E|x|^2 follows c/(T* - t) (log-residual {res_blow:.2g} < "
                             f"exponential {res_exp:.2g}), T* ~ {T:.6g}")
            return Classification("blowup", T, ev)
        ev["message"] = (f"E|x|^2 grows like exp({lam:.3g} t) (log-residual {res_exp:.2g}; "
                         f"blow-up law {res_blow:.2g})")
        return Classification("diverging", None, ev)
    if growing and stopped and solver_T is not None:
        ev["message"] = "run stopped at a blow-up; too few positive points to fit"
        return Classification("blowup", float(solver_T), ev)
    if change < conv_tol:
        ev["message"] = f"relative change {change:.2g} < {conv_tol:g} over the final window"
        return Classification("converged", None, ev)
    ev["message"] = (f"still moving (relative change {change:.2g} over the final window) "
                     "without monotone growth: run longer")
    return Classification("undecided", None, ev)


# =========================================================================== clusters
@dataclass
class Clusters:
    """Clusters of a token cloud (see :func:`clusters`).

    Attributes
    ----------
    labels : ndarray (N,) of int
        Cluster of each token, clusters numbered by decreasing mass.
    centres : ndarray (K, d)
        Weighted mean of each cluster.
    masses : ndarray (K,)
        Total weight of each cluster.
    scale : float
        The distance threshold used (``tol`` times the cloud radius).
    """

    labels: np.ndarray
    centres: np.ndarray
    masses: np.ndarray
    scale: float

    @property
    def n_clusters(self) -> int:
        return int(self.masses.shape[0])


def clusters(X: Any, *, tol: float = 1e-2, weights: Any = None) -> Clusters:
    r"""Single-linkage clusters of a token cloud at a scale relative to the cloud.

    Two tokens are in the same cluster when a chain of tokens joins them with every link
    shorter than :math:`h = \mathrm{tol}\cdot\max_i |x_i - \bar x|` (``tol`` times the
    cloud's radius about its weighted mean :math:`\bar x`).  This is single-linkage
    clustering cut at height :math:`h`, computed as the connected components of the
    :math:`h`-neighbour graph (k-d tree; :math:`O(N \log N)` for well-separated clusters).
    The count is invariant under rotations, translations, scaling and permutations of the
    tokens.  A cloud of one point, or of identical points, is one cluster.
    """
    from scipy.sparse import coo_matrix  # noqa: PLC0415
    from scipy.sparse.csgraph import connected_components  # noqa: PLC0415
    from scipy.spatial import cKDTree  # noqa: PLC0415

    Xa = _points("X", X)
    w = _weights("weights", weights, Xa.shape[0])
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be finite and > 0, got {tol!r}")
    n = Xa.shape[0]
    centre = w @ Xa
    h = float(tol) * float(np.max(np.linalg.norm(Xa - centre, axis=1)))
    if h == 0.0:
        labels = np.zeros(n, dtype=int)
    else:
        pairs = cKDTree(Xa).query_pairs(h, output_type="ndarray")
        graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
        _, labels = connected_components(graph, directed=False)
    masses = np.bincount(labels, weights=w)
    # number clusters by decreasing mass (ties: by first token) for reproducible output
    first = np.full(masses.shape[0], n)
    np.minimum.at(first, labels, np.arange(n))
    order = np.lexsort((first, -masses))
    relabel = np.empty_like(order)
    relabel[order] = np.arange(order.size)
    labels = relabel[labels]
    masses = masses[order]
    # weighted sums of all clusters in one O(N d) pass (a loop over clusters is O(N K))
    sums = np.stack([np.bincount(labels, weights=w * x) for x in Xa.T], axis=1)
    centres = sums / masses[:, None]
    return Clusters(labels, centres, masses, h)


def cluster_counts(traj: Any, *, tol: float = 1e-2) -> np.ndarray:
    """Number of :func:`clusters` at every saved time of a particle trajectory
    (-1 for non-finite states)."""
    if not hasattr(traj, "states"):
        raise TypeError(f"traj must be a ParticleTrajectory, got {type(traj).__name__}")
    out = []
    for X in traj.states:
        out.append(clusters(X, tol=tol, weights=traj.weights).n_clusters
                   if np.all(np.isfinite(X)) else -1)
    return np.asarray(out, dtype=int)


# =========================================================================== kinetic energy
@dataclass
class KineticEnergy:
    r"""Kinetic energy of a flow against its optimal-transport cost (:func:`kinetic_energy`).

    Attributes
    ----------
    energy : float
        :math:`E = \int_0^T \int |\Gamma_{\mu_t}|^2 d\mu_t\,dt` (trapezoidal rule on the
        saved times).
    transport : float
        :math:`W_2^2(\mu_0, \mu_T)/T`.
    ratio : float
        ``energy / transport`` (>= 1 up to quadrature error; 1 only for constant-speed
        straight-line transport that is optimal).
    times, power : ndarray
        Saved times and :math:`\int |\Gamma_{\mu_t}|^2 d\mu_t` at each of them.
    """

    energy: float
    transport: float
    ratio: float
    times: np.ndarray
    power: np.ndarray


def kinetic_energy(traj: Any, att: Attention | None = None, *, w2_method: str = "exact",
                   backend: Any = "numpy") -> KineticEnergy:
    r"""Kinetic energy :math:`\int_0^T\!\int|\Gamma_{\mu_t}(x)|^2\,d\mu_t(x)\,dt` of a particle
    trajectory, compared with :math:`W_2^2(\mu_0,\mu_T)/T`.

    By the Benamou--Brenier formula :math:`W_2^2(\mu_0,\mu_T) = \min T\int_0^T\!\int |v_t|^2
    d\mu_t\,dt` over velocity fields transporting :math:`\mu_0` to :math:`\mu_T`, so the
    ratio ``energy / transport`` is at least 1, with equality only when the tokens move on
    straight lines at constant speed along an optimal map.  The time integral uses the
    trapezoidal rule on the saved times (save densely: its error is :math:`O(\Delta t^2)`).
    The field is re-evaluated with :func:`~transformer_pde.velocity` (``att`` defaults to
    ``traj.attention``).  For masked runs the transport cost is the conditional distance.

    A Gaussian trajectory (``times``, ``means``, ``covs``; ``att`` required) uses the affine
    field :math:`\Gamma(x) = Mx + b` of :func:`transformer_pde.gaussian.affine_field`:
    :math:`\int|\Gamma|^2 d\mu = \operatorname{tr}(M\Sigma M^\top) + |M\alpha + b|^2`, and
    :func:`bures_wasserstein` for the transport cost.
    """
    if hasattr(traj, "covs") and hasattr(traj, "means"):
        return _gaussian_kinetic_energy(traj, att)
    if not hasattr(traj, "states"):
        raise TypeError(f"traj must be a ParticleTrajectory or a Gaussian trajectory, got "
                        f"{type(traj).__name__}")
    att = traj.attention if att is None else att
    if not isinstance(att, Attention):
        raise ValueError("att is required (the trajectory does not carry its attention)")
    times = np.asarray(traj.times, dtype=float)
    if len(times) < 2 or not np.all(np.isfinite(traj.states)):
        raise ValueError("traj needs at least two finite saved states")
    w = np.asarray(traj.weights, dtype=float)
    power = np.array([
        float(w @ np.sum(velocity(att, X, weights=w, positions=traj.positions, t=float(t),
                                  backend=backend) ** 2, axis=1))
        for t, X in zip(times, np.asarray(traj.states, dtype=float))])
    w2 = _distance(traj.states[0], traj.states[-1], w, w, traj.positions, w2_method)
    return _kinetic(times, power, w2)


def _kinetic(times: np.ndarray, power: np.ndarray, w2: float) -> KineticEnergy:
    """Trapezoidal energy of ``power`` over ``times`` against ``w2**2 / T``."""
    energy = float(np.sum(0.5 * (power[1:] + power[:-1]) * np.diff(times)))
    transport = w2 * w2 / float(times[-1] - times[0])
    ratio = energy / transport if transport > 0 else math.inf
    return KineticEnergy(energy, transport, ratio, times, power)


def _gaussian_kinetic_energy(traj: Any, att: Attention | None) -> KineticEnergy:
    from .gaussian import affine_field  # noqa: PLC0415

    if not isinstance(att, Attention):
        raise ValueError("att is required for a Gaussian trajectory")
    times, means, covs = _moments(traj)
    if len(times) < 2 or not (np.all(np.isfinite(means)) and np.all(np.isfinite(covs))):
        raise ValueError("traj needs at least two finite saved states")
    power = []
    for t, m, S in zip(times, means, covs):
        M, b = affine_field(att, m, S, float(t))
        power.append(float(np.trace(M @ S @ M.T) + np.sum((M @ m + b) ** 2)))
    return _kinetic(times, np.asarray(power),
                    bures_wasserstein(means[0], covs[0], means[-1], covs[-1]))
