"""Write the API reference pages (``docs/api/*.rst``) from the package itself.

One page per public module and per subpackage.  A subpackage's page documents the names
its ``__init__`` re-exports (the import path users write, ``transformer_pde.gaussian.solve``)
and then, for each of its modules, the module docstring and the names that module makes
public without the package re-exporting them.  The top-level page lists
``transformer_pde.__all__`` with links to where each name is documented.  Run by
``conf.py`` at every build; the generated files are not committed.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

PACKAGE = "transformer_pde"
SKIP = {"transformer_pde.cli.__main__"}


def _title(text: str, char: str = "=") -> str:
    return f"{text}\n{char * len(text)}\n"


def _public(module) -> list[str]:
    return list(getattr(module, "__all__", []))


def modules() -> tuple[list[str], dict[str, list[str]]]:
    """Top-level modules and, per subpackage, its modules."""
    pkg = importlib.import_module(PACKAGE)
    plain, subpackages = [], {}
    for info in pkgutil.iter_modules(pkg.__path__, PACKAGE + "."):
        if info.name in SKIP or info.name.rsplit(".", 1)[1].startswith("_"):
            continue
        if info.ispkg:
            sub = importlib.import_module(info.name)
            # nested packages (backends.numba) and their modules too
            subpackages[info.name] = [
                m.name for m in pkgutil.walk_packages(sub.__path__, info.name + ".")
                if m.name not in SKIP
                and not any(p.startswith("_") for p in m.name.split(".")[2:])]
        else:
            plain.append(info.name)
    return plain, subpackages


def documented_at(name: str, obj, plain: list[str], subpackages: dict[str, list[str]]) -> str:
    """The dotted path under which the API pages document ``obj`` (exported as ``name``)."""
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) or not module.startswith(PACKAGE):
        # data (KINDS...): the module whose __all__ holds the name
        module = next((m for m in plain if name in _public(importlib.import_module(m))),
                      PACKAGE)
    for pkg in subpackages:
        if module == pkg or module.startswith(pkg + "."):
            if name in _public(importlib.import_module(pkg)):
                return f"{pkg}.{name}"
            return f"{module}.{name}"
    if module in plain:
        return f"{module}.{name}"
    return f"{PACKAGE}.{name}"


def _defined_in(pkg: str, name: str) -> bool:
    """Whether the export ``name`` of module or package ``pkg`` is defined inside it."""
    obj = getattr(importlib.import_module(pkg), name)
    module = getattr(obj, "__module__", None)
    return not isinstance(module, str) or module == pkg or module.startswith(pkg + ".")


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    plain, subpackages = modules()
    pages: dict[str, str] = {}

    def members(mod: str, names: list[str]) -> str:
        own = [n for n in names if _defined_in(mod, n)]
        return f"   :members: {', '.join(own)}\n" if own else "   :no-members:\n"

    for name in plain:
        pages[name] = (_title(f"``{name}``") + f"\n.. automodule:: {name}\n"
                       + members(name, _public(importlib.import_module(name)))
                       + "   :show-inheritance:\n")

    for pkg, mods in subpackages.items():
        names = _public(importlib.import_module(pkg))
        exported = set(names)
        own = [n for n in names if _defined_in(pkg, n)]
        foreign = [n for n in names if n not in own]
        text = [_title(f"``{pkg}``"), f"\n.. automodule:: {pkg}\n"
                f"   :members: {', '.join(own)}\n   :show-inheritance:\n"]
        if foreign:
            links = ", ".join(
                f":py:obj:`~{documented_at(n, getattr(importlib.import_module(pkg), n), plain, subpackages)}`"
                for n in foreign)
            text.append(f"\nAlso importable from ``{pkg}``: {links}.\n")
        for mod in mods:
            # names re-exported by an enclosing package are documented there
            shown = set(exported).union(*(_public(importlib.import_module(p)) for p in mods
                                          if mod.startswith(p + ".")))
            rest = [n for n in _public(importlib.import_module(mod)) if n not in shown]
            text.append("\n" + _title(f"``{mod}``", "-"))
            # a module named like one of the package's exports (cli.main, sweep.run)
            # would describe the same dotted name twice
            clash = "   :no-index:\n" if mod.rsplit(".", 1)[1] in exported else ""
            text.append(f"\n.. automodule:: {mod}\n{members(mod, rest)}   :show-inheritance:\n"
                        f"{clash}")
        pages[pkg] = "".join(text)

    top = importlib.import_module(PACKAGE)
    rows = []
    for name in _public(top):
        if name.startswith("__"):
            continue
        target = documented_at(name, getattr(top, name), plain, subpackages)
        rows.append(f"   {target[len(PACKAGE) + 1:]}")
    pages[PACKAGE] = (_title(f"``{PACKAGE}``") + f"\n.. automodule:: {PACKAGE}\n"
                      "   :no-members:\n\nThe names importable from the package itself, "
                      "each documented in its module:\n\n.. autosummary::\n\n"
                      + "\n".join(rows) + "\n")

    index = [_title("API reference"),
             "\nGenerated from the docstrings. Subpackages document the names their\n"
             "``__init__`` exports (the import path to use) and then each of their modules.\n"
             "The mathematical conventions are on :doc:`../conventions`.\n\n"
             ".. toctree::\n   :maxdepth: 1\n\n"]
    index += [f"   {name}\n" for name in [PACKAGE, *plain, *subpackages]]
    pages["index"] = "".join(index)

    written = []
    for name, text in pages.items():
        path = out / f"{name}.rst"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        written.append(path)
    for stale in out.glob("*.rst"):
        if stale not in written:
            stale.unlink()
    return written
