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

import matplotlib

matplotlib.use("Agg")

import numpy as np
from matplotlib.figure import Figure

from transformer_pde.paper import paper_rank_study, run_figure_script

KINDS = ("softmax", "l2")
VALUES = ("identity", "psd")
EULER = {"step": 0.01, "tol_high": 1e3, "max_iter": 50_000}


def figures(args) -> dict:
    dims = tuple(args.dims)
    studies = {(k, v, d): paper_rank_study(k, d, v, trials=args.trials, seed=args.seed,
                                           euler=EULER)
               for k in KINDS for v in VALUES for d in dims}
    fig = Figure(figsize=(15.0, 4.8), layout="constrained")
    ax_h, ax_a, ax_x = fig.subplots(1, 3)
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
    fig.suptitle(f"The paper's rank study: {args.trials} trials per case (seed {args.seed})")
    for (k, v, d), st in studies.items():
        exact = np.bincount(st.ranks[st.ranks >= 0], minlength=d + 1).tolist()
        euler = dict(zip(*np.unique(st.euler_outcome, return_counts=True), strict=True))
        print(f"{k:>8s} V={v:<8s} d={d}: exact ranks {exact}"
              f", redraws {int(st.redraws.sum())}, Euler {euler}"
              f", agreement {st.agreement():.2f}")
    return {"paper_ranks": fig}


def options(p) -> None:
    p.add_argument("--trials", type=int, default=20, help="trials per case (default 20)")
    p.add_argument("--dims", type=int, nargs="+", default=[3, 4], help="dimensions (3 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


if __name__ == "__main__":
    run_figure_script(__doc__, figures, options=options)
