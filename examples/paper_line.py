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

from transformer_pde.paper import paper_figure, paper_figure_plot, run_figure_script


# %%
# The figure
# ----------
# :func:`~transformer_pde.paper.paper_figure_plot` solves the moment equations from every
# initial covariance of the paper's grid and draws the trajectories in the cone of 2×2
# positive semidefinite matrices; the dashed ray is the rank-one line
# :math:`\{\lambda q^\perp q^{\perp\top}\}` on which the runs stop.

def figures(_args=None) -> dict:
    q = paper_figure("line").Q[0]
    fig, _ = paper_figure_plot("line", view="cone", v_max=1.0,
                               rank_one_line=[-q[1], q[0]],
                               title="Convergence to a line (the paper's parameters; exact solver)")
    return {"paper_line": fig}


# %%
# Run it
# ------
# From the shell, ``python examples/paper_line.py --out DIR`` writes ``DIR/paper_line.png``;
# in a notebook the cell below writes ``figures/paper_line.png`` under the working
# directory and shows the figure.

if __name__ == "__main__":
    run_figure_script(__doc__, figures)
