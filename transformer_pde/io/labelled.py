"""Trajectories as labelled xarray Datasets, saved to netCDF or Zarr.

:func:`particle_dataset` and :func:`gaussian_dataset` turn results into
:class:`xarray.Dataset` objects with named dimensions (``time``, ``token``, ``dim``,
``dim_``) whose attributes keep the status, the message, the run information and the
attention specification (exact JSON of :func:`~transformer_pde.io.codec.attention_to_json`:
float64 values round-trip exactly through ``repr``; every JSON attribute is strict JSON,
see :mod:`~transformer_pde.io.jsonfmt`).  :func:`save_dataset` writes ``.nc``
(netCDF-4 through h5netcdf) or ``.zarr`` and never overwrites an existing path;
:func:`particle_fields` gives the constructor arguments of a
:class:`~transformer_pde.particles.ParticleTrajectory` from such a Dataset.

**Integrity.**  :func:`save_dataset` writes format version :data:`DATASET_FORMAT_VERSION`
(attribute ``format_version``): the attribute ``checksums`` (JSON) records the SHA-256
digest (:func:`~transformer_pde.io.digests.array_digest`) of every variable and coordinate
and one digest of the other attributes, and :func:`open_dataset` recomputes them: an
edited, truncated or bit-flipped file, or a Zarr store with a chunk deleted, raises
:class:`~transformer_pde.errors.IntegrityError` naming the file and the variable, never
returns different data.  Files without ``format_version`` (version 1, written before
checksums existed) are read without checksum checks (only the invariants of the reader);
an unknown version is refused.  Whether the checksums are checked never depends on the
version field alone: a file that carries the ``checksums`` attribute is verified whatever
``format_version`` says, and one that carries them under ``format_version = 1`` (or none)
is refused, its version field having been edited.  A save writes to a temporary path beside the target and
renames it into place, so a failed save leaves nothing behind.

**Self-describing variables.**  Every variable written by :func:`save_dataset` carries the
CF attributes ``long_name`` and ``units`` (:func:`cf_attributes`; the ones the data
already have are kept).  The variables are dimensionless (``units = "1"``): token
coordinates, weights, moments, and the depth ``time`` (the continuous layer index
:math:`t` of the Transformer, not a physical time, so it has no CF time unit and xarray
does not decode it).  Integer status codes carry ``flag_values`` and ``flag_meanings``
(the names of :class:`~transformer_pde.results.Status`, space separated).  Zarr stores are
written with consolidated metadata, so ``xarray.open_zarr`` opens them directly.

xarray is imported only when these functions are called.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentError, IntegrityError, TrajectoryFileError
from ..extras import require
from ..results import Status
from .codec import attention_from_json, attention_to_json
from .digests import (DIGEST_ALGORITHM, array_digest, check_checksum_version, check_version,
                      json_digest, verify_array)
from .jsonfmt import dumps, tag_arrays, untag_arrays

__all__ = ["particle_dataset",
           "particle_fields", "gaussian_dataset", "save_dataset", "open_dataset",
           "TrajectoryFileError", "IntegrityError", "LABELLED_SUFFIXES",
           "DATASET_FORMAT_VERSION", "VARIABLE_ATTRS", "cf_attributes", "status_flags",
           "zarr_metadata_problem"]

#: file suffixes written and read through xarray (NPZ is handled by the trajectory itself)
LABELLED_SUFFIXES = (".nc", ".zarr")

#: format version written by :func:`save_dataset` (2: checksums); 1 = no ``format_version``
DATASET_FORMAT_VERSION = 2
_KNOWN_VERSIONS = (1, 2)
#: the first format version whose files carry checksums
_FIRST_CHECKSUM_VERSION = 2
#: attributes that describe the file itself, not covered by the attribute digest
_OWN_ATTRS = ("format_version", "checksums")

#: CF ``long_name`` of the variables the package writes (all dimensionless: ``units = "1"``)
VARIABLE_ATTRS: dict[str, str] = {
    "time": "depth t (continuous layer index)",
    "states": "token positions x_i(t)",
    "last": "token positions at the final depth",
    "weights": "token weights of the empirical measure",
    "positions": "token positions in the sequence (causal-mask order)",
    "means": "mean of the token distribution",
    "covs": "covariance matrix of the token distribution",
    "limit": "limit of the normalised covariance Sigma(t) / tr Sigma(t)",
    "values": "saved statistic of the tokens",
    "blowup_time": "blow-up depth T* (inf: no blow-up)",
    "t_final": "last depth reached",
    "status": "outcome of the run",
    "n_times": "number of reported depths",
    "times": "reported depths",
    "rank": "numerical rank",
}


def status_flags() -> dict[str, Any]:
    """CF ``flag_values`` (int8 ``0 … k-1``) and ``flag_meanings`` (the space-separated
    values of :class:`~transformer_pde.results.Status`, in that order) of status codes."""
    names = [s.value for s in Status]
    return {"flag_values": np.arange(len(names), dtype=np.int8),
            "flag_meanings": " ".join(names)}


def cf_attributes(ds: Any, *, long_names: dict[str, str] | None = None,
                  status: tuple[str, ...] = ("status",)) -> Any:
    """``ds`` (a shallow copy) with the CF attributes ``long_name`` and ``units`` on every
    variable and coordinate, keeping the ones it has.

    ``long_name`` comes from ``long_names``, then :data:`VARIABLE_ATTRS`, else the
    variable's name; numeric variables get ``units = "1"`` (every quantity of the model is
    dimensionless; the depth ``time`` too).  The integer variables named in ``status``
    (codes: the index in :class:`~transformer_pde.results.Status`) get the
    :func:`status_flags` unless they have ``flag_values``."""
    ds = ds.copy(deep=False)
    names = {**VARIABLE_ATTRS, **(long_names or {})}
    for name, var in ds.variables.items():
        attrs = dict(var.attrs)
        attrs.setdefault("long_name", names.get(str(name), str(name)))
        if var.dtype.kind in "biufc":
            attrs.setdefault("units", "1")
        if str(name) in status and var.dtype.kind in "iu" and "flag_values" not in attrs:
            attrs.update(status_flags())
        var.attrs = attrs
    return ds


def _safe_text(text: str) -> str:
    """``text`` storable as a netCDF attribute (HDF5 strings end at a NUL and must be
    UTF-8): NUL as ``\\x00``, lone surrogates backslash-escaped.  The exact text is kept
    in a ``*_json`` attribute beside it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _plain(value: Any) -> Any:
    """Attribute value as plain Python (what both backends read back the same)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _this_thread() -> Any:
    """A context in which xarray writes in-memory data in this thread: xarray's writers go
    through Dask when it is installed (then even a default Dask Client is bypassed); Dask
    is not part of the ``io`` extra, so without it there is nothing to set."""
    try:
        import dask  # noqa: PLC0415 (optional, and not in the io extra)
    except ImportError:
        return contextlib.nullcontext()
    return dask.config.set(scheduler="synchronous")


def particle_dataset(traj: Any) -> Any:
    """:class:`xarray.Dataset` of a particle trajectory: ``states (time, token, dim)`` (or,
    for a run that saved a statistic, ``last (token, dim)``, ``means (time, dim)``,
    ``covs (time, dim, dim_)`` — ``(time, segment, ...)`` for packed sequences — and
    ``values (time, ...)``), ``weights (token)`` and
    ``positions (token)`` when masked; attributes ``status``, ``message``, ``info`` (JSON)
    and ``attention`` (exact JSON)."""
    xr = require("xarray", "ParticleTrajectory.to_xarray")

    data: dict[str, Any] = {"weights": (("token",), np.asarray(traj.weights))}
    if traj.states is not None:
        data["states"] = (("time", "token", "dim"), np.asarray(traj.states))
    else:
        data["last"] = (("token", "dim"), np.asarray(traj.last))
        means, covs = (np.asarray(a) for a in traj.moments())
        seg = ("segment",) if means.ndim == 3 else ()     # packed sequences: per segment
        data["means"] = (("time", *seg, "dim"), means)
        data["covs"] = (("time", *seg, "dim", "dim_"), covs)
        if traj.values is not None:
            values = np.asarray(traj.values)
            data["values"] = (("time", *(f"values_{i}" for i in range(values.ndim - 1))),
                              values)
    if traj.positions is not None:
        data["positions"] = (("token",), np.asarray(traj.positions))
    attrs = {"transformer_pde": "particle-trajectory", "status": str(traj.status),
             **_message_attrs(str(traj.message)),
             "info": dumps(tag_arrays(dict(traj.info)), describe=True, strict=True),
             "attention": attention_to_json(traj.attention)}
    return cf_attributes(xr.Dataset(data, coords={"time": np.asarray(traj.times)},
                                    attrs=attrs))


def _message_attrs(message: str) -> dict[str, str]:
    """``message`` as a plain attribute, and its exact text as the JSON attribute
    ``message_json`` only when the plain one cannot hold it (a NUL, a lone surrogate)."""
    safe = _safe_text(message)
    return {"message": safe} if safe == message else {"message": safe,
                                                      "message_json": dumps(message)}


def particle_fields(ds: Any, source: str = "dataset") -> dict:
    """The constructor arguments of a
    :class:`~transformer_pde.particles.ParticleTrajectory` from a Dataset made by
    :func:`particle_dataset` (inverse of it); errors name ``source``."""
    if ds.attrs.get("transformer_pde") != "particle-trajectory":
        raise TrajectoryFileError(f"{source} is not a transformer-pde particle trajectory "
                                  f"(attribute 'transformer_pde' missing)")

    def arr(name: str) -> Any:
        return np.asarray(ds[name].values) if name in ds else None

    try:
        message = (json.loads(ds.attrs["message_json"]) if "message_json" in ds.attrs
                   else ds.attrs["message"])
        if not isinstance(message, str):
            raise TypeError("attribute 'message_json' is not a JSON string")
        out = {"times": np.asarray(ds["time"].values), "states": arr("states"),
               "weights": np.asarray(ds["weights"].values), "positions": arr("positions"),
               "status": ds.attrs["status"], "message": message,
               "attention": attention_from_json(ds.attrs.get("attention", "null")),
               "info": untag_arrays(json.loads(ds.attrs.get("info", "{}"))),
               "values": arr("values"), "last": arr("last"),
               "saved_means": arr("means"), "saved_covs": arr("covs")}
    except (KeyError, ValueError, TypeError) as exc:
        raise TrajectoryFileError(f"{source}: incomplete or inconsistent trajectory "
                                  f"({type(exc).__name__}: {exc})") from None
    T, n = out["times"].shape[0], out["weights"].shape[0]
    states = out["states"]
    if states is None and (out["last"] is None or out["saved_means"] is None):
        raise TrajectoryFileError(f"{source}: neither 'states' nor 'last'/'means' are stored")
    if states is not None and (states.ndim != 3 or states.shape[:2] != (T, n)):
        raise TrajectoryFileError(f"{source}: inconsistent shapes: states {states.shape}, "
                                  f"{T} times, {n} weights")
    return out


def gaussian_dataset(traj: Any) -> Any:
    """:class:`xarray.Dataset` of a Gaussian trajectory: ``means (time, dim)``,
    ``covs (time, dim, dim_)``, ``limit (dim, dim_)``; attributes ``status``,
    ``blowup_time``, ``t_final``, ``message``."""
    xr = require("xarray", "GaussianTrajectory.to_xarray")

    data = {"means": (("time", "dim"), np.asarray(traj.means)),
            "covs": (("time", "dim", "dim_"), np.asarray(traj.covs)),
            "limit": (("dim", "dim_"), np.asarray(traj.limit))}
    attrs = {"transformer_pde": "gaussian-trajectory", "status": str(traj.status),
             "blowup_time": float(traj.blowup_time), "t_final": float(traj.t_final),
             **_message_attrs(str(traj.message))}
    return cf_attributes(xr.Dataset(data, coords={"time": np.asarray(traj.times)},
                                    attrs=attrs))


def _checksums(ds: Any) -> str:
    """The ``checksums`` attribute of ``ds``: digests of every variable (coordinates
    included) and of the attributes other than :data:`_OWN_ATTRS`."""
    keys = sorted(str(k) for k in ds.attrs if k not in _OWN_ATTRS)
    return dumps({"algorithm": DIGEST_ALGORITHM,
                  "arrays": {str(name): array_digest(np.asarray(var.values))
                             for name, var in ds.variables.items()},
                  "attrs": {"keys": keys,
                            "digest": json_digest({k: _plain(ds.attrs[k]) for k in keys})}},
                 sort_keys=True, strict=True)


def save_dataset(ds: Any, path: str | Path) -> Path:
    """Write ``ds`` to ``path``: ``.nc`` (netCDF-4, h5netcdf) or ``.zarr`` (Zarr v2 with
    consolidated metadata).

    An existing path is never overwritten.  Every variable is written with the CF
    attributes ``long_name`` and ``units`` (:func:`cf_attributes`).  The file is format version
    :data:`DATASET_FORMAT_VERSION`: ``ds``'s values are written exactly as they are (no
    fill-value masking, no encodings) with the ``checksums`` attribute that
    :func:`open_dataset` verifies.  The data are written to a temporary path beside
    ``path`` (a hidden ``.<name>.<random>.partial`` file or folder) that is renamed to
    ``path`` once complete; on any failure it is removed, so nothing is left at or beside
    ``path``.  ``ds`` itself is not modified.
    """
    path = Path(path)
    if path.suffix not in LABELLED_SUFFIXES:
        raise ArgumentError(f"path must end in one of {LABELLED_SUFFIXES}, got {path.name!r}")
    if path.exists():
        raise ArgumentError(f"{path} already exists; refusing to overwrite it")
    ds = cf_attributes(ds)
    for var in ds.variables.values():
        var.encoding = {}
    ds.attrs = {k: v for k, v in ds.attrs.items() if k not in _OWN_ATTRS}
    ds.attrs["checksums"] = _checksums(ds)
    ds.attrs["format_version"] = DATASET_FORMAT_VERSION
    # raw values: no _FillValue, so NaN payloads and every other bit pattern round-trip
    encoding = {str(name): {"_FillValue": None} for name in ds.variables}
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.partial")
    try:
        with _this_thread():
            if path.suffix == ".nc":
                ds.to_netcdf(tmp, engine="h5netcdf", encoding=encoding)
            else:
                ds.to_zarr(tmp, mode="w-", zarr_format=2, consolidated=True,
                           encoding=encoding)
        if path.exists():
            raise ArgumentError(f"{path} appeared while it was being written; refusing to "
                                f"overwrite it")
        os.rename(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
    return path


def _verify(ds: Any, path: Path) -> None:
    """Check the format version and the checksums written by :func:`save_dataset`."""
    version = _plain(ds.attrs.get("format_version"))
    raw = ds.attrs.get("checksums")
    if raw is None and version is None:
        return  # version 1: written before checksums existed
    if version is not None:
        check_version(version, _KNOWN_VERSIONS, what="",
                      source=f"{path} (attribute 'format_version')")
    if raw is None and version == 1:
        return  # version 1 (stated): no checksums
    # the file carries checksums (or claims a version that has them): verified whatever
    # its version says; a version field set back to 1 or removed is refused below
    try:
        sums = json.loads(raw)
        arrays, attrs = sums["arrays"], sums["attrs"]
        keys, attrs_digest = list(attrs["keys"]), attrs["digest"]
        algorithm = sums["algorithm"]
        if not isinstance(arrays, dict):
            raise TypeError("'arrays' is not a mapping")
    except (TypeError, KeyError, ValueError) as exc:
        raise IntegrityError(f"{path}: the 'checksums' attribute is missing or unreadable "
                             f"({type(exc).__name__}: {exc}); the file was edited or is "
                             f"corrupt") from None
    if algorithm != DIGEST_ALGORITHM:
        raise IntegrityError(f"{path}: unknown checksum algorithm {algorithm!r}")
    names = {str(n) for n in ds.variables}
    for name in sorted(set(arrays) - names):
        raise IntegrityError(f"{path}: array {name!r} is missing (the file was edited or is "
                             f"corrupt)")
    for name in sorted(names - set(arrays)):
        raise IntegrityError(f"{path}: array {name!r} has no checksum (the file was edited)")
    for name in sorted(names):
        verify_array(np.asarray(ds[name].values), arrays[name], what=name, source=path)
    missing = [k for k in keys if k not in ds.attrs]
    if missing:
        raise IntegrityError(f"{path}: attribute {missing[0]!r} is missing (the file was "
                             f"edited or is corrupt)")
    if json_digest({k: _plain(ds.attrs[k]) for k in keys}) != attrs_digest:
        raise IntegrityError(f"{path}: the attributes ({', '.join(keys)}) do not match their "
                             f"checksum (the file was edited or is corrupt)")
    check_checksum_version(version, carries=True, first=_FIRST_CHECKSUM_VERSION, what="",
                           source=f"{path} (attribute 'format_version')")


def zarr_metadata_problem(path: Path, *, consolidated: bool = True) -> str | None:
    """The first Zarr (format 2) metadata file of the store ``path`` that is not a JSON
    object, or an array's ``.zattrs`` without the ``_ARRAY_DIMENSIONS`` that xarray needs,
    described by its path inside the store (``"mean/.zarray is not valid JSON (...)"``);
    ``None`` when all are readable.  ``consolidated``: check ``.zmetadata`` too.  Lets a
    reader name the damaged file where xarray or zarr would raise a bare
    ``JSONDecodeError`` or ``KeyError``."""
    def read(rel: str) -> tuple[Any, str | None]:
        try:
            value = json.loads((path / rel).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return None, f"{rel} is not valid JSON ({type(exc).__name__}: {exc})"
        if not isinstance(value, dict):
            return None, f"{rel} is not a JSON object"
        return value, None

    names = [".zgroup", ".zattrs"] + ([".zmetadata"] if consolidated else [])
    for rel in names:
        if rel == ".zgroup" or (path / rel).is_file():
            _, problem = read(rel)
            if problem:
                return problem
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and (p / ".zarray").is_file()):
        for rel in (f"{sub.name}/.zarray", f"{sub.name}/.zattrs"):
            value, problem = read(rel)
            if problem:
                return problem
        if not isinstance(value.get("_ARRAY_DIMENSIONS"), list):
            return f"{sub.name}/.zattrs has no list '_ARRAY_DIMENSIONS' (the array's dimensions)"
    return None


def open_dataset(path: str | Path) -> Any:
    """Read a Dataset written by :func:`save_dataset` (loaded into memory) and verify it.

    Raises
    ------
    TrajectoryFileError
        ``path`` does not exist or cannot be read as netCDF / Zarr.
    IntegrityError
        (a :class:`TrajectoryFileError`) unknown ``format_version``, or a variable or the
        attributes do not match the recorded checksums, or the file carries checksums
        under ``format_version = 1`` or none (the version field was edited); the message
        names the file and the variable.  The checksums are verified whenever the file
        carries them, whatever its ``format_version`` says; only genuine version-1 files
        (no ``checksums`` attribute, ``format_version`` absent or 1) are returned
        unverified.
    """
    xr = require("xarray", "open_dataset")

    path = Path(path)
    if not path.exists():
        raise TrajectoryFileError(f"{path} does not exist")
    try:
        if path.suffix == ".nc":
            with xr.open_dataset(path, engine="h5netcdf") as ds:
                ds = ds.load()
        else:
            ds = xr.open_zarr(path, consolidated=False, zarr_format=2, chunks=None).load()
    except Exception as exc:  # noqa: BLE001 -- every reader failure means a bad file
        problem = zarr_metadata_problem(path, consolidated=False) if path.is_dir() else None
        raise TrajectoryFileError(f"{path} is not a readable {path.suffix} trajectory "
                                  f"({problem or f'{type(exc).__name__}: {exc}'})") from None
    _verify(ds, path)
    return ds
