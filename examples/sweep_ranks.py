"""Rank histograms from a sweep's Zarr store (transformer-pde sweep)
==================================================================

Runs the study of ``examples/configs/sweep_ranks.toml`` (or reads an existing store,
``STORE``) and draws one histogram of the final covariance rank per (kind, d), from the
labelled results: the store is an xarray Dataset with the grid axes as coordinates::

    python examples/sweep_ranks.py      # writes figures/sweep_ranks.png
"""

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs 2 draws per (kind, d) in a temporary folder
# instead of 12 in ``sweep-ranks/`` of the working directory (resumed when it exists); the
# figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's
# ``figures/``).

import shutil
import tempfile
import tomllib
from pathlib import Path

import numpy as np
import matplotlib.pyplot as plt

from transformer_pde import sweep
from transformer_pde.cli.templates import template_text
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures
from transformer_pde.sweep.config import run_config

FAST = fast_configuration()
OUT = output_folder()
STORE = None        # an existing results.zarr to draw (skips the run)
WORK = Path(tempfile.mkdtemp()) if FAST else Path("sweep-ranks")   # the run's store goes here
WORKERS = 1 if FAST else None     # Dask worker processes (None: one per core)
DRAWS = 2 if FAST else 12         # random draws per (kind, d)

# %%
# A rank sweep as a configuration
# -------------------------------
# ``examples/configs/sweep_ranks.toml`` describes a grid of cells: two attention kinds
# (softmax and L2) times three dimensions (3, 4, 5) times 12 random draws, 72 cells.  Each
# cell is one trial of the paper's rank protocol: :math:`Q` of shape
# :math:`\lfloor d/2\rfloor\times d`, :math:`K = -Q`, :math:`V = I`,
# :math:`\Sigma_0 = SS^\top`; the Gaussian moment ODE is solved until :math:`\Sigma`
# converges, and the cell records the number of eigenvalues of the limit above 0.1.  The same
# file runs from the shell with ``transformer-pde sweep``; it is installed with the package
# (``transformer-pde init sweep`` writes it), so the notebook reads it from there, with
# ``DRAWS`` draws.

CONFIG = template_text("sweep")
if tomllib.loads(CONFIG)["study"]["draws"] != DRAWS:
    CONFIG = CONFIG.replace("\ndraws = 12\n", f"\ndraws = {DRAWS}\n")
    assert tomllib.loads(CONFIG)["study"]["draws"] == DRAWS, "the template's draws moved"


# %%
# Running the sweep
# -----------------
# :func:`~transformer_pde.sweep.config.run_config` runs the cells in parallel on a local
# Dask cluster of ``WORKERS`` processes (default: one per core) and writes each result into
# a Zarr store under ``WORK``.  A store that already exists there is resumed: only the
# cells not yet done are run.  With ``STORE`` the script skips the run and reads a
# finished store.

def results_store(store: str | Path | None, work: Path, workers: int | None) -> str | Path:
    if store is None:
        work.mkdir(parents=True, exist_ok=True)
        (work / "sweep_ranks.toml").write_text(CONFIG, encoding="utf-8")
        run_config(work / "sweep_ranks.toml", work, workers=workers,
                   resume=(work / "results.zarr").exists())
        store = work / "results.zarr"
    return store


# %%
# The histograms
# --------------
# :func:`~transformer_pde.sweep.open_results` opens the store as an xarray Dataset whose
# coordinates are the grid's axes, so the ranks of one kind and dimension are a ``.sel`` away.
# Only the cells whose status is ``DONE`` are counted.  One panel per kind, one group of bars
# per dimension: how many draws end with each rank.

def draw(ds):
    done = ds["cell_status"] == sweep.DONE
    kinds, dims = list(ds["kind"].values), list(ds["d"].values)
    fig = plt.figure(figsize=(4.0 * len(kinds), 3.2), layout="constrained")
    axes = fig.subplots(1, len(kinds), squeeze=False)[0]
    width = 0.8 / len(dims)
    for ax, kind in zip(axes, kinds, strict=True):
        for j, d in enumerate(dims):
            sel = ds["rank"].sel(kind=kind, d=d).where(done.sel(kind=kind, d=d), drop=True)
            counts = np.bincount(sel.values.astype(int), minlength=max(dims) + 1)
            ax.bar(np.arange(counts.size) + (j - (len(dims) - 1) / 2) * width, counts,
                   width=width, label=f"d = {d}")
        ax.set(title=f"{kind}: rank of the final Σ", xlabel="eigenvalues above 0.1",
               ylabel="trials")
        ax.legend()
    fig.suptitle(f"sweep '{ds.attrs['name']}': {int(done.sum())} of {done.size} cells")
    return fig


# %%
# Run it
# ------
# The sweep (about a minute on 2 cores), then the figure (``sweep_ranks.png`` into ``OUT``;
# in Jupyter it shows below the cell).

ds = sweep.open_results(results_store(STORE, WORK, WORKERS))
save_figures({"sweep_ranks": draw(ds)}, OUT, dpi=110)
if FAST:
    shutil.rmtree(WORK)     # the fast run's temporary store
