"""Exit statuses as documented (issue 40, item 7): a path this system cannot use, on any
option, is a one-line usage error naming the option (exit 2), never a raw errno with
"computation failed" (exit 4); configuration values the library refuses are exit 2 naming
the key; ``--out`` that exists as a file or lies under one stays exit 3 ("--out
unusable"); 4 is kept for computations that fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from transformer_pde import cli
from transformer_pde.cli.output import OutputDir, OutputError, path_problem

EXIT = cli.ExitCode

TINY = """
[attention]
d = 2
V = -1.0
[tokens]
n = 5
{tokens}
[run]
t_max = 0.2
dt = 0.1
{run}
[output]
figure = false
"""

GAUSSIAN = """
[attention]
d = 2
V = -1.0
[gaussian]
t_max = 0.2
n_eval = 3
{gaussian}
"""

#: one component longer than NAME_MAX (255 bytes on the file systems Linux and macOS use)
LONG_NAME = "a" * 256
#: a path longer than PATH_MAX (4096 bytes on Linux) of names that are each short enough
LONG_PATH = "/".join(["b" * 200] * 25)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Errno" not in err, err
    return lines[0]


def _config(tmp_path: Path, text: str = TINY, **fields: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(text.format(**{"tokens": "", "run": "", "gaussian": "", **fields}))
    return str(path)


def _exit_of(argv: list[str]) -> int:
    """The exit status of ``transformer-pde argv`` (the parser's usage errors end the
    process through SystemExit; the commands return their status)."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code)


# --------------------------------------------------------------------------- paths
@pytest.mark.parametrize("option, value, words", [
    ("--out", LONG_NAME, "256 bytes long"),
    ("--out", f"new/{LONG_NAME}/x", "256 bytes long"),
    ("--out", LONG_PATH, "bytes long (made absolute)"),
    ("--out", "", "empty string"),
    ("config", LONG_NAME, "256 bytes long"),
    ("config", "", "empty string"),
    ("--checkpoint", LONG_NAME, "256 bytes long"),
    ("--checkpoint", LONG_PATH, "made absolute"),
])
def test_a_path_the_system_cannot_use_is_a_usage_error(tmp_path, capsys, monkeypatch, option,
                                                       value, words):
    monkeypatch.chdir(tmp_path)
    cfg = _config(tmp_path)
    argv = {"--out": ["simulate", cfg, "--out", value],
            "config": ["simulate", value, "--out", "o"],
            "--checkpoint": ["simulate", cfg, "--out", "o", "--checkpoint", value]}[option]
    assert _exit_of(argv + ["-q"]) == EXIT.USAGE
    line = _one_line(capsys.readouterr().err)
    assert f"argument {option}:" in line and words in line, line
    assert len(line) < 400, line  # a long name is abbreviated, not echoed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


@pytest.mark.parametrize("argv", [
    ["gaussian", LONG_NAME],
    ["cone", LONG_NAME],
    ["ranks", LONG_NAME],
    ["sweep", LONG_NAME],
    ["demo", "--out", LONG_NAME],
    ["ranks", "--out", LONG_NAME],
    ["sweep", "study.toml", "--scheduler-file", LONG_NAME],
    ["init", "simulate", LONG_NAME],
    ["pretrained", "text", "--model-dir", LONG_NAME],
    ["pretrained", "text", "--model-file", LONG_PATH],
])
def test_every_path_option_is_checked(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert _exit_of(argv) == EXIT.USAGE
    assert "bytes long" in _one_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make, words", [
    (lambda tmp: tmp / "afile", "exists and is not a directory"),
    (lambda tmp: tmp / "afile" / "sub", "is not a directory"),
])
def test_out_that_is_or_lies_under_a_file_stays_exit_3(tmp_path, capsys, make, words):
    (tmp_path / "afile").write_text("x")
    cfg = _config(tmp_path)
    out = make(tmp_path)
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == EXIT.OUTPUT
    line = _one_line(capsys.readouterr().err)
    assert "--out" in line and words in line


def test_output_dir_refuses_a_path_too_long_naming_the_option(tmp_path):
    # the Python API behind the commands: the same rule, an OutputError (exit 3)
    for bad in (tmp_path / LONG_NAME, Path(LONG_PATH)):
        with pytest.raises(OutputError, match="^--out .*bytes long"):
            OutputDir(bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text, problem", [
    ("", "empty string"),
    ("a\0b", "NUL"),
    ("x" * 255, None),
    ("x" * 256, "256 bytes long"),
    ("é" * 128, "256 bytes long"),  # bytes, not characters: 2 bytes each in UTF-8
    ("é" * 127, None),
    ("/".join(["c" * 250] * 17), "made absolute"),
    ("-", None),
    (".", None),
])
def test_path_problem_table(text, problem):
    found = path_problem(text)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


# --------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("fields, key", [
    ({"run": "save_at = [1.0]"}, "run.save_at"),
    ({"run": "save_at = [0.1, 5.0]"}, "run.save_at"),
])
def test_values_the_library_refuses_are_configuration_errors(tmp_path, capsys, fields, key):
    cfg = _config(tmp_path, **fields)
    out = tmp_path / "o"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == EXIT.USAGE
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"transformer-pde simulate: configuration error: {key}:"), line
    assert not out.exists()


@pytest.mark.parametrize("fields, key", [
    ({"gaussian": "mean = [1e300, 0.0]"}, "gaussian.mean"),
    ({"gaussian": "cov = [[1e300, 0.0], [0.0, 1.0]]"}, "gaussian.cov"),
])
def test_gaussian_inputs_the_library_refuses_name_their_key(tmp_path, capsys, fields, key):
    cfg = _config(tmp_path, GAUSSIAN, **fields)
    out = tmp_path / "o"
    assert cli.main(["gaussian", cfg, "--out", str(out), "--format", "npz"]) == EXIT.USAGE
    line = _one_line(capsys.readouterr().err)
    assert f"configuration error: {key}:" in line, line
    assert not out.exists()


def test_huge_finite_tokens_are_summarised(tmp_path, capsys):
    # tokens of size 1e300 are finite and the run is ok; its summary (the covariance rank
    # of the final cloud) used to overflow and end with exit 4 "S contains NaN or inf"
    cfg = _config(tmp_path, tokens="std = 1e300")
    out = tmp_path / "o"
    assert cli.main(["simulate", cfg, "--out", str(out), "-q"]) == EXIT.OK, \
        capsys.readouterr().err
    assert (out / "summary.json").is_file()


def test_no_errno_reaches_the_user(tmp_path, capsys, monkeypatch):
    """An OSError while --out is examined (here: a loop of symbolic links) is exit 3
    naming --out and saying what is wrong in words."""
    monkeypatch.chdir(tmp_path)
    os.symlink("loop", tmp_path / "loop")
    cfg = _config(tmp_path)
    assert cli.main(["simulate", cfg, "--out", "loop/o", "-q"]) == EXIT.OUTPUT
    line = _one_line(capsys.readouterr().err)
    assert "--out loop/o" in line


# --------------------------------------------------------------------------- sweep
SWEEP = """
name = "ranks"
[study]
cell = "ranks"
draws = {draws}
seed = 0
[study.axes]
kind = ["softmax"]
d = [3]
[cell]
distribution = "paper"
value = "identity"
threshold = 0.1
"""


@pytest.mark.parametrize("out, words", [
    ("afile", "exists and is not a directory"),
    ("afile/sub", "is not a directory"),
])
def test_sweep_out_that_cannot_be_used_is_exit_3(tmp_path, capsys, monkeypatch, out, words):
    # was exit 4 ("error: --out ... exists and is not a directory")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "s.toml").write_text(SWEEP.format(draws=1))
    assert cli.main(["sweep", "s.toml", "--out", out, "--scheduler", "serial", "-q"]) == \
        EXIT.OUTPUT
    line = _one_line(capsys.readouterr().err)
    assert f"--out {out}:" in line and words in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "s.toml"]


def test_sweep_too_large_for_memory_is_refused_up_front(tmp_path, capsys, monkeypatch):
    # was exit 4 "out of memory" after the output folder was made
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SWEEP.format(draws=10 ** 12))
    assert cli.main(["sweep", "s.toml", "--out", "o", "--scheduler", "serial", "-q"]) == \
        EXIT.USAGE
    line = _one_line(capsys.readouterr().err)
    assert "configuration error: study.draws:" in line and "memory" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


def test_sweep_into_new_nested_folders_and_failed_sweep_leaves_none(tmp_path, capsys,
                                                                    monkeypatch):
    import importlib

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SWEEP.format(draws=1))
    assert cli.main(["sweep", "s.toml", "--out", "new/a/b", "--scheduler", "serial",
                     "-q"]) == EXIT.OK
    assert (tmp_path / "new" / "a" / "b" / "summary.json").is_file()
    capsys.readouterr()
    # a sweep that fails before writing removes the folders it made
    monkeypatch.setattr(importlib.import_module("transformer_pde.sweep.run"),
                        "CONNECT_TIMEOUT", 1.0)
    assert cli.main(["sweep", "s.toml", "--out", "other/x", "--scheduler",
                     "tcp://127.0.0.1:9", "-q"]) == EXIT.ERROR
    assert "--scheduler" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "other").exists()


# --------------------------------------------------------------------------- init
@pytest.mark.parametrize("path, words", [
    ("afile/x.toml", "the directory afile is not a directory"),
    ("missing/x.toml", "the directory missing does not exist"),
    ("afile", "exists; pass --force"),
])
def test_init_says_what_is_wrong_with_its_path(tmp_path, capsys, monkeypatch, path, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    assert cli.main(["init", "simulate", path]) == EXIT.OUTPUT
    assert words in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
