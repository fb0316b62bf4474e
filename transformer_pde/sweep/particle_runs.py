"""The particle runs of the built-in cells, in one place (the only code of the sweep
package that calls :func:`transformer_pde.simulate`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..attention import Attention
from ..blocks import Block
from ..particles import FieldOptions, SaveAt, simulate

__all__ = ["sphere_run", "softmax_pair_run"]


def sphere_run(beta: float, X0: np.ndarray, *, t_max: float, dt: float, backend: str) -> Any:
    """Softmax self-attention Q = K = V = I at inverse temperature ``beta`` on the sphere;
    only the initial and final states are kept."""
    d = X0.shape[1]
    att = Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=beta)
    return simulate(att, X0, t_max=t_max, dt=dt, solver="rk4",
                    block=Block(constraint="sphere"),
                    field=FieldOptions(backend=backend),
                    saveat=SaveAt(every=max(1, int(round(t_max / dt)))))


def softmax_pair_run(Q: np.ndarray, K: np.ndarray, V: np.ndarray, X0: np.ndarray,
                     Y0: np.ndarray, *, t_max: float, dt: float
                     ) -> tuple[Attention, np.ndarray, np.ndarray]:
    """Evolve two token clouds with the same softmax attention (RK4); returns the attention
    and both final states.

    The runs use the NumPy backend, not the library's ``"auto"``: a study's stored outputs
    must not depend on which backends the machine running a cell has installed (a study
    resumed elsewhere would mix the last bits of two backends)."""
    att = Attention("softmax", Q, K, V)
    out = []
    for X in (X0, Y0):
        traj = simulate(att, X, t_max=t_max, dt=dt, solver="rk4",
                        # NumPy, not "auto": the cell's outputs are the same on every machine
                        field=FieldOptions(backend="numpy"),
                        saveat=SaveAt(every=max(1, int(round(t_max / dt)))))
        out.append(traj.states[-1])
    return att, out[0], out[1]
