r"""Token clouds along a run: paths, final positions and an animation.

The states are drawn as given or in the co-moving frame :math:`z(t) = e^{-tV} x(t)`
(:func:`rescaled_states`), in which tokens that grow like :math:`e^{t}` under softmax
attention with :math:`V = I` converge to their clusters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from scipy.linalg import expm

from ..errors import ArgumentError, ArgumentTypeError
from ..results import ResultKind, kind_of, require_kind
from .axes import new_axes

__all__ = ["animate_particles", "particles", "rescaled_states"]


def _particle_states(traj: Any, min_d: int = 2) -> tuple[np.ndarray, np.ndarray]:
    if kind_of(traj) is not None:
        require_kind(traj, "traj", (ResultKind.PARTICLES,))
        if traj.states is None:
            raise ArgumentError("traj holds no states (it was saved with SaveAt(fn=...))")
        states = np.asarray(traj.states, dtype=float)
        times = np.asarray(traj.times, dtype=float)
    else:
        try:
            states = np.asarray(traj, dtype=float)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"traj must be a ParticleTrajectory or an array of states "
                                    f"(T, N, d), got {type(traj).__name__}") from None
        times = np.arange(states.shape[0], dtype=float)
    if states.ndim != 3 or states.shape[2] < min_d:
        raise ValueError(f"traj must hold states of shape (T, N, d) with d >= {min_d}, "
                         f"got {states.shape}")
    return times, states


def rescaled_states(traj: Any, rescale: Any) -> np.ndarray:
    r"""States in the co-moving frame :math:`z(t) = e^{-tV} x(t)` (or as given).

    ``rescale`` is ``None`` (no change), ``"value"`` (use ``traj.attention``'s :math:`V`
    at :math:`t = 0`, constant in time) or a (d, d) matrix :math:`V`.  With :math:`V = I`
    softmax tokens grow like :math:`e^{t}`; in the frame :math:`z` they converge to
    clusters (Geshkovski et al. 2023).
    """
    times, states = _particle_states(traj, min_d=1)
    if rescale is None:
        return states
    if isinstance(rescale, str):
        if rescale != "value":
            raise ValueError(f"rescale must be None, 'value' or a (d, d) matrix, got {rescale!r}")
        att = getattr(traj, "attention", None)
        if att is None:
            raise ValueError("rescale='value' needs a trajectory with its attention")
        V = att.at(0.0).heads[0].V if att.heads == 1 else None
        if V is None:
            raise ValueError("rescale='value' needs a single-head attention; pass V explicitly")
    else:
        V = np.asarray(rescale, dtype=float)
    d = states.shape[2]
    if V.shape != (d, d):
        raise ValueError(f"rescale matrix must have shape {(d, d)}, got {V.shape}")
    return np.stack([x @ expm(-t * V).T for t, x in zip(times, states, strict=True)])


def particles(traj: Any, *, labels: Any = None, rescale: Any = None, dims: tuple[int, int] = (0, 1),
              paths: bool = True, ax: Any = None, title: str | None = None,
              max_paths: int = 2000, cmap: Any = "tab10"):
    r"""Token paths and final positions (coloured by cluster) in two coordinates.

    Parameters
    ----------
    traj : ParticleTrajectory or array (T, N, d)
        The run to draw (``d >= 2``).
    labels : array (N,) of int, optional
        Cluster label of each token (e.g. from ``diagnostics.clusters``); final points
        are coloured by label, and the legend shows them as a white marker ("final
        tokens (colour: cluster)") that matches no cluster.  Without labels they are drawn
        in one colour.
    rescale : None, "value" or array (d, d)
        Draw :math:`e^{-tV} x(t)` instead of :math:`x(t)` (see :func:`rescaled_states`).
    dims : (int, int)
        Coordinates to draw.
    paths : bool
        Draw each token's path (thin grey lines), at most ``max_paths`` of them.
    ax : matplotlib.axes.Axes, optional
        Axes to draw into (default: a new figure made through :mod:`matplotlib.pyplot`).
    title, cmap
        Title; colormap of the labels.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn into (a new pyplot figure's when ``ax`` is None), with collections
        ``gid="initial"`` and ``gid="final"`` whose offsets are the first and last drawn
        states.
    """
    states = rescaled_states(traj, rescale)
    i, j = dims
    d = states.shape[2]
    if not (0 <= i < d and 0 <= j < d and i != j):
        raise ValueError(f"dims must be two distinct coordinates in [0, {d}), got {dims!r}")
    ax = new_axes(ax, None, figsize=(5.5, 5.0))
    if paths:
        n = min(states.shape[1], max_paths)
        ax.plot(states[:, :n, i], states[:, :n, j], color="0.6", lw=0.4, alpha=0.7, zorder=1)
    ax.scatter(states[0, :, i], states[0, :, j], s=6, color="0.35", zorder=2, gid="initial",
               label="initial tokens")
    if labels is not None:
        lab = np.asarray(labels)
        if lab.shape != (states.shape[1],):
            raise ValueError(f"labels must have shape ({states.shape[1]},), got {lab.shape}")
        _, codes = np.unique(lab, return_inverse=True)
        import matplotlib as mpl  # noqa: PLC0415 (matplotlib only when drawing)

        cm = mpl.colormaps[cmap] if isinstance(cmap, str) else cmap
        col = cm(codes % cm.N if hasattr(cm, "N") else codes)
        # the legend shows a white marker, not the first cluster's colour: an empty proxy
        # carries the label (also for a later ax.legend()), the scatter none
        final_label = "_final tokens"
        ax.plot([], [], ls="", marker="o", ms=5, mfc="white", mec="k", mew=0.4,
                gid="final-legend", label="final tokens (colour: cluster)")
    else:
        col, final_label = "C3", "final tokens"
    ax.scatter(states[-1, :, i], states[-1, :, j], s=22, c=col, edgecolors="k", linewidths=0.4,
               zorder=3, gid="final", label=final_label)
    ax.set_xlabel(f"$x_{i + 1}$" if rescale is None else f"$(e^{{-tV}}x)_{i + 1}$")
    ax.set_ylabel(f"$x_{j + 1}$" if rescale is None else f"$(e^{{-tV}}x)_{j + 1}$")
    ax.set_aspect("equal", adjustable="datalim")
    ax.legend(loc="best", fontsize="small")
    if title:
        ax.set_title(title)
    return ax


def animate_particles(traj: Any, path: str | Path, *, rescale: Any = None,
                      dims: tuple[int, int] = (0, 1), fps: int = 12, max_frames: int = 120,
                      dpi: int = 80, trail: int = 8) -> Path:
    """Write an animated GIF of the tokens moving (Matplotlib's Pillow writer).

    Parameters
    ----------
    traj : ParticleTrajectory or array (T, N, d)
        The run.
    path : str or Path
        Output file (``.gif``).
    rescale, dims
        As in :func:`particles`.
    fps, max_frames, dpi
        Frame rate, the most frames written (saved states are subsampled evenly) and
        resolution.
    trail : int
        Number of previous frames shown as a fading trail.

    Returns
    -------
    Path
        The file written.
    """
    from matplotlib.animation import FuncAnimation, PillowWriter  # noqa: PLC0415 (matplotlib only when drawing)
    from matplotlib.figure import Figure  # noqa: PLC0415 (as above)

    times, _ = _particle_states(traj)
    states = rescaled_states(traj, rescale)
    i, j = dims
    T = states.shape[0]
    frames = np.unique(np.linspace(0, T - 1, min(T, int(max_frames))).round().astype(int))
    fig = Figure(figsize=(5.0, 5.0), layout="constrained")
    ax = fig.add_subplot()
    xs, ys = states[..., i], states[..., j]
    pad = 0.05 * max(np.ptp(xs), np.ptp(ys), 1e-12)
    ax.set_xlim(xs.min() - pad, xs.max() + pad)
    ax.set_ylim(ys.min() - pad, ys.max() + pad)
    ax.set_aspect("equal")
    trail_sc = ax.scatter([], [], s=3, color="0.7")
    sc = ax.scatter(xs[0], ys[0], s=10, color="C3")
    label = ax.set_title("")

    def update(k):
        f = frames[k]
        lo = frames[max(0, k - trail)]
        tr = np.stack([xs[lo:f].ravel(), ys[lo:f].ravel()], axis=1) if f > lo else np.empty((0, 2))
        trail_sc.set_offsets(tr)
        sc.set_offsets(np.stack([xs[f], ys[f]], axis=1))
        label.set_text(f"t = {times[f]:.3g}")
        return sc, trail_sc, label

    anim = FuncAnimation(fig, update, frames=len(frames), blit=False)
    path = Path(path)
    anim.save(str(path), writer=PillowWriter(fps=int(fps)), dpi=dpi)
    return path
