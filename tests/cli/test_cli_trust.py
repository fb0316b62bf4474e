"""Trust, round 2: SIGTERM keeps the work like Ctrl-C (exit 143), a killed run's staging
directory is removed by the next run, an output directory is claimed by one run at a time,
``--checkpoint`` never replaces a file that is not a checkpoint, a bad ``--scheduler`` or
``--scheduler-file`` is one line naming the option, an edited cell function cannot complete
a study's store, and the rank study does not depend on the BLAS thread count."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from subprocess_runs import DEADLINE, run, started, wait_for_checkpoints
from transformer_pde import cli, load, sweep
from transformer_pde.cli import ExitCode
from transformer_pde.cli.output import (LOCK_NAME, STAGING_PREFIX, OutputDir, OutputError,
                                        remove_stale_staging)

ROOT = Path(__file__).resolve().parents[2]
#: generous deadlines: a subprocess may compile every Numba kernel from a cold cache
#: (NUMBA_CACHE_DIR empty) on a loaded machine; the warm-up fixture takes that cost first

LONG = """
[attention]
d = 2
V = -1.0
[tokens]
n = 16
[run]
t_max = {t_max}
dt = 0.01
save_every = 50
[output]
figure = false
"""


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "transformer_pde.cli", *args]


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> None:
    """Run the subprocesses' computation once (a short run of the same problem, same
    environment) so that Numba's cache is filled before any test times its subprocess."""
    tmp = tmp_path_factory.mktemp("warm")
    cfg = tmp / "warm.toml"
    cfg.write_text(LONG.format(t_max=1.0))
    proc = run(_cli("simulate", str(cfg), "--out", str(tmp / "o"), "-q"),
               capture_output=True, text=True, env=_env(), cwd=tmp, timeout=900)
    assert proc.returncode == 0, proc.stderr


@contextlib.contextmanager
def _start_long(tmp_path: Path, out: Path) -> Iterator[tuple[subprocess.Popen, Path]]:
    """The long run in a subprocess, its process group killed when the test ends."""
    cfg = tmp_path / "long.toml"
    cfg.write_text(LONG.format(t_max=9000.0))
    ck = tmp_path / "run.ckpt"
    with started(_cli("simulate", str(cfg), "--out", str(out), "-q", "--checkpoint",
                      str(ck), "--checkpoint-every", "0.02"),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env=_env(), cwd=tmp_path) as proc:
        yield proc, ck


# --------------------------------------------------------------------------- signals
def test_sigterm_writes_the_states_and_exits_143(tmp_path, warm):
    out = tmp_path / "o"
    with _start_long(tmp_path, out) as (proc, ck):
        wait_for_checkpoints(proc, ck)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == ExitCode.TERMINATED == 143, err
    assert "Traceback" not in err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("transformer-pde simulate: terminated (SIGTERM) at t = "), last
    traj = load(out / "trajectory.npz")
    assert traj.status == "interrupted" and 0 < traj.times[-1] < 9000.0
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "trajectory.npz"]


def test_sigkill_leaves_staging_that_the_next_run_removes(tmp_path, warm):
    out = tmp_path / "o"
    with _start_long(tmp_path, out) as (proc, ck):
        wait_for_checkpoints(proc, ck)
        proc.kill()  # SIGKILL: no clean-up at all
        proc.communicate(timeout=DEADLINE)
    stale = [p for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert len(stale) == 1 and (out / LOCK_NAME).is_file()
    assert str(proc.pid) in stale[0].name
    cfg = tmp_path / "short.toml"
    cfg.write_text(LONG.format(t_max=1.0))
    rerun = run(_cli("simulate", str(cfg), "--out", str(out), "-q"),
                capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=DEADLINE)
    assert rerun.returncode == ExitCode.OK, rerun.stderr
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "trajectory.npz"]


def test_staging_of_a_live_process_is_kept(tmp_path):
    with started([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        with started([sys.executable, "-c", "pass"]) as dead:
            dead.wait()
        with OutputDir(tmp_path / "probe") as probe:  # this machine's staging name
            host = probe.staging.name[len(STAGING_PREFIX):].split(".")[1]
            probe.discard()
        keep = tmp_path / f"{STAGING_PREFIX}{live.pid}.{host}.abc"
        gone = tmp_path / f"{STAGING_PREFIX}{dead.pid}.{host}.abc"
        other = tmp_path / f"{STAGING_PREFIX}{dead.pid}.00000000.abc"  # another machine
        legacy = tmp_path / f"{STAGING_PREFIX}abc123"  # no process id in the name
        for p in (keep, gone, other, legacy):
            p.mkdir()
            (p / "trajectory.npz").write_bytes(b"partial")
        if host == "00000000":
            other = legacy
        assert remove_stale_staging(tmp_path) == [gone]
        assert keep.is_dir() and other.is_dir() and legacy.is_dir() and not gone.exists()


# --------------------------------------------------------------------------- claims
def test_an_output_directory_has_one_writer_at_a_time(tmp_path):
    out = tmp_path / "new" / "o"
    first = OutputDir(out)
    with pytest.raises(OutputError, match="in use by another transformer-pde run"):
        OutputDir(out)
    with pytest.raises(OutputError, match="in use"):
        OutputDir(out, force=True)  # --force does not share a directory with a live run
    first.write_text("a.txt", "first")
    first.commit()
    assert sorted(p.name for p in out.iterdir()) == ["a.txt"]  # lock released
    with OutputDir(out, force=True) as second:
        second.write_text("b.txt", "second")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]


def test_racing_claims_have_exactly_one_winner(tmp_path):
    for k in range(20):
        out = tmp_path / f"o{k}"
        barrier = threading.Barrier(4)
        won, lost = [], []

        def claim(out=out, barrier=barrier, won=won, lost=lost) -> None:
            barrier.wait()
            try:
                won.append(OutputDir(out))
            except OutputError as exc:
                lost.append(str(exc))

        threads = [threading.Thread(target=claim) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, lost
        assert all(str(out) in m for m in lost)
        won[0].discard()
        # nothing left behind (the directory itself when the winner created it)
        assert not out.exists() or list(out.iterdir()) == []


def test_second_simulate_into_a_claimed_directory_is_refused(tmp_path, capsys):
    with started([sys.executable, "-c", "import time; time.sleep(60)"]) as holder:
        with OutputDir(tmp_path / "probe") as probe:
            host = probe.staging.name[len(STAGING_PREFIX):].split(".")[1]
            probe.discard()
        out = tmp_path / "o"
        out.mkdir()
        (out / LOCK_NAME).write_text(f"{holder.pid} {host}\n")  # a live run holds it
        cfg = tmp_path / "s.toml"
        cfg.write_text(LONG.format(t_max=0.5))
        for extra in ([], ["--force"]):
            assert cli.main(["simulate", str(cfg), "--out", str(out), "-q", *extra]) == \
                ExitCode.OUTPUT
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and str(out) in err and f"process {holder.pid}" in err
            assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
        holder.kill()
        holder.wait()
        # its process gone, the claim is stale and taken over
        assert cli.main(["simulate", str(cfg), "--out", str(out), "-q"]) == ExitCode.OK
        assert sorted(p.name for p in out.iterdir()) == ["summary.json", "trajectory.npz"]


# --------------------------------------------------------------------------- --checkpoint
@pytest.mark.parametrize("which, words", [("config", "not a transformer-pde checkpoint"),
                                          ("dot", "is a folder"),
                                          ("devnull", "not a regular file"),
                                          ("missing_dir", "does not exist")])
def test_bad_checkpoint_paths_are_refused(tmp_path, capsys, monkeypatch, which, words):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "c.toml"
    cfg.write_text(LONG.format(t_max=0.5))
    before = cfg.read_bytes()
    path = {"config": "c.toml", "dot": ".", "devnull": os.devnull,
            "missing_dir": "nowhere/run.ckpt"}[which]
    rc = cli.main(["simulate", "c.toml", "--out", "o", "-q", "--checkpoint", path])
    err = capsys.readouterr().err
    assert rc == ExitCode.USAGE, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"--checkpoint {path}" in err and words in err
    assert cfg.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_library_checkpoint_error_is_a_usage_error(tmp_path, capsys, monkeypatch):
    from transformer_pde import particles
    from transformer_pde.errors import CheckpointError

    def refuse(*args, **kwargs):
        raise CheckpointError("checkpoint path refused by the library")

    monkeypatch.setattr(particles, "simulate", refuse)
    cfg = tmp_path / "c.toml"
    cfg.write_text(LONG.format(t_max=0.5))
    rc = cli.main(["simulate", str(cfg), "--out", str(tmp_path / "o"), "-q", "--checkpoint",
                   str(tmp_path / "run.ckpt")])
    err = capsys.readouterr().err
    assert rc == ExitCode.USAGE
    assert err == (f"transformer-pde simulate: --checkpoint {tmp_path / 'run.ckpt'}: "
                   "checkpoint path refused by the library\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


# --------------------------------------------------------------------------- --scheduler
CONE = """
[attention]
d = 2
kind = "softmax"
[cone]
n = 2
t_max = 1.0
n_eval = 5
"""


@pytest.mark.parametrize("option, value, words", [
    ("--scheduler", "bogus-address", "expected 'serial' or an address"),
    ("--scheduler", "tcp://host:99999", "expected 'serial' or an address"),
    ("--scheduler-file", "garbage", "not JSON"),
    ("--scheduler-file", "list", "no \"address\""),
    ("--scheduler-file", "badaddr", "is not an address"),
    ("--scheduler-file", "missing", "does not exist"),
])
def test_bad_scheduler_is_one_line_naming_the_option(tmp_path, capsys, option, value, words):
    files = {"garbage": "{not json", "list": "[1, 2]",
             "badaddr": json.dumps({"address": "bogus-address"})}
    if option == "--scheduler-file":
        path = tmp_path / f"{value}.json"
        if value in files:
            path.write_text(files[value])
        value = str(path)
    cfg = tmp_path / "cone.toml"
    cfg.write_text(CONE)
    out = tmp_path / "o"
    for command in (["cone", str(cfg)], ["ranks", "--dims", "2", "--draws", "1"]):
        rc = cli.main([*command, "--out", str(out), "-q", option, value])
        err = capsys.readouterr().err
        assert rc == ExitCode.USAGE, err
        assert err.count("\n") == 1 and f"{option} " in err and words in err, err
        assert not out.exists()


def test_unreachable_scheduler_is_a_clear_error_within_the_timeout(tmp_path, capsys,
                                                                   monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("transformer_pde.sweep.run"),
                        "CONNECT_TIMEOUT", 1.0)
    cfg = tmp_path / "cone.toml"
    cfg.write_text(CONE)
    t0 = time.monotonic()
    rc = cli.main(["cone", str(cfg), "--out", str(tmp_path / "o"), "-q", "--scheduler",
                   "tcp://127.0.0.1:9"])
    assert time.monotonic() - t0 < 30
    err = capsys.readouterr().err
    assert rc == ExitCode.ERROR, err
    assert err.count("\n") == 1 and "--scheduler tcp://127.0.0.1:9" in err
    assert "cannot reach" in err and "within 1 s" in err
    assert list(tmp_path.iterdir()) == [cfg]


def test_check_scheduler_library_errors(tmp_path):
    from transformer_pde.errors import ArgumentError
    from transformer_pde.sweep.run import SchedulerArgumentError, check_scheduler

    for ok in ("serial", "tcp://10.0.0.5:8786", "10.0.0.5:8786", "tls://sched.example:8786",
               "tcp://[::1]:8786", "inproc://10.0.0.1/123/1"):
        check_scheduler(ok)
    for bad in ("bogus-address", "tcp://", "http://h:1", "tcp://h:0", "h:port"):
        with pytest.raises(ArgumentError, match="scheduler"):
            check_scheduler(bad)
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"address": "tcp://127.0.0.1:8786", "type": "Scheduler"}))
    check_scheduler(scheduler_file=good)
    with pytest.raises(sweep.SchedulerError):  # also a SchedulerError
        check_scheduler(scheduler_file=tmp_path / "none.json")
    assert issubclass(SchedulerArgumentError, ArgumentError)


# --------------------------------------------------------------------------- fingerprints
CELL_V1 = """
def cell(params, rng):
    return {"y": params["x"] * 2.0}
"""
CELL_V2 = """
def cell(params, rng):
    return {"y": params["x"] * 3.0}
"""


def _module_cell(name: str, source: str):
    mod = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)  # no source file: bytecode
    return mod.cell


def test_an_edited_cell_function_cannot_complete_a_store(tmp_path):
    v1, v2 = _module_cell("trust_cells", CELL_V1), _module_cell("trust_cells", CELL_V2)
    assert v1.__qualname__ == v2.__qualname__ and v1.__module__ == v2.__module__
    grid = sweep.Grid({"x": [1.0, 2.0, 3.0]})
    store = tmp_path / "s.zarr"
    first = sweep.Study(grid, v1, outputs={"y": sweep.Output()})
    assert first.fingerprint() == sweep.Study(grid, _module_cell("trust_cells", CELL_V1),
                                              outputs={"y": sweep.Output()}).fingerprint()
    sweep.run(first, store, scheduler="serial", progress=False)
    second = sweep.Study(grid, v2, outputs={"y": sweep.Output()})
    assert second.fingerprint() != first.fingerprint()
    with pytest.raises(sweep.StoreError, match="another version of the cell function "
                                               "trust_cells:cell"):
        sweep.run(second, store, scheduler="serial", progress=False, resume=True)
    ds = sweep.run(first, store, scheduler="serial", progress=False, resume=True)
    np.testing.assert_array_equal(ds["y"].values[:, 0], [2.0, 4.0, 6.0])


def test_code_digest_sees_defaults_closures_and_source():
    from transformer_pde.sweep.study import code_digest

    def make(scale):
        def cell(params, rng):
            return {"y": params["x"] * scale}
        return cell

    def with_default(params, rng, scale=2.0):
        return {"y": params["x"] * scale}

    def with_other_default(params, rng, scale=3.0):
        return {"y": params["x"] * scale}

    assert code_digest(make(2.0)) == code_digest(make(2.0))
    assert code_digest(make(2.0)) != code_digest(make(3.0))
    assert code_digest(with_default) != code_digest(with_other_default)
    assert code_digest(make(np.arange(3.0))) != code_digest(make(np.arange(4.0)))


# --------------------------------------------------------------------------- ranks
RANK_SCRIPT = """
import json, sys, warnings
warnings.simplefilter("ignore")
from transformer_pde.paper import rank_sweep_trials
from transformer_pde.paper.threads import blas_threads
out = {"threads": blas_threads()}
for kind in ("softmax", "l2"):
    r, s = rank_sweep_trials(kind, 4, range(8), value="random", draws=8, seed=2)
    out[kind] = [r.tolist(), s.tolist()]
print(json.dumps(out))
"""


def test_rank_draws_do_not_depend_on_the_blas_thread_count(tmp_path, warm):
    results = []
    for n in ("1", "2"):
        env = {**_env(), "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n}
        proc = run([sys.executable, "-c", RANK_SCRIPT], capture_output=True,
                   text=True, env=env, cwd=tmp_path, timeout=DEADLINE)
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for r in results:
        r.pop("threads")
    assert results[0] == results[1]


def test_rank_draws_are_solved_with_one_blas_thread(monkeypatch):
    from threadpoolctl import threadpool_limits

    from transformer_pde import gaussian
    from transformer_pde.paper import rank_sweep_trials
    from transformer_pde.paper.threads import blas_threads

    if not blas_threads():
        pytest.skip("no controllable BLAS in this process")
    seen = []
    solve = gaussian.solve_batch

    def recording(*args, **kwargs):
        seen.append(blas_threads())
        return solve(*args, **kwargs)

    monkeypatch.setattr(gaussian, "solve_batch", recording)
    with threadpool_limits(limits=2, user_api="blas"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rank_sweep_trials("softmax", 3, range(3), value="random", draws=3)
        assert seen and all(set(s) == {1} for s in seen), seen
        assert set(blas_threads()) == {2}  # restored


def test_rank_cells_equal_on_serial_and_dask(tmp_path):
    from transformer_pde.sweep import RankSweepCell

    grid = sweep.Grid({"kind": ["softmax", "l2"], "value": ["random"], "d": [4],
                       "trial": list(range(4))}, draws=1, seed=2)

    def study():
        return sweep.Study(grid, RankSweepCell(draws=4, seed=2), name="ranks")

    serial = sweep.run(study(), scheduler="serial", progress=False)
    dask = sweep.run(study(), workers=2, progress=False)
    for name in ("cell_status", "rank", "status"):
        np.testing.assert_array_equal(serial[name].values, dask[name].values, err_msg=name)
