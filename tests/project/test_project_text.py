"""The project describes itself in its own words: no file of the package, its tests,
examples, benchmarks, configuration or documentation refers users to a specification
document they do not have (the conventions live in docs/conventions.md)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
    assert "docs/conventions.md" in (ROOT / "transformer_pde" / "attention" / "__init__.py").read_text()


# Development history (dates of runs, issue numbers) belongs in CHANGELOG.md; the pages
# and the docstrings state current facts.  A paper's year in a citation ("2025",
# arXiv:2501.18322) is not a date of the project and does not match.
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2}:\d\d(?::\d\d)?\s*UTC\b")
_ISSUE = re.compile(r"\bissues?\s*(?:#\s*)?\d+", re.IGNORECASE)


def _project_text_files():
    """README, the documentation pages (not the generated ones), every file of the package
    and the docstrings of the benchmark and example scripts."""
    docs = ROOT / "docs"
    generated = {"_build", "auto_examples", "api"}
    yield ROOT / "README.md"
    for path in sorted(docs.rglob("*.md")):
        if not generated & set(path.relative_to(docs).parts):
            yield path
    for folder, suffixes in (("transformer_pde", {".py", ".cu", ".h", ".md", ".toml"}),
                             ("benchmarks", {".py"}), ("examples", {".py", ".toml"})):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in suffixes and "__pycache__" not in path.parts:
                yield path


def test_documentation_and_docstrings_carry_no_dates_or_issue_numbers():
    offenders = []
    for path in _project_text_files():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for rule, pattern in (("date", _DATE), ("issue", _ISSUE)):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {rule}: {line.strip()[:90]}")
    assert not offenders, ("dates of runs and issue numbers are history: move them to "
                           "CHANGELOG.md\n" + "\n".join(offenders))


def test_the_history_rules_match_what_they_are_meant_to():
    scanned = {p.relative_to(ROOT).as_posix() for p in _project_text_files()}
    assert {"README.md", "docs/benchmarks.md", "docs/guides/gpu.md", "transformer_pde/attention/__init__.py",
            "benchmarks/sweep.py"} <= scanned
    assert not any(p.startswith(("docs/_build/", "docs/auto_examples/")) for p in scanned)
    for text in ("run on 2026-11-23", "at 23:18 UTC", "(issue 9)", "Issue #25", "issues 3"):
        assert _DATE.search(text) or _ISSUE.search(text), text
    for text in ("Castin et al. 2025, arXiv:2501.18322", "issues a warning", "issued 2 warnings",
                 "t = 12:30", "tissue 5"):
        assert not (_DATE.search(text) or _ISSUE.search(text)), text
