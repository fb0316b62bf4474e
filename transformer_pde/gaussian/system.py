r"""The reparametrised moment system shared by :func:`~transformer_pde.gaussian.solve` and
:func:`~transformer_pde.gaussian.solve_batch`, and the classification of terminal states.

The state of a member is ``[t, rho, G (d*d, row-major), alpha_tilde (d)]``: the covariance
factor :math:`F = e^{\rho}G` (:math:`\Sigma = FF^\top`, :math:`\|G\|_F = 1`), the mean
:math:`\alpha = \varphi\tilde\alpha` and the time :math:`t`, all functions of the
reparametrised time :math:`s` (see :mod:`transformer_pde.gaussian`).

Not part of the package's public API: the names are shared by the sibling modules only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..attention import Attention, Layers
from .affine import ParamBatch, affine_batch, stack_params, sym
from .laws import law_q_max, rate_scale

__all__: list[str] = []


class MomentSystem:
    """Reparametrised moment system for a batch of members (see :mod:`transformer_pde.gaussian`).

    State row: ``[t, rho, G (d*d, row-major), alpha_tilde (d)]``.
    """

    def __init__(self, atts: Sequence[Attention], B: int):
        self.atts = list(atts)
        a0 = self.atts[0]
        self.d = a0.d
        self.kind = a0.kind
        self.gamma = 1.0 if self.kind == "linear" else 0.0
        self.dynamic = any(a.time_dependent for a in self.atts)
        self.per_member = len(self.atts) > 1
        self.n = 2 + self.d * self.d + self.d
        p0 = [a.at(0.0) for a in self.atts]
        self.kappa = np.array([rate_scale(p) for p in p0])   # (P,)
        self.static = None if self.dynamic else stack_params(p0)
        self.lo = np.full(B, -np.inf)   # clamp window for evaluating parameters
        self.hi = np.full(B, np.inf)

    def q_max(self, t: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """:func:`blowup_law` of each member at its time ``t``."""
        if self.kind != "l2":
            return np.full(len(idx), law_q_max(self.atts[0].at(0.0)))
        out = np.empty(len(idx))
        for j, (i, tt) in enumerate(zip(idx, t)):
            a = self.atts[i] if self.per_member else self.atts[0]
            out[j] = law_q_max(a.at(float(tt) if a.time_dependent else 0.0))
        return out

    def kap(self, idx: np.ndarray) -> np.ndarray:
        return self.kappa if not self.per_member else self.kappa[idx]

    def params(self, t: np.ndarray, idx: np.ndarray) -> ParamBatch:
        if self.static is not None:
            return self.static.take(idx)
        lo, hi = self.lo[idx], self.hi[idx]
        tc = np.minimum(np.maximum(t, lo), hi)
        sel = [self.atts[i] for i in idx] if self.per_member else [self.atts[0]] * len(idx)
        return stack_params([a.at(float(tt)) for a, tt in zip(sel, tc)])

    # ---------------------------------------------------------------- packing
    def pack(self, t: np.ndarray, means: np.ndarray, F: np.ndarray, idx: np.ndarray) -> np.ndarray:
        B, d = means.shape
        nrm = np.sqrt(np.sum(F * F, axis=(1, 2)))
        pos = nrm > 0
        rho = np.where(pos, np.log(np.where(pos, nrm, 1.0)), 0.0)
        G = np.where(pos[:, None, None], F / np.where(pos, nrm, 1.0)[:, None, None], 0.0)
        trS = nrm ** 2
        phi = np.sqrt(1.0 + self.kap(idx) * trS)
        Y = np.empty((B, self.n))
        Y[:, 0] = t
        Y[:, 1] = rho
        Y[:, 2:2 + d * d] = G.reshape(B, d * d)
        Y[:, 2 + d * d:] = means / phi[:, None]
        return Y

    def unpack(self, Y: np.ndarray, idx: np.ndarray):
        d = self.d
        B = Y.shape[0]
        t = Y[:, 0]
        rho = Y[:, 1]
        G = Y[:, 2:2 + d * d].reshape(B, d, d)
        g2 = np.sum(G * G, axis=(1, 2))
        e2r = np.exp(2.0 * rho)
        trS = e2r * g2
        phi = np.sqrt(1.0 + self.kap(idx) * trS)
        mean = Y[:, 2 + d * d:] * phi[:, None]
        return t, rho, G, g2, e2r, trS, phi, mean

    def moments(self, Y: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t, rho, G, g2, e2r, trS, phi, mean = self.unpack(Y, idx)
        F = np.exp(rho)[:, None, None] * G
        return t, mean, F @ np.swapaxes(F, 1, 2)

    # ---------------------------------------------------------------- right-hand side
    def rhs(self, Y: np.ndarray, idx: np.ndarray, full: bool = False):
        t, rho, G, g2, e2r, trS, phi, mean = self.unpack(Y, idx)
        F = np.exp(rho)[:, None, None] * G
        S = F @ np.swapaxes(F, 1, 2)
        M, b = affine_batch(self.params(t, idx), mean, S, F if self.kind == "sinkhorn" else None)
        kap = self.kap(idx)
        nu = trS + self.gamma * np.sum(mean * mean, axis=1)
        w = 1.0 + kap * nu
        MG = M @ G
        gmg = np.sum(G * MG, axis=(1, 2))
        mu = gmg / np.where(g2 > 0, g2, 1.0)
        dmean = np.einsum("bij,bj->bi", M, mean) + b
        dtrS = 2.0 * e2r * gmg
        dlogphi = 0.5 * kap * dtrS / (phi * phi)
        dY = np.empty_like(Y)
        d = self.d
        dY[:, 0] = 1.0 / w
        dY[:, 1] = mu / w
        dY[:, 2:2 + d * d] = ((MG - mu[:, None, None] * G) / w[:, None, None]).reshape(len(t), -1)
        dY[:, 2 + d * d:] = (dmean - mean * dlogphi[:, None]) / (phi * w)[:, None]
        if full:
            return dY, dict(t=t, mean=mean, S=S, M=M, b=b, dmean=dmean, nu=nu,
                            dnu=dtrS + 2.0 * self.gamma * np.sum(mean * dmean, axis=1))
        return dY

    # ---------------------------------------------------------------- diagnostics
    def log_size(self, Y: np.ndarray, idx: np.ndarray) -> np.ndarray:
        t, rho, G, g2, e2r, trS, phi, mean = self.unpack(Y, idx)
        if self.gamma == 0.0:
            return 2.0 * rho + np.log(np.maximum(g2, 1e-300))
        return np.log(np.maximum(trS + np.sum(mean * mean, axis=1), 1e-300))

    def conv_measure(self, Y: np.ndarray, idx: np.ndarray, atol: float) -> np.ndarray:
        """max(relative covariance rate, relative mean rate) per unit t."""
        _, info = self.rhs(Y, idx, full=True)
        S, M = info["S"], info["M"]
        dS = M @ S
        dS = dS + np.swapaxes(dS, 1, 2)
        nS = np.sqrt(np.sum(S * S, axis=(1, 2)))
        rS = np.sqrt(np.sum(dS * dS, axis=(1, 2))) / (nS + atol)
        rm = np.linalg.norm(info["dmean"], axis=1) / (
            np.linalg.norm(info["mean"], axis=1) + np.sqrt(nS) + atol)
        return np.maximum(rS, rm)

    def tau_q(self, Y: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
        r"""tau = nu/nu' and q = -dtau/dt (central differences along F' = MF, alpha' )."""
        _, info = self.rhs(Y, idx, full=True)
        tau = info["nu"] / info["dnu"]
        t, rho, G, *_ = self.unpack(Y, idx)
        mean = info["mean"]
        F = np.exp(rho)[:, None, None] * G
        dF = info["M"] @ F
        h = 1e-4 * np.abs(tau)
        taus = []
        for sgn in (1.0, -1.0):
            Fp = F + sgn * h[:, None, None] * dF
            mp = mean + sgn * h[:, None] * info["dmean"]
            Yp = self.pack(t + sgn * h, mp, Fp, idx)
            _, ip = self.rhs(Yp, idx, full=True)
            taus.append(ip["nu"] / ip["dnu"])
        q = -(taus[0] - taus[1]) / (2.0 * h)
        return tau, q, info


def classify(sysm: MomentSystem, Y: np.ndarray, idx: np.ndarray, converge_tol: float,
            reason: np.ndarray) -> tuple[list, np.ndarray, np.ndarray, list]:
    """Classify terminal states. ``reason``: 0 = t stop/budget, 1 = size threshold, 2 = converged."""
    B = Y.shape[0]
    status = ["running"] * B
    Tstar = np.full(B, np.nan)
    t, mean, S = sysm.moments(Y, idx)
    tr = np.trace(S, axis1=1, axis2=2)
    limit = S / np.where(tr > 0, tr, 1.0)[:, None, None]
    msgs = [""] * B
    big = np.nonzero(reason == 1)[0]
    if big.size:
        tau, q, info = sysm.tau_q(Y[big], idx[big])
        qmax = sysm.q_max(t[big], idx[big])
        # a singularity of the law has q -> 1/p <= q_max: a larger q is a transient of
        # oscillating growth (seen for l2 with singular K), not a blow-up
        isb = (np.isfinite(q) & (qmax > 0) & (q > 0.5 * qmax) & (q <= 1.5 * qmax)
               & (tau > 0))
        rem = np.where(isb, tau / np.where(isb, q, 1.0), np.nan)
        Sm, Mm = info["S"], info["M"]
        dS = Mm @ Sm
        dS = dS + np.swapaxes(dS, 1, 2)
        trj = np.trace(Sm, axis1=1, axis2=2)
        trd = np.trace(dS, axis1=1, axis2=2)
        pos = trj > 0
        trj_ = np.where(pos, trj, 1.0)
        # extrapolate the direction to T*: d(S/trS)/dt = (S' - Shat trS')/trS
        dhat = (dS - Sm / trj_[:, None, None] * trd[:, None, None]) / trj_[:, None, None]
        lim_b = sym(Sm / trj_[:, None, None] + np.nan_to_num(rem)[:, None, None] * dhat)
        sel = big[isb]
        Tstar[sel] = t[sel] + rem[isb]
        lsel = isb & pos
        limit[big[lsel]] = lim_b[lsel]
        # messages from Python floats (formatting NumPy scalars is several times slower)
        nu_l, q_l, qm_l = info["nu"].tolist(), q.tolist(), qmax.tolist()
        t_l, T_l = t.tolist(), Tstar.tolist()
        for j, i in enumerate(big.tolist()):
            if isb[j]:
                status[i] = "blowup"
                msgs[i] = (f"finite-time blow-up: size {nu_l[j]:.3g} at t={t_l[i]:.10g}, "
                           f"q={q_l[j]:.4g} (power law exponent {1 / q_l[j]:.4g}), "
                           f"T*={T_l[i]:.12g}")
            else:
                status[i] = "diverging"
                why = (f"the {sysm.kind} law has bounded M (no finite-time blow-up)"
                       if qm_l[j] <= 0 else f"q={q_l[j]:.3g} <= {0.5 * qm_l[j]:g}"
                       if not q_l[j] > 0.5 * qm_l[j] else
                       f"q={q_l[j]:.3g} > {1.5 * qm_l[j]:g}: faster than the law allows "
                       f"(oscillating growth)")
                msgs[i] = (f"diverging without finite-time blow-up: size {nu_l[j]:.3g} "
                           f"at t={t_l[i]:.6g}, {why}")
    for i in np.nonzero(reason == 2)[0]:
        status[i] = "converged"
        msgs[i] = f"converged at t={t[i]:.6g} (relative rates <= {converge_tol:g})"
    for i in np.nonzero(reason == 0)[0]:
        msgs[i] = msgs[i] or f"reached t={t[i]:.6g} undecided"
    return status, Tstar, limit, msgs


def layer_breakpoints(atts: Sequence[Attention], t_max: float) -> list[float]:
    bps: set[float] = set()
    for a in atts:
        for name in ("Q", "K", "V", "W_O"):
            v = getattr(a, name)
            if isinstance(v, Layers):
                for l in range(1, v.n_layers):
                    tb = v.t0 + l * v.layer_time
                    if 0.0 < tb < t_max:
                        bps.add(float(tb))
    return sorted(bps)


def check_solver_args(t_max: float, rtol: float, atol: float, blowup_threshold: float,
                       converge_tol: float) -> None:
    for n, v in (("t_max", t_max), ("rtol", rtol), ("atol", atol),
                 ("blowup_threshold", blowup_threshold), ("converge_tol", converge_tol)):
        if not (isinstance(v, (int, float, np.floating, np.integer)) and np.isfinite(v) and v > 0):
            raise ValueError(f"{n} must be a finite number > 0, got {v!r}")
    if rtol < 1e-14:
        raise ValueError(f"rtol must be >= 1e-14, got {rtol}")

