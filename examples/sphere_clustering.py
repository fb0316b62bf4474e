"""Clustering of tokens on the sphere S^2 under normalised self-attention
======================================================================

The normalised dynamics of Geshkovski, Letrouit, Polyanskiy and Rigollet ("A mathematical
perspective on Transformers"): tokens x_i on the unit sphere S^{d-1}, Q = K = V = I::

    dx_i/dt = P_{x_i}^perp ( sum_j e^{beta <x_i, x_j>} x_j / sum_j e^{beta <x_i, x_j>} ),

with P_x^perp = I - x x^T the projection on the tangent space (the LayerNorm constraint).
All tokens eventually collapse to one point; for large temperature beta the flow first
freezes into several well-separated clusters that persist for a long time (metastability),
and their number grows with beta.  This script counts clusters against beta and time.

Clusters: single-linkage at an absolute chord distance ``DELTA`` (0.05): on the sphere the
natural scale is fixed (the cloud cannot shrink to a point while clusters are apart).

Run::

    python examples/sphere_clustering.py                           # about a minute on one core
    TRANSFORMER_PDE_FAST=1 python examples/sphere_clustering.py    # a few seconds

Writes figures/sphere_clustering.png (and prints the table of cluster counts).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs three temperatures and 48 tokens to t = 20; the
# figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's
# ``figures/``).  RK4 needs :math:`\beta\,\mathrm{d}t < 2.8` at the largest :math:`\beta`.

import time

import matplotlib.pyplot as plt
import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

import transformer_pde as tp
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
BETAS = [1, 9, 25] if FAST else [1, 2, 4, 9, 16, 25, 36]   # temperatures
N = 48 if FAST else 128                 # tokens
T_MAX = 20.0 if FAST else 200.0         # depth
DT = 0.05                               # RK4 step (max(BETAS) * DT < 2.8)
DELTA = 0.05                            # cluster link length (chord distance)
SEED = 0
if max(BETAS) * DT >= 2.8:
    raise ValueError("DT too large for RK4 stability at the largest beta "
                     "(need max(BETAS) * DT < 2.8)")

# %%
# Counting clusters
# -----------------
# A cluster is a connected group of tokens: single-linkage clustering joins two tokens whose
# chord distance is below ``delta`` and takes connected components.  On the sphere the scale
# is fixed (tokens cannot all shrink towards a point while clusters stay apart), so an
# absolute ``delta`` serves every :math:`\beta` and every time.


def count_clusters(X: np.ndarray, delta: float) -> int:
    """Number of single-linkage clusters with links shorter than ``delta``."""
    if X.shape[0] < 2:
        return X.shape[0]
    return int(fcluster(linkage(X, "single"), delta, criterion="distance").max())


# %%
# The runs
# --------
# The same :math:`n` tokens, uniform on :math:`S^2`, are run once per temperature
# :math:`\beta` with :func:`~transformer_pde.simulate`: softmax attention with
# :math:`Q = K = V = I` in the post-LN block (``constraint="sphere"``), which projects the
# attention output on the tangent plane, integrated with fixed-step RK4 and saved every
# ``save_dt``.  For each run the cluster count is taken at every saved time, and the largest
# :math:`\big|\|x_i\| - 1\big|` measures how well the integrator stays on the sphere.

def run(betas, n, t_max, dt, save_dt, delta, seed):
    rng = np.random.default_rng(seed)
    X0 = rng.normal(size=(n, 3))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)   # uniform on S^2
    eye = np.eye(3)
    results = {}
    for beta in betas:
        att = tp.Attention("softmax", eye, eye, eye, beta=float(beta))
        t0 = time.perf_counter()
        tr = tp.simulate(att, X0, t_max=t_max, dt=dt, solver="rk4",
                         block=tp.Block(constraint="sphere"),
                         saveat=tp.SaveAt(every=max(1, round(save_dt / dt))))
        counts = np.array([count_clusters(X, delta) for X in tr.states])
        drift = float(np.abs(np.linalg.norm(tr.states, axis=2) - 1).max())
        results[beta] = (tr, counts, time.perf_counter() - t0, drift)
    return X0, results


# %%
# The figure
# ----------
# Panel (a) draws the cluster count against time for each :math:`\beta` (log axes): the count
# drops quickly, then stays on plateaus, longer and higher for larger :math:`\beta`.  Panel
# (b) reads the counts at three times against :math:`\beta`.  Panels (c) and (d) show the
# tokens at the final time for the smallest and the largest :math:`\beta` over their initial
# positions (grey): one cluster against many.

def figure(X0, results, delta: float):
    betas = list(results)
    cmap = plt.get_cmap("viridis")
    colors = {b: cmap(i / max(1, len(betas) - 1)) for i, b in enumerate(betas)}
    fig = plt.figure(figsize=(14, 4.2))
    ax = fig.add_subplot(1, 4, 1)
    for b in betas:
        tr, counts, _, _ = results[b]
        ax.step(tr.times[1:], counts[1:], where="post", color=colors[b], label=f"β = {b:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time (depth) t")
    ax.set_ylabel(f"clusters (single linkage, δ = {delta:g})")
    ax.set_title("(a) clusters against time")
    ax.legend(fontsize=7)

    ax = fig.add_subplot(1, 4, 2)
    tr0 = results[betas[0]][0]
    t_max = tr0.times[-1]
    probes = [t for t in (t_max / 40, t_max / 8, t_max) if t > 0]
    for t in probes:
        k = [int(results[b][1][np.searchsorted(results[b][0].times, t - 1e-9)]) for b in betas]
        ax.plot(betas, k, "o-", label=f"t = {t:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("temperature β")
    ax.set_ylabel("clusters")
    ax.set_title("(b) clusters against β")
    ax.legend(fontsize=7)

    for slot, b in ((3, betas[0]), (4, betas[-1])):
        ax = fig.add_subplot(1, 4, slot, projection="3d")
        X = results[b][0].final
        ax.scatter(*X0.T, s=3, color="0.8")
        ax.scatter(*X.T, s=20, color=colors[b])
        ax.set_box_aspect((1, 1, 1))
        for lim in (ax.set_xlim, ax.set_ylim, ax.set_zlim):
            lim(-1, 1)
        ax.set_title(f"({'c' if slot == 3 else 'd'}) β = {b:g}, t = {t_max:g}: "
                     f"{results[b][1][-1]} cluster(s)", fontsize=9)
    fig.suptitle("Normalised self-attention on S² (Q = K = V = I): metastable clusters",
                 fontsize=11)
    fig.tight_layout()
    return fig


# %%
# The runs and the table
# ----------------------
# The cluster counts at :math:`t = 1, 5, 20, 50, 200`, the seconds each run took and the
# largest drift of the norms off the sphere.

X0, results = run(BETAS, N, T_MAX, DT, save_dt=0.2, delta=DELTA, seed=SEED)
times = [1, 5, 20, 50, 200]
print(f"N = {N} tokens on S^2, RK4 dt = {DT}, clusters at link length {DELTA}")
print("beta | " + " ".join(f"t={t:<5g}" for t in times) + " | seconds | max ||x|-1|")
for b, (tr, counts, sec, drift) in results.items():
    row = []
    for t in times:
        row.append(f"{counts[np.searchsorted(tr.times, t - 1e-9)]:<7d}"
                   if t <= tr.times[-1] + 1e-9 else "-      ")
    print(f"{b:4g} | " + " ".join(row) + f" | {sec:7.2f} | {drift:.1e}")

# %%
# The figure
# ----------
# ``sphere_clustering.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures({"sphere_clustering": figure(X0, results, DELTA)}, OUT, dpi=130)
