"""Synchronisation on the circle at negative beta: which initial states end at one point?
==========================================================================================

Tokens on the unit circle under unnormalised isotropic attention (kind ``"exp"``,
Q = K = V = I) at inverse temperature beta, the self-attention dynamics
d theta_i/dt = (1/n) sum_j e^{beta cos(theta_j - theta_i)} sin(theta_j - theta_i).
Polyanskiy, Rigollet and Yao (arXiv 2507.22857) prove that almost every initial state
synchronises for beta >= -0.16 and that this fails for beta < -2/3; in between is open.
The failure below -2/3 is three equal clusters at 120 degrees, a stable equilibrium
exactly when beta < -2/3 (panel c, from the library's linearisation).

Each random initial state is run by the sweep engine (``sweep.SyncCell``) and classified
by ``diagnostics.synchronization_runs``: synchronised when the tokens lie in an open
half-circle (a certificate: they then converge to one point), equilibrium when no token
moves faster than 1e-8 rad per unit time, undecided otherwise by the final time.

(a) i.i.d. uniform initial angles; (b) states near the three-cluster equilibrium (angles
moved by N(0, 0.3^2)), also at n = 10^4 and 10^5 with the exact harmonic field
(``FieldOptions(method="harmonic")``, O(n K) per evaluation); (c) the eigenvalues of that
equilibrium.  Run::

    python examples/negative_beta_sync.py                            # ~9 minutes on 2 cores
    TRANSFORMER_PDE_FAST=1 python examples/negative_beta_sync.py     # seconds
    TRANSFORMER_PDE_DASK=1 python examples/negative_beta_sync.py     # the cells on Dask

Writes figures/negative_beta_sync.png.
"""

# %%
# Parameters
# ----------
# ``FAST`` (``TRANSFORMER_PDE_FAST=1``) runs five values of beta, n in {3, 6} and four draws
# (and n = 300 for the harmonic field);
# ``DASK`` (``TRANSFORMER_PDE_DASK=1``) runs the cells on an embedded Dask cluster (one
# worker per core) instead of in this process; the figure goes into ``OUT``
# (``TRANSFORMER_PDE_OUT``, by default the repository's ``figures/``).

import os
import time

import matplotlib.pyplot as plt
import numpy as np

from transformer_pde import diagnostics, sweep
from transformer_pde.paper.scripts import fast_configuration, output_folder, save_figures

FAST = fast_configuration()
OUT = output_folder()
DASK = os.environ.get("TRANSFORMER_PDE_DASK", "").strip() == "1"
BETAS = [-1.0, -0.7, -0.5, -0.2, 0.2] if FAST else \
    [float(b) for b in np.round(np.linspace(-1.0, 0.2, 25), 3)]
UNIFORM_N = [3, 6] if FAST else [3, 4, 6, 12, 64]      # tokens, panel (a)
TRIANGLE_N = [3, 6] if FAST else [3, 30, 90]          # tokens, panel (b)
DRAWS = 4 if FAST else 100                             # initial states per (beta, n)
TRIANGLE_DRAWS = 4 if FAST else 30
T_MAX = 40.0 if FAST else 300.0                        # final time
LARGE_N = [300] if FAST else [10_000, 100_000]         # tokens, harmonic field, panel (b)
LARGE_BETAS = [-1.0, 0.2] if FAST else [-1.0, -0.3, 0.2]
LARGE_DRAWS = 1 if FAST else 2
LARGE_T_MAX = 10.0 if FAST else 60.0
BACKEND = "numpy" if FAST else "numba"                 # field backend of the runs
SEED = 0
PROVED_SYNC, PROVED_NOT = -0.16, -2.0 / 3.0            # the paper's two bounds


# %%
# The study
# ---------
# One grid per panel: beta times n times draws, each cell one initial state.  A task's
# draws of one (beta, n) run together as one ensemble (``SyncCell.run_batch``).

# The large runs use the harmonic field, RK4 step 0.2 (its error, ~1e-4 in the angles,
# stays far below the certificate's margin 1e-2) and call a state an equilibrium below
# 1e-6 rad per unit time.

def study(init, betas, ns, draws, t_max=T_MAX, dt=0.05, method="direct", speed_tol=1e-8):
    cell = sweep.SyncCell(init=init, spread=0.3, t_max=t_max, dt=dt, check_every=1.0,
                          speed_tol=speed_tol, backend=BACKEND, method=method)
    grid = sweep.Grid({"beta": betas, "n": ns}, draws=draws, seed=SEED)
    return sweep.run(sweep.Study(grid, cell, name=f"negative-beta-{init}-{method}"),
                     scheduler=None if DASK else "serial", progress=not FAST)


t0 = time.perf_counter()
uniform = study("uniform", BETAS, UNIFORM_N, DRAWS)
t1 = time.perf_counter()
triangle = study("triangle", BETAS, TRIANGLE_N, TRIANGLE_DRAWS)
t2 = time.perf_counter()
large = study("triangle", LARGE_BETAS, LARGE_N, LARGE_DRAWS, t_max=LARGE_T_MAX, dt=0.2,
              method="harmonic", speed_tol=1e-6)
t3 = time.perf_counter()


def fractions(ds):
    """Fractions synchronised and undecided per (beta, n)."""
    v = ds["verdict"]
    return (v == diagnostics.synchronization.SYNCHRONISED).mean("draw"), \
        (v == diagnostics.synchronization.UNDECIDED).mean("draw")


for name, ds, seconds in (("uniform", uniform, t1 - t0), ("triangle", triangle, t2 - t1),
                          ("triangle, harmonic field", large, t3 - t2)):
    sync, undecided = fractions(ds)
    print(f"{name} initial states ({seconds:.0f} s): fraction synchronised "
          f"(undecided) per beta and n")
    print("   beta  " + "".join(f"n={n:<11d}" for n in ds["n"].values))
    for b in ds["beta"].values:
        cells = [f"{float(sync.sel(beta=b, n=n)):.2f} ({float(undecided.sel(beta=b, n=n)):.2f})"
                 for n in ds["n"].values]
        print(f"  {b:+.2f}  " + "  ".join(cells))
    stopped = (ds["verdict"] == diagnostics.synchronization.EQUILIBRIUM).values
    if stopped.any():
        eig = ds["max_eig"].values[stopped]
        worst = (f"largest eigenvalue of the linearisation at most {np.nanmax(eig):.3f}"
                 if np.isfinite(eig).any() else "linearisation not computed (n > 256)")
        print(f"  {int(stopped.sum())} runs stopped at an equilibrium: clusters "
              f"{sorted(set(ds['clusters'].values[stopped].tolist()))}, {worst}")


# %%
# The figure
# ----------
# Fraction synchronised against beta, one line per n; dotted, the fraction undecided at
# the final time.  Shaded: proved to synchronise (green), proved not to for every initial
# state (red), open (white).

def bounds(ax):
    lo, hi = min(BETAS) - 0.03, max(BETAS) + 0.03
    ax.axvspan(PROVED_SYNC, hi, color="tab:green", alpha=0.12, lw=0)
    ax.axvspan(lo, PROVED_NOT, color="tab:red", alpha=0.12, lw=0)
    ax.axvline(PROVED_SYNC, color="tab:green", lw=1)
    ax.axvline(PROVED_NOT, color="tab:red", lw=1)
    ax.set_xlim(lo, hi)


def panel(ax, ds, title, large=None):
    sync, undecided = fractions(ds)
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, ds["n"].size))
    for n, c in zip(ds["n"].values, colors, strict=True):
        ax.plot(ds["beta"].values, sync.sel(n=n).values, "o-", color=c, ms=3, lw=1.2,
                label=f"n = {n}")
        if float(undecided.sel(n=n).max()) > 0:
            ax.plot(ds["beta"].values, undecided.sel(n=n).values, ":", color=c, lw=1)
    if large is not None:
        big, _ = fractions(large)
        for n, marker in zip(large["n"].values, "sDv^", strict=False):
            ax.plot(large["beta"].values, big.sel(n=n).values, marker, color="tab:orange",
                    mfc="none", ms=8, mew=1.5,
                    label=f"n = {n:,} (harmonic, {large['draw'].size} per point)")
    bounds(ax)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(r"$\beta$")
    ax.set_ylabel("fraction synchronised")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")


fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
panel(axes[0], uniform, f"(a) uniform initial angles, {DRAWS} states per point")
panel(axes[1], triangle, f"(b) near three clusters (spread 0.3), {TRIANGLE_DRAWS} per point",
      large)
ax = axes[2]
bs = np.linspace(min(BETAS), max(BETAS), 400)
spectra = [diagnostics.polygon_spectrum(3, b) for b in bs]
ax.plot(bs, [s[0].max() for s in spectra], color="k",
        label=r"$\mu_1 = e^{-\beta/2}(\frac{1}{2} + \frac{3}{4}\beta)$ (clusters)")
ax.plot(bs, [s[1] for s in spectra], color="0.5", ls="--", label=r"$\nu$ (inside a cluster)")
ax.axhline(0.0, color="0.7", lw=0.8)
bounds(ax)
ax.set_xlabel(r"$\beta$")
ax.set_ylabel("eigenvalue of the linearisation")
ax.set_title("(c) three equal clusters at 120°: stable iff both < 0")
ax.legend(fontsize=8, loc="upper left")
fig.suptitle("Tokens on the circle, unnormalised attention: synchronisation at negative β "
             "(green: proved; red: proved not for every state; dotted: undecided at "
             f"T = {T_MAX:g})", fontsize=10)
fig.tight_layout()
save_figures({"negative_beta_sync": fig}, OUT, dpi=110)
