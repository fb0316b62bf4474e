"""The project describes itself in its own words: no file of the package, its tests,
examples, benchmarks, configuration or documentation refers users to a specification
document they do not have (the conventions live in docs/conventions.md)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "SPEC", "SPEC.md", "SPEC's" as words; names such as SPECTRUM_RTOL are not references
_REFERENCE = re.compile(r"\bSPEC(?:\.md|'s)?\b(?!TRUM)")
_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cff", ".rst", ".cfg", ".yaml", ".yml"}


def test_no_file_cites_a_specification_users_do_not_have():
    this = Path(__file__).resolve()
    offenders = []
    for path in ROOT.rglob("*"):
        if (path.suffix not in _SUFFIXES or not path.is_file() or path.resolve() == this
                or any(part.startswith(".") or part in {"build", "_build", "dist", "__pycache__"}
                       or part.endswith(".egg-info") for part in path.relative_to(ROOT).parts)):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if _REFERENCE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not offenders, "references to SPEC (point to docs/conventions.md):\n" + "\n".join(offenders)


def test_the_conventions_page_exists_and_is_referenced():
    page = ROOT / "docs" / "conventions.md"
    assert page.is_file()
    text = page.read_text(encoding="utf-8")
    for topic in ("no hidden 1/√d", "Multi-head layout", "Masked", "Covariance-cone", "Sinkhorn"):
        assert topic in text, topic
    assert "docs/conventions.md" in (ROOT / "transformer_pde" / "attention.py").read_text()
