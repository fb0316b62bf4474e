"""The checksum module every writer of the package uses: digests tell arrays apart exactly,
NPZ archives written with their digests reject every edit."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transformer_pde.errors import IntegrityError, TrajectoryFileError
from transformer_pde.io.container import NPZ_CHECKSUMS, load_npz, save_npz
from transformer_pde.io.digests import array_digest, json_digest, verify_array


def test_digest_sees_dtype_shape_and_every_bit():
    a = np.arange(6.0)
    assert array_digest(a) == array_digest(a.copy())
    assert array_digest(a) != array_digest(a.reshape(2, 3))
    assert array_digest(a) != array_digest(a.astype(np.float32))
    assert array_digest(a) != array_digest(a.astype(">f8"))
    b = a.copy()
    b.view(np.uint64)[3] ^= 1  # the last bit of one element
    assert array_digest(a) != array_digest(b)
    # -0.0 and 0.0 compare equal but are different data
    assert array_digest(np.array([0.0])) != array_digest(np.array([-0.0]))
    assert array_digest(None) != array_digest(np.array([]))
    # a non-contiguous view is digested by its values, like its copy
    assert array_digest(np.arange(10.0)[::2]) == array_digest(np.arange(10.0)[::2].copy())
    with pytest.raises(TypeError, match="object"):
        array_digest(np.array([None, 1], dtype=object))


def test_verify_names_the_array_and_the_source():
    a = np.ones(3)
    assert verify_array(a, array_digest(a), what="x", source="f.npz") is a
    with pytest.raises(IntegrityError, match=r"f\.npz: array 'x' does not match"):
        verify_array(a * 1.001, array_digest(a), what="x", source="f.npz")
    with pytest.raises(IntegrityError, match="no valid checksum"):
        verify_array(a, None, what="x", source="f.npz")
    assert issubclass(IntegrityError, TrajectoryFileError)


def test_json_digest_is_canonical():
    assert json_digest({"a": 1, "b": [1.5, "x"]}) == json_digest({"b": [1.5, "x"], "a": 1})
    assert json_digest({"a": 1}) != json_digest({"a": 1.0000000001})


def _arrays():
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(5, 3)), "n": np.arange(4), "s": np.array(["ok", "blowup"]),
            "f32": rng.normal(size=7).astype(np.float32)}


def test_npz_round_trip_is_exact_and_readable_by_numpy(tmp_path):
    arrays = _arrays()
    path = save_npz(tmp_path / "a.npz", arrays)
    back = load_npz(path)
    assert sorted(back) == sorted(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype
        np.testing.assert_array_equal(back[k], v)
    with np.load(path) as z:  # a plain NumPy reader sees the same arrays plus the record
        assert set(z.files) == {*arrays, NPZ_CHECKSUMS}
    assert not list(tmp_path.glob(".*partial"))


def _rewrite(path, tmp_path, edit):
    """Copy the archive with ``edit(name, array) -> array or None`` (None drops it)."""
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files}
    out = {}
    for k, v in entries.items():
        new = edit(k, v)
        if new is not None:
            out[k] = new
    dst = tmp_path / "edited.npz"
    np.savez(dst, **out)
    return dst


@pytest.mark.parametrize("edit,words", [
    (lambda k, v: v * 1.001 if k == "x" else v, "'x' does not match"),
    (lambda k, v: None if k == "n" else v, "missing or not recorded"),
    (lambda k, v: None if k == NPZ_CHECKSUMS else v, "no checksums"),
    (lambda k, v: v.astype(np.float64) if k == "f32" else v, "'f32' does not match"),
    (lambda k, v: np.array(json.dumps({"algorithm": "md5", "arrays": {}}))
     if k == NPZ_CHECKSUMS else v, "unknown checksum record"),
])
def test_npz_edits_are_refused(tmp_path, edit, words):
    path = save_npz(tmp_path / "a.npz", _arrays())
    with pytest.raises(IntegrityError, match=words):
        load_npz(_rewrite(path, tmp_path, edit))


def test_npz_extra_array_is_refused(tmp_path):
    path = save_npz(tmp_path / "a.npz", _arrays())
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files}
    np.savez(tmp_path / "b.npz", **entries, y=np.zeros(2))
    with pytest.raises(IntegrityError, match="missing or not recorded"):
        load_npz(tmp_path / "b.npz")


def test_npz_reserved_name_and_failed_write(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        save_npz(tmp_path / "a.npz", {NPZ_CHECKSUMS: np.zeros(1)})
    with pytest.raises(TypeError, match="object"):  # objects cannot be digested: nothing written
        save_npz(tmp_path / "b.npz", {"o": np.array([{}, 1], dtype=object)})
    assert list(tmp_path.iterdir()) == []


@given(data=st.data())
def test_npz_damage_is_an_error_or_the_same_data(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    arrays = _arrays()
    raw = bytearray(save_npz(tmp / "a.npz", arrays).read_bytes())
    how = data.draw(st.sampled_from(["flip", "truncate"]))
    if how == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= 1 << data.draw(st.integers(0, 7))
    else:
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    (tmp / "b.npz").write_bytes(bytes(raw))
    try:
        back = load_npz(tmp / "b.npz")
    except IntegrityError:
        return
    assert sorted(back) == sorted(arrays)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes()


def test_not_an_archive(tmp_path):
    (tmp_path / "c.npz").write_text("hello")
    with pytest.raises(IntegrityError, match="not a readable NPZ"):
        load_npz(tmp_path / "c.npz")
    with pytest.raises(IntegrityError, match="not a readable NPZ"):
        load_npz(tmp_path / "missing.npz")
