"""The synchronisation study (sweep.SyncCell) on a tiny grid.

Near the three-cluster state (spread 0.05) the verdicts are known from the linearisation
(diagnostics.polygon_spectrum): stable for beta < -2/3 (every run stops there, with a
negative largest eigenvalue), unstable above (every run synchronises).  The batched cells
equal the cell-by-cell ones, and each cell equals synchronization_runs on its own stream.
"""

from __future__ import annotations

import tomllib
import warnings

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde import diagnostics, sweep
from transformer_pde.errors import ArgumentError
from transformer_pde.sweep.config import study_from_config
from transformer_pde.sweep.study import DONE


def _study(**options):
    cell = sweep.SyncCell(init="triangle", spread=0.05, t_max=150.0, dt=0.1, **options)
    grid = sweep.Grid({"beta": [-1.0, -0.4], "n": [3, 6]}, draws=3, seed=2)
    return sweep.Study(grid, cell)


def test_sync_cell_on_a_tiny_grid_follows_the_linearisation():
    ds = sweep.run(_study(), scheduler="serial", progress=False)
    assert np.all(ds["cell_status"].values == DONE)
    stuck, free = ds.sel(beta=-1.0), ds.sel(beta=-0.4)
    assert np.all(stuck["verdict"].values == diagnostics.synchronization.EQUILIBRIUM)
    assert np.all(stuck["clusters"].values == 3)
    # the largest eigenvalue at the equilibrium: max(mu, nu) of the triangle (n = 6: nu
    # counts), mu alone for n = 3; to the distance from the equilibrium (speed < 1e-8)
    mu, nu = diagnostics.polygon_spectrum(3, -1.0)
    np.testing.assert_allclose(stuck["max_eig"].sel(n=3).values, mu.max(), atol=1e-6)
    np.testing.assert_allclose(stuck["max_eig"].sel(n=6).values, max(mu.max(), nu), atol=1e-6)
    assert np.all(free["verdict"].values == diagnostics.synchronization.SYNCHRONISED)
    assert np.all(np.isnan(free["max_eig"].values))
    assert np.all(free["gap"].values > np.pi + 1e-2)
    assert np.all(ds["status"].values == sweep.status_code("ok"))


def test_sync_cell_batched_equals_cell_by_cell_and_its_own_run():
    study = _study()
    batched = sweep.run(study, scheduler="serial", progress=False)
    single = sweep.run(study, scheduler="serial", progress=False, batch_size=1)
    for name in ("verdict", "t_decided", "clusters"):
        np.testing.assert_array_equal(batched[name].values, single[name].values)
    for name in ("order", "gap", "speed"):
        np.testing.assert_allclose(batched[name].values, single[name].values,
                                   rtol=1e-12, atol=1e-15)
    c = study.grid.cell(7)                        # beta = -0.4, n = 3, draw 1
    X0 = diagnostics.circle_initial_states(c.rng(), 1, 3, "triangle", 0.05)
    r = diagnostics.synchronization_runs(-0.4, X0, t_max=150.0, dt=0.1)
    got = batched.isel(beta=1, n=0, draw=1)
    assert (c.params, c.draw) == ({"beta": -0.4, "n": 3}, 1)
    assert int(got["verdict"]) == r.verdict[0] and float(got["t_decided"]) == r.t_decided[0]


def test_sync_cell_bad_options():
    with pytest.raises(ArgumentError, match="gamma"):
        sweep.Study(sweep.Grid({"gamma": [1.0]}), sweep.SyncCell())
    with pytest.raises(ArgumentError, match="init"):
        sweep.SyncCell(init="ring")({}, np.random.default_rng(0))
    with pytest.raises(ArgumentError, match="kind"):
        sweep.SyncCell(kind="l2")({}, np.random.default_rng(0))
    # in a study a bad option fails the cell with its message; the study goes on
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sweep.CellFailureWarning)
        ds = sweep.run(sweep.Study(sweep.Grid({"kind": ["l2"]}), sweep.SyncCell(n=3, t_max=1.0)),
                       scheduler="serial", progress=False)
    assert int(ds["cell_status"].values.ravel()[0]) == sweep.FAILED
    assert sweep.CELLS["synchronization"] is sweep.SyncCell


def test_harmonic_field_gives_the_direct_verdicts():
    """The exact Fourier field (method="harmonic", tolerance 1e-13 per value) against the
    direct sum: the same verdicts and decision times, states within 1e-7 (1e-13 per field
    value, summed over ~800 RK4 stages and amplified by the unstable directions of the flow,
    rate <= 0.6 over t <= 15; 8e-9 seen), far inside the certificate's 1e-2 margin."""
    X0 = diagnostics.circle_initial_states(np.random.default_rng(4), 3, 12)
    runs = [diagnostics.synchronization_runs(
        -0.5, X0, t_max=30.0, field=tp.FieldOptions(backend="numpy", method=m))
        for m in ("direct", "harmonic")]
    np.testing.assert_array_equal(runs[0].verdict, runs[1].verdict)
    np.testing.assert_array_equal(runs[0].t_decided, runs[1].t_decided)
    np.testing.assert_allclose(runs[0].states, runs[1].states, atol=1e-7)
    assert np.all(runs[0].verdict == diagnostics.synchronization.SYNCHRONISED)


def test_sync_cell_from_a_study_configuration():
    """``cell = "synchronization"`` in a study file builds the same study as the code."""
    cfg = tomllib.loads('[study]\ncell = "synchronization"\ndraws = 2\nseed = 2\n'
                        '[study.axes]\nbeta = [-1.0, -0.4]\nn = [3, 6]\n'
                        '[cell]\ninit = "triangle"\nspread = 0.05\nt_max = 150.0\ndt = 0.1\n')
    study = study_from_config(cfg)
    assert study.cell == sweep.SyncCell(init="triangle", spread=0.05, t_max=150.0, dt=0.1)
    assert study.grid.to_dict() == sweep.Grid({"beta": [-1.0, -0.4], "n": [3, 6]},
                                              draws=2, seed=2).to_dict()
