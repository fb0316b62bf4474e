r"""Convergence or blow-up depending on the initial covariance (2-D softmax Gaussians)
==================================================================================

Beyond the paper: a second example of the paper's finding that, for fixed attention parameters, the Gaussian
dynamics can converge for some initial data and blow up in finite time for others (Castin,
Ablin, Carrillo, Peyré 2025, Section 4, Gaussian initial data).  With softmax attention the
moment ODE :math:`\Sigma' = V\Sigma A\Sigma + \Sigma A^\top\Sigma V^\top` is homogeneous of
degree two, so the shape :math:`\Sigma/\operatorname{tr}\Sigma` follows its own flow in the unit
disc and the trace grows or decays according to where the shape goes: here some shapes are
attracted to rank-one stationary covariances (:math:`V\Sigma A = 0` is impossible for invertible
:math:`V, A`, but :math:`\Sigma' = 0` has rank-one solutions), others to a blow-up direction.

Parameters (found by a small random search for a case with both outcomes, rounded to one
decimal; ``examples/paper_initial.py`` redraws the paper's figure with its own values):
:math:`V = \begin{pmatrix}-1.4 & -1.2\\ -1.3 & -0.6\end{pmatrix}`,
:math:`Q = \begin{pmatrix}1.4 & -1.6\\ 0.9 & 1.3\end{pmatrix}`,
:math:`K = \begin{pmatrix}-0.4 & -0.7\\ 0.5 & 1.2\end{pmatrix}`, with the paper's softmax scaling
:math:`A = K^\top Q/\sqrt d` passed explicitly; 48 initial covariances of trace 1 on a circle
of the trace-normalised disc; runs stop at :math:`\operatorname{tr}\Sigma = 10^3` (the paper's
threshold) or :math:`t = 60`.  Solved with the exact adaptive solvers of
:mod:`transformer_pde.gaussian` (the paper used projected explicit Euler).

Writes ``figures/initial_data_dichotomy.png``: left, the trace-normalised slice; right, the
cone (cut at :math:`\operatorname{tr}\Sigma = 3`); red = finite-time blow-up, blue = converged,
grey = still moving at :math:`t = 60` (converging slowly).

Run: ``python examples/paper_initial_data.py`` (well under a minute on 2 cores).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) starts 12 runs instead of 48; the figure goes into
# ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import numpy as np
import matplotlib.pyplot as plt

from transformer_pde import plot
from transformer_pde.paper import STATUS_COLOURS, paper_attention, slice_covariances, solve_paths
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
N_STARTS = 12 if FAST else 48     # initial covariances on the circle

# %%
# The parameters
# --------------
# Three fixed 2×2 matrices, passed to :func:`~transformer_pde.paper.paper_attention` so that
# the softmax score is :math:`\langle Qx, Ky\rangle/\sqrt 2`, i.e. :math:`A = K^\top Q/\sqrt 2`.
# Because the moment equation is homogeneous of degree two, rescaling :math:`\Sigma_0` only
# rescales time; what decides the outcome is the initial shape
# :math:`\Sigma_0/\operatorname{tr}\Sigma_0`, so all runs start at trace one.

V = np.array([[-1.4, -1.2], [-1.3, -0.6]])
Q = np.array([[1.4, -1.6], [0.9, 1.3]])
K = np.array([[-0.4, -0.7], [0.5, 1.2]])


# %%
# The runs and the figure
# -----------------------
# :func:`~transformer_pde.paper.slice_covariances` puts ``N_STARTS`` initial shapes on a circle of
# radius 0.7 in the trace-normalised disc; :func:`~transformer_pde.paper.solve_paths` solves
# each run to :math:`\operatorname{tr}\Sigma = 10^3`, to convergence or to :math:`t = 60`, and
# classifies it.  The left panel draws the shapes :math:`\Sigma/\operatorname{tr}\Sigma` in
# the disc, the right one the covariances themselves in the cone
# :math:`(u, w, v) = (a - b, 2c, a + b)` up to :math:`\operatorname{tr}\Sigma = 3`, both
# coloured by outcome.  The initial circle splits into two arcs: the shapes of one converge to
# the same rank-one direction (blue), those of the other blow up in finite time towards
# another (red).

def figure():
    att = paper_attention("softmax", Q, K, V)
    covs0 = slice_covariances(N_STARTS, radius=0.7, trace=1.0)
    runs = solve_paths(att, covs0, t_max=60.0, n_eval=400, blowup_threshold=1e3,
                       rtol=1e-9, atol=1e-12, converge_tol=1e-6)
    status = [r.status for r in runs]
    colours = [STATUS_COLOURS[s] for s in status]
    fig = plt.figure(figsize=(11.5, 5.0), layout="constrained")
    ax1 = fig.add_subplot(1, 2, 1)
    plot.cone_slice(runs, color_by=colours, ax=ax1)
    ax2 = fig.add_subplot(1, 2, 2, projection="3d")
    plot.cone(runs, color_by=colours, v_max=3.0, ax=ax2)
    counts = ", ".join(f"{s} {status.count(s)}" for s in STATUS_COLOURS if status.count(s))
    fig.suptitle(f"softmax, same parameters, different initial covariances: {counts}")
    return fig, runs


# %%
# The figure to write
# -------------------
# :func:`~transformer_pde.paper.scripts.save_figures` saves every figure that ``figures``
# returns, under its name; ``figure`` also returns the runs, for a closer look at one of
# them (``runs[i].status``, ``runs[i].covs``).

def figures() -> dict:
    return {"initial_data_dichotomy": figure()[0]}


# %%
# Save the figure
# ---------------
# ``initial_data_dichotomy.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures(figures(), OUT)
