r"""Redraw the paper's 2-D covariance figures with its own parameters.

Every panel of a figure (:class:`~transformer_pde.paper.PaperRun`) is solved for all of
its grid's initial covariances at once by :func:`transformer_pde.gaussian.solve_batch`
(exact moment ODE, adaptive, batched dense output at log-spaced times), stopped like the
paper's runs at :math:`\operatorname{tr}\Sigma` = ``tol_high`` or at the paper's last time
``step * max_iter``, and as "converged" when :math:`\|\Sigma'\|_F` < ``tol_low`` (the
paper's criterion).  Each path ends with the solver's final state (on the threshold for
the runs that cross it).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .parameters import PaperRun, paper_figure
from .paths import STATUS_COLOURS

__all__ = ["draw_run", "paper_figure_plot", "run_paths", "solve_run"]


def solve_run(run: PaperRun, covs0: Any = None, *, n_eval: int = 300, t_max: float | None = None,
              rtol: float = 1e-8, atol: float = 1e-12) -> Any:
    r"""Solve one panel exactly from its grid (or ``covs0``).

    Output times: 0 and ``n_eval - 1`` log-spaced times from :math:`10^{-3}` to ``t_max``
    (default: the paper's ``step * max_iter``); runs stop like the paper's: "converged" when
    :math:`\|\Sigma'\|_F` < ``run.rule.tol_low`` (``convergence="absolute"``), and at
    :math:`\operatorname{tr}\Sigma` = ``run.rule.tol_high``.

    Returns
    -------
    transformer_pde.gaussian.GaussianBatch
    """
    from .. import gaussian  # noqa: PLC0415 (numba, scipy: ~1 s, paid when solving)

    covs0 = run.covariances() if covs0 is None else np.asarray(covs0, dtype=float)
    t_max = run.rule.t_max if t_max is None else min(float(t_max), run.rule.t_max)
    t_eval = np.concatenate([[0.0], np.geomspace(min(1e-3, t_max / 2), t_max, int(n_eval) - 1)])
    return gaussian.solve_batch(run.attention(), np.zeros((len(covs0), 2)), covs0, t_max=t_max,
                                t_eval=t_eval, blowup_threshold=run.rule.tol_high, rtol=rtol,
                                atol=atol, convergence="absolute",
                                converge_tol=run.rule.tol_low)


def run_paths(batch: Any) -> list[np.ndarray]:
    """Per member: its saved covariances up to the end of its run (finite rows of
    ``traj_covs`` at times ``<= t_final``; a member that converged early is reported at
    later output times too, which the paper's run does not reach) followed by its final
    state ``covs`` when that is later than the last saved time."""
    paths = []
    for i in range(len(batch)):
        c = batch.traj_covs[i]
        ok = np.all(np.isfinite(c), axis=(1, 2)) & (batch.t_eval <= batch.t_final[i])
        p = c[ok]
        if batch.t_final[i] > batch.t_eval[ok][-1]:
            p = np.concatenate([p, batch.covs[i][None]])
        paths.append(p)
    return paths


def _status_colours(status: Sequence[str]) -> list[str]:
    return [STATUS_COLOURS.get(str(s), "tab:gray") for s in status]


def draw_run(run: PaperRun, ax: Any, *, view: str = "cone", batch: Any = None,
             color_by: str = "start", v_max: float | None = None, linewidth: float = 0.6,
             rank_one_line: Any = None, t_max: float | None = None, stride: int = 1) -> Any:
    """Draw one panel into ``ax`` (3-D axes for ``view="cone"``, 2-D for ``"slice"``); returns
    the :class:`~transformer_pde.gaussian.GaussianBatch` it drew.

    ``color_by="status"`` colours each run by its status (:data:`STATUS_COLOURS`: blue
    converged, red blow-up, orange diverging, grey still moving at the end); ``"start"`` by
    the angle of its initial covariance.  ``t_max`` (default the paper's last time) and
    ``stride`` (every ``stride``-th grid point) go to :func:`solve_run`."""
    from .. import plot  # noqa: PLC0415 (numba, scipy: ~1 s, paid when drawing)

    if batch is None:
        batch = solve_run(run, run.covariances()[::int(stride)], t_max=t_max)
    paths = run_paths(batch)
    colours = _status_colours(batch.status) if color_by == "status" else color_by
    if view == "cone":
        plot.cone(paths, color_by=colours, v_max=v_max, ax=ax, linewidth=linewidth,
                  rank_one_line=rank_one_line)
    elif view == "slice":
        plot.cone_slice(paths, color_by=colours, ax=ax, linewidth=linewidth,
                        rank_one_line=rank_one_line)
    else:
        raise ValueError(f"view must be 'cone' or 'slice', got {view!r}")
    counts = ", ".join(f"{k} {v}" for k, v in batch.counts().items() if v)
    # a run beside the paper's has no paper step to quote; its tag gets a line of its own so
    # the title fits the panel
    head = (f"{run.label} (paper: Euler h = {run.rule.step:g})" if run.paper
            else f"{run.label}\n[beyond the paper]")
    horizon = run.rule.t_max if t_max is None else min(float(t_max), run.rule.t_max)
    ax.set_title(f"{head}\nexact, t <= {horizon:g}: {counts}", fontsize="medium")
    return batch


def paper_figure_plot(name: str, *, view: str = "cone", runs: Sequence[PaperRun] | None = None,
                      color_by: str = "start", v_max: float | None = None, title: str = "",
                      panel_size: float = 4.6, t_max: float | None = None, stride: int = 1,
                      rank_one_line: Any = None, fig: Any = None) -> tuple[Any, list]:
    """All panels of the paper figure ``name`` side by side (or ``runs``), each drawn by
    :func:`draw_run` (``view``, ``color_by``, ``v_max``, ``t_max``, ``stride``,
    ``rank_one_line``) into ``fig`` (default: a new figure made through
    :mod:`matplotlib.pyplot`, so it shows in notebooks); returns the
    :class:`matplotlib.figure.Figure` and the list of batches drawn."""
    from ..plot.axes import new_figure  # noqa: PLC0415 (as plot: paid when drawing)

    runs = list(paper_figure(name).runs if runs is None else runs)
    fig = new_figure(fig, (panel_size * len(runs), panel_size + 0.6))
    batches = []
    for i, run in enumerate(runs):
        ax = fig.add_subplot(1, len(runs), i + 1, projection="3d" if view == "cone" else None)
        t = None if t_max is None else min(float(t_max), run.rule.t_max)
        batches.append(draw_run(run, ax, view=view, color_by=color_by, v_max=v_max, t_max=t,
                                stride=stride, rank_one_line=rank_one_line))
    if title:
        fig.suptitle(title)
    return fig, batches
