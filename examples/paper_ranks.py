r"""The paper's rank study, exact solver beside the paper's explicit Euler
======================================================================

Castin, Ablin, Carrillo & Peyré (arXiv:2501.18322), rank histograms of the limit covariance.
Protocol (``transformer_pde.paper.paper_rank_study``): per trial
:math:`Q \in \mathbb R^{\lfloor d/2\rfloor\times d}` standard normal, :math:`K = -Q`,
:math:`V = I` or :math:`V = W^\top W`, :math:`\Sigma_0 = SS^\top`; the paper's scalings; only
runs that converge (:math:`\|\Sigma'\|_F < 10^{-4}`) are kept, :math:`\Sigma_0` is redrawn
otherwise; the rank is the number of eigenvalues of :math:`\Sigma` above 0.1.  The same kept
draws are also run with the paper's projected explicit Euler (h = 0.01, stop at
:math:`\operatorname{tr}\Sigma > 10^3` or after 50,000 steps).

Left: the exact-solver histograms.  Middle: per-trial agreement of the Euler rank with the
exact rank (trials where Euler converged).  Right: the softmax trials the Euler run discards
as "exceeded": the largest :math:`\operatorname{tr}\Sigma/\operatorname{tr}\Sigma_0` of the
exact run up to the same time -- at most 1, since with :math:`V \succeq 0` and
:math:`A \preceq 0` the trace cannot grow: those discards are Euler artefacts.

The number of trials and the dimensions of the published histograms are not restated here;
``--trials`` and ``--dims`` choose them (defaults 20 and 3 4: 88 s of CPU measured,
the Euler runs of up to 50,000 steps take most of it).  ``examples/configs/paper_ranks.toml`` runs the
exact study from the command line (``transformer-pde ranks``).

Run: ``python examples/paper_ranks.py [--trials 20] [--dims 3 4]`` (writes
``figures/paper_ranks.png``).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs 2 trials per case in dimension 2 instead of 20
# in dimensions 3 and 4; the figure goes into
# ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import numpy as np
import matplotlib.pyplot as plt

from transformer_pde.paper import paper_rank_study
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
TRIALS = 2 if FAST else 20           # trials per case
DIMS = (2,) if FAST else (3, 4)      # dimensions
SEED = 0                             # the random stream

# %%
# The protocol
# ------------
# Two attention kinds, softmax and L2, and two choices of value matrix, :math:`V = I` and a
# random positive semidefinite :math:`V = W^\top W`.  With :math:`K = -Q` the softmax
# interaction matrix :math:`A = K^\top Q/\sqrt d = -Q^\top Q/\sqrt d` is negative
# semidefinite of rank :math:`\lfloor d/2\rfloor`, and the runs settle on covariances whose
# rank the study counts.  ``EULER`` holds the paper's integrator settings: projected
# explicit Euler with step 0.01, a run discarded as "exceeded" once
# :math:`\operatorname{tr}\Sigma > 10^3`, and at most 50,000 steps.

KINDS = ("softmax", "l2")
VALUES = ("identity", "psd")
EULER = {"step": 0.01, "tol_high": 1e3, "max_iter": 50_000}


# %%
# The studies
# -----------
# :func:`~transformer_pde.paper.paper_rank_study` runs ``trials`` draws per case.  Each draw
# solves the moment ODE exactly from :math:`\Sigma_0 = SS^\top` and redraws :math:`\Sigma_0`
# until the run converges (:math:`\|\Sigma'\|_F < 10^{-4}`), then counts the eigenvalues of
# the limit above 0.1.  The kept draws are run a second time with the paper's Euler, so the
# two integrators can be compared draw by draw.

def run_studies(trials: int, seed: int, dims: tuple) -> dict:
    return {(k, v, d): paper_rank_study(k, d, v, trials=trials, seed=seed, euler=EULER)
            for k in KINDS for v in VALUES for d in dims}


# %%
# Left: the rank histograms
# -------------------------
# One bar per case and dimension: how many of the exact runs end with each rank.  The ranks
# are those of the limit covariance itself (not of its shape), since every kept run
# converges.

def draw_histograms(ax_h, studies: dict, dims: tuple) -> None:
    cases = [(k, v) for k in KINDS for v in VALUES]
    width = 0.8 / (len(cases) * len(dims))
    r = np.arange(max(dims) + 1)
    j = 0
    for k, v in cases:
        for d in dims:
            ranks = studies[k, v, d].ranks
            ax_h.bar(r + (j - len(cases) * len(dims) / 2 + 0.5) * width,
                     np.bincount(ranks[ranks >= 0], minlength=r.size)[:r.size], width,
                     label=f"{k}, V={'I' if v == 'identity' else 'WᵀW'}, d={d}")
            j += 1
    ax_h.set_xticks(r)
    ax_h.set_xlabel("rank (eigenvalues of Σ above 0.1)")
    ax_h.set_ylabel("trials")
    ax_h.set_title("exact solver, converged runs")
    ax_h.legend(fontsize="x-small", ncol=2)


# %%
# Middle: Euler against the exact solver
# --------------------------------------
# For each case, the percentage of trials in which the paper's Euler run converges to the
# same rank as the exact run, among the trials where Euler converged at all; the number on
# each bar is how many trials Euler kept.  Below 100 %, the two integrators end some of the
# same draws on different ranks.

def draw_agreement(ax_a, studies: dict) -> None:
    labels, agree, kept = [], [], []
    for (k, v, d), st in studies.items():
        labels.append(f"{k}\n{'I' if v == 'identity' else 'WᵀW'}, d={d}")
        agree.append(100 * st.agreement())
        kept.append(int(np.sum(st.euler_ranks >= 0)))
    x = np.arange(len(labels))
    bars = ax_a.bar(x, agree, color="tab:blue")
    for b, n in zip(bars, kept, strict=True):
        ax_a.annotate(f"{n}", (b.get_x() + b.get_width() / 2, b.get_height()),
                      ha="center", va="bottom", fontsize="x-small")
    ax_a.set_xticks(x, labels, fontsize="x-small", rotation=60)
    ax_a.set_ylim(0, 105)
    ax_a.set_ylabel("% of trials with Euler rank = exact rank")
    ax_a.set_title("paper's Euler (h = 0.01) vs exact\n(number: trials Euler kept)")


# %%
# Right: the discarded softmax trials
# -----------------------------------
# For softmax, :math:`\operatorname{tr}\Sigma' = 2\operatorname{tr}(V\Sigma A\Sigma)`, and with
# :math:`V \succeq 0` and :math:`\Sigma A\Sigma \preceq 0` this is never positive: the exact
# trace cannot grow.  So a softmax trial that Euler stops as "exceeded" is an artefact of the
# step.  The panel shows, for each such trial, the largest
# :math:`\operatorname{tr}\Sigma/\operatorname{tr}\Sigma_0` of the exact run up to the same
# time; it stays at or below the dashed line 1.

def draw_exceeded(ax_x, studies: dict) -> None:
    ratios, names = [], []
    for (k, v, d), st in studies.items():
        if k != "softmax":
            continue
        ex = np.flatnonzero(st.euler_outcome == "exceeded")
        tr0 = np.trace(st.cov0[ex], axis1=1, axis2=2)
        ratios.extend(st.euler_max_trace_exact[ex] / tr0)
        names.extend([f"V={'I' if v == 'identity' else 'WᵀW'}, d={d}"] * ex.size)
    if ratios:
        ax_x.plot(np.arange(len(ratios)), ratios, "o", color="tab:red")
        ax_x.set_xticks(np.arange(len(ratios)), names, fontsize="x-small", rotation=60)
    else:
        ax_x.text(0.5, 0.5, "no softmax trial exceeded\nwith these draws", ha="center",
                  transform=ax_x.transAxes)
    ax_x.axhline(1.0, color="k", lw=0.8, ls="--")
    ax_x.set_ylim(0, 1.2)
    ax_x.set_ylabel("max over the exact run of tr Σ / tr Σ₀")
    ax_x.set_title("softmax trials Euler discards as 'exceeded'\n"
                   "(the exact trace never grows: Euler artefacts)")


# %%
# The figure and the table
# ------------------------
# ``figures`` runs the studies, draws the three panels side by side and prints one line per
# case: the exact rank counts, how many :math:`\Sigma_0` were redrawn, the outcomes of the
# Euler runs and the agreement.

def figures() -> dict:
    dims = DIMS
    studies = run_studies(TRIALS, SEED, dims)
    fig = plt.figure(figsize=(15.0, 4.8), layout="constrained")
    ax_h, ax_a, ax_x = fig.subplots(1, 3)
    draw_histograms(ax_h, studies, dims)
    draw_agreement(ax_a, studies)
    draw_exceeded(ax_x, studies)
    fig.suptitle(f"The paper's rank study: {TRIALS} trials per case (seed {SEED})")
    for (k, v, d), st in studies.items():
        exact = np.bincount(st.ranks[st.ranks >= 0], minlength=d + 1).tolist()
        euler = {str(o): int(c) for o, c in
                 zip(*np.unique(st.euler_outcome, return_counts=True), strict=True)}
        print(f"{k:>8s} V={v:<8s} d={d}: exact ranks {exact}"
              f", redraws {int(st.redraws.sum())}, Euler {euler}"
              f", agreement {st.agreement():.2f}")
    return {"paper_ranks": fig}


# %%
# Save the figure
# ---------------
# ``paper_ranks.png`` into ``OUT``; in Jupyter the figure shows below the cell; most of the
# time goes into the Euler runs of up to 50,000 steps.

save_figures(figures(), OUT)
