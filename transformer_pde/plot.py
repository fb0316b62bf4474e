r"""Figures: covariance cone, its trace-normalised slice, token paths and rank histograms.

Every function draws with Matplotlib's object API, never calls ``plt.show`` and returns
the :class:`matplotlib.figure.Figure` it drew on, so it works headless (Agg) and in
notebooks alike.  Pass ``ax=`` to draw into an existing axes.

Covariance-cone coordinates (``docs/conventions.md``): a symmetric 2×2 matrix
:math:`\Sigma = \begin{pmatrix} a & c\\ c & b\end{pmatrix}` is the point

.. math:: (u, w, v) = (a - b,\; 2c,\; a + b),

and :math:`\Sigma \succeq 0 \iff v \ge \sqrt{u^2 + w^2}`: the positive semidefinite matrices
fill a solid circular cone whose surface is the rank-:math:`\le 1` matrices; the rank-one
matrices :math:`\lambda\, a a^\top` with :math:`a = (\cos\theta, \sin\theta)` form the ray
:math:`\lambda(\cos 2\theta, \sin 2\theta, 1)`.  Diverging trajectories are drawn after
normalisation :math:`\Sigma / \operatorname{tr}\Sigma`, i.e. the point :math:`(u, w)/v` of the
unit disc (its boundary circle is again the rank-one matrices, its centre is
:math:`I/2`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import ArgumentError, ArgumentTypeError
from .results import ResultKind, kind_of, require_kind

__all__ = [
    "cone",
    "cone_coordinates",
    "cone_slice",
    "particles",
    "animate_particles",
    "rank_histogram",
    "rescaled_states",
]

logger = logging.getLogger(__name__)

#: relative slack of ``cone(v_max=...)``: a point is above the rim when its trace exceeds
#: ``v_max * (1 + _RIM_RTOL)`` (covariances rebuilt from a factor carry rounding of a few ulp)
_RIM_RTOL = 1e-9


# --------------------------------------------------------------------------- helpers
def cone_coordinates(covs: Any) -> np.ndarray:
    r"""Map symmetric 2×2 matrices to cone coordinates :math:`(u, w, v) = (a-b, 2c, a+b)`.

    Parameters
    ----------
    covs : array_like, shape (..., 2, 2)
        Covariance matrices (only the upper triangle's off-diagonal entry is used for
        :math:`c`; the matrices are symmetrised first).

    Returns
    -------
    ndarray, shape (..., 3)
        The coordinates ``(u, w, v)``.

    Examples
    --------
    >>> cone_coordinates([[2.0, 0.5], [0.5, 1.0]]).tolist()
    [1.0, 1.0, 3.0]
    """
    S = np.asarray(covs, dtype=float)
    if S.ndim < 2 or S.shape[-2:] != (2, 2):
        raise ValueError(f"covs must have shape (..., 2, 2), got {S.shape}")
    a, b = S[..., 0, 0], S[..., 1, 1]
    c = 0.5 * (S[..., 0, 1] + S[..., 1, 0])
    return np.stack([a - b, 2.0 * c, a + b], axis=-1)


def _covariance_paths(trajectories: Any) -> list[np.ndarray]:
    """Normalise the accepted inputs to a list of (T_i, 2, 2) float arrays (finite rows only).

    Accepts one trajectory or a sequence of them, each a result of the package
    (:class:`transformer_pde.gaussian.GaussianTrajectory`, or a
    :class:`~transformer_pde.ParticleTrajectory` in d = 2: the covariance of its tokens) or
    an array (T, 2, 2); also a single array (n, T, 2, 2) and a
    :class:`transformer_pde.gaussian.GaussianBatch` solved with ``t_eval`` (its
    ``traj_covs``).  Non-finite rows (after a member stopped) are dropped.
    """
    kind = kind_of(trajectories)
    if kind is ResultKind.GAUSSIAN_BATCH:
        if trajectories.traj_covs is None:
            raise ArgumentError("a GaussianBatch holds trajectories only when solved with "
                                "t_eval=...")
        items: list[Any] = list(np.asarray(trajectories.traj_covs, dtype=float))
    elif kind is not None:
        items = [trajectories]
    elif isinstance(trajectories, np.ndarray):
        if trajectories.ndim == 3:
            items = [trajectories]
        elif trajectories.ndim == 4:
            items = list(trajectories)
        else:
            raise ValueError("trajectories as an array must have shape (T, 2, 2) or "
                             f"(n, T, 2, 2), got {trajectories.shape}")
    elif isinstance(trajectories, Iterable):
        items = list(trajectories)
    else:
        raise ArgumentTypeError("trajectories must be a GaussianTrajectory, a GaussianBatch, "
                                "an array (n, T, 2, 2) or a sequence of them, got "
                                f"{type(trajectories).__name__}")
    paths = []
    for i, item in enumerate(items):
        item_kind = kind_of(item)
        if item_kind is ResultKind.GAUSSIAN_BATCH:
            raise ArgumentTypeError(f"trajectories[{i}] is a GaussianBatch: pass it alone, "
                                    "not inside a sequence")
        covs = np.asarray(item.moments()[1] if item_kind is not None else item, dtype=float)
        if covs.ndim == 4 and covs.shape[-2:] == (2, 2):
            paths.extend(_covariance_paths(covs))
            continue
        if covs.ndim != 3 or covs.shape[1:] != (2, 2):
            raise ValueError(f"trajectories[{i}] must hold 2x2 covariances of shape (T, 2, 2), "
                             f"got {covs.shape}")
        covs = covs[np.all(np.isfinite(covs), axis=(1, 2))]
        if len(covs) == 0:
            raise ValueError(f"trajectories[{i}] has no finite covariance")
        paths.append(covs)
    if not paths:
        raise ValueError("trajectories is empty")
    return paths


def _colours(n: int, color_by: Any, ends: Sequence[np.ndarray], cmap: Any) -> list:
    """One RGBA colour per trajectory."""
    import matplotlib as mpl  # noqa: PLC0415

    cm = mpl.colormaps[cmap] if isinstance(cmap, str) else cmap
    if color_by is None:
        return [mpl.colors.to_rgba("C0")] * n
    if isinstance(color_by, str):
        if color_by not in ("start", "end"):
            raise ValueError(f"color_by must be 'start', 'end', None or an array of {n} values, "
                             f"got {color_by!r}")
        # hue = angle of the (normalised) start / end point around the cone axis
        ang = np.array([np.arctan2(p[1], p[0]) for p in ends])
        return [cm((a + np.pi) / (2 * np.pi)) for a in ang]
    vals = np.asarray(color_by)
    if vals.shape[0] != n:
        raise ValueError(f"color_by has {vals.shape[0]} entries for {n} trajectories")
    if vals.dtype.kind in "fiu":
        vals = vals.astype(float)
        lo, hi = np.nanmin(vals), np.nanmax(vals)
        span = hi - lo if hi > lo else 1.0
        return [cm((v - lo) / span) for v in vals]
    return [mpl.colors.to_rgba(v) for v in vals]


def _is_start(color_by: Any) -> bool:
    return isinstance(color_by, str) and color_by == "start"


def _new_axes(ax: Any, projection: str | None = None, figsize=(6.0, 5.0)):
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot(projection=projection)


def _unit(direction: Any) -> np.ndarray:
    a = np.asarray(direction, dtype=float).reshape(-1)
    if a.shape != (2,) or not np.all(np.isfinite(a)) or not np.any(a):
        raise ValueError(f"rank_one_line must be a nonzero 2-vector, got {direction!r}")
    return a / np.linalg.norm(a)


# --------------------------------------------------------------------------- cone
def cone(trajectories: Any, *, color_by: Any = "start", rank_one_line: Any = None,
         v_max: float | None = None, surface: bool = True, cmap: Any = "twilight",
         ax: Any = None, title: str | None = None, linewidth: float = 1.0,
         elev: float = 18.0, azim: float = -60.0):
    r"""Covariance trajectories of 2-D Gaussians drawn in the PSD cone.

    Each trajectory :math:`t \mapsto \Sigma(t)` becomes the curve
    :math:`(u, w, v)(t) = (a-b, 2c, a+b)` (see :func:`cone_coordinates`); the cone
    :math:`v = \sqrt{u^2 + w^2}` (rank-one matrices) is drawn as a translucent surface.
    Start points are marked with dots, end points with crosses.

    Parameters
    ----------
    trajectories : GaussianTrajectory, array (T, 2, 2) or (n, T, 2, 2), or a sequence of them
        Anything with a ``covs`` attribute of shape (T, 2, 2) is accepted.  Non-finite
        rows (after a blow-up) are dropped.
    color_by : {"start", "end"}, None, or array of n values / colours
        ``"start"`` / ``"end"``: colour each curve by the angle of its first / last point
        around the cone axis (cyclic colormap); an array of numbers is mapped through
        ``cmap``; ``None`` draws everything in one colour.
    rank_one_line : array (2,), optional
        Draw the rank-one ray :math:`\{\lambda\, a a^\top\}` for this direction :math:`a`
        (e.g. the limit of a rank-one :math:`A`).
    v_max : float, optional
        Height of the drawn cone (default: the largest trace along the curves).  When
        given, each curve is drawn only up to its first point with trace above
        ``v_max * (1 + 1e-9)`` (blowing-up runs leave the picture there; the slack keeps
        curves that start on the rim with a trace off by rounding).
    surface : bool
        Draw the cone surface.
    cmap : str or Colormap
        Colormap used by ``color_by``.
    ax : mpl_toolkits.mplot3d.Axes3D, optional
        Axes to draw into (a new figure otherwise).
    title, linewidth, elev, azim
        Cosmetics.

    Returns
    -------
    matplotlib.figure.Figure
        Its 3-D axes hold one ``Line3D`` per trajectory (in input order, ``gid`` set to
        ``"trajectory-<i>"``) whose data are exactly the cone coordinates of the input.
    """
    paths = [cone_coordinates(c) for c in _covariance_paths(trajectories)]
    if v_max is not None:
        vtop = float(v_max)
        if not (np.isfinite(vtop) and vtop > 0):
            raise ValueError(f"v_max must be finite and > 0, got {v_max!r}")
        # keep each curve up to its first point above the top of the drawn cone; the
        # relative slack keeps a curve that starts on the rim (a trace reconstructed as
        # 1 + a few ulp with v_max = 1) instead of cutting it at its first point
        above = [p[:, 2] > vtop * (1.0 + _RIM_RTOL) for p in paths]
        cut = [int(np.argmax(a)) if np.any(a) else len(p) for p, a in zip(paths, above, strict=True)]
        paths = [p[:max(k, 1)] for p, k in zip(paths, cut, strict=True)]
    else:
        vtop = max(float(np.max(p[:, 2])) for p in paths)
        if not vtop > 0:
            raise ValueError("all covariances have zero trace: nothing to draw")
    fig, ax = _new_axes(ax, "3d")
    if surface:
        th = np.linspace(0, 2 * np.pi, 61)
        h = np.linspace(0, vtop, 12)
        TH, H = np.meshgrid(th, h)
        ax.plot_surface(H * np.cos(TH), H * np.sin(TH), H, color="0.6", alpha=0.15,
                        linewidth=0, shade=False, gid="cone-surface")
        ax.plot(vtop * np.cos(th), vtop * np.sin(th), np.full_like(th, vtop), color="0.5",
                lw=0.6, gid="cone-rim")
    key = [p[0] if _is_start(color_by) else p[-1] for p in paths]
    key = [k[:2] / k[2] if k[2] > 0 else k[:2] for k in key]
    colours = _colours(len(paths), color_by, key, cmap)
    for i, (p, col) in enumerate(zip(paths, colours, strict=True)):
        ax.plot(p[:, 0], p[:, 1], p[:, 2], color=col, lw=linewidth, gid=f"trajectory-{i}")
        ax.scatter([p[0, 0]], [p[0, 1]], [p[0, 2]], color=col, s=10, marker="o")
        ax.scatter([p[-1, 0]], [p[-1, 1]], [p[-1, 2]], color=col, s=18, marker="x")
    if rank_one_line is not None:
        a = _unit(rank_one_line)
        ray = cone_coordinates(np.outer(a, a)) * np.linspace(0, vtop, 2)[:, None]
        ax.plot(ray[:, 0], ray[:, 1], ray[:, 2], color="k", lw=2.0, ls="--",
                gid="rank-one-line", label=r"$\{\lambda a a^\top\}$")
        ax.legend(loc="upper left")
    ax.set_xlabel(r"$u = a - b$")
    ax.set_ylabel(r"$w = 2c$")
    ax.set_zlabel(r"$v = \mathrm{tr}\,\Sigma$")
    ax.view_init(elev=elev, azim=azim)
    if title:
        ax.set_title(title)
    return fig


def cone_slice(trajectories: Any, *, color_by: Any = "start", rank_one_line: Any = None,
               cmap: Any = "twilight", ax: Any = None, title: str | None = None,
               linewidth: float = 1.0):
    r"""Trace-normalised covariance trajectories: the unit disc :math:`(u, w)/v`.

    The point of :math:`\Sigma / \operatorname{tr}\Sigma` in the slice :math:`v = 1` of the
    PSD cone: the centre is :math:`I/2`, the unit circle the rank-one matrices.  This is
    the view for diverging or blowing-up runs, where :math:`\Sigma` itself leaves every
    bounded set but its shape converges.

    Parameters
    ----------
    trajectories, color_by, rank_one_line, cmap, ax, title, linewidth
        As in :func:`cone`.  ``rank_one_line`` marks the point
        :math:`(\cos 2\theta, \sin 2\theta)` of the direction :math:`a`.

    Returns
    -------
    matplotlib.figure.Figure
        Its axes hold one ``Line2D`` per trajectory (``gid`` ``"trajectory-<i>"``) with
        data :math:`(u/v, w/v)` of the input.
    """
    paths = []
    for covs in _covariance_paths(trajectories):
        p = cone_coordinates(covs)
        keep = p[:, 2] > 0
        if not np.any(keep):
            raise ValueError("a trajectory has no covariance with positive trace")
        paths.append(p[keep, :2] / p[keep, 2:3])
    fig, ax = _new_axes(ax, None, figsize=(5.0, 5.0))
    th = np.linspace(0, 2 * np.pi, 361)
    ax.plot(np.cos(th), np.sin(th), color="0.3", lw=1.0, gid="rank-one-circle")
    key = [p[0] if _is_start(color_by) else p[-1] for p in paths]
    colours = _colours(len(paths), color_by, key, cmap)
    for i, (p, col) in enumerate(zip(paths, colours, strict=True)):
        ax.plot(p[:, 0], p[:, 1], color=col, lw=linewidth, gid=f"trajectory-{i}")
        ax.plot(p[0, 0], p[0, 1], "o", color=col, ms=3)
        ax.plot(p[-1, 0], p[-1, 1], "x", color=col, ms=5)
    if rank_one_line is not None:
        a = _unit(rank_one_line)
        q = cone_coordinates(np.outer(a, a))
        ax.plot([q[0]], [q[1]], "k*", ms=12, gid="rank-one-line")
    ax.set_aspect("equal")
    ax.set_xlim(-1.08, 1.08)
    ax.set_ylim(-1.08, 1.08)
    ax.set_xlabel(r"$u / v$")
    ax.set_ylabel(r"$w / v$")
    if title:
        ax.set_title(title)
    return fig


# --------------------------------------------------------------------------- particles
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
    from scipy.linalg import expm  # noqa: PLC0415

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
        are coloured by label.  Without labels they are drawn in one colour.
    rescale : None, "value" or array (d, d)
        Draw :math:`e^{-tV} x(t)` instead of :math:`x(t)` (see :func:`rescaled_states`).
    dims : (int, int)
        Coordinates to draw.
    paths : bool
        Draw each token's path (thin grey lines), at most ``max_paths`` of them.
    ax, title, cmap
        Axes to draw into, title, colormap of the labels.

    Returns
    -------
    matplotlib.figure.Figure
        Axes with collections ``gid="initial"`` and ``gid="final"`` whose offsets are the
        first and last drawn states.
    """
    states = rescaled_states(traj, rescale)
    i, j = dims
    d = states.shape[2]
    if not (0 <= i < d and 0 <= j < d and i != j):
        raise ValueError(f"dims must be two distinct coordinates in [0, {d}), got {dims!r}")
    fig, ax = _new_axes(ax, None, figsize=(5.5, 5.0))
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
        import matplotlib as mpl  # noqa: PLC0415

        cm = mpl.colormaps[cmap] if isinstance(cmap, str) else cmap
        col = cm(codes % cm.N if hasattr(cm, "N") else codes)
    else:
        col = "C3"
    ax.scatter(states[-1, :, i], states[-1, :, j], s=22, c=col, edgecolors="k", linewidths=0.4,
               zorder=3, gid="final", label="final tokens")
    ax.set_xlabel(f"$x_{i + 1}$" if rescale is None else f"$(e^{{-tV}}x)_{i + 1}$")
    ax.set_ylabel(f"$x_{j + 1}$" if rescale is None else f"$(e^{{-tV}}x)_{j + 1}$")
    ax.set_aspect("equal", adjustable="datalim")
    ax.legend(loc="best", fontsize="small")
    if title:
        ax.set_title(title)
    return fig


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
    from matplotlib.animation import FuncAnimation, PillowWriter  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

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


# --------------------------------------------------------------------------- ranks
def rank_histogram(ranks: Any, *, d: int | None = None, ax: Any = None, title: str | None = None,
                   normalize: bool = True):
    r"""Histogram of numerical ranks (e.g. of limit covariances over random draws).

    Parameters
    ----------
    ranks : array of int, or mapping label -> array of int
        Observed ranks.  With a mapping, one group of bars per label (side by side).
    d : int, optional
        Dimension: the bars cover ranks 0..d (default: the largest rank seen).
    ax, title
        Axes to draw into; title.
    normalize : bool
        Show frequencies (fractions of draws) rather than counts.

    Returns
    -------
    matplotlib.figure.Figure
        Axes whose bar containers (one per group, labelled by the group name) have heights equal
        to the (normalised) counts of ranks 0..d.
    """
    groups: Mapping[str, Any] = ranks if isinstance(ranks, Mapping) else {"ranks": ranks}
    if not groups:
        raise ValueError("ranks is empty")
    data = {}
    for name, r in groups.items():
        arr = np.asarray(r)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"ranks[{name!r}] must be a non-empty 1-D array, "
                             f"got shape {arr.shape}")
        if arr.dtype.kind not in "iu" and not np.all(arr == np.round(arr)):
            raise ValueError(f"ranks[{name!r}] must hold integers")
        arr = arr.astype(int)
        if np.any(arr < 0):
            raise ValueError(f"ranks[{name!r}] must be >= 0")
        data[str(name)] = arr
    top = int(d) if d is not None else max(int(a.max()) for a in data.values())
    if any(int(a.max()) > top for a in data.values()):
        raise ValueError(f"a rank exceeds d={top}")
    fig, ax = _new_axes(ax, None, figsize=(5.0, 3.6))
    k = len(data)
    width = 0.8 / k
    edges = np.arange(top + 1)
    for g, (name, arr) in enumerate(data.items()):
        counts = np.bincount(arr, minlength=top + 1).astype(float)
        if normalize:
            counts /= arr.size
        ax.bar(edges + (g - (k - 1) / 2) * width, counts, width=width, label=name,
               color=f"C{g}")
    ax.set_xticks(edges)
    ax.set_xlabel("numerical rank")
    ax.set_ylabel("fraction of draws" if normalize else "count")
    if isinstance(ranks, Mapping):
        ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return fig
