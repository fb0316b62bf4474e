"""How the embedded cluster starts its worker processes (forked from the calling process,
inheriting its imports and compiled kernels, where that is safe; spawned otherwise), and
how a study's cells are cut into Dask tasks."""

import importlib
import os
import sys
import types
from pathlib import Path

import pytest

import subprocess_runs

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")
run_module = importlib.import_module("transformer_pde.sweep.run")  # the module, not sweep.run

ROOT = Path(__file__).resolve().parents[2]


def _numba_pool(monkeypatch, initialized):
    """This process as if Numba's thread pool were (not) running."""
    fake = types.ModuleType("numba.np.ufunc.parallel")
    fake._is_initialized = initialized
    monkeypatch.setitem(sys.modules, "numba", sys.modules.get("numba", types.ModuleType("numba")))
    monkeypatch.setitem(sys.modules, "numba.np.ufunc.parallel", fake)


@pytest.mark.skipif(sys.platform != "linux", reason="fork is used on Linux only")
def test_fork_on_linux_unless_numbas_thread_pool_runs(monkeypatch):
    _numba_pool(monkeypatch, False)
    assert run_module._embedded_start_method() == "fork"
    # the OpenMP / workqueue pools are not fork-safe: a forked child entering a parallel
    # region is terminated, so the workers are spawned
    _numba_pool(monkeypatch, True)
    assert run_module._embedded_start_method() == "spawn"


@pytest.mark.skipif(sys.platform != "linux", reason="fork is used on Linux only")
def test_no_fork_while_a_kernel_compiles_in_the_background(monkeypatch):
    # a forked child would inherit Numba's compiler lock held by the compiling thread
    _numba_pool(monkeypatch, False)
    monkeypatch.setattr(run_module.compile_notice, "running", lambda: True)
    assert run_module._embedded_start_method() == "spawn"
    monkeypatch.setattr(run_module.compile_notice, "running", lambda: False)
    assert run_module._embedded_start_method() == "fork"


def test_explicit_dask_setting_and_other_platforms_keep_their_method(monkeypatch):
    _numba_pool(monkeypatch, False)
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
        assert run_module._embedded_start_method() == "forkserver"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert run_module._embedded_start_method() == "spawn"


_FORK_SCRIPT = """
import sys

from transformer_pde import sweep
from transformer_pde.sweep.run import _embedded_start_method



def sees_mark(params, rng):
    # the mark is set at run time on a module of the calling process: a forked worker has
    # it, a spawned one imports the module afresh (this function itself is pickled by
    # value, with its globals, so a global of this script would not tell them apart)
    import transformer_pde.sweep.study as study_module

    return {"mark": getattr(study_module, "_TEST_RUN_TIME_MARK", 0),
            "value": float(rng.normal(loc=params["mu"]))}


if __name__ == "__main__":
    import transformer_pde.sweep.study as study_module

    study_module._TEST_RUN_TIME_MARK = 1
    outputs = {"mark": sweep.Output((), "int64"), "value": sweep.Output()}

    def study():
        return sweep.Study(sweep.Grid({"mu": [0.0, 1.0, 2.0]}, draws=3, seed=11), sees_mark,
                           outputs=outputs)

    method = _embedded_start_method()
    ds = sweep.run(study(), sys.argv[1], workers=2, batch_size=1, progress=False)
    ref = sweep.run(study(), scheduler="serial", progress=False)
    print(method, int(ds["mark"].sum()), int(ds["cell_status"].sum()),
          ds["value"].equals(ref["value"]))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fork is used on Linux only")
def test_embedded_cluster_workers_are_forked_and_equal_serial(tmp_path):
    # a fresh interpreter (Numba's pool never started): the embedded cluster forks its
    # workers; each of the 9 cells sees the mark set at run time in the calling process (a
    # spawned worker would import the package afresh, without it), and the values are those
    # of the serial run, bit for bit
    script = tmp_path / "fork_study.py"
    script.write_text(_FORK_SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess_runs.run([sys.executable, str(script), str(tmp_path / "s.zarr")], env=env,
                              capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["fork", "9", "9", "True"]


@pytest.mark.parametrize("n_cells, workers", [(1, 1), (7, 2), (204, 2), (5000, 16)])
def test_guided_batches_cover_every_cell_once_and_end_with_single_cells(n_cells, workers):
    pending = list(range(3, 3 + n_cells))
    batches = run_module._batches(pending, workers, None)
    assert [i for b in batches for i in b] == pending      # every cell once, in order
    sizes = [len(b) for b in batches]
    assert all(1 <= s <= 64 for s in sizes)
    assert sizes == sorted(sizes, reverse=True)             # large first, small last
    # each task takes 1/(8 W) of the cells not yet given out: once at most 8 W are left
    # (8 W - 1 at least, as a task of 2 can cross that mark) tasks are single cells
    tail = min(n_cells, 8 * workers - 1)
    assert sizes[-tail:] == [1] * tail
    # a given batch_size is kept
    assert [len(b) for b in run_module._batches(pending, workers, 5)][:-1] == \
        [5] * ((n_cells - 1) // 5)
