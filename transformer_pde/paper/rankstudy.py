r"""The paper's rank study: the rank of the limit covariance over random parameters.

Protocol of Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322), per trial in dimension
:math:`d`:

* :math:`Q \in \mathbb R^{\lfloor d/2\rfloor \times d}` with i.i.d. :math:`N(0, 1)` entries and
  :math:`K = -Q`, so that :math:`A = K^\top Q/\sqrt d = -Q^\top Q/\sqrt d \preceq 0` has rank
  :math:`\lfloor d/2\rfloor`;
* :math:`V = I` (``value="identity"``) or :math:`V = W^\top W` with :math:`W` standard normal
  :math:`d\times d` (``value="psd"``);
* :math:`\Sigma_0 = SS^\top` with :math:`S` standard normal :math:`d\times d`;
* only runs that converge (:math:`\|\Sigma'\|_F` < ``converge_tol``) are kept: a run that does
  not is discarded and :math:`\Sigma_0` is drawn again (same :math:`Q, V`);
* the rank counted is the number of eigenvalues of the converged :math:`\Sigma` above
  ``threshold`` = 0.1 (:func:`count_rank`).

With :math:`V \succeq 0` and :math:`A \preceq 0`, softmax has
:math:`(\operatorname{tr}\Sigma)' = 2\operatorname{tr}(V^{1/2}\Sigma A\Sigma V^{1/2}) \le 0`:
the trace cannot grow, so every exact softmax run is bounded, and a run the paper's Euler
discards as "exceeded" (:math:`\operatorname{tr}\Sigma > 10^3`) is an artefact of its step.

:func:`rank_trial` runs one trial with the exact adaptive solver
(:func:`transformer_pde.gaussian.solve`); :func:`paper_rank_study` runs many, optionally
beside the paper's Euler (:func:`~transformer_pde.paper.euler_reference`) from the same draws.
The number of trials, the dimensions and the Euler step of the published histograms are
parameters here (``examples/paper_ranks.py`` and ``examples/configs/paper_ranks.toml`` state
the values they use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .euler import euler_reference
from .threads import single_blas_thread
from .scalings import paper_attention

__all__ = ["RANK_THRESHOLD", "RankStudyResult", "RankTrial", "count_rank", "draw_rank_covariance",
           "draw_rank_parameters", "draw_rank_trial", "paper_rank_study", "rank_trial"]

#: eigenvalues of the converged covariance above this count towards its rank (the paper's)
RANK_THRESHOLD = 0.1
_DISTRIBUTIONS = ("paper", "square")
_VALUES = {"paper": ("identity", "psd"), "square": ("identity", "random", "psd")}


def _check(kind: str, d: int, value: str, distribution: str) -> None:
    if kind not in ("softmax", "l2", "sinkhorn"):
        raise ValueError(f"kind must be 'softmax', 'l2' or 'sinkhorn', got {kind!r}")
    if distribution not in _DISTRIBUTIONS:
        raise ValueError(f"distribution must be 'paper' or 'square', got {distribution!r}")
    if value not in _VALUES[distribution]:
        raise ValueError(f"value must be one of {', '.join(map(repr, _VALUES[distribution]))} "
                         f"for distribution={distribution!r}, got {value!r}")
    if isinstance(d, bool) or int(d) != d or int(d) < (2 if distribution == "paper" else 1):
        raise ValueError(f"d must be an integer >= {2 if distribution == 'paper' else 1} for "
                         f"distribution={distribution!r}, got {d!r}")


def draw_rank_parameters(d: int, value: str, rng: np.random.Generator,
                         distribution: str = "paper") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Draw the raw :math:`(Q, K, V)` of one trial (before the paper's scalings).

    ``distribution="paper"``: :math:`Q` of shape :math:`(\lfloor d/2\rfloor, d)` standard
    normal, :math:`K = -Q`, :math:`V = I` or (``value="psd"``) :math:`W^\top W`.
    ``distribution="square"`` (the draw of :func:`rank_sweep`, not the paper's): :math:`Q, K`
    independent standard normal :math:`d\times d`, :math:`V = I`, standard normal
    (``"random"``) or :math:`W^\top W` (``"psd"``).  Draw order: :math:`Q` (then :math:`K`),
    then :math:`W`.
    """
    _check("softmax", d, value, distribution)
    d = int(d)
    if distribution == "paper":
        Q = rng.normal(size=(d // 2, d))
        K = -Q
    else:
        Q, K = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    if value == "identity":
        V = np.eye(d)
    elif value == "random":
        V = rng.normal(size=(d, d))
    else:
        W = rng.normal(size=(d, d))
        V = W.T @ W
    return Q, K, V


def draw_rank_covariance(d: int, rng: np.random.Generator, distribution: str = "paper"
                         ) -> np.ndarray:
    r""":math:`\Sigma_0 = SS^\top` with :math:`S` standard normal :math:`d\times d` (``"paper"``),
    or :math:`FF^\top/d` (``"square"``)."""
    S = rng.normal(size=(int(d), int(d)))
    return S @ S.T if distribution == "paper" else S @ S.T / int(d)


def draw_rank_trial(kind: str, d: int, value: str, rng: np.random.Generator,
                    distribution: str = "paper") -> tuple[Any, np.ndarray]:
    """One trial's :class:`~transformer_pde.Attention` (paper scalings,
    :func:`~transformer_pde.paper.paper_attention`) and initial covariance, drawn from
    ``rng`` (parameters first, then :math:`\\Sigma_0`)."""
    _check(kind, d, value, distribution)
    Q, K, V = draw_rank_parameters(d, value, rng, distribution)
    return paper_attention(kind, Q, K, V), draw_rank_covariance(d, rng, distribution)


def count_rank(cov: Any, threshold: float = RANK_THRESHOLD) -> int:
    """Number of eigenvalues of ``cov`` above ``threshold`` (absolute; 0.1 in the paper)."""
    return int(np.sum(np.linalg.eigvalsh(np.asarray(cov, dtype=float)) > threshold))


@dataclass
class RankTrial:
    """One trial of :func:`rank_trial`.

    ``rank`` is -1 when no draw of :math:`\\Sigma_0` converged within the redraws.
    ``redraws`` counts the discarded draws of :math:`\\Sigma_0`; ``cov0`` is the kept one,
    ``cov`` the covariance at the stop, ``t_stop`` the time at which
    :math:`\\|\\Sigma'\\|_F` < ``converge_tol``."""

    rank: int
    redraws: int
    t_stop: float
    cov0: np.ndarray = field(repr=False)
    cov: np.ndarray = field(repr=False)
    Q: np.ndarray = field(repr=False)
    K: np.ndarray = field(repr=False)
    V: np.ndarray = field(repr=False)


def rank_trial(kind: str, d: int, value: str, rng: np.random.Generator, *,
               distribution: str = "paper", threshold: float = RANK_THRESHOLD,
               converge_tol: float = 1e-4, t_max: float = 2000.0, max_redraws: int = 20,
               rtol: float = 1e-8, atol: float = 1e-10) -> RankTrial:
    r"""One trial of the paper's rank study with the exact adaptive solver.

    Draws :math:`(Q, K, V)` and :math:`\Sigma_0` from ``rng`` (:func:`draw_rank_parameters`,
    :func:`draw_rank_covariance`), solves the moment ODE
    (:func:`transformer_pde.gaussian.solve`, ``rtol``/``atol``) until
    :math:`\|\Sigma'\|_F` < ``converge_tol`` (the paper's criterion,
    ``convergence="absolute"``), :math:`\operatorname{tr}\Sigma = 10^3` or ``t_max``; a run
    that does not converge is discarded and :math:`\Sigma_0` drawn again (same parameters),
    up to ``max_redraws`` times.  The rank is :func:`count_rank` of the converged covariance.
    """
    from .. import gaussian  # noqa: PLC0415 (numba, scipy: ~1 s, paid when solving)

    _check(kind, d, value, distribution)
    if int(max_redraws) < 0:
        raise ValueError(f"max_redraws must be >= 0, got {max_redraws!r}")
    Q, K, V = draw_rank_parameters(d, value, rng, distribution)
    att = paper_attention(kind, Q, K, V)
    for redraw in range(int(max_redraws) + 1):
        cov0 = draw_rank_covariance(d, rng, distribution)
        tr = gaussian.solve(att, np.zeros(int(d)), cov0, t_max=t_max, blowup_threshold=1e3,
                            rtol=rtol, atol=atol, convergence="absolute",
                            converge_tol=converge_tol)
        if tr.status == "converged":
            return RankTrial(count_rank(tr.covs[-1], threshold), redraw, float(tr.t_final), cov0,
                             tr.covs[-1], Q, K, V)
    return RankTrial(-1, int(max_redraws) + 1, float("nan"), cov0, tr.covs[-1], Q, K, V)


@dataclass
class RankStudyResult:
    """Result of :func:`paper_rank_study` (``trials`` trials).

    Attributes
    ----------
    kind, d, value : str, int, str
    ranks : ndarray (trials,) of int
        Exact-solver rank of each kept trial (-1: no draw converged).
    redraws : ndarray (trials,) of int
        Discarded draws of :math:`\\Sigma_0` before the kept one (exact solver).
    euler_ranks : ndarray (trials,) of int or None
        The paper's Euler from the same kept :math:`\\Sigma_0` (-1 unless it converged).
    euler_outcome : ndarray (trials,) of str or None
        Its outcome (``converged``, ``exceeded``, ``max_iter``).
    euler_max_trace_exact : ndarray (trials,) or None
        For the trials the Euler run ends ``exceeded``: the largest
        :math:`\\operatorname{tr}\\Sigma` of the exact run (NaN elsewhere).
    cov0 : ndarray (trials, d, d)
    """

    kind: str
    d: int
    value: str
    ranks: np.ndarray
    redraws: np.ndarray
    cov0: np.ndarray = field(repr=False)
    euler_ranks: np.ndarray | None = None
    euler_outcome: np.ndarray | None = None
    euler_max_trace_exact: np.ndarray | None = None

    def agreement(self) -> float:
        """Fraction of trials where the Euler and the exact ranks agree (among the trials
        Euler kept)."""
        if self.euler_ranks is None:
            raise ValueError("the study was run without euler=...")
        kept = self.euler_ranks >= 0
        return float(np.mean(self.euler_ranks[kept] == self.ranks[kept])) if kept.any() else float("nan")


def paper_rank_study(kind: str, d: int, value: str = "identity", *, trials: int = 100,
                     seed: int = 0, threshold: float = RANK_THRESHOLD, converge_tol: float = 1e-4,
                     t_max: float = 2000.0, max_redraws: int = 20, euler: dict | None = None,
                     rtol: float = 1e-8, atol: float = 1e-10,
                     indices: Any = None) -> RankStudyResult:
    r"""The paper's rank study over ``trials`` trials, all solved together.

    Trial ``i`` draws from ``numpy.random.default_rng([seed, d, i])`` exactly what
    :func:`rank_trial` draws from that generator (parameters, then :math:`\Sigma_0`, then the
    redraws), so both give the same trials; here every round of draws is solved at once by
    :func:`transformer_pde.gaussian.solve_batch` (``convergence="absolute"``).  If ``euler``
    is given, the paper's projected explicit Euler runs from the same kept draws.

    Parameters
    ----------
    kind, d, value, threshold, converge_tol, t_max, max_redraws, rtol, atol
        As in :func:`rank_trial` (``distribution="paper"``).
    trials, seed : int
    indices : sequence of int, optional
        Run only these trials (of ``0 … trials-1``; default all): the result's arrays follow
        ``indices``, and each trial equals its entry in the full study bit for bit (every
        trial has its own generator and the members of a batch solve are independent), so
        a study can be computed in pieces, in any order.
    euler : dict, optional
        ``{"step": h, "tol_high": ..., "max_iter": ...}`` (``tol_low`` defaults to
        ``converge_tol``): run :func:`~transformer_pde.paper.euler_reference` on every kept
        :math:`(Q, K, V, \Sigma_0)`, count its rank where it converged, and for the runs it
        ends as "exceeded" record the largest trace of the exact run up to that time.

    Returns
    -------
    RankStudyResult
        Computed with one BLAS thread
        (:func:`~transformer_pde.paper.threads.single_blas_thread`), so that it does not
        depend on the thread count of the process.
    """
    with single_blas_thread():  # numbers independent of the BLAS thread count
        return _paper_rank_study(kind, d, value, trials=trials, seed=seed, threshold=threshold,
                                 converge_tol=converge_tol, t_max=t_max,
                                 max_redraws=max_redraws, euler=euler, rtol=rtol, atol=atol,
                                 indices=indices)


def _paper_rank_study(kind: str, d: int, value: str, *, trials: int, seed: int,
                      threshold: float, converge_tol: float, t_max: float, max_redraws: int,
                      euler: dict | None, rtol: float, atol: float,
                      indices: Any) -> RankStudyResult:
    from .. import gaussian  # noqa: PLC0415 (numba, scipy: ~1 s, paid when solving)

    _check(kind, d, value, "paper")
    d = int(d)
    if indices is None:
        indices = range(int(trials))
    indices = [int(i) for i in indices]
    if any(not 0 <= i < int(trials) for i in indices):
        raise ValueError(f"indices must be in [0, {int(trials)}), got {indices!r}")
    n = len(indices)
    if n == 0:
        return RankStudyResult(kind, d, value, np.zeros(0, dtype=int), np.zeros(0, dtype=int),
                               np.zeros((0, d, d)))
    rngs = [np.random.default_rng([int(seed), d, i]) for i in indices]
    params = [draw_rank_parameters(d, value, g) for g in rngs]
    atts = [paper_attention(kind, *p) for p in params]
    cov0 = np.stack([draw_rank_covariance(d, g) for g in rngs])
    ranks = np.full(n, -1)
    redraws = np.zeros(n, dtype=int)
    todo = np.arange(n)
    for rnd in range(int(max_redraws) + 1):
        if rnd:
            for i in todo:
                cov0[i] = draw_rank_covariance(d, rngs[i])
            redraws[todo] += 1
        res = gaussian.solve_batch([atts[i] for i in todo], np.zeros((todo.size, d)), cov0[todo],
                                   t_max=t_max, blowup_threshold=1e3, rtol=rtol, atol=atol,
                                   convergence="absolute", converge_tol=converge_tol)
        ok = np.asarray(res.status) == "converged"
        for i, c in zip(todo[ok], res.covs[ok], strict=True):
            ranks[i] = count_rank(c, threshold)
        todo = todo[~ok]
        if todo.size == 0:
            break
    out = RankStudyResult(kind, d, value, ranks, redraws, cov0)
    if euler is not None:
        opts = {"tol_low": converge_tol, **euler}
        e = euler_reference(kind, np.stack([p[0] for p in params]),
                            np.stack([p[1] for p in params]), np.stack([p[2] for p in params]),
                            cov0, **opts)
        out.euler_outcome = e.outcome
        out.euler_ranks = np.array([count_rank(c, threshold) if o == "converged" else -1
                                    for c, o in zip(e.covs, e.outcome, strict=True)])
        mx = np.full(n, np.nan)
        ex = np.flatnonzero(e.outcome == "exceeded")
        if ex.size:
            T = float(e.t_stop[ex].max())
            ts = np.linspace(0.0, T, 400)
            r = gaussian.solve_batch([atts[i] for i in ex], np.zeros((ex.size, d)), cov0[ex],
                                     t_max=T, t_eval=ts, rtol=rtol, atol=atol)
            tr = np.trace(r.traj_covs, axis1=2, axis2=3)
            for k, i in enumerate(ex):
                mx[i] = float(np.nanmax(np.where(ts <= e.t_stop[i], tr[k], np.nan)))
        out.euler_max_trace_exact = mx
    return out
