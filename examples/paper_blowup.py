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
diverging.  To stay under a minute on 2 cores every ``STRIDE``-th grid point is drawn
(3: 395 runs per panel; ``STRIDE = 1`` draws all 1184).

Run: ``python examples/paper_blowup.py`` (writes ``figures/paper_blowup.png``).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) draws every 20th point of the paper's grid of initial
# covariances (60 runs per panel); the figure goes into ``OUT``
# (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

from transformer_pde.paper import paper_figure_plot
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
STRIDE = 20 if FAST else 3     # solve and draw every STRIDE-th grid point (1: all 1184)


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``4th``, ..., ``11th``, ..., ``21st``."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# %%
# Blow-up against divergence
# --------------------------
# With Gaussian tokens :math:`N(0, \Sigma)` the attention field is linear,
# :math:`x \mapsto Mx`, and :math:`\Sigma' = M\Sigma + \Sigma M^\top`.  For softmax
# :math:`M = V\Sigma A` grows with :math:`\Sigma`: the equation is quadratic (a matrix
# Riccati equation) and can reach infinity in finite time, with
# :math:`\operatorname{tr}\Sigma \sim 1/(T^* - t)`.  For L2 and Sinkhorn with a full-rank
# :math:`K`, :math:`M` stays bounded as :math:`\Sigma` grows, so :math:`\Sigma` can grow at
# most exponentially and never blows up in finite time
# (:func:`transformer_pde.gaussian.blowup_law`).  Since the size runs off, each run is drawn
# by its shape :math:`\Sigma/\operatorname{tr}\Sigma`, a point of the unit disc whose
# boundary circle holds the rank-one shapes.


# %%
# The runs and the figure
# -----------------------
# :func:`~transformer_pde.paper.paper_figure_plot` solves the four panels' moment ODEs from
# every ``STRIDE``-th point of the paper's grid of 1184 initial covariances and stops each
# run at the paper's threshold (:math:`\operatorname{tr}\Sigma = 10^3` for the softmax
# panels, :math:`10^4` for L2 and Sinkhorn).  The colour is the solver's verdict: red for a
# finite-time blow-up (its time :math:`T^*` extrapolated from the local power law),
# orange for a run that diverges.  In every panel the shapes end at or near the rank-one
# circle: the growing covariance concentrates on one direction.

def figures() -> dict:
    points = "every grid point" if STRIDE == 1 else f"every {ordinal(STRIDE)} grid point"
    fig, _ = paper_figure_plot("blowup", view="slice", color_by="status", stride=STRIDE,
                               title="Blow-up and divergence, Sigma / tr Sigma (the paper's "
                                     f"parameters; exact solver; {points})")
    return {"paper_blowup": fig}


# %%
# Save the figure
# ---------------
# ``paper_blowup.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures(figures(), OUT)
