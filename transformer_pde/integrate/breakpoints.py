r"""Jump times of piecewise-constant parameters (layer boundaries): one implementation.

A :class:`~transformer_pde.Layers` table is constant on :math:`[t_0 + \ell h, t_0 + (\ell+1) h)`
and jumps at :math:`t_0 + \ell h` for :math:`\ell = 1, \dots, L-1`.  An integrator must not
step over a jump: an embedded pair cannot meet its tolerance across a discontinuity of
the field, a fixed-step method loses its order, and a multistep history must restart.
These helpers are the only place the package computes those times.

Every function takes a list of tables (anything with ``n_layers``, ``t0``,
``layer_time`` and ``index(t, left=...)``); :func:`layer_tables` collects them from the
objects of a run (an :class:`~transformer_pde.Attention`, an MLP, LayerNorms, ...).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..attention import Layers

__all__ = ["is_jump", "jump_times", "layer_tables", "next_jump"]


def layer_tables(*objects: Any) -> list[Layers]:
    """Every :class:`~transformer_pde.Layers` table among ``objects`` and their attributes.

    ``None`` entries are skipped; a ``Layers`` is taken as is; for any other object the
    ``Layers``-valued attributes (``vars(obj)``) are collected, e.g. ``Q, K, V, W_O`` of an
    :class:`~transformer_pde.Attention` or ``W1, b1, W2, b2`` of an MLP.  A sequence of
    objects (e.g. a list of attentions) is flattened."""
    out: list[Layers] = []
    for obj in objects:
        if obj is None:
            continue
        if isinstance(obj, Layers):
            out.append(obj)
        elif isinstance(obj, (list, tuple)):
            out.extend(layer_tables(*obj))
        elif hasattr(obj, "__dict__"):
            out.extend(v for v in vars(obj).values() if isinstance(v, Layers))
    return out


def next_jump(tables: Iterable[Layers], t: float) -> float:
    """First jump time of ``tables`` after the layer in use at ``t`` (``inf`` if none).

    "In use" follows :meth:`Layers.index` (right-continuous, with its rounding tolerance):
    at a time that rounds to a boundary the next jump is the one after it."""
    out = math.inf
    for v in tables:
        nxt = v.index(t) + 1
        if nxt < v.n_layers:
            out = min(out, v.t0 + nxt * v.layer_time)
    return out


def is_jump(tables: Iterable[Layers], t: float) -> bool:
    """Whether one of ``tables`` jumps at ``t`` (its left and right limits differ)."""
    return any(v.index(t, left=True) != v.index(t) for v in tables)


def jump_times(tables: Sequence[Layers], t_start: float, t_end: float) -> np.ndarray:
    r"""Sorted distinct jump times :math:`t_0 + \ell h` of ``tables`` strictly inside
    ``(t_start, t_end)``, as a float64 array."""
    bps: set[float] = set()
    for v in tables:
        for ell in range(1, v.n_layers):
            tb = v.t0 + ell * v.layer_time
            if t_start < tb < t_end:
                bps.add(float(tb))
    return np.array(sorted(bps), dtype=np.float64)
