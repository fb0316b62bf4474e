r"""The reparametrised moment system shared by :func:`~transformer_pde.gaussian.solve` and
:func:`~transformer_pde.gaussian.solve_batch`, the classification of terminal states, and
the pieces of :func:`~transformer_pde.gaussian.solve`'s ``solve_ivp`` integrator on it
(terminal events, the guarded right-hand side, the states at the output times).

The state of a member is ``[t, rho, G (d*d, row-major), alpha_tilde (d)]``: the covariance
factor :math:`F = e^{\rho}G` (:math:`\Sigma = FF^\top`, :math:`\|G\|_F = 1`), the mean
:math:`\alpha = \varphi\tilde\alpha` and the time :math:`t`, all functions of the
reparametrised time :math:`s` (see :mod:`transformer_pde.gaussian`).

Not part of the package's public API: the names are shared by the sibling modules only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import validation
from ..attention import Attention
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate.breakpoints import jump_times, layer_tables
from ..results import Status
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
        for j, (i, tt) in enumerate(zip(idx, t, strict=True)):
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
        return stack_params([a.at(float(tt)) for a, tt in zip(sel, tc, strict=True)])

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


def classify_members(sysm: MomentSystem, Y: np.ndarray, idx: np.ndarray, converge_tol: float,
                     reason: np.ndarray, Yc: np.ndarray | None = None,
                     convergence: str = "auto", creason: np.ndarray | None = None,
                     log_thr: float = math.inf) -> tuple[list, np.ndarray, np.ndarray, list]:
    """Classify terminal states (see :mod:`transformer_pde.gaussian`, *Statuses*).

    ``reason`` per member: 0 = ``t_max`` reached, 1 = size threshold, 2 = converged
    (relative criterion), 3 = step budget spent, 5 = converged (algebraic approach), 6 =
    converged (absolute or trace criterion), 7 = the right-hand side overflowed (non-finite).
    ``Yc``: for members with reason 1, the state
    continued past the drawing threshold (:data:`CLASSIFY_SIZE`), where the blow-up test,
    :math:`T^*` and the limit shape are measured (defaults to ``Y``); ``creason`` is how
    that continuation ended (codes as ``reason``; -1: not continued): a continuation that
    converged (a transient crossing of the threshold ``exp(log_thr)``) makes the member
    ``converged``, one that spent its budget below the threshold ``max_steps``.  Returns
    ``(statuses, T*, limits, messages)``; statuses are :class:`~transformer_pde.results.Status`.
    """
    B = Y.shape[0]
    status = [Status.OK] * B
    Tstar = np.full(B, np.nan)
    t, mean, S = sysm.moments(Y, idx)
    tr = np.trace(S, axis1=1, axis2=2)
    limit = S / np.where(tr > 0, tr, 1.0)[:, None, None]
    msgs = [""] * B
    if creason is None:
        creason = np.full(B, -1)
    crit = {"absolute": f"|Sigma'|_F <= {converge_tol:g}",
            "trace": f"tr Sigma <= {converge_tol:g}", "relative": "relative rates <= "
            f"{converge_tol:g}"}.get(convergence, "relative rates or algebraic approach")
    above = reason == 1
    back = above & np.isin(creason, (2, 5, 6))
    if Yc is not None:
        back_b = above & (creason == 3)
        if np.any(back_b):
            back_b[back_b] = sysm.log_size(Yc[back_b], idx[back_b]) < log_thr
        tcl = Yc[:, 0].tolist()
        for i in np.nonzero(back | back_b)[0].tolist():
            c_ = "converged" if back[i] else "undecided: step budget spent"
            status[i] = Status.CONVERGED if back[i] else Status.MAX_STEPS
            msgs[i] = (f"crossed blowup_threshold transiently at t={t[i]:.10g} (the path stops "
                       f"there); continued without output: {c_} at t={tcl[i]:.6g}"
                       + (f" ({crit})" if back[i] else ""))
        back = back | back_b
        if np.any(back):
            _, _, Sc = sysm.moments(Yc[back], idx[back])
            trc = np.trace(Sc, axis1=1, axis2=2)
            limit[back] = Sc / np.where(trc > 0, trc, 1.0)[:, None, None]
    big = np.nonzero(above & ~back)[0]
    if big.size:
        _classify_growth(sysm, Y if Yc is None else Yc, idx, big, t, Yc is None, status,
                         Tstar, limit, msgs)
    alg = (f"algebraic approach to a stationary state (the rate decays like t^-k with "
           f"k >= {ALG_K_MIN:g}, k steady to {ALG_STEADY:g} while t doubled)")
    ends = {2: (Status.CONVERGED, f"converged at t={{:.6g}} (relative rates <= {converge_tol:g})"),
            5: (Status.CONVERGED, "converged at t={:.6g}: " + alg),
            6: (Status.CONVERGED, f"converged at t={{:.6g}} ({crit})"),
            7: (Status.NONFINITE, "the moment equations overflowed (a non-finite right-hand "
                                  "side) after t={:.6g}; the last finite state is kept"),
            3: (Status.MAX_STEPS, "stopped at t={:.6g}: step budget spent"),
            0: (None, "reached t={:.6g} undecided (no blow-up, divergence or convergence)")}
    for code, (st, text) in ends.items():
        for i in np.nonzero(reason == code)[0]:
            if st is not None:
                status[i] = st
            msgs[i] = text.format(t[i])
    return status, Tstar, limit, msgs


def _classify_growth(sysm: MomentSystem, Ym: np.ndarray, idx: np.ndarray, big: np.ndarray,
                     t: np.ndarray, at_threshold: bool, status: list, Tstar: np.ndarray,
                     limit: np.ndarray, msgs: list) -> None:
    """Blow-up or divergence of the members ``big`` (rows of ``Ym``, the states where the
    growth is measured; ``t`` the times at the drawing threshold) for
    :func:`classify_members`: fills ``status``, ``Tstar``, ``limit`` and ``msgs`` in place.
    ``at_threshold``: the growth is measured on the threshold itself (no continuation)."""
    Yb = Ym[big]
    tc = Yb[:, 0]
    tau, q, info = sysm.tau_q(Yb, idx[big])
    qmax = sysm.q_max(tc, idx[big])
    # a singularity of the law has q -> 1/p <= q_max: a larger q is a transient of
    # oscillating growth (l2 with singular K can grow so), not a blow-up
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
    shape_now = Sm / trj_[:, None, None]
    lim_b = sym(shape_now + np.nan_to_num(rem)[:, None, None] * dhat)
    sel = big[isb]
    Tstar[sel] = tc[isb] + rem[isb]
    limit[big[pos]] = shape_now[pos]
    lsel = isb & pos
    # the linear extrapolation is a small correction when the shape moves like T* - t;
    # when it moves faster (e.g. like (T* - t)^g, g < 1, possible with random V) it can leave
    # the positive semi-definite cone: then the shape measured at the continuation size
    # (CLASSIFY_SIZE) is the limit
    not_psd = np.zeros(big.size, dtype=bool)
    if np.any(lsel):
        not_psd[lsel] = np.linalg.eigvalsh(lim_b[lsel])[:, 0] < -PSD_TOL
    lsel &= ~not_psd
    limit[big[lsel]] = lim_b[lsel]
    # messages from Python floats (formatting NumPy scalars is several times slower)
    nu_l, q_l, qm_l = info["nu"].tolist(), q.tolist(), qmax.tolist()
    t_l, T_l, tc_l = t.tolist(), Tstar.tolist(), tc.tolist()
    for j, i in enumerate(big.tolist()):
        at = (f"size {nu_l[j]:.3g} at t={tc_l[j]:.10g}" if at_threshold else
              f"threshold reached at t={t_l[i]:.10g}; measured at size {nu_l[j]:.3g}, "
              f"t={tc_l[j]:.12g}")
        if isb[j]:
            status[i] = Status.BLOWUP
            msgs[i] = (f"finite-time blow-up: {at}, q={q_l[j]:.4g} (power law exponent "
                       f"{1 / q_l[j]:.4g}), T*={T_l[i]:.12g}")
            if not_psd[j]:
                msgs[i] += ("; limit: the shape at the measuring size (its linear "
                            "extrapolation to T* is not positive semi-definite)")
        else:
            status[i] = Status.DIVERGING
            why = (f"the {sysm.kind} law has bounded M (no finite-time blow-up)"
                   if qm_l[j] <= 0 else f"q={q_l[j]:.3g} <= {0.5 * qm_l[j]:g}"
                   if not q_l[j] > 0.5 * qm_l[j] else
                   f"q={q_l[j]:.3g} > {1.5 * qm_l[j]:g}: faster than the law allows "
                   f"(oscillating growth)")
            msgs[i] = f"diverging without finite-time blow-up: {at}, {why}"


#: Size (tr Sigma, + |alpha|^2 for ``linear``) up to which a run that reached its
#: ``blowup_threshold`` is continued (without output) to measure the blow-up exponent,
#: :math:`T^*` and the limit shape, so that they do not depend on the drawing threshold.
CLASSIFY_SIZE = 1e10
#: Smallest eigenvalue (of a trace-one matrix) below which an extrapolated limit shape is
#: not positive semi-definite (rounding of extrapolated 1e-10-accurate states stays far below).
PSD_TOL = 1e-6
#: Algebraic convergence: the rate :math:`R \propto t^{-k}` with :math:`k \ge` ``ALG_K_MIN``
#: (integrable: the state has a limit) and ``k`` steady to ``ALG_STEADY`` (relative) while
#: ``t`` doubles.
ALG_K_MIN = 1.05
ALG_STEADY = 1e-3
#: Convergence criteria of the solvers and their codes in the compiled kernel.
CONVERGENCE_MODES = {"relative": 0, "auto": 1, "absolute": 2, "trace": 3}


def conv_rates(sysm: MomentSystem, Y: np.ndarray, idx: np.ndarray, atol: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    r"""``(rel, R, |Sigma'|_F, tr Sigma)`` per member: the relative rate of
    :meth:`MomentSystem.conv_measure`, :math:`R = \|\Sigma'\|_F + \|(\alpha\alpha^\top)'\|_F`
    (the rate tested for algebraic convergence), the absolute covariance rate and the trace."""
    _, info = sysm.rhs(Y, idx, full=True)
    S, M, mean, dmean = info["S"], info["M"], info["mean"], info["dmean"]
    dS = M @ S
    dS = dS + np.swapaxes(dS, 1, 2)
    nS = np.sqrt(np.sum(S * S, axis=(1, 2)))
    ndS = np.sqrt(np.sum(dS * dS, axis=(1, 2)))
    rS = ndS / (nS + atol)
    rm = np.linalg.norm(dmean, axis=1) / (np.linalg.norm(mean, axis=1) + np.sqrt(nS) + atol)
    dmm = dmean[:, :, None] * mean[:, None, :]
    dmm = dmm + np.swapaxes(dmm, 1, 2)
    R = ndS + np.sqrt(np.sum(dmm * dmm, axis=(1, 2)))
    return np.maximum(rS, rm), R, ndS, np.trace(S, axis1=1, axis2=2)


def converged_codes(mode: str, rates: tuple, converge_tol: float, t: np.ndarray,
                    alg: np.ndarray) -> np.ndarray:
    """Convergence code per member (0: not converged, 2 relative, 5 algebraic, 6 absolute
    or trace) for criterion ``mode`` from :func:`conv_rates`; ``alg`` (n, 4) = [log t,
    log R, k anchor, t anchor] is the algebraic detector's history, updated in place (only
    for times later than the last one seen)."""
    rel, R, ndS, trS = rates
    if mode == "absolute":
        return np.where(ndS <= converge_tol, 6, 0)
    if mode == "trace":
        return np.where(trS <= converge_tol, 6, 0)
    code = np.where(rel <= converge_tol, 2, 0)
    if mode != "auto":
        return code
    with np.errstate(divide="ignore", invalid="ignore"):
        lt = np.where(t > 0, np.log(np.where(t > 0, t, 1.0)), -np.inf)
        lr = np.where(R > 0, np.log(np.where(R > 0, R, 1.0)), -np.inf)
        fresh = ~np.isfinite(alg[:, 0])
        later = fresh | (lt > alg[:, 0])
        ok = later & np.isfinite(lt) & np.isfinite(lr)
        have = ok & ~fresh
        k = np.where(have, -(lr - alg[:, 1]) / np.where(have, lt - alg[:, 0], 1.0), -np.inf)
        steep = have & (k >= ALG_K_MIN)
        steady = steep & np.isfinite(alg[:, 2]) & (np.abs(k - alg[:, 2]) <= ALG_STEADY * alg[:, 2])
        hit = steady & (t >= 2.0 * alg[:, 3])
        reanchor = steep & ~steady
        alg[reanchor, 2] = k[reanchor]
        alg[reanchor, 3] = t[reanchor]
        drop = have & ~steep
        alg[drop, 2] = np.inf
        alg[ok, 0] = lt[ok]
        alg[ok, 1] = lr[ok]
    return np.where(code > 0, code, np.where(hit, 5, 0))


def layer_breakpoints(atts: Sequence[Attention], t_start: float, t_end: float) -> np.ndarray:
    """Jump times of the piecewise-constant parameters of ``atts`` in ``(t_start, t_end)``
    (:func:`transformer_pde.integrate.breakpoints.jump_times`)."""
    return jump_times(layer_tables(list(atts)), t_start, t_end)


def check_solver_args(t_max: float, rtol: float, atol: float, blowup_threshold: float,
                      converge_tol: float, convergence: str = "auto") -> None:
    for n, v in (("t_max", t_max), ("rtol", rtol), ("atol", atol),
                 ("blowup_threshold", blowup_threshold), ("converge_tol", converge_tol)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.floating,
                                                                   np.integer)):
            raise ArgumentTypeError(f"{n} must be a real number, got {v!r:.60}")
        if not (np.isfinite(v) and v > 0):
            raise ArgumentError(f"{n} must be a finite number > 0, got {v!r}")
    if rtol < 1e-14:
        raise ArgumentError(f"rtol must be >= 1e-14, got {rtol}")
    if not isinstance(convergence, str) or convergence not in CONVERGENCE_MODES:
        raise ArgumentError(f"convergence must be one of {sorted(CONVERGENCE_MODES)}, "
                            f"got {convergence!r}")


def check_t_eval(t_eval: Any, t_max: float) -> np.ndarray | None:
    """``t_eval`` as a float array: 1-D (a scalar is one time), finite, real, strictly
    increasing, in ``[0, t_max]`` (``None`` passes through)."""
    if t_eval is None:
        return None
    if isinstance(t_eval, (bool, np.bool_)) or (isinstance(t_eval, np.ndarray)
                                                and t_eval.dtype == bool):
        raise ArgumentTypeError(f"t_eval must be real times, got {t_eval!r:.60}")
    te = validation.finite_array("t_eval", t_eval)
    if te.ndim > 1:
        raise ArgumentError(f"t_eval must be one-dimensional, got shape {te.shape}")
    te = te.ravel()
    if te.size > 1 and not np.all(np.diff(te) > 0):
        i = int(np.argmin(np.diff(te) > 0))
        raise ArgumentError(f"t_eval must be strictly increasing, got t_eval[{i}] = {te[i]!r} "
                            f">= t_eval[{i + 1}] = {te[i + 1]!r}")
    if te.size and (te[0] < 0 or te[-1] > t_max):
        raise ArgumentError(f"t_eval must lie in [0, t_max] = [0, {t_max:g}], got "
                            f"[{te[0]:g}, {te[-1]:g}]")
    return te


def check_flag(name: str, value: Any) -> bool:
    """A bool (Python or NumPy); anything else raises :class:`ArgumentTypeError`."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a bool (True or False), got {value!r:.60}")
    return bool(value)


# ------------------------------------------------------------ solve's integrator pieces
def conv_events(sysm: MomentSystem, atol: float, convergence: str, converge_tol: float):
    """The convergence events of :func:`~.trajectory.solve_from_factor`: ``(ev_conv, ev_alg, alg_hit)``.

    ``ev_conv`` is a smooth terminal event (relative rate, or the absolute / trace
    criterion); ``ev_alg`` the algebraic test of ``convergence="auto"``, stateful: called
    once per accepted step (and in root finding only after another event fired), and once
    the test passes at a step end a function of s only that crosses zero just before that
    step's end (``alg_hit[0]``)."""
    idx = np.zeros(1, dtype=int)
    alg = np.full((1, 4), np.inf)
    alg_hit = [math.inf]
    if converge_tol <= 0.0:    # no convergence test (the output continuation)
        def ev_conv(_s, y):
            return 1.0
    elif convergence in ("absolute", "trace"):
        j = 2 if convergence == "absolute" else 3

        def ev_conv(_s, y):
            r = conv_rates(sysm, y[None], idx, atol)[j][0]
            return math.log(max(float(r), 1e-300)) - math.log(converge_tol)
    else:
        def ev_conv(_s, y):
            return math.log(max(float(sysm.conv_measure(y[None], idx, atol)[0]), 1e-300)) \
                - math.log(converge_tol)
    ev_conv.terminal = True
    ev_conv.direction = -1

    def ev_alg(s_, y):
        if convergence == "auto" and alg_hit[0] == math.inf and int(converged_codes(
                convergence, conv_rates(sysm, y[None], idx, atol), converge_tol, y[None, 0],
                alg)[0]) == 5:
            alg_hit[0] = s_ - 1e-12 * max(1.0, abs(s_))
        return alg_hit[0] - s_ if alg_hit[0] < math.inf else 1.0
    ev_alg.terminal = True
    return ev_conv, ev_alg, alg_hit


class NonFinite(Exception):
    """The moment equations' right-hand side overflowed (internal)."""


def checked_rhs(sysm: MomentSystem, idx: np.ndarray):
    """The right-hand side for ``solve_ivp``, raising :class:`NonFinite` when it is not
    finite (an overflow would otherwise shrink the step forever or fail obscurely)."""
    def fun(_s, y):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            f = sysm.rhs(y[None], idx)[0]
        if not np.all(np.isfinite(f)):
            raise NonFinite
        return f
    return fun


def set_window(sysm: MomentSystem, t_lo: float, stop: float) -> None:
    """Clamp the parameter evaluation of ``sysm`` to the interior of the segment
    ``[t_lo, stop]`` (a relative margin of 1e-7, at most a quarter of the segment)."""
    eta = 1e-7 * max(1.0, abs(stop))
    sysm.lo[:] = t_lo + min(eta, 0.25 * (stop - t_lo))
    sysm.hi[:] = stop - min(eta, 0.25 * (stop - t_lo))


def time_event(stop: float):
    """Terminal event of ``solve_ivp``: ``t`` crosses ``stop`` upwards."""
    def ev_time(_s, y):
        return y[0] - stop
    ev_time.terminal = True
    ev_time.direction = 1
    return ev_time


def budget_event(budget: int):
    """Terminal event of ``solve_ivp`` that fires once ``budget`` accepted steps are spent.

    A function of s only (root finding re-evaluates it): positive until the step budget is
    spent, then it crosses zero just before the current step's end."""
    count = [0, math.inf]

    def ev_budget(s_, y):
        count[0] += 1
        if count[0] > budget and count[1] == math.inf:
            count[1] = s_ - 1e-12 * max(1.0, abs(s_))
        return count[1] - s_ if count[1] < math.inf else 1.0
    ev_budget.terminal = True
    return ev_budget


def reported_states(sysm: MomentSystem, Y: np.ndarray, seg_y: list, sols: list,
                    t_eval: Any, t0: float, t_end: float | None = None,
                    hold: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(times, means, covs)`` of :func:`~.trajectory.solve_from_factor`'s output: the accepted steps
    (``seg_y``, or the final state ``Y`` alone) without ``t_eval``, else the states at the
    times of ``t_eval`` in ``[t0, t_end]`` (default ``Y[0]``) from the dense outputs
    ``sols``; times that no dense output covers take the stationary state ``hold`` (or
    ``Y`` at ``t0``: a run stationary from its start)."""
    if not seg_y:
        seg_y = [Y[None]]
    Yall = np.vstack(seg_y)
    if t_eval is None:
        return sysm.moments(Yall, np.zeros(len(Yall), int))
    te = np.sort(np.asarray(t_eval, float).ravel())
    t_end = float(Y[0]) if t_end is None else t_end
    te = te[(te >= t0) & (te <= t_end)]
    Ye = np.full((te.size, sysm.n), np.nan)
    done = np.zeros(te.size, bool)
    for sol, lo_t, hi_t in sols:
        sel = ~done & (te >= lo_t) & (te <= hi_t)
        if np.any(sel):
            Ye[sel] = invert_time(sol.sol, sel, te)
            done |= sel
    rest = ~done & (te == t0)       # no step taken: the run's only state is its start
    Ye[rest] = Y
    if hold is not None:
        Ye[~done & ~rest] = hold
    ok = np.isfinite(Ye[:, 0])
    te, Ye = te[ok], Ye[ok]
    _, means, covs = sysm.moments(Ye, np.zeros(len(Ye), int))
    return te, means, covs


def invert_time(dense, sel: np.ndarray, te: np.ndarray) -> np.ndarray:
    """States at times ``te[sel]`` from a dense output in ``s`` (bisection; t(s) increasing)."""
    targets = te[sel]
    lo = np.full(targets.shape, dense.t_min)
    hi = np.full(targets.shape, dense.t_max)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        tm = dense(mid)[0]
        below = tm < targets
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
        if np.all(hi - lo <= 4e-16 * np.maximum(np.abs(hi), 1.0)):
            break
    Ys = np.atleast_2d(dense(0.5 * (lo + hi)).T)
    Ys[:, 0] = targets
    return Ys
