"""Every Python snippet in README.md runs as written (in a temporary directory)."""

import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_snippets():
    assert len(BLOCKS) >= 12


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_snippet_runs(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # snippets may write files
    code = BLOCKS[index]
    exec(compile(code, f"README.md[python block {index}]", "exec"), {"__name__": "__readme__"})
