"""Results of a study as an xarray Dataset, written cell by cell to a Zarr store.

Layout (Zarr format 2, readable by ``xarray.open_zarr``): one variable per output with
dimensions ``(*grid axes, "draw", *output dims)``, the int8 variable ``cell_status``
(0 missing, 1 done, 2 failed) and the attributes

- ``transformer_pde_study``: format marker and version,
- ``fingerprint``: the study's identity (grid, cell configuration, outputs; one level of
  JSON, :func:`~transformer_pde.sweep.study.structured`) -- a store is only ever resumed
  by the same study,
- ``name``, ``config`` (JSON), ``versions`` (software versions),
- ``failures``: JSON ``{flat cell index: message}`` of the failed cells,
- the CF ``Conventions``, ``source``, ``references`` and ``history`` (a line per run that
  wrote to it) of :func:`~transformer_pde.io.labelled.provenance`, and
  ``json_attributes``, the names of the attributes holding JSON.

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
that started them, or rerun the study into a new path).  The digests are verified whenever
a store holds ``cell_digest``, whatever its marker says; a store that holds them under a
version-1 marker (the marker was edited) is refused.  Stores of version 2 (a fingerprint of
JSON inside JSON) are resumed by the same study -- the fingerprints are compared as data
-- and rewritten as version 3 on the way.

**Metadata** (every version).  :func:`open_results` and a resume first check the marker,
the JSON attributes, every variable's dimensions, shape and dtype against the declared
outputs, the coordinates against the recorded grid and Zarr's metadata files: a damaged
item is a :class:`StoreError` naming the store and the item.  The grid's axis order (which
numbers the cells; the fingerprint's JSON sorts it) is that of ``cell_status``'s dims.

Only the process that runs the study writes to the store, so no locking is needed.  Finished
cells are kept in memory and written in groups (:meth:`ResultStore.flush`: every chunk that
holds a new cell is written once, at most every ``flush_interval`` seconds and at the end),
not one Zarr write per cell and variable; the outputs of a group are written before its
statuses, so a cell marked done is complete even if the writer is killed in between.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import IntegrityError, IntegrityWarning, TransformerPDEError
from ..extras import require
from ..io.digests import array_digest, check_checksum_version, check_version
from ..io.jsonfmt import dumps
from ..io.labelled import JSON_ATTRIBUTES, cf_attributes, provenance, zarr_metadata_problem
from .grid import Grid
from .study import DONE, FAILED, MISSING, CellResult, Output, Study, structured

__all__ = ["StoreError", "StoreIntegrityError", "ResultStore", "open_results",
           "software_versions", "cell_digest", "read_fingerprint", "stored_failures", "stored_outputs",
           "FORMAT",
           "DIGEST_VAR"]

logger = logging.getLogger(__name__)

FORMAT = {"format": "transformer-pde-study", "version": 3}   # 3: one level of JSON
_KNOWN_VERSIONS = (1, 2, 3)
_FIRST_DIGEST_VERSION = 2  # the first format version whose stores hold cell_digest
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
        raise StoreError(f"{path} is a Zarr store but not a transformer-pde study (its format "
                         f"marker, the attribute 'transformer_pde_study', is missing or not "
                         f"a JSON object naming {FORMAT['format']!r}); nothing was changed")
    version = marker.get("version")
    return check_version(version, _KNOWN_VERSIONS, what="results-store ", source=path,
                         error=StoreIntegrityError)


# ------------------------------------------------------------------ metadata checks
_JSON_KINDS = {dict: "object", list: "array"}
#: the attributes of a store that hold JSON text (named by its ``json_attributes``)
_JSON_ATTRS = ("transformer_pde_study", "fingerprint", "versions", "failures", "config",
               "status_codes")


def _damaged(path: Any, what: str) -> StoreError:
    return StoreError(f"{path}: {what}; the store's metadata is damaged (it was edited or "
                      f"is corrupt)")


def _json_attr(path: Any, attrs: Mapping[str, Any], name: str, kind: type, *,
               required: bool = True) -> Any:
    """The JSON attribute ``name`` parsed, a JSON ``kind`` (``dict``, ``list``); ``None``
    when it is absent and not ``required``.  Anything else is a :class:`StoreError` naming
    ``path`` and the attribute."""
    if name not in attrs:
        if required:
            raise _damaged(path, f"attribute {name!r} is missing")
        return None
    raw = attrs[name]
    if not isinstance(raw, str):
        raise _damaged(path, f"attribute {name!r} is not JSON text (it holds a "
                             f"{type(raw).__name__})")
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise _damaged(path, f"attribute {name!r} is not valid JSON ({exc})") from None
    if not isinstance(value, kind):
        raise _damaged(path, f"attribute {name!r} is not a JSON {_JSON_KINDS[kind]}")
    return value


def stored_failures(path: Any, attrs: Mapping[str, Any], n_cells: int | None = None
                    ) -> dict[str, str]:
    """The ``failures`` attribute of a store's (or results dataset's) attributes ``attrs``:
    ``{flat cell index: message}``, checked (indices below ``n_cells`` when given); a
    damaged attribute is a :class:`StoreError` naming ``path`` and the attribute."""
    failures = _json_attr(path, attrs, "failures", dict)
    for key, message in failures.items():
        index = int(key) if key.isascii() and key.isdigit() else -1
        if index < 0 or (n_cells is not None and index >= n_cells):
            raise _damaged(path, f"attribute 'failures' names {key!r}, which is not a cell of "
                                 f"the grid" + (f" (0 to {n_cells - 1})" if n_cells else ""))
        if not isinstance(message, str):
            raise _damaged(path, f"attribute 'failures' holds a {type(message).__name__} for "
                                 f"cell {key}, not a message")
    return failures


def stored_outputs(path: Any, fingerprint: Mapping[str, Any]) -> dict[str, Output]:
    """The outputs declared in a store's parsed ``fingerprint`` attribute, as
    :class:`~transformer_pde.sweep.Output` objects (:class:`StoreError` naming ``path``,
    the attribute and the output when a description is not one that
    :meth:`Output.to_dict` writes)."""
    outs = fingerprint.get("outputs")
    if not isinstance(outs, dict):
        raise _damaged(path, "attribute 'fingerprint' has no 'outputs' object")
    out = {}
    for name, spec in outs.items():
        try:
            if not isinstance(spec, dict) or set(spec) != {"shape", "dtype", "dims"}:
                raise ValueError("not an object with 'shape', 'dtype' and 'dims'")
            shape, dims = spec["shape"], spec["dims"]
            if not isinstance(shape, list) or not all(type(n) is int for n in shape):
                raise TypeError(f"shape {shape!r} is not a list of integers")
            if dims is not None and (not isinstance(dims, list)
                                     or not all(isinstance(d, str) for d in dims)):
                raise TypeError(f"dims {dims!r} is not a list of names")
            if not isinstance(spec["dtype"], str):
                raise TypeError(f"dtype {spec['dtype']!r} is not a dtype name")
            out[name] = Output(tuple(shape), spec["dtype"],
                               None if dims is None else tuple(dims))
        except (TypeError, ValueError) as exc:
            raise _damaged(path, f"attribute 'fingerprint': the description of output "
                                 f"{name!r} is invalid ({exc})") from None
    return out


def _stored_grid(path: Any, fingerprint: Mapping[str, Any], ds: Any) -> Grid:
    """The grid of a store's parsed ``fingerprint``, its axes in the order of the dims of
    ``cell_status`` (the fingerprint's JSON sorts them); a :class:`StoreError` naming
    ``path`` and the item when either does not describe the grid."""
    grid = fingerprint.get("grid")
    try:
        if not isinstance(grid, dict) or set(grid) != {"axes", "draws", "seed"}:
            raise ValueError("not an object with 'axes', 'draws' and 'seed'")
        if not isinstance(grid["axes"], dict):
            raise TypeError("'axes' is not an object")
        stored = Grid(grid["axes"], draws=grid["draws"], seed=grid["seed"])
    except (TypeError, ValueError) as exc:
        raise _damaged(path, f"attribute 'fingerprint' holds an invalid grid ({exc})") from None
    if "cell_status" not in ds.data_vars:
        raise _damaged(path, "variable 'cell_status' is missing")
    dims = tuple(str(d) for d in ds["cell_status"].dims)
    if sorted(dims) != sorted(stored.dims) or dims[-1:] != ("draw",):
        raise _damaged(path, f"variable 'cell_status' has dimensions {dims}, expected the "
                             f"grid's axes {sorted(stored.axes)} and 'draw' last")
    return Grid({d: stored.axes[d] for d in dims[:-1]}, draws=stored.draws, seed=stored.seed)


def _check_variable(path: Any, ds: Any, name: str, dims: tuple, shape: tuple,
                    dtype: Any = None) -> None:
    """Refuse a variable that is missing or has other dims, shape or dtype (if given)."""
    if name not in ds.data_vars:
        raise _damaged(path, f"variable {name!r} is missing")
    var = ds[name]
    for what, got, want in (("dimensions", tuple(var.dims), tuple(dims)),
                            ("shape", tuple(var.shape), tuple(shape)),
                            ("dtype", var.dtype, var.dtype if dtype is None else np.dtype(dtype))):
        if got != want:
            raise _damaged(path, f"variable {name!r} has {what} {got}, expected {want}")


def _check_store(path: Any, ds: Any
                 ) -> tuple[int, Grid, dict[str, str], dict[str, Any], dict[str, Output]]:
    """Check everything a store's reader relies on besides the cells: the format marker,
    the JSON attributes, the variables (dimensions, shapes, dtypes) against the study's
    fingerprint, and the grid's coordinates against the grid it records.  Returns the
    format version, the grid, the failures, the parsed fingerprint and the outputs it
    declares; any damage is a :class:`StoreError`
    naming ``path`` and the damaged item."""
    version = _format_version(path, ds.attrs)
    fingerprint = structured(_json_attr(path, ds.attrs, "fingerprint", dict))
    grid = _stored_grid(path, fingerprint, ds)
    outputs = stored_outputs(path, fingerprint)
    failures = stored_failures(path, ds.attrs, grid.n_cells)
    for name, kind in (("config", dict), ("versions", dict), ("status_codes", list)):
        _json_attr(path, ds.attrs, name, kind, required=False)
    for what, value in (("attribute 'fingerprint': 'cell'", fingerprint.get("cell")),
                        ("attribute 'name'", ds.attrs.get("name", ""))):
        if not isinstance(value, str) and not (what.endswith("'cell'") and isinstance(value, dict)):
            raise _damaged(path, f"{what} is not text (it holds a {type(value).__name__})")
    strict = version >= 2  # version 1 wrote with xarray's default encodings (no dtype check)
    _check_variable(path, ds, "cell_status", grid.dims, grid.shape,
                    np.int8 if strict else None)
    if version >= 2 or DIGEST_VAR in ds.data_vars:
        _check_variable(path, ds, DIGEST_VAR, (*grid.dims, "digest_byte"), (*grid.shape, 32),
                        np.uint8)
    for name, spec in outputs.items():
        _check_variable(path, ds, name, (*grid.dims, *spec.dim_names(name)),
                        (*grid.shape, *spec.shape), spec.dtype if strict else None)
    for name in ds.data_vars:
        if name not in outputs and name not in ("cell_status", DIGEST_VAR):
            raise _damaged(path, f"variable {name!r} is not an output of the study (the "
                                 f"fingerprint declares {sorted(outputs)})")
    for dim, values in grid.coords().items():
        if dim not in ds.coords:
            raise _damaged(path, f"coordinate {dim!r} is missing")
        stored = np.asarray(ds[dim].values).tolist()
        if stored != list(np.asarray(values).tolist()):
            raise _damaged(path, f"coordinate {dim!r} holds {stored!r}, not the values of the "
                                 f"grid the study records ({list(values)!r})")
    return version, grid, failures, fingerprint, outputs


def _open_store(path: Path, *, consolidated: bool = True) -> Any:
    """The store ``path`` read by xarray into memory; a damaged Zarr metadata file or any
    failure to read is a :class:`StoreError` naming the store (and the file)."""
    xr = require("xarray", "reading a parameter study's results")
    problem = zarr_metadata_problem(path, consolidated=consolidated) if path.is_dir() else None
    if problem is None:
        try:
            return xr.open_zarr(path, consolidated=False, zarr_format=2, chunks=None).load()
        except Exception as exc:  # noqa: BLE001 -- any failure to read means corrupt/foreign
            problem = f"{type(exc).__name__}: {exc}"
    hint = ("; resuming the study (resume=True) rewrites it" if problem.startswith(".zmetadata")
            else "")
    raise StoreError(f"{path} is not a readable transformer-pde results store ({problem})"
                     f"{hint}; nothing was changed")


def read_fingerprint(path: str | Path) -> tuple[dict[str, Any], dict[str, Output]]:
    """The parsed ``fingerprint`` attribute of the study store ``path`` and the outputs it
    declares, after the checks of the store's metadata (the cells are not verified, and
    the consolidated ``.zmetadata``, which resuming rewrites, is not read).

    Raises
    ------
    StoreError
        ``path`` is not a readable study store, or an item of its metadata is damaged
        (the message names the store and the item)."""
    path = Path(path)
    ds = _open_store(path, consolidated=False)
    return _check_store(path, ds)[3:]


def software_versions() -> dict[str, str]:
    out = {}
    for pkg in ("transformer-pde", "numpy", "scipy", "numba", "dask", "distributed", "xarray",
                "zarr"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return out


#: CF attributes of the store's own variables
_OWN_VARIABLE_ATTRS = {
    "cell_status": {"long_name": "state of the cell", "units": "1",
                    "flag_values": np.array([MISSING, DONE, FAILED], dtype=np.int8),
                    "flag_meanings": "missing done failed"},
    DIGEST_VAR: {"long_name": "SHA-256 digest of the cell's outputs (internal)", "units": "1"},
}


def _template(study: Study) -> Any:
    xr = require("xarray", "a parameter study's results store")

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
        self.ds.attrs.update({**provenance(f"transformer_pde.sweep.run ({study.name})"),
                              "transformer_pde_study": dumps(FORMAT),
                              "fingerprint": study.fingerprint(), "name": study.name,
                              "versions": dumps(software_versions(), sort_keys=True),
                              "failures": "{}", **attrs})
        self.ds.attrs[JSON_ATTRIBUTES] = " ".join(k for k in _JSON_ATTRS if k in self.ds.attrs)
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
                enc[name] = {"chunks": (*study.grid.chunks(item), *var.shape[n_grid:]),
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
        # a store without consolidated metadata (written before it existed) or with a
        # damaged .zmetadata is consolidated when it is resumed
        meta = self.path / ".zmetadata"
        self._consolidated = meta.is_file() and zarr_metadata_problem(self.path) is None
        # the per-array metadata, not .zmetadata (rewritten by _consolidate when damaged)
        return zarr.open_group(str(self.path), mode="r+", zarr_format=2, use_consolidated=False)

    def _consolidate(self) -> None:
        """Rewrite ``.zmetadata`` from the store's metadata (after an attribute changed)."""
        zarr = require("zarr", "a parameter study's results store")
        with warnings.catch_warnings():  # zarr notes that consolidation is not in the v2 spec
            warnings.simplefilter("ignore", UserWarning)
            zarr.consolidate_metadata(str(self.path), zarr_format=2)
        self._consolidated = True

    def _open_existing(self) -> None:
        # the consolidated metadata is derived data: a damaged .zmetadata is rewritten below
        old = _open_store(self.path, consolidated=False)
        version, _, failures, stored, _ = _check_store(self.path, old)
        check_checksum_version(version, carries=DIGEST_VAR in old.data_vars,
                               first=_FIRST_DIGEST_VERSION, what="results-store ",
                               source=self.path, error=StoreIntegrityError)
        if version == 1:
            raise StoreError(f"{self.path} was written by an older transformer-pde (results-"
                             f"store format 1, without per-cell checksums) and cannot be "
                             f"resumed by this version; finish it with the version that "
                             f"started it, or rerun the study into a new path (open_results "
                             f"still reads it); nothing was changed")
        if stored != json.loads(self.study.fingerprint()):
            raise StoreError(
                f"{self.path} was written by a different study (its grid, cell function "
                f"options or outputs changed since); resume only with the same configuration, "
                f"or write to a new path. Stored: {dumps(stored, sort_keys=True)}; now: "
                f"{self.study.fingerprint()}")
        if old["cell_status"].dims != self.study.grid.dims:
            # the fingerprint's JSON sorts the axes: the order is the store's dimensions
            raise StoreError(
                f"{self.path} was written by this study with its grid axes in another order "
                f"(dimensions {tuple(old['cell_status'].dims)}, now {self.study.grid.dims}); "
                f"the cells are numbered in that order: resume with the axes in the stored "
                f"order, or write to a new path; nothing was changed")
        for name in self.ds.data_vars:  # same fingerprint, checked store: same shapes
            self.ds[name].values[...] = old[name].values
        self.failures = failures
        self._group = self._zarr_group()
        # a line of history for this run; a version-2 store is rewritten as version 3
        new = {**provenance(f"transformer_pde.sweep.run ({self.study.name}, resumed)",
                            old.attrs.get("history")),
               "transformer_pde_study": dumps(FORMAT), "fingerprint": self.study.fingerprint(),
               JSON_ATTRIBUTES: self.ds.attrs[JSON_ATTRIBUTES]}
        self.ds.attrs.update(new)
        self._group.attrs.update(new)
        self._consolidate()  # the new attributes; also rewrites an absent or damaged one
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
        Check every done cell against its digest (whenever the store holds digests);
        ``False`` skips only that.  The metadata is checked either way.

    Returns
    -------
    xarray.Dataset
        The outputs, ``cell_status`` and the attributes (not the internal ``cell_digest``).

    Raises
    ------
    StoreError
        ``path`` is missing, unreadable, or not a transformer-pde study store, or an item
        of its metadata is damaged (a JSON attribute, a variable's dimensions, shape or
        dtype, a coordinate, a Zarr metadata file; the message names the store and the
        item).
    StoreIntegrityError
        (a :class:`StoreError` and an :class:`~transformer_pde.errors.IntegrityError`) the
        format version is unknown, (``verify``) a done cell's outputs do not match its
        digest or a status is not a known code (the message names the store and the cell:
        flat index and coordinates), or the store holds digests under a version-1 marker.
        Genuine version-1 stores (no digests) are not verified.
    """
    require("xarray", "reading a parameter study's results")   # the extra first
    path = Path(path)
    if not path.exists():
        raise StoreError(f"{path} does not exist")
    ds = _open_store(path)
    version = _check_store(path, ds)[0]
    if version == 1 and DIGEST_VAR not in ds.data_vars:
        return ds  # a genuine version-1 store: no digests to verify
    if verify:
        outputs = [str(n) for n in ds.data_vars if n not in ("cell_status", DIGEST_VAR)]
        bad = _bad_cells(ds, outputs)
        if bad:
            pos, why = bad[0]
            raise StoreIntegrityError(
                f"{path}: {_describe_cell(ds, pos)}: {why} (a damaged or deleted chunk, or "
                f"an edit); {len(bad)} cell(s) in all. Resume the study (resume=True) to "
                f"recompute them, or open with verify=False to inspect the store")
    # digests under version 1 (which has none): the marker was edited
    check_checksum_version(version, carries=True, first=_FIRST_DIGEST_VERSION,
                           what="results-store ", source=path, error=StoreIntegrityError)
    return ds.drop_vars(DIGEST_VAR)
