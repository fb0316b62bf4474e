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

**Strict JSON.**  ``dumps(obj, strict=True)`` writes standard JSON (RFC 8259), which
every JSON parser reads: NaN and the infinities, which JSON has no numbers for, become
``null``.  The files the command line writes (``summary.json``, ``bench.json``) and the
JSON attributes of labelled netCDF/Zarr files are strict.  Without ``strict`` they are
written as ``NaN``/``Infinity``, Python's extension (the internal metadata of NPZ files
and checkpoints, whose bytes earlier versions also read).

Exact arrays (dtype and shape kept, values bit for bit) are written as tagged objects
``{"__ndarray__": [...], "dtype": "<f8", "shape": [...]}`` by :func:`tag_arrays` and read
back by :func:`untag_arrays`: Python's ``repr`` of a float64 (used by :mod:`json`) reads
back to the same float, so every float32/float64 value round-trips exactly.  Non-finite
values stay exact in strict JSON too: in a tagged array they are the strings ``"nan"``,
``"inf"``, ``"-inf"``, and a non-finite float outside arrays is the tagged object
``{"__float__": "inf"}``.

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
>>> dumps({"t": float("inf"), "x": [1.0, float("nan")]}, strict=True)
'{"t": null, "x": [1.0, null]}'
>>> untag_arrays(json.loads(dumps(tag_arrays({"t": float("inf")}), strict=True)))
{'t': inf}
"""

from __future__ import annotations

import enum
import json
import math
from pathlib import PurePath
from typing import Any

import numpy as np

__all__ = ["FLOAT_TAG", "NDARRAY_TAG", "canonical", "dumps", "finite_json", "json_default",
           "tag_arrays", "untag_arrays"]

#: key of the tagged object that holds an exact array (see :func:`tag_arrays`)
NDARRAY_TAG = "__ndarray__"
#: key of the tagged object that holds a non-finite float (see :func:`tag_arrays`)
FLOAT_TAG = "__float__"


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


def finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float (Python or NumPy, also inside NumPy
    arrays, lists, tuples and dict values) replaced by ``None``; NumPy scalars and arrays
    become Python numbers and lists.  Other objects are kept as they are."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return finite_json(value.tolist())
    if isinstance(value, np.generic):
        return finite_json(value.item())
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def dumps(obj: Any, *, indent: int | None = None, sort_keys: bool = False,
          describe: bool = False, strict: bool = False) -> str:
    """JSON text of ``obj``: data (:func:`json_default`), or with ``describe`` a
    description (objects that are not data by ``str``, the fingerprint mode).

    With ``strict`` the text is standard JSON: NaN and infinities become ``null``
    (:func:`finite_json`; use :func:`tag_arrays` first to keep them exactly).  Without it
    they are written as ``NaN``/``Infinity`` (Python's JSON extension, read back by
    :func:`json.loads`)."""
    if strict:
        return json.dumps(finite_json(obj), indent=indent, sort_keys=sort_keys,
                          allow_nan=False, default=str if describe else json_default)
    return json.dumps(obj, indent=indent, sort_keys=sort_keys,
                      default=str if describe else json_default)


def canonical(obj: Any) -> str:
    """The canonical description of ``obj``: sorted keys, no spaces, objects that are not
    JSON data by ``str``.  Equal JSON data have equal canonical text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str)


def _nonfinite_text(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _exact_items(items: Any) -> Any:
    """The nested lists of an array's ``tolist()`` with non-finite floats as strings."""
    if isinstance(items, list):
        return [_exact_items(v) for v in items]
    if isinstance(items, float) and not math.isfinite(items):
        return _nonfinite_text(items)
    return items


def tag_arrays(value: Any) -> Any:
    """``value`` with every NumPy array replaced by its exact tagged object
    (``{"__ndarray__": list, "dtype": str, "shape": list}``; non-finite elements as the
    strings ``"nan"``, ``"inf"``, ``"-inf"``), every NumPy scalar by the Python scalar
    and every non-finite float by ``{"__float__": "nan" | "inf" | "-inf"}``, so that the
    result is strict JSON data; dicts, lists and tuples (as lists) are walked, other
    values kept."""
    if isinstance(value, np.ndarray):
        items = value.tolist()
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            items = _exact_items(items)
        return {NDARRAY_TAG: items, "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, dict):
        return {k: tag_arrays(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [tag_arrays(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_TAG: _nonfinite_text(value)}
    return value


def untag_arrays(value: Any) -> Any:
    """Inverse of :func:`tag_arrays`: tagged objects become arrays of their dtype and
    shape, or non-finite floats (lists stay lists)."""
    if isinstance(value, dict):
        if set(value) == {FLOAT_TAG} and value[FLOAT_TAG] in ("nan", "inf", "-inf"):
            return float(value[FLOAT_TAG])
        if NDARRAY_TAG in value:
            return np.asarray(value[NDARRAY_TAG], dtype=np.dtype(value["dtype"])).reshape(
                value["shape"])
        return {k: untag_arrays(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag_arrays(v) for v in value]
    return value
