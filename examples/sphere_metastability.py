"""Metastability on the circle: the energy staircase and the most unstable mode
============================================================================

Tokens on the unit circle S^1 with Q = K = V = I.

(a), (b) Unnormalised attention (kind "exp") at large beta with ``shift=beta``: the kernel
e^{beta(<x, y> - 1)} stays in [e^{-2 beta}, 1] and the flow is the plain one with time
rescaled by e^{beta}.  Eight tight groups of tokens form four pairs of clusters at
increasing angles; each pair merges after a time of order e^{beta(1 - cos phi0)}, the
others being too far to matter.  The interaction energy
E = (1/2 beta) sum_ij w_i w_j e^{beta<x_i, x_j> - beta} rises in a staircase, one step
per merge.  Prediction (dashed): two clusters of total mass M at angle phi follow
dphi/dt = -M e^{-beta(1 - cos phi)} sin phi, that is the pairing law
tan(phi/2) = tan(phi0/2) e^{-2s} in the time s with ds/dt = (M/2) e^{-beta(1 - cos phi)}.

(c), (d) Normalised attention (kind "softmax") at beta = 5 from tokens spread almost
uniformly: the Fourier modes c_k = (1/n) sum_j e^{i k theta_j} grow at the linear rates
k^2 I_k(beta) / (beta I_0(beta)), largest for k* = 3, and three clusters form first.

Run::

    python examples/sphere_metastability.py                           # about 40 s on one core
    TRANSFORMER_PDE_FAST=1 python examples/sphere_metastability.py    # a few seconds

Writes figures/sphere_metastability.png.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs two pairs of groups of 2 tokens to t = 200 and
# 120 tokens in (c, d); the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the
# repository's ``figures/``).

import time

import matplotlib.pyplot as plt
import numpy as np
from scipy.integrate import quad
from scipy.special import ive

import transformer_pde as tp
from transformer_pde.diagnostics.metastability import interaction_energy, merge_events
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
BETA = 40.0                                       # beta of the staircase (a, b)
GAPS = [0.35, 0.5] if FAST else [0.35, 0.5, 0.6, 0.68]   # angles of the pairs (a, b)
PER_GROUP = 2 if FAST else 4                      # tokens per group (a, b)
T_MAX = 200.0 if FAST else 1.2e4                  # depth of (a, b)
DT = 1.0     # RK4 step of (a, b): the fastest rate is a cluster's mass <= 1, so dt <= 2 is stable
TOL = 1e-2                                        # cluster link length
BETA_MODES = 5.0                                  # beta of (c, d)
N_MODES = 120 if FAST else 400                    # tokens of (c, d)
SEED = 0


# %%
# The two reductions: the pairing law and the linear growth rates
def pairing_angle(phi0, s):
    """tan(phi/2) = tan(phi0/2) e^{-2s} (the library's version when it is installed)."""
    try:
        from transformer_pde.reductions.limits import pairing_angle as lib
    except ImportError:
        return 2.0 * np.arctan(np.tan(phi0 / 2.0) * np.exp(-2.0 * np.asarray(s)))
    return lib(phi0, s)


def pair_time(beta, phi0, mass, s):
    """Real time t(s) = int_0^s (2/M) e^{beta(1 - cos phi(s'))} ds' of the pairing law."""
    return quad(lambda u: 2.0 / mass * np.exp(beta * (1.0 - np.cos(pairing_angle(phi0, u)))),
                0.0, s, limit=200)[0]


def mode_rates(beta, ks):
    """Linear growth rates k^2 I_k(beta)/(beta I_0(beta)) of softmax attention on S^1."""
    try:
        from transformer_pde.reductions.modes import mode_growth_rate
    except ImportError:
        return np.array([k * k * ive(k, beta) / (beta * ive(0, beta)) for k in ks])
    return np.array([mode_growth_rate(beta, 2, k, model="sa") for k in ks])


def circle(theta):
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


# %%
# (a), (b): four pairs of clusters at large beta
def staircase(beta, gaps, per_group, t_max, dt, tol, seed):
    rng = np.random.default_rng(seed)
    centres = np.arange(len(gaps)) * 2.0 * np.pi / len(gaps)
    groups = np.concatenate([[c - g / 2, c + g / 2] for c, g in zip(centres, gaps, strict=True)])
    theta = np.repeat(groups, per_group) + 1e-4 * rng.standard_normal(groups.size * per_group)
    att = tp.Attention("exp", np.eye(2), np.eye(2), np.eye(2), beta=beta, shift=beta)
    ts = np.unique(np.r_[0.0, np.geomspace(0.1, t_max, 400)])
    traj = tp.simulate(att, circle(theta), t_max=t_max, dt=dt, solver="rk4",
                       saveat=tp.SaveAt(ts=ts), block=tp.Block(constraint="sphere"))
    energy = interaction_energy(traj, beta, shift=beta)
    merges = merge_events(traj, tol=tol)
    mass = 2.0 * per_group / theta.size
    phi_tol = 2.0 * np.arcsin(tol / 2.0)
    predicted, curves = [], []
    for g in gaps:
        s_end = 0.5 * np.log(np.tan(g / 2) / np.tan(phi_tol / 2))
        s = np.linspace(0.0, s_end, 200)
        t = np.array([pair_time(beta, g, mass, si) for si in s])
        predicted.append(t[-1])
        curves.append((t, pairing_angle(g, s)))
    # the measured angle of each pair: between the two groups' first tokens
    first = np.arange(0, theta.size, per_group)
    X = traj.states
    cosang = np.sum(X[:, first[0::2]] * X[:, first[1::2]], axis=2)
    angles = np.arccos(np.clip(cosang, -1.0, 1.0))
    return traj, energy, merges, np.array(predicted), curves, angles


# %%
# (c), (d): the most unstable mode at beta = 5
def modes(beta, n, t_max, dt, amp, kmax, seed):
    rng = np.random.default_rng(seed)
    base = 2.0 * np.pi * np.arange(n) / n
    theta = base.copy()
    for k in range(1, kmax + 1):   # every mode with the same small density amplitude
        theta += amp / k * np.cos(k * base + rng.uniform(0, 2 * np.pi))
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=beta)
    traj = tp.simulate(att, circle(theta), t_max=t_max, dt=dt, solver="rk4",
                       saveat=tp.SaveAt(every=max(1, round(0.1 / dt))),
                       block=tp.Block(constraint="sphere"))
    ang = np.arctan2(traj.states[..., 1], traj.states[..., 0])
    ks = np.arange(1, kmax + 1)
    coef = np.abs(np.exp(1j * ks[None, :, None] * ang[:, None, :]).mean(axis=2))
    return traj, ang, ks, coef


def figure(a, b, beta_a, beta_b, tol):
    traj, energy, merges, predicted, curves, angles = a
    mtraj, ang, ks, coef = b
    rates = mode_rates(beta_b, ks)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0, 0]
    t = traj.times
    ax.plot(t[1:], energy[1:] * 2 * beta_a, color="k", lw=1.5,
            label=r"$2\beta E_\beta$ (shift $=\beta$)")
    for i, tm in enumerate(merges.merge_times):
        ax.axvline(tm, color="tab:blue", lw=1, label="merge seen" if i == 0 else None)
    for i, tp_ in enumerate(predicted):
        ax.axvline(tp_, color="tab:red", ls="--", lw=1,
                   label="pairing-law prediction" if i == 0 else None)
    ax2 = ax.twinx()
    ax2.step(t[1:], merges.counts[1:], where="post", color="0.6", lw=1)
    ax2.set_ylabel(f"clusters (links ≤ {tol:g})", color="0.4")
    ax.set_xscale("log")
    ax.set_xlabel("time t")
    ax.set_ylabel(r"$2\beta\,E_\beta$")
    ax.set_title(f"(a) USA, β = {beta_a:g}, n = {traj.states.shape[1]}: energy staircase")
    ax.legend(fontsize=8, loc="center left")

    ax = axes[0, 1]
    colors = plt.get_cmap("tab10")
    for p in range(angles.shape[1]):
        ax.plot(t[1:], angles[1:, p], color=colors(p), lw=1.5,
                label=f"pair {p + 1}, φ0 = {angles[0, p]:.2f}")
        ct, cphi = curves[p]
        ax.plot(np.maximum(ct, t[1]), cphi, color="k", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(1e-3, 1.0)
    ax.set_xlabel("time t")
    ax.set_ylabel("angle φ between the two clusters of a pair")
    ax.set_title(r"(b) pair angles; dashed: $\tan\frac{\varphi}{2} = "
                 r"\tan\frac{\varphi_0}{2}\,e^{-2s}$")
    ax.legend(fontsize=8, loc="lower left")

    ax = axes[1, 0]
    mt = mtraj.times
    for j, k in enumerate(ks):
        ax.semilogy(mt, coef[:, j], color=colors(j), lw=1.5, label=f"k = {k}: λ = {rates[j]:.3f}")
        ax.semilogy(mt, coef[0, j] * np.exp(rates[j] * mt), color=colors(j), ls="--", lw=1)
    ax.set_ylim(coef[0].min() / 3, 1.5)
    ax.set_xlabel("time t")
    ax.set_ylabel(r"$|c_k| = |\frac{1}{n}\sum_j e^{ik\theta_j}|$")
    ax.set_title(f"(c) SA, β = {beta_b:g}: Fourier modes; dashed: $c_k(0)e^{{λ_k t}}$")
    ax.legend(fontsize=8, loc="lower right")

    ax = axes[1, 1]
    step = max(1, ang.shape[1] // 120)
    # cut the circle in the middle of the widest final gap, so no cluster straddles it
    final = np.sort(np.mod(ang[-1], 2 * np.pi))
    gaps = np.diff(np.r_[final, final[0] + 2 * np.pi])
    cut = final[np.argmax(gaps)] + gaps.max() / 2
    y = np.mod(ang[:, ::step] - cut, 2 * np.pi)
    y[1:][np.abs(np.diff(y, axis=0)) > np.pi] = np.nan   # no line across the cut
    ax.plot(mt, y, color="tab:purple", lw=0.5)
    kstar = int(ks[np.argmax(rates)])
    ax.set_xlabel("time t")
    ax.set_ylabel("token angle θ (from the widest final gap)")
    ax.set_title(f"(d) SA, β = {beta_b:g}: k* = {kstar} clusters form first")
    fig.suptitle("Metastability of attention on the circle (Q = K = V = I, tokens on S¹)")
    fig.tight_layout()
    return fig



# %%
# The runs
# --------
# The staircase of (a, b) and the modes of (c, d), with the merge times seen against those
# the pairing law predicts.

t0 = time.perf_counter()
res_a = staircase(BETA, GAPS, PER_GROUP, T_MAX, DT, TOL, SEED)
t1 = time.perf_counter()
res_b = modes(BETA_MODES, N_MODES, 16.0, 0.05, 1e-3, 6, SEED)
t2 = time.perf_counter()
merges, predicted = res_a[2], res_a[3]
print(f"(a) {t1 - t0:.1f} s; merges seen at {np.round(merges.merge_times, 1).tolist()}, "
      f"predicted {np.round(np.sort(predicted), 1).tolist()}; splits {merges.splits}")
print(f"(c) {t2 - t1:.1f} s; rates {np.round(mode_rates(BETA_MODES, res_b[2]), 4).tolist()}")

# %%
# The figure
# ----------
# ``sphere_metastability.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures({"sphere_metastability": figure(res_a, res_b, BETA, BETA_MODES, TOL)}, OUT,
             dpi=120)
