r"""Blow-up and divergence of 2-D Gaussians, seen in the trace-normalised slice of the PSD cone
===========================================================================================

Beyond the paper: blow-up / divergence slices in the style of the paper's figure (Castin, Ablin, Carrillo,
Peyré 2025, Section 4, Gaussian initial data): for one set of parameters :math:`(Q, K, V)`,
the covariance :math:`\Sigma(t)` of a Gaussian token measure evolves under softmax,
multi-head (two heads), L2 and Sinkhorn attention, and each trajectory is drawn as
:math:`\Sigma/\operatorname{tr}\Sigma` in the unit disc (boundary = rank-one matrices, centre =
:math:`I/2`).  Softmax (single and multi-head) blows up in finite time; L2 and Sinkhorn cannot
(:func:`transformer_pde.gaussian.blowup_law`) and diverge as :math:`t\to\infty`.  Two parameter sets give the
two figures:

* ``figures/blowup_slice_symmetric.png``: :math:`V = I`, :math:`Q = \begin{pmatrix}1 & 0.5\\
  -0.3 & 1\end{pmatrix}`, :math:`K = I`;
* ``figures/blowup_slice_rotation.png``: :math:`V = \begin{pmatrix}1 & -1\\ 1 & 1\end{pmatrix}`
  (expansion and rotation), same :math:`Q, K`.

Scalings (passed explicitly, as the paper's figures used them, see ``docs/conventions.md``): softmax
:math:`A = K^\top Q/\sqrt d` (multi-head: :math:`1/\sqrt k` per head, :math:`k = 1` here), L2
kernel :math:`\exp(-|Qx/\sqrt d - Ky|^2)` (``l2_beta = 1``, :math:`Q/\sqrt d`), Sinkhorn unscaled
with :math:`\varepsilon = 1`; runs stop at :math:`\operatorname{tr}\Sigma = 10^3` like the
paper's.  These are not the paper's matrices (``examples/paper_blowup.py`` redraws its figure); the moment ODE is
solved by the exact adaptive solvers of :mod:`transformer_pde.gaussian`
(:func:`transformer_pde.paper.solve_paths`).

Run: ``python examples/paper_blowup_slices.py`` (a few seconds on 2 cores).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) starts 4 runs per panel instead of 16; the figures
# go into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import numpy as np
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from transformer_pde import plot
from transformer_pde.paper import paper_attention, slice_covariances, solve_paths
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
N_STARTS = 4 if FAST else 16     # initial covariances per panel

# %%
# The parameters
# --------------
# One pair :math:`Q, K` and two value matrices: :math:`V = I`, and :math:`V` with eigenvalues
# :math:`1 \pm i`, an expansion combined with a rotation.  Each is run with four attention
# kinds: softmax with one and with two heads, L2 and Sinkhorn.  For Gaussian tokens the
# covariance follows :math:`\Sigma' = M\Sigma + \Sigma M^\top`; softmax's
# :math:`M = V\Sigma A` grows with :math:`\Sigma` (finite-time blow-up is possible), while
# L2's and Sinkhorn's stays bounded (at most exponential growth).

Q = np.array([[1.0, 0.5], [-0.3, 1.0]])
K = np.eye(2)
PARAMETERS = {
    "symmetric": np.eye(2),
    "rotation": np.array([[1.0, -1.0], [1.0, 1.0]]),
}
VARIANTS = (("softmax", 1), ("softmax", 2), ("l2", 1), ("sinkhorn", 1))


# %%
# The runs of one figure
# ----------------------
# :func:`~transformer_pde.paper.slice_covariances` places ``N_STARTS`` initial covariances of trace one
# on a circle of radius 0.6 in the trace-normalised disc.  For each kind
# :func:`~transformer_pde.paper.solve_paths` first finds where every run stops
# (:math:`\operatorname{tr}\Sigma = 10^3`, convergence or :math:`t = 50`), then reports it at
# 400 evenly spaced times up to that end, so the curves stay smooth right up to a blow-up.
# :func:`~transformer_pde.plot.cone_slice` draws the shapes :math:`\Sigma/\operatorname{tr}\Sigma`
# in the disc; each panel's title counts the outcomes.

def figure(V: np.ndarray, name: str) -> Figure:
    covs0 = slice_covariances(N_STARTS, radius=0.6, trace=1.0)
    fig = plt.figure(figsize=(16, 4.4), layout="constrained")
    axes = fig.subplots(1, 4)
    for ax, (kind, heads) in zip(axes, VARIANTS, strict=True):
        att = paper_attention(kind, Q, K, V, heads=heads)
        # each run reported at 400 evenly spaced times up to its own end (blow-up included)
        runs = solve_paths(att, covs0, t_max=50.0, n_eval=400, blowup_threshold=1e3,
                           rtol=1e-8, atol=1e-10)
        plot.cone_slice(runs, ax=ax)
        label = f"{kind}" + (f", {heads} heads" if heads > 1 else "")
        statuses = [r.status for r in runs]
        counts = ", ".join(f"{s} {statuses.count(s)}" for s in sorted(set(statuses)))
        ax.set_title(f"{label}\n{counts}", fontsize="medium")
    fig.suptitle(f"Sigma / tr Sigma, V = {V.tolist()}, Q = {Q.tolist()}, K = I ({name})")
    return fig


# %%
# The two figures
# ---------------
# One figure per value matrix.  With :math:`V = I` every shape heads for the rank-one
# circle: single-head softmax and Sinkhorn straight out, two-head softmax towards the
# diagonal matrices :math:`e_1e_1^\top` and :math:`e_2e_2^\top` (:math:`u/v = \pm 1`), L2
# along curves.  With the rotation the shapes spiral: softmax still reaches the circle at the
# blow-up time :math:`T^*`, while the Sinkhorn shapes wind in towards the centre :math:`I/2`.

def figures() -> dict:
    return {f"blowup_slice_{name}": figure(V, name) for name, V in PARAMETERS.items()}


# %%
# Save the figures
# ----------------
# ``blowup_slice_symmetric.png`` and ``blowup_slice_rotation.png`` into ``OUT``; in Jupyter
# the figures show below the cell.

save_figures(figures(), OUT)
