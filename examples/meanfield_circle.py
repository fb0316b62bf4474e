"""The mean-field PDE on the circle: clusters, spectrum, and particles converging to it
====================================================================================

Tokens on the circle S^1 under normalised self-attention (Q = K = V = I, post-LN) have, as
their number grows, a density mu(t, theta) solving the continuity equation::

    d_t mu + d_theta(mu v) = 0,    v = (1/beta) d_theta log(K * mu),   K = exp(beta cos),

which :func:`~transformer_pde.meanfield.circle.solve_circle` integrates pseudo-spectrally
(Fourier modes doubled automatically as the density sharpens).  From a small perturbation
of the uniform density at beta = 5 the fastest-growing Fourier mode, k* = 3
(the largest of k^2 I_k(beta) / (beta I_0(beta))), takes over and three clusters form.

Panels: (a) the density in the (t, theta) plane; (b) profiles of the PDE at a few times
over histograms of N quantile-placed particles run by :func:`~transformer_pde.simulate`
(some of their paths are drawn over (a));
(c) the moduli of the Fourier coefficients mu_k at those times (with the number of modes in use);
(d) the Wasserstein distance W1 between N particles and the PDE against N, for i.i.d.
and for quantile-placed tokens, with fitted slopes
(:func:`~transformer_pde.meanfield.study.convergence_study`).

Run::

    python examples/meanfield_circle.py                           # under a minute on 2 cores
    TRANSFORMER_PDE_FAST=1 python examples/meanfield_circle.py    # a few seconds

Writes figures/meanfield_circle.png (and prints the fitted slopes).
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs to t = 3 with 300 tokens and a smaller
# convergence study; the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the
# repository's ``figures/``).

import time

import matplotlib.pyplot as plt
import numpy as np

import transformer_pde as tp
from transformer_pde.meanfield.circle import solve_circle
from transformer_pde.meanfield.distance import circle_quantile
from transformer_pde.meanfield.spectral import circle_growth_rate
from transformer_pde.meanfield.study import convergence_study
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
BETA = 5.0
EPS = 0.05                                # perturbation of the uniform density
T_MAX = 3.0 if FAST else 6.0              # depth of panels (a)-(c)
TOKENS = 300 if FAST else 1200            # particles of panels (a), (b)
SEEDS = 2 if FAST else 6                  # draws per N in panel (d)
NS = (32, 64, 128) if FAST else (64, 128, 256, 512, 1024)   # the N of panel (d)
T_CONV = 1.0                              # the time of panel (d)
SEED = 0


# %%
# The initial density: uniform plus a small perturbation of modes 1..8, random phases.
def initial_density(eps: float, seed: int):
    phases = np.random.default_rng(seed).uniform(0, 2 * np.pi, 8)

    def density0(theta):
        return 1.0 + eps * sum(np.cos(k * theta + phases[k - 1]) for k in range(1, 9))

    return density0


# %%
# The PDE, and N particles placed at the quantiles of the initial density.
def pde_and_particles(density0, t_max: float, n_tokens: int, dt: float):
    times = np.linspace(0.0, t_max, 121)
    sol = solve_circle(density0, BETA, times)
    m = (np.arange(n_tokens) + 0.5) / n_tokens
    ang = circle_quantile(sol.theta, sol.density[0], m)
    eye = np.eye(2)
    att = tp.Attention("softmax", eye, eye, eye, beta=BETA)
    traj = tp.simulate(att, np.c_[np.cos(ang), np.sin(ang)], t_max=t_max, dt=dt,
                       solver="rk4", block=tp.Block(constraint="sphere"),
                       saveat=tp.SaveAt(ts=times[::4]))
    return sol, traj


# %%
# W1 between particles and the PDE at time t, against N.
def convergence(density0, t: float, Ns, seeds: int, dt: float):
    out = {}
    for sampling in ("random", "quantile"):
        out[sampling] = convergence_study(density0, BETA, t, Ns=Ns, seeds=seeds,
                                          sampling=sampling, dt=dt)
    return out


def _snapshots(times):
    """Four of the saved times: 0, half, three quarters and all of the run."""
    t_max = times[-1]
    return [times[int(np.argmin(np.abs(times - f * t_max)))] for f in (0, 0.5, 0.75, 1.0)]


def figure(sol, traj, studies, t_conv: float):
    fig = plt.figure(figsize=(15, 4.3))
    ax = fig.add_subplot(1, 4, 1)
    im = ax.pcolormesh(sol.times, sol.theta, sol.density.T, shading="auto", cmap="magma",
                       vmin=0, vmax=np.quantile(sol.density, 0.995))
    angles = np.mod(np.arctan2(traj.states[..., 1], traj.states[..., 0]), 2 * np.pi)
    for path in angles[:, ::traj.states.shape[1] // 24].T:   # 24 tokens, unwrapped
        path = np.where(np.abs(np.diff(path, prepend=path[0])) > np.pi, np.nan, path)
        ax.plot(traj.times, path, color="c", lw=0.5, alpha=0.8)
    snaps = _snapshots(traj.times)
    for t in snaps[1:]:
        ax.axvline(t, color="w", lw=0.6, ls="--")
    fig.colorbar(im, ax=ax, label="μ(t, θ)")
    ax.set_xlabel("time (depth) t")
    ax.set_ylabel("θ")
    ax.set_title(f"(a) PDE density, β = {BETA:g}; 24 tokens (cyan)", fontsize=10)

    ax = fig.add_subplot(1, 4, 2)
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(snaps)))
    bins = np.linspace(0, 2 * np.pi, 91)
    for t, c in zip(snaps, colors, strict=True):
        i = int(np.argmin(np.abs(sol.times - t)))
        j = int(np.argmin(np.abs(traj.times - t)))
        ax.hist(angles[j], bins=bins, density=True, color=c, alpha=0.3)
        ax.plot(sol.theta, sol.density[i], color=c, lw=1.2, label=f"t = {t:g}")
    ax.set_xlabel("θ")
    ax.set_ylabel("density")
    ax.set_title(f"(b) PDE (lines), {traj.states.shape[1]} tokens (bars)", fontsize=10)
    ax.legend(fontsize=7)

    ax = fig.add_subplot(1, 4, 3)
    k = np.arange(sol.coefficients.shape[1])
    for t, c in zip(snaps, colors, strict=True):
        i = int(np.argmin(np.abs(sol.times - t)))
        n = sol.modes[i]
        ax.semilogy(k[1:n], np.abs(sol.coefficients[i, 1:n]), color=c,
                    label=f"t = {t:g} ({n} modes)")
    ax.axvline(3, color="0.5", lw=0.6, ls=":")
    ax.set_ylim(1e-18, 1)
    ax.set_xscale("log")
    ax.set_xlabel("mode k")
    ax.set_ylabel("|μ̂_k|")
    ax.set_title("(c) spectrum (k* = 3 dotted)")
    ax.legend(fontsize=7)

    ax = fig.add_subplot(1, 4, 4)
    for (sampling, st), marker in zip(studies.items(), ("o", "s"), strict=True):
        N = np.broadcast_to(st.Ns[:, None], st.w1.shape)
        ax.loglog(N.ravel(), st.w1.ravel(), marker, ms=3, alpha=0.5)
        med = np.exp(np.nanmean(np.log(st.w1), axis=1))
        ax.loglog(st.Ns, med, "-", color=ax.lines[-1].get_color(),
                  label=f"{sampling}: slope {st.slope:.2f} ± {st.slope_se:.2f}")
    ax.set_xlabel("tokens N")
    ax.set_ylabel(f"W1(particles, PDE) at t = {t_conv:g}")
    ax.set_title("(d) particles → PDE")
    ax.legend(fontsize=8)
    fig.suptitle("Mean-field equation of self-attention on the circle: pseudo-spectral PDE "
                 "against particles", fontsize=11)
    fig.tight_layout()
    return fig



# %%
# The growth rates of the modes, the runs and the convergence study
# -----------------------------------------------------------------

rates = [circle_growth_rate(BETA, k) for k in range(1, 9)]
print("growth rates k = 1..8:", np.round(rates, 4), "-> k* =", int(np.argmax(rates)) + 1)
density0 = initial_density(EPS, SEED)
t0 = time.perf_counter()
sol, traj = pde_and_particles(density0, T_MAX, TOKENS, dt=0.025)
print(f"PDE and particles: {time.perf_counter() - t0:.1f} s; modes up to "
      f"{sol.modes.max()}, status {sol.status}")
t0 = time.perf_counter()
studies = convergence(density0, T_CONV, NS, SEEDS, dt=0.05)
for name, st in studies.items():
    print(f"W1 ~ N^p, {name:8s}: p = {st.slope:.3f} ± {st.slope_se:.3f}")
print(f"convergence studies: {time.perf_counter() - t0:.1f} s")

# %%
# The figure
# ----------
# ``meanfield_circle.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures({"meanfield_circle": figure(sol, traj, studies, T_CONV)}, OUT, dpi=130)
