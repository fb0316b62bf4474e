r"""The paper's "dependence on the initial data" figure, plus a true 2-head variant
===============================================================================

With the paper's parameters; the 2-head variant is beyond the paper.

Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322).  Parameters
(``transformer_pde.paper.paper_figure("initial")``): the "two lines" :math:`Q, K` and
:math:`V = \begin{pmatrix}1.832 & -0.3769\\ 0.3481 & -0.1163\end{pmatrix}`; initial covariances
``init_grid(30, 30, [-1, 1, -1, 1])`` (648).  Panels: softmax and L2 (paper Euler h = 0.003
and 0.002, stop at tr = 1e3 or :math:`\|\Sigma'\|_F < 10^{-4}`), the paper's "multihead"
panel -- which passes no number of heads and is therefore single-head softmax (h = 0.002) --
and, beyond the paper, the same matrices with 2 heads.  Drawn as
:math:`\Sigma/\operatorname{tr}\Sigma`; red = blow-up (crosses tr = 1e3), blue = converged,
grey = still moving at the paper's last time, orange = L2 runs crossing tr = 1e3 (bounded
L2 runs can cross it transiently; the paper counts them as "exceeded").

Run: ``python examples/paper_initial.py`` (writes ``figures/paper_initial.png``).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) solves every 10th initial covariance of the paper's
# grid instead of all; the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default
# the repository's ``figures/``).

from transformer_pde.paper import EXTRA_RUNS, paper_figure, paper_figure_plot
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
STRIDE = 10 if FAST else 1     # solve and draw every STRIDE-th initial covariance

# %%
# One set of parameters, two outcomes
# -----------------------------------
# With Gaussian tokens :math:`N(0, \Sigma)` and softmax attention the covariance follows
# :math:`\Sigma' = V\Sigma A\Sigma + \Sigma A^\top\Sigma V^\top`, with
# :math:`A = K^\top Q/\sqrt 2`.  The right-hand side is homogeneous of degree two, so the
# shape :math:`\Sigma/\operatorname{tr}\Sigma` follows a flow of its own in the unit disc, and
# whether the trace then grows or decays depends on where the shape goes.  With the paper's
# matrices some initial shapes are carried to a blow-up direction and the others to
# stationary rank-one covariances.  :func:`~transformer_pde.paper.paper_figure` holds the
# paper's three panels; ``EXTRA_RUNS`` adds the same matrices split into two heads.


# %%
# The runs and the figure
# -----------------------
# :func:`~transformer_pde.paper.paper_figure_plot` solves each panel from the 648 initial
# covariances of the paper's grid and stops a run at :math:`\operatorname{tr}\Sigma = 10^3`,
# when :math:`\|\Sigma'\|_F < 10^{-4}`, or at the paper's last time.  Each run is drawn as its
# shape in the disc and coloured by the outcome.  In the softmax panels a band of initial
# shapes blows up (red) and the rest converge (blue); L2, whose field stays bounded as
# :math:`\Sigma` grows, cannot blow up in finite time.  The paper's "multihead" panel passes
# no number of heads and repeats single-head softmax with another step; with two true heads
# (the last panel) the runs are still moving (grey) at :math:`t = 100`.

def figures() -> dict:
    runs = list(paper_figure("initial").runs) + list(EXTRA_RUNS)
    fig, _ = paper_figure_plot("initial", stride=STRIDE, view="slice",
                               color_by="status", runs=runs,
                               title="Dependence on the initial covariance (the paper's "
                                     "parameters; exact solver)")
    return {"paper_initial": fig}


# %%
# Save the figure
# ---------------
# ``paper_initial.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures(figures(), OUT)
