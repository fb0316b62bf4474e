r"""The one codec of :class:`~transformer_pde.Attention`: to plain data and back.

An attention (one or several heads, constant matrices, :class:`~transformer_pde.Layers`
tables, biases) is described by :meth:`~transformer_pde.Attention.to_dict`: the scalars
``kind``, ``heads``, ``masked``, ``beta``, ``eps``, ``l2_beta`` (and ``shift``,
``kv_heads`` and ``rotary``, a small dict of scalars, when they are set), the matrices
``Q``, ``K``, ``V``, ``W_O`` and the biases that are set, a :class:`Layers` as
``{"layers": table, "layer_time": h, "t0": t0}``, and ``"serialisable": False`` when a
parameter is a callable of time (stored as ``None``; such an attention is not rebuilt).
This module turns that description into JSON data and back, in two layouts:

* **inline** (``arrays=None``): every array as an exact tagged object
  (:func:`~transformer_pde.io.jsonfmt.tag_arrays`), the whole attention one JSON text
  (:func:`attention_to_json`); used by the netCDF / Zarr attributes;
* **external** (``arrays`` a dict): every array moved into ``arrays`` under
  ``prefix + name`` (``prefix + name + "__layers"`` for a table) and referenced as
  ``{"array": key}`` or ``{"layers": key, "layer_time": h, "t0": t0}``; used by the NPZ
  trajectory files, whose arrays are archive members with their own checksums.

Both layouts round-trip exactly: :func:`attention_from_data` rebuilds an attention equal
to the original (same matrices bit for bit, same scalars).  :func:`attention_fields`
names the fields that determine an attention, with their live values, for run
fingerprints (checkpoints).

Examples
--------
>>> import numpy as np
>>> from transformer_pde import Attention
>>> att = Attention("softmax", Q=np.eye(2), K=np.eye(2), V=2 * np.eye(2))
>>> arrays = {}
>>> data = attention_data(att, arrays)
>>> data["V"], sorted(arrays)
({'array': 'att__V'}, ['att__K', 'att__Q', 'att__V'])
>>> attention_from_data(data, arrays).V[0, 0]
np.float64(2.0)
>>> attention_from_json(attention_to_json(att)).kind
'softmax'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..attention import Attention
from .jsonfmt import dumps, tag_arrays, untag_arrays

__all__ = ["ATTENTION_PREFIX", "attention_data", "attention_fields", "attention_from_data",
           "attention_from_json", "attention_to_json"]

#: prefix of the archive members that hold an attention's arrays (external layout)
ATTENTION_PREFIX = "att__"


def attention_fields(att: Attention) -> dict[str, Any]:
    """The fields that determine ``att`` (the keys of its description, absent biases left
    out) with their live values: scalars, arrays, :class:`Layers` or callables of time."""
    spec = att.to_dict()
    return {key: getattr(att, key, spec[key]) for key in spec if key != "serialisable"}


def attention_data(att: Attention | None, arrays: dict[str, np.ndarray] | None = None, *,
                   prefix: str = ATTENTION_PREFIX) -> dict[str, Any] | None:
    """JSON data of ``att`` (``None`` for ``None``): arrays inline and exact when
    ``arrays`` is ``None``, else moved into ``arrays`` and referenced by key (see the
    module docstring)."""
    if att is None:
        return None
    spec = att.to_dict()
    if arrays is None:
        return tag_arrays(spec)
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if isinstance(value, np.ndarray):
            arrays[f"{prefix}{key}"] = value
            out[key] = {"array": f"{prefix}{key}"}
        elif isinstance(value, dict) and "layers" in value:  # Layers table
            arrays[f"{prefix}{key}__layers"] = value["layers"]
            out[key] = {"layers": f"{prefix}{key}__layers",
                        "layer_time": value["layer_time"], "t0": value["t0"]}
        else:
            out[key] = value
    return out


def attention_from_data(data: Any, arrays: Mapping[str, Any] | Callable[[str], Any] | None = None
                        ) -> Attention | None:
    """Inverse of :func:`attention_data`: ``None`` for ``None`` or an attention that held
    callables (``"serialisable": False``).

    ``arrays`` is ``None`` for the inline layout, else the arrays of the external layout:
    a mapping, or a function ``key -> array`` (which may raise for a missing key).

    Raises
    ------
    ArgumentError, KeyError, TypeError, ValueError
        ``data`` is not a description written by :func:`attention_data`, or describes an
        invalid attention (the constructor's message).
    """
    if data is None or not data.get("serialisable", True):
        return None
    if arrays is None:
        spec = untag_arrays(data)
    else:
        get = arrays if callable(arrays) else arrays.__getitem__
        spec = {}
        for key, value in data.items():
            if isinstance(value, dict) and "array" in value:
                spec[key] = get(value["array"])
            elif isinstance(value, dict) and "layers" in value:
                spec[key] = {"layers": get(value["layers"]),
                             "layer_time": value["layer_time"], "t0": value["t0"]}
            else:
                spec[key] = value
    return Attention.from_dict(spec)


def attention_to_json(att: Attention | None) -> str:
    """Exact JSON text of ``att`` in the inline layout (``"null"`` for ``None``)."""
    return dumps(attention_data(att))


def attention_from_json(text: str) -> Attention | None:
    """Inverse of :func:`attention_to_json` (``None`` for ``"null"`` or an attention that
    held callables)."""
    return attention_from_data(json.loads(text))
