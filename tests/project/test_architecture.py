"""The package is layered: each unit imports only from units of lower layers, and the
architecture page names every unit and every module of the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "transformer_pde"

#: the layers of docs/architecture.md, bottom first; a unit is a top-level module or subpackage
LAYERS: list[set[str]] = [
    {"errors"},
    {"validation", "extras", "results", "results_display"},
    {"attention", "backends"},
    {"io"},
    {"integrate"},
    {"sinkhorn", "blocks"},
    {"fields", "noise"},
    {"particles", "gaussian", "reductions"},
    {"diagnostics"},
    {"plot"},
    {"pretrained", "paper"},
    {"sweep"},
    {"meanfield"},
    {"cli"},
]
#: outside the layers: the test helpers (they import only the attention specification)
#: and the package's own ``__init__`` (re-exports)
OUTSIDE = {"testing": {"attention"}}


def _unit(path: Path) -> str:
    rel = path.relative_to(PKG).parts
    return rel[0].removesuffix(".py")


def _imports() -> dict[str, set[str]]:
    deps: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        unit = _unit(path)
        if unit == "__init__":
            continue
        pkg_parts = list(path.relative_to(PKG).parts[:-1])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                base = pkg_parts[: len(pkg_parts) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
                names = [target[0]] if target else [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("transformer_pde."):
                names = [node.module.split(".")[1]]
            else:
                continue
            deps.setdefault(unit, set()).update(n for n in names if n != unit)
    return deps


def _layer(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"transformer_pde.{unit} is in no layer of {__file__}: add it (and to "
                         "docs/architecture.md)")


def test_every_unit_has_a_layer():
    units = {_unit(p) for p in PKG.rglob("*.py")} - {"__init__"} - set(OUTSIDE)
    for unit in units:
        _layer(unit)


@pytest.mark.parametrize("unit", sorted(_imports()))
def test_units_import_only_from_lower_layers(unit):
    deps = _imports()[unit]
    if unit in OUTSIDE:
        assert deps <= OUTSIDE[unit], deps - OUTSIDE[unit]
        return
    upward = {d for d in deps if _layer(d) >= _layer(unit)}
    assert not upward, (f"transformer_pde.{unit} (layer {_layer(unit)}) imports "
                        f"{sorted(upward)} from its own or a higher layer")


def test_the_architecture_page_names_every_unit_and_module():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.name in ("__init__.py", "__main__.py") or "kernels" in rel.parts:
            continue
        unit = _unit(path)
        if f"{unit}/" not in page and f"{unit}.py" not in page:
            missing.append(f"unit {unit}")
        if len(rel.parts) > 1 and rel.stem not in page:
            missing.append(f"module {rel.as_posix()}")
    assert not missing, sorted(set(missing))
