r"""Helpers for testing code built on :mod:`transformer_pde`: strategies and references.

Two modules, usable on their own:

* :mod:`transformer_pde.testing.strategies` -- hypothesis strategies that draw token
  measures, attention specifications, SPD matrices, rotations and Gaussians in
  well-conditioned ranges.  Every name of it is importable from this package
  (``from transformer_pde.testing import attention_problems``); it needs the optional
  dependency ``hypothesis``, imported on first use of one of these names.
* :mod:`transformer_pde.testing.references` -- plain NumPy loop/dense implementations of
  the head field of every attention kind (:data:`~transformer_pde.testing.references.REFERENCES`),
  of the whole multi-head field (:func:`~transformer_pde.testing.references.velocity`) and
  of the backend primitives ``softmax``, ``lse`` and ``pointwise``.  They share no code
  with the library's fields and backends and need NumPy and SciPy only, so that the
  library, or a custom attention kind, can be checked against them.

Examples
--------
>>> import numpy as np, transformer_pde as tp
>>> from transformer_pde.testing import references
>>> att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), heads=2)
>>> X = np.random.default_rng(0).normal(size=(6, 2))
>>> bool(np.allclose(tp.velocity(att, X), references.velocity(att, X), rtol=1e-12))
True
"""

from typing import Any

# the names of transformer_pde.testing.strategies, re-exported lazily (hypothesis is optional)
__all__ = ["CORE_KINDS", "Measure", "MeanCov", "attention_problems", "attentions",
           "compact_measures", "gaussians", "matrices", "measures", "rotations", "spd_matrices"]
_STRATEGY_NAMES = frozenset(__all__)


def __getattr__(name: str) -> Any:
    """Import :mod:`.strategies` on first use of one of its names (it needs hypothesis)."""
    if name in _STRATEGY_NAMES:
        from . import strategies  # noqa: PLC0415 (optional dependency: hypothesis)
        return getattr(strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_STRATEGY_NAMES))
