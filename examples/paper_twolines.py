r"""The paper's "convergence to two lines" figure, softmax and L2, with the paper's parameters
==========================================================================================

Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322).  Parameters
(``transformer_pde.paper.paper_figure("twolines")``):
:math:`Q = \begin{pmatrix}0.6764 & 1.521\\ -0.5119 & 1.150\end{pmatrix}`,
:math:`K = \begin{pmatrix}-0.5907 & -0.7688\\ -0.3350 & 0.0930\end{pmatrix}`,
:math:`V = \begin{pmatrix}-0.3489 & 0.9837\\ 0.5809 & 0.0703\end{pmatrix}`; initial
covariances ``init_grid(20, 20, [-1, 1, -1, 1])`` (276 strictly inside the cone).  Depending
on :math:`\Sigma_0` the runs end on one of two rank-one lines.  The paper's script draws
the L2 panel over the softmax one (it saves both under one name); both are drawn here.  The
paper uses projected explicit Euler (h = 0.01, at most 50,000 steps, so t <= 500) and stops
when :math:`\|\Sigma'\|_F < 10^{-7}`; here the exact solver stops on the same rules.

Run: ``python examples/paper_twolines.py`` (writes ``figures/paper_twolines.png``).
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
# Why two lines
# -------------
# With Gaussian tokens :math:`N(0, \Sigma)` the attention field is linear and
# :math:`\Sigma' = M\Sigma + \Sigma M^\top` (softmax: :math:`M = V\Sigma A`,
# :math:`A = K^\top Q/\sqrt 2`).  On a rank-one covariance :math:`\Sigma = \lambda uu^\top` the
# tokens lie on the line :math:`\mathbb R u`, and the cross term of the score,
# :math:`\langle Qx, Ky\rangle \propto u^\top A u`, vanishes when :math:`u^\top A u = 0`: every
# token then sees the same average of the others, zero, and :math:`\Sigma` is stationary.
# The symmetric part of the paper's :math:`A` is indefinite (eigenvalues about -1.17 and
# 0.26), so there are two such directions :math:`u` -- the same for softmax and L2 -- and two
# lines of rank-one limits in the cone.


# %%
# The runs and the figure
# -----------------------
# :func:`~transformer_pde.paper.paper_figure_plot` solves the moment ODE from the 276 initial
# covariances of the paper's grid, for softmax and L2, and stops each run when
# :math:`\|\Sigma'\|_F < 10^{-7}` or at the paper's last time :math:`t = 500`.  In the cone
# :math:`(u, w, v) = (a - b, 2c, a + b)` the paths, coloured by their starting point, go down
# to the cone's surface and end on one of the two lines; which one depends on
# :math:`\Sigma_0`.  Runs that approach the apex slowly are still moving at :math:`t = 500`
# (``ok`` in the panel titles).

def figures() -> dict:
    fig, _ = paper_figure_plot("twolines", stride=STRIDE, view="cone", v_max=1.0,
                               panel_size=5.5,
                               title="Convergence to two lines (the paper's parameters; "
                                     "exact solver)")
    return {"paper_twolines": fig}


# %%
# Save the figure
# ---------------
# ``paper_twolines.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures(figures(), OUT)
