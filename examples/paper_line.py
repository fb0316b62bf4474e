r"""The paper's "convergence to a line" figure (softmax and L2) with the paper's parameters
=======================================================================================

Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322).  Parameters
(``transformer_pde.paper.paper_figure("line")``): one-row
:math:`Q = (0.4063, 0.9137)`, :math:`K = -Q`, :math:`V = I`, so
:math:`A = -Q^\top Q/\sqrt 2` has rank one and :math:`\Sigma` stops on the rank-one ray
:math:`\{\lambda q^\perp q^{\perp\top}\}` (dashed) at a point that depends on
:math:`\Sigma_0`; initial covariances ``init_grid(10, 10, [-0.5, 0.5, -0.5, 0.5])``.  The
paper uses projected explicit Euler (h = 0.5) and stops when
:math:`\|\Sigma'\|_F < 10^{-4}` (t = 58--101); here the exact solver stops each run on the same criterion.

Run: ``python examples/paper_line.py`` (writes ``figures/paper_line.png``).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) solves every 10th initial covariance of the paper's
# grid instead of all; the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default
# the repository's ``figures/``).

from transformer_pde.paper import paper_figure, paper_figure_plot
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
STRIDE = 10 if FAST else 1     # solve and draw every STRIDE-th initial covariance


# %%
# The figure
# ----------
# :func:`~transformer_pde.paper.paper_figure_plot` solves the moment equations from every
# initial covariance of the paper's grid and draws the trajectories in the cone of 2×2
# positive semidefinite matrices; the dashed ray is the rank-one line
# :math:`\{\lambda q^\perp q^{\perp\top}\}` on which the runs stop.

def figures() -> dict:
    q = paper_figure("line").Q[0]
    fig, _ = paper_figure_plot("line", stride=STRIDE, view="cone", v_max=1.0,
                               rank_one_line=[-q[1], q[0]],
                               title="Convergence to a line (the paper's parameters; exact solver)")
    return {"paper_line": fig}


# %%
# Save the figure
# ---------------
# ``paper_line.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures(figures(), OUT)
