r"""Convergent covariance dynamics of 2-D Gaussians in the PSD cone (three figures)
===============================================================================

Beyond the paper: three closed-form cases of the paper's phase plots of converging Gaussian runs (Castin, Ablin,
Carrillo, Peyré 2025, Section 4, Gaussian initial data): covariance trajectories
:math:`t\mapsto\Sigma(t)` of softmax attention drawn in the cone of 2×2 PSD matrices,
:math:`(u, w, v) = (a - b, 2c, a + b)` (``docs/conventions.md``), starting from 24 covariances of trace 1:

``figures/cone_convergence_zero.png`` -- convergence to zero.
    :math:`V = -I`, :math:`Q = K = I`: :math:`\Sigma' = -\sqrt2\,\Sigma^2`, so
    :math:`\Sigma(t) = (\Sigma_0^{-1} + \sqrt2\,t I)^{-1} \to 0` (rate :math:`1/t`).
``figures/cone_convergence_line.png`` -- convergence to a line (rank-one :math:`A`).
    :math:`V = -I`, :math:`Q = K = e_1e_1^\top` (:math:`A = e_1e_1^\top/\sqrt2`):
    :math:`\Sigma' = -\sqrt2\,(\Sigma e_1)(\Sigma e_1)^\top`; :math:`\Sigma` decreases until
    :math:`\Sigma e_1 = 0`, i.e. onto the rank-one ray :math:`\{\lambda e_2e_2^\top\}` (dashed), at
    a point that depends on :math:`\Sigma_0`.
``figures/cone_convergence_plane.png`` -- multi-head convergence to a plane.
    Two heads (:math:`k = 1`), :math:`V = I`, :math:`K = P`, :math:`Q = -P` with :math:`P` the
    coordinate swap: head :math:`h` attends with :math:`A_h = -e_{h'}e_{h'}^\top` and writes
    coordinate :math:`h`, so :math:`M = -\Sigma_{12} P` and
    :math:`a' = b' = -2c^2`, :math:`c' = -(a+b)c`: the off-diagonal entry dies out while the
    diagonal stops at a point of the plane :math:`w = 0` (drawn) that depends on
    :math:`\Sigma_0`.  The same :math:`Q, K, V` with one head give :math:`A = -I` and
    :math:`\Sigma \to 0`: the plane is a multi-head effect.

These are not the paper's parameters (``examples/paper_zero.py``, ``paper_line.py`` and
``paper_plane.py`` redraw its figures with them); these are chosen to
exhibit each behaviour, with the paper's scalings passed explicitly (softmax score divided by
:math:`\sqrt d`, by :math:`\sqrt k = 1` per head for multi-head; see
:func:`transformer_pde.paper.paper_attention`).  The moment ODE is solved with the exact adaptive
solvers of :mod:`transformer_pde.gaussian` (the paper used projected explicit Euler,
:math:`h = 0.01`).

Run: ``python examples/paper_cone_convergence.py`` (well under a minute on 2 cores).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
from mpl_toolkits.mplot3d.art3d import Poly3DCollection

from transformer_pde import plot
from transformer_pde.paper import (paper_attention, run_figure_script,
                                 slice_covariances, solve_paths)

E1 = np.diag([1.0, 0.0])
P = np.array([[0.0, 1.0], [1.0, 0.0]])
#: name -> (Q, K, V, heads, t_max, rank-one direction, title)
FIGURES = {
    "zero": (np.eye(2), np.eye(2), -np.eye(2), 1, 200.0, None,
             "softmax, $V=-I$, $Q=K=I$: convergence to 0"),
    "line": (E1, E1, -np.eye(2), 1, 2000.0, [0.0, 1.0],
             r"softmax, $V=-I$, $A=e_1e_1^\top/\sqrt{2}$: "
             r"convergence to $\{\lambda e_2e_2^\top\}$"),
    "plane": (-P, P, np.eye(2), 2, 200.0, None,
              "2-head softmax, $V=I$, $K=P$, $Q=-P$: convergence to the plane $w=0$"),
}
#: radius of the circle of starting points in the trace-normalised disc (the limit on the
#: line is det(Sigma0)/a0, so a smaller radius spreads the limits along it)
RADIUS = {"zero": 0.8, "line": 0.5, "plane": 0.8}


def figure(name: str):
    Q, K, V, heads, t_max, line, title = FIGURES[name]
    att = paper_attention("softmax", Q, K, V, heads=heads)
    covs0 = slice_covariances(24, radius=RADIUS[name], trace=1.0)
    runs = solve_paths(att, covs0, t_max=t_max, n_eval=300, rtol=1e-9, atol=1e-12)
    fig = plot.cone(runs, rank_one_line=line, title=title, v_max=1.0)
    if name == "plane":
        ax = fig.axes[0]
        ax.add_collection3d(Poly3DCollection([[(0, 0, 0), (1, 0, 1), (-1, 0, 1)]], alpha=0.25,
                                             facecolor="tab:green", edgecolor="tab:green"))
    return fig, runs


def figures(_args=None) -> dict:
    return {f"cone_convergence_{name}": figure(name)[0] for name in FIGURES}


if __name__ == "__main__":
    run_figure_script(__doc__, figures)
