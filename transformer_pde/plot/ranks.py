"""Histograms of numerical ranks (e.g. of limit covariances over random draws)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .axes import new_axes

__all__ = ["rank_histogram"]


def rank_histogram(ranks: Any, *, d: int | None = None, ax: Any = None, title: str | None = None,
                   normalize: bool = True):
    r"""Histogram of numerical ranks (e.g. of limit covariances over random draws).

    Parameters
    ----------
    ranks : array of int, or mapping label -> array of int
        Observed ranks.  With a mapping, one group of bars per label (side by side).
    d : int, optional
        Dimension: the bars cover ranks 0..d (default: the largest rank seen).
    ax : matplotlib.axes.Axes, optional
        Axes to draw into (default: a new figure made through :mod:`matplotlib.pyplot`).
    title : str, optional
        Title.
    normalize : bool
        Show frequencies (fractions of draws) rather than counts.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn into, whose bar containers (one per group, labelled by the group name) have heights equal
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
    ax = new_axes(ax, None, figsize=(5.0, 3.6))
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
    return ax
