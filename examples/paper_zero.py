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

import matplotlib

matplotlib.use("Agg")

from transformer_pde.paper import paper_figure_plot, run_figure_script


def figures(_args=None) -> dict:
    fig, _ = paper_figure_plot("zero", view="cone", v_max=1.0,
                               title="Convergence to zero (the paper's parameters; exact solver)")
    return {"paper_zero": fig}


if __name__ == "__main__":
    run_figure_script(__doc__, figures)
