"""The command line never shows a Python traceback (issue 13, item 8).

Every failure ends with one line on stderr naming the problem and a documented exit
status (``transformer-pde --help``), leaves no output directory behind, and never
overwrites earlier outputs unless ``--force`` is given.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from subprocess_runs import run
from transformer_pde import cli, load

ROOT = Path(__file__).resolve().parents[2]
EXIT = cli.ExitCode


def _write(path: Path, text: str | bytes) -> str:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def _one_line(err: str) -> str:
    """The error output is exactly one line and carries no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


TINY = """
[attention]
d = {d}
V = -1.0
[tokens]
n = 8
[run]
t_max = 0.2
dt = 0.1
"""


# --------------------------------------------------------------------------- d = 1
def test_simulate_d1_writes_every_file(tmp_path, capsys):
    cfg = _write(tmp_path / "d1.toml", TINY.format(d=1))
    out = tmp_path / "o"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == EXIT.OK
    assert sorted(p.name for p in out.iterdir()) == ["particles.png", "summary.json",
                                                      "trajectory.npz"]
    traj = load(out / "trajectory.npz")
    assert traj.states.shape == (3, 8, 1)
    assert json.loads((out / "summary.json").read_text())["d"] == 1
    assert "Traceback" not in capsys.readouterr().err


def test_simulate_d1_gif_is_a_config_error(tmp_path, capsys):
    cfg = _write(tmp_path / "d1.toml", TINY.format(d=1) + "[output]\ngif = true\n")
    out = tmp_path / "o"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == EXIT.USAGE
    assert "output.gif" in _one_line(capsys.readouterr().err)
    assert not out.exists()


# --------------------------------------------------------------------------- --out
def _commands(tmp_path: Path, out: str) -> dict[str, list[str]]:
    sim = _write(tmp_path / "s.toml", TINY.format(d=2))
    gau = _write(tmp_path / "g.toml", "[attention]\nd = 2\n[gaussian]\nt_max = 0.1\n")
    return {
        "demo": ["demo", "--n", "5", "--t-max", "0.1", "--out", out],
        "simulate": ["simulate", sim, "--out", out, "-q"],
        "gaussian": ["gaussian", gau, "--out", out],
        "ranks": ["ranks", "--dims", "2", "--draws", "2", "--kinds", "softmax", "--values",
                  "identity", "--out", out, "-q"],
        "bench": ["bench", "--backends", "numpy", "--out", out],
    }


@pytest.mark.parametrize("command", ["demo", "simulate", "gaussian", "ranks", "bench"])
def test_out_is_a_file(tmp_path, capsys, command):
    target = tmp_path / "afile"
    target.write_text("keep me")
    argv = _commands(tmp_path, str(target))[command]
    assert cli.main(argv) == EXIT.OUTPUT
    line = _one_line(capsys.readouterr().err)
    assert "--out" in line and "not a directory" in line
    assert target.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("command", ["demo", "simulate"])
def test_out_under_a_file(tmp_path, capsys, command):
    (tmp_path / "afile").write_text("keep me")
    argv = _commands(tmp_path, str(tmp_path / "afile" / "sub"))[command]
    assert cli.main(argv) == EXIT.OUTPUT
    line = _one_line(capsys.readouterr().err)
    assert "afile" in line and "not a directory" in line


def test_out_without_permission_mocked(tmp_path, capsys, monkeypatch):
    # the test may run as root (permissions do not apply): the staging directory's creation
    # is made to fail the way it does for an ordinary user
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", kwargs.get("dir"))

    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    out = tmp_path / "ro" / "o"
    assert cli.main(_commands(tmp_path, str(out))["demo"]) == EXIT.OUTPUT
    line = _one_line(capsys.readouterr().err)
    assert "--out" in line and "permission" in line.lower()
    assert not (tmp_path / "ro").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="permissions do not apply to root")
def test_out_without_permission(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert cli.main(_commands(tmp_path, str(ro / "o"))["demo"]) == EXIT.OUTPUT
        assert "permission" in _one_line(capsys.readouterr().err).lower()
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


# --------------------------------------------------------------------------- overwriting
def test_outputs_never_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "o"
    argv = _commands(tmp_path, str(out))["simulate"]
    assert cli.main(argv) == EXIT.OK
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert cli.main(argv) == EXIT.OUTPUT
    line = _one_line(capsys.readouterr().err)
    assert "--force" in line and str(out) in line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "notes.txt"} == before
    # --force replaces the command's files and leaves the others alone
    (out / "summary.json").write_text("{}")
    assert cli.main(argv + ["--force"]) == EXIT.OK
    assert json.loads((out / "summary.json").read_text())["command"] == "simulate"
    assert (out / "notes.txt").read_text() == "mine"


def test_empty_existing_out_is_used(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    assert cli.main(_commands(tmp_path, str(out))["gaussian"]) == EXIT.OK
    assert (out / "summary.json").is_file()


# --------------------------------------------------------------------------- demo options
@pytest.mark.parametrize("options, name", [
    (["--n", "0"], "--n"),
    (["--n", "-3"], "--n"),
    (["--n", "many"], "--n"),
    (["--t-max", "-1"], "--t-max"),
    (["--t-max", "0"], "--t-max"),
    (["--t-max", "nan"], "--t-max"),
    (["--t-max", "inf"], "--t-max"),
    (["--backend", "bogus"], "--backend"),
    (["--seed", "-1"], "--seed"),
])
def test_demo_bad_options(tmp_path, capsys, options, name):
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--out", str(out)] + options)
    assert exc.value.code == EXIT.USAGE
    line = _one_line(capsys.readouterr().err)
    assert name in line and "transformer-pde demo" in line
    assert not out.exists()


# --------------------------------------------------------------------------- config files
def test_non_utf8_config(tmp_path, capsys):
    cfg = _write(tmp_path / "latin1.toml", '[attention]\nd = 2\n# caf\xe9\n'.encode("latin-1"))
    out = tmp_path / "o"
    assert cli.main(["simulate", cfg, "--out", str(out)]) == EXIT.USAGE
    line = _one_line(capsys.readouterr().err)
    assert "latin1.toml" in line and "UTF-8" in line
    assert not out.exists()


def test_config_is_a_directory(tmp_path, capsys):
    assert cli.main(["gaussian", str(tmp_path), "--out", str(tmp_path / "o")]) == EXIT.USAGE
    assert "not a file" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("array, what", [
    (np.array([["a", "b"], ["c", "d"]]), "numbers"),
    (np.array([["1", "2"], ["3", "4"]]), "numbers"),   # numeric strings are not numbers
    (np.array([[1 + 1j, 2], [3, 4]]), "complex"),
    (np.array([[1.0, np.nan], [3, 4]]), "finite"),
    (np.array([True, False]).reshape(1, 2), "numbers"),
    (np.zeros((0, 2)), "at least one token"),
])
def test_token_file_not_numbers(tmp_path, capsys, array, what):
    np.save(tmp_path / "x.npy", array)
    cfg = _write(tmp_path / "s.toml", f'[attention]\nd = 2\n[tokens]\nfile = "{tmp_path / "x.npy"}"\n')
    out = tmp_path / "o"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == EXIT.USAGE
    line = _one_line(capsys.readouterr().err)
    assert "tokens.file" in line and what in line
    assert not out.exists()


def test_token_file_missing_or_garbage(tmp_path, capsys):
    (tmp_path / "g.npy").write_bytes(b"\x93NUMPY garbage")
    for name in ("missing.npy", "g.npy"):
        cfg = _write(tmp_path / "s.toml", f'[attention]\nd = 2\n[tokens]\nfile = "{tmp_path / name}"\n')
        assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == EXIT.USAGE
        line = _one_line(capsys.readouterr().err)
        assert "tokens.file" in line and name in line


@pytest.mark.parametrize("d", [10**8, 10**20, 0, -1])
@pytest.mark.parametrize("command", ["simulate", "gaussian"])
def test_absurd_dimension(tmp_path, capsys, command, d):
    cfg = _write(tmp_path / "big.toml", f"[attention]\nd = {d}\n")
    out = tmp_path / "o"
    t0 = time.perf_counter()
    assert cli.main([command, cfg, "--out", str(out)]) == EXIT.USAGE
    assert time.perf_counter() - t0 < 10.0  # refused up front, nothing allocated
    assert "attention.d" in _one_line(capsys.readouterr().err)
    assert not out.exists()


def test_too_many_tokens_refused_up_front(tmp_path, capsys):
    cfg = _write(tmp_path / "n.toml", "[attention]\nd = 2\n[tokens]\nn = 100000000000000\n")
    assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o")]) == EXIT.USAGE
    assert "tokens.n" in _one_line(capsys.readouterr().err)


def test_indefinite_token_covariance_refused(tmp_path, capsys):
    # issue 13 item 6: a covariance that is not symmetric positive semi-definite is an error
    for cov in ("[[1.0, 2.0], [0.0, 1.0]]", "[[1.0, 0.0], [0.0, -1.0]]"):
        cfg = _write(tmp_path / "c.toml", f"[attention]\nd = 2\n[tokens]\ncov = {cov}\n")
        assert cli.main(["simulate", cfg, "--out", str(tmp_path / "o"), "-q"]) == EXIT.USAGE
        assert "tokens.cov" in _one_line(capsys.readouterr().err)


# --------------------------------------------------------------------------- failures
def test_failed_run_leaves_no_directory(tmp_path, capsys, monkeypatch):
    # a failure after some files were written (here: the figure) removes them all
    from matplotlib.figure import Figure

    def broken(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken)
    out = tmp_path / "deep" / "o"
    assert cli.main(_commands(tmp_path, str(out))["simulate"]) == EXIT.ERROR
    line = _one_line(capsys.readouterr().err)
    assert "No space left on device" in line
    assert not (tmp_path / "deep").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_internal_error_one_line_and_traceback_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # re-read TMPDIR
    try:
        from transformer_pde import plot

        def bug(*args, **kwargs):
            raise ZeroDivisionError("a bug")

        monkeypatch.setattr(plot, "rescaled_states", bug)
        out = tmp_path / "o"
        argv = _commands(tmp_path, str(out))["simulate"]
        assert cli.main(argv) == EXIT.INTERNAL
        line = _one_line(capsys.readouterr().err)
        assert "internal error" in line and "ZeroDivisionError: a bug" in line
        path = Path(line.split("traceback in ")[1].split()[0])
        assert "Traceback" in path.read_text() and "a bug" in path.read_text()
        assert not out.exists()
        # --debug shows the traceback instead
        assert cli.main(argv + ["--debug"]) == EXIT.INTERNAL
        assert "Traceback" in capsys.readouterr().err
    finally:
        tempfile.tempdir = None


def test_help_documents_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "exit status" in text
    for code in EXIT:
        assert f"{int(code):>3d}" in text, code


# --------------------------------------------------------------------------- subprocess
def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}


def test_module_entry_point_one_line(tmp_path):
    proc = run([sys.executable, "-m", "transformer_pde.cli", "demo", "--n", "0",
                "--out", str(tmp_path / "o")], capture_output=True, text=True,
               env=_env(), cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == EXIT.USAGE
    assert "--n" in _one_line(proc.stderr)
    assert not (tmp_path / "o").exists()


def test_too_many_saved_states_refused_up_front(tmp_path, capsys):
    # 1e6 steps (within limits.max_steps) of 1e5 tokens: 1.6 TB of saved states
    cfg = _write(tmp_path / "t.toml", "[attention]\nd = 2\n[tokens]\nn = 100000\n"
                                      "[run]\nt_max = 1e3\ndt = 1e-3\n")
    out = tmp_path / "o"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == EXIT.USAGE
    assert "run.save_every" in _one_line(capsys.readouterr().err)
    assert not out.exists()


def test_debug_and_verbose_before_or_after_the_command(tmp_path, capsys):
    cfg = _write(tmp_path / "g.toml", "[attention]\nd = 2\n[gaussian]\nt_max = 0.1\n")
    assert cli.main(["-v", "gaussian", cfg, "--out", str(tmp_path / "a")]) == EXIT.OK
    assert cli.main(["gaussian", cfg, "--out", str(tmp_path / "b"), "--debug", "-v"]) == EXIT.OK
    with pytest.raises(SystemExit) as exc:
        cli.main(["gaussian"])
    assert exc.value.code == EXIT.USAGE
    line = _one_line(capsys.readouterr().err)
    assert "required: config" in line and "transformer-pde gaussian --help" in line


@pytest.mark.parametrize("command, text, key", [
    ("gaussian", "[gaussian]\ncov = [[1.0, 0.0], [0.0, -1.0]]\n", "gaussian.cov"),
    ("gaussian", "[gaussian]\ncov = [[1.0, 0.5], [0.0, 1.0]]\n", "gaussian.cov"),
    ("gaussian", "[gaussian]\nn_eval = 100000000000000\n", "gaussian.n_eval"),
    ("cone", "[cone]\nn = 100000000000000\n", "cone.n"),
    ("cone", "[cone]\nradius = 1.0\n", "cone.radius"),
])
def test_gaussian_and_cone_inputs_refused_up_front(tmp_path, capsys, command, text, key):
    cfg = _write(tmp_path / "c.toml", "[attention]\nd = 2\n" + text)
    out = tmp_path / "o"
    assert cli.main([command, cfg, "--out", str(out)]) == EXIT.USAGE
    assert key in _one_line(capsys.readouterr().err)
    assert not out.exists()


def test_demo_too_deep_refused_up_front(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli.main(["demo", "--t-max", "1e300", "--out", str(out)]) == EXIT.USAGE
    assert "--t-max" in _one_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("argv, name", [
    (["ranks", "--dims", "0"], "--dims"),
    (["ranks", "--draws", "-2"], "--draws"),
    (["ranks", "--kinds", "linear"], "--kinds"),
    (["bench", "--backends", "bogus"], "--backends"),
    ([], "COMMAND"),
])
def test_bad_command_lines(capsys, argv, name):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == EXIT.USAGE
    assert name in _one_line(capsys.readouterr().err)


def test_ranks_dimension_out_of_range(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli.main(["ranks", "--dims", "1000", "--out", str(out), "-q"]) == EXIT.USAGE
    assert "ranks.dims" in _one_line(capsys.readouterr().err)
    assert not out.exists()


def test_error_inside_a_third_party_library_is_internal(tmp_path, capsys, monkeypatch):
    # a ValueError raised by the package's own checks is a one-line error (exit 4); one
    # raised inside scipy or numpy is a bug of ours: internal error with its traceback
    import scipy.optimize

    from transformer_pde import gaussian

    def solve(*args, **kwargs):
        return scipy.optimize.brentq(lambda t: 1.0 + t * t, 0.0, 1.0)  # same signs: ValueError

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None
    try:
        monkeypatch.setattr(gaussian, "solve", solve)
        cfg = _write(tmp_path / "g.toml", "[attention]\nd = 2\n[gaussian]\nt_max = 0.1\n")
        assert cli.main(["gaussian", cfg, "--out", str(tmp_path / "o")]) == EXIT.INTERNAL
        line = _one_line(capsys.readouterr().err)
        assert "internal error: ValueError" in line and "traceback in" in line

        from transformer_pde.results import Status

        def own_check(*args, **kwargs):
            return Status.parse("bogus")  # the package's own check raises ValueError

        monkeypatch.setattr(gaussian, "solve", own_check)
        assert cli.main(["gaussian", cfg, "--out", str(tmp_path / "p")]) == EXIT.ERROR
        assert "error: status must be one of" in _one_line(capsys.readouterr().err)
    finally:
        tempfile.tempdir = None
