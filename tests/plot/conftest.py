"""The plot functions make pyplot figures: close them after every test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
