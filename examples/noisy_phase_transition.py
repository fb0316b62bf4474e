"""Noisy attention on the circle: the phase transition of the uniform state
=========================================================================

Tokens on the unit circle with Q = K = V = I, unnormalised attention (kind "exp",
shift 0) and independent noise sigma dW on every token.  In the mean-field limit the
density solves the McKean-Vlasov equation d_t mu + d_theta(mu v) = (sigma^2/2) mu''.  The
uniform state loses stability at sigma_# (K_# = 1/sigma_#^2 = beta/(2 I_1(beta))); the
transition is continuous for beta < beta* = 2.446918 and discontinuous, with hysteresis,
above.

(a) beta = 1.5, (b) beta = 6: the first moment m (the modulus of the integral of e^{i theta} dmu) of the stationary
states against sigma/sigma_#.  Lines: the branch of stationary states (continuation of
the self-consistency mu ~ exp(2 (W * mu)/(beta sigma^2)), stable solid, unstable dashed),
the uniform state m = 0.  Markers: long-time states of the PDE, sweeping the noise down
(from the uniform state) and up (from the clustered one); particle runs from both starts.
(c) Particles against the PDE with noise: W_1 between N noisy tokens and the PDE's density
at a fixed time decays like N^{-1/2}.

Run::

    python examples/noisy_phase_transition.py                        # about 15 minutes
    TRANSFORMER_PDE_FAST=1 python examples/noisy_phase_transition.py  # seconds

Writes figures/noisy_phase_transition.png.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) uses a few noise levels, short relaxations and few
# tokens; the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the
# repository's ``figures/``).

import time

import matplotlib.pyplot as plt
import numpy as np

import transformer_pde as tp
from transformer_pde.meanfield import (distance_to_pde, fit_rate, solve_circle,
                                       stationary_branch)
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures
from transformer_pde.reductions.noisy import critical_noise, transition_beta

FAST = fast_configuration()
OUT = output_folder()
BETAS = (1.5, 4.0) if FAST else (1.5, 6.0)        # below and above beta* = 2.446918
RATIOS = {1.5: np.linspace(0.8, 1.1, 2 if FAST else 13),     # sigma / sigma_# of the sweeps
          4.0: np.linspace(0.95, 1.06, 2),
          6.0: np.linspace(0.9, 1.14, 13)}
RELAX = 0.5 if FAST else 20.0            # relaxation time of each noise level, in 1/lambda_1,
#                                          times up to 4 near sigma_# (the slow rates there)
KICK = 1e-3                              # first-mode kick added before each level
TOL = 1e-6                               # resolution of the PDE (relative L2 of its top modes)
N_TOKENS = 60 if FAST else 500           # particle runs of (a), (b)
PARTICLE_LEVELS = 2 if FAST else 7
N_STUDY = [40, 80, 160] if FAST else [125, 250, 500, 1000, 2000]     # (c)
MEMBERS = 2 if FAST else 8
SEED = 0
STUDY_BETA, STUDY_RATIO = 1.5, 1.1       # (c): the uniform state stable, the mode decaying
GRID = 128                               # angles of the densities handed from level to level
THETA = 2 * np.pi * np.arange(GRID) / GRID


def lambda_1(beta):
    """The first mode's rate without noise, I_1(beta)/beta: the time unit of the runs."""
    return critical_noise(beta, 2, quantity="diffusion")


def first_moment(coefficients):
    """m = 2 pi |hat mu_1| of a density's Fourier coefficients."""
    return 2 * np.pi * abs(coefficients[1])


# %%
# The PDE sweeps: each noise level starts from the last one's long-time state
def relax_time(beta, ratio):
    """RELAX / lambda_1, up to 4 times longer where the uniform state's rate
    lambda_1 (1 - ratio^2) is slow (below lambda_1 / 5)."""
    return RELAX / lambda_1(beta) * float(np.clip(0.2 / max(abs(1 - ratio ** 2), 1e-9), 1, 4))


def pde_sweep(beta, ratios, start):
    sigma_c = critical_noise(beta, 2)
    density, ms = start, []
    for r in ratios:
        density = density * (1 + KICK * np.cos(THETA))
        sol = solve_circle(density, beta, relax_time(beta, r), model="usa", shift=0.0,
                           diffusion=(r * sigma_c) ** 2 / 2, tol=TOL, n_theta=GRID,
                           warn=False)
        density = sol.density[-1]
        ms.append(first_moment(sol.coefficients[-1]) if sol.success else np.nan)
    return np.array(ms), density


def sweeps(beta, ratios, clustered):
    """Down from the uniform state, up from ``clustered`` (samples on THETA)."""
    uniform = np.ones(GRID) / (2 * np.pi)
    down, _ = pde_sweep(beta, ratios[::-1], uniform)
    up, _ = pde_sweep(beta, ratios, clustered)
    return down[::-1], up


# %%
# Particles: N noisy tokens from a near-uniform and from a clustered start
def particles(beta, ratios, n, clustered_density):
    sigma_c = critical_noise(beta, 2)
    att = tp.Attention("exp", np.eye(2), np.eye(2), np.eye(2), beta=beta)
    u = (np.arange(n) + 0.5) / n
    cdf = np.cumsum(clustered_density) / clustered_density.sum()
    starts = [2 * np.pi * u, np.interp(u, cdf, THETA)]
    X0 = np.stack([np.stack([np.cos(a), np.sin(a)], axis=-1) for a in starts])
    out = []
    for r in ratios:
        sigma = r * sigma_c
        dt = 0.04 / sigma ** 2
        steps = int(relax_time(beta, r) / dt)
        ens = tp.simulate_ensemble(att, X0, t_max=steps * dt, dt=dt, solver="euler_maruyama",
                                   block="sphere", noise=tp.Noise(sigma=sigma, seed=SEED),
                                   saveat=tp.SaveAt(every=max(1, steps // 20)))
        z = np.exp(1j * np.arctan2(ens.states[..., 1], ens.states[..., 0])).mean(axis=2)
        out.append(np.abs(z[len(z) // 2:]).mean(axis=0))    # time average, second half
    return np.array(out)                                     # (levels, 2 starts)


# %%
# (c): W_1 between noisy particles and the PDE at one time, against N
def convergence(beta, ratio, ns, members):
    sigma = ratio * critical_noise(beta, 2)
    t_end = 2.0 / lambda_1(beta)
    dt = 0.01 / sigma ** 2
    steps = int(round(t_end / dt))
    t_end = steps * dt
    sol = solve_circle(lambda th: 1 + 0.3 * np.cos(th), beta, [0.0, t_end], model="usa",
                       diffusion=sigma ** 2 / 2, tol=1e-10, n_theta=4096)
    att = tp.Attention("exp", np.eye(2), np.eye(2), np.eye(2), beta=beta)
    w1 = []
    for n in ns:
        u = (np.arange(n) + 0.5) / n
        grid = np.linspace(0, 2 * np.pi, 20001)
        theta = np.interp(u, (grid + 0.3 * np.sin(grid)) / (2 * np.pi), grid)
        X0 = np.broadcast_to(np.stack([np.cos(theta), np.sin(theta)], -1), (members, n, 2))
        ens = tp.simulate_ensemble(att, X0.copy(), t_max=t_end, dt=dt,
                                   solver="euler_maruyama", block="sphere",
                                   noise=tp.Noise(sigma=sigma, seed=SEED + 1),
                                   saveat=tp.SaveAt(ts=[t_end]))
        w1.append([distance_to_pde(ens.member(b), sol)[-1] for b in range(members)])
    return np.array(w1)


# %%
# The figure
def figure(results, study, ns):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, beta, label in zip(axes[:2], BETAS, "ab", strict=True):
        res = results[beta]
        br, ratios = res["branch"], RATIOS[beta]
        x = br.sigma / critical_noise(beta, 2)
        stable = br.stable
        for part, style in ((stable, "-"), (~stable, "--")):
            y = np.where(part, br.order, np.nan)
            if part.sum() < part.size:      # join the pieces where stability changes
                edges = np.nonzero(np.diff(part.astype(int)))[0]
                y[edges] = br.order[edges]
                y[edges + 1] = br.order[edges + 1]
            ax.plot(x, y, "k", ls=style, lw=1.6)
        lo, hi = ratios[0] - 0.02, ratios[-1] + 0.02
        ax.plot([1, hi], [0, 0], "k-", lw=1.6)
        ax.plot([lo, 1], [0, 0], "k--", lw=1.6, label="stationary states (dashed: unstable)")
        ax.plot(ratios, res["down"], "v", color="tab:blue", ms=6, mfc="none",
                label="PDE, noise swept down")
        ax.plot(ratios, res["up"], "^", color="tab:red", ms=6, mfc="none",
                label="PDE, noise swept up")
        pr = res["particle_ratios"]
        ax.plot(pr, res["particles"][:, 0], "o", color="tab:blue", ms=4,
                label=f"N = {N_TOKENS} tokens, uniform start")
        ax.plot(pr, res["particles"][:, 1], "s", color="tab:red", ms=4,
                label=f"N = {N_TOKENS} tokens, clustered start")
        ax.axvline(1.0, color="0.5", lw=0.8)
        if np.isfinite(br.fold):
            ax.axvline(np.sqrt(br.critical / br.fold), color="tab:orange", lw=0.8, ls=":",
                       label="fold of the branch")
        ax.set_xlim(lo, hi)
        ax.set_ylim(-0.03, 1.0)
        ax.set_xlabel(r"noise $\sigma/\sigma_\#$")
        ax.set_ylabel(r"first moment $m = 2\pi|\hat\mu_1|$")
        kind = "continuous" if beta < transition_beta(2) else "discontinuous"
        ax.set_title(f"({label}) β = {beta:g}: {kind} "
                     f"(σ# = {critical_noise(beta, 2):.3g})")
        ax.legend(fontsize=7, loc="upper right" if beta < transition_beta(2) else "center left")
    ax = axes[2]
    mean = study.mean(axis=1)
    slope, se = fit_rate(np.repeat(ns, study.shape[1]), study.ravel())
    ax.loglog(np.repeat(ns, study.shape[1]), study.ravel(), ".", color="0.6",
              label="one run")
    ax.loglog(ns, mean, "o-", color="tab:purple", label=f"mean; fit N^{slope:.2f}±{se:.2f}")
    ax.loglog(ns, mean[0] * (np.asarray(ns) / ns[0]) ** -0.5, "k--", lw=1, label=r"$N^{-1/2}$")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("tokens N")
    ax.set_ylabel(r"$W_1$(tokens, PDE) at $t = 2/\lambda_1$")
    ax.set_title(f"(c) β = {STUDY_BETA:g}, σ = {STUDY_RATIO:g} σ#: particles → PDE")
    ax.legend(fontsize=8)
    fig.suptitle("Noisy unnormalised attention on the circle: the uniform state's phase "
                 "transition (Q = K = V = I)")
    fig.tight_layout()
    return fig


# %%
# The runs
# --------
t0 = time.perf_counter()
results = {}
for beta in BETAS:
    branch = stationary_branch(beta, 2, max_order=0.95)
    # the clustered start: the stable state of the branch nearest the lowest noise level
    ratio = branch.sigma / critical_noise(beta, 2)
    pick = int(np.argmin(np.where(branch.stable, abs(ratio - RATIOS[beta][0]), np.inf)))
    clustered = branch.density(pick, np.cos(THETA)) / (2 * np.pi)
    down, up = sweeps(beta, RATIOS[beta], clustered)
    t1 = time.perf_counter()
    levels = np.linspace(RATIOS[beta][0], RATIOS[beta][-1], PARTICLE_LEVELS)
    parts = particles(beta, levels, N_TOKENS, clustered)
    results[beta] = {"branch": branch, "down": down, "up": up, "particle_ratios": levels,
                     "particles": parts}
    print(f"beta = {beta:g}: sigma_# = {critical_noise(beta, 2):.6g}, branch "
          f"{branch.status}, fold sigma/sigma_# = "
          f"{np.sqrt(branch.critical / branch.fold):.4f}; PDE sweeps {t1 - t0:.1f} s, "
          f"particles {time.perf_counter() - t1:.1f} s")
    t0 = time.perf_counter()
study = convergence(STUDY_BETA, STUDY_RATIO, N_STUDY, MEMBERS)
slope, se = fit_rate(np.repeat(N_STUDY, MEMBERS), study.ravel())
print(f"(c) W1 ~ N^{slope:.3f} (se {se:.3f}); {time.perf_counter() - t0:.1f} s")

# %%
# ``noisy_phase_transition.png`` into ``OUT``; in Jupyter the figure shows below the cell.
save_figures({"noisy_phase_transition": figure(results, study, N_STUDY)}, OUT, dpi=110)
