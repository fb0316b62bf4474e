"""A missing optional dependency is an error that names the extra to install."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from transformer_pde.errors import MissingDependencyError
from transformer_pde.extras import EXTRAS, require


@pytest.mark.parametrize(("module", "extra"), sorted(EXTRAS.items()))
def test_missing_module_names_its_extra(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(MissingDependencyError, match=rf"pip install 'transformer-pde\[{extra}\]'") as info:
        require(module, "this feature")
    assert isinstance(info.value, ImportError)
    assert "this feature" in str(info.value)


def test_installed_module_is_returned():
    assert require("numpy", "x") is np


def test_study_store_without_xarray_says_which_extra(monkeypatch, tmp_path):
    from transformer_pde import sweep

    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(MissingDependencyError, match=r"transformer-pde\[io\]"):
        sweep.open_results(tmp_path / "missing.zarr")


def test_every_extra_is_declared_in_pyproject():
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    core = " ".join(meta["dependencies"])
    for module, extra in EXTRAS.items():
        assert module not in core, f"{module} is an optional dependency, not a core one"
        assert any(module in req for req in extras[extra]), (module, extra)
        assert any(module in req for req in extras["all"]), module
        assert any(module in req for req in extras["test"]), module
