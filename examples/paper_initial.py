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

import matplotlib

matplotlib.use("Agg")

from transformer_pde.paper import (EXTRA_RUNS, paper_figure, paper_figure_plot,
                                   run_figure_script)


def figures(_args=None) -> dict:
    runs = list(paper_figure("initial").runs) + list(EXTRA_RUNS)
    fig, _ = paper_figure_plot("initial", view="slice", color_by="status", runs=runs,
                               title="Dependence on the initial covariance (the paper's "
                                     "parameters; exact solver)")
    return {"paper_initial": fig}


if __name__ == "__main__":
    run_figure_script(__doc__, figures)
