"""Integrity of every file the library writes: checksums, invariants, format versions,
atomic saves, sweep-store cell digests, and the ``SaveAt(fn)`` contract."""

import json
import os
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_pde as tp
from transformer_pde import sweep
from transformer_pde.io import codec, labelled
from transformer_pde.errors import (ArgumentError, IntegrityError, IntegrityWarning,
                                    TrajectoryFileError)
from transformer_pde.io.digests import array_digest
from transformer_pde.particles import NPZ_FORMAT_VERSION, ParticleTrajectory, SaveAt
from transformer_pde.sweep.store import DIGEST_VAR, StoreError, StoreIntegrityError

import sweep_cells

SUFFIXES = ("npz", "nc", "zarr")


# ------------------------------------------------------------------------- helpers
def _traj(kind="states", message="fine", status="ok", dtype=np.float64):
    rng = np.random.default_rng(5)
    att = tp.Attention("softmax", np.eye(2), 0.5 * np.eye(2), np.eye(2))
    times = np.linspace(0.0, 1.0, 4)
    w = rng.uniform(0.5, 1.5, 7)
    w = w / w.sum()
    states = rng.normal(size=(4, 7, 2)).astype(dtype)
    if kind == "states":
        return ParticleTrajectory(times, states, w, None, status, message, attention=att,
                                  info={"method": "rk4", "n_steps": 3})
    if kind == "masked":
        pos = np.linspace(0.0, 1.0, 7)
        return ParticleTrajectory(times, states, w, pos, status, message, info={"k": [1, 2]})
    # a saved statistic instead of the states; values hold NaN with a non-default payload
    values = np.array([1.0, 2.0, np.nan, -np.inf])
    values[2] = np.frombuffer(np.uint64(0x7FF8_0000_0000_1234).tobytes(), np.float64)[0]
    from transformer_pde.particles import weighted_moments
    m, c = weighted_moments(states, w)
    return ParticleTrajectory(times, None, w, None, status, message, attention=att,
                              values=values, last=states[-1], saved_means=m, saved_covs=c)


def _fingerprint(tr):
    """Everything a trajectory holds, arrays as exact digests (dtype, shape, bytes)."""
    def d(a):
        return None if a is None else array_digest(np.asarray(a))
    return (d(tr.times), d(tr.states), d(tr.weights), d(tr.positions), d(tr.last),
            d(tr.values), d(tr.saved_means), d(tr.saved_covs), str(tr.status), tr.message,
            json.dumps(tr.info, sort_keys=True, default=str),
            codec.attention_to_json(tr.attention))


def _write_legacy_npz(path, *, version=2, status="ok", **arrays):
    """An NPZ as the version without checksums wrote it (meta version 2, no digests)."""
    meta = {"format": "transformer-pde-trajectory", "version": version, "status": status,
            "message": "", "info": {}, "attention": None}
    with open(path, "wb") as fh:
        np.savez(fh, meta=np.array(json.dumps(meta)), **arrays)
    return path


def _good_arrays(n=5, T=3):
    rng = np.random.default_rng(1)
    return {"times": np.linspace(0.0, 1.0, T), "weights": np.full(n, 1.0 / n),
            "states": rng.normal(size=(T, n, 2))}


# ------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("kind", ["states", "masked", "fn"])
def test_save_load_is_bit_exact_and_versioned(tmp_path, suffix, kind):
    tr = _traj(kind, message="nul \x00 and surrogate \ud800 and é")
    path = tr.save(tmp_path / f"t.{suffix}")
    back = tp.load(path)
    assert _fingerprint(back) == _fingerprint(tr)
    assert sorted(os.listdir(tmp_path)) == [f"t.{suffix}"]  # no temporary left beside it
    if suffix == "npz":
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
        assert meta["version"] == NPZ_FORMAT_VERSION == 3
        assert set(meta["checksums"]) == set(z.files) - {"meta", "meta_checksum"}
    else:
        ds = labelled.open_dataset(path)
        assert ds.attrs["format_version"] == labelled.DATASET_FORMAT_VERSION == 3
        assert set(json.loads(ds.attrs["checksums"])["arrays"]) == set(map(str, ds.variables))


def test_float32_states_round_trip(tmp_path):
    tr = _traj(dtype=np.float32)
    for suffix in SUFFIXES:
        back = tp.load(tr.save(tmp_path / f"t.{suffix}"))
        assert back.states.dtype == np.float32 and _fingerprint(back) == _fingerprint(tr)


def test_nul_message_saves_to_netcdf_and_a_failed_save_leaves_nothing(tmp_path, monkeypatch):
    import xarray as xr

    tr = _traj(message="a\x00b")
    real = xr.Dataset.to_netcdf

    def broken(self, path, *a, **k):
        real(self, path, *a, **k)  # the file exists, then the writer fails
        raise OSError("disk full")

    monkeypatch.setattr(xr.Dataset, "to_netcdf", broken)
    with pytest.raises(OSError, match="disk full"):
        tr.save(tmp_path / "t.nc")
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(xr.Dataset, "to_netcdf", real)
    assert tp.load(tr.save(tmp_path / "t.nc")).message == "a\x00b"
    assert os.listdir(tmp_path) == ["t.nc"]


@pytest.mark.parametrize("suffix", ["zarr", "npz"])
def test_failed_save_leaves_nothing_zarr_npz(tmp_path, monkeypatch, suffix):
    import xarray as xr

    tr = _traj()
    if suffix == "zarr":
        real = xr.Dataset.to_zarr

        def broken(self, store, *a, **k):
            real(self, store, *a, **k)
            raise OSError("disk full")
        monkeypatch.setattr(xr.Dataset, "to_zarr", broken)
    else:
        real = np.savez

        def broken(fh, **arrays):
            real(fh, **arrays)
            raise OSError("disk full")
        monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        tr.save(tmp_path / f"t.{suffix}")
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    assert _fingerprint(tp.load(tr.save(tmp_path / f"t.{suffix}"))) == _fingerprint(tr)


def test_save_refuses_a_trajectory_that_load_would_refuse(tmp_path):
    tr = _traj()
    tr.weights = tr.weights * 2
    with pytest.raises(ArgumentError, match="weights"):
        tr.save(tmp_path / "t.npz")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------- checksums
def test_npz_edited_array_is_an_integrity_error_naming_it(tmp_path):
    path = _traj().save(tmp_path / "t.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["states"] = arrays["states"].copy()
    arrays["states"][1, 2, 0] = np.nextafter(arrays["states"][1, 2, 0], np.inf)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(IntegrityError, match=r"t\.npz.*'states'.*checksum"):
        tp.load(path)
    # an array added or removed is refused too
    arrays["states"] = _traj().states
    arrays["extra"] = np.zeros(2)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(IntegrityError, match="'extra' has no checksum"):
        tp.load(path)
    del arrays["extra"], arrays["weights"]
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(IntegrityError, match="'weights' is missing"):
        tp.load(path)


def test_npz_edited_metadata_is_an_integrity_error(tmp_path):
    path = _traj().save(tmp_path / "t.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(str(arrays["meta"]))
    meta["message"] = "edited"
    arrays["meta"] = np.array(json.dumps(meta))
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(IntegrityError, match="'meta'"):
        tp.load(path)


def test_netcdf_flipped_byte_in_states_is_an_integrity_error(tmp_path):
    tr = _traj()
    path = tr.save(tmp_path / "t.nc")
    raw = bytearray(path.read_bytes())
    at = raw.find(tr.states.tobytes())
    assert at > 0  # stored contiguous and uncompressed
    raw[at + 13] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match=r"t\.nc.*'states'.*checksum"):
        tp.load(path)


def test_zarr_deleted_or_corrupt_chunk_is_refused(tmp_path):
    tr = _traj()
    path = tr.save(tmp_path / "t.zarr")
    chunk = next(p for p in (path / "states").iterdir() if not p.name.startswith("."))
    saved = chunk.read_bytes()
    chunk.unlink()
    with pytest.raises(IntegrityError, match="'states'"):
        tp.load(path)
    raw = bytearray(saved)
    raw[-5] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    with pytest.raises(TrajectoryFileError, match="t.zarr"):
        tp.load(path)
    chunk.write_bytes(saved)
    assert _fingerprint(tp.load(path)) == _fingerprint(tr)


@pytest.mark.parametrize("suffix", ["nc", "zarr"])
def test_labelled_edited_attributes_and_unknown_version(tmp_path, suffix):
    import xarray as xr

    tr = _traj()
    path = tr.save(tmp_path / f"a.{suffix}")
    ds = labelled.open_dataset(path)
    for attr, value, match in (("message", "edited", "attributes"),
                               ("format_version", 7, "unknown format version 7"),
                               ("checksums", "{", "'checksums' attribute")):
        bad = ds.copy()
        bad.attrs = {**ds.attrs, attr: value}
        out = tmp_path / f"{attr}.{suffix}"
        if suffix == "nc":
            bad.to_netcdf(out, engine="h5netcdf")
        else:
            bad.to_zarr(out, zarr_format=2, consolidated=False)
        with pytest.raises(IntegrityError, match=match):
            tp.load(out)
    assert isinstance(xr.Dataset, type)


# ------------------------------------------------------------------------- legacy files
def test_legacy_npz_without_checksums_loads(tmp_path):
    a = _good_arrays()
    for version in (1, 2):
        back = tp.load(_write_legacy_npz(tmp_path / f"v{version}.npz", version=version, **a))
        assert np.array_equal(back.states, a["states"]) and back.status == "ok"


def test_legacy_labelled_files_load(tmp_path):
    tr = _traj()
    ds = labelled.particle_dataset(tr)
    ds.attrs.pop("message_json", None)
    ds.to_netcdf(tmp_path / "old.nc", engine="h5netcdf")
    ds.to_zarr(tmp_path / "old.zarr", zarr_format=2, consolidated=False)
    for name in ("old.nc", "old.zarr"):
        assert _fingerprint(tp.load(tmp_path / name)) == _fingerprint(tr)


@pytest.mark.parametrize("version", [0, 4, 99, "2", None, True])
def test_unknown_npz_version_is_refused(tmp_path, version):
    path = _write_legacy_npz(tmp_path / "t.npz", version=version, **_good_arrays())
    with pytest.raises(IntegrityError, match="unknown trajectory format version"):
        tp.load(path)


# ------------------------------------------------------------------------- invariants
def _edit(arrays, name, fn):
    out = dict(arrays)
    out[name] = fn(np.array(arrays[name]))
    return out


def _set(a, idx, v):
    a[idx] = v
    return a


INVALID = [
    ("weights", lambda w: _set(w, 0, -w[0]), "negative"),
    ("weights", lambda w: w * 1.5, "sums to"),
    ("weights", lambda w: w * (1 + 1e-10), "sums to"),
    ("weights", lambda w: _set(w, 1, np.nan), "NaN"),
    ("times", lambda t: t[::-1].copy(), "strictly increasing"),
    ("times", lambda t: _set(t, 1, t[0]), "strictly increasing"),
    ("times", lambda t: _set(t, 2, np.nan), "NaN"),
    ("times", lambda t: t.astype(np.float32), "float64"),
    ("states", lambda s: _set(s, (1, 1, 1), np.nan), "NaN"),
    ("states", lambda s: s.astype(np.int64), "int64"),
    ("states", lambda s: s.astype(np.float16), "float16"),
    ("positions", lambda p: _set(p, 0, 1.5), r"outside \[0, 1\]"),
    ("positions", lambda p: _set(p, 0, -1e-300), r"outside \[0, 1\]"),
]


@pytest.mark.parametrize("name, edit, match", INVALID)
def test_invariants_are_checked_on_load(tmp_path, name, edit, match):
    arrays = {**_good_arrays(), "positions": np.linspace(0.0, 1.0, 5)}
    path = _write_legacy_npz(tmp_path / "t.npz", **_edit(arrays, name, edit))
    with pytest.raises(IntegrityError, match=f"'{name}'.*{match}|{match}.*'{name}'"):
        tp.load(path)
    # the same edit in a legacy netCDF file
    tr = ParticleTrajectory(**{k: v for k, v in arrays.items()}, status="ok", message="")
    ds = labelled.particle_dataset(tr)
    if name == "times":
        ds = ds.assign_coords(time=edit(np.array(arrays["times"])))
    else:
        ds[name] = (ds[name].dims, edit(np.array(arrays[name])))
    ds.to_netcdf(tmp_path / "t.nc", engine="h5netcdf")
    with pytest.raises(IntegrityError, match=name):
        tp.load(tmp_path / "t.nc")


def test_valid_edge_cases_load(tmp_path):
    a = _good_arrays()
    # normalised to rounding: sum off by a few ulps
    w = np.full(7, 1 / 7)
    assert np.sum(w) != 1.0 or True
    a.update(weights=w, states=np.zeros((3, 7, 2)))
    tp.load(_write_legacy_npz(tmp_path / "a.npz", **a))
    # a single saved time; weights with zeros
    one = {"times": np.array([0.0]), "weights": np.array([0.0, 1.0]),
           "states": np.zeros((1, 2, 3), np.float32)}
    tp.load(_write_legacy_npz(tmp_path / "b.npz", **one))


def test_nan_states_rule_follows_the_status(tmp_path):
    a = _edit(_good_arrays(), "states", lambda s: _set(s, (2, 0, 0), np.nan))
    for status in ("ok", "blowup", "converged", "diverging"):
        with pytest.raises(IntegrityError, match="'states'.*NaN.*status"):
            tp.load(_write_legacy_npz(tmp_path / f"{status}.npz", status=status, **a))
    for status in ("nonfinite", "failed", "max_steps", "interrupted"):
        back = tp.load(_write_legacy_npz(tmp_path / f"{status}.npz", status=status, **a))
        assert np.isnan(back.states[2, 0, 0])


def test_simulated_runs_satisfy_the_rule_nonfinite_keeps_finite_states(tmp_path):
    # a run that ends 'nonfinite' keeps only finite states: the rule never refuses a real run
    att = tp.Attention("softmax", np.eye(2), np.zeros((2, 2)), 50.0 * np.eye(2))
    X0 = np.random.default_rng(0).normal(size=(6, 2)) + 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = tp.simulate(att, X0, t_max=400.0, dt=1.0, solver="euler",
                         field=tp.FieldOptions(backend="numpy"),
                         limits=tp.Limits(max_norm=float(np.finfo(float).max)))
    assert tr.status == "nonfinite" and len(tr.times) > 100
    assert np.isfinite(tr.states).all()
    assert _fingerprint(tp.load(tr.save(tmp_path / "r.npz"))) == _fingerprint(tr)


# ------------------------------------------------------------------------- SaveAt(fn)
def _run(fn, t_max=0.3):
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    X0 = np.random.default_rng(0).normal(size=(8, 2))
    return tp.simulate(att, X0, t_max=t_max, dt=0.1, saveat=SaveAt(fn=fn),
                       field=tp.FieldOptions(backend="numpy"))


@pytest.mark.parametrize("ret, match", [(None, "NoneType"), ("abc", "str"), ({"a": 1}, "dict"),
                                        (np.array([object()]), "object"), (1 + 2j, "complex"),
                                        ([1, "a"], "<U")])
def test_saveat_fn_must_return_a_real_numeric_array(ret, match):
    with pytest.raises(ArgumentError, match=rf"SaveAt\(fn=\.\.\.\)(.|\n)*{match}"):
        _run(lambda t, X, w: ret)


def test_saveat_fn_cannot_change_the_run_in_place():
    ref = _run(lambda t, X, w: X.mean(axis=0))

    def centring(t, X, w):
        X -= X.mean(axis=0)
        return X.mean(axis=0)

    with pytest.raises(ArgumentError, match="in place"):
        _run(centring)

    def weighting(t, X, w):
        w[0] = 0.5
        return 0.0

    with pytest.raises(ArgumentError, match="in place"):
        _run(weighting)
    again = _run(lambda t, X, w: X.mean(axis=0))
    assert np.array_equal(ref.values, again.values) and np.array_equal(ref.last, again.last)


def test_saveat_fn_bad_later_value_fails_the_run_and_keeps_earlier_saves():
    calls = []

    def fn(t, X, w):
        calls.append(t)
        return None if len(calls) == 3 else np.float64(len(calls))

    with pytest.warns(tp.errors.EarlyStopWarning):
        tr = _run(fn)
    assert tr.status == "failed" and "SaveAt(fn=...)" in tr.message and "None" in tr.message
    assert list(tr.values) == [1.0, 2.0] and len(tr.times) == 2
    assert np.dtype(tr.values.dtype).kind == "f"


def test_saveat_fn_bool_and_int_values_round_trip(tmp_path):
    tr = _run(lambda t, X, w: X[:, 0] > 0)
    assert tr.values.dtype == bool
    for suffix in SUFFIXES:
        back = tp.load(tr.save(tmp_path / f"b.{suffix}"))
        assert _fingerprint(back) == _fingerprint(tr)


# ------------------------------------------------------------------------- sweep store
def _study():
    return sweep.Study(sweep.Grid({"mu": [0.0, 1.0, 2.0]}, draws=4, seed=3),
                       sweep_cells.noisy_mean,
                       outputs={"mean": sweep.Output(), "head": sweep.Output((3,)),
                                "count": sweep.Output((), "int64")})


def _chunks(var_dir):
    return sorted(p for p in Path(var_dir).iterdir() if not p.name.startswith("."))


def test_store_damaged_chunk_is_refused_on_open_and_recomputed_on_resume(tmp_path):
    path = tmp_path / "s.zarr"
    ref = sweep.run(_study(), path, scheduler="serial", progress=False)
    assert DIGEST_VAR not in ref and DIGEST_VAR not in sweep.open_results(path)
    for var, damage in (("mean", "delete"), ("head", "flip"), (DIGEST_VAR, "delete")):
        chunk = _chunks(path / var)[0]
        if damage == "delete":
            chunk.unlink()
        else:
            # an edit that decodes fine: rewrite the array with one value changed
            import zarr
            arr = zarr.open_group(str(path), mode="r+", zarr_format=2)[var]
            v = arr[...]
            v[1, 2, 0] += 1.0
            arr[...] = v
        with pytest.raises(StoreIntegrityError, match=r"s\.zarr: cell \d+ \(mu=.*draw=\d+\)"):
            sweep.open_results(path)
        assert isinstance(StoreIntegrityError("x"), (StoreError, IntegrityError))
        damaged = sweep.open_results(path, verify=False)
        assert (damaged["cell_status"].values == sweep.DONE).all()
        with pytest.warns(IntegrityWarning, match="failed their checksum"):
            ds = sweep.run(_study(), path, scheduler="serial", resume=True, progress=False)
        for name in ("mean", "head", "count", "cell_status"):
            assert ds[name].equals(ref[name]), name
            assert sweep.open_results(path)[name].equals(ref[name]), name


def test_store_single_cell_is_identified(tmp_path):
    import zarr

    path = tmp_path / "s.zarr"
    sweep.run(_study(), path, scheduler="serial", progress=False)
    arr = zarr.open_group(str(path), mode="r+", zarr_format=2)["count"]
    v = arr[...]
    v[2, 1] += 1
    arr[...] = v
    with pytest.raises(StoreIntegrityError, match=r"cell 9 \(mu=2\.0, draw=1\).*1 cell\(s\)"):
        sweep.open_results(path)


def test_store_unknown_or_old_version(tmp_path):
    import zarr

    path = tmp_path / "s.zarr"
    sweep.run(_study(), path, scheduler="serial", progress=False)
    g = zarr.open_group(str(path), mode="r+", zarr_format=2)
    g.attrs["transformer_pde_study"] = json.dumps({"format": "transformer-pde-study",
                                                   "version": 9})
    with pytest.raises(StoreIntegrityError, match="unknown results-store format version 9"):
        sweep.open_results(path)
    g.attrs["transformer_pde_study"] = json.dumps({"format": "transformer-pde-study",
                                                   "version": 1})
    # version 1 has no digests: a store that carries them under version 1 was edited
    with pytest.raises(StoreIntegrityError, match="format version 1, but carries"):
        sweep.open_results(path)
    # a version-1 store as that version wrote it (no cell_digest) opens, unverified
    shutil.rmtree(path / DIGEST_VAR)
    assert (sweep.open_results(path)["cell_status"].values == sweep.DONE).all()
    with pytest.raises(StoreError, match="cannot be resumed"):
        sweep.run(_study(), path, scheduler="serial", resume=True, progress=False)


# ------------------------------------------------------------------------- fuzzing
def _saved(tmp_path_factory, suffix, kind):
    d = tmp_path_factory.mktemp("orig")
    tr = _traj(kind)
    return tr, tr.save(d / f"t.{suffix}")


def _load_or_error(path):
    try:
        return tp.load(path)
    except TrajectoryFileError:
        return None


@pytest.mark.parametrize("suffix", ["npz", "nc"])
@pytest.mark.parametrize("kind", ["states", "fn"])
def test_fuzz_flipped_byte_or_truncation_never_gives_different_data(tmp_path_factory, suffix,
                                                                    kind):
    tr, orig = _saved(tmp_path_factory, suffix, kind)
    raw = orig.read_bytes()
    want = _fingerprint(tr)
    work = tmp_path_factory.mktemp("fuzz")

    # half of the flips land in the bytes of the largest array (found in the file: NPZ
    # members are stored, small netCDF variables contiguous), the rest anywhere
    payload = (tr.states if tr.states is not None else tr.saved_covs).tobytes()
    at = raw.find(payload)
    assert at >= 0
    offsets = st.one_of(st.integers(0, len(raw) - 1), st.integers(at, at + len(payload) - 1))

    @settings(max_examples=40)
    @given(offset=offsets, bit=st.integers(0, 7), truncate=st.booleans())
    def check(offset, bit, truncate):
        data = bytearray(raw)
        if truncate:
            data = data[:offset]
        else:
            data[offset] ^= 1 << bit
        path = work / f"t.{suffix}"
        path.write_bytes(bytes(data))
        back = _load_or_error(path)
        assert back is None or _fingerprint(back) == want

    check()


@pytest.mark.filterwarnings("ignore::UserWarning")  # zarr on a store with a file deleted
@pytest.mark.parametrize("kind", ["states", "fn"])
def test_fuzz_zarr_damaged_chunk_never_gives_different_data(tmp_path_factory, kind):
    tr, orig = _saved(tmp_path_factory, "zarr", kind)
    files = sorted(p.relative_to(orig) for p in orig.rglob("*") if p.is_file())
    want = _fingerprint(tr)
    work = tmp_path_factory.mktemp("fuzz")

    @settings(max_examples=40)
    @given(which=st.sampled_from(files), action=st.sampled_from(["delete", "flip", "truncate"]),
           where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
    def check(which, action, where, bit):
        path = work / "t.zarr"
        if path.exists():
            shutil.rmtree(path)
        shutil.copytree(orig, path)
        f = path / which
        data = bytearray(f.read_bytes())
        if action == "delete":
            f.unlink()
        elif action == "truncate" or not data:
            f.write_bytes(bytes(data[:int(where * len(data))]))
        else:
            data[int(where * len(data))] ^= 1 << bit
            f.write_bytes(bytes(data))
        back = _load_or_error(path)
        assert back is None or _fingerprint(back) == want

    check()


def test_npz_zip_container_damage_is_a_trajectory_file_error(tmp_path):
    path = _traj().save(tmp_path / "t.npz")
    assert zipfile.is_zipfile(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(TrajectoryFileError):
        tp.load(path)


# ------------------------------------------------------------------ self-describing files
@pytest.mark.parametrize("suffix", ["nc", "zarr"])
def test_labelled_variables_have_cf_attributes_and_zarr_is_consolidated(tmp_path, suffix):
    import json
    import warnings

    import xarray as xr

    tr = _traj()
    path = tr.save(tmp_path / f"a.{suffix}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # open_zarr warns on a store without .zmetadata
        ds = (xr.open_zarr(path) if suffix == "zarr"
              else xr.open_dataset(path, engine="h5netcdf")).load()
    for name in ds.variables:
        assert ds[name].attrs["units"] == "1" and ds[name].attrs["long_name"], name
    assert ds["time"].dtype == np.float64  # "1" is no CF time unit: not decoded
    assert "message_json" not in ds.attrs  # a plain message is written once
    json_names = ds.attrs["json_attributes"].split()
    assert {"attention", "checksums"} <= set(json_names)
    for key in json_names:  # strict JSON attributes
        json.loads(ds.attrs[key], parse_constant=lambda c, k=key: pytest.fail(f"{k}: {c}"))
    assert _fingerprint(tp.load(path)) == _fingerprint(tr)
