"""The arguments of a pretrained model's continuous-depth run, checked once for every model.

:meth:`PretrainedEncoder.simulate <transformer_pde.pretrained.PretrainedEncoder.simulate>` and
:meth:`PretrainedDecoder.simulate <transformer_pde.pretrained.PretrainedDecoder.simulate>` take
the same depth arguments (``steps_per_layer``, ``solver``, ``repeat_layer``, ``n_layers``);
:func:`check_depth_run` validates them with the same messages for both.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import ArgumentError
from ..integrate.solvers import Solver, get_solver

__all__ = ["check_depth_run"]


def check_depth_run(depth: int, layer: Callable[[Any], Any], steps_per_layer: Any, solver: Any,
                    repeat_layer: Any, n_layers: Any) -> Solver:
    """Validate the depth arguments of a model with ``depth`` layers; return the solver.

    Parameters
    ----------
    depth : int
        The model's number of layers.
    layer : callable
        The model's ``layer(index)``, called on ``repeat_layer`` to validate the index.
    steps_per_layer, solver, repeat_layer, n_layers
        As in the models' ``simulate``.

    Raises
    ------
    ArgumentError
        ``steps_per_layer`` or ``n_layers`` not an integer >= 1, a solver that is not a
        one-step fixed-step solver, more layers than the model has without ``repeat_layer``,
        or a bad ``repeat_layer`` (from ``layer``).
    """
    if isinstance(steps_per_layer, bool) or not isinstance(steps_per_layer, (int, np.integer)) \
            or steps_per_layer < 1:
        raise ArgumentError(f"steps_per_layer must be an integer >= 1, got {steps_per_layer!r}")
    stepper = get_solver(solver, "solver")
    if stepper.adaptive or stepper.multistep:
        raise ArgumentError(f"solver={solver!r}: use a one-step fixed-step solver "
                            "('euler', 'heun', 'rk4', 'implicit_midpoint')")
    assert isinstance(stepper, Solver)  # get_solver's check: not adaptive, so a Solver
    if repeat_layer is not None:
        layer(repeat_layer)  # validates the index
    L = depth if n_layers is None else n_layers
    if isinstance(L, bool) or not isinstance(L, (int, np.integer)) or L < 1:
        raise ArgumentError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    if repeat_layer is None and L > depth:
        raise ArgumentError(f"n_layers={L} exceeds the model's {depth} layers; pass "
                            "repeat_layer= to iterate one layer's weights to long times")
    return stepper
