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

import matplotlib

matplotlib.use("Agg")

from transformer_pde.paper import paper_figure_plot, run_figure_script


def figures(_args=None) -> dict:
    fig, _ = paper_figure_plot("twolines", view="cone", v_max=1.0, panel_size=5.5,
                               title="Convergence to two lines (the paper's parameters; "
                                     "exact solver)")
    return {"paper_twolines": fig}


if __name__ == "__main__":
    run_figure_script(__doc__, figures)
