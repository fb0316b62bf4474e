"""Every script of ``examples/`` runs as a notebook in its fast configuration.

The notebook form of an example is its ``# %%`` cells run in order in one namespace, as
Jupyter runs them: ``__name__ == "__main__"``, no ``__file__``, no command line.  Each runs
with ``TRANSFORMER_PDE_FAST=1`` (the small sizes) and ``TRANSFORMER_PDE_OUT`` set to a
temporary folder, and must write there PNG files named like the figures committed in
``figures/`` (so the gallery page of every example has its figure).  The examples share one
process, so the Numba kernels compile once.  The full configuration made the committed
figures; ``tests/project/test_notebook.py`` runs two examples in a real Jupyter kernel.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: what an example prints in its fast configuration: the mean-field example's fastest mode
#: k* = 3 and the W1 slope of quantile-placed tokens, -1.0x (the rate 1/N)
PRINTED = {"meanfield_circle": ("k* = 3", "quantile: p = -1.0")}


def _gallery_support():
    # docs/ is no package: the gallery's table of optional requirements is read from its file
    spec = importlib.util.spec_from_file_location("gallery_support",
                                                  ROOT / "docs" / "gallery_support.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def notebook_cells(script: Path) -> list[str]:
    """The code of each ``# %%`` cell of ``script`` (the text before the first marker is
    the first cell)."""
    return re.split(r"^# %%.*$", script.read_text(encoding="utf-8"), flags=re.MULTILINE)


def test_examples_are_plain_scripts():
    # no command line and no path of their own: parameters are variables of the first cell
    assert len(EXAMPLES) >= 20
    for script in EXAMPLES:
        text = script.read_text(encoding="utf-8")
        for word in ("argparse", "sys.argv", "__file__", "__main__"):
            assert word not in text, f"{script.name} uses {word}"
        cells = notebook_cells(script)
        assert len(cells) >= 3, script.name
        assert "FAST = fast_configuration()" in cells[1], script.name    # the first cell
        assert "OUT = output_folder()" in cells[1], script.name


def test_notebook_cells_split_like_jupytext():
    text = "'''doc'''\nimport os\n# %%\n# text\nx = 1\n# %% [markdown]\ny = 2\n"
    assert re.split(r"^# %%.*$", text, flags=re.MULTILINE)[1:] == ["\n# text\nx = 1\n",
                                                                   "\ny = 2\n"]


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_as_notebook_in_fast_configuration(script, tmp_path, monkeypatch, capsys):
    gallery = _gallery_support()
    requirement = gallery.REQUIRES.get(script.stem)
    # found, not imported: the model packages' own imports (llm, torch) are not installed
    if requirement and importlib.util.find_spec(requirement) is None:
        pytest.skip(f"{script.stem} needs {requirement}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = tmp_path / "out"
    monkeypatch.setenv("TRANSFORMER_PDE_FAST", "1")
    monkeypatch.setenv("TRANSFORMER_PDE_OUT", str(out))
    monkeypatch.chdir(tmp_path)          # nothing is written into the repository
    namespace: dict = {"__name__": "__main__"}
    try:
        for i, cell in enumerate(notebook_cells(script)):
            exec(compile(cell, f"{script.name} (cell {i})", "exec"), namespace)
    finally:
        plt.close("all")
    assert namespace["FAST"] is True and namespace["OUT"] == out
    written = sorted(p.name for p in out.glob("*.png"))
    assert written, f"{script.name} wrote no figure into OUT"
    for name in written:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
    # a gallery page that did not run shows the committed figures of the same names
    assert written == sorted(p.name for p in gallery.committed_figures(script))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    printed = capsys.readouterr().out
    for text in PRINTED.get(script.stem, ()):
        assert text in printed
