"""Where the LayerNorm sits: clustering speed of six normalisation schemes
=======================================================================

Tokens x_i = r_i theta_i with directions theta_i on the unit sphere, softmax self-attention
with Q = K = V = I, and the attention field A_i evaluated on the directions.  The schemes of
``tp.Block(normalization=...)`` move the directions by the same Post-LN field times a speed
factor s_i::

    theta_i' = s_i P_{theta_i} A_i,   s = 1 (post), 1/r (pre), 1/(r|A|) (peri),
                                     alpha/|A| (ngpt), 1/(r sqrt(1+t)) (cod),

and Mix-LN ("mix") is post up to a switch depth, pre after it.  Post-LN and nGPT keep
r = 1 and the tokens collapse exponentially, 1 - <theta_i, theta_j> ~ e^{-2t}; Pre-LN and
Peri-LN let the residual stream grow, r ~ t, so the angular speed decays like 1/t and the
collapse is only polynomial, 1 - <theta_i, theta_j> ~ t^{-2} (t^{-1} for LN-Scaling).  The
dashed curves are the exact law of equiangular tokens (pairwise cosine rho, radius r)::

    rho' = 2 s tau,  r' = g a,  tau = e^{b rho}(1 - rho)(1 + (n-1) rho)/Z,
    a = (e^b + (n-1) rho e^{b rho})/Z,  Z = e^b + (n-1) e^{b rho},

(g = 0, 1, 1/\\|A\\|, 0, 1/sqrt(1+t): the radial factors) from the same initial mean cosine,
integrated below in log(1 - rho) with scipy's DOP853: the random cloud follows it to
about one per cent.

n = 32 tokens uniform on S^511.  With Q = K = V = I the field is a combination of the
tokens, so the flow stays in the 32-dimensional span of the initial tokens: the script runs
it in an orthonormal basis of that span (d = 32 coordinates), which leaves every inner
product, and so every curve, unchanged.

Temperature: beta = sqrt(d) is the usual scaling of scores, but with Q = K = I the
self-score beta dominates all others (beta <theta_i, theta_j> ~ beta / sqrt(d) = 1), so
A_i is theta_i up to about n e^{-beta} and the tangential speed at t = 0 is about 5e-9:
the cloud would need depths of order 1e8 to move (the script prints the measured speed).
The figure uses beta = 1 (the same as beta = sqrt(d) with Q = K = d^{-1/4} I).

Run::

    python examples/sphere_normalization.py                           # under a minute on one core
    TRANSFORMER_PDE_FAST=1 python examples/sphere_normalization.py    # a few seconds

Writes figures/sphere_normalization.png.
"""

from __future__ import annotations

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) shortens the runs (depth 8 and 50 instead of 12 and
# 1000); the figure goes into ``OUT`` (``TRANSFORMER_PDE_OUT``, by default the repository's
# ``figures/``).

import time

import matplotlib.pyplot as plt
import numpy as np
from scipy.integrate import solve_ivp

import transformer_pde as tp
from transformer_pde.blocks.normalization import Normalization
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
BETA = 1.0          # temperature of the runs
D = 512             # dimension
SEED = 0

# %%
# The schemes: (label, Normalization, final depth, step, colour)
SWITCH = 1.5
EXPONENTIAL = ("post", "ngpt", "mix")     # exponential collapse on the sphere (mix: until the switch)
POLYNOMIAL = ("pre", "peri", "cod")       # the stream grows: polynomial collapse
COLORS = {"post": "C0", "ngpt": "C1", "mix": "C2", "pre": "C3", "peri": "C4", "cod": "C5"}


def schemes(quick: bool) -> dict[str, tuple[Normalization, float, float]]:
    short, long_ = (8.0, 50.0) if quick else (12.0, 1000.0)
    return {"post": (Normalization("post"), short, 0.02),
            "ngpt": (Normalization("ngpt", alpha=1.0), short, 0.02),
            "mix": (Normalization("mix", switch=SWITCH), long_, 0.1),
            "pre": (Normalization("pre"), long_, 0.1),
            "peri": (Normalization("peri"), long_, 0.1),
            "cod": (Normalization("cod"), long_, 0.1)}


def initial_tokens(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n tokens uniform on S^{d-1}, and their coordinates in an orthonormal basis of their
    span (same Gram matrix)."""
    X0 = np.random.default_rng(seed).normal(size=(n, d))
    X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
    basis, _ = np.linalg.qr(X0.T)                 # (d, n), orthonormal columns
    Y0 = X0 @ basis
    Y0 /= np.linalg.norm(Y0, axis=1, keepdims=True)   # unit to rounding already
    return X0, Y0


def mean_cosine(states: np.ndarray) -> np.ndarray:
    """Mean of <theta_i, theta_j> over the pairs i != j, per saved state."""
    th = states / np.linalg.norm(states, axis=2, keepdims=True)
    n = th.shape[1]
    s = th.sum(axis=1)
    return ((s * s).sum(axis=1) - n) / (n * (n - 1))


def tangential_speed(X0: np.ndarray, beta: float) -> float:
    """max_i |P_{x_i} A_i| at t = 0 in the full dimension (Q = K = V = I)."""
    eye = np.eye(X0.shape[1])
    A = tp.velocity(tp.Attention("softmax", eye, eye, eye, beta=beta), X0)
    P = A - (A * X0).sum(axis=1, keepdims=True) * X0
    return float(np.linalg.norm(P, axis=1).max())


# %%
# The exact equiangular law, in w = log(1 - rho) and log r
def equiangular_gap(beta: float, n: int, rho0: float, times: np.ndarray,
                    nz: Normalization) -> np.ndarray:
    """1 - rho(t) of n equiangular tokens under the scheme ``nz`` (softmax, Q = K = V = I)."""
    def rhs(t, y):
        u = np.exp(y[0])
        rho, r, e = 1.0 - u, np.exp(y[1]), np.exp(-beta * u)   # e = e^{b rho} / e^b
        den = 1.0 + (n - 1) * e
        a = (1.0 + (n - 1) * rho * e) / den
        norm_a = np.sqrt(1.0 + 2 * (n - 1) * rho * e + (n - 1) * (1 + (n - 2) * rho) * e * e) / den
        scheme = nz.at(t).scheme
        c = 1.0 / np.sqrt(1.0 + t)
        alpha = 1.0 if nz.alpha is None else nz.alpha
        s, g = {"post": (1.0, 0.0), "pre": (1 / r, 1.0), "peri": (1 / (r * norm_a), 1 / norm_a),
                "ngpt": (alpha / norm_a, 0.0), "cod": (c / r, c)}[scheme]
        return [-2 * s * e * (1 + (n - 1) * rho) / den, g * a / r]

    pieces = [(0.0, times[-1])] if nz.switch is None else [(0.0, nz.switch), (nz.switch, times[-1])]
    y, out = [np.log(1 - rho0), 0.0], np.empty(times.size)
    for a, b in pieces:
        sol = solve_ivp(rhs, (a, b), y, method="DOP853", rtol=1e-11, atol=1e-12,
                        dense_output=True)
        mask = (times >= a) & (times <= b)
        out[mask] = np.exp(sol.sol(times[mask])[0])
        y = sol.y[:, -1]
    return out


# %%
# The runs
def run(Y0: np.ndarray, beta: float, quick: bool) -> dict:
    n = Y0.shape[0]
    eye = np.eye(n)
    att = tp.Attention("softmax", eye, eye, eye, beta=beta)
    out = {}
    for name, (nz, t_max, dt) in schemes(quick).items():
        t0 = time.perf_counter()
        # saves: evenly up to t = 10, then geometrically (the log axes); the steps land on them
        ts = np.unique(np.concatenate([np.linspace(0.0, min(t_max, 10.0), 201),
                                       np.geomspace(10.0, t_max, 150) if t_max > 10 else []]))
        tr = tp.simulate(att, Y0, t_max=t_max, dt=dt, solver="rk4",
                         block=tp.Block(normalization=nz), saveat=tp.SaveAt(ts=ts))
        if not tr.success:
            raise RuntimeError(f"{name}: {tr.message}")
        m = mean_cosine(tr.states)
        gap = equiangular_gap(beta, n, float(m[0]), tr.times, nz)
        out[name] = (tr.times, m, gap, time.perf_counter() - t0)
    return out


# %%
# The figure
def figure(results: dict, beta: float, speed: float, d: int):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    ax = axes[0]
    for name, (t, m, _, _) in results.items():
        ax.plot(t[1:], m[1:], color=COLORS[name], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("depth t")
    ax.set_ylabel(r"mean cosine $\langle\theta_i,\theta_j\rangle$")
    ax.set_title("(a) mean cosine against depth")
    ax.legend(fontsize=8)

    ax = axes[1]
    for name in EXPONENTIAL:
        t, m, gap, _ = results[name]
        keep = t <= (results["post"][0][-1])
        ax.semilogy(t[keep], 1 - m[keep], color=COLORS[name], label=name)
        ax.semilogy(t[keep], gap[keep], "k--", lw=0.8)
    t = results["post"][0]
    ax.semilogy(t, 0.3 * np.exp(-2 * (t - 3.0)), ":", color="gray", label=r"$\propto e^{-2t}$")
    ax.axvline(SWITCH, color=COLORS["mix"], lw=0.6, ls=":")
    ax.set_ylim(1e-12, 2)
    ax.set_xlabel("depth t")
    ax.set_ylabel(r"$1 -$ mean cosine")
    ax.set_title("(b) on the sphere: exponential (dashed: equiangular law)")
    ax.legend(fontsize=8)

    ax = axes[2]
    for name in (*POLYNOMIAL, "mix"):
        t, m, gap, _ = results[name]
        ax.loglog(t[1:], 1 - m[1:], color=COLORS[name], label=name)
        ax.loglog(t[1:], gap[1:], "k--", lw=0.8)
    t = results["pre"][0][1:]
    tt = t[t >= 3]
    ax.loglog(tt, 0.5 * tt ** -2.0, ":", color="gray", label=r"$\propto t^{-2}$")
    ax.loglog(tt, 0.6 * tt ** -1.0, "-.", color="gray", label=r"$\propto t^{-1}$")
    ax.set_xlabel("depth t")
    ax.set_ylabel(r"$1 -$ mean cosine")
    ax.set_title("(c) growing stream: polynomial")
    ax.legend(fontsize=8)
    fig.suptitle(f"n = 32 tokens uniform on $S^{{{d - 1}}}$, SA, Q = K = V = I, β = {beta:g}   "
                 f"(at β = √{d} the initial tangential speed is {speed:.1e}: frozen)",
                 fontsize=10)
    fig.tight_layout()
    return fig



# %%
# The runs
# --------
# The initial tangential speed at :math:`\beta = \sqrt d`, then each scheme against the
# equiangular law.

X0, Y0 = initial_tokens(32, D, SEED)
speed = tangential_speed(X0, float(np.sqrt(D)))
print(f"beta = sqrt({D}): max tangential speed at t = 0 is {speed:.3g}")
results = run(Y0, BETA, FAST)
for name, (t, m, gap, secs) in results.items():
    err = np.max(np.abs((1 - m) - gap) / gap)
    print(f"{name:5s} t_max = {t[-1]:7.1f}  1 - mean cosine = {1 - m[-1]:.3e}  "
          f"equiangular law {gap[-1]:.3e}  (max relative gap {err:.2%})  {secs:.1f} s")

# %%
# The figure
# ----------
# ``sphere_normalization.png`` into ``OUT``; in Jupyter the figure shows below the cell.

save_figures({"sphere_normalization": figure(results, BETA, speed, D)}, OUT, dpi=130)
