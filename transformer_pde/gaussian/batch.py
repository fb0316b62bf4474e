r"""Many Gaussian initial conditions at once: :func:`solve_batch` and :class:`GaussianBatch`."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..attention import Attention
from .. import validation
from ..errors import ArgumentError, ArgumentTypeError, EarlyStopWarning
from ..integrate.controller import PIController, initial_step
from ..integrate.tableaux import DOPRI5
from ..results import ResultKind, Status
from . import kernels
from .affine import check_attention, check_mean_cov, psd_factor
from .system import (
    CLASSIFY_SIZE,
    CONVERGENCE_MODES,
    MomentSystem,
    check_flag,
    check_solver_args,
    check_t_eval,
    classify,
    conv_rates,
    converged_codes,
    layer_breakpoints,
)
from .trajectory import GaussianTrajectory, solve_from_factor

__all__ = ["GaussianBatch", "solve_batch"]

logger = logging.getLogger(__name__)

_STIFF_STEPS_BATCH = 4000  # step attempts per member of solve_batch before the Radau hand-off
_LAND = 1e-12              # landing tolerance on t (relative) and on log(size)


@dataclass
class GaussianBatch:
    r"""Result of :func:`solve_batch` (``B`` members).

    Attributes
    ----------
    status : ndarray (B,) of str
        Values of :class:`~transformer_pde.results.Status` (``"ok"``, ``"converged"``,
        ``"blowup"``, ``"diverging"``, ``"max_steps"``), so ``res.status == "blowup"``
        selects members.
    blowup_time : ndarray (B,)  (``nan`` unless blow-up)
    t_final : ndarray (B,)
        Time of the final state (on the blow-up threshold for blow-ups).
    means, covs : ndarray (B, d), (B, d, d)
        Final states (on the blow-up threshold, :math:`\nu = ` ``blowup_threshold`` to
        1e-12 relative, for members that reached it).
    limit : ndarray (B, d, d)
        :math:`\Sigma/\operatorname{tr}\Sigma`, extrapolated to :math:`T^*` on blow-up
        (linearly from the continuation size; where that leaves the positive semi-definite
        cone, the shape at that size, and the member's message says so).
    n_steps : ndarray (B,)
        Accepted explicit steps per member up to the final state (members handed to Radau
        add ``nfev // 8``).
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

    #: :class:`~transformer_pde.results.ResultKind` of the result protocol
    result_kind: ClassVar[ResultKind] = ResultKind.GAUSSIAN_BATCH

    def __len__(self) -> int:
        return self.status.shape[0]

    @property
    def success(self) -> np.ndarray:
        """Per member: :attr:`Status.success <transformer_pde.results.Status.success>`."""
        return np.array([Status(s).success for s in self.status], dtype=bool)

    @property
    def times(self) -> np.ndarray:
        """The common output times ``t_eval`` (empty without ``t_eval``)."""
        return np.zeros(0) if self.t_eval is None else self.t_eval

    @property
    def message(self) -> str:
        """One sentence: the number of members per status."""
        c = {k: v for k, v in self.counts().items() if v}
        return f"{len(self)} members: " + ", ".join(f"{v} {k}" for k, v in c.items())

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """``(means, covs)`` at ``t_eval``, shapes ``(B, T, d)`` and ``(B, T, d, d)`` (NaN
        after a member stopped); raises if the batch was solved without ``t_eval``."""
        if self.t_eval is None:
            raise ArgumentError("moments() needs states at common times: call solve_batch "
                                "with t_eval (the final states are .means and .covs)")
        return self.traj_means, self.traj_covs

    def counts(self) -> dict[str, int]:
        """Number of members per status (every :class:`~transformer_pde.results.Status`)."""
        return {s.value: int(np.sum(self.status == s.value)) for s in Status}

    def __getitem__(self, i: int) -> GaussianTrajectory:
        """Member ``i`` as a :class:`GaussianTrajectory` (its states at ``t_eval`` up to its
        stop, then its final state)."""
        i = int(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"member {i} out of range for a batch of {len(self)}")
        i %= len(self)
        if self.t_eval is not None:
            keep = np.isfinite(self.traj_covs[i, :, 0, 0])
            times, ms, cs = self.t_eval[keep], self.traj_means[i, keep], self.traj_covs[i, keep]
        else:
            times = np.zeros(0)
            ms = np.zeros((0,) + self.means.shape[1:])
            cs = np.zeros((0,) + self.covs.shape[1:])
        if not times.size or times[-1] < self.t_final[i]:
            times = np.append(times, self.t_final[i])
            ms = np.concatenate([ms, self.means[i][None]])
            cs = np.concatenate([cs, self.covs[i][None]])
        return GaussianTrajectory(times, ms, cs, Status(self.status[i]),
                                  float(self.blowup_time[i]), self.limit[i],
                                  float(self.t_final[i]), self.messages[i], 0,
                                  self.means[i], self.covs[i])


def _numpy_advance(sysm: MomentSystem, Y: np.ndarray, ids: np.ndarray, h: np.ndarray,
                   stops: np.ndarray, kstop: np.ndarray, eval_pos: np.ndarray,
                   trY: np.ndarray | None, rtol: float, atol_vec: np.ndarray, atol: float,
                   log_thr: float, convergence: str, converge_tol: float, budget: int,
                   n_steps: np.ndarray, reason: np.ndarray, pi_prev: np.ndarray) -> None:
    """The NumPy integrator: advance members ``ids`` (rows of ``Y``, updated in place) with
    Dormand--Prince 5(4) and per-member step control until the last of ``stops`` (reason 0),
    the size threshold ``exp(log_thr)``, landed on to 1e-12 relative (1), convergence
    (2, 5, 6) or ``budget`` attempts (3).  ``kstop`` is each member's next stop.  Step
    sizes: the package's PI controller (:meth:`PIController.factors
    <transformer_pde.integrate.controller.PIController.factors>`, exponents from the
    pair's error order), one history per member in ``pi_prev`` (updated in place)."""
    B = Y.shape[0]
    tab = DOPRI5
    ctrl = PIController(tab.error_order)
    ns = tab.n_stages
    t_prev_stop = np.where(kstop > 0, stops[np.maximum(kstop - 1, 0)], 0.0)
    t_prev_stop = np.minimum(t_prev_stop, Y[:, 0])
    alg = np.full((B, 4), np.inf)
    n_att = np.zeros(B, dtype=int)
    h_ctrl = h.copy()
    secant = np.zeros(B, dtype=bool)
    sz_land = np.zeros(B, dtype=bool)    # landing on the size threshold (after an overshoot)

    def set_window(ia):
        st = stops[kstop[ia]]
        lo = t_prev_stop[ia]
        fin = np.isfinite(st)
        st_ = np.where(fin, st, lo + 1.0)
        eta = np.minimum(1e-7 * np.maximum(1.0, np.abs(st_)), 0.25 * (st_ - lo))
        sysm.lo[ia] = lo + eta
        sysm.hi[ia] = np.where(fin, st_ - eta, np.inf)

    active = np.zeros(B, dtype=bool)
    active[ids] = True
    set_window(ids)
    f = np.zeros_like(Y)
    f[ids] = sysm.rhs(Y[ids], ids)
    lsz = np.zeros(B)
    lsz[ids] = sysm.log_size(Y[ids], ids)
    while np.any(active):
        ia = np.nonzero(active)[0]
        yA, fA, hA = Y[ia], f[ia], h[ia]
        st = stops[kstop[ia]]
        gap = st - yA[:, 0]
        h_aim = gap / fA[:, 0]                  # dt/ds = fA[:,0]
        aiming = h_aim <= hA
        hA = np.where(aiming, h_aim, hA)
        K = [fA]
        for i in range(1, ns):
            acc = np.zeros_like(yA)
            for j in range(i):
                a = tab.A[i, j]
                if a != 0.0:
                    acc += a * K[j]
            K.append(sysm.rhs(yA + hA[:, None] * acc, ia))
        acc = np.zeros_like(yA)
        for j in range(ns):
            if tab.b[j] != 0.0:
                acc += tab.b[j] * K[j]
        ynew = yA + hA[:, None] * acc
        fnew = sysm.rhs(ynew, ia)
        K.append(fnew)
        err = np.zeros_like(yA)
        for j in range(ns + 1):
            if tab.e[j] != 0.0:
                err += tab.e[j] * K[j]
        err *= hA[:, None]
        sc = atol_vec + rtol * np.maximum(np.abs(yA), np.abs(ynew))
        en = np.sqrt(np.mean((err / sc) ** 2, axis=1))
        en = np.where(np.all(np.isfinite(ynew), axis=1), en, np.inf)
        ok = en <= 1.0
        tn = ynew[:, 0]
        with np.errstate(invalid="ignore"):
            tol_t = _LAND * np.maximum(1.0, np.abs(st))
            over = ok & (tn > st + tol_t)
            landed = ok & ~over & aiming & (np.abs(tn - st) <= tol_t)
        lnew = np.where(ok, sysm.log_size(np.where(ok[:, None], ynew, yA), ia), -np.inf)
        # the size threshold is a stop as well: a step past it is retried with a secant step
        # in s on log(size) (nearly linear in s near a blow-up)
        over_sz = ok & (lnew > log_thr + _LAND)
        accept = ok & ~over & ~over_sz
        # the PI rule; a step that passed the error test but overshot a stop or the
        # threshold is retried with a secant step below (its factor is not used) and does
        # not enter the controller's history
        fac, prev_new = ctrl.factors(en, pi_prev[ia], accept)
        pi_prev[ia] = prev_new
        h_new = hA * fac
        l0 = lsz[ia]
        # (the secant steps are computed for every member and used only where they apply:
        # elsewhere, e.g. after a rejected step with lnew = -inf, they may overflow)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            # overshoot of a stop: secant correction in s
            h_new = np.where(over, hA * gap / np.maximum(tn - yA[:, 0], 1e-300), h_new)
            h_sz = hA * (log_thr - l0) / np.maximum(lnew - l0, 1e-300)
        h_new = np.where(over_sz, np.where(over, np.minimum(h_new, h_sz), h_sz), h_new)
        # after an aimed, accepted step keep the previous (larger) proposal
        h_new = np.where(accept & aiming, np.maximum(h[ia], h_new), h_new)
        # landing on the threshold: once a step overshot it, every accepted step that stays
        # below it is followed by a step aimed with that step's slope of log(size) (the
        # controller's step would overshoot again and cost another retry)
        sz_land[ia] |= over_sz
        aim_sz = accept & sz_land[ia] & (lnew > l0) & (lnew < log_thr - _LAND)
        with np.errstate(divide="ignore", invalid="ignore"):
            h_aim_sz = hA * (log_thr - lnew) / np.where(aim_sz, lnew - l0, 1.0)
        aim_sz &= h_aim_sz < h_new
        h_new = np.where(aim_sz, h_aim_sz, h_new)
        # the error controller's proposal after accepted steps (a continuation restarts from
        # it, not from the secant step that landed on the threshold)
        free = accept & ~aiming & ~secant[ia]
        h_ctrl[ia] = np.where(free, hA * fac, h_ctrl[ia])
        secant[ia] = over | over_sz | aim_sz
        n_att[ia] += 1
        n_steps[ia] += accept
        acc_i = ia[accept]
        Y[acc_i] = ynew[accept]
        f[acc_i] = fnew[accept]
        lsz[acc_i] = lnew[accept]
        h[ia] = h_new
        # landings
        for j in np.nonzero(landed & accept)[0]:
            i = ia[j]
            Y[i, 0] = stops[kstop[i]]
            if trY is not None and eval_pos[kstop[i]] >= 0:
                trY[i, eval_pos[kstop[i]]] = Y[i]
            t_prev_stop[i] = stops[kstop[i]]
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
            big = lsz[chk] >= log_thr - _LAND
            reason[chk[big]] = 1
            active[chk[big]] = False
            rest = chk[~big]
            if rest.size:
                hist = alg[rest]            # a copy: the updated history is written back
                code = converged_codes(convergence, conv_rates(sysm, Y[rest], rest, atol),
                                       converge_tol, Y[rest, 0], hist)
                alg[rest] = hist
                conv = code > 0
                reason[rest[conv]] = code[conv]
                active[rest[conv]] = False
        stiff = active & (n_att >= budget)
        if np.any(stiff):
            reason[stiff] = 3
            active[stiff] = False
    h[ids] = np.maximum(h[ids], h_ctrl[ids])


def solve_batch(att: Attention | Sequence[Attention], means0: Any, covs0: Any, *, t_max: float,
                rtol: float = 1e-10, atol: float = 1e-12, blowup_threshold: float = 1e8,
                converge_tol: float = 1e-10, convergence: str = "auto", t_eval: Any = None,
                max_steps: int = 100_000, use_numba: bool = True) -> GaussianBatch:
    r"""Integrate many Gaussian initial conditions (and optionally parameter sets) together.

    All members are advanced simultaneously by one vectorised adaptive Dormand--Prince 5(4)
    integrator (DOP853 on the numba path, see ``use_numba``) on the reparametrised system of
    :mod:`transformer_pde.gaussian`, **with a step size, error control and event handling per
    member** (NumPy arrays of shape ``(B, ...)``; members that terminate leave the active
    set).  Members land exactly (to :math:`10^{-12}` relative) on ``t_eval`` points,
    :class:`~transformer_pde.Layers` breakpoints, ``t_max`` and the size threshold by
    secant-adjusted steps in :math:`s`.  Statuses, :math:`T^*` and limits follow
    :func:`solve` (same classification, measured past the threshold as there), and the
    results agree with :func:`solve` member by member to about ``1e3 * rtol``.

    Parameters
    ----------
    att : Attention or sequence of B Attention
        One specification for all members, or one per member (same kind, ``d`` and heads).
    means0 : array_like (B, d)
    covs0 : array_like (B, d, d)
    t_max, rtol, atol, blowup_threshold, converge_tol, convergence
        As in :func:`solve`.
    t_eval : array_like (T,), optional
        Common output times (finite, strictly increasing, in ``[0, t_max]``);
        ``traj_means`` / ``traj_covs`` hold NaN after a member terminated.
    max_steps : int
        Step attempts per member (>= 1) of the explicit method, capped at 4000; a member that needs
        more (typically a stiff one: a collapsing direction of :math:`\Sigma` decaying much
        faster than the rest evolves) is continued alone with the implicit Radau method
        (see :func:`solve`).
    use_numba : bool
        (A bool: anything else raises :class:`~transformer_pde.errors.ArgumentTypeError`.)
        For ``softmax`` / ``linear`` with constant parameters, run the same per-member
        algorithm compiled with numba, with the 8th-order DOP853 pair instead of
        Dormand--Prince 5(4) (about 0.6x the right-hand-side evaluations at ``rtol = 1e-10``),
        one member after the other, or, from 256 members on, in parallel over members
        (``prange``, numba's thread count; members are independent, so the results are
        identical for any thread count).  Steps: the package's PI controller
        (:mod:`transformer_pde.integrate.controller`) on both paths.  The first call compiles
        (about a minute of CPU, d = 2 gets its own faster build, +25 s for the parallel
        kernel; cached on disk).  Otherwise, or with ``False`` (or without numba), the NumPy implementation.

    Returns
    -------
    GaussianBatch

    Warns
    -----
    EarlyStopWarning
        Once per call, when members stopped before ``t_max`` for a reason other than
        convergence (blow-up, budget, overflow: status ``"nonfinite"``), with the counts.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        As :func:`solve` (``means0`` / ``covs0`` for ``mean0`` / ``cov0``), and for
        ``use_numba`` not a bool or ``max_steps`` not an integer >= 1.
    """
    if isinstance(att, Attention):
        atts = [check_attention(att)]
    else:
        if not isinstance(att, Sequence) or isinstance(att, (str, bytes)):
            raise ArgumentTypeError("att must be an Attention or a sequence of them, got "
                                    f"{type(att).__name__}")
        atts = [check_attention(a) for a in att]
        if not atts:
            raise ArgumentError("att must be an Attention or a non-empty sequence of them")
        a0 = atts[0]
        for i, a in enumerate(atts):
            if (a.kind, a.d, a.heads, a.W_O is None) != (a0.kind, a0.d, a0.heads, a0.W_O is None):
                raise ArgumentError(f"att[{i}] differs from att[0] in kind, d, heads or W_O "
                                    "presence")
    d = atts[0].d
    m0, c0 = check_mean_cov(means0, covs0, d, "means0", "covs0", batch=True)
    B = m0.shape[0]
    if len(atts) > 1 and len(atts) != B:
        raise ArgumentError(f"att has {len(atts)} members but means0 has {B}")
    check_solver_args(t_max, rtol, atol, blowup_threshold, converge_tol, convergence)
    t_eval = check_t_eval(t_eval, float(t_max))
    use_numba = check_flag("use_numba", use_numba)
    max_steps = validation.integer("max_steps", max_steps, minimum=1)
    sysm = MomentSystem(atts, B)
    all_idx = np.arange(B)
    Y = sysm.pack(np.zeros(B), m0, psd_factor(c0), all_idx)
    log_thr = math.log(blowup_threshold)
    log_thr_c = math.log(max(blowup_threshold, CLASSIFY_SIZE))
    if np.any(sysm.log_size(Y, all_idx) >= log_thr):
        i = int(np.argmax(sysm.log_size(Y, all_idx)))
        raise ArgumentError(f"member {i}: the initial size already exceeds blowup_threshold")
    n = sysm.n
    atol_vec = np.full(n, atol)
    atol_vec[1] = rtol
    budget = min(int(max_steps), _STIFF_STEPS_BATCH)

    te = None if t_eval is None else np.unique(np.asarray(t_eval, float).ravel())
    if te is not None:
        te = te[(te >= 0) & (te <= t_max)]
    bps = layer_breakpoints(atts, 0.0, t_max)
    stops = np.unique(np.concatenate([
        bps, np.array([float(t_max)]), te[te > 0] if te is not None else np.zeros(0)]))
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
    mode = CONVERGENCE_MODES[convergence]

    fast = use_numba and kernels.AVAILABLE and not sysm.dynamic and sysm.kind in ("softmax",
                                                                                   "linear")
    if fast:
        # the compiled kernel does the initial convergence check, the step choice and the
        # continuation past the threshold per member
        reason, n_steps, Yc, creason = kernels.run_compiled(
            sysm, atts, Y, stops, eval_pos, rtol, atol_vec, atol, log_thr, log_thr_c, mode,
            converge_tol, budget, trY)
    else:
        reason = np.full(B, -1)
        code = converged_codes(convergence, conv_rates(sysm, Y, all_idx, atol), converge_tol,
                               Y[:, 0], np.full((B, 4), np.inf))
        reason[code > 0] = code[code > 0]
        # initial step (Hairer-Wanner heuristic, per member: the package's controller)
        h = initial_step(Y, sysm.rhs(Y, all_idx), rtol, atol_vec,
                         f=lambda z: sysm.rhs(z, all_idx), error_order=DOPRI5.error_order)
        n_steps = np.zeros(B, dtype=int)
        kstop = np.zeros(B, dtype=int)
        pi_prev = np.ones(B)           # the PI controller's history per member
        run = np.nonzero(reason < 0)[0]
        if run.size:
            _numpy_advance(sysm, Y, run, h, stops, kstop, eval_pos, trY, rtol, atol_vec, atol,
                           log_thr, convergence, converge_tol, budget, n_steps, reason, pi_prev)
        # continue the members on the threshold (no output, no final time) to measure the
        # blow-up, T* and the limit, or to see a transient crossing converge
        Yc = Y.copy()
        creason = np.full(B, -1)
        cont = np.nonzero(reason == 1)[0] if log_thr_c > log_thr else np.zeros(0, dtype=int)
        if cont.size:
            stops_c = np.concatenate([layer_breakpoints(atts, 0.0, math.inf), [math.inf]])
            kc = np.searchsorted(stops_c, Y[:, 0], side="right")
            _numpy_advance(sysm, Yc, cont, h.copy(), stops_c, kc, np.full(stops_c.size, -1),
                           None, rtol, atol_vec, atol, log_thr_c, convergence, converge_tol,
                           budget, np.zeros(B, dtype=int), creason, pi_prev)

    if te is not None:
        bi, ti = np.nonzero(np.isfinite(trY[:, :, 0]))
        if bi.size:
            _, mm, SS = sysm.moments(trY[bi, ti], bi)
            traj_m[bi, ti] = mm
            traj_c[bi, ti] = SS

    status, Tstar, limit, msgs = classify(sysm, Y, all_idx, converge_tol,
                                          np.where(reason == 3, 0, reason), Yc, convergence,
                                          creason, log_thr)
    t_fin, means, covs = sysm.moments(Y, all_idx)
    # members that became stiff: continue one by one with the implicit Radau method
    for i in np.nonzero(reason == 3)[0]:
        logger.info("solve_batch: member %d stiff at t=%.6g, continuing with Radau", i, t_fin[i])
        a_i = atts[i] if len(atts) > 1 else atts[0]
        F_i = np.exp(Y[i, 1]) * Y[i, 2:2 + d * d].reshape(d, d)
        rem = None if te is None else te[te > t_fin[i]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EarlyStopWarning)   # one warning per batch below
            tr = solve_from_factor(a_i, float(t_fin[i]), means[i], F_i, t_max=float(t_max),
                                   rtol=rtol, atol=atol, blowup_threshold=blowup_threshold,
                                   converge_tol=converge_tol, convergence=convergence,
                                   t_eval=rem, method="Radau")
        status[i], Tstar[i], limit[i], msgs[i] = tr.status, tr.blowup_time, tr.limit, tr.message
        t_fin[i] = tr.t_final
        if te is not None and len(tr.times):
            pos = np.searchsorted(te, tr.times)
            traj_m[i, pos] = tr.means
            traj_c[i, pos] = tr.covs
        means[i], covs[i] = tr.final_mean, tr.final_cov
        n_steps[i] += tr.nfev // 8
    value = {st: st.value for st in Status}          # (enum attribute access is slow)
    res = GaussianBatch(np.array([value[s] for s in status]), Tstar, t_fin, means, covs, limit,
                        n_steps, te, traj_m, traj_c, msgs)
    early = np.isin(res.status, [st.value for st in Status if st.stopped_early])
    if np.any(early):
        counts = {k: v for k, v in res.counts().items() if v and Status(k).stopped_early}
        first = int(np.argmax(early))
        warnings.warn(f"solve_batch: {int(early.sum())} of {B} members stopped before t_max="
                      f"{float(t_max):g} ({', '.join(f'{v} {k}' for k, v in counts.items())}); "
                      f"member {first}: {msgs[first]}", EarlyStopWarning, stacklevel=2)
    return res
