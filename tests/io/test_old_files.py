"""Files written by the previous layout (commit c9033c2: the run information as one JSON
attribute, dimensions ``dim``/``dim_``, no CF global attributes, a study fingerprint of JSON
inside JSON inside JSON) still load, with the arrays and metadata they were written with.

The files are in ``tests/data/files_c9033c2`` (made by ``tests/data/make_old_files.py``
with that commit); ``expected.npz`` holds what the old writer was given, so every
comparison here is exact (``np.array_equal`` on float64: no tolerance, the files store
the bits).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.io import labelled, untag_arrays

pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

DATA = Path(__file__).resolve().parents[1] / "data" / "files_c9033c2"


@pytest.fixture(scope="module")
def expected():
    with np.load(DATA / "expected.npz") as z:
        out = {k: z[k] for k in z.files}
    out["text"] = json.loads(str(out["text"]))
    return out


@pytest.mark.parametrize("name", ["particles.nc", "particles.npz"])
def test_old_particle_files_load_with_their_arrays_and_metadata(name, expected):
    traj = tp.load(DATA / name)
    text = expected["text"]["particles"]
    for got, want in ((traj.states, expected["states"]), (traj.times, expected["times"]),
                      (traj.weights, expected["weights"])):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert str(traj.status) == text["status"] and traj.message == text["message"]
    assert dict(traj.info) == untag_arrays(text["info"])
    assert tp.io.attention_to_json(traj.attention) == text["attention"]


def test_old_statistic_file_loads_its_moments_and_values(expected):
    traj = tp.load(DATA / "statistic.nc")
    for got, key in ((traj.last, "stats_last"), (traj.times, "stats_times"),
                     (traj.saved_means, "stats_means"), (traj.saved_covs, "stats_covs"),
                     (traj.values, "stats_values")):
        assert np.array_equal(got, expected[key]), key
    text = expected["text"]["statistic"]
    assert str(traj.status) == text["status"] and dict(traj.info) == untag_arrays(text["info"])


def test_old_gaussian_file_opens_verified(expected):
    ds = labelled.open_dataset(DATA / "gaussian.nc")
    assert ds["covs"].dims == ("time", "dim", "dim_")   # the old names, kept as written
    for name in ("means", "covs", "limit"):
        assert np.array_equal(ds[name].values, expected[f"gauss_{name}"]), name
    assert np.array_equal(ds["time"].values, expected["gauss_times"])
    text = expected["text"]["gaussian"]
    assert ds.attrs["status"] == text["status"] and ds.attrs["message"] == text["message"]
    assert float(ds.attrs["t_final"]) == text["t_final"]


def test_old_study_store_opens_and_resumes_with_a_structured_fingerprint(tmp_path, expected):
    """A store of the previous layout (format 2) is read with its values, and resumed by
    the same study: its fingerprint is compared as data (the JSON texts inside it decoded),
    and the resume rewrites it in the new layout (format 3, one level of JSON)."""
    from transformer_pde import sweep
    from transformer_pde.sweep.cells import ConePathCell

    store = tmp_path / "cone.zarr"
    shutil.copytree(DATA / "cone.zarr", store)
    old = sweep.open_results(store)
    for name in old.data_vars:
        assert np.array_equal(old[name].values, expected[f"cone_{name}"], equal_nan=True), name
    att = tp.Attention("softmax", Q=np.eye(2), K=np.eye(2),
                       V=np.array([[1.0, 0.2], [0.0, 0.5]]))
    label = expected["text"]["cone"]["label"]
    cell = ConePathCell(att, (((1.0, 0.0), (0.0, 1.0)), ((2.0, 0.1), (0.1, 0.5))), 0.5, 3,
                        (), label)
    study = sweep.Study(sweep.Grid({"run": [0, 1]}, draws=1), cell, name="cone")
    ds = sweep.run(study, store=store, resume=True, scheduler="serial", progress=False)
    for name in old.data_vars:   # nothing recomputed, nothing changed
        assert np.array_equal(ds[name].values, old[name].values, equal_nan=True), name
    new = sweep.open_results(store)
    assert json.loads(new.attrs["transformer_pde_study"])["version"] == 3
    fp = json.loads(new.attrs["fingerprint"])
    assert isinstance(fp["cell"], dict) and isinstance(fp["cell"]["attention"], dict)
    assert fp == sweep.study.structured(json.loads(expected["text"]["cone"]["fingerprint"]))
    assert new.attrs["Conventions"] == labelled.CF_CONVENTIONS
    assert "transformer-pde" in new.attrs["history"]
