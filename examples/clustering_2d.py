r"""Clustering of a 2-D token cloud under softmax self-attention
============================================================

Tokens :math:`x_i(0) \sim N(0, I_2)` follow the particle attention flow

.. math:: \dot x_i = V \sum_j \frac{e^{\beta\langle Q x_i, K x_j\rangle}}
          {\sum_l e^{\beta\langle Q x_i, K x_l\rangle}}\, x_j ,

integrated with RK4.  With :math:`V = I` every token is pushed along a convex
combination of the tokens, so the cloud grows like :math:`e^{t}`; in the co-moving
frame :math:`z = e^{-t V} x` the tokens collapse onto a few clusters
(Geshkovski, Letrouit, Polyanskiy, Rigollet 2023).  The figure shows three panels:

1. ``Q = K = V = I``, unmasked: paths of :math:`z_i(t)` and the final clusters, which sit
   at vertices of a convex polygon;
2. the same tokens under *causal* (masked) attention, token ``i`` at position
   ``i / (N - 1)``: a token only attends to earlier ones, so token 0 sees only itself and
   stays put in the co-moving frame, and every later token is drawn towards clusters
   formed by earlier tokens;
3. the number of clusters (single linkage at 2 % of the cloud's radius) along depth.

Run ``python examples/clustering_2d.py``; it writes ``figures/clustering_2d.png`` (about
10 s on 2 cores; ``N`` is the number of tokens).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs 60 tokens to depth 3 instead of 200 to 6; the
# figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's
# ``figures/``).

import time

import numpy as np
import matplotlib.pyplot as plt

import transformer_pde as tp
from transformer_pde import plot
from transformer_pde.diagnostics import clusters
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
N = 60 if FAST else 200         # tokens
T_MAX = 3.0 if FAST else 6.0    # final depth
DT = 0.05                       # RK4 step
SEED = 0
#: single-linkage cut: a fraction of the cloud's radius about its mean
CLUSTER_TOL = 0.02


# %%
# Two runs from the same tokens
# -----------------------------
# The tokens start as an i.i.d. Gaussian cloud.  The unmasked run lets every token attend
# to every other one; the masked run gives token ``i`` the position ``i / (N - 1)`` and lets
# it attend only to tokens at earlier positions (causal attention).  Both are integrated
# with RK4 at a fixed step.

def simulate_runs(n: int = 200, t_max: float = 6.0, dt: float = 0.05,
                  seed: int = 0) -> dict[str, tp.ParticleTrajectory]:
    """The unmasked and the causal run of ``n`` tokens, ``Q = K = V = I``."""
    X0 = np.random.default_rng(seed).normal(size=(n, 2))
    I2 = np.eye(2)
    runs = {"unmasked": tp.simulate(tp.Attention("softmax", I2, I2, I2), X0, t_max=t_max,
                                    dt=dt, solver="rk4")}
    runs["masked"] = tp.simulate(tp.Attention("softmax", I2, I2, I2, masked=True), X0,
                                 positions=np.linspace(0.0, 1.0, n), t_max=t_max,
                                 dt=dt, solver="rk4")
    return runs


# %%
# Clusters in the co-moving frame
# -------------------------------
# :func:`~transformer_pde.plot.rescaled_states` maps the states to :math:`z = e^{-t}x`;
# :func:`~transformer_pde.diagnostics.clusters` cuts the single-linkage tree at 2 % of the
# cloud's radius.  :func:`~transformer_pde.plot.particles` draws the paths into the first
# two panels; the third counts the clusters along depth.

def draw(runs: dict[str, tp.ParticleTrajectory]):
    """The three-panel figure (a pyplot figure, so a notebook shows it)."""
    I2 = np.eye(2)
    n = next(iter(runs.values())).states.shape[1]
    fig = plt.figure(figsize=(15, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (name, traj) in zip(axes[:2], runs.items(), strict=True):
        if traj.status != "ok":
            raise RuntimeError(f"{name} run stopped early: {traj.message}")
        Z = plot.rescaled_states(traj, I2)  # z = e^{-t} x
        final = clusters(Z[-1], tol=CLUSTER_TOL)
        plot.particles(Z, labels=final.labels, ax=ax,
                       title=f"{name} softmax, Q=K=V=I: {final.n_clusters} clusters at t={traj.t_final:g}")
        ax.set_xlabel(r"$(e^{-t}x)_1$")
        ax.set_ylabel(r"$(e^{-t}x)_2$")
        counts = [clusters(z, tol=CLUSTER_TOL).n_clusters for z in Z]
        axes[2].step(traj.times, counts, where="post", label=name)
        print(f"{name:9s}: {final.n_clusters:3d} clusters at t = {traj.t_final:g} "
              f"({traj.info['n_steps']} RK4 steps)")
    masked_Z = plot.rescaled_states(runs["masked"], I2)
    axes[1].scatter(*masked_Z[-1, 0], marker="*", s=160, color="gold", edgecolors="k",
                    zorder=4, label="token 0 (sees only itself)")
    axes[1].legend(loc="best", fontsize="small")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("depth t")
    axes[2].set_ylabel("clusters (single linkage, 2 % of radius)")
    axes[2].set_title(f"N = {n} tokens")
    axes[2].grid(alpha=0.3)
    axes[2].legend()
    return fig


# %%
# Run it
# ------
# The two runs, then the figure (``clustering_2d.png`` into ``OUT``; in Jupyter it shows
# below the cell).

t0 = time.perf_counter()
runs = simulate_runs(N, T_MAX, DT, SEED)
print(f"simulated in {time.perf_counter() - t0:.1f} s")
save_figures({"clustering_2d": draw(runs)}, OUT, dpi=110)
