"""Write the small intersphinx inventories of ``docs/_inventories/`` (offline builds).

CI and development machines reach only package registries, so the build cannot download
``objects.inv`` from NumPy, SciPy, POT, xarray... This script writes, for each project, an
inventory (Sphinx's version-2 format) holding only the names these docs refer to, with
their real addresses on the projects' hosted documentation.  ``conf.py`` reads them and
keeps the remote inventories as the fallback (first choice on Read the Docs).

Add a name here when a page or a docstring refers to a new one, then run::

    python docs/make_inventories.py
"""

from __future__ import annotations

import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent / "_inventories"

# project -> (name, version, {(domain:role, name): relative URI})
PROJECTS: dict[str, tuple[str, str, dict[tuple[str, str], str]]] = {
    "python": ("Python", "3", {
        ("py:exception", "ValueError"): "library/exceptions.html#ValueError",
        ("py:exception", "TypeError"): "library/exceptions.html#TypeError",
        ("py:exception", "KeyboardInterrupt"): "library/exceptions.html#KeyboardInterrupt",
        ("py:exception", "Warning"): "library/exceptions.html#Warning",
        ("py:exception", "RuntimeWarning"): "library/exceptions.html#RuntimeWarning",
        ("py:function", "warnings.warn"): "library/warnings.html#warnings.warn",
        ("py:function", "warnings.simplefilter"): "library/warnings.html#warnings.simplefilter",
        ("py:module", "warnings"): "library/warnings.html#module-warnings",
        ("py:module", "logging"): "library/logging.html#module-logging",
        ("py:module", "tomllib"): "library/tomllib.html#module-tomllib",
        ("py:class", "pathlib.Path"): "library/pathlib.html#pathlib.Path",
    }),
    "numpy": ("NumPy", "2", {
        ("py:class", "numpy.ndarray"): "reference/generated/numpy.ndarray.html#numpy.ndarray",
        ("py:class", "numpy.float32"): "reference/arrays.scalars.html#numpy.float32",
        ("py:class", "numpy.float64"): "reference/arrays.scalars.html#numpy.float64",
        ("py:class", "numpy.random.Generator"):
            "reference/random/generator.html#numpy.random.Generator",
        ("py:class", "numpy.random.SeedSequence"):
            "reference/random/bit_generators/generated/numpy.random.SeedSequence.html"
            "#numpy.random.SeedSequence",
        ("py:function", "numpy.random.default_rng"):
            "reference/random/generator.html#numpy.random.default_rng",
        ("py:function", "numpy.linalg.matrix_rank"):
            "reference/generated/numpy.linalg.matrix_rank.html#numpy.linalg.matrix_rank",
        ("py:function", "numpy.linalg.eigh"):
            "reference/generated/numpy.linalg.eigh.html#numpy.linalg.eigh",
        ("py:function", "numpy.exp"): "reference/generated/numpy.exp.html#numpy.exp",
        ("py:function", "numpy.einsum"): "reference/generated/numpy.einsum.html#numpy.einsum",
    }),
    "scipy": ("SciPy", "1", {
        ("py:function", "scipy.integrate.solve_ivp"):
            "reference/generated/scipy.integrate.solve_ivp.html#scipy.integrate.solve_ivp",
        ("py:class", "scipy.integrate.DOP853"):
            "reference/generated/scipy.integrate.DOP853.html#scipy.integrate.DOP853",
        ("py:class", "scipy.integrate.Radau"):
            "reference/generated/scipy.integrate.Radau.html#scipy.integrate.Radau",
        ("py:function", "scipy.linalg.expm"):
            "reference/generated/scipy.linalg.expm.html#scipy.linalg.expm",
        ("py:function", "scipy.linalg.sqrtm"):
            "reference/generated/scipy.linalg.sqrtm.html#scipy.linalg.sqrtm",
        ("py:function", "scipy.cluster.hierarchy.linkage"):
            "reference/generated/scipy.cluster.hierarchy.linkage.html"
            "#scipy.cluster.hierarchy.linkage",
        ("py:function", "scipy.optimize.brentq"):
            "reference/generated/scipy.optimize.brentq.html#scipy.optimize.brentq",
    }),
    "ot": ("POT Python Optimal Transport", "0.9", {
        ("py:module", "ot"): "all.html#module-ot",
        ("py:function", "ot.emd2"): "all.html#ot.emd2",
        ("py:function", "ot.sinkhorn"): "all.html#ot.sinkhorn",
        ("py:function", "ot.sliced_wasserstein_distance"):
            "all.html#ot.sliced_wasserstein_distance",
        ("py:function", "ot.bregman.sinkhorn_log"):
            "gen_modules/ot.bregman.html#ot.bregman.sinkhorn_log",
    }),
    "xarray": ("xarray", "2025", {
        ("py:class", "xarray.Dataset"): "generated/xarray.Dataset.html#xarray.Dataset",
        ("py:class", "xarray.DataArray"): "generated/xarray.DataArray.html#xarray.DataArray",
        ("py:function", "xarray.open_zarr"):
            "generated/xarray.open_zarr.html#xarray.open_zarr",
        ("py:function", "xarray.open_dataset"):
            "generated/xarray.open_dataset.html#xarray.open_dataset",
        ("py:method", "xarray.Dataset.to_zarr"):
            "generated/xarray.Dataset.to_zarr.html#xarray.Dataset.to_zarr",
        ("py:method", "xarray.Dataset.to_netcdf"):
            "generated/xarray.Dataset.to_netcdf.html#xarray.Dataset.to_netcdf",
    }),
    "matplotlib": ("Matplotlib", "3", {
        ("py:class", "matplotlib.figure.Figure"):
            "api/_as_gen/matplotlib.figure.Figure.html#matplotlib.figure.Figure",
        ("py:class", "matplotlib.axes.Axes"):
            "api/_as_gen/matplotlib.axes.Axes.html#matplotlib.axes.Axes",
    }),
    "distributed": ("Dask.distributed", "2025", {
        ("py:class", "distributed.Client"): "api.html#distributed.Client",
        ("py:class", "distributed.LocalCluster"): "api.html#distributed.LocalCluster",
    }),
}

# the remote addresses (conf.py's intersphinx_mapping uses the same ones)
URLS = {
    "python": "https://docs.python.org/3",
    "numpy": "https://numpy.org/doc/stable",
    "scipy": "https://docs.scipy.org/doc/scipy",
    "ot": "https://pythonot.github.io",
    "xarray": "https://docs.xarray.dev/en/stable",
    "matplotlib": "https://matplotlib.org/stable",
    "distributed": "https://distributed.dask.org/en/stable",
}


def inventory(project: str, version: str, entries: dict[tuple[str, str], str]) -> bytes:
    """The bytes of an ``objects.inv`` (version 2) holding ``entries``."""
    head = (f"# Sphinx inventory version 2\n# Project: {project}\n# Version: {version}\n"
            "# The remainder of this file is compressed using zlib.\n").encode()
    body = "".join(f"{name} {role} 1 {uri} -\n"
                   for (role, name), uri in sorted(entries.items(), key=lambda e: e[0][1]))
    return head + zlib.compress(body.encode(), 9)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for key, (project, version, entries) in PROJECTS.items():
        (OUT / f"{key}.inv").write_bytes(inventory(project, version, entries))


if __name__ == "__main__":
    main()
