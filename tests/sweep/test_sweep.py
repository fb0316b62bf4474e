"""Parameter studies (transformer_pde.sweep): grids, seeding, stores, resume, Dask."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from transformer_pde import sweep
from transformer_pde.errors import ArgumentError, ArgumentTypeError

import subprocess_runs
import sweep_cells

ROOT = Path(__file__).resolve().parents[2]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                         env.get("PYTHONPATH", "")])
    env["NUMBA_NUM_THREADS"] = "1"
    return env


def _study(draws=4, mus=(0.0, 1.0, 2.0), fn=sweep_cells.noisy_mean, seed=3):
    return sweep.Study(sweep.Grid({"mu": list(mus)}, draws=draws, seed=seed), fn)


# ------------------------------------------------------------------------- grid
def test_grid_shape_cells_and_seeds():
    g = sweep.Grid({"kind": ["softmax", "l2"], "d": [3, 4, 5]}, draws=2, seed=11)
    assert g.shape == (2, 3, 2) and g.n_cells == 12 and g.dims == ("kind", "d", "draw")
    c = g.cell(7)
    assert c.params == {"kind": "l2", "d": 3} and c.draw == 1
    # a cell's stream depends only on (seed, index): the same twice, distinct across cells
    assert c.rng().normal() == g.cell(7).rng().normal()
    first = [g.cell(i).rng().integers(2**62) for i in range(g.n_cells)]
    assert len(set(first)) == g.n_cells
    expected = np.random.default_rng(np.random.SeedSequence(11, spawn_key=(7,))).normal()
    assert g.cell(7).rng().normal() == expected


@pytest.mark.parametrize("axes, draws, seed, err", [
    ({"d": []}, 1, 0, ArgumentError), ({"d": [1, 1]}, 1, 0, ArgumentError),
    ({"draw": [1]}, 1, 0, ArgumentError), ({"d": [1, "a"]}, 1, 0, ArgumentTypeError),
    ({"d": "abc"}, 1, 0, ArgumentTypeError), ({"d": [1]}, 0, 0, ArgumentError),
    ({"d": [1]}, 1.5, 0, ArgumentTypeError), ({"d": [1]}, 1, -1, ArgumentError),
    ({"1x": [1]}, 1, 0, ArgumentError), ({"d": [float("nan")]}, 1, 0, ArgumentError),
    ([1, 2], 1, 0, ArgumentTypeError), ({"d": [[1, 2]]}, 1, 0, ArgumentTypeError)])
def test_grid_rejects_bad_definitions(axes, draws, seed, err):
    with pytest.raises(err):
        sweep.Grid(axes, draws=draws, seed=seed)


# ------------------------------------------------------------------------- serial runs
def test_serial_values_are_the_cell_function_on_each_cells_stream():
    study = _study()
    ds = sweep.run(study, scheduler="serial", progress=False)
    assert ds["mean"].dims == ("mu", "draw") and ds["head"].shape == (3, 4, 3)
    assert list(ds["mu"].values) == [0.0, 1.0, 2.0]
    for cell in study.grid:
        ref = sweep_cells.noisy_mean(cell.params, cell.rng())
        pos = study.grid.position(cell.index)
        assert ds["mean"].values[pos] == ref["mean"]
        assert np.array_equal(ds["head"].values[pos], ref["head"])
        assert ds["count"].values[pos] == ref["count"]
    assert ds["count"].dtype.kind == "i"
    assert (ds["cell_status"].values == sweep.DONE).all()
    assert json.loads(ds.attrs["versions"])["numpy"] == np.__version__


def test_failed_cells_are_recorded_and_the_study_goes_on(tmp_path):
    study = sweep.Study(sweep.Grid({"mu": [0.0, 1.0, 2.0]}, draws=2), sweep_cells.flaky)
    with pytest.warns(sweep.CellFailureWarning, match="2 of 6 cells failed"):
        ds = sweep.run(study, tmp_path / "s.zarr", scheduler="serial", progress=False)
    status = ds["cell_status"].values
    assert (status[1] == sweep.FAILED).all() and (status[[0, 2]] == sweep.DONE).all()
    assert np.isnan(ds["value"].values[1]).all()
    s = sweep.summary(ds)
    assert s["failed"] == 2 and s["done"] == 4
    assert list(s["failures"]) == [next(iter(s["failures"]))]
    assert "RuntimeError: this cell always fails" in next(iter(s["failures"]))
    back = sweep.open_results(tmp_path / "s.zarr")
    assert back["cell_status"].equals(ds["cell_status"])
    assert len(json.loads(back.attrs["failures"])) == 2


def test_outputs_checked_against_declaration():
    study = sweep.Study(sweep.Grid({"mu": [0.0]}), sweep_cells.noisy_mean,
                        outputs={"mean": sweep.Output(), "head": sweep.Output((4,)),
                                 "count": sweep.Output((), "int64")})
    with pytest.warns(sweep.CellFailureWarning, match="shape"):
        ds = sweep.run(study, scheduler="serial", progress=False)
    assert ds["cell_status"].values.item() == sweep.FAILED


def test_run_argument_errors(tmp_path):
    study = _study()
    with pytest.raises(ArgumentTypeError, match="study"):
        sweep.run("nope")
    with pytest.raises(ArgumentError, match="workers"):
        sweep.run(study, workers=0)
    with pytest.raises(ArgumentError, match="workers"):
        sweep.run(study, scheduler="serial", workers=2)
    with pytest.raises(ArgumentError, match="workers"):
        sweep.run(study, scheduler="tcp://127.0.0.1:9", workers=2)


# ------------------------------------------------------------------------- stores
def test_store_is_never_overwritten_and_only_resumed_by_the_same_study(tmp_path):
    path = tmp_path / "s.zarr"
    ds = sweep.run(_study(), path, scheduler="serial", progress=False)
    before = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    with pytest.raises(sweep.StoreError, match="already exists"):
        sweep.run(_study(), path, scheduler="serial", progress=False)
    with pytest.raises(sweep.StoreError, match="different study"):
        sweep.run(_study(mus=(0.0, 1.0)), path, scheduler="serial", resume=True,
                  progress=False)
    with pytest.raises(sweep.StoreError, match="different study"):
        sweep.run(_study(seed=4), path, scheduler="serial", resume=True, progress=False)
    after = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert before == after
    again = sweep.run(_study(), path, scheduler="serial", resume=True, progress=False)
    assert again["mean"].equals(ds["mean"])


def test_corrupt_and_foreign_stores_are_refused(tmp_path):
    import xarray as xr

    junk = tmp_path / "junk.zarr"
    junk.mkdir()
    (junk / ".zgroup").write_bytes(os.urandom(64))
    foreign = tmp_path / "foreign.zarr"
    xr.Dataset({"x": ("i", np.arange(3.0))}).to_zarr(foreign, zarr_format=2,
                                                    consolidated=False)
    for path, match in ((junk, "not a readable"), (foreign, "not a transformer-pde study")):
        with pytest.raises(sweep.StoreError, match=match):
            sweep.run(_study(), path, scheduler="serial", resume=True, progress=False)
        with pytest.raises(sweep.StoreError):
            sweep.open_results(path)
    with pytest.raises(sweep.StoreError, match="does not exist"):
        sweep.open_results(tmp_path / "missing.zarr")


_FAILING: set = set()
_CALLS: list = []


def _flaky_here(params, rng):
    _CALLS.append(params["mu"])
    if params["mu"] in _FAILING:
        raise RuntimeError("this cell always fails")
    return {"value": float(rng.uniform())}


def test_resume_recomputes_only_failed_and_missing_cells(tmp_path, monkeypatch):
    path = tmp_path / "s.zarr"
    monkeypatch.setattr(sys.modules[__name__], "_FAILING", {1.0})
    study = sweep.Study(sweep.Grid({"mu": [0.0, 1.0, 2.0]}, draws=2), _flaky_here)
    with pytest.warns(sweep.CellFailureWarning):
        sweep.run(study, path, scheduler="serial", progress=False)

    # the same function (same code: same fingerprint); the failing cells now succeed (an
    # edited function could not complete the store: test_cli_trust)
    monkeypatch.setattr(sys.modules[__name__], "_FAILING", set())
    monkeypatch.setattr(sys.modules[__name__], "_CALLS", [])
    calls = _CALLS
    ds = sweep.run(sweep.Study(study.grid, _flaky_here), path, scheduler="serial", resume=True,
                   progress=False)
    assert calls == [1.0, 1.0]
    assert (ds["cell_status"].values == sweep.DONE).all()
    assert json.loads(ds.attrs["failures"]) == {}
    assert json.loads(sweep.open_results(path).attrs["failures"]) == {}


def test_unreachable_scheduler_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    import importlib

    # the message is what is tested, not the length of the timeout
    monkeypatch.setattr(importlib.import_module("transformer_pde.sweep.run"), "CONNECT_TIMEOUT", 1.0)
    path = tmp_path / "s.zarr"
    with pytest.raises(sweep.SchedulerError, match="cannot reach"):
        sweep.run(_study(), path, scheduler="tcp://127.0.0.1:9", progress=False)
    assert not path.exists()
    with pytest.raises(sweep.SchedulerError, match="does not exist"):
        sweep.run(_study(), path, scheduler_file=tmp_path / "none.json", progress=False)


# ------------------------------------------------------------------------- Dask clusters
def test_embedded_local_cluster_equals_serial_bit_for_bit(tmp_path):
    study = _study(draws=6)
    ds = sweep.run(study, tmp_path / "s.zarr", workers=2, batch_size=2, progress=False)
    ref = sweep.run(_study(draws=6), scheduler="serial", progress=False)
    for name in ("mean", "head", "count", "cell_status"):
        assert ds[name].equals(ref[name]), name
    assert sweep.open_results(tmp_path / "s.zarr")["head"].equals(ref["head"])


def _worker_settings(params, rng):
    import dask

    return {"profile": bool(dask.config.get("distributed.worker.profile.enabled")),
            "tick_ms": 1e3 * dask.utils.parse_timedelta(
                dask.config.get("distributed.admin.tick.interval"))}


def test_embedded_cluster_workers_run_without_the_profiler(tmp_path):
    # the embedded cluster's workers are started under run._EMBEDDED_CLUSTER_CONFIG
    outputs = {"profile": sweep.Output((), "bool"), "tick_ms": sweep.Output()}
    ds = sweep.run(sweep.Study(sweep.Grid({"i": [0, 1]}), _worker_settings, outputs=outputs),
                   workers=1, progress=False)
    assert not ds["profile"].values.any()
    assert (ds["tick_ms"].values == 1000.0).all()


def _wait_for(predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_real_cluster_survives_a_killed_worker(tmp_path):
    """A scheduler and two worker processes on 127.0.0.1; one worker is killed while the
    study runs: Dask reschedules its tasks and the result equals a serial run."""
    sched_file = tmp_path / "scheduler.json"
    env = _env()
    env["TPDE_SWEEP_SLEEP"] = "0.1"
    env["TPDE_SWEEP_LOG"] = str(tmp_path / "log")
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    # each process group is killed when the block ends
    with contextlib.ExitStack() as procs:
        procs.enter_context(subprocess_runs.started(
            [*dask, "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
             "--scheduler-file", str(sched_file)], **quiet))
        procs.callback(os.environ.pop, "TPDE_SWEEP_SLEEP", None)
        _wait_for(sched_file.exists, 60, "the scheduler")
        worker = [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                  str(sched_file), "--nthreads", "1", "--nworkers", "1", "--no-nanny",
                  "--host", "127.0.0.1"]
        workers = [procs.enter_context(subprocess_runs.started(worker, **quiet))
                   for _ in range(2)]
        from distributed import Client

        with Client(scheduler_file=str(sched_file), timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
            import threading

            def kill_one():
                log = tmp_path / "log"
                _wait_for(lambda: log.exists() and len(list(log.iterdir())) >= 6, 60,
                          "some cells")
                subprocess_runs.signal_group(workers[0], signal.SIGKILL)

            killer = threading.Thread(target=kill_one)
            killer.start()
            study = sweep.Study(sweep.Grid({"mu": [0.0, 1.0, 2.0]}, draws=10, seed=5),
                                sweep_cells.slow_logged)
            os.environ["TPDE_SWEEP_SLEEP"] = "0"  # the serial reference need not sleep
            ds = sweep.run(study, tmp_path / "s.zarr", scheduler=client, batch_size=3,
                           progress=False)
            killer.join()
            assert client.status == "running"  # the caller's client is left open
        assert workers[0].poll() is not None, "the worker was not killed"
        ref = sweep.run(sweep.Study(study.grid, sweep_cells.slow_logged), scheduler="serial",
                        progress=False)
        assert (ds["cell_status"].values == sweep.DONE).all()
        assert ds["value"].equals(ref["value"])
        assert sweep.open_results(tmp_path / "s.zarr")["value"].equals(ref["value"])


_CLIENT_SCRIPT = """
import sys
from transformer_pde import sweep
import sweep_cells
if __name__ == "__main__":
    study = sweep.Study(sweep.Grid({"mu": [0.0, 1.0, 2.0, 3.0]}, draws=10, seed=9),
                        sweep_cells.slow_logged)
    sweep.run(study, sys.argv[1], workers=2, batch_size=1, resume=len(sys.argv) > 2,
              progress=False)
"""


def test_killed_client_resumes_without_recomputing_finished_cells(tmp_path):
    """SIGKILL the process running a study (and its local cluster), then resume: every
    cell marked done in the store is kept, and the result equals an uninterrupted run."""
    script = tmp_path / "client.py"
    script.write_text(_CLIENT_SCRIPT)
    store = tmp_path / "s.zarr"
    env = _env()
    env["TPDE_SWEEP_LOG"] = str(tmp_path / "log1")
    env["TPDE_SWEEP_SLEEP"] = "0.15"
    def some_done():
        if not (store / "cell_status").exists():
            return False
        try:
            return int((sweep.open_results(store)["cell_status"] == 1).sum()) >= 8
        except sweep.StoreError:
            return False

    # its process group (the client and its local cluster) is SIGKILLed when the block ends
    with subprocess_runs.started([sys.executable, str(script), str(store)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        _wait_for(some_done, 120, "cells to finish")
    partial = sweep.open_results(store)
    done = partial["cell_status"].values == sweep.DONE
    assert 8 <= done.sum() < done.size
    env["TPDE_SWEEP_LOG"] = str(tmp_path / "log2")
    env["TPDE_SWEEP_SLEEP"] = "0"
    subprocess_runs.run([sys.executable, str(script), str(store), "resume"], env=env,
                        check=True, timeout=300, capture_output=True)
    recomputed = [f.read_text().split(":")[0] for f in (tmp_path / "log2").iterdir()]
    final = sweep.open_results(store)
    assert (final["cell_status"].values == sweep.DONE).all()
    assert len(recomputed) == int((~done).sum())
    assert np.array_equal(final["value"].values[done], partial["value"].values[done])
    study = sweep.Study(sweep.Grid({"mu": [0.0, 1.0, 2.0, 3.0]}, draws=10, seed=9),
                        sweep_cells.slow_logged)
    ref = sweep.run(study, scheduler="serial", progress=False)
    assert final["value"].equals(ref["value"])


# ------------------------------------------------------------------------- built-in cells
def test_cone_cell_equals_a_direct_gaussian_solve():
    from transformer_pde import gaussian

    cell = sweep.ConeCell(kind="softmax", Q=((1.0, 0.3), (0.0, 1.0)), t_max=5.0)
    study = sweep.Study(sweep.Grid({"u": [-0.3, 0.2], "w": [0.0, 0.4]}), cell)
    ds = sweep.run(study, scheduler="serial", progress=False)
    u, w = 0.2, 0.4
    att = tp_attention(np.array([[1.0, 0.3], [0.0, 1.0]]))
    ref = gaussian.solve(att, np.zeros(2), np.array([[(1 + u) / 2, w / 2], [w / 2, (1 - u) / 2]]),
                         t_max=5.0, blowup_threshold=1e8, rtol=1e-10)
    got = ds.sel(u=u, w=w, draw=0)
    assert sweep.STATUS_CODES[int(got["status"])] == str(ref.status)
    assert np.array_equal(got["limit"].values, ref.limit)
    assert float(got["t_final"]) == ref.t_final
    with pytest.raises(ArgumentError, match="not an option"):
        sweep.Study(sweep.Grid({"bogus": [1]}), cell)


def tp_attention(Q):
    from transformer_pde import Attention

    return Attention("softmax", Q, np.eye(2), np.eye(2))


def test_rank_cell_is_the_papers_trial_on_the_cells_stream():
    from transformer_pde.paper import rank_trial

    study = sweep.Study(sweep.Grid({"kind": ["softmax", "l2"], "d": [3]}, draws=2, seed=4),
                        sweep.RankCell(t_max=500.0))
    ds = sweep.run(study, scheduler="serial", progress=False)
    for cell in study.grid:
        ref = rank_trial(cell.params["kind"], 3, "identity", cell.rng(), t_max=500.0)
        pos = study.grid.position(cell.index)
        assert ds["rank"].values[pos] == ref.rank and ds["redraws"].values[pos] == ref.redraws
    assert set(ds["rank"].values.ravel()) <= {-1, 0, 1, 2, 3}


def test_cone_cell_outside_the_cone_fails_with_a_message():
    study = sweep.Study(sweep.Grid({"u": [0.99], "w": [0.5]}), sweep.ConeCell())
    with pytest.warns(sweep.CellFailureWarning, match="inside the cone"):
        ds = sweep.run(study, scheduler="serial", progress=False)
    assert ds["cell_status"].item() == sweep.FAILED


def test_stability_cell_never_exceeds_its_bound():
    study = sweep.Study(sweep.Grid({"delta": [1e-3, 1e-1]}, draws=2, seed=1),
                        sweep.StabilityCell(n=24, t_max=0.5, dt=0.05))
    ds = sweep.run(study, scheduler="serial", progress=False)
    assert (ds["cell_status"] == sweep.DONE).all()
    assert (ds["ratio"] <= ds["bound"] * (1 + 1e-12)).all()
    assert np.allclose(ds["ratio"], ds["w2_t"] / ds["w2_0"], rtol=0, atol=0)


def test_cluster_cell_equals_a_direct_run_and_count():
    import transformer_pde as tp
    from transformer_pde import diagnostics

    cell = sweep.ClusterCell(d=3, n=16, t_max=2.0, dt=0.25, backend="numpy")
    study = sweep.Study(sweep.Grid({"beta": [1.0, 4.0]}, seed=2), cell)
    ds = sweep.run(study, scheduler="serial", progress=False)
    c = study.grid.cell(1)
    X0 = c.rng().normal(size=(16, 3))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), beta=4.0)
    traj = tp.simulate(att, X0, t_max=2.0, dt=0.25, solver="rk4",
                       block=tp.Block(constraint="sphere"))
    cl = diagnostics.clusters(traj.states[-1])
    assert ds["n_clusters"].values[1, 0] == cl.n_clusters
    assert ds["largest"].values[1, 0] == cl.masses.max()
    assert (ds["status"] == sweep.status_code("ok")).all()


# ------------------------------------------------------------------------- config files
def test_study_from_config_names_bad_keys(tmp_path):
    from transformer_pde.errors import ConfigError
    from transformer_pde.sweep.config import run_config, study_from_config

    good = {"study": {"cell": "cone", "draws": 1, "axes": {"u": [0.0], "w": [0.1]}},
            "cell": {"t_max": 2.0}}
    assert study_from_config(good).grid.shape == (1, 1, 1)
    bad = [({"study": {"cell": "nope"}}, "neither a built-in"),
           ({"study": {"cell": "cone", "oops": 1}}, "unknown key 'oops'"),
           ({"study": {"cell": "cone", "axes": {"u": []}}}, "empty"),
           ({"study": {"cell": "cone"}, "cell": {"bogus": 1}}, "bogus"),
           ({"study": {"cell": "cone", "axes": {"zz": [1]}}}, "not an option"),
           ({"study": {"cell": "sweep_cells:noisy_mean"}, "cell": {"a": 1}}, "built-in cells only"),
           ({"study": {"cell": "no_such_module:f"}}, "cannot import"),
           ({"study": {}}, "study.cell is required"),
           ({"study": {"cell": "cone", "draws": 0}}, "draws")]
    for cfg, match in bad:
        with pytest.raises(ConfigError, match=match):
            study_from_config(cfg)
    cfg_path = tmp_path / "s.toml"
    cfg_path.write_text('[study]\ncell = "sweep_cells:noisy_mean"\ndraws = 2\n'
                        '[study.axes]\nmu = [0.0, 1.0]\n')
    s = run_config(cfg_path, tmp_path / "out", scheduler="serial", progress=False)
    assert s["done"] == 4 and (tmp_path / "out" / "summary.json").exists()
    with pytest.raises(sweep.StoreError, match="already exists"):
        run_config(cfg_path, tmp_path / "out", scheduler="serial", progress=False)
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfe[study")
    with pytest.raises(ConfigError, match="not valid TOML"):
        run_config(tmp_path / "bad.toml", tmp_path / "out2", scheduler="serial")
    assert not (tmp_path / "out2").exists()


# ------------------------------------------------------------------------- labelled trajectories
def test_particle_trajectory_round_trips_through_netcdf_and_zarr(tmp_path):
    import transformer_pde as tp
    from transformer_pde.io import labelled

    att = tp.Attention("softmax", np.eye(2), np.eye(2), [[1.0, 0.2], [0.0, 1.0]], beta=0.7,
                       masked=True)
    X0 = np.random.default_rng(0).normal(size=(12, 2))
    traj = tp.simulate(att, X0, positions=np.linspace(0, 1, 12), t_max=0.5, dt=0.1)
    for suffix in (".nc", ".zarr"):
        path = traj.save(tmp_path / f"t{suffix}")
        back = tp.load(path)
        assert np.array_equal(back.states, traj.states)
        assert np.array_equal(back.times, traj.times)
        assert np.array_equal(back.positions, traj.positions)
        assert back.attention.to_dict().keys() == traj.attention.to_dict().keys()
        assert np.array_equal(back.attention.at(0).heads[0].V, traj.attention.at(0).heads[0].V)
        assert back.attention.beta == 0.7 and back.status == traj.status
        with pytest.raises(ArgumentError, match="already exists"):
            labelled.save_dataset(labelled.particle_dataset(traj), path)
    junk = tmp_path / "junk.nc"
    junk.write_bytes(os.urandom(100))
    with pytest.raises(labelled.TrajectoryFileError, match="junk.nc"):
        labelled.open_dataset(junk)


def test_gaussian_trajectory_as_dataset():
    import transformer_pde as tp
    from transformer_pde import gaussian

    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    g = gaussian.solve(att, np.zeros(2), 0.3 * np.eye(2), t_max=1.0, t_eval=[0.0, 0.5, 1.0])
    ds = g.to_xarray()
    assert ds["covs"].dims == ("time", "row", "col") and ds["means"].dims == ("time", "component")
    assert np.array_equal(ds["covs"].values, g.covs) and ds.attrs["status"] == str(g.status)


@pytest.mark.slow  # over 10 s on 2 cores
# ------------------------------------------------------------------------- command line
def test_sweep_command_runs_resumes_and_refuses_cleanly(tmp_path, capsys):
    from transformer_pde.cli import main

    cfg = tmp_path / "s.toml"
    cfg.write_text('name = "t"\n[study]\ncell = "sweep_cells:flaky"\ndraws = 2\n'
                   '[study.axes]\nmu = [0.0, 1.0]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out), "--scheduler", "serial", "-q"]) == 1
    text = capsys.readouterr()
    assert "2 of 4 cells done, 2 failed" in text.out and "this cell always fails" in text.out
    assert json.loads((out / "summary.json").read_text())["failed"] == 2
    # without --resume the store is never touched; with it only the failed cells rerun
    assert main(["sweep", str(cfg), "--out", str(out), "--scheduler", "serial", "-q"]) == 4
    assert "already exists" in capsys.readouterr().err
    assert main(["sweep", str(cfg), "--out", str(out), "--scheduler", "serial", "-q",
                 "--resume"]) == 1
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o2"), "--scheduler",
                 "tcp://127.0.0.1:9", "-q"]) == 4
    err = capsys.readouterr().err
    assert "cannot reach the Dask scheduler" in err and "Traceback" not in err
    assert not (tmp_path / "o2").exists()
    assert main(["sweep", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "o3")]) == 2


def test_statistic_only_trajectory_round_trips(tmp_path):
    import transformer_pde as tp
    from transformer_pde.integrate.loop import SaveAt

    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    X0 = np.random.default_rng(1).normal(size=(10, 2))
    traj = tp.simulate(att, X0, t_max=0.4, dt=0.1,
                       saveat=SaveAt(fn=lambda t, X, w: np.linalg.norm(X, axis=1).max()))
    assert traj.states is None
    back = tp.load(traj.save(tmp_path / "s.zarr"))
    assert back.states is None and np.array_equal(back.values, traj.values)
    for a, b in zip(back.moments(), traj.moments(), strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(back.last, traj.last)


def test_store_chunks_hold_many_consecutive_cells(tmp_path):
    # a chunk per cell meant one ~9 ms Zarr write per cell and variable; finished cells are
    # consecutive in the grid's order, so chunks span whole trailing dimensions (~64 KiB)
    import zarr

    def cell(params, rng):
        return {"x": float(params["a"]), "v": np.full(3, rng.normal())}

    study = sweep.Study(sweep.Grid({"a": list(range(50)), "b": [0, 1]}, draws=3, seed=1), cell)
    ds = sweep.run(study, tmp_path / "s.zarr", scheduler="serial", progress=False)
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    assert g["x"].chunks == (50, 2, 3) and g["v"].chunks == (50, 2, 3, 3)
    assert g["cell_status"].nchunks_initialized == 1
    assert sweep.open_results(tmp_path / "s.zarr")["v"].equals(ds["v"])
    assert sweep.Grid({"a": list(range(100)), "b": list(range(100))},
                      draws=10).chunks(8) == (8, 100, 10)
    assert sweep.Grid({"a": list(range(100))}, draws=10).chunks(8 * 800) == (1, 10)
