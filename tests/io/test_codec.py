"""The one attention codec and the one JSON encoding: every attention (heads, tables,
biases) round-trips exactly in both layouts, the layouts are those of the files written
before (fixed text), and JSON data never becomes an arbitrary string."""

from __future__ import annotations

import enum
import json
from pathlib import Path

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.io import (attention_data, attention_fields, attention_from_data,
                                attention_from_json, attention_to_json, canonical, dumps,
                                json_digest, tag_arrays, untag_arrays)

RNG = np.random.default_rng(3)
I4 = np.eye(4)


def _attentions():
    return {
        "plain": tp.Attention("softmax", I4, I4, -I4, beta=0.3),
        "heads": tp.Attention("softmax", RNG.normal(size=(4, 4)), RNG.normal(size=(4, 4)),
                              I4, heads=2, masked=True, W_O=RNG.normal(size=(4, 4))),
        "layers": tp.Attention("l2", tp.Layers(RNG.normal(size=(3, 4, 4)), layer_time=0.25,
                                                t0=0.1), I4, I4, l2_beta=0.7),
        "bias": tp.Attention("softmax", I4, I4, I4, b_Q=RNG.normal(size=4), b_O=np.ones(4)),
        "sinkhorn": tp.Attention("sinkhorn", I4, I4, I4, eps=0.2),
    }


def _same(a, b):
    da, db = a.to_dict(), b.to_dict()
    assert da.keys() == db.keys()
    for k in da:
        x, y = da[k], db[k]
        if isinstance(x, dict):
            assert np.array_equal(x["layers"], y["layers"]) and x["layers"].dtype == y["layers"].dtype
            assert (x["layer_time"], x["t0"]) == (y["layer_time"], y["t0"])
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y)
            assert x.tobytes() == y.tobytes()        # -0.0 and every bit kept
        else:
            assert x == y


@pytest.mark.parametrize("name", sorted(_attentions()))
def test_both_layouts_round_trip_exactly(name):
    att = _attentions()[name]
    _same(attention_from_json(attention_to_json(att)), att)
    arrays: dict = {}
    data = attention_data(att, arrays)
    json.dumps(data)                                 # plain JSON data, arrays moved out
    assert all(isinstance(v, np.ndarray) for v in arrays.values())
    _same(attention_from_data(json.loads(json.dumps(data)), arrays), att)
    _same(attention_from_data(data, arrays.__getitem__), att)


def test_layouts_are_the_file_formats():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), -np.eye(2), beta=0.5)
    assert attention_to_json(att) == (
        '{"kind": "softmax", "heads": 1, "masked": false, "beta": 0.5, "eps": 1.0, '
        '"l2_beta": 0.5, "serialisable": true, "Q": {"__ndarray__": [[1.0, 0.0], [0.0, 1.0]], '
        '"dtype": "<f8", "shape": [2, 2]}, "K": {"__ndarray__": [[1.0, 0.0], [0.0, 1.0]], '
        '"dtype": "<f8", "shape": [2, 2]}, "V": {"__ndarray__": [[-1.0, -0.0], [-0.0, -1.0]], '
        '"dtype": "<f8", "shape": [2, 2]}, "W_O": null}')
    arrays: dict = {}
    tab = tp.Attention("l2", tp.Layers(np.ones((2, 2, 2)), layer_time=0.5), np.eye(2), np.eye(2))
    data = attention_data(tab, arrays)
    assert data["Q"] == {"layers": "att__Q__layers", "layer_time": 0.5, "t0": 0.0}
    assert data["K"] == {"array": "att__K"} and data["W_O"] is None
    assert sorted(arrays) == ["att__K", "att__Q__layers", "att__V"]


def test_callables_are_described_not_rebuilt():
    att = tp.Attention("softmax", lambda t: I4, I4, I4)
    assert attention_from_json(attention_to_json(att)) is None
    arrays: dict = {}
    assert attention_from_data(attention_data(att, arrays), arrays) is None
    assert attention_data(None) is None and attention_from_json("null") is None
    fields = attention_fields(att)
    assert callable(fields["Q"]) and "serialisable" not in fields
    assert "b_Q" not in fields                       # absent biases are not fields


def test_json_data_mode_converts_and_refuses():
    class Colour(enum.Enum):
        RED = "red"

    text = dumps({"i": np.int64(3), "f": np.float32(0.1), "a": np.arange(2), "p": Path("x/y"),
                  "e": Colour.RED, "s": tp.Status.OK})
    assert json.loads(text) == {"i": 3, "f": float(np.float32(0.1)), "a": [0, 1], "p": "x/y",
                                "e": "red", "s": "ok"}
    with pytest.raises(TypeError, match="object"):
        dumps({"x": object()})


def test_description_mode_and_canonical_text_are_fixed():
    # the fingerprint text of studies and checksums: objects by str, as in files written before
    assert dumps({"b": np.int64(3), "a": 1}, sort_keys=True, describe=True) == '{"a": 1, "b": "3"}'
    assert canonical({"b": [1.5, np.float32(0.25)], "a": None}) == '{"a":null,"b":[1.5,"0.25"]}'
    assert json_digest({"a": 1, "b": [1.5, "x"]}) == json_digest({"b": [1.5, "x"], "a": 1})


def test_tagged_arrays_keep_dtype_shape_and_bits():
    value = {"x": np.array([[-0.0, 1e-310]], dtype=np.float64), "y": [np.float32(1.5)],
             "z": np.zeros((0, 3), dtype=np.int16)}
    back = untag_arrays(json.loads(json.dumps(tag_arrays(value))))
    assert back["x"].tobytes() == value["x"].tobytes() and back["x"].dtype == np.float64
    assert back["y"] == [1.5]
    assert back["z"].shape == (0, 3) and back["z"].dtype == np.int16


def test_strict_json_nonfinite_null_and_tagged_values_exact():
    from transformer_pde.io.jsonfmt import dumps, tag_arrays, untag_arrays

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard {c}"))

    value = {"t": np.inf, "x": [1.0, float("nan")], "a": np.array([1.0, -np.inf], np.float32)}
    assert strict(dumps(value, strict=True)) == {"t": None, "x": [1.0, None], "a": [1.0, None]}
    back = untag_arrays(strict(dumps(tag_arrays(value), strict=True)))
    assert back["t"] == np.inf and np.isnan(back["x"][1])
    assert back["a"].dtype == np.float32 and back["a"].tolist() == [1.0, -np.inf]
    # without strict: Python's extension, as before (internal metadata keeps its bytes)
    assert dumps({"t": np.inf}) == '{"t": Infinity}'
