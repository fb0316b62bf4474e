r"""Saving results: the overwrite rule, labelled files that replace a previous one, and
the NPZ files of Gaussian solves and batches.

**Overwriting.**  Every ``save(path, *, overwrite=False)`` of the package refuses an
existing ``path`` unless ``overwrite=True`` (:func:`check_target`: an
:class:`~transformer_pde.errors.ArgumentError` naming the path and the option), so a
notebook cell never destroys a previous result by accident and a re-run cell says how
to replace it.  With ``overwrite=True`` the new file is written completely beside the
old one and then moved over it (:func:`save_labelled` for netCDF / Zarr; NPZ files
through :func:`~transformer_pde.io.container.write_npz`): a failed save leaves the
previous file as it was.  A directory is replaced only when it is a Zarr store.

**Gaussian files.**  :func:`save_gaussian` writes a
:class:`~transformer_pde.gaussian.GaussianTrajectory` or
:class:`~transformer_pde.gaussian.GaussianBatch` to an NPZ archive of the checksummed
container (:func:`~transformer_pde.io.container.save_npz`: the SHA-256 digest of every
array is stored and checked when read).  The entry ``meta`` is JSON text
``{"format": "transformer-pde-gaussian" | "transformer-pde-gaussian-batch",
"version": 1, ...}`` with the status and message(s) and the provenance of
:func:`~transformer_pde.io.labelled.provenance` (``source``, ``history``, ...); every number is stored in an array
(so ``nan`` blow-up times round-trip exactly).  :func:`read_gaussian` verifies the
checksums, then the invariants of :func:`check_gaussian` (shapes, dtypes, finite and
strictly increasing times, finite states unless the status says otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, IntegrityError, TrajectoryFileError
from ..results import Status
from . import labelled
from .container import load_npz, save_npz
from .digests import check_version
from .jsonfmt import dumps

__all__ = ["GAUSSIAN_BATCH_FORMAT", "GAUSSIAN_FORMAT", "GAUSSIAN_FORMAT_VERSION",
           "LabelledSave", "check_gaussian", "check_target", "read_gaussian",
           "save_gaussian", "save_labelled"]

#: ``meta["format"]`` of a saved :class:`~transformer_pde.gaussian.GaussianTrajectory`
GAUSSIAN_FORMAT = "transformer-pde-gaussian"
#: ``meta["format"]`` of a saved :class:`~transformer_pde.gaussian.GaussianBatch`
GAUSSIAN_BATCH_FORMAT = "transformer-pde-gaussian-batch"
#: version of both Gaussian formats written by :func:`save_gaussian`
GAUSSIAN_FORMAT_VERSION = 1

_ZARR_MARKERS = (".zgroup", ".zattrs", "zarr.json")
#: arrays of each format: (name, required)
_TRAJ_ARRAYS = {"times": True, "means": True, "covs": True, "blowup_time": True,
                "limit": True, "t_final": True, "nfev": True, "final_mean": False,
                "final_cov": False}
_BATCH_ARRAYS = {"status": True, "blowup_time": True, "t_final": True, "means": True,
                 "covs": True, "limit": True, "n_steps": True, "t_eval": False,
                 "traj_means": False, "traj_covs": False}


# ------------------------------------------------------------------ overwrite rule
def check_target(path: str | os.PathLike, overwrite: Any) -> Path:
    """``path`` as a :class:`~pathlib.Path`, checked for a save.

    Raises
    ------
    ArgumentTypeError
        ``overwrite`` is not a bool.
    ArgumentError
        ``path`` exists and ``overwrite`` is False (the message names the path and says
        ``overwrite=True``); or ``path`` is a directory that is not a Zarr store (never
        replaced, even with ``overwrite=True``).
    """
    if not isinstance(overwrite, (bool, np.bool_)):
        raise ArgumentTypeError(f"overwrite must be a bool, got {type(overwrite).__name__}")
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return path
    if not overwrite:
        raise ArgumentError(f"{path} already exists; pass overwrite=True to replace it")
    if path.is_dir() and not (path.suffix == ".zarr"
                              and any((path / m).exists() for m in _ZARR_MARKERS)):
        raise ArgumentError(f"{path} is a directory that is not a Zarr store; it is never "
                            f"replaced (remove it or choose another path)")
    return path


def save_labelled(ds: Any, path: str | os.PathLike, *, overwrite: bool = False,
                  made_by: str | None = None) -> Path:
    """:func:`~transformer_pde.io.labelled.save_dataset` of ``ds`` to ``path`` (``.nc`` or
    ``.zarr``), replacing an existing file or store when ``overwrite`` is True.

    The new file is written completely under a hidden name beside ``path`` first; a
    netCDF file is then renamed over the old one (atomic), a Zarr store swapped with it
    (the old store is moved aside, the new one renamed into place, the old one deleted;
    if the second rename fails the old store is put back).  ``made_by`` names the writer
    in the file's ``history`` (:func:`~transformer_pde.io.labelled.provenance`).  Errors as
    :func:`check_target`.
    """
    path = check_target(path, overwrite)
    if not (path.exists() or path.is_symlink()):
        return labelled.save_dataset(ds, path, made_by=made_by)
    tag = uuid.uuid4().hex[:12]
    new = path.with_name(f".{path.stem}.{tag}.new{path.suffix}")
    labelled.save_dataset(ds, new, made_by=made_by)
    if not new.is_dir():
        os.replace(new, path)
        return path
    old = path.with_name(f".{path.name}.{tag}.old")
    try:
        os.rename(path, old)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    try:
        os.rename(new, path)
    except BaseException:
        os.rename(old, path)
        shutil.rmtree(new, ignore_errors=True)
        raise
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)
    return path


class LabelledSave:
    """Mixin of the results saved as labelled files (the mean-field solutions): ``save``
    from their ``to_xarray()``."""

    __slots__ = ()

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write :meth:`to_xarray` to ``path`` (``.nc`` or ``.zarr``), with a checksum per
        variable that :func:`transformer_pde.io.labelled.open_dataset` verifies; an existing
        ``path`` is an error unless ``overwrite=True`` (then replaced once the new file is
        complete: :func:`save_labelled`).  The file's ``history`` names
        ``<class>.save`` and the package version.  Needs the ``io`` extra."""
        return save_labelled(self.to_xarray(), path, overwrite=overwrite,  # type: ignore[attr-defined]
                             made_by=f"{type(self).__name__}.save")


# ------------------------------------------------------------------ Gaussian files
def _fields_of(result: Any) -> tuple[str, dict[str, Any]]:
    """``(format, fields)`` of a Gaussian trajectory or batch (by its ``result_kind``)."""
    kind = str(getattr(type(result), "result_kind", ""))
    if kind == "gaussian":
        names, fmt = _TRAJ_ARRAYS, GAUSSIAN_FORMAT
        extra = {"status": str(result.status), "message": str(result.message)}
    elif kind == "gaussian_batch":
        names, fmt = _BATCH_ARRAYS, GAUSSIAN_BATCH_FORMAT
        extra = {"messages": [str(m) for m in result.messages]}
    else:
        raise ArgumentTypeError(f"result must be a GaussianTrajectory or GaussianBatch, got "
                                f"{type(result).__name__}")
    fields = {k: getattr(result, k) for k in names}
    fields.update(extra)
    return fmt, fields


def save_gaussian(result: Any, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Write a Gaussian trajectory or batch to the NPZ file ``path`` (see the module
    docstring); :func:`read_gaussian` restores its fields exactly.

    Raises
    ------
    ArgumentError
        ``path`` ends in ``.nc`` / ``.zarr`` (Gaussian results are saved as NPZ; use
        ``to_xarray()`` for labelled files), ``path`` exists and ``overwrite`` is False,
        or ``result`` breaks an invariant of :func:`check_gaussian` (nothing is written).
    ArgumentTypeError
        ``result`` is not a Gaussian result, or ``overwrite`` is not a bool.
    """
    if Path(path).suffix in labelled.LABELLED_SUFFIXES:
        raise ArgumentError(f"path {str(path)!r}: Gaussian results are saved as NPZ (use a "
                            f"name ending in .npz); for netCDF or Zarr save "
                            f"result.to_xarray() with transformer_pde.io.labelled.save_dataset")
    fmt, fields = _fields_of(result)
    path = check_target(path, overwrite)
    try:
        check_gaussian(path, fmt, fields)
    except TrajectoryFileError as exc:
        raise ArgumentError(f"cannot save this result (loading would refuse it): "
                            f"{exc}") from None
    names = _TRAJ_ARRAYS if fmt == GAUSSIAN_FORMAT else _BATCH_ARRAYS
    arrays = {k: np.asarray(fields[k]) for k in names if fields[k] is not None}
    if "status" in arrays:
        arrays["status"] = arrays["status"].astype(str)
    texts = ("status", "message") if fmt == GAUSSIAN_FORMAT else ("messages",)
    meta = {"format": fmt, "version": GAUSSIAN_FORMAT_VERSION,
            **{k: fields[k] for k in texts},
            **labelled.provenance(f"{type(result).__name__}.save")}
    arrays["meta"] = np.array(dumps(meta))
    save_npz(path, arrays)
    return path


def read_gaussian(path: str | os.PathLike) -> tuple[str, dict[str, Any]]:
    """``(format, fields)`` of a file written by :func:`save_gaussian`: ``format`` is
    :data:`GAUSSIAN_FORMAT` or :data:`GAUSSIAN_BATCH_FORMAT`, ``fields`` the constructor
    arguments of the result.

    Raises
    ------
    FileNotFoundError
        No such file.
    IntegrityError
        (a :class:`~transformer_pde.errors.TrajectoryFileError`) not an archive of the
        checksummed container, an array does not match its digest, the metadata is not a
        Gaussian result's, an unknown version, or an invariant of :func:`check_gaussian`
        is broken; the message names the file (and the array).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    arrays = load_npz(path)
    try:
        meta = json.loads(str(arrays.pop("meta")))
        fmt = meta["format"]
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(f"{path} is not a transformer-pde Gaussian result (metadata "
                             f"missing or unreadable: {type(exc).__name__}: {exc})") from None
    if fmt not in (GAUSSIAN_FORMAT, GAUSSIAN_BATCH_FORMAT):
        raise IntegrityError(f"{path} is not a transformer-pde Gaussian result (format "
                             f"{fmt!r})")
    check_version(meta.get("version"), (GAUSSIAN_FORMAT_VERSION,), what="Gaussian ",
                  source=path)
    names = _TRAJ_ARRAYS if fmt == GAUSSIAN_FORMAT else _BATCH_ARRAYS
    for k in sorted(set(arrays) - set(names)):
        raise IntegrityError(f"{path}: unexpected array {k!r}")
    fields: dict[str, Any] = {k: arrays.get(k) for k in names}
    if fmt == GAUSSIAN_FORMAT:
        fields.update(status=meta.get("status"), message=meta.get("message"))
        for k in ("blowup_time", "t_final"):
            fields[k] = float(fields[k]) if fields[k] is not None else None
        fields["nfev"] = int(fields["nfev"]) if fields["nfev"] is not None else None
    else:
        fields["messages"] = meta.get("messages")
    check_gaussian(path, fmt, fields)
    if fmt == GAUSSIAN_FORMAT:
        fields["status"] = Status.parse(fields["status"])
    else:
        fields["messages"] = [str(m) for m in fields["messages"]]
    return fmt, fields


def check_gaussian(source: Any, fmt: str, fields: Mapping[str, Any]) -> None:
    """The invariants of a Gaussian result's fields (``fmt`` one of the two formats).

    Required fields present; a valid status (every member's for a batch) and text
    message(s); float64 arrays with consistent shapes: a trajectory's ``times (T,)``,
    ``means (T, d)``, ``covs (T, d, d)``, ``limit (d, d)``, ``final_mean (d,)``,
    ``final_cov (d, d)``; a batch's ``(B,)`` vectors, ``means (B, d)``, ``covs``,
    ``limit (B, d, d)``, ``t_eval (T,)``, ``traj_means (B, T, d)``,
    ``traj_covs (B, T, d, d)``; times finite and strictly increasing; trajectory states
    finite unless the status is ``nonfinite``.

    Raises
    ------
    IntegrityError
        Naming ``source`` and the field.
    """
    def bad(name: str, msg: str) -> IntegrityError:
        return IntegrityError(f"{source}: {name!r} {msg}")
    names = _TRAJ_ARRAYS if fmt == GAUSSIAN_FORMAT else _BATCH_ARRAYS
    for k, required in names.items():
        if required and fields.get(k) is None:
            raise bad(k, "is missing")
    arr = {k: None if fields.get(k) is None else np.asarray(fields[k]) for k in names}
    if fmt == GAUSSIAN_FORMAT:
        _check_traj(bad, fields, arr)
    else:
        _check_batch(bad, fields, arr)


def _float(bad: Any, name: str, a: np.ndarray, shape: tuple) -> None:
    if a.dtype.kind != "f":
        raise bad(name, f"has dtype {a.dtype}, expected a floating-point type")
    if a.shape != shape:
        raise bad(name, f"has shape {a.shape}, expected {shape}")


def _check_times(bad: Any, name: str, t: np.ndarray) -> None:
    if t.ndim != 1:
        raise bad(name, f"must be 1-D, got shape {t.shape}")
    _float(bad, name, t, t.shape)
    if not np.all(np.isfinite(t)) or (t.size > 1 and not np.all(np.diff(t) > 0)):
        raise bad(name, "is not finite and strictly increasing")


def _check_traj(bad: Any, fields: Mapping[str, Any], a: Mapping[str, Any]) -> None:
    try:
        status = Status.parse(fields.get("status"))
    except ValueError as exc:
        raise bad("status", str(exc)) from None
    if not isinstance(fields.get("message"), str):
        raise bad("message", "must be a str")
    _check_times(bad, "times", a["times"])
    T = a["times"].shape[0]
    if a["means"].ndim != 2:
        raise bad("means", f"must be (T, d), got shape {a['means'].shape}")
    d = a["means"].shape[1]
    shapes = {"means": (T, d), "covs": (T, d, d), "limit": (d, d), "final_mean": (d,),
              "final_cov": (d, d), "blowup_time": (), "t_final": ()}
    for k, shape in shapes.items():
        if a[k] is not None:
            _float(bad, k, a[k], shape)
    if a["nfev"].shape != () or a["nfev"].dtype.kind not in "iu":
        raise bad("nfev", f"must be an integer, got {a['nfev'].dtype} {a['nfev'].shape}")
    if status is not Status.NONFINITE:
        for k in ("means", "covs"):
            if not np.all(np.isfinite(a[k])):
                raise bad(k, f"holds NaN or inf although the status is {str(status)!r}")


def _check_batch(bad: Any, fields: Mapping[str, Any], a: Mapping[str, Any]) -> None:
    st = a["status"]
    if st.ndim != 1 or st.dtype.kind not in "UO":
        raise bad("status", f"must be a 1-D array of str, got {st.dtype} {st.shape}")
    for s in st.tolist():
        try:
            Status.parse(s)
        except ValueError as exc:
            raise bad("status", str(exc)) from None
    B = st.shape[0]
    msgs = fields.get("messages")
    if not isinstance(msgs, (list, tuple)) or len(msgs) != B \
            or not all(isinstance(m, str) for m in msgs):
        raise bad("messages", f"must be a list of {B} str")
    if a["means"].ndim != 2 or a["means"].shape[0] != B:
        raise bad("means", f"must be (B, d) with B = {B}, got shape {a['means'].shape}")
    d = a["means"].shape[1]
    for k, shape in {"blowup_time": (B,), "t_final": (B,), "covs": (B, d, d),
                     "limit": (B, d, d)}.items():
        _float(bad, k, a[k], shape)
    if a["n_steps"].shape != (B,) or a["n_steps"].dtype.kind not in "iu":
        raise bad("n_steps", f"must be ({B},) integers, got {a['n_steps'].dtype} "
                             f"{a['n_steps'].shape}")
    te = a["t_eval"]
    if te is None:
        if a["traj_means"] is not None or a["traj_covs"] is not None:
            raise bad("traj_means", "is present without 't_eval'")
        return
    _check_times(bad, "t_eval", te)
    T = te.shape[0]
    for k, shape in {"traj_means": (B, T, d), "traj_covs": (B, T, d, d)}.items():
        if a[k] is None:
            raise bad(k, "is missing (the batch has 't_eval')")
        _float(bad, k, a[k], shape)
