"""Lost in the middle: the retrieval profile of causal ALiBi attention on the circle
==================================================================================

Duerinckx, Geshkovski and Rossi (arXiv 2605.09213): N tokens on the circle at positions
u_j = j/N, i.i.d. uniform at t = 0, move by causal attention whose weights carry the ALiBi
factor e^{-lambda (u_i - u_j)}.  In the kinetic limit the correlation of the last token at
time t with the source token at position s,

    S_t(s) = lim_N  N E[ sum_{n <= n_max} omega_{n,M} cos n(theta_N(t) - theta_{sN}(0)) ],

is U-shaped in s (primacy and recency, lowest in the middle) until the critical time t_c,
when the right end turns down (``transformer_pde.reductions.lost_in_middle``: closed form,
critical time).  Their parameters: lambda = 1, M = 8, n_max = 20.

(a) t_c(beta), beta = 0.1 ... 4.8.  (b) S_t(s) for beta = 1: kinetic and particles
(estimate and standard error per bin of s), measured with ``simulate_ensemble``: softmax
attention with ``alibi=lambda``, ``masked=True``, Q = K = I and V = beta I_0(beta) I on the
circle (``block="sphere"``), which has the linearisation of the paper's model, hence the
same S_t(s); each run carries 32 probes (tokens of zero weight at the last position,
started at equally spaced angles) whose mean e^{i n theta} is the last token's law given
the prompt, regressed on the prompt's initial modes bin by bin.  (c) The kinetic shape
across t_c.  (d) The distance of the particles to the kinetic limit against N, and its
fitted rate.  (e) The rates a_n measured on the particles.  (f) The critical time from
them: the slope at s = 1 is t A_1 - t^2 A_2 / (2(1 - e^{-lambda})), A_k = sum_n omega_n a_n^k.

Run::

    python examples/lost_in_the_middle.py                           # about 10 min on 2 cores
    TRANSFORMER_PDE_FAST=1 python examples/lost_in_the_middle.py    # seconds

Writes figures/lost_in_the_middle.png and prints every number beside the authors'.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs two small prompts for a short time; the figure
# goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import time

import matplotlib.pyplot as plt
import numpy as np
from scipy.special import i0

import transformer_pde as tp
from transformer_pde.integrate import SaveAt
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures
from transformer_pde.particles.ensemble import simulate_ensemble
from transformer_pde.reductions.lost_in_middle import (critical_time, measure_retrieval,
                                                       mode_rates, mode_response,
                                                       retrieval_profile, soft_weights)

FAST = fast_configuration()
OUT = output_folder()
BETA, LAM, M, N_MAX = 1.0, 1.0, 8.0, 20          # the authors' parameters (beta of (b-d))
#: prompt lengths and runs: R N = 2.5e5 tokens per length up to N = 1000 (the regression's
#: standard error is about constant in N at fixed R N, the cost grows like R N^2), and one
#: long prompt (N = 4000, 25 runs)
NS = [80, 160] if FAST else [125, 250, 500, 1000, 4000]
RUNS = {n: (40 if FAST else (250_000 // n if n <= 1000 else 25)) for n in NS}
NS_RATE = NS if FAST else NS[:-1]     # the lengths with equal R N (equal noise) for rates in N
PROBES = 16 if FAST else 32
TIMES = np.array([0.25, 0.5, 0.75, 1.0]) if FAST else np.round(np.arange(0.25, 3.01, 0.25), 2)
DT = 0.125                                        # RK4 step: rates a_n <= 0.6 at beta = 1
EDGES = np.linspace(0.0, 1.0, 6 if FAST else 11)  # bins of the source position
#: the critical times their script prints (lambda = 1, M = 8, n_max = 20), to 6 decimals
PRINTED_TC = {1.0: 2.457489, 2.0: 0.600716, 3.0: 0.174018}
#: the rates a_n are measured on the last bin at times up to this (series in t, cubic)
RATE_TIMES = 1.0
SEED = 0


# %%
# The kinetic side: the critical time and the bin averages of the profile
def bin_average(t, edges, rates):
    """Bin averages of g_n(t; s) for every rate (rows) and bin (columns), by Gauss-Legendre
    quadrature (in v = sqrt(s / s_1) on the first bin, where Y ~ log(1/s))."""
    x, wq = np.polynomial.legendre.leggauss(64)
    out = np.zeros((len(rates), len(edges) - 1))
    for b, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        if lo == 0.0:
            v = 0.5 * (x + 1.0)
            s, jac = hi * v ** 2, hi * v * wq
        else:
            s, jac = 0.5 * (hi - lo) * x + 0.5 * (hi + lo), 0.5 * (hi - lo) * wq
        for n, a in enumerate(rates):
            out[n, b] = np.sum(mode_response(t, s, a, LAM) * jac) / (hi - lo)
    return out


betas = np.round(np.arange(0.1, 4.81, 0.1), 2)
t_crit = np.array([critical_time(b, LAM, M=M, n_max=N_MAX) for b in betas])
tc = critical_time(BETA, LAM, M=M, n_max=N_MAX)
print("critical time t_c(beta), lambda = 1, M = 8, n_max = 20")
print("  beta   this package    their script    difference")
for b, printed in PRINTED_TC.items():
    mine = critical_time(b, LAM, M=M, n_max=N_MAX)
    print(f"  {b:4.1f}   {mine:12.6f}    {printed:12.6f}    {mine - printed:+.1e}")

omega = soft_weights(N_MAX, M)
rates = mode_rates(BETA, N_MAX)
kinetic = np.array([omega @ bin_average(t, EDGES, rates) for t in TIMES])   # (T, B)


# %%
# The particle side: ensembles of prompts with probes, regressed bin by bin
def particle_profile(n, runs, seed):
    """(S (T, B), its standard error, the mode-resolved G (T, n_max, B) and its standard
    error, seconds) from ``runs`` prompts of ``n`` tokens."""
    rng = np.random.default_rng(seed)
    theta0 = rng.uniform(0.0, 2.0 * np.pi, (runs, n))
    probes = rng.uniform(0.0, 2.0 * np.pi / PROBES, (runs, 1)) \
        + 2.0 * np.pi * np.arange(PROBES) / PROBES
    angles = np.concatenate([theta0, probes], axis=1)
    X0 = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    positions = np.concatenate([np.arange(1, n + 1) / n, np.ones(PROBES)])
    weights = np.concatenate([np.ones(n), np.zeros(PROBES)])
    att = tp.Attention("softmax", np.eye(2), np.eye(2), BETA * i0(BETA) * np.eye(2),
                       beta=BETA, masked=True, alibi=LAM)
    start = time.perf_counter()
    ens = simulate_ensemble(att, X0, t_max=float(TIMES[-1]), dt=DT, saveat=SaveAt(ts=TIMES),
                            weights=weights, positions=positions, block="sphere")
    seconds = time.perf_counter() - start
    final = np.arctan2(ens.states[..., 1], ens.states[..., 0])[:, :, n:]
    G, se = measure_retrieval(theta0, final, positions[:n], EDGES, n_max=N_MAX)
    S = np.einsum("n,tnb->tb", omega, G)
    S_se = np.sqrt(np.einsum("n,tnb->tb", omega ** 2, se ** 2))
    return S, S_se, G, se, seconds


results = {}
for k, n in enumerate(NS):
    results[n] = particle_profile(n, RUNS[n], SEED + k)
    print(f"N = {n:5d}: {RUNS[n]} runs of {n} tokens + {PROBES} probes, "
          f"{results[n][4]:.0f} s")


# %%
# Where particles and the kinetic limit agree, and how fast in N
# ---------------------------------------------------------------
# The deficit concentrates in the first bin (the earliest tokens average over few
# predecessors); elsewhere the root mean square of S_N - S over the bins, its expected
# noise se^2 removed, measures what is left.  Rates in N from the prompts with R N = 2.5e5.
def distance(n, ti, bins=slice(1, None)):
    """(bias, noise): rms over ``bins`` of S_N - S with se^2 removed, and the rms se."""
    S, se = results[n][:2]
    d2 = (S[ti, bins] - kinetic[ti, bins]) ** 2 - se[ti, bins] ** 2
    return np.sqrt(max(np.mean(d2), 0.0)), np.sqrt(np.mean(se[ti, bins] ** 2))


print(f"\nS_t(s) by bins of s (first bin: s in (0, {EDGES[1]:g}]), kinetic and particles;"
      "\nrms bias and se over the other bins")
for ti, t in enumerate(TIMES):
    if t not in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0):
        continue
    print(f"  t = {t:4.2f}   kinetic " + " ".join(f"{v:6.3f}" for v in kinetic[ti]))
    for n in NS:
        bias, noise = distance(n, ti)
        print(f"      N = {n:5d}     " + " ".join(f"{v:6.3f}" for v in results[n][0][ti])
              + f"   (rms bias {bias:.3f}, se {noise:.3f})")


def power_fit(ns, values, errors):
    """Exponent p, its error and prefactor C of values ~ C N^-p (weighted least squares in
    logs; values below two standard errors left out)."""
    keep = values > 2.0 * errors
    if keep.sum() < 2:
        return np.nan, np.nan, np.nan
    x, y = np.log(np.asarray(ns, float)[keep]), np.log(values[keep])
    w = (values[keep] / errors[keep]) ** 2
    A = np.stack([np.ones_like(x), -x], axis=1)
    cov = np.linalg.inv(A.T @ (A * w[:, None]))
    c, p = cov @ (A.T @ (w * y))
    return p, np.sqrt(cov[1, 1]), np.exp(c)


first, fits = {}, {}
print(f"\nfirst-bin deficit S - S_N on (0, {EDGES[1]:g}] and its rate in N")
for ti, t in enumerate(TIMES):
    first[t] = np.array([[kinetic[ti, 0] - results[n][0][ti, 0], results[n][1][ti, 0]]
                         for n in NS_RATE])
    fits[t] = power_fit(NS_RATE, *first[t].T)
    if t in (0.5, 1.0, 1.5, 2.0):
        print(f"  t = {t:4.2f}: " + ", ".join(f"N={n}: {d:.3f} +- {e:.3f}" for n, (d, e)
                                           in zip(NS_RATE, first[t], strict=True))
              + f"   ~ N^-p, p = {fits[t][0]:.2f} +- {fits[t][1]:.2f}")


# %%
# The critical time from the particles
# -------------------------------------
# At s = 1 the profile's slope is exactly P(1) lambda [t A_1 - t^2 A_2 / (2 (1 - e^-lambda))]
# with A_k = sum_n omega_n a_n^k, so t_c needs the rates a_n only.  On the last bin,
# g_n(t; s) = a_n t <P>_bin + O(t^2): a cubic in t fitted to the particles' G_n there at
# t <= RATE_TIMES measures a_n (where the particles follow the kinetic limit closely), and
# t_c follows; its error by sampling the rates' normal errors.
def measured_rates(G, se):
    lo, hi = EDGES[-2], EDGES[-1]
    x, wq = np.polynomial.legendre.leggauss(16)
    s = 0.5 * (hi - lo) * x + 0.5 * (hi + lo)
    p_bin = np.sum(LAM * np.exp(LAM * s) / np.expm1(LAM) * 0.5 * wq)   # <P(s)> on the bin
    keep = TIMES <= RATE_TIMES + 1e-12
    t = TIMES[keep]
    A = np.stack([t, t ** 2, t ** 3], axis=1)
    est, err = np.empty(N_MAX), np.empty(N_MAX)
    for n in range(N_MAX):
        e = se[keep, n, -1]
        cov = np.linalg.inv((A / e[:, None] ** 2).T @ A)
        c = cov @ (A / e[:, None] ** 2).T @ G[keep, n, -1]
        est[n], err[n] = c[0] / p_bin, np.sqrt(cov[0, 0]) / p_bin
    return est, err


def tc_of(a):
    """t_c of rates a (..., n_max)."""
    return 2.0 * -np.expm1(-LAM) * (a @ omega) / ((a ** 2) @ omega)


tc_particles = {}
for n in NS:
    est, err = measured_rates(*results[n][2:4])
    draws = est + err * np.random.default_rng(SEED).normal(size=(4000, N_MAX))
    tc_particles[n] = (tc_of(est), float(np.std(tc_of(draws)))), (est, err)
print("\nrates a_n = n^2 I_n(beta) and the critical time, kinetic and from the particles")
print(f"  kinetic       a_1..3 = {rates[0]:.4f} {rates[1]:.4f} {rates[2]:.4f}   t_c = {tc:.4f}")
for n in NS:
    (t_n, t_err), (est, err) = tc_particles[n]
    print(f"  N = {n:5d}    a_1..3 = " + " ".join(f"{v:.4f}" for v in est[:3])
          + f"   t_c = {t_n:.3f} +- {t_err:.3f}   ({(t_n - tc) / t_err:+.1f} sigma)")



# %%
# The figure
fig, ax = plt.subplots(2, 3, figsize=(16, 9))
a = ax[0, 0]
a.semilogy(betas, t_crit, "k-")
for b, printed in PRINTED_TC.items():
    a.plot(b, printed, "o", mfc="none", color="C3")
a.set(xlabel=r"$\beta$", ylabel=r"$t_c(\beta)$",
      title=r"(a) critical time ($\lambda=1$, $M=8$, $n_{\max}=20$); o: their script")

a = ax[0, 1]
s_fine = np.linspace(0.004, 1.0, 300)
mid = 0.5 * (EDGES[1:] + EDGES[:-1])
big = NS_RATE[-1]
for k, t in enumerate(t for t in TIMES if t in (0.5, 1.0, 1.5, 2.0)):
    ti = int(np.flatnonzero(TIMES == t)[0])
    a.plot(s_fine, retrieval_profile(t, s_fine, BETA, LAM, M=M, n_max=N_MAX), color=f"C{k}",
           lw=0.8, label=f"t = {t:g}")
    a.plot(mid, kinetic[ti], "s", mfc="none", ms=6, color=f"C{k}")
    a.errorbar(mid, results[big][0][ti], yerr=results[big][1][ti], fmt="o", ms=3,
               color=f"C{k}")
a.set(xlabel="source position s", ylabel=r"$S_t(s)$", yscale="log",
      title=f"(b) kinetic (lines; squares: bin averages), particles N = {big} (dots)")
a.legend(fontsize=8)

a = ax[0, 2]
for k, t in enumerate([0.5, 1.0, 2.0, tc, 3.5, 5.0]):
    prof = retrieval_profile(t, s_fine, BETA, LAM, M=M, n_max=N_MAX)
    a.plot(s_fine, prof / prof[-1], color=plt.cm.viridis(k / 5),
           lw=2.0 if t == tc else 1.0, label=f"t = {t:.3g}" + (" = $t_c$" if t == tc else ""))
a.set(xlabel="source position s", ylabel=r"$S_t(s)\,/\,S_t(1)$", yscale="log",
      title="(c) kinetic shape: recency fades at $t_c$")
a.legend(fontsize=8)

a = ax[1, 0]
for k, t in enumerate(t for t in TIMES if t in (0.5, 1.0, 1.5)):
    d = first[t]
    a.errorbar(NS_RATE, d[:, 0], yerr=d[:, 1], fmt="o", color=f"C{k}",
               label=f"first bin, t = {t:g}: p = {fits[t][0]:.2f}")
    if np.isfinite(fits[t][0]):
        nn = np.array([NS_RATE[0], NS_RATE[-1]], float)
        a.plot(nn, fits[t][2] * nn ** -fits[t][0], "--", color=f"C{k}", lw=0.8)
    ti = int(np.flatnonzero(TIMES == t)[0])
    a.plot(NS_RATE, [distance(n, ti)[0] for n in NS_RATE], "x", color=f"C{k}",
           label=f"other bins, rms, t = {t:g}")
a.set(xscale="log", yscale="log", xlabel="N", xticks=NS_RATE, xticklabels=NS_RATE,
      ylabel=r"$S_t - S_t^{(N)}$", title=r"(d) particles to the kinetic limit ($\sim N^{-p}$)")
a.minorticks_off()
a.set_ylim(top=a.get_ylim()[1] * 12)           # room for the legend above the points
a.legend(fontsize=7, ncol=2, loc="upper right")

a = ax[1, 1]
n_show = 6
mode = np.arange(1, n_show + 1)
a.semilogy(mode, rates[:n_show], "k_", ms=14, mew=2, label=r"$a_n = n^2 I_n(\beta)$")
for k, n in enumerate(NS):
    est, err = tc_particles[n][1]
    pos = est[:n_show] > 0                      # a log axis: positive estimates only
    a.errorbar(mode[pos] + 0.06 * (k - len(NS) / 2), est[:n_show][pos],
               yerr=err[:n_show][pos], fmt="o", ms=3, color=f"C{k}",
               label=f"particles N = {n}")
a.set(xlabel="mode n", ylabel="rate", title=r"(e) rates measured on the last bin, $t \leq 1$")
a.legend(fontsize=8)

a = ax[1, 2]
for k, n in enumerate(NS):
    t_n, t_err = tc_particles[n][0]
    a.errorbar([n], [t_n], yerr=[t_err], fmt="o", color=f"C{k}")
a.axhline(tc, color="k", label=f"kinetic $t_c$ = {tc:.4f}")
a.set(xscale="log", xlabel="N", ylabel="$t_c$", xticks=NS, xticklabels=NS,
      title="(f) critical time from the particles' rates")
a.minorticks_off()
a.legend(fontsize=8)
fig.tight_layout()
save_figures({"lost_in_the_middle": fig}, OUT)
