r"""Rank histograms of the limit covariance, d = 3, 4, 5, softmax and L2, V = I and V random
========================================================================================

Beyond the paper: rank histograms over *square* random :math:`Q, K` -- not the paper's
experiment, which ``examples/paper_ranks.py`` and ``examples/configs/paper_ranks.toml`` run
(Castin, Ablin, Carrillo, Peyré 2025, Section 4): over many random draws of the parameters and of the initial
covariance, the numerical rank of the limit of :math:`\Sigma(t)` -- of
:math:`\Sigma/\operatorname{tr}\Sigma` for runs that blow up or diverge.  Each draw
(:func:`transformer_pde.paper.rank_sweep`): :math:`Q, K` with i.i.d. :math:`N(0,1)` entries,
:math:`V = I` or i.i.d. :math:`N(0,1)`, :math:`\Sigma_0 = FF^\top/d` with :math:`F` standard
normal, mean 0.

Scalings passed explicitly, as in the paper's figures (``docs/conventions.md``): softmax
:math:`A = K^\top Q/\sqrt d`; L2 kernel :math:`\exp(-|Qx/\sqrt d - Ky|^2)` (``l2_beta = 1``).
Runs stop at :math:`\operatorname{tr}\Sigma = 10^3` (the paper's threshold) or :math:`t = 30`;
the moment ODE is solved by the exact adaptive :func:`transformer_pde.gaussian.solve_batch`.  Rank:
eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma` above ``1e-3`` times the largest.  For a finite-time
blow-up the solver extrapolates the shape to :math:`T^*`, so the rank-one limit is clean; for a
run that diverges exponentially the shape is measured where the solver decides divergence,
at :math:`\operatorname{tr}\Sigma = 10^{10}` (paths are cut at :math:`10^3`, but every run that
reaches it is continued there); it still has small eigenvalues whose ratio to the largest
depends on the growth rates, so the histogram depends on that size and on the rank tolerance
(both printed in the figure).

Writes ``figures/rank_histograms.png`` and prints the counts.

Run: ``python examples/paper_rank_histograms.py [--draws 100]`` (under a minute on 2 cores
with the default 100 draws per case).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) makes 5 draws per case instead of 100; the figure goes into
# ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

from transformer_pde.gaussian.system import CLASSIFY_SIZE
from transformer_pde.paper import rank_figure, rank_sweep
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
DRAWS = 5 if FAST else 100     # random draws per case
SEED = 0                        # the random stream

# %%
# The cases
# ---------
# Twelve cases: softmax and L2 attention, :math:`V = I` or a random :math:`V`, in dimensions
# 3, 4 and 5.  The rank is numerical: the number of eigenvalues of
# :math:`\Sigma/\operatorname{tr}\Sigma` above ``RTOL`` times the largest, which does not
# depend on the scale, so converged, blown-up and diverging runs are counted alike.  Runs
# stop at the paper's threshold :math:`\operatorname{tr}\Sigma = 10^3`.

KINDS = ("softmax", "l2")
VALUES = ("identity", "random")
DIMS = (3, 4, 5)
RTOL = 1e-3
THRESHOLD = 1e3


# %%
# The sweeps and the figure
# -------------------------
# For each case :func:`~transformer_pde.paper.rank_sweep` makes ``draws`` independent draws
# of :math:`Q, K, \Sigma_0` (and :math:`V` when random), solves all of them together with
# the batched exact solver (up to :math:`t = 30`) and records each run's status and the
# numerical rank of its limit shape.  :func:`~transformer_pde.paper.rank_figure` draws one
# panel per kind and value matrix, with a group of bars per dimension (fractions of the
# draws).  Most draws end on a rank-one shape.  A finite-time blow-up gives a clean rank-one limit (the shape is
# extrapolated to :math:`T^*`); a run that diverges exponentially keeps small eigenvalues,
# so its count depends on the size where the shape is measured and on ``RTOL``.

def figure(draws: int = 100, seed: int = 0):
    sweeps = [rank_sweep(kind, d, value=value, draws=draws, seed=seed, t_max=30.0,
                         blowup_threshold=THRESHOLD, rtol=RTOL)
              for kind in KINDS for value in VALUES for d in DIMS]
    fig = rank_figure(sweeps, f"numerical rank (rtol {RTOL:g}) of the limit covariance, "
                              f"{draws} draws per case\npaths stop at tr = {THRESHOLD:g}, "
                              f"limit shapes measured at tr = {CLASSIFY_SIZE:g}",
                      figsize=(10.0, 6.8))
    return fig, sweeps


# %%
# The counts
# ----------
# Besides the figure the script prints, per case, the rank counts (ranks 0 to :math:`d`) and
# the statuses of the runs (converged, blow-up, diverging, still moving).

def figures() -> dict:
    fig, sweeps = figure(DRAWS, SEED)
    for sw in sweeps:
        s = sw.summary()
        print(f"{s['kind']:>8s} V={s['value']:<8s} d={s['d']}: ranks 0..{s['d']} -> "
              f"{s['rank_counts']}   statuses {s['status_counts']}")
    return {"rank_histograms": fig}



# %%
# Save the figure
# ---------------
# ``rank_histograms.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures(figures(), OUT)
