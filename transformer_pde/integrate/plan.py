r"""How many steps and saves a run takes, and the checks made before it starts.

A run from :math:`t = 0` to :math:`t_{max}` is cut into segments ending at the *stops*:
the save times of ``SaveAt(ts=...)`` inside :math:`(0, t_{max})`, then :math:`t_{max}`
(:func:`segment_stops`).  A fixed-step solver takes :func:`~.controller.n_fixed_steps`
steps in each segment (:func:`planned_steps`): ``t_max=0.07, dt=0.01`` takes 7 steps,
not :math:`\lceil 0.07/0.01\rceil = 8` (the quotient is ``7.000000000000001`` in floating
point; the count is decided relative to the step).  An adaptive solver's step count is
not known in advance (``None``).  :func:`planned_saves` counts the states a run keeps if
it reaches :math:`t_{max}`, and :func:`preflight` refuses, before anything is computed, a
run whose steps exceed ``Limits.max_steps`` or whose saved states exceed
``Limits.max_memory`` (:class:`~transformer_pde.errors.ArgumentError`).  These are the
counts the time loop (:class:`~.loop.TimeLoop`) follows, so a caller that checks a run
up front (the command line) refuses exactly the runs :func:`~transformer_pde.simulate`
refuses.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from ..errors import ArgumentError
from .controller import n_fixed_steps

__all__ = ["check_step_budget", "physical_memory", "planned_saves", "planned_steps",
           "preflight", "segment_stops"]


def physical_memory() -> int | None:
    """Physical memory of this machine in bytes (``SC_PHYS_PAGES * SC_PAGE_SIZE``), or
    ``None`` where the platform does not report it (no ``os.sysconf``, or a value that
    is not positive).  The one reading of it that the memory checks before a run share
    (:meth:`~transformer_pde.Limits.memory_limit`, the command line's configuration
    checks)."""
    try:
        memory = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None
    return memory if memory > 0 else None


def segment_stops(t_max: float, saveat: Any = None) -> list[float]:
    """Ends of the segments of a run: the times of ``saveat.ts`` strictly inside
    :math:`(0, t_{max})`, then ``t_max`` (only ``t_max`` without ``ts``)."""
    t_max = float(t_max)
    ts = None if saveat is None else saveat.ts
    if ts is None:
        return [t_max]
    return [float(s) for s in ts if 0.0 < s < t_max] + [t_max]


def planned_steps(t_max: float, dt: float, saveat: Any = None, *,
                  adaptive: bool = False) -> int | None:
    r"""Number of steps of a fixed-step run, ``None`` for an adaptive one.

    Parameters
    ----------
    t_max, dt : float
        Final time and step size (> 0).
    saveat : SaveAt, optional
        With ``ts``, steps land on every save time, so each segment between stops is
        counted on its own (:func:`segment_stops`).
    adaptive : bool, default False
        The solver is adaptive (``solver.adaptive``).

    Returns
    -------
    int or None
        :math:`\sum_k` :func:`~.controller.n_fixed_steps` of each segment; e.g. 7 for
        ``t_max=0.07, dt=0.01`` and 4 for ``t_max=1.0, dt=0.3`` (the last step 0.1 long).
    """
    if adaptive:
        return None
    total, t = 0, 0.0
    for s in segment_stops(t_max, saveat):
        total += n_fixed_steps(s - t, float(dt))
        t = s
    return total


def planned_saves(t_max: float, dt: float, saveat: Any, *, adaptive: bool = False) -> int:
    r"""Number of states a run saves if it reaches ``t_max``.

    ``SaveAt(ts=...)``: the save times up to ``t_max``; ``SaveAt(every=k)``: the initial
    state, every :math:`k`-th fixed step and the final state
    (:math:`\lceil n/k\rceil + 1` for :math:`n` fixed steps), or for an adaptive solver the
    grid of multiples of :math:`k\,\Delta t` it lands on
    (``n_fixed_steps(t_max, k * dt) + 1``)."""
    if saveat.ts is not None:
        return len({float(s) for s in saveat.ts if s <= float(t_max)})
    every = saveat.every
    if adaptive:
        return n_fixed_steps(float(t_max), float(dt) * every) + 1
    return math.ceil(planned_steps(t_max, dt, saveat) / every) + 1


def check_step_budget(t_max: float, dt: float, saveat: Any, limits: Any, *,
                      adaptive: bool = False) -> None:
    """Refuse a fixed-step run that needs more than ``limits.max_steps`` steps.

    Raises
    ------
    ArgumentError
        The message names ``t_max``, ``dt``, the step count and ``max_steps``."""
    steps = planned_steps(t_max, dt, saveat, adaptive=adaptive)
    if steps is not None and steps > limits.max_steps:
        raise ArgumentError(
            f"t_max={float(t_max):g} with dt={dt:g} needs {steps} steps, more than "
            f"max_steps={limits.max_steps}; increase dt or Limits(max_steps=...)")


def preflight(t_max: float, dt: float, *, saveat: Any, limits: Any, adaptive: bool,
              state_shape: tuple[int, ...], dtype: Any) -> None:
    """Refuse, before it starts, a run that cannot finish within its limits.

    Parameters
    ----------
    t_max, dt : float
    saveat : SaveAt
    limits : Limits
        ``max_steps`` (fixed-step runs: :func:`check_step_budget`) and
        :meth:`~transformer_pde.Limits.memory_limit`.
    adaptive : bool
        The solver is adaptive.
    state_shape : tuple of int
        Shape of one saved state, e.g. ``(N, d)`` tokens.
    dtype : dtype
        Working precision of the saved states.

    Raises
    ------
    ArgumentError
        Too many steps, or :func:`planned_saves` states of ``state_shape`` and ``dtype``
        would need more than the memory limit (not checked with ``SaveAt(fn=...)``, which
        keeps a statistic instead of the states).  The message names the limit to raise.
    """
    check_step_budget(t_max, dt, saveat, limits, adaptive=adaptive)
    if saveat.fn is not None:
        return
    saves = planned_saves(t_max, dt, saveat, adaptive=adaptive)
    size = math.prod(int(k) for k in state_shape)
    need = float(saves) * size * np.dtype(dtype).itemsize
    cap = limits.memory_limit()
    if need > cap:
        shape = " x ".join(str(int(k)) for k in state_shape)
        raise ArgumentError(
            f"the {saves} saved states of {shape} tokens would need "
            f"{need / 2 ** 30:.3g} GiB, more than max_memory={cap / 2 ** 30:.3g} GiB; "
            "save fewer with SaveAt(every=k) or SaveAt(ts=...), keep a statistic with "
            "SaveAt(fn=...), or raise Limits(max_memory=...)")
