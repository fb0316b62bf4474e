"""Every Python snippet of README.md and of the documentation pages (docs/**/*.md) runs as
written, each in a fresh namespace and a temporary directory.

Only fenced blocks tagged ``python`` run; ``py`` blocks need something optional (the
pretrained model directory: tests/pretrained/test_pretrained.py runs those) and
``text``/``bash`` blocks are not Python.
"""

import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted(
    p for p in (ROOT / "docs").rglob("*.md")
    if not any(part.startswith(("_", ".")) or part == "auto_examples"
               for part in p.relative_to(ROOT / "docs").parts))
FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
BLOCKS = [(page.relative_to(ROOT).as_posix(), i, code)
          for page in PAGES
          for i, code in enumerate(FENCE.findall(page.read_text(encoding="utf-8")))]


def test_pages_have_snippets():
    readme = [b for b in BLOCKS if b[0] == "README.md"]
    assert 1 <= len(readme) <= 3          # the README keeps one short example
    assert len(BLOCKS) >= 16              # the rest moved to docs/ and still runs


@pytest.mark.parametrize("page, index, code", BLOCKS,
                         ids=[f"{page}[{i}]" for page, i, _ in BLOCKS])
def test_snippet_runs(page, index, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # snippets may write files
    exec(compile(code, f"{page}[python block {index}]", "exec"), {"__name__": "__readme__"})
