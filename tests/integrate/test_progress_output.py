"""A run's progress bar leaves its final state as text: in a terminal (tqdm's text bar on
stderr) and in a notebook executed without a live front end (nbclient), where the widget
bar's stored text used to stay at "0%"."""

from __future__ import annotations

import io
import re

import pytest

from transformer_pde.extras import progress_bar
from transformer_pde.integrate.loop import Progress


def _last_line(stream_text: str) -> str:
    """What a terminal shows last: the text after the final carriage return of the last
    non-empty line."""
    lines = [ln for ln in stream_text.split("\n") if ln.strip()]
    return lines[-1].split("\r")[-1] if lines else ""


def test_text_bar_ends_on_its_final_state(capsys):
    p = Progress(total=15.0, enabled=True, every=1e9, desc="run")
    for t in range(1, 16):
        p.update(float(t))
    p.close()
    err = capsys.readouterr().err
    last = _last_line(err)
    assert last.startswith("run: 100%") and "15/15" in last, err
    assert capsys.readouterr().out == ""  # nothing on stdout


def test_disabled_progress_prints_nothing(capsys):
    p = Progress(total=1.0, enabled=False, every=0.0, desc="run")
    p.update(1.0)
    p.close()
    assert capsys.readouterr() == ("", "")


def test_progress_bar_outside_jupyter_is_the_text_bar():
    out = io.StringIO()
    bar = progress_bar(total=2, desc="x", file=out)
    bar.update(2)
    bar.close()
    assert not hasattr(bar, "container")  # no widget outside a Jupyter kernel
    assert _last_line(out.getvalue()).startswith("x: 100%")


_CELL = """
from transformer_pde.integrate.loop import Progress
p = Progress(total=15.0, enabled=True, every=1e9, desc="run")
for t in range(1, 16):
    p.update(float(t))
p.close()
"""


def test_executed_notebook_keeps_the_final_line(tmp_path, monkeypatch):
    # About 2 s (a kernel starts).  Run where the kernel has ipywidgets (widget bar: the stored display's text/plain is
    # updated on close) and where it has not (text bar on stderr); both must end at 100 %.
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(_CELL)])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    shown = [o.data["text/plain"] for o in outputs if o.output_type == "display_data"]
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    final = shown[-1] if shown else _last_line(stderr)
    assert re.match(r"run: 100%\|.*\| 15/15 ", final), outputs
    assert "IProgress not found" not in stderr  # tqdm's fallback warning is not shown
