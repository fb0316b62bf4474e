"""Phase diagram of clustering on the sphere: probability of one cluster over (beta, t)
====================================================================================

The experiment of Geshkovski, Letrouit, Polyanskiy and Rigollet ("A mathematical
perspective on Transformers", arXiv 2312.10794): n = 32 tokens drawn uniformly on the
sphere S^{d-1} follow post-LN self-attention with Q = K = V = I,

    dx_i/dt = P_{x_i} ( sum_j e^{beta <x_i, x_j>} x_j / sum_j e^{beta <x_i, x_j>} ),

and each panel shows, over the plane of the temperature beta and the time t, the
probability over random initialisations that the tokens have clustered: that every pair
has <x_i, x_j> >= 1 - eps (eps = 1e-3, ``pair_fraction(X, eps) == 1``).

In high dimension random tokens are nearly orthogonal, <x_i, x_j> = O(1/sqrt(d)), so as
d -> infinity the flow starts from the equiangular configuration rho_0 = 0 and stays
equiangular; the white curve is the time at which that configuration reaches
rho = 1 - eps (``equiangular_time(beta, n=32, rho0=0, rho=1-eps)``).

* d = 8 and d = 128 run the tokens themselves: one ``simulate_ensemble`` call per beta
  integrates all initialisations at once (RK4 on the sphere, saved at every step).
* d = 1024 integrates the Gram matrices G_ij = <x_i, x_j> (``gram_flow``, DOP853), whose
  cost does not depend on d: only the initial Gram matrices (``random_gram``) do.

Run::

    python examples/sphere_phase_diagram.py                           # about a minute on two cores
    TRANSFORMER_PDE_FAST=1 python examples/sphere_phase_diagram.py    # a few seconds

Writes figures/sphere_phase_diagram.png (and prints the time each panel took).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs 3 temperatures x 4 initialisations to t = 5;
# the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's
# ``figures/``).  RK4 needs :math:`\beta\,\mathrm{d}t < 2.8` at :math:`\beta = 9`.

import time

import matplotlib.pyplot as plt
import numpy as np

import transformer_pde as tp
from transformer_pde.diagnostics.pairs import pair_fraction
from transformer_pde.particles.ensemble import simulate_ensemble
from transformer_pde.reductions import equiangular_time, gram_flow, random_gram
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
N = 32                                  # tokens
SEEDS = 4 if FAST else 16               # initialisations per beta
BETAS = np.linspace(0.1, 9.0, 3 if FAST else 24)   # temperatures
T_MAX = 5.0 if FAST else 30.0           # depth
DT = 0.15                               # RK4 step (and save step) of the token panels
SAVE_DT = 0.25                          # save step of the Gram panel
EPS = 1e-3                              # closeness 1 - <x_i, x_j>
SEED = 0
if BETAS[-1] * DT >= 2.8:
    raise ValueError("DT too large for RK4 stability at the largest beta (need beta * DT < 2.8)")


# %%
# Probability of one cluster from the tokens (d = 8, 128)
# -------------------------------------------------------
# All seeds of one beta form one ensemble; ``SaveAt(fn=...)`` keeps only whether each
# system has clustered, so the states are never stored.
def tokens_panel(d, betas, n, seeds, t_max, dt, eps, rng):
    X0 = rng.normal(size=(seeds, n, d))
    X0 /= np.linalg.norm(X0, axis=-1, keepdims=True)      # uniform on S^{d-1}
    eye = np.eye(d)
    prob = []
    for beta in betas:
        att = tp.Attention("softmax", eye, eye, eye, beta=float(beta))
        ens = simulate_ensemble(
            att, X0, t_max=t_max, dt=dt, solver="rk4", block="sphere",
            saveat=tp.SaveAt(fn=lambda t, X, w: pair_fraction(X, eps) == 1.0))
        prob.append(ens.values.mean(axis=1))
    return ens.times, np.array(prob)


# %%
# Probability of one cluster from the Gram flow (d = 1024)
# --------------------------------------------------------
# The Gram matrices of the initial tokens carry all that the flow needs; their evolution
# is integrated for all seeds at once.  DOP853 lands on every save time, so the save grid
# (``save_dt``) sets most of the cost.
def gram_panel(d, betas, n, seeds, t_max, save_dt, eps, rng):
    G0 = random_gram(n, d, rng, batch=seeds)
    times = np.linspace(0.0, t_max, int(round(t_max / save_dt)) + 1)
    prob = []
    for beta in betas:
        sol = gram_flow(G0, float(beta), times, model="sa")
        prob.append((pair_fraction(sol.grams, eps, gram=True) == 1.0).mean(axis=1))
    return times, np.array(prob)


# %%
# Drawing the panels
# ------------------
def figure(panels, betas, curve, n, eps, seeds):
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2),
                             sharey=True, constrained_layout=True)
    edges = np.concatenate([[betas[0] - 0.5 * (betas[1] - betas[0])],
                            0.5 * (betas[1:] + betas[:-1]),
                            [betas[-1] + 0.5 * (betas[-1] - betas[-2])]])
    for ax, (d, how, times, prob, sec) in zip(axes, panels, strict=True):
        tedges = np.concatenate([[times[0]], 0.5 * (times[1:] + times[:-1]), [times[-1]]])
        mesh = ax.pcolormesh(edges, tedges, prob.T, cmap="magma", vmin=0.0, vmax=1.0,
                             shading="flat", rasterized=True)
        ax.plot(curve[0], curve[1], color="white", lw=2.0,
                label=r"equiangular $t_\varepsilon(\beta)$, $\rho_0 = 0$")
        ax.set_ylim(times[0], times[-1])
        ax.set_xlim(edges[0], edges[-1])
        ax.set_xlabel(r"temperature $\beta$")
        ax.set_title(f"d = {d}  ({how}, {sec:.0f} s)", fontsize=10)
    axes[0].set_ylabel("time (depth) t")
    axes[0].legend(loc="lower right", fontsize=8, facecolor="0.15", edgecolor="0.6",
                   labelcolor="white", framealpha=0.9)
    fig.colorbar(mesh, ax=axes, shrink=0.9,
                 label=r"P(all $\langle x_i, x_j\rangle \geq 1-\varepsilon$)")
    fig.suptitle(f"Post-LN self-attention on the sphere, n = {n} tokens, ε = {eps:g}, "
                 f"{seeds} random initialisations per β", fontsize=11)
    return fig



# %%
# The three panels
# ----------------
# d = 8 and d = 128 with :func:`~transformer_pde.particles.ensemble.simulate_ensemble`,
# d = 1024 with the Gram flow; each prints the time it took.

panels = []
for d in (8, 128, 1024):
    rng = np.random.default_rng([SEED, d])
    t0 = time.perf_counter()
    if d < 1024:
        times, prob = tokens_panel(d, BETAS, N, SEEDS, T_MAX, DT, EPS, rng)
        how = "simulate_ensemble"
    else:
        times, prob = gram_panel(d, BETAS, N, SEEDS, T_MAX, SAVE_DT, EPS, rng)
        how = "gram_flow"
    sec = time.perf_counter() - t0
    panels.append((d, how, times, prob, sec))
    print(f"d = {d:5d} ({how}): {len(BETAS)} betas x {SEEDS} seeds in {sec:.1f} s")
fine = np.linspace(BETAS[0], BETAS[-1], 200)
curve = (fine, np.array([equiangular_time(b, N, 0.0, 1.0 - EPS) for b in fine]))

# %%
# The figure
# ----------
# ``sphere_phase_diagram.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures({"sphere_phase_diagram": figure(panels, BETAS, curve, N, EPS, SEEDS)}, OUT,
             dpi=130)
