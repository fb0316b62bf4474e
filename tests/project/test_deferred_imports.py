"""Every deferred import says why.

An ``import`` inside a function body postpones a cost or a dependency (an optional package,
a heavy module, a cycle); when the reason is not written, the next reader cannot tell
whether it still holds and the habit spreads.  So each such statement in
``transformer_pde/`` carries a comment on its own line(s), on the line(s) just above it, or
above the group of imports (or the ``try:``) it opens, that says why in words: lint codes
(``noqa: PLC0415``, ``type: ignore``, ``pragma: no cover``) do not count.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "transformer_pde"

_CODES = re.compile(r"noqa(:\s*[A-Z]+\d+(\s*,\s*[A-Z]+\d+)*)?|type:\s*ignore(\[[^\]]*\])?"
                    r"|pragma:\s*no\s+cover", re.IGNORECASE)


def _says_why(comment: str) -> bool:
    """A reason is at least two words once the lint codes are taken out."""
    return len(re.findall(r"[A-Za-z]{2,}", _CODES.sub(" ", comment))) >= 2


def _deferred_imports(source: str, name: str) -> list[tuple[str, int, bool]]:
    """``(key, line, explained)`` of each import statement inside a function of ``source``."""
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    found: list[tuple[ast.stmt, str]] = []

    def visit(node: ast.AST, qual: list[str], in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, [*qual, child.name], True)
            elif isinstance(child, ast.ClassDef):
                visit(child, [*qual, child.name], in_function)
            else:
                if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                    found.append((child, ".".join(qual)))
                visit(child, qual, in_function)

    visit(ast.parse(source), [], False)
    out = []
    for node, qual in found:
        notes = [comments.get(i, "") for i in range(node.lineno, (node.end_lineno or 0) + 1)]
        i = node.lineno - 1          # upwards over comments, a try: and the imports above
        while i >= 1 and lines[i - 1].strip().startswith(("#", "try:", "import ", "from ")):
            notes.append(comments.get(i, ""))
            i -= 1
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
        else:
            module = node.names[0].name
        out.append((f"{name}:{qual}:{module}", node.lineno, any(map(_says_why, notes))))
    return out


def test_every_deferred_import_says_why():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        name = path.relative_to(PKG).as_posix()
        for key, line, explained in _deferred_imports(path.read_text(encoding="utf-8"), name):
            if not explained:
                bad.append(f"transformer_pde/{name}:{line} ({key})")
    assert not bad, ("deferred imports without a comment saying why (on the line or just "
                     "above):\n" + "\n".join(bad))


@pytest.mark.parametrize("source, explained", [
    ("import os\n", []),                                            # module level: not deferred
    ("def f():\n    import os  # noqa: PLC0415\n", [False]),
    ("def f():\n    import os\n", [False]),
    ("def f():\n    import os  # noqa: PLC0415 (only when drawing)\n", [True]),
    ("def f():\n    # optional: the io extra\n    import xarray\n", [True]),
    ("def f():\n    try:  # optional dependency\n        import cupy\n"
     "    except ImportError:\n        pass\n", [True]),
    ("def f():\n    import a  # heavy, numba\n    from b import c\n", [True, True]),
    ("def f():\n    x = 1  # heavy module\n    import a\n", [False]),
    ("class C:\n    def m(self):\n        def g():\n            import a\n", [False]),
    ("def f():\n    s = '# not a comment'\n    import a\n", [False]),
])
def test_the_rule_sees_what_it_is_meant_to(source, explained):
    assert [e for _, _, e in _deferred_imports(source, "m.py")] == explained


def test_sites_are_named_by_file_function_and_module():
    src = "class C:\n    def m(self):\n        from ..io import labelled\n"
    assert _deferred_imports(src, "a/b.py") == [("a/b.py:C.m:..io", 3, False)]
