"""Figures of token flows through the layers of a network (see :mod:`transformer_pde.pretrained`).

Three views of token states (T, N, d) saved along depth: :func:`token_paths` (each token's
path in the plane of the first two principal components), :func:`statistics_along_depth`
(statistics of :func:`~transformer_pde.diagnostics.depth_statistics` against depth) and
:func:`cosine_matrices` (the token-by-token cosine similarity matrix at a few depths).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..diagnostics.depth import cosine_similarity
from ..errors import ArgumentError
from .axes import new_figure

__all__ = ["STATISTICS_PANELS", "DepthCurve", "PathPanel", "cosine_matrices", "principal_plane",
           "statistics_along_depth", "token_paths"]

#: default panels of :func:`statistics_along_depth`: statistic key -> axis label
STATISTICS_PANELS: tuple[tuple[str, str], ...] = (
    ("n_clusters", "clusters (5% of radius)"),
    ("effective_rank", "effective rank of Σ"),
    ("mean_cosine", "mean cosine similarity"),
    ("relative_radius", "radius / mean norm"),
)


@dataclass(frozen=True)
class PathPanel:
    """One panel of :func:`token_paths`.

    Attributes
    ----------
    title : str
        Panel title.
    states : array (T, N, d)
        Token states along depth.
    basis : array (T', N', d), optional
        States whose first two principal components span the drawn plane (default:
        ``states``); give the same ``basis`` to several panels to compare them in one plane.
    labelled : bool
        Write each token next to its final point.
    """

    title: str
    states: Any
    basis: Any = None
    labelled: bool = False


@dataclass(frozen=True)
class DepthCurve:
    """One curve of :func:`statistics_along_depth`.

    Attributes
    ----------
    label : str
        Legend entry.
    times : sequence of float
        Depths of the entries of ``statistics``.
    statistics : mapping str -> sequence of float
        Per-depth statistics (the keys of the drawn panels at least).
    style : str
        Matplotlib format string of the curve.
    markersize : float, optional
        Marker size (Matplotlib's default if None).
    """

    label: str
    times: Sequence[float]
    statistics: Mapping[str, Sequence[float]]
    style: str = "o-"
    markersize: float | None = None


def principal_plane(states: Any) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``mu`` (d,) and the first two principal directions ``B`` (2, d) of all tokens of
    ``states`` (..., d): a state ``x`` is drawn at ``(x - mu) @ B.T``."""
    S = np.asarray(states, dtype=float)
    P = S.reshape(-1, S.shape[-1])
    mu = P.mean(axis=0)
    _, _, vt = np.linalg.svd(P - mu, full_matrices=False)
    return mu, vt[:2]


def token_paths(panels: Sequence[PathPanel], tokens: Sequence[str], *,
                title: str | None = None, cmap: Any = "viridis", fig: Any = None):
    """Token paths along depth, one panel per flow, in a principal plane.

    Each token's path is a line (token ``i`` coloured by ``cmap`` at ``i / (N - 1)``), its
    first state a dot and its last state a square; panels with ``labelled`` write the token
    at its last state.

    Parameters
    ----------
    panels : sequence of PathPanel
        The flows, side by side; every ``states`` has the N tokens of ``tokens``.
    tokens : sequence of str
        The tokens (N).
    title : str, optional
        Figure title.
    cmap : str or Colormap
        Colours of the tokens.
    fig : matplotlib.figure.Figure, optional
        Figure to draw into (default: a new figure made through :mod:`matplotlib.pyplot`,
        laid out with ``tight_layout``).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into: one axes per panel; token ``i``'s path is its ``3 i``-th line, with the data of the
        projection ``(states - mu) @ B.T`` of :func:`principal_plane` of the panel's basis.
    """
    import matplotlib  # noqa: PLC0415 (matplotlib only when drawing)

    if not panels:
        raise ArgumentError("token_paths needs at least one panel")
    cm = matplotlib.colormaps[cmap] if isinstance(cmap, str) else cmap
    n = len(tokens)
    colours = [cm(i / max(n - 1, 1)) for i in range(n)]
    own = fig is None
    fig = new_figure(fig, (5.5 * len(panels), 5.5), layout=None)
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, panel in zip(axes, panels, strict=True):
        S = np.asarray(panel.states, dtype=float)
        if S.ndim != 3 or S.shape[1] != n:
            raise ArgumentError(f"panel {panel.title!r}: states must have shape (T, {n}, d), "
                                f"got {S.shape}")
        mu, B = principal_plane(S if panel.basis is None else panel.basis)
        Y = (S - mu) @ B.T
        for i in range(n):
            ax.plot(Y[:, i, 0], Y[:, i, 1], "-", color=colours[i], lw=1.0, alpha=0.8)
            ax.plot(Y[0, i, 0], Y[0, i, 1], "o", color=colours[i], ms=3)
            ax.plot(Y[-1, i, 0], Y[-1, i, 1], "s", color=colours[i], ms=6, mec="k", mew=0.5)
            if panel.labelled:
                ax.annotate(tokens[i], Y[-1, i], fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("PC 1")
        ax.set_ylabel("PC 2")
    if title:
        fig.suptitle(title, fontsize=11)
    if own:
        fig.tight_layout()
    return fig


def statistics_along_depth(top: Sequence[DepthCurve], bottom: Sequence[DepthCurve], *,
                           panels: Sequence[tuple[str, str]] = STATISTICS_PANELS,
                           title: str | None = None, fig: Any = None):
    """Depth statistics against depth: the network (top row), long flows (bottom row).

    One column per ``(key, label)`` of ``panels``.  The top row has linear axes against the
    layer index; the bottom row a symmetric-log depth axis (linear below 1) and, for the
    key ``relative_radius``, a logarithmic value axis (collapse at an exponential rate is a
    straight line).

    Parameters
    ----------
    top, bottom : sequence of DepthCurve
        The curves of each row.
    panels : sequence of (key, label)
        The statistics drawn and their axis labels.
    title, fig : optional
        As in :func:`token_paths`.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into, with axes ``(2, len(panels))``; curve ``j`` of a row is the ``j``-th line of each of its
        axes, with data ``(times, statistics[key])``.
    """
    def draw(ax: Any, curve: DepthCurve, key: str) -> None:
        kw = {} if curve.markersize is None else {"ms": curve.markersize}
        ax.plot(np.asarray(curve.times), curve.statistics[key], curve.style, label=curve.label,
                **kw)

    own = fig is None
    fig = new_figure(fig, (5.25 * len(panels), 8), layout=None)
    axes = fig.subplots(2, len(panels), squeeze=False)
    for j, (key, label) in enumerate(panels):
        ax = axes[0, j]
        for curve in top:
            draw(ax, curve, key)
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
        ax = axes[1, j]
        for curve in bottom:
            draw(ax, curve, key)
        ax.set_xscale("symlog", linthresh=1.0)
        if key == "relative_radius":
            ax.set_yscale("log")
        ax.set_xlabel("depth t (layers)")
        ax.set_ylabel(label)
        if j == 0:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=11)
    if own:
        fig.tight_layout()
    return fig


def cosine_matrices(rows: Sequence[tuple[str, Sequence[float], Any]], *, ncol: int = 7,
                    title: str | None = "cosine similarities between tokens "
                                         "(token order along the axes)",
                    fig: Any = None):
    """Cosine-similarity matrices of the tokens at ``ncol`` evenly spaced saved depths.

    Parameters
    ----------
    rows : sequence of (label, times, states)
        One row of panels per flow: ``states`` (T, N, d) saved at ``times`` (T); panel ``c``
        shows :func:`~transformer_pde.diagnostics.cosine_similarity` of the state with index
        ``round(c (T - 1) / (ncol - 1))`` (each index once; a flow with fewer than ``ncol``
        states leaves its last panels empty), titled ``"{label} {time}"``.
    ncol : int
        Panels per row.
    title : str, optional
        Figure title.
    fig : matplotlib.figure.Figure, optional
        Figure to draw into (default: a new figure made through :mod:`matplotlib.pyplot`,
        constrained layout).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into, with axes ``(len(rows), ncol)`` whose images hold the cosine matrices (colour range
        [-1, 1]) and one colour bar.
    """
    if not rows or isinstance(ncol, bool) or not isinstance(ncol, (int, np.integer)) \
            or ncol < 1:
        raise ArgumentError(f"cosine_matrices needs rows and an integer ncol >= 1, got "
                            f"{len(rows)} rows and ncol={ncol!r}")
    fig = new_figure(fig, (2.1 * ncol + 1.0, 2.3 * len(rows)))
    axes = fig.subplots(len(rows), ncol, squeeze=False)
    im = None
    for r, (label, times, states) in enumerate(rows):
        idx = np.unique(np.linspace(0, len(times) - 1, ncol).round().astype(int))
        for c in range(ncol):
            ax = axes[r, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(idx):
                ax.axis("off")
                continue
            im = ax.imshow(cosine_similarity(states[idx[c]]), vmin=-1, vmax=1, cmap="RdBu_r")
            ax.set_title(f"{label} {times[idx[c]]}", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.6, label="cosine similarity")
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
