r"""Checksums and fingerprints for everything the library writes and reads back.

Every array the package writes to a file (trajectory NPZ, netCDF and Zarr datasets,
checkpoints, sweep stores) carries a digest of its exact contents, and every reader
recomputes it: an edited, truncated or bit-flipped file is an error naming the file and
the array, never different data.

The digest of an array is SHA-256 over its dtype, its shape and its bytes in C order, so
two arrays have the same digest exactly when they are equal element for element with
the same dtype and shape (up to SHA-256 collisions).  A *fingerprint* is the digest of a
JSON-able description (its :func:`~transformer_pde.io.jsonfmt.canonical` text): used by
checkpoints and studies to recognise their own run.

Whether a file is checked never depends on its version field alone: a reader verifies the
checksums of every file that carries them, whatever version it claims, and
:func:`check_checksum_version` then refuses a file that carries checksums under a version
(or no version) written before checksums existed -- its version field was edited.  Only a
file without any checksum (a genuine older file) is read unverified.

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
from typing import Any

import numpy as np

from ..errors import IntegrityError
from .jsonfmt import canonical, dumps

__all__ = ["DIGEST_ALGORITHM", "array_digest", "check_checksum_version", "check_version",
           "json_digest", "verify_array"]

#: name recorded beside every digest, so that a reader can refuse an algorithm it does not know
DIGEST_ALGORITHM = "sha256"


def array_digest(a: Any) -> str:
    """Hex SHA-256 of ``a``'s dtype, shape and bytes (C order).  ``None`` has its own digest.

    Arrays on a GPU (anything with ``.get()`` and ``__cuda_array_interface__``) are copied
    to the host first.

    Raises
    ------
    TypeError
        ``a`` is an array of Python objects (they have no stable bytes).
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
    h.update(dumps([a.dtype.str, list(a.shape)]).encode())
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
    """Hex SHA-256 of the canonical JSON of ``obj``
    (:func:`~transformer_pde.io.jsonfmt.canonical`: sorted keys, no spaces, NaN and
    infinities as ``NaN``/``Infinity``, other objects by ``str``)."""
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


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


def check_checksum_version(version: Any, *, carries: bool, first: int, what: str,
                           source: Any, error: type[IntegrityError] = IntegrityError) -> None:
    """Refuse a file that carries checksums under a version field that says it has none.

    A reader verifies the checksums of a file whenever the file carries them, whatever its
    version field says, then calls this: a file whose version field is absent
    (``None``) or older than ``first`` (the first format version with checksums) but
    that carries checksums (``carries``) had its version field edited (e.g. set back to
    an older version, so that a reader would skip the checksums), and is refused with
    ``error`` naming ``source`` and the ``what`` format.  A genuine older file carries
    no checksums and passes."""
    if carries and (version is None or version < first):
        claim = "no format version" if version is None else f"{what}format version {version!r}"
        raise error(f"{source}: claims {claim}, but carries the checksums of version {first} "
                    f"and later (its version field was edited, or it is corrupt)")
