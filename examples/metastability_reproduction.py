"""Metastable clusters on the circle: the published experiment, reproduced and timed
=================================================================================

Bruno, Pasqualotto & Agazzi (arXiv 2410.23228) run N = 2 x 10^4 tokens on the circle,
i.i.d. uniform at t = 0, under

    d theta_i / dt = -(1/N) sum_j e^{beta cos(theta_i - theta_j)} sin(theta_i - theta_j),

beta = 5, to T = 0.6 by explicit Euler with dt = 1e-4 and a dense N x N kernel, and predict
that the uniform state breaks up along its most unstable Fourier mode, k* = 3 (the largest of
their gamma_k = k^2 I_k(beta) / (pi beta)), into three clusters at the angles
(2 pi m - arg c_3(0)) / 3.

In this library that flow is unnormalised attention, ``Attention("exp", I, I, I, beta=5)``
(no shift), on the unit circle, ``Block(constraint=Sphere())``, in the same time: its
tangential velocity is their F(theta) (checked to round-off in
``tests/meanfield/test_metastability_rates.py``).  The Fourier modes
c_k = (1/N) sum_j e^{-ik theta_j} grow at lambda_k = k^2 I_k(beta) / beta = pi gamma_k
(:func:`~transformer_pde.reductions.modes.mode_growth_rate` with ``model="usa"``); the
softmax flow of the same tokens has lambda_k / I_0(beta).

Panels: (a) the tokens' angles with the predicted cluster positions; (b) the moduli of the modes c_k(t) against
c_k(0) e^{lambda_k t}; (c) the rates measured from particles (pooled over draws, two
standard errors) against lambda_k and the published gamma_k; (d) the W1 distance between
the particles and the mean-field PDE (uniform for all t: the uniform state is stationary)
against N at two times, with fitted slopes.

Run::

    python examples/metastability_reproduction.py                         # minutes
    TRANSFORMER_PDE_FAST=1 python examples/metastability_reproduction.py  # seconds

Writes figures/metastability_reproduction.png and prints the tables.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) shrinks every size (tokens, draws, the N of the
# convergence study); the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the
# repository's ``figures/``).

import dataclasses
import os
import time

import matplotlib.pyplot as plt
import numpy as np
from scipy.special import iv

import transformer_pde as tp
from transformer_pde.diagnostics.metastability import circle_modes, fit_mode_growth
from transformer_pde.integrate import Dop853
from transformer_pde.meanfield.study import convergence_study
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures
from transformer_pde.particles.ensemble import simulate_ensemble
from transformer_pde.reductions.modes import mode_growth_rate, most_unstable_degree

FAST = fast_configuration()
OUT = output_folder()
BETA, T_END = 5.0, 0.6                     # the published experiment
N_MAIN = 600 if FAST else 20_000           # tokens of the main run (published: 2 x 10^4)
EULER_DT = 1e-4                            # the published step
RTOL, ATOL = 1e-8, 1e-10                   # our adaptive DOP853
N_ACC = 200 if FAST else 2_000             # tokens of the accuracy comparison
N_RATES, DRAWS = (300, 8) if FAST else (8_000, 16)   # growth-rate ensemble
T_LINEAR = 0.04                            # end of the fitted linear phase
NS = (50, 100, 200) if FAST else (100, 300, 1_000, 3_000, 10_000)  # panel (d)
SEEDS = 2 if FAST else 4                   # draws per N in panel (d)
T_CONV = (0.05, 0.15)                      # times of panel (d)
KS = np.arange(1, 7)                       # Fourier modes followed
SEED = 12345
# the published numbers (the notebook's printed output and formulas)
PUBLISHED = {"steps": 6000, "wall_s": 91.0, "kstar": 3, "clusters": 3}
I2 = np.eye(2)
ATT = tp.Attention("exp", I2, I2, I2, beta=BETA)
SPHERE = tp.Block(constraint=tp.Sphere())
# the exact Fourier field where this version of the library has it, else the direct sum
# (NumPy: its O(N K) sums are vectorised; a parallel kernel gains nothing at these N)
HARMONIC = "method" in {f.name for f in dataclasses.fields(tp.FieldOptions)}
FIELD = (tp.FieldOptions(method="harmonic", backend="numpy") if HARMONIC
         else tp.FieldOptions())
FIELD_NAME = "harmonic (Fourier)" if HARMONIC else "direct (all pairs)"


def on_circle(theta):
    return np.stack([np.cos(theta), np.sin(theta)], axis=-1)


def angles(X):
    return np.arctan2(X[..., 1], X[..., 0])


def uniform_tokens(rng, n, draws=None):
    shape = (n,) if draws is None else (draws, n)
    return on_circle(rng.uniform(0.0, 2.0 * np.pi, shape))


def clusters(theta, gap=0.2, share=0.01):
    """Centres (circular means) of the groups of angles separated by gaps > ``gap``
    holding more than ``share`` of the tokens."""
    s = np.sort(np.mod(theta, 2 * np.pi))
    cut = np.flatnonzero(np.diff(np.r_[s, s[0] + 2 * np.pi]) > gap)
    if cut.size == 0:
        return np.array([])
    # start after the last gap: the groups are then contiguous, split after each other gap
    groups = np.split(np.roll(s, -(cut[-1] + 1)), (cut[:-1] - cut[-1]) % s.size)
    return np.array([np.angle(np.exp(1j * g).mean()) for g in groups
                     if g.size > share * s.size])


# %%
# The main run: N tokens, adaptive DOP853
# ---------------------------------------
# Saved every 0.02; the modes c_1..c_6 along it and the cluster centres at T against the
# predicted (2 pi m - arg c_3(0)) / 3.

rng = np.random.default_rng(SEED)
X0 = uniform_tokens(rng, N_MAIN)
ts = np.linspace(0.0, T_END, 31)
t0 = time.perf_counter()
main = tp.simulate(ATT, X0, t_max=T_END, dt=0.01, solver=Dop853(rtol=RTOL, atol=ATOL),
                   block=SPHERE, field=FIELD, saveat=tp.SaveAt(ts=ts))
wall_main = time.perf_counter() - t0
modes = circle_modes(main, KS)
lam = mode_growth_rate(BETA, 2, KS, model="usa")
gamma = KS ** 2 * iv(KS, BETA) / (np.pi * BETA)
theta_T = angles(main.states[-1])
found = clusters(theta_T)
predicted = np.mod((2 * np.pi * np.arange(3) - np.angle(modes[0, 2])) / 3, 2 * np.pi)


def offset(centres, positions):
    """The largest angle between a centre and the nearest of ``positions``."""
    return max(np.abs(np.angle(np.exp(1j * (c - positions)))).min() for c in centres)


print(f"main run: N = {N_MAIN}, {FIELD_NAME} field, DOP853 rtol={RTOL:g}: {wall_main:.1f} s, "
      f"{main.info['n_steps']} steps; {found.size} clusters at T = {T_END}, the largest "
      f"{offset(found, predicted):.3f} rad from (2 pi m - arg c_3(0))/3")

# %%
# Growth rates measured from particles
# ------------------------------------
# DRAWS independent i.i.d. uniform draws of N_RATES tokens (one packed ensemble run), the
# modes pooled over draws and fitted on [0, T_LINEAR].

X_rates = uniform_tokens(rng, N_RATES, DRAWS)
ts_lin = np.linspace(0.0, T_LINEAR, 9)
ens = simulate_ensemble(ATT, X_rates, t_max=T_LINEAR, dt=0.005,
                        solver=Dop853(rtol=RTOL, atol=ATOL), block="sphere",
                        saveat=tp.SaveAt(ts=ts_lin), field=FIELD)
states = np.asarray(ens.states)
fit = fit_mode_growth(ens.times, np.stack([circle_modes(states[:, b], KS)
                                           for b in range(DRAWS)]), t_end=T_LINEAR)
kstar = most_unstable_degree(BETA, 2, model="usa")
print(f"\n{'k':>2} {'gamma_k (pub.)':>14} {'pi gamma_k':>11} {'lambda_k (lib.)':>15} "
      f"{'measured':>16} {'z':>5}")
for j, k in enumerate(KS):
    print(f"{k:>2} {gamma[j]:>14.6f} {np.pi * gamma[j]:>11.6f} {lam[j]:>15.6f} "
          f"{fit.rates[j]:>9.3f} ± {fit.stderr[j]:.3f} "
          f"{(fit.rates[j] - lam[j]) / fit.stderr[j]:>5.1f}")
print(f"most unstable mode k* = {kstar}; measured argmax {KS[np.argmax(fit.rates)]}")

# %%
# Particles against the mean-field PDE
# ------------------------------------
# From i.i.d. uniform tokens the PDE stays uniform (a stationary, unstable state), so W1
# between the particles and it is the size of the finite-N fluctuation: N^{-1/2} at t = 0,
# amplified by e^{lambda* t} in the linear phase (and O(1) once the clusters form).

studies = [convergence_study(lambda th: np.full_like(th, 1.0 / (2 * np.pi)), BETA, t,
                             Ns=NS, seeds=SEEDS, seed=1, model="usa", dt=0.005)
           for t in T_CONV]
for t, st in zip(T_CONV, studies, strict=True):
    print(f"t = {t}: W1 ~ N^p, p = {st.slope:.3f} ± {st.slope_se:.3f}; mean W1 "
          f"{np.round(np.nanmean(st.w1, axis=1), 4).tolist()}")
w1_T = tp.meanfield.distance.w1_circle(
    main.states[-1], (2 * np.pi * np.arange(64) / 64, np.full(64, 1 / (2 * np.pi))))
print(f"t = {T_END}: W1(particles, PDE) = {w1_T:.3f} at N = {N_MAIN}")

# %%
# Speed and accuracy against the published setting
# ------------------------------------------------
# Their setting on this machine: explicit Euler, dt = 1e-4, the direct field at N_MAIN,
# ten steps timed and extrapolated to the 6000 steps of T = 0.6.  Accuracy: both schemes
# at N_ACC tokens against DOP853 at rtol = atol = 1e-13 (the largest angle error over the
# tokens at T, and the error of the modulus of c_3(T)).

euler = tp.FieldOptions()                # the direct field, as published
tp.simulate(ATT, X0, t_max=EULER_DT, dt=EULER_DT, solver="euler", block=SPHERE, field=euler)
steps = 10
t0 = time.perf_counter()
tp.simulate(ATT, X0, t_max=steps * EULER_DT, dt=EULER_DT, solver="euler", block=SPHERE,
            field=euler, saveat=tp.SaveAt(ts=[steps * EULER_DT]))
per_step = (time.perf_counter() - t0) / steps
wall_euler = per_step * round(T_END / EULER_DT)

X_acc = uniform_tokens(np.random.default_rng(SEED + 1), N_ACC)
end = tp.SaveAt(ts=[T_END])
ref = tp.simulate(ATT, X_acc, t_max=T_END, dt=0.01, solver=Dop853(rtol=1e-13, atol=1e-13),
                  block=SPHERE, field=FIELD, saveat=end)
runs = {"euler": ("euler", EULER_DT), "dop853": (Dop853(rtol=RTOL, atol=ATOL), 0.01)}
acc = {}
for name, (solver, dt) in runs.items():
    r = tp.simulate(ATT, X_acc, t_max=T_END, dt=dt, solver=solver, block=SPHERE, field=FIELD,
                    saveat=end)
    err = np.abs(np.angle(np.exp(1j * (angles(r.states[-1]) - angles(ref.states[-1]))))).max()
    c3 = abs(circle_modes(r.states[-1:], 3)[0, 0]) - abs(circle_modes(ref.states[-1:], 3)[0, 0])
    acc[name] = (err, abs(c3), r.info["n_steps"])
(e_eu, c_eu, _), (e_dp, c_dp, n_dp) = acc.values()

rows = [
    ("time steps to T = 0.6", PUBLISHED["steps"], main.info["n_steps"]),
    ("wall time, their setting (s)", PUBLISHED["wall_s"], wall_euler),
    ("wall time, DOP853 + field (s)", PUBLISHED["wall_s"], wall_main),
    ("most unstable mode k*", PUBLISHED["kstar"], int(KS[np.argmax(fit.rates)])),
    ("clusters at T = 0.6", PUBLISHED["clusters"], found.size),
    ("rate of k = 3 (pi gamma_3)", np.pi * gamma[2], fit.rates[2]),
]
print(f"\n{'quantity':<32} {'published':>10} {'reproduced':>11} {'difference':>11}")
for name, pub, got in rows:
    print(f"{name:<32} {pub:>10.4g} {got:>11.4g} {got - pub:>11.3g}")
print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
print(f"speed-up of DOP853 + {FIELD_NAME} over Euler dt=1e-4 + direct, same machine, "
      f"N = {N_MAIN}: {wall_euler / wall_main:.1f}x (Euler: {per_step * 1e3:.1f} ms a step, "
      f"{steps} timed, extrapolated to 6000)")
print(f"accuracy at N = {N_ACC} against DOP853 rtol=1e-13 ({ref.info['n_steps']} steps):")
print(f"  Euler dt=1e-4 (6000 steps):      max angle error {e_eu:.2e}, |c_3| error {c_eu:.2e}")
print(f"  DOP853 rtol={RTOL:g} ({n_dp} steps): max angle error {e_dp:.2e}, |c_3| error {c_dp:.2e}")


# %%
# The figure
# ----------

def figure():
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    ax = axes[0, 0]
    th = np.mod(angles(main.states), 2 * np.pi)
    pick = np.random.default_rng(0).choice(N_MAIN, min(N_MAIN, 400), replace=False)
    y = th[:, pick].copy()
    y[1:][np.abs(np.diff(y, axis=0)) > np.pi] = np.nan      # no line across 0 = 2 pi
    ax.plot(main.times, y, color="tab:blue", lw=0.3, alpha=0.5)
    for p in predicted:
        ax.axhline(p, color="tab:red", ls="--", lw=1)
    ax.set_ylim(0, 2 * np.pi)
    ax.set_xlabel("t")
    ax.set_ylabel("θ (400 of the tokens)")
    ax.set_title(f"(a) N = {N_MAIN}, β = {BETA:g}; dashed: (2πm − arg c₃(0))/3")

    ax = axes[0, 1]
    colors = plt.get_cmap("tab10")
    for j, k in enumerate(KS):
        ax.semilogy(main.times, np.abs(modes[:, j]), color=colors(j), lw=1.5,
                    label=f"k = {k}, λ = {lam[j]:.2f}")
        tt = main.times[main.times <= 0.35]
        ax.semilogy(tt, np.abs(modes[0, j]) * np.exp(lam[j] * tt), color=colors(j), ls="--",
                    lw=0.8)
    ax.set_ylim(np.abs(modes[0]).min() / 3, 1.5)
    ax.set_xlabel("t")
    ax.set_ylabel(r"$|c_k(t)|$")
    ax.set_title(r"(b) Fourier modes; dashed: $|c_k(0)|\,e^{\lambda_k t}$")
    ax.legend(fontsize=8, loc="lower right")

    ax = axes[1, 0]
    kk = np.linspace(0.5, 6.5, 200)
    ax.plot(kk, kk ** 2 * iv(kk, BETA) / BETA, color="k", lw=1,
            label="λ_k = k² I_k(β)/β = π γ_k")
    ax.plot(kk, kk ** 2 * iv(kk, BETA) / (np.pi * BETA), color="0.5", ls=":", lw=1,
            label="γ_k = k² I_k(β)/(πβ) (published)")
    ax.errorbar(KS, fit.rates, yerr=2 * fit.stderr, fmt="o", color="tab:red", capsize=3,
                label=f"measured, {DRAWS} draws of N = {N_RATES} (±2 s.e.)")
    ax.axvline(kstar, color="tab:red", ls="--", lw=0.8)
    ax.set_xlabel("k")
    ax.set_ylabel("growth rate")
    ax.set_title(f"(c) rates in the linear phase t ≤ {T_LINEAR}; k* = {kstar}")
    ax.legend(fontsize=8)

    ax = axes[1, 1]
    for i, (t, st) in enumerate(zip(T_CONV, studies, strict=True)):
        mean = np.nanmean(st.w1, axis=1)
        ax.loglog(np.repeat(st.Ns, st.w1.shape[1]), st.w1.ravel(), ".", color=colors(i),
                  alpha=0.5)
        ax.loglog(st.Ns, mean, "o-", color=colors(i),
                  label=f"t = {t}: slope {st.slope:.2f} ± {st.slope_se:.2f}")
    ns = np.asarray(NS, float)
    ax.loglog(ns, np.nanmean(studies[0].w1, axis=1)[0] * np.sqrt(ns[0] / ns), "k--", lw=0.8,
              label=r"$N^{-1/2}$")
    ax.set_xlabel("N")
    ax.set_ylabel("W1(particles, PDE)")
    ax.set_title("(d) particles vs the mean-field PDE (uniform)")
    ax.legend(fontsize=8)
    fig.suptitle("Metastable clustering on the circle (arXiv 2410.23228), reproduced with "
                 f"DOP853 and the {FIELD_NAME} field")
    fig.tight_layout()
    return fig


save_figures({"metastability_reproduction": figure()}, OUT, dpi=110)
