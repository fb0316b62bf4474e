"""Noisy tokens on the circle: clusters form at small noise and blur away at large noise
=====================================================================================

Tokens on the unit circle S^1 with softmax attention (Q = K = V = I, beta = 1) and
individual noise sigma dW projected on the circle (the Stratonovich SDE, generator
(sigma^2/2) d^2/dtheta^2), integrated by ``simulate_ensemble`` with the Stratonovich Heun
scheme: every member is an independent system with its own Brownian path.

(a) The order parameter, the modulus of c_1 = (1/n) sum_j e^{i theta_j}, along depth, averaged over the
members, for several noise levels.  The uniform state's first Fourier mode grows at the
rate lambda_1 - sigma^2/2, with lambda_1 = I_1(beta) / (beta I_0(beta)) the noiseless rate
(``reductions.modes.mode_growth_rate``): the tokens gather into one blurred cluster when
sigma < sigma_c = sqrt(2 lambda_1) and stay spread (the modulus of c_1 of order n^{-1/2})
above it.

(b) The final angles of all members, each turned so that its mean direction is at 0: one
sharp cluster without noise, a blurred one below sigma_c, a flat histogram above.  (At
this small beta the most unstable mode of the noiseless flow is the first one, so the
tokens form a single cluster.)

Run::

    python examples/noisy_clustering.py                           # about 30 s on one core
    TRANSFORMER_PDE_FAST=1 python examples/noisy_clustering.py    # a few seconds

Writes figures/noisy_clustering.png.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs fewer members, tokens and steps; the figure goes
# into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import time

import matplotlib.pyplot as plt
import numpy as np

import transformer_pde as tp
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures
from transformer_pde.reductions.modes import mode_growth_rate

FAST = fast_configuration()
OUT = output_folder()
BETA = 1.0
SIGMAS = [0.0, 0.5, 0.8, 1.4] if FAST else [0.0, 0.4, 0.6, 0.8, 1.1, 1.4]
N = 24 if FAST else 64                 # tokens per member
B = 2 if FAST else 12                  # members (independent systems)
T_MAX = 4.0 if FAST else 30.0
DT = 0.1 if FAST else 0.05
SEED = 0

# sigma_c of softmax attention.  ``reductions.critical_noise`` is the threshold of the
# unnormalised kind "exp" (1.063 at beta = 1); at the uniform state softmax divides that
# field by Z = I_0(beta), so this sigma_c is critical_noise(BETA, 2, shift=log I_0(BETA)).
LAMBDA_1 = float(mode_growth_rate(BETA, 2, 1))
SIGMA_C = np.sqrt(2.0 * LAMBDA_1)


# %%
# The runs
def order_parameter(t, X, w):
    """|c_1| of every member: X is (B, n, 2), the first Fourier mode is the mean of x."""
    return np.linalg.norm(X.mean(axis=1), axis=-1)


def run(sigma, X0):
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2), beta=BETA)
    noise = tp.Noise(sigma=sigma, seed=SEED) if sigma > 0 else tp.Noise()
    return tp.simulate_ensemble(att, X0, t_max=T_MAX, dt=DT, solver="heun_stratonovich",
                                noise=noise, block="sphere", backend="numpy",
                                saveat=tp.SaveAt(every=max(1, round(0.5 / DT)),
                                                 fn=order_parameter))


rng = np.random.default_rng(SEED)
theta0 = rng.uniform(-np.pi, np.pi, size=(B, N))
X0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=-1)
t0 = time.perf_counter()
runs = {s: run(s, X0) for s in SIGMAS}
print(f"{len(SIGMAS)} noise levels x {B} members x {N} tokens to t = {T_MAX:g}: "
      f"{time.perf_counter() - t0:.1f} s; sigma_c = {SIGMA_C:.3f}")
for s, ens in runs.items():
    print(f"sigma = {s:.2f}: final mean |c_1| = {ens.values[-1].mean():.3f}")


# %%
# The figure
def aligned_angles(last):
    """The angles of every member's tokens relative to the member's mean direction."""
    m = last.mean(axis=1)
    phase = np.arctan2(m[:, 1], m[:, 0])
    ang = np.arctan2(last[..., 1], last[..., 0]) - phase[:, None]
    return (ang + np.pi) % (2 * np.pi) - np.pi


def figure():
    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(SIGMAS)))
    for c, (s, ens) in zip(colors, runs.items(), strict=True):
        ax_a.plot(ens.times, ens.values.mean(axis=1), color=c,
                  label=rf"$\sigma$ = {s:g}" + (" (> $\\sigma_c$)" if s > SIGMA_C else ""))
    ax_a.axhline(1 / np.sqrt(N), color="k", ls=":", lw=1, label=r"$n^{-1/2}$")
    ax_a.set(xlabel="t (depth)", ylabel=r"mean $|c_1|$ over members", ylim=(0, 1.02),
             title=rf"(a) order parameter; $\sigma_c = \sqrt{{2\lambda_1}}$ = {SIGMA_C:.3f}")
    ax_a.legend(fontsize=8, loc="center right")
    bins = np.linspace(-np.pi, np.pi, 49)
    for s in (SIGMAS[0], SIGMAS[1], SIGMAS[3], SIGMAS[-1]):
        c = colors[SIGMAS.index(s)]
        ax_b.hist(aligned_angles(runs[s].last).ravel(), bins=bins, density=True, color=c,
                  histtype="step", lw=2, label=rf"$\sigma$ = {s:g}")
    ax_b.axhline(1 / (2 * np.pi), color="k", ls=":", lw=1, label="uniform")
    ax_b.set(xlabel="angle to the member's mean direction", ylabel="density",
             title=f"(b) final angles, t = {T_MAX:g}, {B} members x {N} tokens", yscale="log",
             ylim=(1e-2, None))
    ax_b.legend(fontsize=8)
    fig.suptitle(rf"Noisy tokens on $S^1$: softmax, $\beta$ = {BETA:g}, individual noise "
                 r"$\sigma\,dW$ (generator $\frac{\sigma^2}{2}\partial_\theta^2$)")
    fig.tight_layout()
    return fig


save_figures({"noisy_clustering": figure()}, OUT)
