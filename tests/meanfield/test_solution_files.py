"""PDE solutions saved as labelled, checksummed netCDF: read back equal, never replaced
without ``overwrite=True``, an edited file refused."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from transformer_pde.errors import ArgumentError
from transformer_pde.meanfield import solve_circle, solve_line

pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")


@pytest.fixture(scope="module")
def solutions():
    circle = solve_circle(lambda th: 1.0 + 0.3 * np.cos(3 * th), 3.0, [0.0, 0.5])
    line = solve_line(stats.norm(0.0, 1.0), [0.0, 0.2], beta=-0.25, n_nodes=32)
    return circle, line


def test_saved_solutions_read_back_equal(solutions, tmp_path):
    from transformer_pde.io.labelled import open_dataset
    for sol, name in zip(solutions, ("circle.nc", "line.nc"), strict=True):
        path = sol.save(tmp_path / name)
        ds = open_dataset(path)
        want = sol.to_xarray()
        for var in want.data_vars:
            np.testing.assert_array_equal(ds[var].values, want[var].values)
        assert ds.attrs["status"] == "ok"


def test_an_existing_file_needs_overwrite(solutions, tmp_path):
    circle, _ = solutions
    path = circle.save(tmp_path / "circle.nc")
    with pytest.raises(ArgumentError, match="overwrite=True"):
        circle.save(path)
    assert circle.save(path, overwrite=True) == path
