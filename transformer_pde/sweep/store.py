"""Results of a study as an xarray Dataset, written cell by cell to a Zarr store.

Layout (Zarr format 2, readable by ``xarray.open_zarr``): one variable per output with
dimensions ``(*grid axes, "draw", *output dims)``, the int8 variable ``cell_status``
(0 missing, 1 done, 2 failed) and the attributes

- ``transformer_pde_study``: format marker and version,
- ``fingerprint``: the study's identity (grid, cell configuration, outputs) -- a store is
  only ever resumed by the same study,
- ``name``, ``config`` (JSON), ``versions`` (software versions),
- ``failures``: JSON ``{flat cell index: message}`` of the failed cells.

Only the process that runs the study writes to the store, so no locking is needed.  Finished
cells are kept in memory and written in groups (:meth:`ResultStore.flush`: every chunk that
holds a new cell is written once, at most every ``flush_interval`` seconds and at the end),
not one Zarr write per cell and variable; the outputs of a group are written before its
statuses, so a cell marked done is complete even if the writer is killed in between.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import TransformerPDEError
from .grid import Grid
from .study import DONE, FAILED, MISSING, CellResult, Study

__all__ = ["StoreError", "ResultStore", "open_results", "software_versions", "FORMAT"]

FORMAT = {"format": "transformer-pde-study", "version": 1}


class StoreError(TransformerPDEError):
    """A results store is missing, corrupt, foreign, or belongs to another study."""


def software_versions() -> dict[str, str]:
    import importlib.metadata as md  # noqa: PLC0415

    out = {}
    for pkg in ("transformer-pde", "numpy", "scipy", "numba", "dask", "distributed", "xarray",
                "zarr"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return out


def _grid_chunks(grid: Grid, item_size: int, target: int = 1 << 16) -> tuple[int, ...]:
    """Chunk shape over the grid dimensions: ~``target`` bytes of consecutive cells (whole
    trailing dimensions first), so that a group of finished cells -- which are consecutive
    in the grid's order -- is written as few chunks.  (One chunk per cell, as with chunks of
    1 along every axis but the draws, costs a Zarr write per cell: ~9 ms each.)"""
    cells = max(1, target // max(item_size, 1))
    chunks = []
    for n in reversed(grid.shape):
        take = int(max(1, min(n, cells)))
        chunks.append(take)
        cells = cells // n if take == n else 1
    return tuple(reversed(chunks))


def _template(study: Study) -> Any:
    import xarray as xr  # noqa: PLC0415

    grid = study.grid
    data_vars = {"cell_status": (grid.dims, np.full(grid.shape, MISSING, dtype=np.int8))}
    for name, spec in study.outputs.items():
        data_vars[name] = ((*grid.dims, *spec.dim_names(name)),
                           np.full((*grid.shape, *spec.shape), spec.fill, dtype=spec.dtype))
    return xr.Dataset(data_vars, coords=grid.coords())


class ResultStore:
    """In-memory results of a study, optionally mirrored to a Zarr directory."""

    def __init__(self, study: Study, path: str | Path | None, *, resume: bool,
                 attrs: Mapping[str, Any]) -> None:
        self.study = study
        self.path = None if path is None else Path(path)
        self.ds = _template(study)
        self.ds.attrs.update({"transformer_pde_study": json.dumps(FORMAT),
                              "fingerprint": study.fingerprint(), "name": study.name,
                              "versions": json.dumps(software_versions(), sort_keys=True),
                              "failures": "{}", **attrs})
        self.failures: dict[str, str] = {}
        self._group = None
        self._dirty: set[tuple[int, ...]] = set()
        self._failures_dirty = False
        self._last_flush = time.monotonic()
        if self.path is None:
            return
        if self.path.exists():
            if not resume:
                raise StoreError(f"{self.path} already exists; pass resume=True (CLI: --resume) "
                                 f"to complete it, or choose another path (nothing was "
                                 f"overwritten)")
            self._open_existing()
        else:
            if not self.path.parent.is_dir():
                raise StoreError(f"cannot create {self.path}: {self.path.parent} is not a "
                                 f"directory")
            enc = {}
            for name, var in self.ds.data_vars.items():
                n_grid = len(study.grid.dims)
                item = int(np.prod(var.shape[n_grid:], dtype=int)) * var.dtype.itemsize
                enc[name] = {"chunks": (*_grid_chunks(study.grid, item), *var.shape[n_grid:])}
            import dask  # noqa: PLC0415

            try:
                with dask.config.set(scheduler="synchronous"):
                    self.ds.to_zarr(self.path, mode="w-", zarr_format=2, encoding=enc,
                                    consolidated=False)
            except (OSError, ValueError) as exc:
                raise StoreError(f"cannot create the results store {self.path}: {exc}") from exc
            self._group = self._zarr_group()

    # ------------------------------------------------------------------ reading
    def _zarr_group(self) -> Any:
        import zarr  # noqa: PLC0415

        return zarr.open_group(str(self.path), mode="r+", zarr_format=2)

    def _open_existing(self) -> None:
        import xarray as xr  # noqa: PLC0415

        try:
            old = xr.open_zarr(self.path, consolidated=False, zarr_format=2, chunks=None).load()
        except Exception as exc:  # noqa: BLE001 -- any failure to read means corrupt/foreign
            raise StoreError(f"{self.path} is not a readable transformer-pde results store "
                             f"({type(exc).__name__}: {exc}); nothing was changed") from None
        marker = old.attrs.get("transformer_pde_study")
        if marker is None or json.loads(marker).get("format") != FORMAT["format"]:
            raise StoreError(f"{self.path} is a Zarr store but not a transformer-pde study "
                             f"(no format marker); nothing was changed")
        if old.attrs.get("fingerprint") != self.study.fingerprint():
            raise StoreError(
                f"{self.path} was written by a different study (its grid, cell function "
                f"options or outputs changed since); resume only with the same configuration, "
                f"or write to a new path. Stored: {old.attrs.get('fingerprint')}; now: "
                f"{self.study.fingerprint()}")
        for name in self.ds.data_vars:
            if name not in old or old[name].shape != self.ds[name].shape:
                raise StoreError(f"{self.path}: variable {name!r} is missing or has the wrong "
                                 f"shape; the store is corrupt")
            self.ds[name].values[...] = old[name].values
        try:
            self.failures = dict(json.loads(old.attrs.get("failures", "{}")))
        except json.JSONDecodeError:
            raise StoreError(f"{self.path}: attribute 'failures' is not JSON; the store is "
                             f"corrupt") from None
        self._group = self._zarr_group()

    def pending(self) -> list[int]:
        """Flat indices of the cells still to compute (missing or failed)."""
        status = self.ds["cell_status"].values.reshape(-1)
        return [int(i) for i in np.flatnonzero(status != DONE)]

    # ------------------------------------------------------------------ writing
    def record(self, res: CellResult) -> None:
        """Keep one finished cell in memory; it reaches the store at the next :meth:`flush`."""
        pos = self.study.grid.position(res.index)
        key = str(res.index)
        was_failed = key in self.failures
        if res.status == DONE:
            for name, value in res.values.items():
                self.ds[name].values[pos] = value
            self.failures.pop(key, None)
        else:
            for name, spec in self.study.outputs.items():
                self.ds[name].values[pos] = spec.fill
            self.failures[key] = res.message
        self._failures_dirty |= res.status == FAILED or was_failed
        self.ds["cell_status"].values[pos] = res.status
        self.ds.attrs["failures"] = json.dumps(self.failures, sort_keys=True)
        self._dirty.add(pos)

    def flush(self, *, force: bool = True, interval: float = 1.0) -> None:
        """Write the cells recorded since the last flush (if ``force`` or ``interval``
        seconds have passed): each Zarr chunk holding one of them is written once, the
        outputs first and ``cell_status`` last."""
        if self._group is None or not self._dirty:
            return
        if not force and time.monotonic() - self._last_flush < interval:
            return
        n_grid = len(self.study.grid.dims)
        names = [*self.study.outputs, "cell_status"]  # status last
        for name in names:
            arr = self._group[name]
            size = arr.chunks[:n_grid]
            values = self.ds[name].values
            blocks = {tuple(i // c for i, c in zip(p, size, strict=True)) for p in self._dirty}
            for b in sorted(blocks):
                sl = tuple(slice(i * c, (i + 1) * c) for i, c in zip(b, size, strict=True))
                arr[sl] = values[sl]
        if self._failures_dirty:
            self._group.attrs["failures"] = json.dumps(self.failures, sort_keys=True)
            self._failures_dirty = False
        self._dirty.clear()
        self._last_flush = time.monotonic()

    def dataset(self) -> Any:
        return self.ds.copy()


def open_results(path: str | Path) -> Any:
    """Open a study's Zarr store as an :class:`xarray.Dataset` (loaded into memory).

    Raises :class:`StoreError` when ``path`` is not a transformer-pde study store."""
    import xarray as xr  # noqa: PLC0415

    path = Path(path)
    if not path.exists():
        raise StoreError(f"{path} does not exist")
    try:
        ds = xr.open_zarr(path, consolidated=False, zarr_format=2, chunks=None).load()
    except Exception as exc:  # noqa: BLE001
        raise StoreError(f"{path} is not a readable transformer-pde results store "
                         f"({type(exc).__name__}: {exc})") from None
    if "transformer_pde_study" not in ds.attrs:
        raise StoreError(f"{path} is a Zarr store but not a transformer-pde study")
    return ds
