r"""Parameters of the parts of a block that may depend on depth :math:`t`.

A weight of an :class:`~transformer_pde.blocks.MLP`, a
:class:`~transformer_pde.blocks.LayerNorm` or an :class:`~transformer_pde.blocks.RMSNorm`
is one of

* a constant array, validated once (finite, real) and stored read-only;
* a callable ``t -> array``, validated each time it is evaluated;
* a :class:`~transformer_pde.Layers` table, piecewise constant in :math:`t`, evaluated
  with its right-continuous rule or, with ``left=True``, its left limit (the value the
  stages at the right end of a step use, so that a step over one layer sees only that
  layer's values).

:func:`stored_parameter` validates a parameter when the part is built,
:func:`parameter_at` and :func:`vector_at` evaluate it at a depth, and
:func:`refuse_class` turns a class passed where an instance is expected into a clear
error.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from ..attention import Layers
from ..errors import ArgumentError, ArgumentTypeError
from ..validation import matrix, real_array

__all__ = ["parameter_at", "refuse_class", "stored_parameter", "vector_at"]


def refuse_class(name: str, value: Any) -> None:
    """A class passed where an instance is expected (``constraint=Sphere``): a clear
    :class:`~transformer_pde.errors.ArgumentTypeError` saying what to pass instead;
    anything else passes."""
    if not isinstance(value, type):
        return
    cls = value.__name__
    if value.__module__.split(".")[0] == "transformer_pde":
        cls = f"tp.{cls}"
    try:
        needs_args = any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                         for p in inspect.signature(value).parameters.values())
    except (TypeError, ValueError):  # no signature available
        needs_args = True
    call = f"{cls}(...)" if needs_args else f"{cls}()"
    raise ArgumentTypeError(f"{name} must be an instance, got the class {cls}: pass "
                            f"{name}={call}, not {name}={cls}")


def stored_parameter(name: str, value: Any, *, vector: bool) -> Any:
    """Validate a constant parameter now (time-dependent ones at evaluation).

    Parameters
    ----------
    name : str
        The parameter's name in messages.
    value : array_like, callable, Layers or None
        ``None``, callables and tables are returned as they are.
    vector : bool
        Whether the parameter is a vector (any array with a single non-trivial axis is
        flattened) rather than a matrix.

    Returns
    -------
    ndarray (read-only), callable, Layers or None
    """
    refuse_class(name, value)
    if value is None or isinstance(value, Layers) or callable(value):
        return value
    arr = matrix(name, np.atleast_2d(real_array(name, value)))
    if vector:
        if min(arr.shape) != 1:
            raise ArgumentError(f"{name} must be a vector, got shape {np.shape(value)}")
        arr = arr.ravel()
    arr = np.array(arr)
    arr.setflags(write=False)
    return arr


def parameter_at(name: str, value: Any, t: float, left: bool) -> Any:
    """The value of a stored parameter at depth ``t`` (a table's left limit with
    ``left=True``; a callable's value validated as a finite real matrix)."""
    if isinstance(value, Layers):
        return value(t, left=left)
    if callable(value):
        return matrix(name, np.atleast_2d(real_array(f"{name} (evaluated at t={t})", value(t))), t)
    return value


def vector_at(name: str, value: Any, n: int, t: float, left: bool) -> np.ndarray | None:
    """A vector parameter at depth ``t`` as a float array of ``n`` entries (``None``
    stays ``None``); an :class:`~transformer_pde.errors.ArgumentError` naming it when it
    has another number of entries."""
    if value is None:
        return None
    v = np.asarray(parameter_at(name, value, t, left), dtype=float).ravel()
    if v.shape != (n,):
        raise ArgumentError(f"{name} must have {n} entries, got {v.size} (t={t})")
    return v
