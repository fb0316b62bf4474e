"""A quiet CLI: Dask's log records and other libraries' warnings (also the workers') are
counted in one summary line on stderr, shown in full with ``-v``; Ctrl-C in a terminal
(SIGINT to the whole process group, workers included) prints no worker traceback."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from subprocess_runs import run, signal_group, started
from transformer_pde.cli import main
from transformer_pde.cli.quiet import Quiet
from transformer_pde.errors import TransformerPDEWarning

ROOT = Path(__file__).resolve().parents[2]


class _OwnWarning(TransformerPDEWarning):
    pass


def noisy_cell(params, rng):
    """A cell (run in this process with --scheduler serial) that warns like scipy, logs like
    Dask and warns once as the package does."""
    warnings.warn("overflow encountered in multiply", RuntimeWarning, stacklevel=1)
    logging.getLogger("distributed.worker").warning("Compute Failed (a test record)")
    if params["mu"] == 0.0 and rng is not None:
        warnings.warn("a message of the package", _OwnWarning, stacklevel=1)
    return {"value": float(rng.uniform())}


def _config(tmp_path: Path, cell: str, mus: str = "[0.0, 1.0]", draws: int = 1) -> str:
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'[study]\ncell = "{cell}"\ndraws = {draws}\n[study.axes]\nmu = {mus}\n')
    return str(cfg)


def test_other_warnings_and_dask_records_are_one_summary_line(tmp_path, capsys, caplog):
    cfg = _config(tmp_path, f"{__name__}:noisy_cell")
    assert main(["sweep", cfg, "--out", str(tmp_path / "o"), "--scheduler", "serial",
                 "-q"]) == 0
    err = capsys.readouterr().err.splitlines()
    # the package's warning is shown (one line); the rest is one line at the end
    assert err[0] == "transformer-pde sweep: warning: _OwnWarning: a message of the package"
    assert err[-1].startswith("transformer-pde sweep: not shown: ")
    assert "RuntimeWarning: overflow encountered in multiply" in err[-1]
    assert "Dask log message" in err[-1] and "WARNING" in err[-1]
    assert err[-1].endswith("run with -v to see them")
    assert len(err) == 2, err
    assert not any("Compute Failed" in r.getMessage() for r in caplog.records)
    assert logging.getLogger("distributed").propagate  # restored after the command


def test_verbose_shows_everything_in_full(tmp_path, capsys, caplog):
    cfg = _config(tmp_path, f"{__name__}:noisy_cell")
    assert main(["sweep", cfg, "--out", str(tmp_path / "o"), "--scheduler", "serial", "-q",
                 "-v"]) == 0
    err = capsys.readouterr().err
    assert "not shown" not in err
    # with its source location, as Python shows it
    assert f"{__file__}:" in err and "RuntimeWarning: overflow encountered in multiply" in err
    # the record reaches the root handlers (here pytest's; the command's own on stderr)
    assert any("Compute Failed" in r.getMessage() for r in caplog.records)


def test_summary_counts():
    q = Quiet("transformer-pde x", verbose=False)
    assert q.summary() is None
    for _ in range(3):
        q.show_warning("overflow", RuntimeWarning, "f.py", 1)
    q.show_warning("other", UserWarning, "f.py", 2)
    with q:
        logging.getLogger("distributed.nanny").warning("w")
        logging.getLogger("distributed.scheduler").error("e")
        logging.getLogger("distributed.scheduler").info("not counted")
    assert q.summary() == ("transformer-pde x: not shown: 4 warnings (RuntimeWarning: overflow "
                           "x3; 1 other kind) and 2 Dask log messages (ERROR x1, WARNING x1); "
                           "run with -v to see them")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                         env.get("PYTHONPATH", "")])
    env["NUMBA_NUM_THREADS"] = "1"
    env["MPLBACKEND"] = "Agg"
    return env


def test_embedded_cluster_run_prints_no_dask_logs(tmp_path):
    cfg = _config(tmp_path, "sweep_cells:noisy_mean")
    proc = run([sys.executable, "-m", "transformer_pde.cli", "sweep", cfg, "--out",
                str(tmp_path / "o"), "--workers", "1", "-q"], capture_output=True,
               text=True, env=_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # before: some thirty INFO lines of the scheduler, nannies and workers
    assert proc.stderr == "", proc.stderr


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_prints_no_worker_traceback(tmp_path):
    log = tmp_path / "cells"
    cfg = _config(tmp_path, "sweep_cells:slow_logged", mus="[0.0, 1.0, 2.0, 3.0]", draws=50)
    env = {**_env(), "TPDE_SWEEP_LOG": str(log), "TPDE_SWEEP_SLEEP": "0.3"}
    # a terminal's Ctrl-C signals the whole foreground process group: the command and its
    # Dask worker processes
    with started([sys.executable, "-m", "transformer_pde.cli", "sweep", cfg,
                  "--out", str(tmp_path / "o"), "--workers", "2", "-q"],
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                 cwd=tmp_path) as proc:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if log.is_dir() and len(list(log.iterdir())) >= 4:  # both workers run cells
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        signal_group(proc, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("transformer-pde sweep: interrupted"), err
    assert len(lines) <= 2, err  # the result line, and at most the summary of hidden records
