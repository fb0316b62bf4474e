"""``transformer-pde --version``, ``init KIND [PATH]`` (the installed example configurations,
which the CLI runs) and "did you mean" for unknown configuration keys."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest

from transformer_pde import __version__
from transformer_pde.cli import main
from transformer_pde.cli.config import ConfigError, Table, did_you_mean
from transformer_pde.cli.templates import TEMPLATES, template_text

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"transformer-pde {__version__}"


def test_packaged_configs_are_the_examples():
    # the installed copies (package data) and examples/configs/ are the same files
    packaged = resources.files("transformer_pde.cli").joinpath("configs")
    names = sorted(p.name for p in packaged.iterdir() if p.name.endswith(".toml"))
    assert names == sorted(p.name for p in (ROOT / "examples" / "configs").glob("*.toml"))
    for name in names:
        assert packaged.joinpath(name).read_text() == \
            (ROOT / "examples" / "configs" / name).read_text(), name
    assert sorted(f for f, _ in TEMPLATES.values()) == names


def test_init_writes_the_template_and_refuses_to_overwrite(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "gaussian"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == ("wrote gaussian.toml; run it with: transformer-pde gaussian "
                           "gaussian.toml")
    text = (tmp_path / "gaussian.toml").read_text()
    assert text.splitlines()[0] == "# transformer-pde gaussian gaussian.toml --out out-gaussian"
    assert text == template_text("gaussian", "gaussian.toml")
    (tmp_path / "gaussian.toml").write_text("# mine\n")
    assert main(["init", "gaussian"]) == 3  # an existing file is kept
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "gaussian.toml").read_text() == "# mine\n"
    assert main(["init", "gaussian", "--force"]) == 0
    assert (tmp_path / "gaussian.toml").read_text() == text
    # a directory: the kind's file name in it; '-': stdout
    (tmp_path / "d").mkdir()
    assert main(["init", "sweep", "d"]) == 0
    assert (tmp_path / "d" / "sweep_ranks.toml").is_file()
    # a folder that does not exist (trailing slash): an error, no file named like it
    assert main(["init", "sweep", "missing/"]) == 3
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()
    capsys.readouterr()
    assert main(["init", "cone", "-"]) == 0
    assert capsys.readouterr().out == template_text("cone")
    assert main(["init", "cone", str(tmp_path / "no" / "such" / "c.toml")]) == 3
    with pytest.raises(SystemExit) as exc:
        main(["init", "simulat"])
    assert exc.value.code == 2


def _small(kind: str, text: str) -> str:
    """The template with its sizes cut down (same keys, a test-sized run)."""
    subs = {
        "simulate": [(r"n = 256", "n = 12"), (r"t_max = 6.0", "t_max = 0.2")],
        "gaussian": [(r"n_eval = 200", "n_eval = 20")],
        "cone": [(r"n = 24", "n = 2"), (r"t_max = 2000.0", "t_max = 5.0"),
                 (r"n_eval = 200", "n_eval = 10")],
        "ranks": [(r"draws = 100", "draws = 1"), (r"dims = \[3, 4, 5\]", "dims = [3]"),
                  (r"t_max = 30.0", "t_max = 2.0")],
        "paper-ranks": [(r"draws = 100", "draws = 1"), (r"dims = \[3, 4, 5\]", "dims = [3]")],
        "sweep": [(r"draws = 12", "draws = 1"), (r"d = \[3, 4, 5\]", "d = [3]")],
    }[kind]
    for pattern, repl in subs:
        text, n = re.subn(pattern, repl, text)
        assert n == 1, (kind, pattern)  # the template still has the key the test shrinks
    return text


@pytest.mark.parametrize("kind", list(TEMPLATES))
def test_every_template_runs(tmp_path, capsys, kind):
    path = tmp_path / f"{kind}.toml"
    assert main(["init", kind, str(path)]) == 0
    command = capsys.readouterr().out.split("transformer-pde ")[1].split()[0]
    assert command == TEMPLATES[kind][1]
    path.write_text(_small(kind, path.read_text()))
    extra = ["--scheduler", "serial"] if command in ("cone", "ranks", "sweep") else []
    quiet = ["-q"] if command != "gaussian" else []
    code = main([command, str(path), "--out", str(tmp_path / "out"), *quiet, *extra])
    err = capsys.readouterr().err
    assert code in (0, 1), err  # ran (1: some runs ended without an answer)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary


@pytest.mark.parametrize("word,options,expected", [
    ("kidn", ["kind", "d", "beta"], "; did you mean 'kind'?"),
    ("Beta", ["kind", "d", "beta"], "; did you mean 'beta'?"),
    ("atention", ["attention", "tokens"], "; did you mean 'attention'?"),
    ("zzz", ["kind", "d", "beta"], ""),
])
def test_did_you_mean(word, options, expected):
    assert did_you_mean(word, options) == expected


def test_unknown_keys_and_tables_suggest_the_closest(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^run\.t_mx: unknown key; did you mean 't_max'\?; "
                                          r"allowed keys are dt, t_max$"):
        Table({"t_mx": 1.0}, "run", ("t_max", "dt"))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[atention]\nkind = "softmax"\n')
    assert main(["simulate", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "atention: unknown key; did you mean 'attention'?" in capsys.readouterr().err
    cfg.write_text('[attention]\nd = 2\n[tokens]\nseeed = 1\n')
    assert main(["simulate", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "tokens.seeed: unknown key; did you mean 'seed'?" in capsys.readouterr().err
    cfg.write_text('[study]\ncell = "ranks"\ndraw = 2\n')
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "unknown key 'draw'; did you mean 'draws'?" in capsys.readouterr().err
    cfg.write_text('[study]\ncell = "ranks"\n[cell]\nthreshhold = 0.1\n')
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "unknown key 'threshhold'; did you mean 'threshold'?" in capsys.readouterr().err
    cfg.write_text('[study]\ncell = "rank"\n')
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "did you mean 'ranks'?" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_simulate_template_uses_the_librarys_defaults():
    # the template a user starts from must not pin a slower backend than the library picks
    # (with "numpy" pinned, 3,000 tokens ran for minutes where "auto" takes seconds)
    import tomllib

    from transformer_pde.particles.options import FieldOptions

    from transformer_pde.backends import DEFAULT_BACKEND
    from transformer_pde.sinkhorn.options import DEFAULT_MAX_ITER, DEFAULT_TOL

    text = (ROOT / "examples" / "configs" / "simulate.toml").read_text()
    config = tomllib.loads(text)
    assert config["field"]["backend"] == FieldOptions().backend == DEFAULT_BACKEND == "auto"
    # the commented Sinkhorn defaults are the library's (a user uncommenting them changes
    # nothing)
    tol, max_iter = re.search(r"sinkhorn_tol = (\S+), sinkhorn_max_iter = (\d+)", text).groups()
    assert (float(tol), int(max_iter)) == (DEFAULT_TOL, DEFAULT_MAX_ITER)
