r"""The paper's "convergence to zero" figure, all four panels, with the paper's parameters
======================================================================================

Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322), 2-D Gaussian covariance dynamics drawn in
the PSD cone :math:`(u, w, v) = (a - b, 2c, a + b)`.  Parameters
(``transformer_pde.paper.paper_figure("zero")``, exact values there):
:math:`Q = \begin{pmatrix}0.4581 & 0.3083\\ 0.2315 & 0.2774\end{pmatrix}`, :math:`K = -Q`,
:math:`V = \begin{pmatrix}2.669 & -0.6915\\ -0.6915 & 2.687\end{pmatrix}`; initial covariances
``init_grid(10, 10, [-0.5, 0.5, -0.5, 0.5])`` (100 of trace one).  Panels: softmax, L2,
2-head softmax, Sinkhorn (:math:`\varepsilon = 1`) with the paper's scalings
(``paper_attention``).  The paper integrates with projected explicit Euler (h = 0.3, 0.3,
0.3, 0.5) and stops a run when :math:`\|\Sigma'\|_F < 10^{-5}` (at t = 1100--1900); here the
exact adaptive solver (``gaussian.solve_batch``, batched dense output) stops each run on the
same criterion (``convergence="absolute"``); :math:`\Sigma \to 0` like :math:`1/t`.

Run: ``python examples/paper_zero.py`` (writes ``figures/paper_zero.png``).
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
# From tokens to a covariance
# ---------------------------
# When the tokens form a centred Gaussian :math:`N(0, \Sigma)`, each of the four attention
# kinds moves them by a linear field :math:`x \mapsto M(\Sigma)x`, so the whole token
# measure stays Gaussian and its evolution is the matrix ODE
# :math:`\Sigma' = M\Sigma + \Sigma M^\top`.  For softmax, :math:`M = V\Sigma A` with
# :math:`A = K^\top Q/\sqrt d`.  Here :math:`K = -Q` makes :math:`A = -Q^\top Q/\sqrt 2`
# negative definite and :math:`V` is symmetric positive definite, so
# :math:`\operatorname{tr}\Sigma' = 2\operatorname{tr}(V\Sigma A\Sigma) \le 0`: the spread of
# the tokens can only shrink.  :func:`~transformer_pde.paper.paper_figure` holds the paper's
# matrices, its grid of 100 trace-one initial covariances and its stopping rule per panel.


# %%
# The runs and the figure
# -----------------------
# :func:`~transformer_pde.paper.paper_figure_plot` solves the moment ODE of each panel from
# every initial covariance of the grid at once (adaptive DOP853 with dense output), stopping
# a run when :math:`\|\Sigma'\|_F < 10^{-5}`, and draws the paths in the cone of 2×2 PSD
# matrices: the disc at height :math:`v = 1` holds the starting points, the apex is
# :math:`\Sigma = 0`.  In all four panels every path runs down to the apex; the quadratic
# right-hand side makes the approach algebraic, :math:`\Sigma(t) \sim 1/t`, which is why the
# paper's stopping times are in the thousands.

def figures() -> dict:
    fig, _ = paper_figure_plot("zero", stride=STRIDE, view="cone", v_max=1.0,
                               title="Convergence to zero (the paper's parameters; exact solver)")
    return {"paper_zero": fig}


# %%
# Save the figure
# ---------------
# ``paper_zero.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures(figures(), OUT)
