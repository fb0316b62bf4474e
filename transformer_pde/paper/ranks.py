r"""Rank histograms of the limit covariance over random draws.

The draws are solved with one BLAS thread
(:func:`~transformer_pde.paper.threads.single_blas_thread`): a draw's status
(``blowup`` or ``diverging``) is decided by thresholds on measured quantities, and a
multi-threaded BLAS may round them differently with the number of threads, so the numbers
of a study would depend on where it ran (a Dask worker has one BLAS thread, the command's
own process as many as cores).  With one thread they are the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .paths import STATUS_COLOURS
from .rankstudy import paper_rank_study
from .scalings import paper_attention
from .threads import single_blas_thread

__all__ = ["RankSweep", "rank_figure", "rank_sweep", "rank_sweep_trials"]

_VALUE_LABELS = {"identity": "I", "random": "random", "psd": "W^T W"}


@dataclass
class RankSweep:
    """Result of :func:`rank_sweep`: one numerical rank and status per random draw."""

    kind: str
    d: int
    value: str
    ranks: np.ndarray
    status: np.ndarray
    rtol: float
    blowup_threshold: float
    t_max: float

    def summary(self) -> dict:
        return {"kind": self.kind, "d": self.d, "value": self.value, "draws": int(self.ranks.size),
                "rank_counts": np.bincount(self.ranks[self.ranks >= 0],
                                           minlength=self.d + 1).tolist(),
                "status_counts": {s: int(np.sum(self.status == s))
                                  for s in (*STATUS_COLOURS, "failed")},
                "rtol": self.rtol, "blowup_threshold": self.blowup_threshold, "t_max": self.t_max}


def rank_sweep(kind: str, d: int, *, value: str = "identity", draws: int = 100, seed: int = 0,
               t_max: float = 30.0, blowup_threshold: float = 1e3, rtol: float = 1e-3,
               solver_rtol: float = 1e-6, solver_atol: float = 1e-9, max_steps: int = 2000,
               distribution: str = "square", threshold: float = 0.1,
               converge_tol: float = 1e-4, max_redraws: int = 20) -> RankSweep:
    r"""Rank of the limit covariance over random draws.

    ``distribution="paper"`` is the paper's study
    (:func:`~transformer_pde.paper.paper_rank_study`: :math:`Q` of shape
    :math:`\lfloor d/2\rfloor\times d`, :math:`K = -Q`, ``value`` ``"identity"`` or ``"psd"``
    (:math:`V = W^\top W`), :math:`\Sigma_0 = SS^\top`, converged runs only
    (:math:`\|\Sigma'\|_F` < ``converge_tol``, :math:`\Sigma_0` redrawn up to
    ``max_redraws`` times), rank = eigenvalues of :math:`\Sigma` above ``threshold``); its
    ``t_max`` should be long (algebraic convergence, e.g. 2000); ``status`` is
    ``"converged"`` or ``"failed"`` (no draw converged, rank -1).

    ``distribution="square"`` (default; not the paper's experiment): each draw takes :math:`Q, K` with
    i.i.d. :math:`N(0, 1)` entries, :math:`V = I` or
    (``value="random"``) i.i.d. :math:`N(0, 1)`, and :math:`\Sigma_0 = FF^\top/d` with
    :math:`F` standard normal; the attention uses the paper's scalings
    (:func:`paper_attention`).  All draws are integrated together with
    :func:`transformer_pde.gaussian.solve_batch` (exact moment ODE, adaptive), stopping at
    :math:`\operatorname{tr}\Sigma` = ``blowup_threshold`` (the paper stopped at
    :math:`10^3`) or ``t_max``.  The rank counted is
    :func:`transformer_pde.diagnostics.numerical_rank` (relative tolerance ``rtol``) of
    ``limit`` = :math:`\Sigma/\operatorname{tr}\Sigma` at the end (extrapolated to
    :math:`T^*` for finite-time blow-ups); numerical rank is scale invariant, so this is also
    the rank of a converged :math:`\Sigma`.  L2 (full-rank keys) and Sinkhorn cannot blow up
    in finite time (:func:`transformer_pde.gaussian.blowup_law`): their runs end
    ``"diverging"`` and ``limit`` is the final shape.
    """
    ranks, status = rank_sweep_trials(
        kind, d, range(int(draws)) if int(draws) >= 1 else [], value=value, draws=draws,
        seed=seed, t_max=t_max, blowup_threshold=blowup_threshold, rtol=rtol,
        solver_rtol=solver_rtol, solver_atol=solver_atol, max_steps=max_steps,
        distribution=distribution, threshold=threshold, converge_tol=converge_tol,
        max_redraws=max_redraws)
    return RankSweep(kind, int(d), value, ranks, status,
                     float(threshold if distribution == "paper" else rtol),
                     float(blowup_threshold), float(t_max))


def rank_sweep_trials(kind: str, d: int, trials: Sequence[int], *, value: str = "identity",
                      draws: int = 100, seed: int = 0, t_max: float = 30.0,
                      blowup_threshold: float = 1e3, rtol: float = 1e-3,
                      solver_rtol: float = 1e-6, solver_atol: float = 1e-9,
                      max_steps: int = 2000, distribution: str = "square",
                      threshold: float = 0.1, converge_tol: float = 1e-4,
                      max_redraws: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """Ranks and statuses of the draws ``trials`` (indices in ``0 … draws-1``) of
    :func:`rank_sweep` with the same arguments, solved together.

    Each draw is bit for bit its entry in the full sweep: its parameters are the same
    numbers of the same random stream, and the members of a batch solve are independent
    (per-member steps and events), so a study can compute the draws in any grouping and
    order (this is what the ``ranks`` command's cells do).

    The draws are solved with one BLAS thread
    (:func:`~transformer_pde.paper.threads.single_blas_thread`), so the result
    does not depend on the thread count of the process (the command's own, or a Dask
    worker's).

    Returns
    -------
    ranks : ndarray of int, status : ndarray of str
        One entry per element of ``trials``.
    """
    with single_blas_thread():
        return _rank_sweep_trials(kind, d, trials, value=value, draws=draws, seed=seed,
                                  t_max=t_max, blowup_threshold=blowup_threshold, rtol=rtol,
                                  solver_rtol=solver_rtol, solver_atol=solver_atol,
                                  max_steps=max_steps, distribution=distribution,
                                  threshold=threshold, converge_tol=converge_tol,
                                  max_redraws=max_redraws)


def _rank_sweep_trials(kind: str, d: int, trials: Sequence[int], *, value: str, draws: int,
                       seed: int, t_max: float, blowup_threshold: float, rtol: float,
                       solver_rtol: float, solver_atol: float, max_steps: int,
                       distribution: str, threshold: float, converge_tol: float,
                       max_redraws: int) -> tuple[np.ndarray, np.ndarray]:
    from .. import gaussian  # noqa: PLC0415 (numba, scipy: ~1 s, paid when solving)
    from ..diagnostics import numerical_rank  # noqa: PLC0415 (as gaussian)

    if distribution == "paper":
        st = paper_rank_study(kind, d, value, trials=draws, seed=seed, threshold=threshold,
                              converge_tol=converge_tol, t_max=t_max, max_redraws=max_redraws,
                              rtol=solver_rtol, atol=solver_atol, indices=trials)
        return st.ranks, np.where(st.ranks >= 0, "converged", "failed")
    if distribution != "square":
        raise ValueError(f"distribution must be 'square' or 'paper', got {distribution!r}")
    if value not in ("identity", "random"):
        raise ValueError(f"value must be 'identity' or 'random', got {value!r}")
    if int(d) < 1 or int(draws) < 1:
        raise ValueError(f"d and draws must be >= 1, got d={d!r}, draws={draws!r}")
    idx = [int(i) for i in trials]
    if any(not 0 <= i < int(draws) for i in idx):
        raise ValueError(f"trials must be in [0, {int(draws)}), got {idx!r}")
    # the whole stream of the sweep (cheap: a few d x d normal draws each), then the draws
    rng = np.random.default_rng([int(seed), int(d), 0 if value == "identity" else 1])
    params = []
    for _ in range(int(draws)):
        Q, K = rng.normal(size=(d, d)), rng.normal(size=(d, d))
        V = np.eye(d) if value == "identity" else rng.normal(size=(d, d))
        params.append((Q, K, V))
    F = rng.normal(size=(int(draws), d, d))
    covs0 = F @ np.swapaxes(F, -1, -2) / d
    if not idx:
        return np.zeros(0, dtype=int), np.zeros(0, dtype=str)
    atts = [paper_attention(kind, *params[i]) for i in idx]
    res = gaussian.solve_batch(atts, np.zeros((len(idx), d)), covs0[idx], t_max=t_max,
                               blowup_threshold=blowup_threshold, rtol=solver_rtol,
                               atol=solver_atol, max_steps=max_steps)
    ranks = np.array([numerical_rank(L, rtol) for L in res.limit], dtype=int)
    return ranks, np.asarray(res.status)


def rank_figure(sweeps: Sequence[RankSweep], title: str,
                figsize: tuple[float, float] | None = None, *, fig: Any = None) -> Any:
    """Rank histograms of :func:`rank_sweep` results: one panel per (kind, value) -- rows
    kinds, columns values, in the order of ``sweeps`` -- with one group of bars per
    dimension; returns the :class:`matplotlib.figure.Figure` (``fig`` when given, resized to
    ``figsize`` if that is given too, else a new figure made through
    :mod:`matplotlib.pyplot`, so it shows in a notebook)."""
    from .. import plot  # noqa: PLC0415 (numba, scipy: ~1 s, paid when drawing)
    from ..plot.axes import new_figure  # noqa: PLC0415 (as plot: paid when drawing)

    kinds = list(dict.fromkeys(s.kind for s in sweeps))
    values = list(dict.fromkeys(s.value for s in sweeps))
    d_max = max(s.d for s in sweeps)
    size = figsize or (4.2 * len(values), 3.2 * len(kinds))
    if fig is not None and figsize is not None:
        fig.set_size_inches(*figsize)
    fig = new_figure(fig, size)
    axes = fig.subplots(len(kinds), len(values), squeeze=False)
    for i, k in enumerate(kinds):
        for j, v in enumerate(values):
            group = {f"d = {s.d}": s.ranks[s.ranks >= 0] for s in sweeps
                     if s.kind == k and s.value == v}
            # a dimension none of whose draws converged has no rank to draw: say so on the
            # panel instead of failing the whole figure
            empty = [name for name, r in group.items() if r.size == 0]
            group = {name: r for name, r in group.items() if r.size}
            ax, label = axes[i, j], f"{k}, V = {_VALUE_LABELS.get(v, v)}"
            if group:
                plot.rank_histogram(group, d=d_max, ax=ax, title=label)
            else:
                ax.set_title(label)
            if empty:
                ax.text(0.02, 0.98, "no converged draw: " + ", ".join(empty),
                        transform=ax.transAxes, va="top", fontsize="small")
    fig.suptitle(title)
    return fig
