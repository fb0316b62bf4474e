"""``save(path, *, overwrite=False)`` on every result with a file format: the overwrite
rule, atomic replacement, and the checksummed NPZ files of Gaussian solves and batches."""

import os
import warnings
import zipfile

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.errors import ArgumentError, ArgumentTypeError, IntegrityError
from transformer_pde.gaussian.batch import GaussianBatch, load, solve_batch
from transformer_pde.gaussian.trajectory import GaussianTrajectory, solve
from transformer_pde.io.digests import array_digest
from transformer_pde.particles import ParticleTrajectory

SUFFIXES = ("npz", "nc", "zarr")


def _traj(message="fine", scale=1.0):
    rng = np.random.default_rng(5)
    times = np.linspace(0.0, 1.0, 4)
    w = np.full(7, 1 / 7)
    states = scale * rng.normal(size=(4, 7, 2))
    att = tp.Attention("softmax", np.eye(2), 0.5 * np.eye(2), np.eye(2))
    return ParticleTrajectory(times, states, w, None, "ok", message, attention=att)


def _att(d=2):
    return tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=1.0)


@pytest.fixture(scope="module")
def gauss():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return solve(_att(), np.array([0.1, -0.2]), np.diag([0.3, 0.1]), t_max=2.0)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(1)
    m = 0.2 * rng.normal(size=(5, 2))
    c = np.stack([np.diag([0.05 + 0.1 * i, 0.1]) for i in range(5)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return solve_batch(_att(), m, c, t_max=1.5, t_eval=np.linspace(0.0, 1.5, 7),
                           use_numba=False)


def _same(a, b):
    """Exact equality of two arrays (dtype, shape and bytes; NaN payloads included)."""
    return array_digest(np.asarray(a)) == array_digest(np.asarray(b))


# ------------------------------------------------------------------ particle trajectories
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_existing_path_is_refused_naming_it_and_the_option(tmp_path, suffix):
    path = _traj("first").save(tmp_path / f"t.{suffix}")
    with pytest.raises(ArgumentError, match=r"t\.%s already exists.*overwrite=True" % suffix):
        _traj("second").save(path)
    assert tp.load(path).message == "first"           # untouched
    assert sorted(os.listdir(tmp_path)) == [f"t.{suffix}"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_overwrite_true_replaces_the_file_and_leaves_nothing_beside_it(tmp_path, suffix):
    path = _traj("first").save(tmp_path / f"t.{suffix}")
    new = _traj("second", scale=2.0)
    assert _traj("second", scale=2.0).save(path, overwrite=True) == path
    back = tp.load(path)
    assert back.message == "second" and _same(back.states, new.states)
    assert sorted(os.listdir(tmp_path)) == [f"t.{suffix}"]


@pytest.mark.parametrize("suffix", ("npz", "nc"))
def test_a_failed_overwrite_keeps_the_previous_file(tmp_path, suffix, monkeypatch):
    import xarray as xr
    path = _traj("first").save(tmp_path / f"t.{suffix}")

    def broken(*args, **kwargs):
        raise OSError("disk full")
    if suffix == "nc":
        monkeypatch.setattr(xr.Dataset, "to_netcdf", broken)
    else:
        monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        _traj("second").save(path, overwrite=True)
    monkeypatch.undo()
    assert tp.load(path).message == "first"
    assert sorted(os.listdir(tmp_path)) == [f"t.{suffix}"]


def test_overwrite_must_be_a_bool_and_never_replaces_a_plain_directory(tmp_path):
    with pytest.raises(ArgumentTypeError, match="overwrite"):
        _traj().save(tmp_path / "t.npz", overwrite="yes")
    folder = tmp_path / "data.zarr"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ArgumentError, match="not a Zarr store"):
        _traj().save(folder, overwrite=True)
    with pytest.raises(ArgumentError, match="not a Zarr store"):
        _traj().save(tmp_path, overwrite=True)
    assert (folder / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------ Gaussian results
def test_gaussian_trajectory_round_trips_exactly(tmp_path, gauss):
    path = gauss.save(tmp_path / "g.npz")
    back = GaussianTrajectory.load(path)
    assert isinstance(back, GaussianTrajectory) and back.status == gauss.status
    assert back.message == gauss.message and back.nfev == gauss.nfev
    for name in ("times", "means", "covs", "limit", "final_mean", "final_cov"):
        assert _same(getattr(back, name), getattr(gauss, name)), name
    assert _same(back.blowup_time, gauss.blowup_time) and back.t_final == gauss.t_final
    assert isinstance(load(path), GaussianTrajectory)


def test_gaussian_batch_round_trips_exactly_nan_rows_included(tmp_path, batch):
    assert np.isnan(batch.traj_covs).any()  # rows after a member stopped are NaN
    path = batch.save(tmp_path / "b.npz")
    back = GaussianBatch.load(path)
    assert list(back.status) == list(batch.status) and back.messages == batch.messages
    for name in ("blowup_time", "t_final", "means", "covs", "limit", "n_steps", "t_eval",
                 "traj_means", "traj_covs"):
        assert _same(getattr(back, name), getattr(batch, name)), name
    assert isinstance(load(path), GaussianBatch)
    # a member taken from the loaded batch is the member of the original one
    assert _same(back[2].covs, batch[2].covs)


def test_gaussian_batch_without_t_eval_round_trips(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = solve_batch(_att(), np.zeros((2, 2)), np.stack([np.eye(2) * 0.1] * 2),
                        t_max=0.5, use_numba=False)
    back = load(b.save(tmp_path / "b.npz"))
    assert back.t_eval is None and back.traj_means is None and _same(back.covs, b.covs)


@pytest.mark.parametrize("which", ["gauss", "batch"])
def test_gaussian_save_follows_the_overwrite_rule(tmp_path, which, request):
    res = request.getfixturevalue(which)
    path = res.save(tmp_path / "r.npz")
    with pytest.raises(ArgumentError, match="already exists.*overwrite=True"):
        res.save(path)
    assert res.save(path, overwrite=True) == path
    assert sorted(os.listdir(tmp_path)) == ["r.npz"]
    with pytest.raises(ArgumentError, match="NPZ"):
        res.save(tmp_path / "r.nc")


def test_gaussian_load_refuses_the_other_kind_and_damaged_files(tmp_path, gauss, batch):
    g, b = gauss.save(tmp_path / "g.npz"), batch.save(tmp_path / "b.npz")
    with pytest.raises(IntegrityError, match="holds a GaussianBatch"):
        GaussianTrajectory.load(b)
    with pytest.raises(IntegrityError, match="holds a GaussianTrajectory"):
        GaussianBatch.load(g)
    # an array edited in place (the archive rewritten with one changed number)
    with np.load(g) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["covs"] = arrays["covs"].copy()
    arrays["covs"][0, 0, 0] += 1e-9
    edited = tmp_path / "edited.npz"
    np.savez(edited, **arrays)
    with pytest.raises(IntegrityError, match="covs"):
        load(edited)
    with pytest.raises(IntegrityError):
        load(_traj().save(tmp_path / "particles.npz"))   # a particle file is no Gaussian result
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(g.read_bytes()[:200])
    with pytest.raises(IntegrityError, match="trunc.npz"):
        load(trunc)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.npz")
    assert zipfile.is_zipfile(g)


def test_gaussian_save_refuses_a_result_that_load_would_refuse(tmp_path, gauss):
    bad = GaussianTrajectory(gauss.times[::-1].copy(), gauss.means, gauss.covs, gauss.status,
                             gauss.blowup_time, gauss.limit, gauss.t_final, gauss.message,
                             gauss.nfev, gauss.final_mean, gauss.final_cov)
    with pytest.raises(ArgumentError, match="times"):
        bad.save(tmp_path / "bad.npz")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("suffix", ["nc", "zarr"])
def test_labelled_files_need_the_io_extra_only(tmp_path, monkeypatch, suffix):
    """Dask is not in the ``io`` extra: without it a labelled file is written and read back
    the same (it was an ImportError of ``dask``)."""
    import sys
    monkeypatch.setitem(sys.modules, "dask", None)      # import dask raises ImportError
    path = _traj().save(tmp_path / f"t.{suffix}")
    monkeypatch.undo()
    back = tp.load(path)
    assert _same(back.states, _traj().states) and back.message == "fine"


def test_labelled_reading_without_xarray_names_the_extra(tmp_path, monkeypatch):
    import sys
    from transformer_pde.errors import MissingDependencyError
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(MissingDependencyError, match=r"open_dataset.*transformer-pde\[io\]"):
        tp.io.open_dataset(tmp_path / "t.nc")
