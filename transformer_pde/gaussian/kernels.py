r"""Compiled (numba) per-member DOP853 loop of :func:`~transformer_pde.gaussian.solve_batch`
for ``softmax`` / ``linear`` attention with constant parameters.

The NumPy integrator of :mod:`transformer_pde.gaussian.batch` is the reference
implementation; this is the same per-member algorithm (step control, landing on stops,
events) with the 8th-order DOP853 pair.  Without numba, :data:`AVAILABLE` is ``False``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..attention import Attention
from ..integrate.controller import PIController, initial_step, pi_factor
from ..integrate.tableaux import DOP853
from .system import ALG_K_MIN, ALG_STEADY

__all__: list[str] = []

try:  # numba is optional: the NumPy integrator below is the reference implementation
    import numba as _nb
except ImportError:  # pragma: no cover
    _nb = None


#: True when numba and the DOP853 coefficients are available (the compiled path can run).
AVAILABLE = _nb is not None

# landing tolerance on log(size) at the blow-up threshold (relative size error)
_LAND_LOG = 1e-12
# algebraic convergence (the NumPy path's transformer_pde.gaussian.system.converged_codes)
_ALG_K_MIN = ALG_K_MIN
_ALG_STEADY = ALG_STEADY


# The per-member loop for softmax / linear with constant parameters: the NumPy path's algorithm
# (per-member step control, landing on stops, events) with the 8th-order DOP853 pair instead of
# Dormand--Prince 5(4): at rtol 1e-10 it needs about 0.6x the right-hand-side evaluations.
def _nb_rhs(y, out, d, linear, Vf, Ah, kap, S, S2, M, T, MG, al, bvec, dmean):
    """dY/ds of one member into ``out``; leaves S, M, alpha, alpha' in the scratch arrays
    (read by :func:`_nb_conv`) and returns the size nu."""
    n_g = d * d
    rho = y[1]
    g2 = 0.0
    for i in range(n_g):
        g2 += y[2 + i] * y[2 + i]
    e2r = np.exp(2.0 * rho)
    trS = e2r * g2
    phi = np.sqrt(1.0 + kap * trS)
    for i in range(d):
        al[i] = phi * y[2 + n_g + i]
    for i in range(d):
        for j in range(i + 1):
            acc = 0.0
            for k in range(d):
                acc += y[2 + i * d + k] * y[2 + j * d + k]
            S[i, j] = e2r * acc
            S[j, i] = S[i, j]
            S2[i, j] = S[i, j] + (al[i] * al[j] if linear else 0.0)
            S2[j, i] = S2[i, j]
    for i in range(d):
        bvec[i] = 0.0
        for j in range(d):
            M[i, j] = 0.0
    H = Vf.shape[0]
    for h in range(H):
        # T = S2 @ A_h ; M += Vf_h @ T
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for k in range(d):
                    acc += S2[i, k] * Ah[h, k, j]
                T[i, j] = acc
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for k in range(d):
                    acc += Vf[h, i, k] * T[k, j]
                M[i, j] += acc
        if not linear:
            for i in range(d):
                acc = 0.0
                for k in range(d):
                    acc += Vf[h, i, k] * al[k]
                bvec[i] += acc
    gmg = 0.0
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for k in range(d):
                acc += M[i, k] * y[2 + k * d + j]
            MG[i, j] = acc
            gmg += y[2 + i * d + j] * acc
    mu = gmg / g2 if g2 > 0 else 0.0
    a2 = 0.0
    for i in range(d):
        acc = bvec[i]
        for k in range(d):
            acc += M[i, k] * al[k]
        dmean[i] = acc
        a2 += al[i] * al[i]
    nu = trS + (a2 if linear else 0.0)
    w = 1.0 + kap * nu
    iw = 1.0 / w
    dtrS = 2.0 * e2r * gmg
    dlogphi = 0.5 * kap * dtrS / (phi * phi)
    out[0] = iw
    out[1] = mu * iw
    for i in range(d):
        for j in range(d):
            out[2 + i * d + j] = (MG[i, j] - mu * y[2 + i * d + j]) * iw
    ipw = iw / phi
    for i in range(d):
        out[2 + n_g + i] = (dmean[i] - al[i] * dlogphi) * ipw
    return nu


def _nb_conv(d, S, M, al, dmean, atol, cv):
    """Convergence measures from the scratch of the last :func:`_nb_rhs` call (evaluated once
    per accepted step, not per stage): returns the relative rate of
    :meth:`MomentSystem.conv_measure`; ``cv`` receives ``[R, |Sigma'|_F, tr Sigma]`` with
    ``R = |Sigma'|_F + |(alpha alpha^T)'|_F`` (the rate tested for algebraic convergence)."""
    nS = 0.0
    ndS = 0.0
    trS = 0.0
    for i in range(d):
        trS += S[i, i]
        for j in range(d):
            nS += S[i, j] * S[i, j]
            acc = 0.0
            for k in range(d):
                acc += M[i, k] * S[k, j] + S[i, k] * M[j, k]
            ndS += acc * acc
    nS = np.sqrt(nS)
    rS = np.sqrt(ndS) / (nS + atol)
    dm = 0.0
    a2 = 0.0
    dmm = 0.0
    for i in range(d):
        dm += dmean[i] * dmean[i]
        a2 += al[i] * al[i]
        for j in range(d):
            x = dmean[i] * al[j] + al[i] * dmean[j]
            dmm += x * x
    rm = np.sqrt(dm) / (np.sqrt(a2) + np.sqrt(nS) + atol)
    cv[0] = np.sqrt(ndS) + np.sqrt(dmm)
    cv[1] = np.sqrt(ndS)
    cv[2] = trS
    return max(rm, rS)


def _nb_converged(mode, rel, cv, conv_tol, t, alg):
    """0 (not converged), 2 (relative criterion), 5 (algebraic approach) or 6 (absolute /
    trace criterion) for convergence ``mode`` 0 relative, 1 auto, 2 absolute, 3 trace.
    ``alg`` = [log t, log R, k anchor, t anchor] carries the algebraic detector's history
    (see :func:`transformer_pde.gaussian.system.converged_codes`)."""
    if mode == 2:
        return 6 if cv[1] <= conv_tol else 0
    if mode == 3:
        return 6 if cv[2] <= conv_tol else 0
    if rel <= conv_tol:
        return 2
    if mode == 1 and t > 0.0 and cv[0] > 0.0:
        lt = np.log(t)
        if np.isfinite(alg[0]) and not lt > alg[0]:
            return 0           # only later times update the history
        lr = np.log(cv[0])
        hit = False
        if np.isfinite(alg[0]):
            k = -(lr - alg[1]) / (lt - alg[0])
            if k >= _ALG_K_MIN:
                if np.isfinite(alg[2]) and abs(k - alg[2]) <= _ALG_STEADY * alg[2]:
                    hit = t >= 2.0 * alg[3]
                else:
                    alg[2] = k
                    alg[3] = t
            else:
                alg[2] = np.inf
        alg[0] = lt
        alg[1] = lr
        if hit:
            return 5
    return 0


def _nb_advance(y, K, d, linear, Vfm, Ahm, km, rtol, atol_vec, atol, stops, eval_pos, lthr,
                conv_mode, conv_tol, budget, traj_m, h, cA, cB, cE5, cE3, pic, scr, cv, alg,
                out):
    """Advance one member from ``y`` (``K[0]`` = its field) until the last stop (0), the size
    threshold ``exp(lthr)``, landed on to 1e-12 relative (1), convergence (2, 5, 6) or the
    budget of ``budget`` step attempts (3).  Step sizes: the package's PI rule
    (:func:`transformer_pde.integrate.controller.pi_factor`, parameters ``pic`` = [alpha,
    beta, safety, fmin, fmax]) with its history in ``out[3]`` (read and updated).  Returns
    the code; ``out[:3]`` = [h, accepted steps, attempts]."""
    S, S2, M, T, MG, al, bv, dm, ytmp, ynew, acc, e5v, e3v = scr
    n = y.shape[0]
    ns = cB.shape[0]
    nst = stops.shape[0]
    alpha, beta, safety, fmin, fmax = pic[0], pic[1], pic[2], pic[3], pic[4]
    prev = out[3]
    k = 0
    natt = 0
    nacc = 0
    res = -1
    lsz = np.log(_nb_rhs(y, K[0], d, linear, Vfm, Ahm, km, S, S2, M, T, MG, al, bv, dm))
    h_ctrl = h
    secant = False
    sz_land = False           # landing on the size threshold (after a first overshoot)
    while True:
        st = stops[k]
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
            _nb_rhs(ytmp, K[i], d, linear, Vfm, Ahm, km, S, S2, M, T, MG, al, bv, dm)
        for j in range(n):
            acc[j] = 0.0
        for l in range(ns):
            a = cB[l]
            if a != 0.0:
                for j in range(n):
                    acc[j] += a * K[l, j]
        for j in range(n):
            ynew[j] = y[j] + hh * acc[j]
        nu = _nb_rhs(ynew, K[ns], d, linear, Vfm, Ahm, km, S, S2, M, T, MG, al, bv, dm)
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
        fac, prev = _nb_pi(en, prev, accept, alpha, beta, safety, fmin, fmax)
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
                if eval_pos[k] >= 0:
                    traj_m[eval_pos[k], :] = y
                if k == nst - 1:
                    res = 0
                    break
                k += 1
            if lnew >= lthr - _LAND_LOG:
                res = 1
                break
            # S, M, alpha, alpha' in the scratch are those of ynew (the last RHS call)
            rel = _nb_conv(d, S, M, al, dm, atol, cv)
            c = _nb_converged(conv_mode, rel, cv, conv_tol, y[0], alg)
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


def _nb_member(m, Y, Yc, h0, d, linear, Vfm, Ahm, km, rtol, atol_vec, atol, stops, eval_pos,
               lthr, lthr_c, conv_mode, conv_tol, budget, traj, reason, creason, n_steps,
               cA, cB, cE5, cE3, pic):
    """DOP853 (Hairer--Norsett--Wanner: 12 stages, FSAL, 5th- and 3rd-order error estimates
    combined as in ``scipy.integrate.DOP853``) for member ``m`` from the initial step
    ``h0[m]``; all state is local, so members can run in parallel.  A member that lands on
    the size threshold ``exp(lthr)`` is continued (without output) to ``exp(lthr_c)`` into
    ``Yc[m]`` (code in ``creason[m]``), where blow-up time and limit shape are measured."""
    n = Y.shape[1]
    scr = (np.empty((d, d)), np.empty((d, d)), np.empty((d, d)), np.empty((d, d)),
           np.empty((d, d)), np.empty(d), np.empty(d), np.empty(d), np.empty(n), np.empty(n),
           np.empty(n), np.empty(n), np.empty(n))
    S, S2, M, T, MG, al, bv, dm = scr[:8]
    ns = cB.shape[0]
    K = np.empty((ns + 1, n))
    cv = np.empty(3)
    alg = np.full(4, np.inf)
    out = np.empty(4)
    out[3] = 1.0              # the PI controller's history (no accepted step yet)
    y = Y[m].copy()
    _nb_rhs(y, K[0], d, linear, Vfm, Ahm, km, S, S2, M, T, MG, al, bv, dm)
    rel = _nb_conv(d, S, M, al, dm, atol, cv)
    c0 = _nb_converged(conv_mode, rel, cv, conv_tol, 0.0, alg)
    if c0 > 0:
        reason[m] = c0
        Yc[m, :] = y
        return
    res = _nb_advance(y, K, d, linear, Vfm, Ahm, km, rtol, atol_vec, atol, stops, eval_pos,
                      lthr, conv_mode, conv_tol, budget, traj[m], h0[m], cA, cB, cE5, cE3, pic,
                      scr, cv, alg, out)
    Y[m, :] = y
    reason[m] = res
    n_steps[m] = np.int64(out[1])
    if res == 1 and lthr_c > lthr:
        # continue past the drawing threshold (no stops, no output) for T* and the limit
        inf_stop = np.full(1, np.inf)
        no_eval = np.full(1, -1, dtype=np.int64)
        alg[:] = np.inf
        left = budget - np.int64(out[2])
        creason[m] = _nb_advance(y, K, d, linear, Vfm, Ahm, km, rtol, atol_vec, atol,
                                 inf_stop, no_eval, lthr_c, conv_mode, conv_tol,
                                 max(left, 1), traj[m], out[0], cA, cB, cE5, cE3,
                                 pic, scr, cv, alg, out)
    Yc[m, :] = y


def _nb_dispatch(m, Y, Yc, h0, d, linear, Vfm, Ahm, km, rtol, atol_vec, atol, stops,
                 eval_pos, lthr, lthr_c, conv_mode, conv_tol, budget, traj, reason, creason,
                 n_steps, cA, cB, cE5, cE3, pic):
    """:func:`_nb_member` with ``d`` a compile-time constant for d = 2 (the phase grids of
    the paper; numba compiles a specialisation for a literal argument, whose small
    matrix loops it unrolls: about 2.5x faster right-hand sides), generic otherwise."""
    if d == 2:
        _nb_member(m, Y, Yc, h0, 2, linear, Vfm, Ahm, km, rtol, atol_vec, atol, stops,
                   eval_pos, lthr, lthr_c, conv_mode, conv_tol, budget, traj, reason, creason,
                   n_steps, cA, cB, cE5, cE3, pic)
    else:
        _nb_member(m, Y, Yc, h0, d, linear, Vfm, Ahm, km, rtol, atol_vec, atol, stops,
                   eval_pos, lthr, lthr_c, conv_mode, conv_tol, budget, traj, reason, creason,
                   n_steps, cA, cB, cE5, cE3, pic)


def _nb_run(Y, Yc, h0, d, linear, Vf, Ah, kap, rtol, atol_vec, atol, stops, eval_pos, lthr,
            lthr_c, conv_mode, conv_tol, budget, traj, reason, creason, n_steps, cA, cB, cE5,
            cE3, pic):
    """All members, one after the other (small batches: no thread start-up, quick compile)."""
    P = Vf.shape[0]
    for m in range(Y.shape[0]):
        p = m if P > 1 else 0     # P is 1 (shared parameters) or B
        _nb_dispatch(m, Y, Yc, h0, d, linear, Vf[p], Ah[p], kap[p], rtol, atol_vec, atol,
                     stops, eval_pos, lthr, lthr_c, conv_mode, conv_tol, budget, traj, reason,
                     creason, n_steps, cA, cB, cE5, cE3, pic)


def _nb_run_par(Y, Yc, h0, d, linear, Vf, Ah, kap, rtol, atol_vec, atol, stops, eval_pos,
                lthr, lthr_c, conv_mode, conv_tol, budget, traj, reason, creason, n_steps,
                cA, cB, cE5, cE3, pic):
    """All members in parallel (``prange``): each member's state is local to
    :func:`_nb_member` and it writes only its own rows of the outputs, so the results do
    not depend on the number of threads or the schedule."""
    P = Vf.shape[0]
    for m in _prange(Y.shape[0]):
        mi = np.int64(m)          # (a prange index may be unsigned: keep integer arithmetic)
        p = mi if P > 1 else np.int64(0)
        _nb_dispatch(mi, Y, Yc, h0, d, linear, Vf[p], Ah[p], kap[p], rtol, atol_vec, atol,
                     stops, eval_pos, lthr, lthr_c, conv_mode, conv_tol, budget, traj, reason,
                     creason, n_steps, cA, cB, cE5, cE3, pic)


_prange = range
_nb_pi = pi_factor
PAR_MIN_MEMBERS = 256   # batches at least this large use the parallel kernel
if _nb is not None:
    _prange = _nb.prange
    _nb_rhs = _nb.njit(cache=True, inline="always")(_nb_rhs)
    _nb_pi = _nb.njit(cache=True, inline="always")(pi_factor)
    _nb_conv = _nb.njit(cache=True)(_nb_conv)
    _nb_converged = _nb.njit(cache=True)(_nb_converged)
    _nb_advance = _nb.njit(cache=True)(_nb_advance)
    _nb_member = _nb.njit(cache=True)(_nb_member)
    _nb_dispatch = _nb.njit(cache=True)(_nb_dispatch)
    _nb_run = _nb.njit(cache=True)(_nb_run)
    _nb_run_par = _nb.njit(cache=True, parallel=True)(_nb_run_par)


def run_compiled(sysm: Any, atts: Sequence[Attention], Y: np.ndarray, stops: np.ndarray,
                 eval_pos: np.ndarray, rtol: float, atol_vec: np.ndarray, atol: float,
                 log_thr: float, log_thr_c: float, conv_mode: int, conv_tol: float,
                 budget: int, traj: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Advance every member of ``Y`` (rows of the s-time state, updated in place) with the
    compiled loop; returns ``(reason, n_steps, Yc, creason)`` per member: reason 0 = last
    stop reached, 1 = landed on the size threshold, 2 / 5 / 6 = converged (relative,
    algebraic, absolute or trace criterion), 3 = step budget spent; ``Yc`` is the state
    continued past the threshold to ``exp(log_thr_c)`` (``creason`` its code, -1 if not
    continued).  ``sysm`` is the batch's
    :class:`~transformer_pde.gaussian.system.MomentSystem` (kind, d, rate scales)."""
    d = sysm.d
    Vf, Ah = [], []
    for a in atts:
        p = a.at(0.0)
        W = np.eye(d) if p.W_O is None else p.W_O
        Vf.append(np.stack([W[:, hd.rows] @ hd.V for hd in p.heads]))
        Ah.append(np.stack([p.beta * hd.A for hd in p.heads]))
    B = Y.shape[0]
    reason = np.full(B, -1, dtype=np.int64)
    creason = np.full(B, -1, dtype=np.int64)
    n_steps = np.zeros(B, dtype=np.int64)
    Yc = np.empty_like(Y)
    par = B >= PAR_MIN_MEMBERS and _nb.get_num_threads() > 1
    run = _nb_run_par if par else _nb_run
    tab = DOP853
    ctrl = PIController(tab.error_order)
    pic = np.array([ctrl.alpha, ctrl.beta, ctrl.safety, ctrl.fmin, ctrl.fmax])
    # the first trial step of every member (the package's heuristic, on the NumPy field)
    idx = np.arange(B)
    h0 = np.ascontiguousarray(initial_step(Y, sysm.rhs(Y, idx), rtol, atol_vec,
                                           f=lambda z: sysm.rhs(z, idx),
                                           error_order=tab.error_order))
    with _nb.parallel_chunksize(8):   # dynamic scheduling: members differ in cost
        run(Y, Yc, h0, d, sysm.kind == "linear", np.ascontiguousarray(np.stack(Vf)),
            np.ascontiguousarray(np.stack(Ah)), np.ascontiguousarray(sysm.kappa, float),
            float(rtol), atol_vec, float(atol), stops, eval_pos, float(log_thr),
            float(log_thr_c), int(conv_mode), float(conv_tol), int(budget), traj, reason,
            creason, n_steps, tab.A, tab.b, tab.e, tab.e_aux, pic)
    return reason, n_steps, Yc, creason
