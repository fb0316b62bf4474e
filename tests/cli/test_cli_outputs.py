"""What the commands write: labelled data files (netCDF, Zarr, NPZ on request, NPZ with a
notice when the [io] extra is missing), strict JSON, CF attributes."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from transformer_pde import cli
from transformer_pde.cli.output import IO_EXTRA_HINT, OutputError, data_format
from transformer_pde.cli.runs import run_gaussian
from transformer_pde.cli.studies import run_cone
from transformer_pde.io.container import load_npz
from transformer_pde.io.labelled import open_dataset

GAUSSIAN = {"attention": {"d": 2, "V": -1.0},
            "gaussian": {"t_max": 0.5, "n_eval": 4, "cov": [[1.0, 0.2], [0.2, 0.5]]}}
BLOWUP = {"attention": {"d": 2}, "gaussian": {"t_max": 3.0, "n_eval": 5}}
CONE = {"attention": {"d": 2}, "cone": {"n": 3, "t_max": 2.0, "n_eval": 5}}


def _strict(path: Path) -> object:
    """Parse with a strict JSON parser: NaN / Infinity are refused."""
    def refuse(name: str) -> None:
        raise ValueError(f"{path}: non-standard JSON constant {name}")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def test_every_json_written_is_strict_and_nonfinite_is_null(tmp_path):
    # each JSON file the commands wrote parses with a strict parser
    run_gaussian(BLOWUP, tmp_path / "g")
    run_cone(CONE, tmp_path / "c", scheduler="serial", progress=False)
    assert cli.main(["ranks", "--dims", "2", "--draws", "2", "--kinds", "softmax",
                     "--values", "identity", "--out", str(tmp_path / "r"), "-q",
                     "--scheduler", "serial"]) == 0
    files = sorted(tmp_path.rglob("*.json"))
    assert len(files) >= 3
    for f in files:
        _strict(f)
    # a run without blow-up: blowup_time is not finite in Python, null in the file
    s = run_gaussian(GAUSSIAN, tmp_path / "conv")
    assert not np.isfinite(s["blowup_time"])  # no blow-up: NaN in the result
    assert _strict(tmp_path / "conv" / "summary.json")["blowup_time"] is None


def test_gaussian_writes_labelled_netcdf_with_status_and_parameters(tmp_path):
    s = run_gaussian(BLOWUP, tmp_path / "g")
    assert s["files"]["data"] == "gaussian.nc"
    ds = open_dataset(tmp_path / "g" / "gaussian.nc")  # checksums verified
    assert ds.attrs["status"] == "blowup" == s["status"]
    assert ds.attrs["blowup_time"] == s["blowup_time"]
    assert json.loads(ds.attrs["config"])["attention"] == {"d": 2}
    for name in ds.variables:
        assert ds[name].attrs["units"] == "1" and ds[name].attrs["long_name"], name
    assert ds["time"].dtype == np.float64  # units "1": not decoded as a CF time


def test_cone_netcdf_holds_status_flags(tmp_path):
    run_cone(CONE, tmp_path / "c", scheduler="serial", progress=False)
    ds = open_dataset(tmp_path / "c" / "cone.nc")
    meanings = ds["status"].attrs["flag_meanings"].split()
    assert list(ds["status"].attrs["flag_values"]) == list(range(len(meanings)))
    assert [meanings[c] for c in ds["status"].values] == ["blowup"] * 3
    assert ds["covs0"].shape == (3, 2, 2) and ds["covs"].shape == (3, 5, 2, 2)


def test_format_zarr_and_npz_on_request(tmp_path):
    import xarray as xr

    s = run_gaussian(GAUSSIAN, tmp_path / "z", data_format="zarr")
    assert s["files"]["data"] == "gaussian.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated: no warning from open_zarr
        ds = xr.open_zarr(tmp_path / "z" / "gaussian.zarr").load()
    assert ds.attrs["status"] == s["status"]
    s = run_gaussian(GAUSSIAN, tmp_path / "n", data_format="npz")
    z = load_npz(tmp_path / "n" / "gaussian.npz")
    assert str(z["status"]) == s["status"] and z["covs"].shape == (4, 2, 2)
    with pytest.raises(OutputError, match="--format"):
        data_format("hdf5")


def test_missing_io_extra_falls_back_to_npz_with_one_line(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "h5netcdf" else real(name, *a))
    s = run_gaussian(GAUSSIAN, tmp_path / "g")
    assert s["files"]["data"] == "gaussian.npz" and (tmp_path / "g" / "gaussian.npz").is_file()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and IO_EXTRA_HINT in err[0]


def test_force_replaces_an_earlier_zarr_output(tmp_path):
    run_gaussian(GAUSSIAN, tmp_path / "z", data_format="zarr")
    s = run_gaussian(BLOWUP, tmp_path / "z", data_format="zarr", force=True)
    assert open_dataset(tmp_path / "z" / "gaussian.zarr").attrs["status"] == s["status"]
