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

import numpy as np

from ..attention import Attention
from ..integrate.controller import PIController, initial_step, pi_factor
from ..integrate.tableaux import DOP853
from .system import ALG_K_MIN, ALG_STEADY, MomentSystem

__all__ = ["AVAILABLE", "KIND_CODES", "PAR_MIN_MEMBERS", "advance_member", "controls",
           "param_table", "run_members"]

try:  # numba is optional: without it the interpreter runs the same code
    import numba as _nb
    from numba.extending import overload as _overload
except ImportError:  # pragma: no cover
    _nb = None
    _overload = None

#: True when numba is installed (the compiled path can run).
AVAILABLE = _nb is not None
#: Batches at least this large run their members in parallel (``prange``).
PAR_MIN_MEMBERS = 256
#: Kind codes of ``con[0]``.
KIND_CODES = {"softmax": 0, "linear": 1, "l2": 2, "sinkhorn": 3}
# indices of the settings array ``ctl``
CTL_RTOL, CTL_ATOL, CTL_LTHR, CTL_LTHR_C, CTL_CONV_TOL, CTL_CONV_MODE, CTL_BUDGET = range(7)
CTL_PI = 7          # ctl[7:12] = PI controller [alpha, beta, safety, fmin, fmax]
# landing tolerance on log(size) at the blow-up threshold (relative size error)
_LAND_LOG = 1e-12


def _jitable(inline: str = "never"):
    """Keep a function plain for the interpreter and let numba compile it where a compiled
    kernel calls it (literal arguments such as ``d = 2`` stay literal: unrolled loops)."""
    def wrap(fn):
        if _overload is not None:
            @_overload(fn, inline=inline, strict=False, prefer_literal=True)
            def _ov(*args):
                return fn
        return fn
    return wrap


_pi = _jitable("always")(pi_factor)


def _rhs(y, out, d, prm, seg, con, scr, general):
    """dY/ds of one member into ``out`` with the parameters ``prm[seg]`` (head, [Vf, A, G],
    d, d); leaves S, M, alpha, alpha' in the scratch (read by :func:`_conv`) and returns
    the size nu.  Per head the affine field is ``M0, b0`` (kind by kind as
    :func:`transformer_pde.gaussian.affine.head_affine`) and ``M += Vf M0``, ``b += Vf b0``
    with ``Vf = W_O E_h V_h``.  ``general``: l2 / sinkhorn (else softmax / linear)."""
    g2, e2r, trS, phi = _state(y, d, con, scr)
    if general:
        _field_general(y, d, prm, seg, con, scr)
    else:
        _field_affine(d, prm, seg, con, scr)
    return _flow(y, out, d, con, scr, g2, e2r, trS, phi)


if _overload is not None:
    @_overload(_rhs, strict=False, prefer_literal=True)
    def _rhs_typed(y, out, d, prm, seg, con, scr, general):
        # ``general`` is a literal in the compiled kernels: only its field is compiled
        if getattr(general, "literal_value", True):
            def rhs(y, out, d, prm, seg, con, scr, general):
                g2, e2r, trS, phi = _state(y, d, con, scr)
                _field_general(y, d, prm, seg, con, scr)
                return _flow(y, out, d, con, scr, g2, e2r, trS, phi)
        else:
            def rhs(y, out, d, prm, seg, con, scr, general):
                g2, e2r, trS, phi = _state(y, d, con, scr)
                _field_affine(d, prm, seg, con, scr)
                return _flow(y, out, d, con, scr, g2, e2r, trS, phi)
        return rhs


@_jitable("always")
def _state(y, d, con, scr):
    """Sigma (and S2 = Sigma + alpha alpha^T for linear) and alpha into the scratch;
    returns ``(|G|^2, e^(2 rho), tr Sigma, phi)``."""
    S, S2, al = scr[0], scr[1], scr[5]
    linear = int(con[0]) == 1
    kap = con[1]
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
    return g2, e2r, trS, phi


@_jitable("always")
def _field_affine(d, prm, seg, con, scr):
    """softmax / linear: ``M = sum_h Vf_h S2 A_h``, ``b = sum_h Vf_h alpha`` (softmax) or 0."""
    S2, M, T, al, bvec = scr[1], scr[2], scr[3], scr[5], scr[6]
    linear = int(con[0]) == 1
    for i in range(d):
        bvec[i] = 0.0
        for j in range(d):
            M[i, j] = 0.0
    for h in range(prm.shape[1]):
        # T = S2 @ A_h ; M += Vf_h @ T
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for k in range(d):
                    acc += S2[i, k] * prm[seg, h, 1, k, j]
                T[i, j] = acc
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for k in range(d):
                    acc += prm[seg, h, 0, i, k] * T[k, j]
                M[i, j] += acc
        if not linear:
            for i in range(d):
                acc = 0.0
                for k in range(d):
                    acc += prm[seg, h, 0, i, k] * al[k]
                bvec[i] += acc


@_jitable()
def _field_general(y, d, prm, seg, con, scr):
    """l2 / sinkhorn: ``M = sum_h Vf_h M0_h``, ``b = sum_h Vf_h b0_h`` (per head
    :func:`_head_l2` / :func:`_head_sinkhorn`; ``dmean`` holds ``b0_h`` meanwhile)."""
    S, M, T, al, bvec, dmean, W1, W2, F = (scr[0], scr[2], scr[3], scr[5], scr[6], scr[7],
                                           scr[8], scr[9], scr[10])
    sinkhorn = int(con[0]) == 3
    for i in range(d):
        bvec[i] = 0.0
        for j in range(d):
            M[i, j] = 0.0
    if sinkhorn:
        er = np.exp(y[1])
        for i in range(d):
            for j in range(d):
                F[i, j] = er * y[2 + i * d + j]
    for h in range(prm.shape[1]):
        if sinkhorn:
            _head_sinkhorn(T, dmean, F, al, prm[seg, h, 1], con[3], W1, W2, d)
        else:
            _head_l2(T, dmean, S, al, prm[seg, h, 1], prm[seg, h, 2], con[2], W1, W2, d)
        for i in range(d):
            acc = 0.0
            for j in range(d):
                acc2 = 0.0
                for k in range(d):
                    acc2 += prm[seg, h, 0, i, k] * T[k, j]
                M[i, j] += acc2
                acc += prm[seg, h, 0, i, j] * dmean[j]
            bvec[i] += acc


@_jitable("always")
def _flow(y, out, d, con, scr, g2, e2r, trS, phi):
    """dY/ds from the field ``M, b`` in the scratch (``dmean`` receives alpha'); returns
    the size nu."""
    M, MG, al, bvec, dmean = scr[2], scr[4], scr[5], scr[6], scr[7]
    linear = int(con[0]) == 1
    kap = con[1]
    n_g = d * d
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


@_jitable("always")
def _matmul(out, X, Y, d):
    """``out = X @ Y`` (d x d)."""
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for k in range(d):
                acc += X[i, k] * Y[k, j]
            out[i, j] = acc


@_jitable()
def _head_l2(T, b0, S, al, A0, G, lb, W1, W2, d):
    """l2: ``M0 = lb S (I + lb G S)^-1 A0``, ``b0 = (I + lb S G)^-1 alpha``."""
    _matmul(W1, G, S, d)
    _matmul(W2, S, G, d)
    for i in range(d):
        for j in range(d):
            W1[i, j] = lb * W1[i, j] + (1.0 if i == j else 0.0)
            W2[i, j] = lb * W2[i, j] + (1.0 if i == j else 0.0)
    X = np.linalg.solve(W1, np.ascontiguousarray(A0))
    _matmul(T, S, X, d)
    for i in range(d):
        for j in range(d):
            T[i, j] = lb * T[i, j]
    z = np.linalg.solve(W2, al.copy())
    for i in range(d):
        b0[i] = z[i]


@_jitable()
def _head_sinkhorn(T, b0, F, al, A, eps, W1, W2, d):
    """sinkhorn: ``M0 = 2 Sh (eps I + R')^-1 Sh A`` with ``Sh = Sigma^1/2`` from the SVD of
    the factor ``F`` and ``(eps I + R')^-1`` from the SVD of ``Sh A F``; ``b0 = alpha -
    M0 alpha``."""
    U, sv, _ = np.linalg.svd(F)
    for i in range(d):                      # W1 = Sh
        for j in range(d):
            acc = 0.0
            for k in range(d):
                acc += U[i, k] * sv[k] * U[j, k]
            W1[i, j] = acc
    _matmul(W2, W1, A, d)                   # W2 = Sh A
    _matmul(T, W2, F, d)                    # Z = Sh A F
    X, zeta, _ = np.linalg.svd(T)
    for i in range(d):
        zeta[i] = 1.0 / (eps + np.sqrt(eps * eps + 4.0 * zeta[i] * zeta[i]))
    for i in range(d):                      # T = Sh (eps I + R')^-1
        for j in range(d):
            acc = 0.0
            for k in range(d):
                acc2 = 0.0
                for m in range(d):
                    acc2 += X[k, m] * zeta[m] * X[j, m]
                acc += W1[i, k] * acc2
            T[i, j] = acc
    _matmul(W1, T, W2, d)                   # M0 / 2 = Sh inv Sh A
    for i in range(d):
        acc = 0.0
        for j in range(d):
            T[i, j] = 2.0 * W1[i, j]
            acc += T[i, j] * al[j]
        b0[i] = al[i] - acc


@_jitable()
def _conv(d, S, M, al, dmean, atol, cv):
    """Convergence measures from the scratch of the last :func:`_rhs` call (evaluated once
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


@_jitable()
def _converged(mode, rel, cv, conv_tol, t, alg):
    """0 (not converged), 2 (relative criterion), 5 (algebraic approach) or 6 (absolute /
    trace criterion) for convergence ``mode`` 0 relative, 1 auto, 2 absolute, 3 trace.
    ``alg`` = [log t, log R, k anchor, t anchor] carries the algebraic detector's history
    (the rule of :func:`transformer_pde.gaussian.system.converged_codes`)."""
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
            if k >= ALG_K_MIN:
                if np.isfinite(alg[2]) and abs(k - alg[2]) <= ALG_STEADY * alg[2]:
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


@_jitable()
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
    lsz = np.log(_rhs(y, K[0], d, prm, seg, con, scr, general))
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
            _rhs(ytmp, K[i], d, prm, seg, con, scr, general)
        for j in range(n):
            acc[j] = 0.0
        for l in range(ns):
            a = cB[l]
            if a != 0.0:
                for j in range(n):
                    acc[j] += a * K[l, j]
        for j in range(n):
            ynew[j] = y[j] + hh * acc[j]
        nu = _rhs(ynew, K[ns], d, prm, seg, con, scr, general)
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
                    _rhs(y, K[0], d, prm, seg, con, scr, general)
            if lnew >= lthr - _LAND_LOG:
                res = 1
                break
            # S, M, alpha, alpha' in the scratch are those of y (the last RHS call)
            rel = _conv(d, S, M, al, dm, atol, cv)
            c = _converged(conv_mode, rel, cv, conv_tol, y[0], alg)
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
    _rhs(y, K[0], d, prm, int(stops[2, 0]), con, scr, general)
    rel = _conv(d, scr[0], scr[2], scr[5], scr[7], ctl[CTL_ATOL], wk[0])
    c0 = _converged(int(ctl[CTL_CONV_MODE]), rel, wk[0], ctl[CTL_CONV_TOL], 0.0, wk[1])
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


# The kernels: serial (small batches: no thread start-up) or parallel (``prange``: each
# member writes only its own rows, so the results do not depend on the number of threads
# or the schedule), for softmax / linear or for l2 / sinkhorn (``general``, a constant, so
# that each family compiles only its own field).
def _serial_affine(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes):
    for m in range(Y.shape[0]):
        _member_d(m, Y, Yc, traj, h0, False, prm, con, stops, stops_c, ctl, atol_vec, tab, codes)


def _serial_general(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes):
    for m in range(Y.shape[0]):
        _member_d(m, Y, Yc, traj, h0, True, prm, con, stops, stops_c, ctl, atol_vec, tab, codes)


def _parallel_affine(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes):
    for m in _prange(Y.shape[0]):
        _member_d(np.int64(m), Y, Yc, traj, h0, False, prm, con, stops, stops_c, ctl, atol_vec,
                  tab, codes)


def _parallel_general(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes):
    for m in _prange(Y.shape[0]):
        _member_d(np.int64(m), Y, Yc, traj, h0, True, prm, con, stops, stops_c, ctl, atol_vec,
                  tab, codes)


_prange = range
if _nb is not None:
    _prange = _nb.prange
    advance_member = _nb.njit(cache=True)(advance_member)
    _member_d = _nb.njit(cache=True)(_member_d)
    _serial_affine = _nb.njit(cache=True)(_serial_affine)
    _serial_general = _nb.njit(cache=True)(_serial_general)
    _parallel_affine = _nb.njit(cache=True, parallel=True)(_parallel_affine)
    _parallel_general = _nb.njit(cache=True, parallel=True)(_parallel_general)


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
    final states) with :func:`advance_member`, compiled (in parallel from
    :data:`PAR_MIN_MEMBERS` members on) or interpreted; ``traj`` (B, T, n) receives the
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
    if compiled and AVAILABLE:
        par = B >= PAR_MIN_MEMBERS and _nb.get_num_threads() > 1
        kernel = ((_parallel_general if general else _parallel_affine) if par else
                  (_serial_general if general else _serial_affine))
        with _nb.parallel_chunksize(8):   # dynamic scheduling: members differ in cost
            kernel(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes)
    else:
        run = getattr(advance_member, "py_func", advance_member)
        for m in range(B):
            p = m if prm.shape[0] > 1 else 0
            codes[m] = run(Y[m], Yc[m], traj[m], h0[m], prm.shape[-1], general, prm[p], con[p],
                           stops, stops_c, ctl, atol_vec, tab)
    return codes[:, 0], codes[:, 2], Yc, codes[:, 1]
