"""Size rules of the package: no module over about 600 lines, no function over about 100
lines of code (its docstring not counted), compiled kernels excepted."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "transformer_pde"
MODULE_LINES = 610
FUNCTION_LINES = 100
#: decorators of compiled kernels, whose loops are written out for the compiler
KERNEL_DECORATORS = {"njit", "jit", "jitable", "intrinsic", "overload", "vectorize", "guvectorize"}


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute):
            names.add(target.attr)
        elif isinstance(target, ast.Name):
            names.add(target.id)
    return names


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    n = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        n -= first.end_lineno - first.lineno + 1
    return n


def test_no_module_is_too_long():
    long = {p.relative_to(PKG).as_posix(): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines: {long}"


def test_no_function_is_too_long():
    long = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and not (_decorator_names(node) & KERNEL_DECORATORS) \
                    and (n := _code_lines(node)) > FUNCTION_LINES:
                long[f"{path.relative_to(PKG).as_posix()}::{node.name}"] = n
    assert not long, f"functions over {FUNCTION_LINES} lines of code: {long}"


def test_the_rules_see_what_they_are_meant_to():
    src = "def f():\n    '''doc\n\n    more'''\n    return 1\n"
    node = ast.parse(src).body[0]
    assert _code_lines(node) == 2
    node = ast.parse("@numba.njit(cache=True)\ndef g():\n    pass\n").body[0]
    assert _decorator_names(node) == {"njit"}
