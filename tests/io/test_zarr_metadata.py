"""A Zarr trajectory whose Zarr metadata files are damaged: the error names the store and
the damaged file (``states/.zarray``), not only xarray's bare JSONDecodeError or KeyError."""

from __future__ import annotations

import json

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.errors import TrajectoryFileError
from transformer_pde.io.labelled import zarr_metadata_problem
from transformer_pde.particles import ParticleTrajectory


def _saved(tmp_path):
    times = np.linspace(0.0, 1.0, 3)
    states = np.random.default_rng(2).normal(size=(3, 4, 2))
    return ParticleTrajectory(times, states, np.full(4, 0.25), None, "ok", "").save(
        tmp_path / "t.zarr")


def _truncate(path):
    path.write_text(path.read_text()[:20])


def _drop_dims(path):
    attrs = json.loads(path.read_text())
    attrs.pop("_ARRAY_DIMENSIONS")
    path.write_text(json.dumps(attrs))


@pytest.mark.parametrize("rel, damage, match", [
    ("states/.zarray", _truncate, r"states/\.zarray is not valid JSON"),
    ("weights/.zattrs", _truncate, r"weights/\.zattrs is not valid JSON"),
    ("time/.zattrs", _drop_dims, r"time/\.zattrs has no list '_ARRAY_DIMENSIONS'"),
    (".zattrs", _truncate, r"\.zattrs is not valid JSON"),
])
def test_damaged_zarr_metadata_file_is_named(tmp_path, rel, damage, match):
    path = _saved(tmp_path)
    assert zarr_metadata_problem(path) is None
    damage(path / rel)
    with pytest.raises(TrajectoryFileError, match=r"t\.zarr is not a readable \.zarr "
                                                  r"trajectory \(" + match):
        tp.load(path)
    assert zarr_metadata_problem(path).startswith(rel)
