r"""Covariance trajectories of 2-D Gaussians in the positive semidefinite cone.

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

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError
from ..results import ResultKind, kind_of
from .axes import new_axes

__all__ = ["cone", "cone_coordinates", "cone_slice"]

#: colormap of ``color_by`` when ``cmap=None`` (both cone figures): viridis is perceptually
#: uniform and readable with the common colour-vision deficiencies
_CMAP = "viridis"
#: the part of :data:`_CMAP` used: its palest yellows (above 0.85) vanish on the
#: light grey cone surface, so the curves run from dark purple to green
_CMAP_RANGE = (0.0, 0.85)

#: relative slack of ``cone(v_max=...)``: a point is above the rim when its trace exceeds
#: ``v_max * (1 + _RIM_RTOL)`` (covariances rebuilt from a factor carry rounding of a few ulp)
_RIM_RTOL = 1e-9


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
    """One RGBA colour per trajectory (``cmap=None``: viridis on 0 … 0.85)."""
    import matplotlib as mpl  # noqa: PLC0415 (matplotlib only when drawing)

    if cmap is None:
        base, (lo_c, hi_c) = mpl.colormaps[_CMAP], _CMAP_RANGE

        def cm(x: Any) -> Any:
            return base(lo_c + (hi_c - lo_c) * np.asarray(x, dtype=float))
    else:
        cm = mpl.colormaps[cmap] if isinstance(cmap, str) else cmap
    if color_by is None:
        return [mpl.colors.to_rgba("C0")] * n
    if isinstance(color_by, str):
        if color_by not in ("start", "end"):
            raise ValueError(f"color_by must be 'start', 'end', None or an array of {n} values, "
                             f"got {color_by!r}")
        # angle of the (normalised) start / end point around the cone axis, -pi ... pi
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


def _unit(direction: Any) -> np.ndarray:
    a = np.asarray(direction, dtype=float).reshape(-1)
    if a.shape != (2,) or not np.all(np.isfinite(a)) or not np.any(a):
        raise ValueError(f"rank_one_line must be a nonzero 2-vector, got {direction!r}")
    return a / np.linalg.norm(a)


def _rank_one_label(direction: Any) -> str:
    r"""Legend text of the rank-one ray of ``direction``: the matrices
    :math:`\lambda\, a a^\top` (:math:`\lambda \ge 0`) with :math:`a` the unit vector
    along ``direction``, its entries written out.

    For ``[0, 2]``: ``rank one $\lambda\,aa^\top$, $a = (0, 1)$``.
    """
    a = _unit(direction) + 0.0  # + 0.0: no "-0" in the label
    return rf"rank one $\lambda\,aa^\top$, $a = ({a[0]:.3g}, {a[1]:.3g})$"


def _few_ticks(ax: Any, *axes: str) -> None:
    """At most 5 ticks on each named axis ("x", "y", "z"): the 3-D axes' default 9 overlap
    at the figure sizes used here."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 (matplotlib only when drawing)

    for name in axes:
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))



def cone(trajectories: Any, *, color_by: Any = "start", rank_one_line: Any = None,
         v_max: float | None = None, surface: bool = True, cmap: Any = None,
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
        around the cone axis (from :math:`-\pi`, the start of ``cmap``, to :math:`\pi`,
        its end); an array of numbers is mapped through ``cmap`` (smallest to largest);
        ``None`` draws everything in one colour.
    rank_one_line : array (2,), optional
        Draw the rank-one ray :math:`\{\lambda\, a a^\top : \lambda \ge 0\}` for the
        unit vector :math:`a` along this direction (e.g. the limit of a rank-one
        :math:`A`), labelled in a legend ("rank one λ aaᵀ, a = (…)").
    v_max : float, optional
        Height of the drawn cone (default: the largest trace along the curves).  When
        given, each curve is drawn only up to its first point with trace above
        ``v_max * (1 + 1e-9)`` (blowing-up runs leave the picture there; the slack keeps
        curves that start on the rim with a trace off by rounding).
    surface : bool
        Draw the cone surface.
    cmap : str, Colormap or None
        Colormap used by ``color_by``; ``None``: viridis (perceptually
        uniform, readable with the common colour-vision deficiencies) on 0 … 0.85, without
        the palest yellows that fade into the grey cone.
    ax : mpl_toolkits.mplot3d.axes3d.Axes3D, optional
        3-D axes to draw into (default: a new figure made through :mod:`matplotlib.pyplot`).
    title, linewidth, elev, azim
        Cosmetics.

    Returns
    -------
    mpl_toolkits.mplot3d.axes3d.Axes3D
        The 3-D axes drawn into; they hold one ``Line3D`` per trajectory (in input order, ``gid`` set to
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
    ax = new_axes(ax, "3d")
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
                gid="rank-one-line", label=_rank_one_label(a))
        ax.legend(loc="upper left", fontsize="small")
    _few_ticks(ax, "x", "y", "z")
    ax.set_xlabel(r"$u = a - b$")
    ax.set_ylabel(r"$w = 2c$")
    ax.set_zlabel(r"$v = \mathrm{tr}\,\Sigma$")
    ax.view_init(elev=elev, azim=azim)
    if title:
        ax.set_title(title)
    return ax


def cone_slice(trajectories: Any, *, color_by: Any = "start", rank_one_line: Any = None,
               cmap: Any = None, ax: Any = None, title: str | None = None,
               linewidth: float = 1.0):
    r"""Trace-normalised covariance trajectories: the unit disc :math:`(u, w)/v`.

    The point of :math:`\Sigma / \operatorname{tr}\Sigma` in the slice :math:`v = 1` of the
    PSD cone: the centre is :math:`I/2`, the unit circle the rank-one matrices.  This is
    the view for diverging or blowing-up runs, where :math:`\Sigma` itself leaves every
    bounded set but its shape converges.

    Parameters
    ----------
    trajectories, color_by, rank_one_line, cmap, ax, title, linewidth
        As in :func:`cone` (``ax`` a 2-D axes).  ``rank_one_line`` marks the point
        :math:`(\cos 2\theta, \sin 2\theta)` of the direction :math:`a`.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn into (a new pyplot figure's when ``ax`` is None); they hold one
        ``Line2D`` per trajectory (``gid`` ``"trajectory-<i>"``) with
        data :math:`(u/v, w/v)` of the input.
    """
    paths = []
    for covs in _covariance_paths(trajectories):
        p = cone_coordinates(covs)
        keep = p[:, 2] > 0
        if not np.any(keep):
            raise ValueError("a trajectory has no covariance with positive trace")
        paths.append(p[keep, :2] / p[keep, 2:3])
    ax = new_axes(ax, None, figsize=(5.0, 5.0))
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
        ax.plot([q[0]], [q[1]], "k*", ms=12, ls="", gid="rank-one-line", label=_rank_one_label(a))
        ax.legend(loc="upper left", fontsize="small")
    ax.set_aspect("equal")
    ax.set_xlim(-1.08, 1.08)
    ax.set_ylim(-1.08, 1.08)
    ax.set_xlabel(r"$u / v$")
    ax.set_ylabel(r"$w / v$")
    if title:
        ax.set_title(title)
    return ax

