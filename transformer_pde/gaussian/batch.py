r"""Many Gaussian initial conditions at once: :func:`solve_batch` and :class:`GaussianBatch`."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..attention import Attention
from . import kernels
from .affine import check_attention, check_mean_cov, psd_factor
from .system import MomentSystem, check_solver_args, classify, layer_breakpoints
from .trajectory import solve_from_factor

__all__ = ["GaussianBatch", "solve_batch"]

logger = logging.getLogger(__name__)

STATUSES = ("converged", "blowup", "diverging", "running")

_STIFF_STEPS_BATCH = 4000  # step attempts per member of solve_batch before the Radau hand-off


@dataclass
class GaussianBatch:
    """Result of :func:`solve_batch` (``B`` members).

    Attributes
    ----------
    status : ndarray (B,) of str
    blowup_time : ndarray (B,)  (``nan`` unless blow-up)
    t_final : ndarray (B,)
    means, covs : ndarray (B, d), (B, d, d)
        Final states (at the blow-up threshold for blow-ups).
    limit : ndarray (B, d, d)
        :math:`\\Sigma/\\operatorname{tr}\\Sigma`, extrapolated to :math:`T^*` on blow-up.
    n_steps : ndarray (B,)
        Accepted explicit steps per member (members handed to Radau add ``nfev // 8``).
    t_eval : ndarray (T,) or None
    traj_means, traj_covs : ndarray (B, T, d), (B, T, d, d) or None
        States at ``t_eval`` (NaN after a member terminated).
    messages : list of str (B)
        Per-member explanation of the status.
    """

    status: np.ndarray
    blowup_time: np.ndarray
    t_final: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    limit: np.ndarray
    n_steps: np.ndarray
    t_eval: np.ndarray | None = None
    traj_means: np.ndarray | None = None
    traj_covs: np.ndarray | None = None
    messages: list = field(default_factory=list)

    def __len__(self) -> int:
        return self.status.shape[0]

    def counts(self) -> dict[str, int]:
        """Number of members per status."""
        return {s: int(np.sum(self.status == s)) for s in STATUSES}



# Dormand-Prince 5(4) tableau (FSAL); local extrapolation with the 5th-order solution.
_DP_A = [
    [],
    [1 / 5],
    [3 / 40, 9 / 40],
    [44 / 45, -56 / 15, 32 / 9],
    [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
    [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
]
_DP_B = np.array([35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84])
_DP_E = np.array([71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40])



def solve_batch(att: Attention | Sequence[Attention], means0: Any, covs0: Any, *, t_max: float,
                rtol: float = 1e-10, atol: float = 1e-12, blowup_threshold: float = 1e8,
                converge_tol: float = 1e-10, t_eval: Any = None, max_steps: int = 100_000,
                use_numba: bool = True) -> GaussianBatch:
    r"""Integrate many Gaussian initial conditions (and optionally parameter sets) together.

    All members are advanced simultaneously by one vectorised adaptive Dormand--Prince 5(4)
    integrator (DOP853 on the numba path, see ``use_numba``) on the reparametrised system of
    :mod:`transformer_pde.gaussian`, **with a step size, error control and event handling per member** (NumPy arrays of shape ``(B, ...)``; members
    that terminate leave the active set).  Members land exactly (to :math:`10^{-12}` relative)
    on ``t_eval`` points, :class:`Layers` breakpoints and ``t_max`` by secant-adjusted steps in
    :math:`s`.  Statuses and :math:`T^*` follow :func:`solve` (same classification), and the
    results agree with :func:`solve` member by member to about ``1e3 * rtol``.

    Parameters
    ----------
    att : Attention or sequence of B Attention
        One specification for all members, or one per member (same kind, ``d`` and heads).
    means0 : array_like (B, d)
    covs0 : array_like (B, d, d)
    t_max, rtol, atol, blowup_threshold, converge_tol
        As in :func:`solve`.
    t_eval : array_like (T,), optional
        Common output times; ``traj_means`` / ``traj_covs`` hold NaN after a member terminated.
    max_steps : int
        Step attempts per member of the explicit method, capped at 4000; a member that needs
        more (typically a stiff one: a collapsing direction of :math:`\Sigma` decaying much
        faster than the rest evolves) is continued alone with the implicit Radau method (see :func:`solve`).
    use_numba : bool
        For ``softmax`` / ``linear`` with constant parameters, run the same per-member
        algorithm compiled with numba, with the 8th-order DOP853 pair instead of
        Dormand--Prince 5(4) (about 0.6x the right-hand-side evaluations at ``rtol = 1e-10``),
        one member after the other, or, from 256 members on, in parallel over members
        (``prange``, numba's thread count; members are independent, so the results are
        identical).  The first call compiles (~10 s, ~20 s with the parallel kernel; cached on
        disk).  Otherwise, or with ``False`` (or without numba), the NumPy implementation.

    Returns
    -------
    GaussianBatch
    """
    if isinstance(att, Attention):
        atts = [check_attention(att)]
    else:
        atts = [check_attention(a) for a in att]
        if not atts:
            raise ValueError("att must be an Attention or a non-empty sequence of them")
        a0 = atts[0]
        for i, a in enumerate(atts):
            if (a.kind, a.d, a.heads, a.W_O is None) != (a0.kind, a0.d, a0.heads, a0.W_O is None):
                raise ValueError(f"att[{i}] differs from att[0] in kind, d, heads or W_O presence")
    d = atts[0].d
    m0, c0 = check_mean_cov(means0, covs0, d, "means0", "covs0", batch=True)
    B = m0.shape[0]
    if len(atts) > 1 and len(atts) != B:
        raise ValueError(f"att has {len(atts)} members but means0 has {B}")
    check_solver_args(t_max, rtol, atol, blowup_threshold, converge_tol)
    sysm = MomentSystem(atts, B)
    all_idx = np.arange(B)
    Y = sysm.pack(np.zeros(B), m0, psd_factor(c0), all_idx)
    log_thr = math.log(blowup_threshold)
    if np.any(sysm.log_size(Y, all_idx) >= log_thr):
        i = int(np.argmax(sysm.log_size(Y, all_idx)))
        raise ValueError(f"member {i}: the initial size already exceeds blowup_threshold")
    n = sysm.n
    atol_vec = np.full(n, atol)
    atol_vec[1] = rtol

    te = None if t_eval is None else np.unique(np.asarray(t_eval, float).ravel())
    if te is not None:
        te = te[(te >= 0) & (te <= t_max)]
    stops = np.unique(np.concatenate([
        np.asarray(layer_breakpoints(atts, t_max), float),
        np.array([float(t_max)]),
        te[te > 0] if te is not None else np.zeros(0)]))
    traj_m = traj_c = None
    if te is not None:
        traj_m = np.full((B, te.size, d), np.nan)
        traj_c = np.full((B, te.size, d, d), np.nan)
        if te.size and te[0] == 0.0:
            traj_m[:, 0] = m0
            traj_c[:, 0] = c0
    te_pos = {float(v): i for i, v in enumerate(te)} if te is not None else {}
    eval_pos = np.array([te_pos.get(float(v), -1) for v in stops], dtype=np.int64)
    # full states landed on at t_eval (row eval_pos[k] for stop k), NaN until reached; both
    # integrators fill it, the moments are taken once after them
    trY = np.full((B, 1 if te is None else max(te.size, 1), n), np.nan)

    kstop = np.zeros(B, dtype=int)
    t_prev_stop = np.zeros(B)

    def set_window(ia):
        st = stops[kstop[ia]]
        lo = t_prev_stop[ia]
        eta = np.minimum(1e-7 * np.maximum(1.0, np.abs(st)), 0.25 * (st - lo))
        sysm.lo[ia] = lo + eta
        sysm.hi[ia] = st - eta

    set_window(all_idx)
    fast = (use_numba and kernels.AVAILABLE and not sysm.dynamic
            and sysm.kind in ("softmax", "linear"))
    if fast:
        # the compiled kernel does the initial convergence check and step choice per member
        reason, n_steps = kernels.run_compiled(sysm, atts, Y, stops, eval_pos, rtol, atol_vec,
                                               atol, log_thr, converge_tol,
                                               min(max_steps, _STIFF_STEPS_BATCH), trY)
        active = np.zeros(B, dtype=bool)
    else:
        f = sysm.rhs(Y, all_idx)
        conv0 = sysm.conv_measure(Y, all_idx, atol) <= converge_tol
        reason = np.where(conv0, 2, -1)
        active = ~conv0
        # initial step (Hairer-Wanner heuristic, vectorised)
        scale = atol_vec + rtol * np.abs(Y)
        d0 = np.sqrt(np.mean((Y / scale) ** 2, axis=1))
        d1 = np.sqrt(np.mean((f / scale) ** 2, axis=1))
        h = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.maximum(d1, 1e-300))
        h = np.minimum(h, 0.1)
        n_steps = np.zeros(B, dtype=int)
        n_att = np.zeros(B, dtype=int)
    land_tol = 1e-12

    # the NumPy integrator (no member is active after the numba path)
    while np.any(active):
        ia = np.nonzero(active)[0]
        yA, fA, hA = Y[ia], f[ia], h[ia]
        st = stops[kstop[ia]]
        gap = st - yA[:, 0]
        h_aim = gap / fA[:, 0]                  # dt/ds = fA[:,0]
        aiming = h_aim <= hA
        hA = np.where(aiming, h_aim, hA)
        K = [fA]
        for i in range(1, 6):
            acc = np.zeros_like(yA)
            for j, a in enumerate(_DP_A[i]):
                if a != 0.0:
                    acc += a * K[j]
            K.append(sysm.rhs(yA + hA[:, None] * acc, ia))
        acc = np.zeros_like(yA)
        for j in range(6):
            if _DP_B[j] != 0.0:
                acc += _DP_B[j] * K[j]
        ynew = yA + hA[:, None] * acc
        fnew = sysm.rhs(ynew, ia)
        K.append(fnew)
        err = np.zeros_like(yA)
        for j in range(7):
            if _DP_E[j] != 0.0:
                err += _DP_E[j] * K[j]
        err *= hA[:, None]
        sc = atol_vec + rtol * np.maximum(np.abs(yA), np.abs(ynew))
        en = np.sqrt(np.mean((err / sc) ** 2, axis=1))
        en = np.where(np.all(np.isfinite(ynew), axis=1), en, np.inf)
        ok = en <= 1.0
        tn = ynew[:, 0]
        over = ok & (tn > st + land_tol * np.maximum(1.0, np.abs(st)))
        landed = ok & ~over & aiming & (np.abs(tn - st) <= land_tol * np.maximum(1.0, np.abs(st)))
        accept = ok & ~over
        fac = np.where(en == 0, 5.0, np.clip(0.9 * np.where(en > 0, en, 1.0) ** -0.2, 0.2, 5.0))
        fac = np.where(ok, fac, np.minimum(fac, 0.9))
        h_new = hA * fac
        # overshoot of a stop: secant correction in s
        h_new = np.where(over, hA * gap / np.maximum(tn - yA[:, 0], 1e-300), h_new)
        # after an aimed, accepted step keep the previous (larger) proposal
        h_new = np.where(accept & aiming, np.maximum(h[ia], h_new), h_new)
        n_att[ia] += 1
        n_steps[ia] += accept
        acc_i = ia[accept]
        Y[acc_i] = ynew[accept]
        f[acc_i] = fnew[accept]
        h[ia] = h_new
        # landings
        for j in np.nonzero(landed)[0]:
            i = ia[j]
            Y[i, 0] = stops[kstop[i]]
            tt = float(stops[kstop[i]])
            if eval_pos[kstop[i]] >= 0:
                trY[i, eval_pos[kstop[i]]] = Y[i]
            t_prev_stop[i] = tt
            if kstop[i] == stops.size - 1:
                reason[i] = 0
                active[i] = False
            else:
                kstop[i] += 1
                set_window(np.array([i]))
                f[i] = sysm.rhs(Y[i:i + 1], np.array([i]))[0]
        # events on accepted, still-active members
        chk = acc_i[active[acc_i]]
        if chk.size:
            big = sysm.log_size(Y[chk], chk) >= log_thr
            reason[chk[big]] = 1
            active[chk[big]] = False
            rest = chk[~big]
            if rest.size:
                conv = sysm.conv_measure(Y[rest], rest, atol) <= converge_tol
                reason[rest[conv]] = 2
                active[rest[conv]] = False
        stiff = active & (n_att >= min(max_steps, _STIFF_STEPS_BATCH))
        if np.any(stiff):
            reason[stiff] = 3
            active[stiff] = False

    if te is not None:
        bi, ti = np.nonzero(np.isfinite(trY[:, :, 0]))
        if bi.size:
            _, mm, SS = sysm.moments(trY[bi, ti], bi)
            traj_m[bi, ti] = mm
            traj_c[bi, ti] = SS

    status, Tstar, limit, msgs = classify(sysm, Y, all_idx, converge_tol,
                                         np.where(reason == 3, 0, reason))
    t_fin, means, covs = sysm.moments(Y, all_idx)
    # members that became stiff: continue one by one with the implicit Radau method
    for i in np.nonzero(reason == 3)[0]:
        logger.info("solve_batch: member %d stiff at t=%.6g, continuing with Radau", i, t_fin[i])
        a_i = atts[i] if len(atts) > 1 else atts[0]
        F_i = np.exp(Y[i, 1]) * Y[i, 2:2 + d * d].reshape(d, d)
        rem = None if te is None else te[te > t_fin[i]]
        tr = solve_from_factor(a_i, float(t_fin[i]), means[i], F_i, t_max=float(t_max), rtol=rtol,
                         atol=atol, blowup_threshold=blowup_threshold,
                         converge_tol=converge_tol, t_eval=rem, method="Radau")
        status[i], Tstar[i], limit[i], msgs[i] = tr.status, tr.blowup_time, tr.limit, tr.message
        t_fin[i] = tr.t_final
        if te is not None and len(tr.times):
            pos = np.searchsorted(te, tr.times)
            traj_m[i, pos] = tr.means
            traj_c[i, pos] = tr.covs
        means[i], covs[i] = tr.final_mean, tr.final_cov
        n_steps[i] += tr.nfev // 8
    return GaussianBatch(np.array(status), Tstar, t_fin, means, covs, limit, n_steps, te,
                         traj_m, traj_c, msgs)

