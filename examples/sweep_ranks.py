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
from matplotlib.figure import Figure

from transformer_pde import sweep
from transformer_pde.sweep.config import run_config

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="an existing results.zarr (skips the run)")
    ap.add_argument("--out", default="figures", help="directory of the PNG")
    ap.add_argument("--work", default="sweep-ranks", help="directory of the run's store")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    store = args.store
    if store is None:
        run_config(HERE / "configs" / "sweep_ranks.toml", args.work, workers=args.workers,
                   resume=Path(args.work, "results.zarr").exists())
        store = Path(args.work) / "results.zarr"
    ds = sweep.open_results(store)
    done = ds["cell_status"] == sweep.DONE
    kinds, dims = list(ds["kind"].values), list(ds["d"].values)
    fig = Figure(figsize=(4.0 * len(kinds), 3.2), layout="constrained")
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "sweep_ranks.png", dpi=110)


if __name__ == "__main__":
    main()
