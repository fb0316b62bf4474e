"""Short summaries of results for the console and for notebooks.

Every result class of the package (trajectories, Gaussian solves and batches, clusters,
sweep results, mean-field solutions, reductions) describes itself in a few lines: its
``__repr__`` is a header line followed by one indented ``name  value`` line per row, and
its ``_repr_html_`` (used by Jupyter) is the same rows as an HTML table.  Neither ever
prints an array: arrays are shown by their shape and dtype, time grids by their range
and count, and long texts are cut to :data:`MAX_TEXT` characters.

The helpers here build those summaries from a title and a list of ``(name, value)``
rows; every text that reaches the HTML table is escaped.  A result class inherits
:class:`Summarised` and writes only ``_summary()`` (its title and rows); as a dataclass it
is declared with ``repr=False`` so that the dataclass ``__repr__`` does not replace the
summary.

This module imports nothing from the package.

Examples
--------
>>> print(summary_text("Run(status='ok')", [("times", time_span([0.0, 0.5, 1.0]))]))
Run(status='ok')
  times  0 … 1 (3 saved)
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["MAX_TEXT", "Summarised", "array_summary", "counts_text", "number", "path_text", "shorten",
           "stats_text",
           "summary_html", "summary_text", "time_span"]

#: longest text (in characters) shown in a summary row; longer texts end in "…"
MAX_TEXT = 120

Rows = Sequence[tuple[str, str]]


def shorten(text: Any, limit: int = MAX_TEXT) -> str:
    """``str(text)`` on one line (newlines as spaces), cut to ``limit`` characters with a
    final ``…`` when longer."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: max(limit - 1, 0)] + "…"


def number(x: Any) -> str:
    """A real number in 4 significant digits (``nan``, ``inf`` as such)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return shorten(x)
    return f"{v:.4g}"


def time_span(times: Any, noun: str = "saved") -> str:
    """``"t0 … t1 (T saved)"`` for a time grid (``"none"`` when it is empty)."""
    t = np.asarray(times, dtype=float).ravel()
    if t.size == 0:
        return "none"
    if t.size == 1:
        return f"{number(t[0])} (1 {noun})"
    return f"{number(t[0])} … {number(t[-1])} ({t.size} {noun})"


def array_summary(a: Any) -> str:
    """``"(shape) dtype"`` of an array, ``"—"`` for ``None``."""
    if a is None:
        return "—"
    arr = np.asarray(a)
    return f"{tuple(arr.shape)} {arr.dtype}"


def counts_text(counts: Mapping[str, int]) -> str:
    """``"3 ok, 1 blowup"``: the non-zero counts, largest first (ties in the given order)."""
    items = [(k, int(v)) for k, v in counts.items() if int(v)]
    items.sort(key=lambda kv: -kv[1])
    return ", ".join(f"{v} {k}" for k, v in items) or "none"


def stats_text(values: Any) -> str:
    """``"min … median … max (n finite)"`` of the finite entries of ``values``
    (``"none finite"`` when there are none)."""
    v = np.asarray(values, dtype=float).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "none finite"
    if v.size == 1:
        return number(v[0])
    return (f"min {number(v.min())}, median {number(np.median(v))}, max {number(v.max())} "
            f"({v.size} finite)")


def path_text(values: Any) -> str:
    """``"first → last"`` of a quantity sampled at increasing times (its value alone for
    one sample, ``"none"`` for none)."""
    v = np.asarray(values).ravel()
    if v.size == 0:
        return "none"
    if v.size == 1:
        return number(v[0])
    return f"{number(v[0])} → {number(v[-1])}"


def summary_text(title: str, rows: Rows) -> str:
    """The text summary: ``title`` then one ``  name  value`` line per row (names padded
    to a common width; values on one line, cut to :data:`MAX_TEXT` characters)."""
    rows = [(str(k), shorten(v)) for k, v in rows]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join([str(title)] + [f"  {k.ljust(width)}  {v}" for k, v in rows])


def summary_html(title: str, rows: Rows) -> str:
    """The HTML summary (``_repr_html_``): ``title`` in bold above a two-column table of
    ``rows``; every text is HTML-escaped."""
    esc = html.escape
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{esc(str(k))}</th>"
        f"<td style='text-align:left'>{esc(shorten(v))}</td></tr>" for k, v in rows)
    return (f"<div class='transformer-pde-summary'><strong>{esc(str(title))}</strong>"
            f"<table>{body}</table></div>")


class Summarised:
    """Mixin of the result classes: ``__repr__`` is :func:`summary_text` and
    ``_repr_html_`` is :func:`summary_html` of the title and rows that ``_summary()``
    returns.  A dataclass using it needs ``@dataclass(repr=False)`` (otherwise the
    generated ``__repr__`` wins)."""

    __slots__ = ()

    def _summary(self) -> tuple[str, Rows]:
        """Title and rows of the summaries (never the arrays)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return summary_text(*self._summary())

    def _repr_html_(self) -> str:
        return summary_html(*self._summary())
