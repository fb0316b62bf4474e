r"""The paper's blow-up / divergence figure, all four panels, with the paper's parameters
=====================================================================================

Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322); each run drawn as
:math:`\Sigma/\operatorname{tr}\Sigma` in the unit disc (boundary: rank one).  Parameters
(``transformer_pde.paper.paper_figure("blowup")``):
:math:`Q = \begin{pmatrix}-0.0968 & 0.4222\\ -0.2255 & -0.6379\end{pmatrix}`,
:math:`K = \begin{pmatrix}-0.0163 & 1.044\\ -1.085 & -2.206\end{pmatrix}`, :math:`V = I`;
initial covariances ``init_grid(40, 40, [-1, 1, -1, 1])`` (1184).  Panels: softmax and 2-head
softmax blow up in finite time (the paper stops at tr = 1e3; Euler h = 0.01 and 0.002), L2
and Sinkhorn cannot blow up and diverge (stopped at tr = 1e4; h = 0.001 and 0.01).  Here the
exact solver stops each run on the same thresholds; red = finite-time blow-up, orange =
diverging.  To stay under a minute on 2 cores every ``--stride``-th grid point is drawn
(default 3: 395 runs per panel; ``--stride 1`` draws all 1184).

Run: ``python examples/paper_blowup.py [--stride 3]`` (writes ``figures/paper_blowup.png``).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from transformer_pde.paper import paper_figure_plot, run_figure_script


def figures(args) -> dict:
    fig, _ = paper_figure_plot("blowup", view="slice", color_by="status", stride=args.stride,
                               title="Blow-up and divergence, Sigma / tr Sigma (the paper's "
                                     f"parameters; exact solver; every {args.stride}th grid "
                                     "point)")
    return {"paper_blowup": fig}


def options(p) -> None:
    p.add_argument("--stride", type=int, default=3, help="draw every k-th grid point (3)")


if __name__ == "__main__":
    run_figure_script(__doc__, figures, options=options)
