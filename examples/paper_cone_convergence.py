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

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) starts 8 runs per figure instead of 24; the figures go into
# ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import numpy as np
from mpl_toolkits.mplot3d.art3d import Poly3DCollection

from transformer_pde import plot
from transformer_pde.paper import paper_attention, slice_covariances, solve_paths
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
N_STARTS = 8 if FAST else 24     # initial covariances per figure

# %%
# Three cases with a closed form
# ------------------------------
# For Gaussian tokens :math:`N(0, \Sigma)` softmax attention moves the covariance by
# :math:`\Sigma' = V\Sigma A\Sigma + \Sigma A^\top\Sigma V^\top`, with
# :math:`A = K^\top Q/\sqrt 2` (per head :math:`A_h = K_h^\top Q_h`, :math:`k = 1`).  Each
# entry of ``FIGURES`` picks :math:`Q, K, V` so that this equation can be solved or read by
# hand: :math:`V = -I` with :math:`A = I/\sqrt 2` (then :math:`(\Sigma^{-1})' = \sqrt 2\, I`:
# the inverse grows linearly), :math:`V = -I` with a rank-one :math:`A` (then
# :math:`\Sigma' = -\sqrt 2\,(\Sigma e_1)(\Sigma e_1)^\top`, which vanishes once
# :math:`\Sigma e_1 = 0`), and two heads that each read one coordinate and write the other.
# The starting covariances have trace one and lie on a circle of the trace-normalised disc;
# for the line, a smaller circle spreads the limits along it.

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


# %%
# The runs and one figure
# -----------------------
# :func:`~transformer_pde.paper.solve_paths` solves the moment ODE from the ``N_STARTS``
# covariances to tight tolerances and reports each run at 300 evenly spaced times up to its
# end.  :func:`~transformer_pde.plot.cone` draws the paths in the cone of 2×2 PSD matrices,
# :math:`(u, w, v) = (a - b, 2c, a + b)`, with the rank-one ray of the line case dashed; the
# plane case adds the plane :math:`w = 0` in green.  The function also returns the runs, so
# their final covariances can be compared with the closed forms, e.g. the limit
# :math:`\lambda = \det\Sigma_0/(\Sigma_0)_{11}` on the ray :math:`\{\lambda e_2e_2^\top\}`.

def figure(name: str):
    Q, K, V, heads, t_max, line, title = FIGURES[name]
    att = paper_attention("softmax", Q, K, V, heads=heads)
    covs0 = slice_covariances(N_STARTS, radius=RADIUS[name], trace=1.0)
    runs = solve_paths(att, covs0, t_max=t_max, n_eval=300, rtol=1e-9, atol=1e-12)
    ax = plot.cone(runs, rank_one_line=line, title=title, v_max=1.0)
    if name == "plane":
        ax.add_collection3d(Poly3DCollection([[(0, 0, 0), (1, 0, 1), (-1, 0, 1)]], alpha=0.25,
                                             facecolor="tab:green", edgecolor="tab:green"))
    return ax.figure, runs


# %%
# The three figures
# -----------------
# In the first figure every path runs to the apex :math:`\Sigma = 0`, like :math:`1/t`.  In
# the second the paths stop on the dashed ray, each at its own point.  In the third the
# off-diagonal entry decays and the paths end in the green plane :math:`w = 0`, again at
# points that depend on :math:`\Sigma_0`; one head with the same matrices would drive
# :math:`\Sigma` to zero instead.

def figures() -> dict:
    return {f"cone_convergence_{name}": figure(name)[0] for name in FIGURES}


# %%
# Save the figures
# ----------------
# ``cone_convergence_zero.png``, ``cone_convergence_line.png`` and
# ``cone_convergence_plane.png`` into ``OUT``; in Jupyter the figures show below the cell.

save_figures(figures(), OUT)
