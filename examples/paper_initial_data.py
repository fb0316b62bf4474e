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

import matplotlib

matplotlib.use("Agg")

import numpy as np
from matplotlib.figure import Figure

from transformer_pde import plot
from transformer_pde.paper import (STATUS_COLOURS, paper_attention,
                                 run_figure_script, slice_covariances, solve_paths)

V = np.array([[-1.4, -1.2], [-1.3, -0.6]])
Q = np.array([[1.4, -1.6], [0.9, 1.3]])
K = np.array([[-0.4, -0.7], [0.5, 1.2]])


def figure():
    att = paper_attention("softmax", Q, K, V)
    covs0 = slice_covariances(48, radius=0.7, trace=1.0)
    runs = solve_paths(att, covs0, t_max=60.0, n_eval=400, blowup_threshold=1e3,
                       rtol=1e-9, atol=1e-12, converge_tol=1e-6)
    status = [r.status for r in runs]
    colours = [STATUS_COLOURS[s] for s in status]
    fig = Figure(figsize=(11.5, 5.0), layout="constrained")
    ax1 = fig.add_subplot(1, 2, 1)
    plot.cone_slice(runs, color_by=colours, ax=ax1)
    ax2 = fig.add_subplot(1, 2, 2, projection="3d")
    plot.cone(runs, color_by=colours, v_max=3.0, ax=ax2)
    counts = ", ".join(f"{s} {status.count(s)}" for s in STATUS_COLOURS if status.count(s))
    fig.suptitle(f"softmax, same parameters, different initial covariances: {counts}")
    return fig, runs


def figures(_args=None) -> dict:
    return {"initial_data_dichotomy": figure()[0]}


if __name__ == "__main__":
    run_figure_script(__doc__, figures)
