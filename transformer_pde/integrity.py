r"""Checksums and fingerprints for everything the library writes and reads back.

Every array the package writes to a file (trajectory NPZ, netCDF and Zarr datasets,
checkpoints, sweep stores) carries a digest of its exact contents, and every reader
recomputes it: an edited, truncated or bit-flipped file is an error naming the file and
the array, never different data.

The digest of an array is SHA-256 over its dtype, its shape and its bytes in C order, so
two arrays have the same digest exactly when they are equal element for element with
the same dtype and shape (up to SHA-256 collisions).  A *fingerprint* is the digest of a
JSON-able description: used by checkpoints and studies to recognise their own run.

Examples
--------
>>> import numpy as np
>>> a = np.arange(6.0).reshape(2, 3)
>>> d = array_digest(a)
>>> verify_array(a, d, what="a", source="memory") is a
True
>>> b = a.copy(); b[0, 0] = 1e-300
>>> verify_array(b, d, what="a", source="memory")
Traceback (most recent call last):
...
transformer_pde.errors.IntegrityError: memory: array 'a' does not match its checksum (the file was edited or is corrupt)
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from .errors import IntegrityError

__all__ = ["DIGEST_ALGORITHM", "NPZ_CHECKSUMS", "array_digest", "verify_array", "json_digest",
           "check_version", "save_npz", "load_npz", "write_npz", "IntegrityError"]

#: name recorded beside every digest, so that a reader can refuse an algorithm it does not know
DIGEST_ALGORITHM = "sha256"


def array_digest(a: Any) -> str:
    """Hex SHA-256 of ``a``'s dtype, shape and bytes (C order).  ``None`` has its own digest.

    Arrays on a GPU (anything with ``.get()`` and ``__cuda_array_interface__``) are copied
    to the host first.
    """
    h = hashlib.sha256()
    if a is None:
        h.update(b"none")
        return h.hexdigest()
    if hasattr(a, "__cuda_array_interface__"):
        a = a.get()
    a = np.asarray(a)
    if a.dtype.hasobject:
        raise TypeError(f"cannot digest an array of dtype {a.dtype} (objects have no stable bytes)")
    a = np.ascontiguousarray(a)
    # the dtype string names the byte order too ('<f8'), so '<f8' and '>f8' copies differ
    h.update(json.dumps([a.dtype.str, list(a.shape)]).encode())
    h.update(memoryview(a).cast("B") if a.size else b"")
    return h.hexdigest()


def verify_array(a: Any, expected: str, *, what: str, source: Any) -> Any:
    """Return ``a`` if its digest is ``expected``; otherwise raise :class:`IntegrityError`
    naming ``source`` (the file) and ``what`` (the array)."""
    if not isinstance(expected, str):
        raise IntegrityError(f"{source}: array {what!r} has no valid checksum recorded")
    try:
        got = array_digest(a)
    except TypeError:
        raise IntegrityError(f"{source}: array {what!r} has an unreadable dtype") from None
    if got != expected:
        raise IntegrityError(f"{source}: array {what!r} does not match its checksum "
                             "(the file was edited or is corrupt)")
    return a


def json_digest(obj: Any) -> str:
    """Hex SHA-256 of the canonical JSON of ``obj`` (sorted keys, no NaN shortcuts)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


#: name of the entry of an NPZ archive of :func:`save_npz` that holds its arrays' digests
NPZ_CHECKSUMS = "__checksums__"


def write_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray], *,
              compressed: bool = False) -> Path:
    """Write the NPZ archive ``path`` atomically: into a hidden temporary file beside it,
    renamed over ``path`` once complete.  A failed or interrupted write leaves ``path`` as it
    was (absent, or the previous file) and no temporary file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.partial")
    try:
        with open(tmp, "wb") as fh:
            (np.savez_compressed if compressed else np.savez)(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def save_npz(path: Any, arrays: dict[str, Any], *, compressed: bool = False) -> Any:
    """Write ``arrays`` to the NPZ archive ``path`` with the digest of each array.

    The digests are stored as JSON in the entry ``__checksums__`` (with the algorithm's
    name); :func:`load_npz` checks them.  The archive is written beside ``path`` and
    renamed over it, so a failed write leaves no partial file.  ``np.load`` still reads
    the archive as usual.

    Parameters
    ----------
    path : str or Path
        Target file (``.npz``).
    arrays : dict of str to array_like
        Numeric, boolean or string arrays (no Python objects).
    compressed : bool, default False
        ``np.savez_compressed`` instead of ``np.savez``.
    """
    if NPZ_CHECKSUMS in arrays:
        raise ValueError(f"{NPZ_CHECKSUMS!r} is reserved for the checksums")
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    meta = {"algorithm": DIGEST_ALGORITHM, "arrays": {k: array_digest(v) for k, v in arrays.items()}}
    write_npz(path, {**arrays, NPZ_CHECKSUMS: np.array(json.dumps(meta, sort_keys=True))},
              compressed=compressed)
    return path


def load_npz(path: Any) -> dict[str, np.ndarray]:
    """Read an archive written by :func:`save_npz`, every array checked against its digest.

    Raises
    ------
    IntegrityError
        The file is not such an archive (no checksums, unreadable), an array is missing,
        extra, or does not match its digest.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            files = list(z.files)
            if NPZ_CHECKSUMS not in files:
                raise IntegrityError(f"{path}: no checksums recorded (not written by transformer-pde)")
            meta = json.loads(str(z[NPZ_CHECKSUMS]))
            sums = meta["arrays"]
            if meta.get("algorithm") != DIGEST_ALGORITHM or not isinstance(sums, dict):
                raise IntegrityError(f"{path}: unknown checksum record")
            names = [k for k in files if k != NPZ_CHECKSUMS]
            if sorted(names) != sorted(sums):
                raise IntegrityError(f"{path}: arrays {sorted(set(names) ^ set(sums))} are missing "
                                     "or not recorded (the file was edited or is corrupt)")
            return {k: verify_array(z[k], sums[k], what=k, source=path) for k in names}
    except IntegrityError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged zip raises BadZipFile, zlib.error, EOFError, NotImplementedError (compression byte), RuntimeError ("encrypted" flag), ...
        raise IntegrityError(f"{path}: not a readable NPZ archive ({type(exc).__name__}: {exc})") from None


def check_version(version: Any, known: tuple[int, ...], *, what: str, source: Any,
                  error: type[IntegrityError] = IntegrityError) -> int:
    """Return ``version`` if it is one of the ``known`` format versions (ints, ascending);
    otherwise raise ``error`` naming ``source`` and the ``what`` format (a bool or a float
    is not a version)."""
    if type(version) is not int or version not in known:
        raise error(f"{source}: unknown {what}format version {version!r}; this transformer-pde "
                    f"reads versions {known[0]} to {known[-1]} (the file is corrupt or was "
                    "written by a newer transformer-pde)")
    return version
