r"""Trajectory files: the NPZ format of a particle trajectory, its checks, and labelled files.

:func:`save_trajectory` writes a :class:`~transformer_pde.particles.ParticleTrajectory`
(any object with its attributes) to NPZ, or to netCDF (``.nc``) / Zarr (``.zarr``) through
:mod:`~transformer_pde.io.labelled`; :func:`read_trajectory` reads it back as the
trajectory's constructor arguments, after :func:`check_trajectory` (the shape, dtype and
value invariants every trajectory file must meet).  The NPZ layout:

* ``meta``: JSON text ``{"format": "transformer-pde-trajectory", "version": 3, "status",
  "message", "info", "attention", "digest_algorithm": "sha256", "checksums": {...}}``
  (:data:`NPZ_FORMAT_VERSION`; the attention as encoded by
  :func:`~transformer_pde.io.codec.attention_data`; the CF-style ``Conventions``,
  ``source``, ``references`` and ``history`` of
  :func:`~transformer_pde.io.labelled.provenance`), and ``meta_checksum``, its SHA-256;
* ``times``, ``weights``, ``positions`` (masked attention) and either ``states`` or
  ``last``, ``means``, ``covs`` and ``values`` (``SaveAt(fn=...)``), plus the attention's
  arrays; ``checksums`` holds the SHA-256 of each.

Files of versions 1 and 2 (no checksums) are still read, with the invariant checks only.
The checksums are verified whenever a file carries them, whatever version its metadata
claims; a file that carries them under version 1 or 2 is refused (its version was edited).
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentError, IntegrityError, TrajectoryFileError
from ..results import Status
from . import labelled
from .codec import attention_data, attention_from_data
from .container import write_npz
from .digests import (DIGEST_ALGORITHM, array_digest, check_checksum_version, check_version,
                      verify_array)
from .jsonfmt import dumps
from .saving import check_target, save_labelled

__all__ = ["NPZ_FORMAT_VERSION", "NPZ_VERSIONS", "TRAJECTORY_FORMAT", "check_trajectory",
           "dataset_fields", "read_trajectory", "save_trajectory"]

#: format marker in the metadata of every trajectory NPZ file
TRAJECTORY_FORMAT = "transformer-pde-trajectory"
#: NPZ trajectory format written by :func:`save_trajectory`: 3 = per-array SHA-256
#: checksums; versions 1 and 2 (no checksums) are still read, with the invariant checks only
NPZ_FORMAT_VERSION = 3
#: the NPZ versions :func:`read_trajectory` reads
NPZ_VERSIONS = (1, 2, 3)
#: the first NPZ version whose files carry checksums
_FIRST_CHECKSUM_VERSION = 3

_STATE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ARRAYS = ("times", "states", "weights", "positions", "last", "saved_means", "saved_covs",
           "values")


# ------------------------------------------------------------------ checks
def check_trajectory(source: Any, fields: Mapping[str, Any]) -> None:
    """Check the invariants of a trajectory's constructor arguments ``fields``.

    ``times`` float64, finite and strictly increasing; ``states`` / ``last`` float32 or
    float64; ``weights`` float32/float64, finite, >= 0 and summing to 1 within
    ``max(1e-12, N * eps)``; ``positions`` finite and in [0, 1]; ``values`` real numeric
    (bool, integer or float); consistent shapes.  Non-finite ``states`` / ``last`` are
    refused when the status is a success (``ok``, ``converged``, ``blowup``,
    ``diverging``): :func:`~transformer_pde.simulate` never saves a non-finite state (a
    non-finite step ends the run with ``nonfinite`` and is not saved; a blow-up state is
    finite), so they can only come from an edit.

    Raises
    ------
    TrajectoryFileError
        Inconsistent shapes (the message names ``source`` and the arrays).
    IntegrityError
        (a :class:`TrajectoryFileError`) a dtype :func:`~transformer_pde.simulate` never
        writes or a broken value invariant (the message names ``source`` and the array).
    """
    status = Status.parse(fields["status"])
    a = {k: None if fields.get(k) is None else np.asarray(fields[k]) for k in _ARRAYS}
    sizes = _segment_sizes(source, fields.get("info"), a["weights"])
    _check_shapes(source, a["times"], a["states"], a["weights"], a["positions"], a["last"],
                  a["saved_means"], a["saved_covs"], a["values"], sizes)
    _check_values(source, status, a["times"], a["states"], a["weights"], a["positions"],
                  a["last"], sizes)


def _segment_sizes(path, info: Any, weights: Any) -> list[int]:
    """The sizes of the packed sequences of ``info["segments"]`` (one segment of all the
    tokens when absent): positive integers summing to the number of weights, or a
    :class:`TrajectoryFileError` naming ``path``."""
    n = None if weights is None or np.ndim(weights) != 1 else int(np.shape(weights)[0])
    seg = info.get("segments") if isinstance(info, Mapping) else None
    if seg is None:
        return [n] if n is not None else []
    ok = isinstance(seg, (list, tuple)) and len(seg) > 0 and all(
        isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1 for k in seg)
    if not ok or (n is not None and sum(int(k) for k in seg) != n):
        raise TrajectoryFileError(f"{path}: inconsistent arrays: info['segments'] must be "
                                  f"sizes >= 1 summing to the N = {n} weights, got "
                                  f"{str(seg)[:80]}")
    return [int(k) for k in seg]


def _check_shapes(path, times, states, weights, positions, last, means, covs, values,
                  sizes) -> None:
    """Dtypes and shapes of a trajectory's arrays (:class:`TrajectoryFileError` naming
    ``path`` and the array; :class:`IntegrityError` for a dtype that
    :func:`simulate` never writes)."""
    def bad(msg: str) -> TrajectoryFileError:
        return TrajectoryFileError(f"{path}: inconsistent arrays: {msg}")
    for name, a in (("times", times), ("weights", weights), ("states", states),
                    ("positions", positions), ("last", last), ("means", means), ("covs", covs)):
        if a is not None and not np.issubdtype(a.dtype, np.floating):
            raise IntegrityError(f"{path}: inconsistent arrays: array {name!r} has dtype "
                                 f"{a.dtype}, expected floating point")
    if times.dtype != np.float64:
        raise IntegrityError(f"{path}: array 'times' has dtype {times.dtype}, expected float64")
    for name, a in (("states", states), ("last", last), ("weights", weights),
                    ("positions", positions), ("means", means), ("covs", covs)):
        if a is not None and a.dtype not in _STATE_DTYPES:
            raise IntegrityError(f"{path}: array {name!r} has dtype {a.dtype}, expected "
                                 f"float32 or float64")
    if values is not None and values.dtype.kind not in "biuf":
        raise IntegrityError(f"{path}: array 'values' has dtype {values.dtype}, expected a "
                             f"real numeric type (bool, integer or float)")
    if times.ndim != 1 or times.size == 0:
        raise bad(f"times must be a non-empty 1-D array, got shape {times.shape}")
    if weights.ndim != 1:
        raise bad(f"weights must be 1-D, got shape {weights.shape}")
    n = weights.shape[0]
    if states is not None:
        if states.ndim != 3 or states.shape[0] != times.shape[0] or states.shape[1] != n:
            raise bad(f"states {states.shape} must be (T, N, d) with T = {times.shape[0]} "
                      f"saved times and N = {n} weights")
    else:
        if last.ndim != 2 or last.shape[0] != n:
            raise bad(f"last {last.shape} must be (N, d) with N = {n}")
        T, d = times.shape[0], last.shape[1]
        # packed sequences keep the moments of each segment: (T, S, d) and (T, S, d, d)
        per = (T, d) if len(sizes) <= 1 else (T, len(sizes), d)
        if means.shape != per or covs.shape != per + (d,):
            raise bad(f"means {means.shape} / covs {covs.shape} must be {per} / {per + (d,)}")
        if values is not None and values.shape[:1] != (T,):
            raise bad(f"values {values.shape} must have T = {T} rows")
    if positions is not None and positions.shape != (n,):
        raise bad(f"positions {positions.shape} must be ({n},)")
    if states is not None and last is not None and last.shape != states.shape[1:]:
        raise bad(f"last {last.shape} must be {states.shape[1:]}")


def _check_values(path, status: Status, times, states, weights, positions, last,
                  sizes) -> None:
    """The value invariants of :func:`load` (after :func:`_check_shapes`):
    :class:`IntegrityError` naming ``path`` and the array.  The weights of each segment
    (``sizes``: packed sequences) sum to 1."""
    def bad(name: str, msg: str) -> IntegrityError:
        return IntegrityError(f"{path}: array {name!r} {msg} (the file was edited or is "
                              f"corrupt)")
    if not np.all(np.isfinite(times)):
        raise bad("times", "holds NaN or inf")
    if times.size > 1 and not np.all(np.diff(times) > 0):
        raise bad("times", "is not strictly increasing")
    if not np.all(np.isfinite(weights)):
        raise bad("weights", "holds NaN or inf")
    if np.any(weights < 0):
        raise bad("weights", "holds negative weights")
    start = 0
    for b, size in enumerate(sizes):
        part = weights[start:start + size]
        start += size
        total = math.fsum(part.astype(np.float64).tolist())
        tol = max(1e-12, size * float(np.finfo(weights.dtype).eps))
        if not abs(total - 1.0) <= tol:
            where = f" in segment {b}" if len(sizes) > 1 else ""
            raise bad("weights", f"sums to {total!r}{where}, not 1 (tolerance {tol:.3g})")
    if positions is not None and not (np.all(np.isfinite(positions))
                                      and np.all((positions >= 0) & (positions <= 1))):
        raise bad("positions", "holds positions outside [0, 1] (or NaN)")
    if status.success:
        # simulate never saves a non-finite state: a non-finite step ends the run with
        # status 'nonfinite' without saving it, and a blow-up is detected on a finite state
        for name, a in (("states", states), ("last", last)):
            if a is not None and not np.all(np.isfinite(a)):
                raise bad(name, f"holds NaN or inf although the run ended with status "
                                f"{str(status)!r}")


# ------------------------------------------------------------------ writing
def save_trajectory(traj: Any, path: str | Path, *, overwrite: bool = False,
                    made_by: str = "ParticleTrajectory.save") -> Path:
    """Write the trajectory ``traj`` to ``path``: NPZ, or netCDF (``.nc``) / Zarr (``.zarr``)
    through :func:`~transformer_pde.io.labelled.particle_dataset`.  :func:`read_trajectory`
    restores it exactly.

    Every array is written with its SHA-256 digest (NPZ format version
    :data:`NPZ_FORMAT_VERSION`; labelled files:
    :func:`~transformer_pde.io.labelled.save_dataset`) and the file is first written to a
    temporary path beside ``path`` and renamed into place, so a failed save leaves nothing
    behind.  An existing ``path`` is replaced only with ``overwrite=True`` (then the new
    file is complete before it takes the old one's place:
    :func:`~transformer_pde.io.saving.save_labelled`).  The file records the package
    version and a ``history`` line naming ``made_by``
    (:func:`~transformer_pde.io.labelled.provenance`; NPZ: keys of ``meta``).

    Raises
    ------
    ArgumentError
        ``path`` exists and ``overwrite`` is False (the message names the path and says
        ``overwrite=True``), ``path`` is a directory that is not a Zarr store, or the
        trajectory breaks an invariant of :func:`check_trajectory` (it could not be read
        back); nothing is written.
    ArgumentTypeError
        ``overwrite`` is not a bool.
    """
    path = check_target(path, overwrite)
    fields = {k: getattr(traj, k) for k in _ARRAYS}
    fields["status"] = Status.parse(traj.status)
    fields["info"] = traj.info
    try:
        check_trajectory(path, fields)
    except TrajectoryFileError as exc:
        raise ArgumentError(f"cannot save this trajectory (load would refuse it): "
                            f"{exc}") from None
    if path.suffix in labelled.LABELLED_SUFFIXES:
        return save_labelled(labelled.particle_dataset(traj), path, overwrite=overwrite,
                             made_by=made_by)
    arrays: dict[str, Any] = {"times": traj.times, "weights": traj.weights}
    if traj.states is not None:
        arrays["states"] = traj.states
    else:
        arrays.update(last=traj.last, means=traj.saved_means, covs=traj.saved_covs)
        if traj.values is not None:
            arrays["values"] = traj.values
    if traj.positions is not None:
        arrays["positions"] = traj.positions
    meta: dict[str, Any] = {"format": TRAJECTORY_FORMAT,
                            "version": NPZ_FORMAT_VERSION,
                            "status": str(traj.status), "message": traj.message,
                            "info": traj.info,
                            "attention": attention_data(traj.attention, arrays),
                            **labelled.provenance(made_by)}
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    meta["digest_algorithm"] = DIGEST_ALGORITHM
    meta["checksums"] = {k: array_digest(v) for k, v in arrays.items()}
    arrays["meta"] = np.array(dumps(meta))
    arrays["meta_checksum"] = np.array(array_digest(arrays["meta"]))
    # written beside the target and renamed over it: a failed save leaves no partial file
    return write_npz(path, arrays)


# ------------------------------------------------------------------ reading
def _open_npz(path: Path, what: str) -> Any:
    """``np.load`` of an NPZ archive, every failure turned into :class:`TrajectoryFileError`."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise TrajectoryFileError(f"{path} is a directory, not a {what} file")
    if path.stat().st_size == 0:
        raise TrajectoryFileError(f"{path} is empty (0 bytes), not a {what} file")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as fh:
            magic = fh.read(6)
        kind = "a plain .npy array" if magic == b"\x93NUMPY" else "not an NPZ archive"
        raise TrajectoryFileError(f"{path} is {kind}, not a {what} file (written by "
                                  "ParticleTrajectory.save)")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - zipfile.BadZipFile, OSError, ValueError, EOFError
        raise TrajectoryFileError(f"{path} is not a readable {what} file "
                                  f"(truncated or corrupt archive: {exc})") from None


def _entry(z: Any, path: Path, key: str) -> np.ndarray:
    try:
        return z[key]
    except KeyError:
        raise TrajectoryFileError(f"{path}: missing array {key!r}") from None
    except Exception as exc:  # noqa: BLE001 - corrupt member: BadZipFile, zlib.error, ValueError, EOFError
        raise TrajectoryFileError(f"{path}: array {key!r} is unreadable (truncated or "
                                  f"corrupt file: {type(exc).__name__}: {exc})") from None




def dataset_fields(ds: Any, source: str = "dataset") -> dict[str, Any]:
    """The constructor arguments of a trajectory from a labelled Dataset made by
    :func:`~transformer_pde.io.labelled.particle_dataset`, checked by
    :func:`check_trajectory` (errors name ``source``)."""
    fields = labelled.particle_fields(ds, source)
    check_trajectory(source, fields)
    return fields


def read_trajectory(path: str | Path) -> dict[str, Any]:
    """The constructor arguments of the trajectory written to ``path`` by :func:`save_trajectory`.

    The data are verified before they are returned:

    - **checksums**: NPZ files of format version 3 (:data:`NPZ_FORMAT_VERSION`) and
      ``.nc`` / ``.zarr`` files of version 2 record the SHA-256 digest of every array
      (and of the metadata); each is recomputed, whenever the file carries them,
      whatever version it claims (a file that carries checksums under an older version
      had its version edited, and is refused).  Files written before checksums existed
      (NPZ versions 1 and 2, labelled files without ``format_version``, with no checksum
      of any kind) are read with the invariant checks only.  An unknown version is
      refused.
    - **invariants** (every version): ``times`` float64, finite and strictly increasing;
      ``states`` / ``last`` float32 or float64 (an integer or float16 file is refused);
      ``weights`` float32/float64, finite, >= 0 and summing to 1 within
      ``max(1e-12, N * eps)``; ``positions`` finite and in [0, 1]; ``values`` real numeric
      (bool, integer or float); consistent shapes.  Non-finite ``states`` / ``last`` are
      refused when the status is a success (``ok``, ``converged``, ``blowup``,
      ``diverging``): :func:`~transformer_pde.simulate` never saves a non-finite state (a
      non-finite step ends the run with ``nonfinite`` and is not saved; a blow-up state is finite), so
      they can only come from an edit; for the other statuses they are accepted.

    Raises
    ------
    TrajectoryFileError
        (a :class:`~transformer_pde.errors.TransformerPDEError` and ``ValueError``) the
        file is empty, truncated, not an NPZ archive, a plain ``.npy``, has no or bad
        metadata, misses arrays or has inconsistent shapes; the message names the file.
    IntegrityError
        (a :class:`TrajectoryFileError`) an array does not match its checksum, an
        invariant above is broken, or the format version is unknown; the message names
        the file and the array.
    FileNotFoundError
        No such file.
    """
    path = Path(path)
    if path.suffix in labelled.LABELLED_SUFFIXES:
        return dataset_fields(labelled.open_dataset(path), str(path))
    with _open_npz(path, "transformer-pde trajectory") as z:
        meta = _read_meta(z, path)
        get = _array_getter(z, path, meta)
        try:
            status = Status.parse(meta["status"])
            message = str(meta["message"])
        except (KeyError, ValueError) as exc:
            raise TrajectoryFileError(f"{path}: bad metadata ({exc})") from None
        info = meta.get("info", {})
        if not isinstance(info, dict):
            raise TrajectoryFileError(f"{path}: bad metadata ('info' is not a mapping)")
        times, weights = get("times"), get("weights")
        positions = get("positions") if "positions" in z.files else None
        fields: dict[str, Any] = {
            "times": times, "states": get("states") if "states" in z.files else None,
            "weights": weights, "positions": positions, "status": status,
            "message": message, "attention": None, "info": info, "values": None,
            "last": None, "saved_means": None, "saved_covs": None}
        if fields["states"] is None:
            if "last" not in z.files:
                raise TrajectoryFileError(f"{path}: missing array 'states'")
            fields.update(last=get("last"), saved_means=get("means"), saved_covs=get("covs"),
                          values=get("values") if "values" in z.files else None)
        check_trajectory(path, fields)
        try:
            fields["attention"] = attention_from_data(meta.get("attention"), get)
        except TrajectoryFileError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: the stored attention is invalid
            raise TrajectoryFileError(f"{path}: the stored attention is invalid "
                                      f"({type(exc).__name__}: {exc})") from None
        return fields


def _read_meta(z: Any, path: Path) -> dict[str, Any]:
    """The verified metadata of an open trajectory archive (format and version checked)."""
    if "meta" not in z.files:
        raise TrajectoryFileError(f"{path} is not a transformer-pde trajectory (no 'meta' "
                                  "entry)")
    raw_meta = _entry(z, path, "meta")
    if "meta_checksum" in z.files:
        expected = _entry(z, path, "meta_checksum")
        verify_array(raw_meta, str(expected) if expected.dtype.kind == "U" else None,
                     what="meta", source=path)
    try:
        meta = json.loads(str(raw_meta))
    except json.JSONDecodeError as exc:
        raise TrajectoryFileError(f"{path}: metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != TRAJECTORY_FORMAT:
        raise TrajectoryFileError(f"{path} is not a transformer-pde trajectory (metadata "
                                  f"format is not {TRAJECTORY_FORMAT!r})")
    check_version(meta.get("version"), NPZ_VERSIONS, what="trajectory ", source=path)
    return meta


def _array_getter(z: Any, path: Path, meta: dict[str, Any]) -> Callable[[str], np.ndarray]:
    """``get(key)`` of the archive's arrays: when the archive carries checksums (any of
    ``meta_checksum``, the metadata's ``checksums`` or ``digest_algorithm``; every file of
    version 3 on), every array is read and verified against its checksum up front, so
    nothing unverified is ever used, whatever version the metadata claims; an archive that
    carries them under version 1 or 2 is then refused (its version was edited)."""
    version = meta["version"]
    carries = bool({"checksums", "digest_algorithm"} & set(meta)) or "meta_checksum" in z.files
    if version < _FIRST_CHECKSUM_VERSION and not carries:
        return lambda key: _entry(z, path, key)  # a genuine version-1 or -2 file
    sums = meta.get("checksums")
    if "meta_checksum" not in z.files or not isinstance(sums, dict) \
            or meta.get("digest_algorithm") != DIGEST_ALGORITHM:
        raise IntegrityError(f"{path}: the checksums of this version-{version} file "
                             f"are missing or unreadable (the file was edited or is "
                             f"corrupt)")
    stored = set(z.files) - {"meta", "meta_checksum"}
    for key in sorted(set(sums) - stored):
        raise IntegrityError(f"{path}: array {key!r} is missing (the file was edited "
                             f"or is corrupt)")
    for key in sorted(stored - set(sums)):
        raise IntegrityError(f"{path}: array {key!r} has no checksum (the file was "
                             f"edited)")
    verified = {key: verify_array(_entry(z, path, key), sums[key], what=key, source=path)
                for key in sorted(stored)}
    check_checksum_version(version, carries=True, first=_FIRST_CHECKSUM_VERSION,
                           what="trajectory ", source=path)

    def get(key: str) -> np.ndarray:
        if key not in verified:
            raise TrajectoryFileError(f"{path}: missing array {key!r}")
        return verified[key]
    return get
