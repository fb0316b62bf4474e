r"""Members of :func:`~transformer_pde.gaussian.solve_batch` in SIMD lockstep (softmax, linear).

The compiled kernel :func:`run_lanes` integrates the members of a batch ``L`` at a time in
*lanes*: the states of the ``L`` members in flight are stored structure-of-arrays (the lane
index innermost, ``y[component, lane]``), so that every Runge–Kutta stage, every
evaluation of the moment field and every error norm is one loop over lanes that the
compiler turns into vector instructions.  Each lane keeps **its own** step size, error
control, stops and size threshold: the decisions of
:func:`transformer_pde.gaussian.member.advance_member` (DOP853, the PI rule, landing on
stops and on the size threshold by secant steps, the convergence tests, the continuation
to the classification size) are taken lane by lane in scalar code after each step; a lane
whose member has finished takes the next member of the batch at once, so the vector
width stays busy until the batch runs out.

A member's arithmetic is the same on every lane and in every chunk (no sum runs across
lanes, and the compiler contracts no products into fused multiply-adds), so its result
does not depend on the lane, the lane count, the chunking or the thread count.  The
operations and their order are those of the per-member integrator, so the results agree
with it up to rounding (where exp, log and sqrt round differently, e.g. compiled against
interpreted).  The field of the affine kinds is (per head :math:`h`, value map
:math:`V_h^f = W_O E_h V_h`, score matrix :math:`A_h = \beta K_h^\top Q_h`)

.. math::

    M = \sum_h V_h^f\, \Sigma_2 A_h, \qquad b = \sum_h V_h^f \alpha \;(\text{softmax}),
    \quad b = 0 \;(\text{linear}),

with :math:`\Sigma_2 = \Sigma` (softmax) or :math:`\Sigma + \alpha\alpha^\top` (linear);
the flow of the state :math:`[t, \rho, G, \tilde\alpha]` is that of :mod:`.member_field`.

The field is evaluated over all lanes by :mod:`.lockstep_field` (for :math:`d = 2` in a
few vectorised loops with every per-lane quantity in registers); a lane that needs the
field at its current state (a new member, the continuation past the threshold, a layer
breakpoint) waits for the next pass, which evaluates it first.  The per-lane decisions
after a step run in one loop over lanes (:func:`_decide`) that passes no array to a
function on the common path.  The kernel releases the GIL (``nogil``):
:func:`run_chunks` runs chunks of a large batch on a pool of threads (numba's thread
count) instead of a ``prange`` loop, which is costly to compile.  Not public API.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .lockstep_field import errors, field_any, field_d2, stage
from .member_field import member_converged, pi_rule

__all__ = ["AVAILABLE", "LANES", "run_chunks", "run_lanes"]

try:  # numba is optional: without it solve_batch runs the interpreted per-member path
    import numba as _nb
except ImportError:  # pragma: no cover
    _nb = None

#: True when numba is installed (the lockstep kernel can run).
AVAILABLE = _nb is not None
#: Lanes (members in flight) per kernel call: a few vector widths.
LANES = 64

# indices of the settings array ``ctl`` (as in member.py)
_RTOL, _ATOL, _LTHR, _LTHR_C, _CONV_TOL, _CONV_MODE, _BUDGET, _PI = 0, 1, 2, 3, 4, 5, 6, 7
_LAND = 1e-12            # landing tolerance on log(size) at the threshold
# a lane waiting for K[0] at its state: a new member, the continuation, a layer breakpoint
PEND_LOAD, PEND_CONT, PEND_SEG = 1, 2, 3
# float lane state ``lf[index, lane]``
F_H, F_HH, F_HCTRL, F_PREV, F_LSZ, F_KAP, F_LTHR, F_GAP = range(8)
# integer lane state ``li[index, lane]``
(I_MEM, I_PHASE, I_K, I_SEG, I_NATT, I_NACC, I_BUDGET, I_SECANT, I_SZLAND, I_ACT,
 I_AIM, I_PEND) = range(12)


def njit(fn):
    """``fn`` compiled by numba (cached on disk, releasing the GIL, IEEE division) when
    numba is installed, else ``fn`` itself."""
    if _nb is None:  # pragma: no cover
        return fn
    return _nb.njit(cache=True, nogil=True, error_model="numpy")(fn)


@njit
def run_lanes(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, cA, cB, cE5, cE3,
              codes, lo, hi, lanes):
    """Integrate the members ``lo:hi`` of a batch in ``lanes`` lanes.

    Arguments as :func:`transformer_pde.gaussian.member.run_members` gives them to the
    per-member integrator (affine kinds only): ``Y`` (B, n) the packed states at
    ``t = 0``, replaced by the final states; ``Yc`` (B, n) receives the states continued
    past the threshold; ``traj`` (B, T, n) the states at the output stops; ``h0`` (B,) the
    first trial steps; ``prm`` (P, segments, H, 3, d, d) and ``con`` (P, 4) the parameters
    (P = 1: shared); ``stops`` / ``stops_c`` the stop tables of the run and of the
    continuation; ``ctl`` the settings; ``atol_vec`` (n,); the DOP853 coefficients
    ``cA, cB, cE5, cE3``; ``codes`` (B, 3) receives ``(code, continuation code, accepted
    steps)`` per member.

    Each pass evaluates the field ``ns + 1`` times over all lanes: pass 0 (only when some
    lane (re)started: a new member, the continuation, a layer breakpoint) at the states
    ``y``, into ``K[0]``; passes ``1 .. ns`` at the stages, the last at the new state.
    The field is :func:`~.lockstep_field.field_d2` (d = 2) or
    :func:`~.lockstep_field.field_any`."""
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
            if d == 2:
                field_d2(ytmp, K[i], kap, P, lin, S, M, al, dm, nu, v)
            else:
                field_any(ytmp, K[i], kap, P, lin, S, S2, T, M, MG, al, dm, nu, v)
            if i == 0:
                _conv_lanes(S, M, al, dm, ctl[_ATOL], cv, rel)
                for m in range(L):
                    if li[I_PEND, m] != 0:
                        nxt = _started(m, nu[m], nxt, hi, y, lf, li, io, prm, con, tabs, ctl,
                                       P, rel, cv, alg)
        errors(y, ytmp, K, cE5, cE3, atol_vec, ctl[_RTOL], ev, v5, v3)
        _conv_lanes(S, M, al, dm, ctl[_ATOL], cv, rel)
        nxt = _decide(nxt, hi, y, ytmp, K, nu, ev, lf, li, io, prm, con, tabs, ctl, P, rel, cv,
                      alg)


@njit
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


@njit
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
    lf[F_LTHR, m] = ctl[_LTHR]
    li[I_BUDGET, m] = int(ctl[_BUDGET])
    for j in range(4):
        alg[m, j] = np.inf
    _begin(m, 0, y, lf, li, prm, tabs, P)
    return nxt + 1


@njit
def _started(m, num, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, rel, cv, alg):
    """Lane ``m`` got ``K[0]`` (size ``num``) at its state after waiting for it: a new
    member is tested for convergence at ``t = 0`` (finished at once if so), a layer
    breakpoint completes the step that landed on it (convergence test, budget); returns
    the next member to load."""
    kind = li[I_PEND, m]
    li[I_PEND, m] = 0
    if kind == PEND_SEG:
        res = member_converged(int(ctl[_CONV_MODE]), rel[m], cv[m], ctl[_CONV_TOL], y[0, m],
                               alg[m])
        if res <= 0:
            res = 3 if li[I_NATT, m] >= li[I_BUDGET, m] else -1
        if res >= 0:
            return _finish(m, res, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg)
        li[I_ACT, m] = 1
        return nxt
    lf[F_LSZ, m] = math.log(num)
    if kind == PEND_LOAD:
        c0 = member_converged(int(ctl[_CONV_MODE]), rel[m], cv[m], ctl[_CONV_TOL], 0.0, alg[m])
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


@njit
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
        if res == 1 and ctl[_LTHR_C] > ctl[_LTHR]:
            li[I_BUDGET, m] = max(li[I_BUDGET, m] - li[I_NATT, m], 1)
            lf[F_H, m] = max(lf[F_HCTRL, m], lf[F_H, m])
            lf[F_LTHR, m] = ctl[_LTHR_C]
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


@njit
def _decide(nxt, hi, y, ynew, K, nu, ev, lf, li, io, prm, con, tabs, ctl, P, rel, cv, alg):
    """The decisions of every active lane after its step (those of the per-member
    integrator): accept or retry, the next step, landing on stops and on the size
    threshold, the convergence test; a lane whose phase ended is finished
    (:func:`_finish`).  Returns the next member to load.  One loop over lanes that passes
    no array to a function on the common path (no reference counting per lane)."""
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
            en = abs(hh) * e5 / math.sqrt((e5 + 0.01 * e3) * n)
        ok = en <= 1.0
        tn = ynew[0, m]
        tol_l = 1e-12 * max(1.0, abs(st))
        over = ok and (tn > st + tol_l)
        lnew = math.log(nu[m]) if nu[m] > 0.0 else -np.inf
        over_sz = ok and (lnew > lthr + _LAND)
        landed = ok and (not over) and aiming and abs(tn - st) <= tol_l
        accept = ok and not over and not over_sz
        fac, prev = pi_rule(en, lf[F_PREV, m], accept, ctl[_PI], ctl[_PI + 1], ctl[_PI + 2],
                            ctl[_PI + 3], ctl[_PI + 4])
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
        if accept and sz_land and lsz < lnew < lthr - _LAND:
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
            if res < 0 and lnew >= lthr - _LAND:
                res = 1
            if res == -2:     # the convergence and budget tests wait for the new K[0]
                li[I_ACT, m] = 0
                li[I_PEND, m] = PEND_SEG
                continue
            if res < 0:       # rel, cv of lane m are those of y (its last field evaluation)
                c = member_converged(int(ctl[_CONV_MODE]), rel[m], cv[m], ctl[_CONV_TOL],
                                     y[0, m], alg[m])
                if c > 0:
                    res = c
        if res < 0 and li[I_NATT, m] >= li[I_BUDGET, m]:
            res = 3
        if res >= 0:
            nxt = _finish(m, res, nxt, hi, y, lf, li, io, prm, con, tabs, ctl, P, alg)
    return nxt


@njit
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


@njit
def _conv_lanes(S, M, al, dm, atol, cv, rel):
    """:func:`~transformer_pde.gaussian.member_field.member_conv` of every lane at its last
    field evaluation: ``rel`` (L,) the relative rate, ``cv`` (L, 3) ``[R, |Sigma'|_F,
    tr Sigma]``."""
    d, L = al.shape
    if d == 2:
        _conv_d2(S, M, al, dm, atol, cv, rel)
        return
    for m in range(L):
        nS = 0.0
        ndS = 0.0
        trS = 0.0
        for i in range(d):
            trS += S[i, i, m]
            for j in range(d):
                nS += S[i, j, m] * S[i, j, m]
                acc = 0.0
                for k in range(d):
                    acc += M[i, k, m] * S[k, j, m] + S[i, k, m] * M[j, k, m]
                ndS += acc * acc
        nS = math.sqrt(nS)
        rS = math.sqrt(ndS) / (nS + atol)
        dmv = 0.0
        a2 = 0.0
        dmm = 0.0
        for i in range(d):
            dmv += dm[i, m] * dm[i, m]
            a2 += al[i, m] * al[i, m]
            for j in range(d):
                x = dm[i, m] * al[j, m] + al[i, m] * dm[j, m]
                dmm += x * x
        rm = math.sqrt(dmv) / (math.sqrt(a2) + math.sqrt(nS) + atol)
        cv[m, 0] = math.sqrt(ndS) + math.sqrt(dmm)
        cv[m, 1] = math.sqrt(ndS)
        cv[m, 2] = trS
        rel[m] = max(rm, rS)


@njit
def _conv_d2(S, M, al, dm, atol, cv, rel):
    """:func:`_conv_lanes` for ``d = 2`` written out (the same operations in the same
    order)."""
    for m in range(al.shape[1]):
        s00, s01, s10, s11 = S[0, 0, m], S[0, 1, m], S[1, 0, m], S[1, 1, m]
        m00, m01, m10, m11 = M[0, 0, m], M[0, 1, m], M[1, 0, m], M[1, 1, m]
        trS = s00 + s11
        nS = s00 * s00 + s01 * s01 + s10 * s10 + s11 * s11
        x00 = (m00 * s00 + s00 * m00) + (m01 * s10 + s01 * m01)
        x01 = (m00 * s01 + s00 * m10) + (m01 * s11 + s01 * m11)
        x10 = (m10 * s00 + s10 * m00) + (m11 * s10 + s11 * m01)
        x11 = (m10 * s01 + s10 * m10) + (m11 * s11 + s11 * m11)
        ndS = x00 * x00 + x01 * x01 + x10 * x10 + x11 * x11
        nS = math.sqrt(nS)
        rS = math.sqrt(ndS) / (nS + atol)
        a0, a1, d0, d1 = al[0, m], al[1, m], dm[0, m], dm[1, m]
        dmv = d0 * d0 + d1 * d1
        a2 = a0 * a0 + a1 * a1
        y00 = d0 * a0 + a0 * d0
        y01 = d0 * a1 + a0 * d1
        y10 = d1 * a0 + a1 * d0
        y11 = d1 * a1 + a1 * d1
        dmm = y00 * y00 + y01 * y01 + y10 * y10 + y11 * y11
        rm = math.sqrt(dmv) / (math.sqrt(a2) + math.sqrt(nS) + atol)
        cv[m, 0] = math.sqrt(ndS) + math.sqrt(dmm)
        cv[m, 1] = math.sqrt(ndS)
        cv[m, 2] = trS
        rel[m] = max(rm, rS)


@njit
def _gather(m, p, seg, prm, P):
    """Parameters ``[V^f, A]`` of segment ``seg`` of parameter row ``p`` into lane ``m``."""
    d = prm.shape[-1]
    for h in range(prm.shape[2]):
        for w in range(2):
            for i in range(d):
                for j in range(d):
                    P[h, w, i, j, m] = prm[p, seg, h, w, i, j]


@njit
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



def run_chunks(Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, tab, codes,
               threads: int, lanes: int = LANES) -> None:
    """:func:`run_lanes` over the whole batch: one call, or chunks of members on a pool
    of ``threads`` threads (the kernel releases the GIL; each member writes only its own
    rows, so the results do not depend on ``threads``)."""
    B = Y.shape[0]
    cA, cB, cE5, cE3 = (np.ascontiguousarray(c, dtype=float) for c in tab)
    args = (Y, Yc, traj, h0, prm, con, stops, stops_c, ctl, atol_vec, cA, cB, cE5, cE3, codes)
    if threads <= 1 or B < 2 * lanes:
        run_lanes(*args, 0, B, lanes)
        return
    n_chunks = min(max(4 * threads, B // 4096), max(1, B // lanes))
    edges = np.linspace(0, B, n_chunks + 1).round().astype(int)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        jobs = [pool.submit(run_lanes, *args, int(a), int(b), lanes)
                for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]
        for job in jobs:
            job.result()


if _nb is not None:
    from ..backends.compile_notice import install as _install_compile_notice

    _install_compile_notice()  # a cold kernel compilation is said (compile_notice)
