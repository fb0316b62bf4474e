"""Common noise: two tokens driven antipodal
==========================================

Tokens on the sphere S^{d-1} under softmax attention (Q = K = V = I, inverse temperature
beta) plus a *common* matrix Brownian motion W_t that every token sees:
dx_i = P_{x_i}(A_i dt + sigma dW_t x_i), the engine's ``Noise(common=A)`` with the d^2
matrices A_ab = sigma E_ab.  The entries of W_t have variance sigma^2 t with
sigma^2 = S2 / d (an initialisation of variance 1/d per entry, S2 = 2).

(a) Two tokens, rho0 = 0: the probability that they end antipodal (rho -> -1) against
beta for several d.  Lines: the quadrature of the scale function
(``reductions.antipodal_probability``); points: the fraction of B independent pairs of
``simulate_ensemble`` with rho_T < 0, with 95 % Wilson intervals.  Dotted: the critical
beta_c = log(2 d / S2 - 1)/2 below which the antipodal end is never reached.  Near beta_c
the pairs approach -1 slowly and may still leave it after T: the points lie above the line
there (the horizon bias; the run prints its bound and the unbiased mean of P(rho_T)).

(b) The same law when the noise multiplies the attention output (random value matrices,
no deterministic drift): the transition beta_c = arccosh(d - 2)/2 grows with d.

(c) n tokens from uniform random positions: the fraction of runs that end in two
antipodal clusters (the rest end in one) against beta, for n = 2, 4, 8; the line is the
n = 2 oracle averaged over the law of the cosine of two uniform points.

Run::

    python examples/common_noise_antipodal.py                           # a few minutes
    TRANSFORMER_PDE_FAST=1 python examples/common_noise_antipodal.py    # seconds

Writes figures/common_noise_antipodal.png.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs few pairs on a coarse beta grid; the figure goes
# into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import math
import time

import matplotlib.pyplot as plt
import numpy as np
from scipy.special import roots_jacobi

import transformer_pde as tp
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures
from transformer_pde.reductions import antipodal_probability, common_noise_matrices, critical_beta

FAST = fast_configuration()
OUT = output_folder()
S2 = 2.0                                             # sigma^2 d
DIMS = [2, 3, 6]                                     # (a)
BETAS_MC = [0.25, 1.0, 2.5] if FAST else [0.1, 0.5, 0.9, 1.3, 1.8, 2.5, 3.5]
PAIRS = 40 if FAST else 1500                         # pairs per point of (a)
NS = [2, 4] if FAST else [2, 4, 8]                   # (c)
D_N = 3                                              # dimension of (c)
RUNS_N = 30 if FAST else 600                         # runs per point of (c)
T_MAX = 4.0 if FAST else 24.0
DT = 0.04                                            # Stratonovich Heun step
DECIDED = 0.99                                       # |rho_T| above this: decided
SEED = 0


def wilson(k, n, z=1.96):
    """The Wilson score interval of a binomial proportion k / n (containing k / n)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return min(centre - half, p), max(centre + half, p)


def run(beta, d, X0, seed):
    """Final tokens (B, n, d) of the ensemble X0 under attention + common noise."""
    att = tp.Attention("softmax", np.eye(d), np.eye(d), np.eye(d), beta=beta)
    noise = tp.Noise(common=common_noise_matrices(d, math.sqrt(S2 / d)), seed=seed)
    traj = tp.simulate_ensemble(att, X0, t_max=T_MAX, dt=DT, solver="heun_stratonovich",
                                block=tp.Block(constraint=tp.Sphere()), noise=noise,
                                backend="numpy")
    return traj.states[-1]


# %%
# (a) Two tokens against the oracle
def pairs_panel(seed):
    rows = []
    for d in DIMS:
        X0 = np.zeros((PAIRS, 2, d))
        X0[:, 0, 0] = X0[:, 1, 1] = 1.0                  # rho0 = 0
        for beta in BETAS_MC:
            X = run(beta, d, X0, seed)
            rho = np.einsum("bi,bi->b", X[:, 0], X[:, 1])
            k = int(np.sum(rho < 0.0))
            # P(rho_T) is the exact probability of the end given rho_T (a martingale): its
            # mean has no horizon bias, and the mean of g = |1{rho_T < 0} - P(rho_T)| bounds
            # the horizon bias of the sign at T
            later = antipodal_probability(beta, d, np.clip(rho, -1.0, 1.0), math.sqrt(S2 / d))
            rows.append((d, beta, k / PAIRS, *wilson(k, PAIRS),
                         float(np.mean(np.abs(rho) < DECIDED)), float(np.mean(later)),
                         float(np.mean(np.abs((rho < 0.0) - later)))))
            seed += 1
    return rows


# %%
# (c) n tokens: one cluster or two antipodal clusters
def uniform_sphere(rng, shape, d):
    X = rng.standard_normal((*shape, d))
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def clusters_panel(seed):
    rng = np.random.default_rng(seed)
    rows = []
    for n in NS:
        for beta in BETAS_MC:
            X = run(beta, D_N, uniform_sphere(rng, (RUNS_N, n), D_N), seed)
            rho = np.einsum("bi,bji->bj", X[:, 0], X[:, 1:])     # cosines to token 0
            decided = np.all(np.abs(rho) > DECIDED, axis=1)
            two = np.any(rho < 0.0, axis=1)
            k = int(np.sum(two))
            rows.append((n, beta, k / RUNS_N, *wilson(k, RUNS_N), 1 - float(decided.mean())))
            seed += 1
    return rows


def uniform_pair_law(beta, d, sigma, nodes=40):
    """E P(rho0) over the cosine rho0 of two uniform points: density ~ (1 - rho^2)^{(d-3)/2}."""
    x, w = roots_jacobi(nodes, (d - 3) / 2, (d - 3) / 2)
    return float(np.sum(w * antipodal_probability(beta, d, x, sigma)) / np.sum(w))


# %%
# The figure
def figure(pairs, clusters):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    beta = np.linspace(0.0, 4.0, 161)
    colors = plt.get_cmap("tab10")
    ax = axes[0]
    for j, d in enumerate(DIMS):
        sigma = math.sqrt(S2 / d)
        ax.plot(beta, [antipodal_probability(b, d, 0.0, sigma) for b in beta],
                color=colors(j), label=f"d = {d} (σ² = {S2 / d:.2g})")
        ax.axvline(critical_beta(d, sigma), color=colors(j), ls=":", lw=1)
        r = np.array([row for row in pairs if row[0] == d])
        ax.errorbar(r[:, 1], r[:, 2], yerr=[r[:, 2] - r[:, 3], r[:, 4] - r[:, 2]], fmt="o",
                    color=colors(j), ms=4, capsize=2)
    ax.axhline(0.5, color="0.6", lw=0.8, ls="--", label="no attention: arccos(ρ₀)/π")
    ax.set_xlabel("β")
    ax.set_ylabel("P(ρ → −1 | ρ₀ = 0)")
    ax.set_title(f"(a) noise on the token; points: {PAIRS} pairs, sign of ρ at t = {T_MAX:g}, "
                 "95 % CI", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[1]
    for j, d in enumerate([2, 3, 4, 8, 32]):
        p = [antipodal_probability(b, d, 0.0, placement="value", drift=0.0) for b in beta]
        ax.plot(beta, p, color=colors(j), label=f"d = {d}")
        if d >= 4:
            ax.axvline(critical_beta(d, placement="value", drift=0.0), color=colors(j),
                       ls=":", lw=1)
    ax.set_xlabel("β")
    ax.set_ylabel("P(ρ → −1 | ρ₀ = 0)")
    ax.set_title("(b) noise on the value (no drift): β_c = arccosh(d−2)/2")
    ax.legend(fontsize=8)

    ax = axes[2]
    sigma = math.sqrt(S2 / D_N)
    ax.plot(beta, [uniform_pair_law(b, D_N, sigma) for b in beta], color="k", lw=1,
            label="n = 2: oracle, uniform ρ₀")
    for j, n in enumerate(NS):
        r = np.array([row for row in clusters if row[0] == n])
        ax.errorbar(r[:, 1] + 0.03 * j, r[:, 2], yerr=[r[:, 2] - r[:, 3], r[:, 4] - r[:, 2]],
                    fmt="o-", color=colors(j), ms=4, capsize=2, lw=0.8, label=f"n = {n}")
    ax.set_xlabel("β")
    ax.set_ylabel("fraction of runs ending in two antipodal clusters")
    ax.set_title(f"(c) n uniform tokens, d = {D_N}: {RUNS_N} runs per point")
    ax.legend(fontsize=8)
    fig.suptitle("Two tokens under a common matrix noise (softmax, Q = K = V = I, on the sphere)")
    fig.tight_layout()
    return fig


# %%
# The runs
# --------
t0 = time.perf_counter()
pairs = pairs_panel(SEED)
t1 = time.perf_counter()
clusters = clusters_panel(SEED + 1000)
t2 = time.perf_counter()
for d, beta, p, lo, hi, undecided, mart, bound in pairs:
    exact = antipodal_probability(beta, d, 0.0, math.sqrt(S2 / d))
    print(f"(a) d={d} beta={beta:4.2f}: {p:.3f} [{lo:.3f}, {hi:.3f}] oracle {exact:.3f}; "
          f"mean P(rho_T) {mart:.3f}, horizon bias <= {bound:.3f} (undecided {undecided:.3f})")
for n, beta, p, lo, hi, undecided in clusters:
    print(f"(c) n={n} beta={beta:4.2f}: two clusters {p:.3f} [{lo:.3f}, {hi:.3f}] "
          f"(undecided {undecided:.3f})")
print(f"(a) {t1 - t0:.1f} s, (c) {t2 - t1:.1f} s")

# %%
# ``common_noise_antipodal.png`` into ``OUT``
save_figures({"common_noise_antipodal": figure(pairs, clusters)}, OUT, dpi=110)
