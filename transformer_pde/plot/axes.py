"""Where a figure function draws: the axes it is given, or a new figure of its own."""

from __future__ import annotations

from typing import Any

__all__ = ["new_axes"]


def new_axes(ax: Any, projection: str | None = None,
             figsize: tuple[float, float] = (6.0, 5.0)) -> tuple[Any, Any]:
    """``(ax.figure, ax)`` when ``ax`` is given; otherwise a new
    :class:`matplotlib.figure.Figure` (constrained layout, not registered with ``pyplot``)
    and its single axes with ``projection``."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure  # noqa: PLC0415 (matplotlib only when drawing)

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot(projection=projection)
