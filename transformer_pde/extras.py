"""Optional dependencies and the extras that install them.

The core install (``pip install transformer-pde``) brings NumPy, SciPy, Numba, POT,
Matplotlib, tqdm and threadpoolctl: enough for every simulation, the Gaussian moment
ODEs, the diagnostics and the figures. Parameter studies and labelled output need more:

=========  ======================================  ==========================================
extra      installs                                needed by
=========  ======================================  ==========================================
``sweep``  dask[distributed], xarray, zarr         :mod:`transformer_pde.sweep` (studies, stores)
``io``     xarray, zarr, h5netcdf, h5py            labelled output (``to_xarray``, ``.nc``, ``.zarr``)
``all``    both of the above
=========  ======================================  ==========================================

:func:`require` imports one of them, or raises :class:`~transformer_pde.errors.MissingDependencyError`
naming the ``pip install`` line that provides it.

:func:`progress_bar` makes the package's tqdm bars: ipywidgets is an optional front-end
dependency of the Jupyter bar, and without it the text bar is used, silently.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any

from .errors import MissingDependencyError

__all__ = ["EXTRAS", "progress_bar", "require"]

#: the extra of ``pyproject.toml`` that installs each optional module
EXTRAS: dict[str, str] = {
    "dask": "sweep",
    "distributed": "sweep",
    "xarray": "io",
    "zarr": "io",
    "h5netcdf": "io",
    "h5py": "io",
}


def require(module: str, feature: str) -> ModuleType:
    """Import the optional ``module`` needed by ``feature``.

    Parameters
    ----------
    module : str
        A module named in :data:`EXTRAS` (or a submodule of one, ``"dask.array"``).
    feature : str
        What the caller is doing, for the message (``"a parameter study"``).

    Returns
    -------
    module
        The imported module.

    Raises
    ------
    MissingDependencyError
        The module is not installed; the message names the extra, e.g.
        ``pip install 'transformer-pde[sweep]'``.

    Examples
    --------
    >>> from transformer_pde.extras import require
    >>> require("numpy", "an example").__name__
    'numpy'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS.get(module.split(".")[0], "all")
        raise MissingDependencyError(
            f"{feature} needs the optional dependency {module!r} ({exc}); install it with "
            f"pip install 'transformer-pde[{extra}]' (or 'transformer-pde[all]')") from None


def progress_bar(**kwargs: Any) -> Any:
    """A tqdm progress bar (``tqdm.auto``) whose final state stays readable as text.

    ``kwargs`` go to :class:`tqdm.tqdm` (``total``, ``initial``, ``desc``, ``unit``,
    ``bar_format``).  In a Jupyter kernel with ipywidgets it is the widget bar, displayed
    with a display id; its ``close()`` updates that display, so a notebook executed without
    a live front end (nbclient, ``jupyter nbconvert --execute``, a docs build) stores the
    final line (``100%|██████████| 15/15 ...``) as the output's text, not the ``0%`` of the
    first display.  Elsewhere (a terminal, a kernel without ipywidgets) it is tqdm's text
    bar on stderr, whose last line is the final state; tqdm's warning that ipywidgets is
    missing is not shown (the text bar is the intended fallback).
    """
    with warnings.catch_warnings():
        # "IProgress not found": tqdm.auto falls back to the text bar, as wanted here
        warnings.filterwarnings("ignore", message="IProgress not found")
        from tqdm.auto import tqdm  # noqa: PLC0415 (it probes for Jupyter: only when a bar is shown)
    notebook = sys.modules.get("tqdm.notebook")  # imported by tqdm.auto in a Jupyter kernel
    if notebook is None or not issubclass(tqdm, notebook.tqdm_notebook):
        return tqdm(**kwargs)
    bar = tqdm(display=False, **kwargs)
    if bar.disable:
        return bar
    # tqdm.notebook's own IPython display function (IPython is there: the kernel runs)
    handle = notebook.display(bar.container, display_id=True)
    bar.displayed = True
    close = bar.close

    def close_and_refresh() -> None:
        first = not bar.disable  # tqdm sets disable on close (close runs again from __del__)
        close()
        if first and bar.leave:
            handle.update(bar.container)  # the stored text/plain becomes the final line

    bar.close = close_and_refresh
    return bar
