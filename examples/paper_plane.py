r"""The paper's "convergence to a plane" figure (2-head softmax) with the paper's parameters
========================================================================================

Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322).  Parameters
(``transformer_pde.paper.paper_figure("plane")``): the "line" matrices, one-row
:math:`Q = (0.4063, 0.9137)`, :math:`K = -Q`, :math:`V = I`, with :math:`H = 2` heads of
:math:`k = 1` row: head 0 gets the row (:math:`A_0 = K_0^\top Q_0`), head 1 gets none
(:math:`A_1 = 0`), exactly as the paper's code slices the rows; so only the first
coordinate is written and :math:`\Sigma` stops on a plane of the cone.  Initial covariances
``init_grid(10, 10, [-0.5, 0.5, -0.5, 0.5])``.  The paper uses projected explicit Euler
(h = 0.5), stopping when :math:`\|\Sigma'\|_F < 10^{-4}` (t = 5.5--42.5); here the exact
solver stops each run on the same criterion.

Run: ``python examples/paper_plane.py`` (writes ``figures/paper_plane.png``).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) solves every 10th initial covariance of the paper's
# grid instead of all; the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default
# the repository's ``figures/``).

from transformer_pde.paper import paper_figure_plot
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
STRIDE = 10 if FAST else 1     # solve and draw every STRIDE-th initial covariance

# %%
# One written coordinate
# ----------------------
# With Gaussian tokens :math:`N(0, \Sigma)` the attention field is linear,
# :math:`x \mapsto Mx`, and :math:`\Sigma' = M\Sigma + \Sigma M^\top`.  Each head writes its
# own coordinate (its row of :math:`V = I`).  Head 0 attends with
# :math:`A_0 = K_0^\top Q_0 = -qq^\top`, :math:`q = (0.4063, 0.9137)`, and moves the first
# coordinate; head 1 has no row of :math:`Q, K`, so :math:`A_1 = 0` and it writes the mean of
# the tokens, zero here.  The second coordinate therefore never moves: :math:`\Sigma_{22}`
# keeps its initial value, while :math:`\Sigma' = 0` exactly when
# :math:`(\Sigma q)_1 = \Sigma_{11}q_1 + \Sigma_{12}q_2 = 0`, a plane through the apex of
# the cone.


# %%
# The runs and the figure
# -----------------------
# :func:`~transformer_pde.paper.paper_figure_plot` solves the moment ODE from the 100 initial
# covariances of the paper's grid at once and stops each run, as the paper does, when
# :math:`\|\Sigma'\|_F < 10^{-4}`.  The paths, drawn in the cone of 2×2 PSD matrices
# :math:`(u, w, v) = (a - b, 2c, a + b)`, descend from the disc :math:`v = 1` and end (crosses)
# at points of the plane :math:`\Sigma_{11}q_1 + \Sigma_{12}q_2 = 0` that depend on
# :math:`\Sigma_0`: the limit set is a plane, not a point or a line.

def figures() -> dict:
    fig, _ = paper_figure_plot("plane", stride=STRIDE, view="cone", v_max=1.0,
                               panel_size=5.5,
                               title="Convergence to a plane (2 heads, the second empty)")
    return {"paper_plane": fig}


# %%
# Save the figure
# ---------------
# ``paper_plane.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures(figures(), OUT)
