"""``transformer-pde warmup``: compiles the named paths, one line each; unknown names are a
usage error (exit 2, no traceback)."""

from __future__ import annotations

from transformer_pde import cli
from transformer_pde.cli.warmup import WARMUP_PATHS


def test_warmup_compiles_the_named_paths(capsys):
    assert cli.main(["warmup", "particles", "gaussian"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in lines] == ["particles", "gaussian"]
    assert all(ln.startswith("warmup: ") and ln.endswith(" s)") for ln in lines)


def test_warmup_refuses_an_unknown_path(capsys):
    assert cli.main(["warmup", "particle"]) == 2
    err = capsys.readouterr().err
    assert "unknown warmup path" in err and "Traceback" not in err
    assert all(name in err for name in WARMUP_PATHS)
