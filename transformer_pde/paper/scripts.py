r"""What the scripts of ``examples/`` share: their fast switch and their output folder.

Every example is a plain script (no command line) whose first cell holds its parameters as
variables, so it runs top to bottom as a file, in the gallery and, cell by cell (``# %%``),
in Jupyter.  Two environment variables reach every example the same way:

* ``TRANSFORMER_PDE_FAST=1`` (:func:`fast_configuration`): the small sizes of CI, of the
  notebook test and of the default documentation build.  The figures of the repository are
  made without it.
* ``TRANSFORMER_PDE_OUT=DIR`` (:func:`output_folder`): the one folder an example writes its
  figures into; by default the ``figures/`` of the repository the working directory is in
  (so ``python examples/NAME.py`` from the root and a notebook opened in ``examples/`` both
  write there), else ``./figures``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:   # matplotlib is imported by the plotting code that makes the figures
    from matplotlib.figure import Figure

__all__ = ["FAST_VARIABLE", "OUT_VARIABLE", "fast_configuration", "output_folder",
           "save_figures", "show_pngs"]

#: environment variable of the fast configuration (``"1"``: on)
FAST_VARIABLE = "TRANSFORMER_PDE_FAST"
#: environment variable of the output folder
OUT_VARIABLE = "TRANSFORMER_PDE_OUT"


def fast_configuration() -> bool:
    """``True`` when ``TRANSFORMER_PDE_FAST=1``: the example shrinks its sizes (fewer
    tokens, runs or grid points; shorter depths) to finish in seconds.  Any other value, or
    none, is the full configuration that made the committed figures."""
    return os.environ.get(FAST_VARIABLE, "").strip() == "1"


def output_folder() -> Path:
    """The folder an example writes into: ``TRANSFORMER_PDE_OUT`` when set; otherwise the
    ``figures/`` of the nearest folder at or above the working directory that holds
    ``pyproject.toml`` and ``figures/`` (the repository); otherwise ``./figures``.  The
    folder is created."""
    chosen = os.environ.get(OUT_VARIABLE, "").strip()
    if chosen:
        out = Path(chosen).expanduser()
    else:
        here = Path.cwd().resolve()
        out = next((p / "figures" for p in (here, *here.parents)
                    if (p / "pyproject.toml").is_file() and (p / "figures").is_dir()),
                   here / "figures")
    out.mkdir(parents=True, exist_ok=True)
    return out


def save_figures(figures: Mapping[str, Figure], out: str | os.PathLike | None = None,
                 dpi: float = 100) -> list[Path]:
    """Save each figure as ``<out>/<name>.png`` (``out`` defaults to :func:`output_folder`)
    and return the paths written.  The figures stay open, so Jupyter shows the pyplot ones
    at the end of the cell."""
    folder = output_folder() if out is None else Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures.items():
        fig.savefig(folder / f"{name}.png", dpi=dpi)
        written.append(folder / f"{name}.png")
    return written


def show_pngs(paths: Iterable[str | os.PathLike]) -> list[Figure]:
    """One pyplot figure per PNG file, at the file's size (100 pixels per inch, no axes), so
    that Jupyter shows the figures a function wrote and closed (the pretrained models'
    reports); returns the figures."""
    # deferred: pyplot loads a backend; this module is imported with transformer_pde.paper
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figures = []
    for path in paths:
        image = plt.imread(path)
        fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100), dpi=100)
        ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
        ax.imshow(image)
        ax.set_axis_off()
        figures.append(fig)
    return figures

