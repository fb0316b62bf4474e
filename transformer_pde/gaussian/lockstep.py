r"""The integrator of :func:`~transformer_pde.gaussian.solve_batch`: DOP853 on the
reparametrised moment system of each member, ``L`` members at a time in *lanes*.

:func:`run` integrates the members of a batch ``L`` at a time: the states of the ``L``
members in flight are stored structure-of-arrays (the lane index innermost,
``y[component, lane]``), so that every Runge–Kutta stage, every evaluation of the moment
field and every error norm is one loop over lanes that the compiler turns into vector
instructions.  Each lane keeps **its own** step size, error control, stops and size
threshold; the decisions (below) are taken lane by lane in scalar code after each step
(:func:`_decide`, written once); a lane whose member has finished takes the next member
of the batch at once, so the vector width stays busy until the batch runs out.  The lane
count is a parameter: one lane is the member-by-member integrator, which the interpreter
runs (``solve_batch(..., use_numba=False)``, or without numba) as the very same code
(every function here is plain Python that numba compiles where the kernel calls it).

Method
------
DOP853 (Hairer, Nørsett, Wanner: 12 stages, FSAL, the 5th- and 3rd-order error estimates
combined as in ``scipy.integrate.DOP853``), the package's PI controller
(:func:`transformer_pde.integrate.controller.pi_factor`), error norm with the scale
:math:`\mathrm{atol}_j + \mathrm{rtol}\max(|y_j|, |y^{new}_j|)` per component.  Stops
(``t_eval`` points, layer breakpoints, ``t_max``) are landed on to :math:`10^{-12}`
relative by steps aimed with the slope :math:`dt/ds`; the size threshold
:math:`\nu = e^{\ell}` is landed on to :math:`10^{-12}` relative in :math:`\log\nu` by
secant steps in :math:`s`.  Convergence is tested after every accepted step
(:func:`~.member_field.member_converged`: relative, algebraic, absolute or trace
criterion, the rule of :func:`transformer_pde.gaussian.system.converged_codes`).

Codes per member (``codes[m] = (code, continuation code, accepted steps)``): 0 the last
stop reached, 1 the size threshold reached, 2 / 5 / 6 converged (relative, algebraic,
absolute or trace criterion), 3 the step budget spent; a member on the threshold is
continued without output to the classification size
(:data:`~transformer_pde.gaussian.system.CLASSIFY_SIZE`), its code is the second one.

A member's arithmetic is the same on every lane and in every chunk (no sum runs across
lanes, and the compiler contracts no products into fused multiply-adds), so its result
does not depend on the lane, the lane count, the chunking or the thread count; the
compiled and the interpreted runs differ by rounding only (where their ``exp`` / ``log``
round differently: a few ulps per step).  The field is evaluated over all lanes by
:mod:`.lockstep_field` (affine kinds: every lane, for :math:`d = 2` in a few vectorised
loops; l2 / Sinkhorn: the lanes that need it, one by one); a lane that needs the field at
its current state (a new member, the continuation past the threshold, a layer breakpoint)
waits for the next pass, which evaluates it first.  The kernel releases the GIL
(``nogil``): :func:`run` runs chunks of a large batch on a pool of threads.  Not public
API.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .lockstep_field import conv, errors, field_any, field_d2, field_general, stage
from .member_field import jitable, member_converged, pi_rule

__all__ = ["AVAILABLE", "CTL_ATOL", "CTL_BUDGET", "CTL_CONV_MODE", "CTL_CONV_TOL", "CTL_LTHR",
           "CTL_LTHR_C", "CTL_PI", "CTL_RTOL", "LANES", "run"]

try:  # numba is optional: without it the interpreter runs the same code
    import numba as _nb
    from numba.extending import overload as _overload
except ImportError:  # pragma: no cover
    _nb = _overload = None

#: True when numba is installed (the compiled kernel can run).
AVAILABLE = _nb is not None
#: Lanes (members in flight) per kernel call: a few vector widths.
LANES = 64

# indices of the settings array ``ctl`` (:func:`~transformer_pde.gaussian.member.controls`)
CTL_RTOL, CTL_ATOL, CTL_LTHR, CTL_LTHR_C, CTL_CONV_TOL, CTL_CONV_MODE, CTL_BUDGET = range(7)
CTL_PI = 7          # ctl[7:12] = PI controller [alpha, beta, safety, fmin, fmax]
LAND_LOG = 1e-12    # landing tolerance on log(size) at the threshold (relative size error)
# a lane waiting for K[0] at its state: a new member, the continuation, a layer breakpoint
PEND_LOAD, PEND_CONT, PEND_SEG = 1, 2, 3
# float lane state ``lf[index, lane]``
F_H, F_HH, F_HCTRL, F_PREV, F_LSZ, F_KAP, F_LTHR, F_GAP = range(8)
# integer lane state ``li[index, lane]``
(I_MEM, I_PHASE, I_K, I_SEG, I_NATT, I_NACC, I_BUDGET, I_SECANT, I_SZLAND, I_ACT,
 I_AIM, I_PEND) = range(12)


@jitable()
def _lanes(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, cA, cB, cE5, cE3, codes,
           lo, hi, lanes, general):
    """Integrate the members ``lo:hi`` of a batch in ``lanes`` lanes.

    ``Y`` (B, n) the packed states at ``t = 0``, replaced by the final states; ``Yc``
    (B, n) receives the states continued past the threshold (the final state where there
    is no continuation, continuation code -1); ``traj`` (B, T, n) the states at the output
    stops; ``h0`` (B,) the first trial steps; ``prm`` (P, segments, H, 3, d, d) and
    ``con`` (P, 4) the parameters (P = 1: shared; ``con[:, 1]`` = kappa); ``stops`` /
    ``stops_c`` the ``(3, k)`` stop tables ``[time, output row or -1, parameter segment]``
    of the run and of the continuation (last ``inf``); ``ctl`` the settings (``CTL_*``);
    ``atol_vec`` (n,); the DOP853 coefficients ``cA, cB, cE5, cE3``; ``codes`` (B, 3)
    receives ``(code, continuation code, accepted steps)`` per member; ``general``: l2 /
    Sinkhorn (a literal in the compiled kernels: only that field is compiled).

    Each pass evaluates the field ``ns + 1`` times: pass 0 (only when some lane
    (re)started: a new member, the continuation, a layer breakpoint) at the states ``y``,
    into ``K[0]``; passes ``1 .. ns`` at the stages, the last at the new state."""
    n = Y.shape[1]
    d = prm.shape[-1]
    L = max(1, min(lanes, hi - lo))
    ns = cB.shape[0]
    lin = int(con[0, 0]) == 1
    y, ytmp, K = np.zeros((n, L)), np.zeros((n, L)), np.zeros((ns + 1, n, L))
    P = np.zeros((prm.shape[2], 2, d, d, L))
    S, S2, T = np.zeros((d, d, L)), np.zeros((d, d, L)), np.zeros((d, d, L))
    M, MG = np.zeros((d, d, L)), np.zeros((d, d, L))
    al, dm = np.zeros((d, L)), np.zeros((d, L))
    v = np.zeros((8, L))
    accf, v5, v3 = np.zeros((n, L)), np.zeros((n, L)), np.zeros((n, L))
    yl = np.zeros(n)
    scr = (np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, d)),
           np.zeros((d, d)), np.zeros(d), np.zeros(d), np.zeros(d), np.zeros((d, d)),
           np.zeros((d, d)), np.zeros((d, d)))
    lf = np.zeros((8, L))
    kap, hh = lf[F_KAP], lf[F_HH]
    li = np.zeros((12, L), dtype=np.int64)
    nu = np.ones(L)
    ev = np.zeros((5, L))
    cv = np.zeros((L, 3))
    alg = np.full((L, 4), np.inf)
    tabs = (stops, stops_c)
    io = (Y, Yc, h0, codes, traj)
    rel = np.zeros(L)
    nxt = lo
    for m in range(L):
        nxt = _load(m, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg)
    while li[I_ACT].sum() + li[I_PEND].sum() > 0:
        for i in range(ns + 1):
            if i == 0:
                if li[I_PEND].sum() == 0:
                    continue
                for j in range(n):
                    for m in range(L):
                        ytmp[j, m] = y[j, m]
            else:
                if i == 1:
                    _aim(y, K, lf, li, tabs)
                stage(y, K, cA[i] if i < ns else cB, i, hh, accf, ytmp)
            _field(general, i, ytmp, K[i], kap, P, lin, S, S2, T, M, MG, al, dm, nu, v, li,
                   prm, con, yl, scr)
            if i == 0:
                conv(S, M, al, dm, ctl[CTL_ATOL], cv, rel)
                for m in range(L):
                    if li[I_PEND, m] != 0:
                        nxt = _started(m, nu[m], nxt, hi, y, lf, li, io, prm, con, tabs, ctl,
                                       P, rel, cv, alg)
        errors(y, ytmp, K, cE5, cE3, atol_vec, ctl[CTL_RTOL], ev, v5, v3)
        conv(S, M, al, dm, ctl[CTL_ATOL], cv, rel)
        nxt = _decide(nxt, hi, y, ytmp, K, nu, ev, lf, li, io, prm, con, tabs, ctl, P, rel, cv,
                      alg)


def _field(general, i, y, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu, w, li, prm, con, yl,
           scr):
    """The field at the states ``y`` into ``out`` (:mod:`.lockstep_field`) in pass ``i``:
    of every lane (affine kinds) or of the lanes that need it (l2 / Sinkhorn,
    ``general``: in pass 0 the lanes waiting for ``K[0]``, else the active ones)."""
    if general:
        _field_l2s(general, i, y, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu, w, li, prm,
                   con, yl, scr)
    else:
        _field_affine(general, i, y, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu, w, li,
                      prm, con, yl, scr)


def _field_l2s(general, i, y, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu, w, li, prm, con,
               yl, scr):
    field_general(y, out, kap, li[I_PEND] if i == 0 else li[I_ACT], li[I_MEM], li[I_SEG], prm,
                  con, S, S2, M, MG, al, dm, nu, yl, scr)


def _field_affine(general, i, y, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu, w, li, prm,
                  con, yl, scr):
    if S.shape[0] == 2:
        field_d2(y, out, kap, P, lin, S, M, al, dm, nu, w)
    else:
        field_any(y, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu)


if _overload is not None:
    @_overload(_field, strict=False, prefer_literal=True, inline="always",
               jit_options={"error_model": "numpy"})
    def _field_typed(general, i, y, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu, w, li, prm,
                     con, yl, scr):
        # ``general`` is a literal in the compiled kernels: only its field is compiled
        value = getattr(general, "literal_value", None)
        if value is None:
            return _field
        return _field_l2s if value else _field_affine

    jitable("always")(_field_l2s)       # (for a non-literal ``general``)
    jitable("always")(_field_affine)


@jitable()
def _begin(m, phase, y, lf, li, prm, tabs, P):
    """Start phase ``phase`` (0: the run, 1: the continuation past the threshold) of the
    member in lane ``m``: its first stop after its time and the parameters of that
    segment; the lane waits (``I_PEND``) for ``K[0]`` at its state."""
    tab = tabs[phase]
    nst = tab.shape[1]
    k = 0
    while k < nst - 1 and not tab[0, k] > y[0, m]:
        k += 1
    seg = int(tab[2, k])
    mem = li[I_MEM, m]
    _gather(m, mem if prm.shape[0] > 1 else 0, seg, prm, P)
    li[I_PHASE, m] = phase
    li[I_K, m] = k
    li[I_SEG, m] = seg
    li[I_NATT, m] = 0
    li[I_NACC, m] = 0
    li[I_SECANT, m] = 0
    li[I_SZLAND, m] = 0
    li[I_ACT, m] = 0
    li[I_PEND, m] = PEND_LOAD if phase == 0 else PEND_CONT
    lf[F_HCTRL, m] = lf[F_H, m]


@jitable()
def _load(m, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg):
    """Put member ``nxt`` into lane ``m`` (idle when the batch has run out); returns the
    next member to load."""
    Y, h0 = io[0], io[2]
    if nxt >= hi:
        li[I_ACT, m] = 0
        li[I_PEND, m] = 0
        return nxt
    li[I_MEM, m] = nxt
    for j in range(Y.shape[1]):
        y[j, m] = Y[nxt, j]
    lf[F_KAP, m] = con[nxt if con.shape[0] > 1 else 0, 1]
    lf[F_H, m] = h0[nxt]
    lf[F_PREV, m] = 1.0
    lf[F_LTHR, m] = ctl[CTL_LTHR]
    li[I_BUDGET, m] = int(ctl[CTL_BUDGET])
    for j in range(4):
        alg[m, j] = np.inf
    _begin(m, 0, y, lf, li, prm, tabs, P)
    return nxt + 1


@jitable()
def _started(m, num, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, rel, cv, alg):
    """Lane ``m`` got ``K[0]`` (size ``num``) at its state after waiting for it: a new
    member is tested for convergence at ``t = 0`` (finished at once if so), a layer
    breakpoint completes the step that landed on it (convergence test, budget); returns
    the next member to load."""
    kind = li[I_PEND, m]
    li[I_PEND, m] = 0
    if kind == PEND_SEG:
        res = member_converged(int(ctl[CTL_CONV_MODE]), rel[m], cv[m], ctl[CTL_CONV_TOL], y[0, m],
                               alg[m])
        if res <= 0:
            res = 3 if li[I_NATT, m] >= li[I_BUDGET, m] else -1
        if res >= 0:
            return _finish(m, res, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg)
        li[I_ACT, m] = 1
        return nxt
    lf[F_LSZ, m] = np.log(num) if num > 0.0 else -np.inf
    if kind == PEND_LOAD:
        c0 = member_converged(int(ctl[CTL_CONV_MODE]), rel[m], cv[m], ctl[CTL_CONV_TOL], 0.0, alg[m])
        if c0 > 0:
            Y, Yc, codes = io[0], io[1], io[3]
            mem = li[I_MEM, m]
            for j in range(Y.shape[1]):
                Yc[mem, j] = Y[mem, j]
            codes[mem, 0] = c0
            codes[mem, 1] = -1
            codes[mem, 2] = 0
            return _load(m, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg)
    li[I_ACT, m] = 1
    return nxt


@jitable()
def _finish(m, res, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg):
    """The phase of lane ``m`` ended with code ``res``: store the member's results, begin
    its continuation past the threshold or load the next member; returns the next member
    to load."""
    Y, Yc, codes = io[0], io[1], io[3]
    mem = li[I_MEM, m]
    n = Y.shape[1]
    if li[I_PHASE, m] == 0:
        for j in range(n):
            Y[mem, j] = y[j, m]
        codes[mem, 0] = res
        codes[mem, 2] = li[I_NACC, m]
        if res == 1 and ctl[CTL_LTHR_C] > ctl[CTL_LTHR]:
            li[I_BUDGET, m] = max(li[I_BUDGET, m] - li[I_NATT, m], 1)
            lf[F_H, m] = max(lf[F_HCTRL, m], lf[F_H, m])
            lf[F_LTHR, m] = ctl[CTL_LTHR_C]
            for j in range(4):
                alg[m, j] = np.inf
            _begin(m, 1, y, lf, li, prm, tabs, P)
            return nxt
        codes[mem, 1] = -1
    else:
        codes[mem, 1] = res
    for j in range(n):
        Yc[mem, j] = y[j, m]
    return _load(m, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg)


@jitable()
def _decide(nxt, hi, y, ynew, K, nu, ev, lf, li, io, prm, con, tabs, ctl, P, rel, cv, alg):
    """The decisions of every active lane after its step: accept or retry, the next
    step, landing on stops and on the size threshold, the convergence test; a lane whose
    phase ended is finished (:func:`_finish`).  Returns the next member to load.  One
    loop over lanes that passes no array to a function on the common path (no reference
    counting per lane)."""
    n, L = y.shape
    ns = K.shape[0] - 1
    stops, stops_c = tabs
    for m in range(L):
        if li[I_ACT, m] == 0:
            continue
        k = li[I_K, m]
        st = stops[0, k] if li[I_PHASE, m] == 0 else stops_c[0, k]
        hh, h, lsz, lthr = lf[F_HH, m], lf[F_H, m], lf[F_LSZ, m], lf[F_LTHR, m]
        aiming = li[I_AIM, m] == 1
        e5, e3 = ev[0, m], ev[1, m]
        if ev[2, m] != 0.0:
            en = np.inf
        elif e5 == 0.0 and e3 == 0.0:
            en = 0.0
        else:
            en = abs(hh) * e5 / np.sqrt((e5 + 0.01 * e3) * n)
        ok = en <= 1.0
        tn = ynew[0, m]
        tol_l = 1e-12 * max(1.0, abs(st))
        over = ok and (tn > st + tol_l)
        lnew = np.log(nu[m]) if nu[m] > 0.0 else -np.inf
        over_sz = ok and (lnew > lthr + LAND_LOG)
        landed = ok and (not over) and aiming and abs(tn - st) <= tol_l
        accept = ok and not over and not over_sz
        fac, prev = pi_rule(en, lf[F_PREV, m], accept, ctl[CTL_PI], ctl[CTL_PI + 1], ctl[CTL_PI + 2],
                            ctl[CTL_PI + 3], ctl[CTL_PI + 4])
        lf[F_PREV, m] = prev
        h_new = hh * fac
        if over:
            h_new = hh * lf[F_GAP, m] / max(tn - y[0, m], 1e-300)
        if over_sz:
            h_sz = hh * (lthr - lsz) / max(lnew - lsz, 1e-300)
            h_new = h_sz if (not over or h_sz < h_new) else h_new
        if accept and aiming:
            h_new = max(h, h_new)
        sz_land = li[I_SZLAND, m] == 1 or over_sz
        li[I_SZLAND, m] = 1 if sz_land else 0
        aim_sz = False
        if accept and sz_land and lsz < lnew < lthr - LAND_LOG:
            h_sz = hh * (lthr - lnew) / (lnew - lsz)
            if h_sz < h_new:
                h_new = h_sz
                aim_sz = True
        secant_cur = li[I_SECANT, m] == 1
        li[I_SECANT, m] = 1 if (over or over_sz or aim_sz) else 0
        li[I_NATT, m] += 1
        lf[F_H, m] = h_new
        res = -1
        if accept:
            if not aiming and not secant_cur:
                lf[F_HCTRL, m] = hh * fac
            li[I_NACC, m] += 1
            for j in range(n):
                y[j, m] = ynew[j, m]
                K[0, j, m] = K[ns, j, m]
            lf[F_LSZ, m] = lnew
            if landed:
                res = _landed(m, st, k, tabs[li[I_PHASE, m]], y, li, io, prm, P)
            if res < 0 and lnew >= lthr - LAND_LOG:
                res = 1
            if res == -2:     # the convergence and budget tests wait for the new K[0]
                li[I_ACT, m] = 0
                li[I_PEND, m] = PEND_SEG
                continue
            if res < 0:       # rel, cv of lane m are those of y (its last field evaluation)
                c = member_converged(int(ctl[CTL_CONV_MODE]), rel[m], cv[m], ctl[CTL_CONV_TOL],
                                     y[0, m], alg[m])
                if c > 0:
                    res = c
        if res < 0 and li[I_NATT, m] >= li[I_BUDGET, m]:
            res = 3
        if res >= 0:
            nxt = _finish(m, res, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg)
    return nxt


@jitable()
def _landed(m, st, k, tab, y, li, io, prm, P):
    """Lane ``m`` landed on stop ``k`` of ``tab``: the output row and the next stop;
    returns 0 after the last stop, -2 at a layer breakpoint (new parameters: the lane
    waits for ``K[0]``), else -1."""
    y[0, m] = st
    mem = li[I_MEM, m]
    if tab[1, k] >= 0:
        row = int(tab[1, k])
        for j in range(y.shape[0]):
            io[4][mem, row, j] = y[j, m]
    if k == tab.shape[1] - 1:
        return 0
    k += 1
    li[I_K, m] = k
    if int(tab[2, k]) != li[I_SEG, m]:          # a layer breakpoint: the field jumps
        li[I_SEG, m] = int(tab[2, k])
        _gather(m, mem if prm.shape[0] > 1 else 0, li[I_SEG, m], prm, P)
        return -2
    return -1


@jitable()
def _gather(m, p, seg, prm, P):
    """Parameters ``[V^f, A]`` of segment ``seg`` of parameter row ``p`` into lane ``m``."""
    d = prm.shape[-1]
    for h in range(prm.shape[2]):
        for w in range(2):
            for i in range(d):
                for j in range(d):
                    P[h, w, i, j, m] = prm[p, seg, h, w, i, j]


@jitable()
def _aim(y, K, lf, li, tabs):
    """Per lane the step ``lf[F_HH]`` of this attempt: the controller's step, or the step
    aimed at the next stop with the slope dt/ds when that is shorter (idle lanes: 0)."""
    for m in range(y.shape[1]):
        if li[I_ACT, m] == 0:
            lf[F_HH, m] = 0.0
            continue
        gap = tabs[li[I_PHASE, m]][0, li[I_K, m]] - y[0, m]
        h_aim = gap / K[0, 0, m]
        aiming = h_aim <= lf[F_H, m]
        li[I_AIM, m] = 1 if aiming else 0
        lf[F_GAP, m] = gap
        lf[F_HH, m] = h_aim if aiming else lf[F_H, m]


def lanes_affine(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, cA, cB, cE5, cE3,
                codes, lo, hi, lanes):
    _lanes(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, cA, cB, cE5, cE3, codes,
           lo, hi, lanes, False)


def lanes_general(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, cA, cB, cE5, cE3,
                 codes, lo, hi, lanes):
    _lanes(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, cA, cB, cE5, cE3, codes,
           lo, hi, lanes, True)


if _nb is not None:
    from ..backends.compile_notice import install as _install_compile_notice

    _install_compile_notice()  # a cold kernel compilation is said (compile_notice)
    # the compiled kernels: cached on disk, releasing the GIL, IEEE division
    lanes_affine = _nb.njit(cache=True, nogil=True, error_model="numpy")(lanes_affine)
    lanes_general = _nb.njit(cache=True, nogil=True, error_model="numpy")(lanes_general)


def run(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes, general: bool,
        threads: int = 1, lanes: int = LANES, compiled: bool = True) -> None:
    """Integrate every member of ``Y`` (arguments as :func:`_lanes`; ``tab = (A, b, e5,
    e3)`` the DOP853 coefficients): compiled, in one call or in chunks of members on a
    pool of ``threads`` threads (the kernel releases the GIL; each member writes only its
    own rows, so the results do not depend on ``threads``), or without ``compiled`` (or
    numba) by the interpreter in one lane, member by member."""
    B = Y.shape[0]
    cA, cB, cE5, cE3 = (np.ascontiguousarray(c, dtype=float) for c in tab)
    args = (Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, cA, cB, cE5, cE3, codes)
    if not (compiled and AVAILABLE):
        # NumPy scalars: an overflow is a status ("nonfinite"), as in the compiled kernel
        with np.errstate(all="ignore"):
            _lanes(*args, 0, B, 1, general)
        return
    kernel = lanes_general if general else lanes_affine
    if threads <= 1 or B < 2 * lanes:
        kernel(*args, 0, B, lanes)
        return
    n_chunks = min(max(4 * threads, B // 4096), max(1, B // lanes))
    edges = np.linspace(0, B, n_chunks + 1).round().astype(int)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        jobs = [pool.submit(kernel, *args, int(a), int(b), lanes)
                for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]
        for job in jobs:
            job.result()
