"""The package's import graph: no cycle and no private name crossing a module border.

The graph is built from the source (AST), with every ``import`` statement wherever it
stands -- function-level imports included, since a cycle hidden in a function is still a
cycle.  An edge ``a -> b`` means module ``a`` imports something from module ``b``
(``from .b import x`` where ``x`` is a submodule of package ``b`` gives ``a -> b.x``;
importing a package also runs its ``__init__``, so ``a -> b`` is kept as well).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "transformer_pde"
PKG = "transformer_pde"


def _modules() -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (path, is_package)}`` for every module of the package."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


MODULES = _modules()


def _base(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    """Absolute dotted name of the module a ``from ... import`` statement reads from."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """``(target module, imported name or None, line)`` for every package import in ``module``."""
    path, is_pkg = MODULES[module]
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((a.name, None, node.lineno) for a in node.names
                       if a.name == PKG or a.name.startswith(PKG + "."))
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, module, is_pkg)
            if base != PKG and not base.startswith(PKG + "."):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:      # ``from pkg import submodule``
                    out.append((base, None, node.lineno))
                    out.append((sub, None, node.lineno))
                else:
                    out.append((base, a.name, node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _, _ in _imports(m):
            # importing a.b.c runs a/__init__, a.b/__init__ and a.b.c
            parts = target.split(".")
            for k in range(1, len(parts) + 1):
                t = ".".join(parts[:k])
                if t in MODULES and t != m and not m.startswith(t + "."):
                    graph[m].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_covers_the_package():
    graph = _graph()
    assert "transformer_pde.fields" in graph and "transformer_pde.sinkhorn" in graph
    # a known edge, found through a module-level import
    assert "transformer_pde.attention" in graph["transformer_pde.fields"]


def test_no_import_cycle():
    cycles = _cycles(_graph())
    assert not cycles, f"import cycles in the package: {cycles}"


def test_no_private_name_crosses_a_module_border():
    bad = []
    for m in MODULES:
        for target, name, line in _imports(m):
            if name is not None and name.startswith("_") and not name.startswith("__"):
                bad.append(f"{MODULES[m][0].relative_to(ROOT.parent)}:{line} imports {name} "
                           f"from {target}")
    assert not bad, "private names imported from other modules:\n" + "\n".join(bad)


def test_validation_and_errors_import_nothing_else_from_the_package():
    for leaf, allowed in (("transformer_pde.errors", set()),
                          ("transformer_pde.validation", {"transformer_pde.errors"}),
                          ("transformer_pde.sinkhorn.anderson", set()),
                          ("transformer_pde.results", {"transformer_pde.errors"})):
        if leaf in MODULES:
            assert _graph()[leaf] <= allowed, (leaf, _graph()[leaf])


@pytest.mark.parametrize("source, expected", [
    ("from .a import b\n", [("transformer_pde.x.a", "b")]),
    ("def f():\n    from ..y import _z\n", [("transformer_pde.y", "_z")]),
])
def test_import_resolution(source, expected, tmp_path, monkeypatch):
    # the resolver handles relative imports at any depth, inside functions too
    path = tmp_path / "m.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "transformer_pde.x.m", (path, False))
    got = [(t, n) for t, n, _ in _imports("transformer_pde.x.m")]
    assert got == expected


def test_cycle_detector_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_package_namespace_lists_the_future_import():
    # `from __future__ import annotations` leaves a name `annotations` in the module; in a
    # package's __init__ it shows in dir() and tab completion beside the public names
    import importlib
    import pkgutil

    import transformer_pde

    names = ["transformer_pde"] + [f"transformer_pde.{m.name}"
                                   for m in pkgutil.iter_modules(transformer_pde.__path__)
                                   if m.ispkg]
    listed = [n for n in names if "annotations" in dir(importlib.import_module(n))]
    assert not listed
