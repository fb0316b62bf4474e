"""Where a figure function draws: the axes (or figure) it is given, or a new one made
through :mod:`matplotlib.pyplot`.

New figures are made with :func:`matplotlib.pyplot.figure`, so they display inline in
Jupyter and with :func:`matplotlib.pyplot.show`; nothing here selects a backend or changes
``rcParams``.  Callers that only save a figure close it with
:func:`matplotlib.pyplot.close`.
"""

from __future__ import annotations

from typing import Any

from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["new_axes", "new_figure"]


def new_figure(fig: Any, figsize: tuple[float, float], layout: str | None = "constrained") -> Any:
    """``fig`` when given (a :class:`matplotlib.figure.Figure`, drawn into as it is); otherwise
    a new pyplot figure of size ``figsize`` with ``layout``."""
    if fig is not None:
        from matplotlib.figure import Figure  # noqa: PLC0415 (matplotlib only when drawing)

        if not isinstance(fig, Figure):
            raise ArgumentTypeError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
        return fig
    import matplotlib.pyplot as plt  # noqa: PLC0415 (as above)

    return plt.figure(figsize=figsize, layout=layout)


def new_axes(ax: Any, projection: str | None = None,
             figsize: tuple[float, float] = (6.0, 5.0)) -> Any:
    """``ax`` when given; otherwise the single axes (with ``projection``) of a new pyplot
    figure of size ``figsize`` (constrained layout)."""
    if ax is not None:
        from matplotlib.axes import Axes  # noqa: PLC0415 (matplotlib only when drawing)

        if not isinstance(ax, Axes):
            raise ArgumentTypeError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
        if projection == "3d" and getattr(ax, "name", None) != "3d":
            raise ArgumentError("ax must be a 3-D axes (projection='3d') for this figure")
        return ax
    return new_figure(None, figsize).add_subplot(projection=projection)
