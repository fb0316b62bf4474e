"""Rank histograms from a sweep's Zarr store (transformer-pde sweep)
==================================================================

Runs the study of ``examples/configs/sweep_ranks.toml`` (or reads an existing store with
``--store``) and draws one histogram of the final covariance rank per (kind, d), from the
labelled results: the store is an xarray Dataset with the grid axes as coordinates::

    python examples/sweep_ranks.py --out figures
"""

import argparse
from pathlib import Path

import numpy as np
import matplotlib.pyplot as plt

from transformer_pde import sweep
from transformer_pde.sweep.config import run_config
from transformer_pde.paper.scripts import script_argv

# %%
# A rank sweep as a configuration
# -------------------------------
# ``examples/configs/sweep_ranks.toml`` describes a grid of cells: two attention kinds
# (softmax and L2) times three dimensions (3, 4, 5) times 12 random draws, 72 cells.  Each
# cell is one trial of the paper's rank protocol: :math:`Q` of shape
# :math:`\lfloor d/2\rfloor\times d`, :math:`K = -Q`, :math:`V = I`,
# :math:`\Sigma_0 = SS^\top`; the Gaussian moment ODE is solved until :math:`\Sigma`
# converges, and the cell records the number of eigenvalues of the limit above 0.1.  The same
# file runs from the shell with ``transformer-pde sweep``.

#: this directory when run as a file; in a notebook (no ``__file__``) the working directory,
#: which should then be ``examples/``
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()


# %%
# Running the sweep
# -----------------
# :func:`~transformer_pde.sweep.config.run_config` runs the cells in parallel on a local
# Dask cluster of ``--workers`` processes (default: one per core) and writes each result into
# a Zarr store under ``--work``.  A store that already exists there is resumed: only the
# cells not yet done are run.  With ``--store`` the script skips the run and reads a
# finished store.

def results_store(store: str | None, work: str, workers: int | None) -> str | Path:
    if store is None:
        run_config(HERE / "configs" / "sweep_ranks.toml", work, workers=workers,
                   resume=Path(work, "results.zarr").exists())
        store = Path(work) / "results.zarr"
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
# From the shell, ``python examples/sweep_ranks.py --out DIR`` runs the sweep in
# ``sweep-ranks/`` (``--work``) and writes ``DIR/sweep_ranks.png``; about a minute on 2
# cores.  In a notebook, started in ``examples/``, the cell below does the same with the
# defaults.

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="an existing results.zarr (skips the run)")
    ap.add_argument("--out", default="figures", help="directory of the PNG")
    ap.add_argument("--work", default="sweep-ranks", help="directory of the run's store")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)
    ds = sweep.open_results(results_store(args.store, args.work, args.workers))
    fig = draw(ds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "sweep_ranks.png", dpi=110)


if __name__ == "__main__":
    main(script_argv())
