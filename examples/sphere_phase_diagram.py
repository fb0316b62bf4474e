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

    python examples/sphere_phase_diagram.py            # about a minute on two cores
    python examples/sphere_phase_diagram.py --quick    # a few seconds; smoke test

Writes figures/sphere_phase_diagram.png (and prints the time each panel took).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import transformer_pde as tp
from transformer_pde.diagnostics.pairs import pair_fraction
from transformer_pde.particles.ensemble import simulate_ensemble
from transformer_pde.reductions import equiangular_time, gram_flow, random_gram
from transformer_pde.paper.scripts import script_argv

#: the repository root when run as a file; in a notebook (no ``__file__``) the working
#: directory, so the figures go to ``./figures``
ROOT = Path(__file__).resolve().parents[1] if "__file__" in globals() else Path.cwd()


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
# The figure
# ----------
def figure(panels, betas, curve, n, eps, seeds, out: Path) -> None:
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
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small run for a smoke test")
    p.add_argument("--n", type=int, default=32, help="number of tokens")
    p.add_argument("--seeds", type=int, default=16, help="initialisations per beta")
    p.add_argument("--betas", type=int, default=24, help="number of beta values in [0.1, 9]")
    p.add_argument("--t-max", type=float, default=30.0)
    p.add_argument("--dt", type=float, default=0.15, help="RK4 step (and save step) of the "
                   "token panels")
    p.add_argument("--save-dt", type=float, default=0.25, help="save step of the Gram panel")
    p.add_argument("--eps", type=float, default=1e-3, help="closeness 1 - <x_i, x_j>")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path,
                   default=ROOT / "figures",
                   help="output folder (or .png file)")
    a = p.parse_args(argv)
    if a.quick:
        a.seeds, a.betas, a.t_max = 4, 6, 10.0
    betas = np.linspace(0.1, 9.0, a.betas)
    if betas[-1] * a.dt >= 2.8:
        p.error("--dt too large for RK4 stability at beta = 9 (need beta * dt < 2.8)")
    panels = []
    for d in (8, 128, 1024):
        rng = np.random.default_rng([a.seed, d])
        t0 = time.perf_counter()
        if d < 1024:
            times, prob = tokens_panel(d, betas, a.n, a.seeds, a.t_max, a.dt, a.eps, rng)
            how = "simulate_ensemble"
        else:
            times, prob = gram_panel(d, betas, a.n, a.seeds, a.t_max, a.save_dt, a.eps, rng)
            how = "gram_flow"
        sec = time.perf_counter() - t0
        panels.append((d, how, times, prob, sec))
        print(f"d = {d:5d} ({how}): {len(betas)} betas x {a.seeds} seeds in {sec:.1f} s")
    fine = np.linspace(betas[0], betas[-1], 200)
    curve = (fine, np.array([equiangular_time(b, a.n, 0.0, 1.0 - a.eps) for b in fine]))
    out = a.out if a.out.suffix == ".png" else a.out / "sphere_phase_diagram.png"
    figure(panels, betas, curve, a.n, a.eps, a.seeds, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(script_argv())
