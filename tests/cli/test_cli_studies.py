"""The ``ranks`` and ``cone`` commands run as studies on the sweep engine: same files and
numbers as before the rebuild (and as the serial library functions), Dask equal to serial,
--resume after Ctrl-C without recomputing finished cells, failed cells recorded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from transformer_pde import cli, paper, sweep
from transformer_pde.cli import ExitCode

RANKS = ["ranks", "--dims", "3", "--draws", "6", "--seed", "5", "--kinds", "softmax", "l2",
         "--values", "identity", "random", "-q"]

#: ranks.npz written by the serial implementation before the rebuild (commit 8800504) for
#: RANKS: the rebuilt command must give exactly these numbers
BEFORE = {
    "softmax_identity_d3": ([1, 1, 1, 1, 1, 1], ["blowup"] * 6),
    "softmax_random_d3": ([1, 2, 1, 2, 1, 1], ["blowup", "blowup", "blowup", "ok", "blowup",
                                               "blowup"]),
    "l2_identity_d3": ([2, 1, 2, 2, 3, 1], ["ok", "diverging", "diverging", "diverging", "ok",
                                            "diverging"]),
    "l2_random_d3": ([1, 1, 1, 2, 1, 1], ["diverging", "diverging", "diverging", "ok",
                                          "diverging", "diverging"]),
}

CONE = """
[attention]
d = 2
kind = "softmax"
V = [[1.0, 0.3], [0.0, 0.5]]
[cone]
n = 6
t_max = 5.0
n_eval = 20
init = "random"
seed = 3
color_by = "status"
"""
#: blow-up times in cone.npz before the rebuild (commit 8800504)
CONE_BEFORE = [0.4832328581923687, 0.6910394878485543, 0.5173925775527475, 0.6652891702967244,
               0.5923588445543854, 0.6265952661497518]


def _npz(path: Path) -> dict:
    """The arrays of the old NPZ layout, read from the labelled file the command writes
    (``ranks.nc`` / ``cone.nc``, every array checked against its checksum): the labelled
    file holds the same numbers."""
    from transformer_pde.io.labelled import open_dataset

    ds = open_dataset(Path(path).with_suffix(".nc"))
    names = ds["status"].attrs["flag_meanings"].split()
    status = np.array(names)[ds["status"].values]
    if ds.attrs["command"] == "ranks":
        out = {}
        for i, k in enumerate(ds["kind"].values):
            for j, v in enumerate(ds["value"].values):
                for m, d in enumerate(ds["d"].values):
                    out[f"{k}_{v}_d{d}"] = ds["rank"].values[i, j, m]
                    out[f"{k}_{v}_d{d}_status"] = status[i, j, m]
        return out
    out = {"covs0": ds["covs0"].values, "status": status,
           "blowup_time": ds["blowup_time"].values, "limit": ds["limit"].values}
    for i, n in enumerate(ds["n_times"].values):
        out[f"times_{i}"] = ds["times"].values[i, :n]
        out[f"covs_{i}"] = ds["covs"].values[i, :n]
    return out


def _same_files(a: Path, b: Path, name: str) -> None:
    za, zb = _npz(a / name), _npz(b / name)
    assert sorted(za) == sorted(zb)
    for k in za:
        assert za[k].dtype.kind == zb[k].dtype.kind
        np.testing.assert_array_equal(za[k], zb[k], err_msg=k)


@pytest.fixture(scope="module")
def serial_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks") / "serial"
    assert cli.main([*RANKS, "--out", str(out), "--scheduler", "serial"]) == 0
    return out


def test_ranks_numbers_are_those_before_the_rebuild_and_rank_sweeps(serial_ranks):
    z = _npz(serial_ranks / "ranks.npz")
    assert sorted(k for k in z if not k.endswith("_status")) == sorted(BEFORE)
    for key, (ranks, status) in BEFORE.items():
        assert z[key].tolist() == ranks, key
        assert z[f"{key}_status"].tolist() == status, key
        kind, value, _ = key.split("_")
        ref = paper.rank_sweep(kind, 3, value=value, draws=6, seed=5)
        np.testing.assert_array_equal(z[key], ref.ranks)
        np.testing.assert_array_equal(z[f"{key}_status"], ref.status)
    s = json.loads((serial_ranks / "summary.json").read_text())
    assert s["study"] == {"store": "results.zarr", "cells": 24, "done": 24, "failed": 0,
                          "missing": 0, "failures": {}}
    ds = sweep.open_results(serial_ranks / "results.zarr")
    assert ds["rank"].dims == ("kind", "value", "d", "trial", "draw")
    np.testing.assert_array_equal(ds["rank"].values[1, 0, 0, :, 0], z["l2_identity_d3"])
    assert (serial_ranks / "ranks.png").is_file()


def test_any_grouping_of_draws_gives_the_same_numbers():
    # draws split over tasks in any way (what Dask does) equal the one batched solve
    ref = paper.rank_sweep("l2", 3, value="random", draws=6, seed=5)
    for trials in ([4], [0, 5], [3, 1, 2]):
        ranks, status = paper.rank_sweep_trials("l2", 3, trials, value="random", draws=6,
                                                seed=5)
        np.testing.assert_array_equal(ranks, ref.ranks[trials])
        np.testing.assert_array_equal(status, ref.status[trials])
    ref = paper.rank_sweep("softmax", 3, value="psd", draws=3, seed=2, distribution="paper",
                           t_max=3000.0)
    ranks, _ = paper.rank_sweep_trials("softmax", 3, [2, 0], value="psd", draws=3, seed=2,
                                       distribution="paper", t_max=3000.0)
    np.testing.assert_array_equal(ranks, ref.ranks[[2, 0]])


def test_ranks_on_a_local_dask_cluster_equal_serial(serial_ranks, tmp_path):
    out = tmp_path / "dask"
    assert cli.main([*RANKS, "--out", str(out), "--workers", "2"]) == 0
    _same_files(serial_ranks, out, "ranks.npz")


@pytest.mark.filterwarnings("ignore::transformer_pde.errors.EarlyStopWarning")
def test_cone_numbers_are_those_of_solve_paths(tmp_path):
    from transformer_pde.cli.builders import build_attention

    cfg = tmp_path / "c.toml"
    cfg.write_text(CONE)
    out = tmp_path / "o"
    assert cli.main(["cone", str(cfg), "--out", str(out), "--scheduler", "serial", "-q"]) == 0
    z = _npz(out / "cone.npz")
    np.testing.assert_allclose(z["blowup_time"], CONE_BEFORE, rtol=1e-9)
    att = build_attention({"d": 2, "kind": "softmax", "V": [[1.0, 0.3], [0.0, 0.5]]})
    runs = paper.solve_paths(att, z["covs0"], t_max=5.0, n_eval=20)
    for i, r in enumerate(runs):
        np.testing.assert_array_equal(z[f"times_{i}"], r.times)
        np.testing.assert_array_equal(z[f"covs_{i}"], r.covs)
        np.testing.assert_array_equal(z["limit"][i], r.limit)
        assert z["status"][i] == r.status
    np.testing.assert_array_equal(z["blowup_time"], [r.blowup_time for r in runs])
    s = json.loads((out / "summary.json").read_text())
    assert s["t_final"] == [r.t_final for r in runs]
    assert s["files"] == {"data": "cone.nc", "figure": "cone.png", "store": "results.zarr"}


def test_ranks_resume_after_ctrl_c(serial_ranks, tmp_path, monkeypatch, capsys):
    calls = []
    real = sweep.RankSweepCell.run_batch

    def counted(self, params_list, rngs):
        calls.append(len(params_list))
        if stop_after is not None and len(calls) > stop_after:
            raise KeyboardInterrupt
        return real(self, params_list, rngs)

    monkeypatch.setattr(sweep.RankSweepCell, "run_batch", counted)
    out = tmp_path / "r"
    stop_after = 2
    assert cli.main([*RANKS, "--out", str(out), "--scheduler", "serial"]) == ExitCode.INTERRUPTED
    err = capsys.readouterr().err
    assert "results.zarr" in err and "--resume" in err
    finished = sum(calls[:2])
    assert finished > 0 and sorted(p.name for p in out.iterdir()) == ["results.zarr"]
    # without --resume the store is not touched
    assert cli.main([*RANKS, "--out", str(out), "--scheduler", "serial"]) == ExitCode.OUTPUT
    assert "--resume" in capsys.readouterr().err
    # another configuration cannot complete it
    assert cli.main([*RANKS, "--out", str(out), "--scheduler", "serial", "--resume",
                     "--seed", "6"]) == ExitCode.ERROR
    assert "different study" in capsys.readouterr().err
    calls.clear()
    stop_after = None
    assert cli.main([*RANKS, "--out", str(out), "--scheduler", "serial", "--resume"]) == 0
    assert sum(calls) == 24 - finished  # no finished cell computed again
    _same_files(serial_ranks, out, "ranks.npz")


def test_a_failing_draw_is_recorded_and_the_others_kept(serial_ranks, tmp_path, monkeypatch,
                                                        capsys):
    real = paper.rank_sweep_trials

    def fails_on_trial_4(kind, d, trials, **kw):
        if kind == "l2" and kw["value"] == "random" and 4 in list(trials):
            raise FloatingPointError("draw 4 broke")
        return real(kind, d, trials, **kw)

    monkeypatch.setattr(paper, "rank_sweep_trials", fails_on_trial_4)
    out = tmp_path / "f"
    assert cli.main([*RANKS, "--out", str(out), "--scheduler", "serial"]) == \
        ExitCode.UNSUCCESSFUL
    captured = capsys.readouterr()
    assert "1 cell(s) failed: FloatingPointError: draw 4 broke" in captured.out
    assert "CellFailureWarning" in captured.err
    z, ref = _npz(out / "ranks.npz"), _npz(serial_ranks / "ranks.npz")
    assert z["l2_random_d3"][4] == -1 and z["l2_random_d3_status"][4] == "failed"
    keep = np.arange(6) != 4
    np.testing.assert_array_equal(z["l2_random_d3"][keep], ref["l2_random_d3"][keep])
    for key in ("softmax_identity_d3", "softmax_random_d3", "l2_identity_d3"):
        np.testing.assert_array_equal(z[key], ref[key])
    s = json.loads((out / "summary.json").read_text())
    assert s["study"]["failed"] == 1
    assert next(sw for sw in s["sweeps"] if sw["kind"] == "l2" and sw["value"] == "random"
                )["status_counts"]["failed"] == 1


@pytest.mark.parametrize("command", ["ranks", "cone"])
def test_study_options_in_help(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    for option in ("--workers", "--scheduler", "--scheduler-file", "--resume", "--quiet"):
        assert option in text


def test_unreachable_scheduler_leaves_nothing(tmp_path, capsys, monkeypatch):
    import importlib

    # the message and the empty folder are what is tested, not the length of the timeout
    monkeypatch.setattr(importlib.import_module("transformer_pde.sweep.run"), "CONNECT_TIMEOUT", 1.0)
    out = tmp_path / "o"
    rc = cli.main([*RANKS, "--out", str(out), "--scheduler", "tcp://127.0.0.1:1"])
    assert rc == ExitCode.ERROR
    assert "scheduler" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []
