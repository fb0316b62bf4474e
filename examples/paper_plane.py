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

import matplotlib

matplotlib.use("Agg")

from transformer_pde.paper import paper_figure_plot, run_figure_script

def figures(_args=None) -> dict:
    fig, _ = paper_figure_plot("plane", view="cone", v_max=1.0, panel_size=5.5,
                               title="Convergence to a plane (2 heads, the second empty)")
    return {"paper_plane": fig}


if __name__ == "__main__":
    run_figure_script(__doc__, figures)
