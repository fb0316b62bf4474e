r"""The one JSON encoding of the package: every JSON text it writes goes through here.

Two modes, one per purpose:

* **data** (``dumps(obj)``, :func:`json_default`): NumPy scalars become Python numbers
  (``np.float32(0.1).item()``, the value exactly), NumPy arrays nested lists, paths their
  string, enums their value; any other object is a ``TypeError`` naming its type, so no
  object is ever written as an arbitrary string.  Used by trajectory and checkpoint
  metadata, labelled-file attributes, study stores, CLI outputs and pretrained summaries.
* **description** (``dumps(obj, describe=True)``, :func:`canonical`): any object that is
  not JSON data is written as its ``str``.  This is the text of *fingerprints* (the run
  configuration a study or a checksum identifies); its bytes are part of files written
  before, so it never changes.  :func:`canonical` is the form hashed by
  :func:`~transformer_pde.io.digests.json_digest`: sorted keys, no spaces.

Exact arrays (dtype and shape kept, values bit for bit) are written as tagged objects
``{"__ndarray__": [...], "dtype": "<f8", "shape": [...]}`` by :func:`tag_arrays` and read
back by :func:`untag_arrays`: Python's ``repr`` of a float64 (used by :mod:`json`) reads
back to the same float, so every float32/float64 value round-trips exactly.

Examples
--------
>>> import numpy as np
>>> dumps({"n": np.int64(3), "x": np.arange(2.0)})
'{"n": 3, "x": [0.0, 1.0]}'
>>> dumps({"n": np.int64(3)}, describe=True)
'{"n": "3"}'
>>> canonical({"b": 1, "a": [1.5, "x"]})
'{"a":[1.5,"x"],"b":1}'
>>> back = untag_arrays(tag_arrays({"q": np.eye(2, dtype=np.float32)}))
>>> back["q"].dtype, back["q"].shape
(dtype('float32'), (2, 2))
"""

from __future__ import annotations

import enum
import json
from pathlib import PurePath
from typing import Any

import numpy as np

__all__ = ["NDARRAY_TAG", "canonical", "dumps", "json_default", "tag_arrays", "untag_arrays"]

#: key of the tagged object that holds an exact array (see :func:`tag_arrays`)
NDARRAY_TAG = "__ndarray__"


def json_default(o: Any) -> Any:
    """The JSON data of an object :mod:`json` does not know (``default=`` of
    :func:`json.dumps`): NumPy scalar -> Python scalar, NumPy array -> nested lists,
    path -> ``str``, enum -> its value.

    Raises
    ------
    TypeError
        Any other object (the message names its type).
    """
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, PurePath):
        return str(o)
    if isinstance(o, enum.Enum):
        return o.value
    raise TypeError(f"cannot write an object of type {type(o).__name__} to JSON")


def dumps(obj: Any, *, indent: int | None = None, sort_keys: bool = False,
          describe: bool = False) -> str:
    """JSON text of ``obj``: data (:func:`json_default`), or with ``describe`` a
    description (objects that are not data by ``str``, the fingerprint mode).

    NaN and infinities are written as ``NaN``/``Infinity`` (Python's JSON extension, read
    back by :func:`json.loads`)."""
    return json.dumps(obj, indent=indent, sort_keys=sort_keys,
                      default=str if describe else json_default)


def canonical(obj: Any) -> str:
    """The canonical description of ``obj``: sorted keys, no spaces, objects that are not
    JSON data by ``str``.  Equal JSON data have equal canonical text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str)


def tag_arrays(value: Any) -> Any:
    """``value`` with every NumPy array replaced by its exact tagged object
    (``{"__ndarray__": list, "dtype": str, "shape": list}``) and every NumPy scalar by the
    Python scalar; dicts, lists and tuples (as lists) are walked, other values kept."""
    if isinstance(value, np.ndarray):
        return {NDARRAY_TAG: value.tolist(), "dtype": value.dtype.str,
                "shape": list(value.shape)}
    if isinstance(value, dict):
        return {k: tag_arrays(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [tag_arrays(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def untag_arrays(value: Any) -> Any:
    """Inverse of :func:`tag_arrays`: tagged objects become arrays of their dtype and
    shape (lists stay lists)."""
    if isinstance(value, dict):
        if NDARRAY_TAG in value:
            return np.asarray(value[NDARRAY_TAG], dtype=np.dtype(value["dtype"])).reshape(
                value["shape"])
        return {k: untag_arrays(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag_arrays(v) for v in value]
    return value
