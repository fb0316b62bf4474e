"""Results of a study as an xarray Dataset, written cell by cell to a Zarr store.

Layout (Zarr format 2, readable by ``xarray.open_zarr``): one variable per output with
dimensions ``(*grid axes, "draw", *output dims)``, the int8 variable ``cell_status``
(0 missing, 1 done, 2 failed) and the attributes

- ``transformer_pde_study``: format marker and version,
- ``fingerprint``: the study's identity (grid, cell configuration, outputs) -- a store is
  only ever resumed by the same study,
- ``name``, ``config`` (JSON), ``versions`` (software versions),
- ``failures``: JSON ``{flat cell index: message}`` of the failed cells.

Every variable has the CF attributes ``long_name`` and ``units`` (``"1"``: the model's
quantities are dimensionless); ``cell_status`` and the ``status`` outputs of the built-in
cell functions (:mod:`transformer_pde.sweep.cells`) have ``flag_values`` and
``flag_meanings``.  The store's metadata is consolidated (``.zmetadata``, refreshed when
the ``failures`` attribute changes), so ``xarray.open_zarr(path)`` opens it without a
warning.

**Integrity** (format version 2).  The variable ``cell_digest`` (``uint8``, 32 bytes per
cell, same chunks over the grid) holds the SHA-256 of each done cell's outputs
(:func:`cell_digest`), written with the outputs and before the status.  :func:`open_results`
verifies every done cell and raises :class:`StoreIntegrityError` naming the first damaged
cell (its flat index and coordinates); resuming (:class:`ResultStore` with ``resume=True``)
marks a damaged cell missing again, warns (:class:`~transformer_pde.errors.IntegrityWarning`)
and recomputes it.  A deleted chunk reads as the fill value and fails its digest the
same way.  ``cell_digest`` is internal: the datasets returned by :func:`open_results` and
:meth:`ResultStore.dataset` do not hold it.  Stores of version 1 (no digests) are opened
without verification and cannot be resumed by this version (finish them with the version
that started them, or rerun the study into a new path).

Only the process that runs the study writes to the store, so no locking is needed.  Finished
cells are kept in memory and written in groups (:meth:`ResultStore.flush`: every chunk that
holds a new cell is written once, at most every ``flush_interval`` seconds and at the end),
not one Zarr write per cell and variable; the outputs of a group are written before its
statuses, so a cell marked done is complete even if the writer is killed in between.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import IntegrityError, IntegrityWarning, TransformerPDEError
from ..extras import require
from ..io.digests import array_digest, check_version
from ..io.jsonfmt import dumps
from .grid import Grid
from .study import DONE, FAILED, MISSING, CellResult, Study

__all__ = ["StoreError", "StoreIntegrityError", "ResultStore", "open_results",
           "software_versions", "cell_digest", "FORMAT", "DIGEST_VAR"]

logger = logging.getLogger(__name__)

FORMAT = {"format": "transformer-pde-study", "version": 2}
_KNOWN_VERSIONS = (1, 2)
#: name of the per-cell digest variable in the Zarr store (format version 2)
DIGEST_VAR = "cell_digest"


class StoreError(TransformerPDEError):
    """A results store is missing, corrupt, foreign, or belongs to another study."""


class StoreIntegrityError(StoreError, IntegrityError):
    """A done cell of a results store does not match its digest (a damaged or deleted
    chunk, an edit); the message names the store and the cell."""


def cell_digest(values: Mapping[str, Any]) -> np.ndarray:
    """SHA-256 (32 ``uint8``) of one cell's outputs: the
    :func:`~transformer_pde.io.digests.array_digest` of each output, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(values):
        h.update(name.encode())
        h.update(bytes.fromhex(array_digest(np.asarray(values[name]))))
    return np.frombuffer(h.digest(), dtype=np.uint8).copy()


def _describe_cell(ds: Any, pos: tuple[int, ...]) -> str:
    """``cell 7 (mu=1.0, draw=1)``: flat index and coordinates of grid position ``pos``."""
    dims = ds["cell_status"].dims
    shape = ds["cell_status"].shape
    coords = []
    for dim, i in zip(dims, pos, strict=True):
        value = ds[dim].values[i].item() if dim in ds.coords else i
        coords.append(f"{dim}={value!r}")
    return f"cell {int(np.ravel_multi_index(pos, shape))} ({', '.join(coords)})"


def _bad_cells(ds: Any, outputs: list[str]) -> list[tuple[tuple[int, ...], str]]:
    """Grid positions whose status is not a known code, or that are done but whose outputs
    do not match ``cell_digest``, with the reason."""
    status = np.asarray(ds["cell_status"].values)
    digests = np.asarray(ds[DIGEST_VAR].values)
    arrays = {name: np.asarray(ds[name].values) for name in outputs}
    bad = []
    for pos in map(tuple, np.argwhere(~np.isin(status, (MISSING, DONE, FAILED)))):
        bad.append((pos, f"unknown status {int(status[pos])}"))
    for pos in map(tuple, np.argwhere(status == DONE)):
        if not np.array_equal(cell_digest({k: a[pos] for k, a in arrays.items()}),
                              digests[pos]):
            bad.append((pos, "outputs do not match the cell's digest"))
    return bad


def _format_version(path: Path, attrs: Mapping[str, Any]) -> int:
    """The store's format version from its marker attribute (:class:`StoreError` if it is
    not a study store or the version is unknown)."""
    try:
        marker = json.loads(attrs["transformer_pde_study"])
        ok = marker.get("format") == FORMAT["format"]
    except (KeyError, TypeError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise StoreError(f"{path} is a Zarr store but not a transformer-pde study (no format "
                         f"marker); nothing was changed")
    version = marker.get("version")
    return check_version(version, _KNOWN_VERSIONS, what="results-store ", source=path,
                         error=StoreIntegrityError)


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


#: CF attributes of the store's own variables
_OWN_VARIABLE_ATTRS = {
    "cell_status": {"long_name": "state of the cell", "units": "1",
                    "flag_values": np.array([MISSING, DONE, FAILED], dtype=np.int8),
                    "flag_meanings": "missing done failed"},
    DIGEST_VAR: {"long_name": "SHA-256 digest of the cell's outputs (internal)", "units": "1"},
    "draw": {"long_name": "random draw of the grid point", "units": "1"},
}


def _template(study: Study) -> Any:
    xr = require("xarray", "a parameter study's results store")
    from ..io.labelled import cf_attributes  # noqa: PLC0415

    grid = study.grid
    data_vars = {"cell_status": (grid.dims, np.full(grid.shape, MISSING, dtype=np.int8)),
                 DIGEST_VAR: ((*grid.dims, "digest_byte"),
                              np.zeros((*grid.shape, 32), dtype=np.uint8))}
    for name, spec in study.outputs.items():
        data_vars[name] = ((*grid.dims, *spec.dim_names(name)),
                           np.full((*grid.shape, *spec.shape), spec.fill, dtype=spec.dtype))
    ds = xr.Dataset(data_vars, coords=grid.coords())
    for name, attrs in _OWN_VARIABLE_ATTRS.items():
        if name in ds.variables:
            ds[name].attrs.update(attrs)
    # status codes are Status indices in the built-in cells only (a user's "status" may not be)
    builtin = type(study.cell).__module__ == "transformer_pde.sweep.cells"
    return cf_attributes(ds, status=("status",) if builtin else ())


class ResultStore:
    """In-memory results of a study, optionally mirrored to a Zarr directory."""

    def __init__(self, study: Study, path: str | Path | None, *, resume: bool,
                 attrs: Mapping[str, Any]) -> None:
        self.study = study
        self.path = None if path is None else Path(path)
        if DIGEST_VAR in (study.outputs or {}):
            raise StoreError(f"an output may not be called {DIGEST_VAR!r} (the store's "
                             f"per-cell checksums)")
        self.ds = _template(study)
        self.ds.attrs.update({"transformer_pde_study": dumps(FORMAT),
                              "fingerprint": study.fingerprint(), "name": study.name,
                              "versions": dumps(software_versions(), sort_keys=True),
                              "failures": "{}", **attrs})
        self.failures: dict[str, str] = {}
        self._group = None
        self._dirty: set[tuple[int, ...]] = set()
        self._failures_dirty = False
        self._consolidated = True
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
                # no _FillValue: every bit pattern (NaN payloads included) is stored as is,
                # so that the digests of the cells read back match
                enc[name] = {"chunks": (*_grid_chunks(study.grid, item), *var.shape[n_grid:]),
                             "_FillValue": None}
            dask = require("dask", "a parameter study's results store")
            try:
                with dask.config.set(scheduler="synchronous"):
                    self.ds.to_zarr(self.path, mode="w-", zarr_format=2, encoding=enc,
                                    consolidated=True)
            except (OSError, ValueError) as exc:
                raise StoreError(f"cannot create the results store {self.path}: {exc}") from exc
            self._group = self._zarr_group()

    # ------------------------------------------------------------------ reading
    def _zarr_group(self) -> Any:
        zarr = require("zarr", "a parameter study's results store")
        # a store written before consolidated metadata existed is consolidated at its
        # first flush
        self._consolidated = (self.path / ".zmetadata").is_file()
        return zarr.open_group(str(self.path), mode="r+", zarr_format=2)

    def _consolidate(self) -> None:
        """Rewrite ``.zmetadata`` from the store's metadata (after an attribute changed)."""
        zarr = require("zarr", "a parameter study's results store")
        with warnings.catch_warnings():  # zarr notes that consolidation is not in the v2 spec
            warnings.simplefilter("ignore", UserWarning)
            zarr.consolidate_metadata(str(self.path), zarr_format=2)
        self._consolidated = True

    def _open_existing(self) -> None:
        xr = require("xarray", "a parameter study's results store")
        try:
            old = xr.open_zarr(self.path, consolidated=False, zarr_format=2, chunks=None).load()
        except Exception as exc:  # noqa: BLE001 -- any failure to read means corrupt/foreign
            raise StoreError(f"{self.path} is not a readable transformer-pde results store "
                             f"({type(exc).__name__}: {exc}); nothing was changed") from None
        if _format_version(self.path, old.attrs) == 1:
            raise StoreError(f"{self.path} was written by an older transformer-pde (results-"
                             f"store format 1, without per-cell checksums) and cannot be "
                             f"resumed by this version; finish it with the version that "
                             f"started it, or rerun the study into a new path (open_results "
                             f"still reads it); nothing was changed")
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
        bad = _bad_cells(self.ds, list(self.study.outputs))
        if bad:
            # a damaged cell is not trusted: it becomes missing again and is recomputed
            for pos, _ in bad:
                self.ds["cell_status"].values[pos] = MISSING
                self.ds[DIGEST_VAR].values[pos] = 0
                for name, spec in self.study.outputs.items():
                    self.ds[name].values[pos] = spec.fill
                self._dirty.add(pos)
            first = "; ".join(f"{_describe_cell(self.ds, p)}: {why}" for p, why in bad[:3])
            msg = (f"{self.path}: {len(bad)} done cell(s) failed their checksum (damaged or "
                   f"deleted chunks) and will be recomputed: {first}"
                   f"{'; ...' if len(bad) > 3 else ''}")
            logger.warning("%s", msg)
            warnings.warn(msg, IntegrityWarning, stacklevel=3)

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
            # the digest of the values as stored (after the cast to the output's dtype)
            self.ds[DIGEST_VAR].values[pos] = cell_digest(
                {name: self.ds[name].values[pos] for name in self.study.outputs})
            self.failures.pop(key, None)
        else:
            for name, spec in self.study.outputs.items():
                self.ds[name].values[pos] = spec.fill
            self.ds[DIGEST_VAR].values[pos] = 0
            self.failures[key] = res.message
        self._failures_dirty |= res.status == FAILED or was_failed
        self.ds["cell_status"].values[pos] = res.status
        self.ds.attrs["failures"] = dumps(self.failures, sort_keys=True)
        self._dirty.add(pos)

    def flush(self, *, force: bool = True, interval: float = 1.0) -> None:
        """Write the cells recorded since the last flush (if ``force`` or ``interval``
        seconds have passed): each Zarr chunk holding one of them is written once, the
        outputs first, then ``cell_digest``, and ``cell_status`` last."""
        if self._group is None or not self._dirty:
            return
        if not force and time.monotonic() - self._last_flush < interval:
            return
        n_grid = len(self.study.grid.dims)
        names = [*self.study.outputs, DIGEST_VAR, "cell_status"]  # status last
        for name in names:
            arr = self._group[name]
            size = arr.chunks[:n_grid]
            values = self.ds[name].values
            blocks = {tuple(i // c for i, c in zip(p, size, strict=True)) for p in self._dirty}
            for b in sorted(blocks):
                sl = tuple(slice(i * c, (i + 1) * c) for i, c in zip(b, size, strict=True))
                arr[sl] = values[sl]
        if self._failures_dirty or not self._consolidated:
            self._group.attrs["failures"] = dumps(self.failures, sort_keys=True)
            self._consolidate()
            self._failures_dirty = False
        self._dirty.clear()
        self._last_flush = time.monotonic()

    def dataset(self) -> Any:
        """A copy of the results (without the internal ``cell_digest`` variable)."""
        return self.ds.drop_vars(DIGEST_VAR).copy()


def open_results(path: str | Path, *, verify: bool = True) -> Any:
    """Open a study's Zarr store as an :class:`xarray.Dataset` (loaded into memory).

    Parameters
    ----------
    path : str or Path
        The store (``results.zarr``).
    verify : bool, default True
        Check every done cell against its digest (format version 2).  ``False`` only
        reads (to inspect a damaged store, or to read its metadata before resuming it).

    Returns
    -------
    xarray.Dataset
        The outputs, ``cell_status`` and the attributes (not the internal ``cell_digest``).

    Raises
    ------
    StoreError
        ``path`` is missing, unreadable, or not a transformer-pde study store.
    StoreIntegrityError
        (a :class:`StoreError` and an :class:`~transformer_pde.errors.IntegrityError`) the
        format version is unknown, or (``verify``) a done cell's outputs do not match its
        digest or a status is not a known code; the message names the store and the cell
        (flat index and coordinates).  Version-1 stores (no digests) are not verified.
    """
    xr = require("xarray", "reading a parameter study's results")
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
    version = _format_version(path, ds.attrs)
    if version == 1:
        return ds
    if DIGEST_VAR not in ds or ds[DIGEST_VAR].shape != (*ds["cell_status"].shape, 32):
        raise StoreIntegrityError(f"{path}: variable {DIGEST_VAR!r} is missing or has the "
                                  f"wrong shape; the store is corrupt")
    if verify:
        outputs = [str(n) for n in ds.data_vars if n not in ("cell_status", DIGEST_VAR)]
        bad = _bad_cells(ds, outputs)
        if bad:
            pos, why = bad[0]
            raise StoreIntegrityError(
                f"{path}: {_describe_cell(ds, pos)}: {why} (a damaged or deleted chunk, or "
                f"an edit); {len(bad)} cell(s) in all. Resume the study (resume=True) to "
                f"recompute them, or open with verify=False to inspect the store")
    return ds.drop_vars(DIGEST_VAR)
