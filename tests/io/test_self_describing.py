"""Files that describe themselves: CF global attributes (``Conventions``, ``source`` with the
package version, ``references``, ``history``) on every file the package writes, the run
information as flat attributes (one level of JSON at most) read back exactly, readable
``long_name``\\ s and named dimensions."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import gaussian, sweep
from transformer_pde.io import labelled, read_trajectory
from transformer_pde.io.labelled import (CF_CONVENTIONS, JSON_ATTRIBUTES, info_attributes,
                                         info_from_attributes, package_version, provenance)
from transformer_pde.particles import ParticleTrajectory

pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")
pytest.importorskip("zarr")

#: one history line: UTC time (ISO 8601), package and version, what wrote the file
LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ transformer-pde (\S+) (.+)\Z")

#: run information that a flat attribute must keep exactly: texts (plain, empty, with a NUL
#: or a lone surrogate), int64 limits and a larger int, bools, None, non-finite and tiny
#: floats, NumPy scalars (stored as Python numbers, as before), arrays of several dtypes,
#: nested data, and keys that are not identifiers (kept in the JSON attribute 'info')
INFO = {"method": "rk4", "empty": "", "nul": "a\x00b", "surrogate": "x\udcff",
        "big": 2 ** 63 - 1, "small": -(2 ** 63), "huge": 2 ** 70, "yes": True, "none": None,
        "nan": float("nan"), "inf": float("-inf"), "tiny": 5e-324, "f32": np.float32(0.1),
        "i16": np.int16(-3), "sizes": [3, 4], "arr": np.arange(6, dtype=np.int32).reshape(2, 3),
        "farr": np.array([1.0, np.nan, np.inf]), "nested": {"a": [1, {"b": "c"}]},
        "two words": 1, "é": "accent", "1x": 2.5}


def _traj(info=None):
    rng = np.random.default_rng(5)
    att = tp.Attention("softmax", np.eye(2), 0.5 * np.eye(2), np.eye(2))
    w = np.full(7, 1 / 7)
    return ParticleTrajectory(np.linspace(0.0, 1.0, 4), rng.normal(size=(4, 7, 2)), w, None,
                              "ok", "fine", attention=att, info=info or {"n_steps": 3})


def _same(a, b):
    """Equal as saved data: NaN equal to NaN, NumPy scalars as Python numbers."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(
            a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, np.generic):
        a = a.item()
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _open(path):
    import xarray as xr

    if path.suffix == ".zarr":
        return xr.open_zarr(path).load()
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()


def _check_cf(attrs, made_by):
    assert attrs["Conventions"] == CF_CONVENTIONS
    assert attrs["source"] == f"transformer-pde {package_version()}"
    assert "arXiv:2501.18322" in attrs["references"]
    m = LINE.match(attrs["history"].splitlines()[-1])
    assert m is not None and m.group(1) == package_version() and m.group(2) == made_by


# ------------------------------------------------------------------ global attributes
@pytest.mark.parametrize("suffix", [".nc", ".zarr", ".npz"])
def test_saved_trajectory_records_version_and_history(tmp_path, suffix):
    path = _traj().save(tmp_path / f"t{suffix}")
    if suffix == ".npz":
        with np.load(path) as z:
            attrs = json.loads(str(z["meta"]))
    else:
        attrs = _open(path).attrs
        for name in attrs[JSON_ATTRIBUTES].split():   # one level of JSON: objects, not text
            assert not isinstance(json.loads(attrs[name]), str), name
    _check_cf(attrs, "ParticleTrajectory.save")


def test_gaussian_results_and_cli_outputs_record_what_made_them(tmp_path):
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    g = gaussian.solve(att, np.zeros(2), 0.3 * np.eye(2), t_max=0.5, t_eval=[0.0, 0.5])
    g.save(tmp_path / "g.npz")
    with np.load(tmp_path / "g.npz") as z:
        _check_cf(json.loads(str(z["meta"])), "GaussianTrajectory.save")
    ds = g.to_xarray()
    ds.attrs["command"] = "gaussian"                 # what the CLI's datasets carry
    _check_cf(labelled.open_dataset(labelled.save_dataset(ds, tmp_path / "g.nc")).attrs,
              "transformer-pde gaussian")


def test_history_gets_a_line_per_write():
    first = provenance("one")["history"]
    both = provenance("two", first)["history"].splitlines()
    assert len(both) == 2 and both[0] == first and both[1].endswith(" two")


def test_resaving_an_opened_file_appends_to_its_history(tmp_path):
    path = _traj().save(tmp_path / "a.nc")
    ds = labelled.open_dataset(path)
    again = labelled.open_dataset(labelled.save_dataset(ds, tmp_path / "b.nc"))
    lines = again.attrs["history"].splitlines()
    assert lines[0] == ds.attrs["history"] and lines[1].endswith(" transformer_pde.io.save_dataset")
    assert tp.load(tmp_path / "b.nc").info == tp.load(path).info


def test_study_store_has_cf_attributes_and_one_level_of_json(tmp_path):
    import sweep_cells

    study = sweep.Study(sweep.Grid({"mu": [0.0, 1.0]}, draws=1), sweep_cells.noisy_mean,
                        name="demo")
    ds = sweep.run(study, tmp_path / "s.zarr", scheduler="serial", progress=False)
    _check_cf(ds.attrs, "transformer_pde.sweep.run (demo)")
    stored = sweep.open_results(tmp_path / "s.zarr").attrs
    for name in stored[JSON_ATTRIBUTES].split():
        value = json.loads(stored[name])
        assert not any(isinstance(v, str) and v.startswith("{")
                       for v in (value.values() if isinstance(value, dict) else value)), name


# ------------------------------------------------------------------ run information
def test_info_attributes_round_trip_in_memory():
    attrs = info_attributes(INFO)
    assert attrs["info_method"] == "rk4" and attrs["info_big"] == 2 ** 63 - 1
    assert isinstance(attrs["info_sizes"], str)           # JSON, named as such
    assert "info_sizes" in attrs[JSON_ATTRIBUTES].split()
    assert set(json.loads(attrs["info"])) == {"two words", "é", "1x"}
    assert _same({k: (v.item() if isinstance(v, np.generic) else v) for k, v in INFO.items()},
                 info_from_attributes(attrs))


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_run_information_reads_back_exactly_from_flat_attributes(tmp_path, suffix):
    traj = _traj(INFO)
    path = traj.save(tmp_path / f"t{suffix}")
    got = read_trajectory(path)["info"]
    assert _same({k: (v.item() if isinstance(v, np.generic) else v) for k, v in INFO.items()},
                 got)
    attrs = _open(path).attrs
    assert attrs["info_method"] == "rk4" and int(attrs["info_small"]) == -(2 ** 63)
    assert float(attrs["info_tiny"]) == 5e-324


# ------------------------------------------------------------------ names
def test_dimensions_are_named_alike_in_particle_gaussian_and_study_files():
    traj = _traj()
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    g = gaussian.solve(att, np.zeros(2), 0.3 * np.eye(2), t_max=0.5, t_eval=[0.0, 0.5])
    assert labelled.particle_dataset(traj)["states"].dims == ("time", "token", "component")
    gds = g.to_xarray()
    assert gds["means"].dims == ("time", "component")
    assert gds["covs"].dims == ("time", "row", "col") and gds["limit"].dims == ("row", "col")
    stat = ParticleTrajectory(traj.times, None, traj.weights, None, "ok", "", last=traj.last,
                              saved_means=traj.states.mean(axis=1),
                              saved_covs=np.zeros((4, 2, 2)))
    ds = labelled.particle_dataset(stat)
    assert ds["means"].dims == ("time", "component") and ds["covs"].dims == ("time", "row", "col")


def test_long_names_say_what_a_variable_is():
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    g = gaussian.solve(att, np.zeros(2), 0.3 * np.eye(2), t_max=0.5, t_eval=[0.0, 0.5])
    for ds in (labelled.particle_dataset(_traj()), g.to_xarray()):
        for name, var in ds.variables.items():
            assert var.attrs["long_name"] != name and var.attrs["units"] == "1", name
    from transformer_pde.sweep.cells import CELLS

    for cls in CELLS.values():              # every output of the built-in cell functions
        for name in cls.OUTPUTS if hasattr(cls, "OUTPUTS") else ():
            assert name in labelled.VARIABLE_ATTRS, (cls.__name__, name)
    assert labelled.VARIABLE_ATTRS["t_stop"] == "depth at which the run stopped"
    ds = labelled.cf_attributes(labelled.particle_dataset(_traj()).assign(score=("token", np.ones(7))))
    assert ds["score"].attrs["long_name"] == "quantity 'score'"


@pytest.mark.parametrize("fmt", ["netcdf", "npz"])
def test_cli_data_files_name_their_command(tmp_path, fmt):
    from transformer_pde.cli.runs import run_gaussian
    from transformer_pde.io.container import load_npz

    cfg = {"attention": {"d": 2, "V": -1.0}, "gaussian": {"t_max": 0.5, "n_eval": 3}}
    s = run_gaussian(cfg, tmp_path / "o", data_format=fmt)
    path = tmp_path / "o" / s["files"]["data"]
    attrs = (json.loads(str(load_npz(path)["provenance"])) if fmt == "npz"
             else labelled.open_dataset(path).attrs)
    _check_cf(attrs, "transformer-pde gaussian")


def test_mean_field_solutions_saved_have_readable_long_names(tmp_path):
    from transformer_pde.meanfield import solve_circle

    sol = solve_circle(lambda th: 1.0 + 0.3 * np.cos(th), 1.0, [0.0, 0.2])
    ds = labelled.open_dataset(sol.save(tmp_path / "c.nc"))
    for name, var in ds.variables.items():
        assert "'" not in var.attrs["long_name"], (name, var.attrs["long_name"])
    _check_cf(ds.attrs, "CircleSolution.save")
