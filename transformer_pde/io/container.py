r"""The checksummed NPZ container: every NPZ file of the package is written through here.

:func:`write_npz` writes an NPZ archive atomically (a hidden temporary file beside the
target, renamed over it).  :func:`save_npz` adds the SHA-256 digest of every array
(:func:`~transformer_pde.io.digests.array_digest`) in the entry :data:`NPZ_CHECKSUMS`
(JSON ``{"algorithm": "sha256", "arrays": {name: digest}}``), and :func:`load_npz`
returns the arrays only after every digest matched: an edited, truncated or damaged
archive is an :class:`~transformer_pde.errors.IntegrityError` naming the file and the
array.  ``np.load`` still reads these archives as usual.

Trajectory files and run checkpoints use :func:`write_npz` with their own metadata entry
(:mod:`transformer_pde.io.trajectory`, :mod:`transformer_pde.integrate.checkpoint`).

Examples
--------
>>> import numpy as np, tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "a.npz"
>>> _ = save_npz(path, {"x": np.arange(3.0)})
>>> load_npz(path)["x"]
array([0., 1., 2.])
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IntegrityError
from .digests import DIGEST_ALGORITHM, array_digest, verify_array
from .jsonfmt import dumps

__all__ = ["NPZ_CHECKSUMS", "load_npz", "save_npz", "write_npz"]

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

    Returns
    -------
    path
        ``path`` as given.

    Raises
    ------
    ValueError
        An array is named ``__checksums__`` (reserved).
    """
    if NPZ_CHECKSUMS in arrays:
        raise ValueError(f"{NPZ_CHECKSUMS!r} is reserved for the checksums")
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    meta = {"algorithm": DIGEST_ALGORITHM, "arrays": {k: array_digest(v) for k, v in arrays.items()}}
    write_npz(path, {**arrays, NPZ_CHECKSUMS: np.array(dumps(meta, sort_keys=True))},
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
