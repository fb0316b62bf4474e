"""The array-namespace contract of :mod:`transformer_pde.backends`: the package calls on
backend arrays only the functions of ``XP_FUNCTIONS``, NumPy and CuPy provide all of them,
and ``array_namespace`` / ``to_host`` are the only tests of where an array lives; every
entry point taking ``backend=`` defaults to the one ``DEFAULT_BACKEND``."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import transformer_pde as tp
from transformer_pde.backends import (DEFAULT_BACKEND, XP_FUNCTIONS, array_namespace,
                                      get_backend, to_host)
from transformer_pde.cli.parser import build_parser
from transformer_pde.cli.runs import run_demo
from transformer_pde.diagnostics import kinetic_energy
from transformer_pde.particles import FieldOptions
from transformer_pde.pretrained import PretrainedDecoder, PretrainedEncoder

PKG = Path(__file__).resolve().parents[2] / "transformer_pde"
#: the backends themselves call their own library directly
IMPLEMENTATIONS = ("backends/numpy_backend.py", "backends/cupy_backend.py",
                   "backends/cuda_cpu.py", "backends/numba/")
#: ``xp.name``, ``be.xp.name``, ``_xp(a).name``, ``array_namespace(a).name``
CALL = re.compile(r"(?:\bxp|\b_xp\([^()]*\)|\barray_namespace\([^()]*\))\.([A-Za-z_]\w*)")


def _sources():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if not rel.startswith(IMPLEMENTATIONS):
            yield rel, path.read_text(encoding="utf-8")


def _called() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for rel, text in _sources():
        for name in CALL.findall(text):
            used.setdefault(name, set()).add(rel)
    return used


def test_the_scan_sees_the_package_calls():
    # guards the scan itself: these calls exist in integrate, blocks and sinkhorn today
    assert {"asarray", "where", "abs", "max"} <= set(_called())


def test_the_package_calls_only_the_contracts_functions():
    outside = {name: sorted(files) for name, files in _called().items()
               if name not in XP_FUNCTIONS and name != "asnumpy"}   # to_host's own
    assert not outside, f"add to backends.XP_FUNCTIONS (and check CuPy has them): {outside}"


def test_numpy_provides_every_function_of_the_contract():
    assert get_backend("numpy").xp is np
    assert [n for n in sorted(XP_FUNCTIONS) if not hasattr(np, n)] == []


@pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy is not installed")
def test_cupy_provides_every_function_of_the_contract():
    import cupy  # deferred: optional dependency, present on GPU machines only

    assert [n for n in sorted(XP_FUNCTIONS) if not hasattr(cupy, n)] == []


@pytest.mark.parametrize("pattern", [r"\bimport cupy\b", r"__module__[^\n]*cupy",
                                     r"hasattr\([^()]*,\s*[\"']get[\"']\)"])
def test_no_other_detection_of_device_arrays(pattern):
    hits = [rel for rel, text in _sources()
            if rel != "backends/__init__.py" and re.search(pattern, text)]
    assert hits == [], f"use backends.array_namespace / to_host instead: {hits}"


def test_host_arrays_stay_where_they_are():
    a = np.arange(6.0).reshape(2, 3)
    assert array_namespace(a) is np and array_namespace(1.5) is np
    assert array_namespace(np.float32(1.0)) is np
    assert to_host(a) is a                     # no copy of a host array
    assert isinstance(to_host([1.0, 2.0]), np.ndarray)



def test_every_entry_point_defaults_to_the_one_default_backend():
    entry_points = [tp.FieldEvaluator, tp.velocity, tp.sinkhorn_coupling, get_backend,
                    kinetic_energy, run_demo, PretrainedEncoder.hidden_states,
                    PretrainedEncoder.simulate, PretrainedDecoder.hidden_states,
                    PretrainedDecoder.logits, PretrainedDecoder.generate,
                    PretrainedDecoder.attention_weights, PretrainedDecoder.simulate]
    names = [f.__qualname__ for f in entry_points
             if [p.default for n, p in inspect.signature(f).parameters.items()
                 if n in ("backend", "name")] != [DEFAULT_BACKEND]]
    assert names == [], f"backend defaults other than DEFAULT_BACKEND: {names}"
    assert FieldOptions().backend == DEFAULT_BACKEND == "auto"
    assert build_parser().parse_args(["demo"]).backend == DEFAULT_BACKEND
