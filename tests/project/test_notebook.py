"""The notebook ``docs/notebooks/journeys.ipynb`` runs top to bottom in a fresh kernel and
every figure cell (tagged ``figure``) shows a PNG.

The main uses of the library (a particle run and its plot, diagnostics, a Gaussian solve
and its cone plot, an ensemble, the sphere reductions) are executed as a user runs them in
Jupyter: with the kernel's inline backend, so a plot function that built a figure pyplot
does not manage would show no image and fail here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebooks" / "journeys.ipynb"


def _execute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat")
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient")
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel")
    # the kernel picks its inline backend only when no backend is forced (CI sets Agg)
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()      # raises CellExecutionError, naming the cell, on any error
    return nb


def test_notebook_runs_and_shows_its_figures(tmp_path, monkeypatch):
    assert NOTEBOOK.is_file()
    nb = _execute(tmp_path, monkeypatch)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)      # every cell ran
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors
    figures = [c for c in code if "figure" in c.metadata.get("tags", [])]
    assert len(figures) >= 5
    for cell in figures:
        images = [o for o in cell.outputs if o.output_type == "display_data"
                  and "image/png" in o.get("data", {})]
        assert len(images) == 1, cell.source[:80]
    # no warning text leaks into the journeys (stderr streams)
    stderr = "".join(o.text for c in code for o in c.outputs
                     if o.output_type == "stream" and o.name == "stderr")
    assert "Traceback" not in stderr
    assert os.listdir(tmp_path) == []     # the journeys write no file


def _example_notebook(script: Path):
    """The notebook the gallery offers for download: sphinx-gallery's text blocks as
    Markdown cells, its code blocks as code cells."""
    nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat")
    parser = pytest.importorskip("sphinx_gallery.py_source_parser",
                                 reason="the gallery test needs sphinx-gallery")
    _, blocks = parser.split_code_and_text_blocks(str(script))[:2]
    cells = [nbformat.v4.new_code_cell(text) if label == "code"
             else nbformat.v4.new_markdown_cell(text) for label, text, _ in blocks]
    return nbformat.v4.new_notebook(cells=cells)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["clustering_2d", "paper_line"])
def test_gallery_example_runs_as_notebook(tmp_path, monkeypatch, name):
    # the downloadable notebook of an example runs in a fresh kernel (no command line, no
    # __file__) in its fast configuration and shows its figure inline
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient")
    pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    monkeypatch.setenv("TRANSFORMER_PDE_FAST", "1")
    monkeypatch.delenv("TRANSFORMER_PDE_OUT", raising=False)   # the default folder
    script = NOTEBOOK.parents[2] / "examples" / f"{name}.py"
    nb = _example_notebook(script)
    assert sum(c.cell_type == "markdown" for c in nb.cells) >= 2    # narrative between cells
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    # no repository above the working directory: written into ./figures
    assert list((tmp_path / "figures").glob("*.png"))
