"""Ctrl-C keeps the work (issue 13, item 9): SIGINT to a running ``transformer-pde simulate``
writes the states computed so far (a trajectory :func:`transformer_pde.load` reads, status
``interrupted``) and exits with status 130 after one line on stderr."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from subprocess_runs import DEADLINE, run, started, wait_for_checkpoints
from transformer_pde import load
from transformer_pde.cli import ExitCode

ROOT = Path(__file__).resolve().parents[2]

LONG = """
[attention]
d = 2
V = -1.0
[tokens]
n = 16
[run]
t_max = 9000.0
dt = 0.01
save_every = 50
[output]
figure = false
"""


@contextlib.contextmanager
def _start(tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """The long run in a subprocess (with default SIGINT whatever the test process's), and
    its process group killed when the test ends."""
    cfg = tmp_path / "long.toml"
    cfg.write_text(LONG)
    out = tmp_path / "o"
    ck = tmp_path / "run.ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    with started([sys.executable, "-m", "transformer_pde.cli", "simulate", str(cfg),
                  "--out", str(out), "-q", "--checkpoint", str(ck),
                  "--checkpoint-every", "0.05", *extra],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                 cwd=tmp_path) as proc:
        yield proc, out, ck


#: deadlines allow for a subprocess that compiles every Numba kernel from a cold cache
#: (an empty NUMBA_CACHE_DIR) on a loaded machine; the warm-up fixture pays it first


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> None:
    """The same computation once, in a subprocess with the same environment (a short run of
    the same problem), so that the Numba cache is filled before a test times its run."""
    tmp = tmp_path_factory.mktemp("warm")
    cfg = tmp / "warm.toml"
    cfg.write_text(LONG.replace("9000.0", "1.0"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    proc = run([sys.executable, "-m", "transformer_pde.cli", "simulate", str(cfg),
                "--out", str(tmp / "o"), "-q"], capture_output=True, text=True,
               env=env, cwd=tmp, timeout=900)
    assert proc.returncode == 0, proc.stderr


def test_sigint_writes_the_states_and_exits_130(tmp_path, warm):
    with _start(tmp_path) as (proc, out, ck):
        wait_for_checkpoints(proc, ck)
        proc.send_signal(signal.SIGINT)
        stdout, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == ExitCode.INTERRUPTED == 130, err
    assert "Traceback" not in err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("transformer-pde simulate: interrupted at t = ")
    assert "trajectory.npz" in last
    traj = load(out / "trajectory.npz")
    assert traj.status == "interrupted"
    assert len(traj.times) >= 2 and 0 < traj.times[-1] < 9000.0
    assert np.all(np.diff(traj.times) > 0)
    assert traj.states.shape == (len(traj.times), 16, 2)
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["t_final"] == pytest.approx(traj.times[-1])
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "trajectory.npz"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


SHORT = """
[attention]
d = 2
V = -1.0
[tokens]
n = 10
seed = 4
[run]
t_max = 3.0
dt = 0.01
save_every = 7
[output]
figure = false
"""


def test_interrupt_then_resume_equals_the_uninterrupted_run(tmp_path, monkeypatch, capsys):
    """Ctrl-C (a KeyboardInterrupt raised inside the 120th field evaluation) with
    ``--checkpoint``, then ``--resume`` into the same ``--out``: the result is the
    uninterrupted run's, bit for bit."""
    from transformer_pde import cli
    from transformer_pde.fields import FieldEvaluator

    cfg = tmp_path / "short.toml"
    cfg.write_text(SHORT)
    ck = tmp_path / "run.ckpt"
    out = tmp_path / "o"
    argv = ["simulate", str(cfg), "--out", str(out), "-q", "--checkpoint", str(ck),
            "--checkpoint-every", "1e-9"]

    call = FieldEvaluator.__call__
    count = {"n": 0}

    def interrupting(self, *args, **kwargs):
        count["n"] += 1
        if count["n"] == 120:
            raise KeyboardInterrupt
        return call(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(FieldEvaluator, "__call__", interrupting)
        assert cli.main(argv) == ExitCode.INTERRUPTED
    err = capsys.readouterr().err
    assert err.startswith("transformer-pde simulate: interrupted at t = ")
    part = load(out / "trajectory.npz")
    assert part.status == "interrupted" and part.times[-1] < 3.0
    assert ck.is_file()

    # without --resume (or --force) the interrupted run's files are kept
    assert cli.main(argv) == ExitCode.OUTPUT
    capsys.readouterr()
    assert cli.main(argv + ["--resume"]) == ExitCode.OK
    done = load(out / "trajectory.npz")
    assert done.status == "ok"

    ref_out = tmp_path / "ref"
    assert cli.main(["simulate", str(cfg), "--out", str(ref_out), "-q"]) == ExitCode.OK
    ref = load(ref_out / "trajectory.npz")
    np.testing.assert_array_equal(done.times, ref.times)
    np.testing.assert_array_equal(done.states, ref.states)
    # the resumed run replaced the interrupted run's files; a second --resume does not
    # replace a finished run's files
    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
    assert cli.main(argv + ["--resume"]) == ExitCode.OUTPUT


def test_resume_needs_a_checkpoint(tmp_path, capsys):
    from transformer_pde import cli

    cfg = tmp_path / "short.toml"
    cfg.write_text(SHORT)
    out = tmp_path / "o"
    assert cli.main(["simulate", str(cfg), "--out", str(out), "--resume"]) == ExitCode.USAGE
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "checkpoint" in line
    assert not out.exists()


def test_demo_interrupted_keeps_its_files(tmp_path, monkeypatch, capsys):
    from transformer_pde import cli
    from transformer_pde.fields import FieldEvaluator

    call = FieldEvaluator.__call__
    count = {"n": 0}

    def interrupting(self, *args, **kwargs):
        count["n"] += 1
        if count["n"] == 30:
            raise KeyboardInterrupt
        return call(self, *args, **kwargs)

    monkeypatch.setattr(FieldEvaluator, "__call__", interrupting)
    out = tmp_path / "demo"
    assert cli.main(["demo", "--n", "20", "--out", str(out)]) == ExitCode.INTERRUPTED
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "interrupted" in captured.err
    assert load(out / "trajectory.npz").status == "interrupted"


def test_other_commands_interrupted_write_nothing(tmp_path, monkeypatch, capsys):

    from transformer_pde import cli, sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    # Ctrl-C before any cell of the study finished
    monkeypatch.setattr(sweep.RankSweepCell, "run_batch", interrupted)
    monkeypatch.setattr(sweep.RankSweepCell, "__call__", interrupted)
    out = tmp_path / "r"
    assert cli.main(["ranks", "--dims", "2", "--draws", "2", "--out", str(out),
                     "-q", "--scheduler", "serial"]) == ExitCode.INTERRUPTED
    assert capsys.readouterr().err == "transformer-pde ranks: interrupted; nothing was written\n"
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_log_lines_never_break_the_progress_bar(tmp_path, warm):
    """With a progress bar and INFO lines on one stderr, every log line starts a line of its
    own: the bar is cleared before it and redrawn after it (tqdm.write)."""
    cfg = tmp_path / "short.toml"
    cfg.write_text(LONG.replace("9000.0", "30.0").replace("save_every = 50", "save_every = 500"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    proc = run([sys.executable, "-m", "transformer_pde.cli", "simulate", str(cfg),
                "--out", str(tmp_path / "o"), "--verbose", "--report-every", "0.02"],
               capture_output=True, text=True, env=env, cwd=tmp_path, timeout=DEADLINE)
    assert proc.returncode == ExitCode.OK, proc.stderr
    logged = [line for line in proc.stderr.split("\n") if "INFO" in line]
    assert len(logged) >= 3, proc.stderr
    # what a terminal shows of each such line is the text after its last carriage return
    for line in logged:
        assert line.rsplit("\r", 1)[-1].startswith("INFO"), repr(line)
    assert "%|" in proc.stderr  # the bar was drawn
