r"""The per-member integrator of :func:`~transformer_pde.gaussian.solve_batch`: DOP853 on
the reparametrised moment system of one Gaussian, with its own step control and events.

One implementation, :func:`advance_member`, a numba ``@njit(cache=True)`` kernel; the
interpreter runs the very same code (``advance_member.py_func`` and the plain functions it
calls), so ``solve_batch(..., use_numba=False)`` takes the same steps as the compiled path
and differs from it only by rounding (the compiled and the interpreted ``exp`` / ``log`` /
``sqrt`` may differ in the last bit: a few ulps per step, amplified over a run like any
perturbation of the initial value).  Without numba :data:`AVAILABLE` is ``False`` and only
the interpreted path runs.

Method
------
DOP853 (Hairer, Nørsett, Wanner: 12 stages, FSAL, the 5th- and 3rd-order error estimates
combined as in ``scipy.integrate.DOP853``), the package's PI controller
(:func:`transformer_pde.integrate.controller.pi_factor`), error norm
:math:`\mathrm{atol}_j + \mathrm{rtol}\max(|y_j|, |y^{new}_j|)` per component.  Stops
(``t_eval`` points, layer breakpoints, ``t_max``) are landed on to :math:`10^{-12}`
relative by steps aimed with the slope :math:`dt/ds`; the size threshold
:math:`\nu = e^{\ell}` is landed on to :math:`10^{-12}` relative in :math:`\log\nu` by
secant steps in :math:`s`.  Convergence is tested after every accepted step
(:func:`transformer_pde.gaussian.system.converged_codes`: relative, algebraic, absolute or
trace criterion).

Codes returned per member: 0 the last stop reached, 1 the size threshold reached, 2 / 5 / 6
converged (relative, algebraic, absolute or trace criterion), 3 the step budget spent; a
member on the threshold is continued without output to the classification size
(:data:`~transformer_pde.gaussian.system.CLASSIFY_SIZE`), its code is the second one.

Arguments are grouped (see :func:`advance_member`): the parameters of a member as a table
``prm`` (segment, head, [value map, score matrix, key Gram matrix], d, d) with constants
``con = [kind code, kappa, 2 l2_beta, eps]``; the stops as ``(3, n)`` tables ``[time,
output row or -1, parameter segment]``; the controller and tolerances in ``ctl`` (indices
``CTL_*``); the DOP853 coefficients in ``tab = (A, b, e5, e3)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..attention import Attention
from ..integrate.controller import PIController, initial_step
from ..integrate.tableaux import DOP853
from .member_field import (KIND_CODES, jitable, member_conv, member_converged, member_rhs,
                           pi_rule)
from . import lockstep
from .system import MomentSystem

__all__ = ["AVAILABLE", "KIND_CODES", "PAR_MIN_MEMBERS", "advance_member", "controls",
           "param_table", "run_members"]

try:  # numba is optional: without it the interpreter runs the same code
    import numba as _nb
except ImportError:  # pragma: no cover
    _nb = None

#: True when numba is installed (the compiled path can run).
AVAILABLE = _nb is not None
#: Batches at least this large run their members on numba's threads (chunks of members).
PAR_MIN_MEMBERS = 256
# indices of the settings array ``ctl``
CTL_RTOL, CTL_ATOL, CTL_LTHR, CTL_LTHR_C, CTL_CONV_TOL, CTL_CONV_MODE, CTL_BUDGET = range(7)
CTL_PI = 7          # ctl[7:12] = PI controller [alpha, beta, safety, fmin, fmax]
# landing tolerance on log(size) at the blow-up threshold (relative size error)
_LAND_LOG = 1e-12


_pi = pi_rule


@jitable()
def _advance(y, K, d, general, prm, con, stops, lthr, budget, traj, h, ctl, atol_vec, tab,
             scr, wk):
    """Advance one member from ``y`` (updated in place) until the last of ``stops`` (code 0),
    the size threshold ``exp(lthr)`` (1), convergence (2, 5, 6) or ``budget`` step attempts
    (3), starting at the first stop after ``y[0]``; ``wk = (cv, alg, out)``: convergence
    scratch, the algebraic detector's history, and ``out`` = [h, accepted steps, attempts,
    PI history] (``out[3]`` read and updated).  ``K[0]`` is recomputed at the start and
    where the parameter segment changes."""
    cA, cB, cE5, cE3 = tab
    cv, alg, out = wk[0], wk[1], wk[2]
    S, M, al, dm = scr[0], scr[2], scr[5], scr[7]
    rtol, atol = ctl[CTL_RTOL], ctl[CTL_ATOL]
    conv_tol, conv_mode = ctl[CTL_CONV_TOL], int(ctl[CTL_CONV_MODE])
    alpha, beta, safety = ctl[CTL_PI], ctl[CTL_PI + 1], ctl[CTL_PI + 2]
    fmin, fmax = ctl[CTL_PI + 3], ctl[CTL_PI + 4]
    n = y.shape[0]
    ns = cB.shape[0]
    nst = stops.shape[1]
    prev = out[3]
    k = 0
    while k < nst - 1 and not stops[0, k] > y[0]:
        k += 1
    seg = int(stops[2, k])
    ytmp, ynew, acc, e5v, e3v = wk[3], wk[4], wk[5], wk[6], wk[7]
    natt = 0
    nacc = 0
    res = -1
    nu0 = member_rhs(y, K[0], d, prm, seg, con, scr, general)
    lsz = np.log(nu0) if nu0 > 0.0 else -np.inf     # (size 0: no log(0) warning)
    h_ctrl = h
    secant = False
    sz_land = False           # landing on the size threshold (after a first overshoot)
    while True:
        st = stops[0, k]
        gap = st - y[0]
        h_aim = gap / K[0, 0]
        aiming = h_aim <= h
        hh = h_aim if aiming else h
        # stage sums with the component loop innermost (independent, vectorisable)
        for i in range(1, ns):
            for j in range(n):
                acc[j] = 0.0
            for l in range(i):
                a = cA[i, l]
                if a != 0.0:
                    for j in range(n):
                        acc[j] += a * K[l, j]
            for j in range(n):
                ytmp[j] = y[j] + hh * acc[j]
            member_rhs(ytmp, K[i], d, prm, seg, con, scr, general)
        for j in range(n):
            acc[j] = 0.0
        for l in range(ns):
            a = cB[l]
            if a != 0.0:
                for j in range(n):
                    acc[j] += a * K[l, j]
        for j in range(n):
            ynew[j] = y[j] + hh * acc[j]
        nu = member_rhs(ynew, K[ns], d, prm, seg, con, scr, general)
        for j in range(n):
            e5v[j] = 0.0
            e3v[j] = 0.0
        for l in range(ns + 1):
            a5 = cE5[l]
            a3 = cE3[l]
            for j in range(n):
                e5v[j] += a5 * K[l, j]
                e3v[j] += a3 * K[l, j]
        e5 = 0.0
        e3 = 0.0
        finite = True
        for j in range(n):
            sc = atol_vec[j] + rtol * max(abs(y[j]), abs(ynew[j]))
            e5 += (e5v[j] / sc) ** 2
            e3 += (e3v[j] / sc) ** 2
            if not np.isfinite(ynew[j]):
                finite = False
        if not finite:
            en = np.inf
        elif e5 == 0.0 and e3 == 0.0:
            en = 0.0
        else:
            en = abs(hh) * e5 / np.sqrt((e5 + 0.01 * e3) * n)
        ok = en <= 1.0
        tn = ynew[0]
        tol_l = 1e-12 * max(1.0, abs(st))
        over = ok and (tn > st + tol_l)
        lnew = np.log(nu) if nu > 0.0 else -np.inf
        # the size threshold is a stop as well: a step past it is retried with a secant
        # step in s on log(size) (log size is nearly linear in s near a blow-up)
        over_sz = ok and (lnew > lthr + _LAND_LOG)
        landed = ok and (not over) and aiming and abs(tn - st) <= tol_l
        accept = ok and not over and not over_sz
        # the PI rule (a step that passed the error test but overshot a stop or the
        # threshold is retried with a secant step: its factor is not used)
        fac, prev = _pi(en, prev, accept, alpha, beta, safety, fmin, fmax)
        h_new = hh * fac
        if over:
            h_new = hh * gap / max(tn - y[0], 1e-300)
        if over_sz:
            h_sz = hh * (lthr - lsz) / max(lnew - lsz, 1e-300)
            h_new = h_sz if (not over or h_sz < h_new) else h_new
        if accept and aiming:
            h_new = max(h, h_new)
        # landing on the threshold: once a step overshot it, every accepted step that stays
        # below it is followed by a step aimed with that step's slope of log(size) (the
        # controller's step would overshoot again and cost another retry)
        sz_land = sz_land or over_sz
        aim_sz = False
        if accept and sz_land and lsz < lnew < lthr - _LAND_LOG:
            h_sz = hh * (lthr - lnew) / (lnew - lsz)
            if h_sz < h_new:
                h_new = h_sz
                aim_sz = True
        secant_cur = secant
        secant = over or over_sz or aim_sz
        natt += 1
        h = h_new
        if accept:
            if not aiming and not secant_cur:
                h_ctrl = hh * fac
            nacc += 1
            for j in range(n):
                y[j] = ynew[j]
                K[0, j] = K[ns, j]
            lsz = lnew
            if landed:
                y[0] = st
                if stops[1, k] >= 0:
                    traj[int(stops[1, k]), :] = y
                if k == nst - 1:
                    res = 0
                    break
                k += 1
                if int(stops[2, k]) != seg:     # a layer breakpoint: the field jumps
                    seg = int(stops[2, k])
                    member_rhs(y, K[0], d, prm, seg, con, scr, general)
            if lnew >= lthr - _LAND_LOG:
                res = 1
                break
            # S, M, alpha, alpha' in the scratch are those of y (the last RHS call)
            rel = member_conv(d, S, M, al, dm, atol, cv)
            c = member_converged(conv_mode, rel, cv, conv_tol, y[0], alg)
            if c > 0:
                res = c
                break
        if natt >= budget:
            res = 3
            break
    # the error controller's last proposal (not the secant step that landed on a stop),
    # so that a continuation does not restart from a tiny step
    out[0] = max(h_ctrl, h)
    out[1] = nacc
    out[2] = natt
    out[3] = prev
    return res


def advance_member(y, yc, traj, h0, d, general, prm, con, stops, stops_c, ctl, atol_vec,
                   tab):
    """Integrate one member; returns ``(code, continuation code, accepted steps)``.

    ``y`` (n,): the packed state at ``t = 0`` (:class:`~.system.MomentSystem`), replaced by
    the final state; ``yc`` (n,) receives the state continued past the threshold (``y``
    where there is no continuation, continuation code -1); ``traj`` (T, n) receives the
    states landed on at the output stops; ``h0`` the first trial step in ``s``; ``d`` the
    dimension (a literal 2 compiles unrolled loops); ``prm`` (segments, H, 3, d, d) and
    ``con`` (4,) the member's parameters; ``stops`` / ``stops_c`` (3, n) the stops of the
    run and of the continuation (last ``inf``); ``ctl`` the settings (``CTL_*``);
    ``atol_vec`` (n,) the absolute tolerances; ``tab`` the DOP853 coefficients.  All state
    is local: members can run in parallel."""
    n = y.shape[0]
    ns = tab[1].shape[0]
    scr = (np.empty((d, d)), np.empty((d, d)), np.empty((d, d)), np.empty((d, d)),
           np.empty((d, d)), np.empty(d), np.empty(d), np.empty(d), np.empty((d, d)),
           np.empty((d, d)), np.empty((d, d)))
    out = np.empty(4)
    out[3] = 1.0              # the PI controller's history (no accepted step yet)
    wk = (np.empty(3), np.full(4, np.inf), out, np.empty(n), np.empty(n), np.empty(n),
          np.empty(n), np.empty(n))
    K = np.empty((ns + 1, n))
    member_rhs(y, K[0], d, prm, int(stops[2, 0]), con, scr, general)
    rel = member_conv(d, scr[0], scr[2], scr[5], scr[7], ctl[CTL_ATOL], wk[0])
    c0 = member_converged(int(ctl[CTL_CONV_MODE]), rel, wk[0], ctl[CTL_CONV_TOL], 0.0, wk[1])
    if c0 > 0:
        yc[:] = y
        return c0, -1, 0
    budget = int(ctl[CTL_BUDGET])
    lthr, lthr_c = ctl[CTL_LTHR], ctl[CTL_LTHR_C]
    res = _advance(y, K, d, general, prm, con, stops, lthr, budget, traj, h0, ctl, atol_vec,
                   tab, scr, wk)
    yc[:] = y
    nacc = int(out[1])
    cres = -1
    if res == 1 and lthr_c > lthr:
        # continue past the drawing threshold (no output) for T* and the limit
        wk[1][:] = np.inf
        left = budget - int(out[2])
        cres = _advance(yc, K, d, general, prm, con, stops_c, lthr_c, max(left, 1), traj,
                        out[0], ctl, atol_vec, tab, scr, wk)
    return res, cres, nacc


def _member_d(m, Y, Yc, traj, h0, general, prm, con, stops, stops_c, ctl, atol_vec, tab,
              codes):
    """Member ``m`` of a batch (parameters row ``m`` or the shared row 0), with ``d`` a
    compile-time constant for d = 2 (the phase grids of the paper), generic otherwise."""
    p = m if prm.shape[0] > 1 else 0
    d = prm.shape[-1]
    if d == 2:
        r = advance_member(Y[m], Yc[m], traj[m], h0[m], 2, general, prm[p], con[p], stops,
                           stops_c, ctl, atol_vec, tab)
    else:
        r = advance_member(Y[m], Yc[m], traj[m], h0[m], d, general, prm[p], con[p], stops,
                           stops_c, ctl, atol_vec, tab)
    codes[m, 0] = r[0]
    codes[m, 1] = r[1]
    codes[m, 2] = r[2]


# The kernel of l2 / sinkhorn (``general``, a constant, so that only that field is
# compiled): members lo:hi one after the other; it releases the GIL, so chunks of a large
# batch run on a pool of threads (each member writes only its own rows: the results do not
# depend on the number of threads).  softmax / linear run in lockstep (:mod:`.lockstep`).
def _serial_general(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes,
                    lo, hi):
    for m in range(lo, hi):
        _member_d(m, Y, Yc, traj, h0, True, prm, con, stops, stops_c, ctl, atol_vec, tab, codes)


if _nb is not None:
    from ..backends.compile_notice import install as _install_compile_notice

    _install_compile_notice()  # a cold kernel compilation is said (compile_notice)
    advance_member = _nb.njit(cache=True)(advance_member)
    _member_d = _nb.njit(cache=True, nogil=True)(_member_d)
    _serial_general = _nb.njit(cache=True, nogil=True)(_serial_general)


def _run_general(args: tuple, B: int, threads: int) -> None:
    """:func:`_serial_general` over ``B`` members: one call, or chunks of 8 members
    (members differ in cost) on a pool of ``threads`` threads."""
    if threads <= 1:
        _serial_general(*args, 0, B)
        return
    edges = list(range(0, B, 8)) + [B]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        jobs = [pool.submit(_serial_general, *args, a, b)
                for a, b in zip(edges[:-1], edges[1:], strict=True)]
        for job in jobs:
            job.result()


def param_table(atts: Sequence[Attention], kind: str, bounds: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(prm, con)`` of :func:`advance_member` for every parameter set (one, or one per
    member): ``prm`` (P, segments, H, 3, d, d) holds per segment and head ``[W_O E_h V_h,
    beta K_h^T Q_h, K_h^T K_h]`` (the last only for ``l2``), ``con`` (P, 4) ``[kind code,
    kappa, 2 l2_beta, eps]``.  The segments are the intervals between ``bounds`` (layer
    breakpoints, sorted), evaluated at interior points (``t = 0`` without breakpoints)."""
    nb = bounds.size
    ts = [0.0] if nb == 0 else (
        [0.5 * bounds[0]] + [0.5 * (bounds[j - 1] + bounds[j]) for j in range(1, nb)]
        + [bounds[-1] + 1.0])
    prm, con = [], []
    for a in atts:
        rows = []
        for t in ts:
            p = a.at(float(t))
            W = np.eye(a.d) if p.W_O is None else p.W_O
            rows.append([np.stack([W[:, hd.rows] @ hd.V, p.beta * hd.A,
                                   hd.K.T @ hd.K if kind == "l2" else np.zeros((a.d, a.d))])
                         for hd in p.heads])
        prm.append(rows)
        p0 = a.at(0.0)
        con.append([KIND_CODES[kind], 0.0, 2.0 * p0.l2_beta, p0.eps])
    return np.ascontiguousarray(prm, dtype=float), np.array(con, dtype=float)


def controls(rtol: float, atol: float, log_thr: float, log_thr_c: float, converge_tol: float,
             conv_mode: int, budget: int) -> np.ndarray:
    """The settings array ``ctl`` of :func:`advance_member` (indices ``CTL_*``), with the
    package's PI controller for DOP853's error order."""
    ctrl = PIController(DOP853.error_order)
    return np.array([rtol, atol, log_thr, log_thr_c, converge_tol, conv_mode, budget,
                     ctrl.alpha, ctrl.beta, ctrl.safety, ctrl.fmin, ctrl.fmax], dtype=float)


def run_members(sysm: MomentSystem, Y: np.ndarray, traj: np.ndarray, prm: np.ndarray,
                con: np.ndarray, stops: np.ndarray, stops_c: np.ndarray, ctl: np.ndarray,
                atol_vec: np.ndarray, compiled: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Integrate every member of ``Y`` (rows of packed states at ``t = 0``, replaced by the
    final states) with the integrator of :func:`advance_member`: compiled (softmax /
    linear in SIMD lockstep, :func:`~transformer_pde.gaussian.lockstep.run_lanes`; l2 /
    sinkhorn member by member; on numba's threads from :data:`PAR_MIN_MEMBERS` members
    on) or interpreted (member by member); ``traj`` (B, T, n) receives the
    states at the output stops.  The first trial steps are the package's heuristic
    (:func:`~transformer_pde.integrate.controller.initial_step`) on ``sysm``'s field.
    Returns ``(code, n_steps, Yc, continuation code)`` per member."""
    B = Y.shape[0]
    con = con.copy()
    con[:, 1] = sysm.kappa
    idx = np.arange(B)
    h0 = np.ascontiguousarray(initial_step(Y, sysm.rhs(Y, idx), ctl[CTL_RTOL], atol_vec,
                                           f=lambda z: sysm.rhs(z, idx),
                                           error_order=DOP853.error_order))
    tab = (DOP853.A, DOP853.b, DOP853.e, DOP853.e_aux)
    codes = np.zeros((B, 3), dtype=np.int64)
    Yc = np.empty_like(Y)
    general = sysm.kind in ("l2", "sinkhorn")
    if compiled and AVAILABLE and not general:
        threads = _nb.get_num_threads() if B >= PAR_MIN_MEMBERS else 1
        lockstep.run_chunks(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab,
                            codes, threads)
    elif compiled and AVAILABLE:
        threads = _nb.get_num_threads() if B >= PAR_MIN_MEMBERS else 1
        _run_general((Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes),
                     B, threads)
    else:
        run = getattr(advance_member, "py_func", advance_member)
        for m in range(B):
            p = m if prm.shape[0] > 1 else 0
            codes[m] = run(Y[m], Yc[m], traj[m], h0[m], prm.shape[-1], general, prm[p], con[p],
                           stops, stops_c, ctl, atol_vec, tab)
    return codes[:, 0], codes[:, 2], Yc, codes[:, 1]
