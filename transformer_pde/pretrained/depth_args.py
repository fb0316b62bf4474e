"""The depth of a pretrained model and the arguments of its continuous-depth run, checked
once for every model.

:class:`~transformer_pde.pretrained.PretrainedEncoder` and
:class:`~transformer_pde.pretrained.PretrainedDecoder` are :class:`DepthModel` s: their
``n_layers`` and ``d`` come from their ``config``, a layer index is checked by one rule, and
their ``simulate`` take the same depth arguments (``steps_per_layer``, ``solver``,
``repeat_layer``, ``n_layers``), validated by :meth:`DepthModel.check_depth_run` with the
same messages for both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..integrate.solvers import Solver, get_solver
from ..validation import integer

__all__ = ["DepthModel"]


class DepthModel:
    """What the pretrained models share: a ``config`` with ``n_layers`` and ``d``."""

    config: Any

    @property
    def n_layers(self) -> int:
        """Number of layers :math:`L`."""
        return self.config.n_layers

    @property
    def d(self) -> int:
        """Token dimension."""
        return self.config.d

    def layer_index(self, ell: Any) -> int:
        """``ell`` as a layer index in ``[0, n_layers)`` (``ArgumentError`` naming ``layer``
        otherwise)."""
        if isinstance(ell, bool) or not isinstance(ell, (int, np.integer)) \
                or not 0 <= ell < self.n_layers:
            raise ArgumentError(f"layer must be an integer in [0, {self.n_layers}), got {ell!r}")
        return int(ell)

    def check_depth_run(self, steps_per_layer: Any, solver: Any, repeat_layer: Any,
                        n_layers: Any) -> Solver:
        """Validate the depth arguments of ``simulate``; return the solver.

        Raises
        ------
        ArgumentError
            ``steps_per_layer`` or ``n_layers`` not an integer >= 1, a solver that is not a
            one-step fixed-step solver, more layers than the model has without
            ``repeat_layer``, or a ``repeat_layer`` that is not a layer index.
        ArgumentTypeError
            ``steps_per_layer`` or ``n_layers`` not a number, or not a solver.
        """
        integer("steps_per_layer", steps_per_layer, minimum=1)
        stepper = get_solver(solver, "solver")
        if stepper.adaptive or stepper.multistep:
            raise ArgumentError(f"solver={solver!r}: use a one-step fixed-step solver "
                                "('euler', 'heun', 'rk4', 'implicit_midpoint')")
        assert isinstance(stepper, Solver)  # get_solver's check: not adaptive, so a Solver
        if repeat_layer is not None:
            self.layer_index(repeat_layer)
        L = self.n_layers if n_layers is None else integer("n_layers", n_layers, minimum=1)
        if repeat_layer is None and L > self.n_layers:
            raise ArgumentError(f"n_layers={L} exceeds the model's {self.n_layers} layers; pass "
                                "repeat_layer= to iterate one layer's weights to long times")
        return stepper
