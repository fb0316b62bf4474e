"""Shared pytest configuration for the transformer-pde test suite.

Hypothesis profiles
-------------------
``default``   moderate example counts, no deadline (field evaluations are cheap but the
              first call of a backend may compile or warm up; wall-clock deadlines would
              make the suite flaky on a loaded 2-core machine).
``thorough``  many more examples, for a local soak: ``HYPOTHESIS_PROFILE=thorough pytest``
              (tests with an explicit ``max_examples`` keep it).
``ci``        like ``default`` but derandomised, so CI failures reproduce exactly; selected
              automatically when the ``CI`` environment variable is set (as ``.ci/run`` is).

Fixtures
--------
``rng``       a seeded NumPy generator.
``backend``   the name of each backend that loads on this machine
              (:func:`transformer_pde.backends.available_backends`: numpy and numba, cupy
              where a GPU is present); a test taking it runs once per backend, with the
              backend's name as the test id.
"""

from __future__ import annotations

import os

# "auto" picks a backend by the problem alone in the tests: no NumPy answer while the Numba
# kernels compile in the background (tests of that rule set the variable themselves)
os.environ.setdefault("TRANSFORMER_PDE_AUTO_COMPILE", "foreground")

import matplotlib
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from transformer_pde.backends import available_backends

matplotlib.use("Agg")  # figures in tests and examples never open a window

settings.register_profile(
    "default", max_examples=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile(
    "ci", parent=settings.get_profile("default"), derandomize=True, print_blob=True)
settings.register_profile(
    "thorough", parent=settings.get_profile("default"), max_examples=500)
_IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if _IN_CI else "default"))


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator, so that non-hypothesis random tests are reproducible."""
    return np.random.default_rng(20250122)


@pytest.fixture(scope="session", params=available_backends(), ids=str)
def backend(request: pytest.FixtureRequest) -> str:
    """The name of one installed backend; the test runs once for each (ids: the names).

    Session-scoped (a name, no state), so hypothesis tests may take it too."""
    return request.param


@pytest.fixture(autouse=True)
def _close_pyplot_figures():
    """Plot functions make their figures through pyplot (so they show in notebooks): close
    whatever a test left open, so figures never pile up across the suite."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
