"""Trajectories as labelled xarray Datasets, saved to netCDF or Zarr.

:func:`particle_dataset` and :func:`gaussian_dataset` turn results into
:class:`xarray.Dataset` objects with named dimensions (``time``, ``token``, ``component``
of a vector, ``row`` and ``col`` of a matrix, ``segment`` of packed sequences) whose
attributes keep the status, the message, the run information (one attribute per key,
``info_<key>``: :func:`info_attributes`) and the attention specification (exact JSON of
:func:`~transformer_pde.io.codec.attention_to_json`: float64 values round-trip exactly
through ``repr``).  An attribute holds at most one level of JSON, strict JSON (see
:mod:`~transformer_pde.io.jsonfmt`), and the attribute ``json_attributes`` names the ones
that do; the others are plain text or numbers.

**Self-describing files.**  Every file carries the CF global attributes of
:func:`provenance`: ``Conventions = "CF-1.10"``, ``source`` (the package and its
version), ``references`` (the paper and the documentation) and ``history`` (one line per
write: UTC time, package version and what wrote it).  Files of format version 2 and
earlier (the run information as one JSON attribute ``info``, dimensions ``dim`` and
``dim_``, no CF global attributes) load with the same arrays and metadata.
:func:`save_dataset` writes ``.nc`` (netCDF-4 through h5netcdf) or ``.zarr`` and never
overwrites an existing path;
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
is refused, its version field having been edited.  A save writes to a temporary path
beside the target and renames it into place, so a failed save leaves nothing behind.

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
import math
import os
import re
import shutil
import sys
import uuid
from datetime import datetime, timezone
from importlib import metadata
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
           "zarr_metadata_problem", "CF_CONVENTIONS", "REFERENCES", "JSON_ATTRIBUTES",
           "INFO_PREFIX", "COMPONENT", "ROW", "COL", "package_version", "provenance",
           "info_attributes", "info_from_attributes"]

#: file suffixes written and read through xarray (NPZ is handled by the trajectory itself)
LABELLED_SUFFIXES = (".nc", ".zarr")

#: format version written by :func:`save_dataset` (3: the run information flattened to
#: ``info_<key>`` attributes, CF global attributes; 2: checksums; 1 = no ``format_version``).
#: Version 3 makes a reader of version 2, which would see no ``info``, refuse the file.
DATASET_FORMAT_VERSION = 3
_KNOWN_VERSIONS = (1, 2, 3)
#: the first format version whose files carry checksums
_FIRST_CHECKSUM_VERSION = 2
#: attributes that describe the file itself, not covered by the attribute digest
_OWN_ATTRS = ("format_version", "checksums")

#: CF ``long_name`` of the variables and coordinates the package writes (all dimensionless:
#: ``units = "1"``), the built-in study outputs and grid axes included
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
    "t_stop": "depth at which the run stopped",
    "status": "outcome of the run",
    "n_times": "number of reported depths",
    "times": "reported depths",
    "rank": "numerical rank",
    "redraws": "number of initial covariances drawn again",
    "n_clusters": "number of clusters of the final tokens",
    "largest": "mass of the largest cluster",
    "w2_0": "Wasserstein-2 distance of the two token measures at depth 0",
    "w2_t": "Wasserstein-2 distance of the two token measures at the final depth",
    "ratio": "growth of the Wasserstein-2 distance, w2_t / w2_0",
    "bound": "a-priori bound on the growth of the Wasserstein-2 distance",
    # the synchronisation cell (tokens on the circle)
    "verdict": "0 synchronised (certified: tokens in an open half-circle), 1 stopped at an "
               "equilibrium, 2 undecided",
    "t_decided": "depth of the check that gave the verdict (NaN when undecided)",
    "order": "order parameter |sum_j w_j e^{i theta_j}| at the last check",
    "gap": "largest angular gap between consecutive tokens at the last check",
    "speed": "largest token speed over the last check interval",
    "clusters": "number of clusters at the last check",
    "max_eig": "largest eigenvalue of the linearisation at the final state (rotation removed)",
    "run": "index of the run",
    "draw": "random draw of the grid point",
    "trial": "index of the random trial",
    "kind": "attention kind",
    "d": "dimension of the tokens",
    "n": "number of tokens",
    "value": "value matrix of the attention",
    "beta": "inverse temperature beta",
    "covs0": "initial covariance matrix",
    # the mean-field solutions (CircleSolution, LineSolution)
    "theta": "angle on the circle",
    "mode": "index k of the Fourier mode",
    "density": "density of the token distribution",
    "spectrum": "modulus of the Fourier coefficient |mu_k(t)|",
    "modes": "number of Fourier modes in use",
    "mass": "total mass of the density (1 up to round-off)",
    "min_density": "minimum of the density over the grid",
    "tail": "relative L2 share of the top third of the spectrum",
    "node": "index of the Lagrangian node",
    "x": "position X_j(t) of the Lagrangian node",
    "cdf": "initial distribution function at the node's label, F_0(xi_j)",
    "label": "initial position xi_j of the node",
}

#: names of the dimensions: a vector's components, a matrix's rows and columns (the same
#: in particle, Gaussian and study files; older files call them ``dim``, ``dim``
#: and ``dim_``, and still load)
COMPONENT, ROW, COL = "component", "row", "col"


#: the CF conventions whose attributes the labelled files carry (``Conventions``)
CF_CONVENTIONS = "CF-1.10"
#: the ``references`` global attribute: the paper the package implements, and its documentation
REFERENCES = ("V. Castin, P. Ablin, J. A. Carrillo, G. Peyre, A Unified Perspective on the "
              "Dynamics of Deep Transformers, 2025, arXiv:2501.18322; "
              "https://transformer-pde.readthedocs.io")
#: global attribute naming (space separated) the attributes whose text is JSON
JSON_ATTRIBUTES = "json_attributes"
#: prefix of the flattened run information: ``info_<key>`` holds ``traj.info[key]``
INFO_PREFIX = "info_"
_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def package_version() -> str:
    """The installed transformer-pde's version (the package's ``__version__`` when it is
    run from a source tree that is not installed)."""
    try:
        return metadata.version("transformer-pde")
    except metadata.PackageNotFoundError:  # the package itself is imported already
        return str(getattr(sys.modules[__name__.split(".")[0]], "__version__", "unknown"))


def provenance(made_by: str, history: Any = None, *, now: datetime | None = None
               ) -> dict[str, str]:
    """The CF global attributes of a file the package writes: ``Conventions``
    (:data:`CF_CONVENTIONS`), ``source`` (``"transformer-pde <version>"``), ``references``
    (:data:`REFERENCES`) and ``history``: ``history`` (the text of the data's earlier
    history, if any) with one line appended, ``"<UTC time, ISO 8601> transformer-pde
    <version> <made_by>"`` (``made_by``: the function or command that wrote the file, e.g.
    ``"ParticleTrajectory.save"`` or ``"transformer-pde simulate"``).

    Every writer of the package takes these from here: labelled files
    (:func:`save_dataset`), the metadata of trajectory and Gaussian NPZ files, study stores.
    """
    version = package_version()
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = f"{stamp} transformer-pde {version} {made_by}"
    before = str(history).rstrip("\n") if history else ""
    return {"Conventions": CF_CONVENTIONS, "source": f"transformer-pde {version}",
            "references": REFERENCES, "history": f"{before}\n{line}" if before else line}


def _native(value: Any) -> bool:
    """Whether ``value`` is stored as a plain netCDF/Zarr attribute that reads back equal:
    a non-empty text without NUL or lone surrogates, an int64 (not a bool), a finite float."""
    if isinstance(value, str):
        return value != "" and _safe_text(value) == value
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return _INT64[0] <= value <= _INT64[1]
    return isinstance(value, float) and math.isfinite(value)


def info_attributes(info: dict) -> dict[str, Any]:
    """The run information ``info`` as flat attributes: ``info_<key>`` for each key that is
    an identifier, holding the value itself when it is a text, an int64 or a finite float,
    else its strict JSON (arrays and non-finite numbers exactly: :func:`tag_arrays`); keys
    that are not identifiers go together into the JSON attribute ``info``.  The attribute
    :data:`JSON_ATTRIBUTES` names the ones holding JSON (inverse: :func:`info_from_attributes`)."""
    out: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    json_names = []
    for key, value in info.items():
        value = value.item() if isinstance(value, np.generic) else value
        if not (isinstance(key, str) and _KEY_RE.match(key)):
            rest[key] = value
        elif _native(value):
            out[INFO_PREFIX + key] = value
        else:
            out[INFO_PREFIX + key] = dumps(tag_arrays(value), describe=True, strict=True)
            json_names.append(INFO_PREFIX + key)
    if rest:
        out["info"] = dumps(tag_arrays(rest), describe=True, strict=True)
        json_names.append("info")
    out[JSON_ATTRIBUTES] = " ".join(json_names)
    return out


def info_from_attributes(attrs: Any) -> dict:
    """The run information of a particle file's attributes: :func:`info_attributes`
    inverted, or the JSON attribute ``info`` of older files (without
    :data:`JSON_ATTRIBUTES`)."""
    if JSON_ATTRIBUTES not in attrs:
        return untag_arrays(json.loads(attrs.get("info", "{}")))
    json_names = set(str(attrs[JSON_ATTRIBUTES]).split())
    info = untag_arrays(json.loads(attrs["info"])) if "info" in json_names else {}
    for name, value in attrs.items():
        if name.startswith(INFO_PREFIX):
            info[name[len(INFO_PREFIX):]] = (untag_arrays(json.loads(value))
                                             if name in json_names else _plain(value))
    return info


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

    ``long_name`` comes from ``long_names``, then :data:`VARIABLE_ATTRS`, else says what
    the name is (``"coordinate 'u'"``, ``"quantity 'score'"``); numeric variables get
    ``units = "1"`` (every quantity of the model is dimensionless; the depth ``time`` too).
    The integer variables named in ``status`` (codes: the index in
    :class:`~transformer_pde.results.Status`) get the :func:`status_flags` unless they
    have ``flag_values``."""
    ds = ds.copy(deep=False)
    names = {**VARIABLE_ATTRS, **(long_names or {})}
    for name, var in ds.variables.items():
        attrs = dict(var.attrs)
        what = "coordinate" if name in ds.dims else "quantity"
        attrs.setdefault("long_name", names.get(str(name), f"{what} {str(name)!r}"))
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
    """:class:`xarray.Dataset` of a particle trajectory: ``states (time, token, component)``
    (or, for a run that saved a statistic, ``last (token, component)``,
    ``means (time, component)``, ``covs (time, row, col)`` — ``(time, segment, ...)`` for
    packed sequences — and ``values (time, ...)``), ``weights (token)`` and
    ``positions (token)`` when masked; attributes ``status``, ``message``, the run
    information flattened (``info_<key>``: :func:`info_attributes`) and ``attention``
    (exact JSON)."""
    xr = require("xarray", "ParticleTrajectory.to_xarray")

    data: dict[str, Any] = {"weights": (("token",), np.asarray(traj.weights))}
    if traj.states is not None:
        data["states"] = (("time", "token", COMPONENT), np.asarray(traj.states))
    else:
        data["last"] = (("token", COMPONENT), np.asarray(traj.last))
        means, covs = (np.asarray(a) for a in traj.moments())
        seg = ("segment",) if means.ndim == 3 else ()     # packed sequences: per segment
        data["means"] = (("time", *seg, COMPONENT), means)
        data["covs"] = (("time", *seg, ROW, COL), covs)
        if traj.values is not None:
            values = np.asarray(traj.values)
            data["values"] = (("time", *(f"values_{i}" for i in range(values.ndim - 1))),
                              values)
    if traj.positions is not None:
        data["positions"] = (("token",), np.asarray(traj.positions))
    message = _message_attrs(str(traj.message))
    info = info_attributes(dict(traj.info))
    info[JSON_ATTRIBUTES] = " ".join(["attention", *(["message_json"] if "message_json"
                                                     in message else []),
                                      *info[JSON_ATTRIBUTES].split()])
    attrs = {"transformer_pde": "particle-trajectory", "status": str(traj.status),
             **message, "attention": attention_to_json(traj.attention), **info}
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
               "info": info_from_attributes(ds.attrs),
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
    """:class:`xarray.Dataset` of a Gaussian trajectory: ``means (time, component)``,
    ``covs (time, row, col)``, ``limit (row, col)``; attributes ``status``,
    ``blowup_time``, ``t_final``, ``message``."""
    xr = require("xarray", "GaussianTrajectory.to_xarray")

    data = {"means": (("time", COMPONENT), np.asarray(traj.means)),
            "covs": (("time", ROW, COL), np.asarray(traj.covs)),
            "limit": ((ROW, COL), np.asarray(traj.limit))}
    attrs = {"transformer_pde": "gaussian-trajectory", "status": str(traj.status),
             "blowup_time": float(traj.blowup_time), "t_final": float(traj.t_final),
             **_message_attrs(str(traj.message))}
    attrs[JSON_ATTRIBUTES] = "message_json" if "message_json" in attrs else ""
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


def save_dataset(ds: Any, path: str | Path, *, made_by: str | None = None) -> Path:
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

    The file carries the CF global attributes of :func:`provenance` (``Conventions``,
    ``source`` with the package version, ``references``, and ``history``: ``ds``'s own
    history with a line naming ``made_by``; by default ``"transformer-pde <command>"`` for
    a Dataset with a ``command`` attribute, else ``"transformer_pde.io.save_dataset"``).
    """
    path = Path(path)
    if path.suffix not in LABELLED_SUFFIXES:
        raise ArgumentError(f"path must end in one of {LABELLED_SUFFIXES}, got {path.name!r}")
    if path.exists():
        raise ArgumentError(f"{path} already exists; refusing to overwrite it")
    ds = cf_attributes(ds)
    for var in ds.variables.values():
        var.encoding = {}
    attrs = {k: v for k, v in ds.attrs.items() if k not in _OWN_ATTRS}
    if made_by is None:
        made_by = (f"transformer-pde {attrs['command']}" if "command" in attrs
                   else "transformer_pde.io.save_dataset")
    prov = provenance(made_by, attrs.get("history"))
    attrs = {**prov, **{k: v for k, v in attrs.items() if k not in prov}}   # CF's first
    json_names = str(attrs.get(JSON_ATTRIBUTES, "")).split()
    attrs[JSON_ATTRIBUTES] = " ".join(dict.fromkeys([*json_names, "checksums"]))
    ds.attrs = attrs
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
