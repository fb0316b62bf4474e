"""The example ``examples/meanfield_circle.py`` runs (quick mode) and writes its figure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "meanfield_circle.py"


@pytest.mark.slow
def test_example_quick_writes_the_figure(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("meanfield_circle_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--quick", "--out", str(tmp_path)])
    out = tmp_path / "meanfield_circle.png"
    assert out.stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "k* = 3" in printed and "quantile: p = -1.0" in printed
