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
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

__all__ = ["EXTRAS", "require"]

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
