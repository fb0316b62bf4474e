r"""The lane loops of the integrator of :func:`~transformer_pde.gaussian.solve_batch`
(:mod:`~transformer_pde.gaussian.lockstep`): Runge–Kutta stages, error sums, the moment
field and the convergence measures of ``L`` members at once.

Arrays are structure-of-arrays with the lane index innermost (``y[component, lane]``).
The state of a member is ``[t, rho, G (d*d), alpha_tilde (d)]``
(:class:`~.system.MomentSystem`); with

.. math::

    \Sigma = e^{2\rho} G G^\top, \quad \alpha = \varphi\tilde\alpha, \quad
    \varphi = \sqrt{1 + \kappa\, e^{2\rho}\|G\|_F^2}

and the affine field :math:`\dot x = Mx + b` of the kind, the flow is

.. math::

    \dot t = w^{-1},\ \dot\rho = \mu w^{-1},\ \dot G = (MG - \mu G) w^{-1},\
    \dot{\tilde\alpha} = (\alpha' - \alpha\, \tfrac{d\log\varphi}{dt}) (w\varphi)^{-1},
    \quad \mu = \frac{\langle G, MG\rangle}{\|G\|^2},\ w = 1 + \kappa\nu,

with :math:`\alpha' = M\alpha + b` and the size :math:`\nu = \operatorname{tr}\Sigma`
(:math:`+|\alpha|^2` for linear).  The affine kinds (per head :math:`h`, value map
:math:`V_h^f = W_O E_h V_h`, score matrix :math:`A_h`) have :math:`M = \sum_h V_h^f
\Sigma_2 A_h`, :math:`b = \sum_h V_h^f \alpha` (softmax; :math:`\Sigma_2 = \Sigma`) or
:math:`b = 0` (linear; :math:`\Sigma_2 = \Sigma + \alpha\alpha^\top`): :func:`field_d2`
computes them for :math:`d = 2` in a few loops over lanes with every per-lane quantity in
registers (vector instructions), :func:`field_any` for any :math:`d`; l2 and Sinkhorn
(:func:`field_general`) take :math:`M, b` per lane from
:func:`~transformer_pde.gaussian.member_field.general_affine`.  All perform the same
operations in the same order (no products contracted into fused multiply-adds), so a
member's result does not depend on its lane.  Every function is plain Python that numba
compiles where the kernel calls it (:func:`~.member_field.jitable`), so the interpreter
runs the same code.  Not public API.
"""

from __future__ import annotations

import numpy as np

from .member_field import general_affine, jitable

__all__ = ["conv", "errors", "field_any", "field_d2", "field_general", "stage"]


@jitable()
def stage(y, K, coef, i, hh, acc, ytmp):
    """``ytmp = y + hh * sum_{l < i} coef[l] K[l]`` (zero coefficients skipped, terms
    added in the order of ``l``); ``y``, ``ytmp``, ``acc`` (scratch) (n, L), ``K``
    (stages, n, L), ``hh`` (L,)."""
    n, L = y.shape
    for j in range(n):
        for m in range(L):
            acc[j, m] = 0.0
    for l in range(i):
        a = coef[l]
        if a != 0.0:
            for j in range(n):
                for m in range(L):
                    acc[j, m] += a * K[l, j, m]
    for j in range(n):
        for m in range(L):
            ytmp[j, m] = y[j, m] + hh[m] * acc[j, m]


@jitable()
def errors(y, ynew, K, cE5, cE3, atol_vec, rtol, ev, v5, v3):
    """Per lane the sums of squares of the scaled 5th- and 3rd-order error estimates into
    ``ev[0]``, ``ev[1]``, and ``ev[2]`` = 0 exactly when the new state is finite;
    states as in :func:`stage`, ``v5``, ``v3`` (n, L) are scratch."""
    n, L = y.shape
    for j in range(n):
        for m in range(L):
            v5[j, m] = 0.0
            v3[j, m] = 0.0
    for l in range(K.shape[0]):
        a5 = cE5[l]
        a3 = cE3[l]
        for j in range(n):
            for m in range(L):
                v5[j, m] += a5 * K[l, j, m]
                v3[j, m] += a3 * K[l, j, m]
    for m in range(L):
        ev[0, m] = 0.0
        ev[1, m] = 0.0
        ev[2, m] = 0.0
    for j in range(n):
        s0 = atol_vec[j]
        for m in range(L):
            s = s0 + rtol * max(abs(y[j, m]), abs(ynew[j, m]))
            ev[0, m] += (v5[j, m] / s) ** 2
            ev[1, m] += (v3[j, m] / s) ** 2
            ev[2, m] += ynew[j, m] * 0.0          # NaN when a component is not finite


@jitable()
def field_d2(y, out, kap, P, lin, S, M, al, dm, nu, w):
    """The field at the states ``y`` (n, L) of ``d = 2`` members into ``out``; ``S``, ``M``
    (2, 2, L), ``al``, ``dm`` (2, L) receive :math:`\\Sigma`, :math:`M`, :math:`\\alpha`,
    :math:`\\alpha'` and ``nu`` (L,) the size (as :func:`field_any`); ``w`` (8, L) is
    scratch."""
    L = y.shape[1]
    e2r, phi, s00, s01, s11, cc = w[0], w[1], w[2], w[3], w[4], w[5]
    for m in range(L):
        e2r[m] = np.exp(2.0 * y[1, m])
    for m in range(L):
        g00, g01, g10, g11 = y[2, m], y[3, m], y[4, m], y[5, m]
        g2 = g00 * g00 + g01 * g01 + g10 * g10 + g11 * g11
        tr = e2r[m] * g2
        ph = np.sqrt(1.0 + kap[m] * tr)
        phi[m] = ph
        a0 = ph * y[6, m]
        a1 = ph * y[7, m]
        al[0, m] = a0
        al[1, m] = a1
        c00 = e2r[m] * (g00 * g00 + g01 * g01)
        c10 = e2r[m] * (g10 * g00 + g11 * g01)
        c11 = e2r[m] * (g10 * g10 + g11 * g11)
        S[0, 0, m] = c00
        S[0, 1, m] = c10
        S[1, 0, m] = c10
        S[1, 1, m] = c11
        if lin:
            c00 = c00 + a0 * a0
            c10 = c10 + a1 * a0
            c11 = c11 + a1 * a1
        s00[m] = c00
        s01[m] = c10
        s11[m] = c11
    for m in range(L):
        for r in range(2):
            dm[r, m] = 0.0
            M[r, 0, m] = 0.0
            M[r, 1, m] = 0.0
    for h in range(P.shape[0]):
        for m in range(L):
            b00, b01, b10, b11 = P[h, 1, 0, 0, m], P[h, 1, 0, 1, m], P[h, 1, 1, 0, m], \
                P[h, 1, 1, 1, m]
            v00, v01, v10, v11 = P[h, 0, 0, 0, m], P[h, 0, 0, 1, m], P[h, 0, 1, 0, m], \
                P[h, 0, 1, 1, m]
            t00 = s00[m] * b00 + s01[m] * b10
            t01 = s00[m] * b01 + s01[m] * b11
            t10 = s01[m] * b00 + s11[m] * b10
            t11 = s01[m] * b01 + s11[m] * b11
            M[0, 0, m] += v00 * t00 + v01 * t10
            M[0, 1, m] += v00 * t01 + v01 * t11
            M[1, 0, m] += v10 * t00 + v11 * t10
            M[1, 1, m] += v10 * t01 + v11 * t11
            if not lin:
                dm[0, m] += v00 * al[0, m] + v01 * al[1, m]
                dm[1, m] += v10 * al[0, m] + v11 * al[1, m]
    for m in range(L):
        a0, a1 = al[0, m], al[1, m]
        dm[0, m] = dm[0, m] + M[0, 0, m] * a0 + M[0, 1, m] * a1
        dm[1, m] = dm[1, m] + M[1, 0, m] * a0 + M[1, 1, m] * a1
        g2 = y[2, m] * y[2, m] + y[3, m] * y[3, m] + y[4, m] * y[4, m] + y[5, m] * y[5, m]
        tr = e2r[m] * g2
        nu[m] = tr + (a0 * a0 + a1 * a1) if lin else tr + 0.0
    for m in range(L):
        g00, g01, g10, g11 = y[2, m], y[3, m], y[4, m], y[5, m]
        m00, m01, m10, m11 = M[0, 0, m], M[0, 1, m], M[1, 0, m], M[1, 1, m]
        q00 = m00 * g00 + m01 * g10
        q01 = m00 * g01 + m01 * g11
        q10 = m10 * g00 + m11 * g10
        q11 = m10 * g01 + m11 * g11
        gmg = g00 * q00 + g01 * q01 + g10 * q10 + g11 * q11
        g2 = g00 * g00 + g01 * g01 + g10 * g10 + g11 * g11
        mu = gmg / g2 if g2 > 0 else 0.0
        ph = phi[m]
        o0 = 1.0 / (1.0 + kap[m] * nu[m])
        out[0, m] = o0
        out[1, m] = mu * o0
        c = 0.5 * kap[m] * (2.0 * e2r[m] * gmg) / (ph * ph)
        out[2, m] = (q00 - mu * g00) * o0
        out[3, m] = (q01 - mu * g01) * o0
        out[4, m] = (q10 - mu * g10) * o0
        out[5, m] = (q11 - mu * g11) * o0
        cc[m] = c
    for m in range(L):
        r = out[0, m] / phi[m]
        out[6, m] = (dm[0, m] - al[0, m] * cc[m]) * r
        out[7, m] = (dm[1, m] - al[1, m] * cc[m]) * r


@jitable("always")
def _lane_state(y, m, d, kap, lin, S, S2, al):
    """:math:`\\Sigma`, :math:`\\Sigma_2` and :math:`\\alpha` of lane ``m`` into ``S``,
    ``S2``, ``al``; returns ``(|G|^2, e^(2 rho), tr Sigma, phi)``."""
    nG = d * d
    g2 = 0.0
    for q in range(nG):
        g2 += y[2 + q, m] * y[2 + q, m]
    e2r = np.exp(2.0 * y[1, m])
    trS = e2r * g2
    phi = np.sqrt(1.0 + kap * trS)
    for r in range(d):
        al[r, m] = phi * y[2 + nG + r, m]
    for r in range(d):
        for c in range(r + 1):
            acc = 0.0
            for k in range(d):
                acc += y[2 + r * d + k, m] * y[2 + c * d + k, m]
            acc = e2r * acc
            S[r, c, m] = acc
            S[c, r, m] = acc
            if lin:
                acc = acc + al[r, m] * al[c, m]
            S2[r, c, m] = acc
            S2[c, r, m] = acc
    return g2, e2r, trS, phi


@jitable("always")
def _lane_affine(m, P, lin, S2, T, M, al, dm):
    """``M = sum_h V^f_h S2 A_h`` and ``b = sum_h V^f_h alpha`` (softmax; 0 for linear)
    of lane ``m`` into ``M`` and ``dm``."""
    d = S2.shape[0]
    for r in range(d):
        dm[r, m] = 0.0
        for c in range(d):
            M[r, c, m] = 0.0
    for h in range(P.shape[0]):
        for r in range(d):
            for c in range(d):
                acc = 0.0
                for k in range(d):
                    acc += S2[r, k, m] * P[h, 1, k, c, m]
                T[r, c, m] = acc
        for r in range(d):
            for c in range(d + (0 if lin else 1)):
                acc = 0.0
                for k in range(d):
                    acc += P[h, 0, r, k, m] * (T[k, c, m] if c < d else al[k, m])
                if c < d:
                    M[r, c, m] += acc
                else:
                    dm[r, m] += acc


@jitable("always")
def _lane_flow(y, out, m, d, kap, lin, M, MG, al, dm, nu, g2, e2r, trS, phi):
    """The flow of lane ``m`` into ``out`` from ``M`` and ``b`` (in ``dm``, which receives
    :math:`\\alpha'`); ``nu[m]`` receives the size."""
    nG = d * d
    gmg = 0.0
    for r in range(d):
        for c in range(d):
            acc = 0.0
            for k in range(d):
                acc += M[r, k, m] * y[2 + k * d + c, m]
            MG[r, c, m] = acc
            gmg += y[2 + r * d + c, m] * acc
    a2 = 0.0
    for r in range(d):
        acc = dm[r, m]
        for k in range(d):
            acc += M[r, k, m] * al[k, m]
        dm[r, m] = acc
        a2 += al[r, m] * al[r, m]
    mu = gmg / g2 if g2 > 0 else 0.0
    nu[m] = trS + a2 if lin else trS + 0.0
    iw = 1.0 / (1.0 + kap * nu[m])
    out[0, m] = iw
    out[1, m] = mu * iw
    dlogphi = 0.5 * kap * (2.0 * e2r * gmg) / (phi * phi)
    for r in range(d):
        for c in range(d):
            out[2 + r * d + c, m] = (MG[r, c, m] - mu * y[2 + r * d + c, m]) * iw
    for r in range(d):
        out[2 + nG + r, m] = (dm[r, m] - al[r, m] * dlogphi) * (iw / phi)


@jitable()
def field_any(y, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu):
    """The field of the affine kinds at the states ``y`` (n, L) of members of any ``d``
    into ``out``; ``S``, ``M`` (d, d, L), ``al``, ``dm`` (d, L) receive :math:`\\Sigma`,
    :math:`M`, :math:`\\alpha`, :math:`\\alpha'` and ``nu`` (L,) the size; ``S2``, ``T``,
    ``MG`` (d, d, L) are scratch."""
    d = S.shape[0]
    for m in range(y.shape[1]):
        g2, e2r, trS, phi = _lane_state(y, m, d, kap[m], lin, S, S2, al)
        _lane_affine(m, P, lin, S2, T, M, al, dm)
        _lane_flow(y, out, m, d, kap[m], lin, M, MG, al, dm, nu, g2, e2r, trS, phi)


@jitable()
def field_general(y, out, kap, need, mem, seg, prm, con, S, S2, M, MG, al, dm, nu, yl,
                  scr):
    """The field of l2 / Sinkhorn members at the states ``y`` (n, L) of the lanes with
    ``need[m] != 0`` (the others are left as they are), as :func:`field_any`; lane ``m``
    holds parameter row ``mem[m]`` (row 0 when shared) in segment ``seg[m]`` of ``prm``
    (P, segments, H, 3, d, d) and ``con`` (P, 4); ``yl`` (n,) and ``scr`` (the scratch of
    :func:`~.member_field.general_affine`) are per-lane scratch.  ``d = 2`` is compiled
    with unrolled loops."""
    if S.shape[0] == 2:
        _general_lanes(2, y, out, kap, need, mem, seg, prm, con, S, S2, M, MG, al, dm, nu, yl,
                       scr)
    else:
        _general_lanes(S.shape[0], y, out, kap, need, mem, seg, prm, con, S, S2, M, MG, al,
                       dm, nu, yl, scr)


@jitable()
def _general_lanes(d, y, out, kap, need, mem, seg, prm, con, S, S2, M, MG, al, dm, nu, yl,
                   scr):
    sS, sM, sal, sb = scr[0], scr[2], scr[5], scr[6]
    for m in range(y.shape[1]):
        if need[m] == 0:
            continue
        g2, e2r, trS, phi = _lane_state(y, m, d, kap[m], False, S, S2, al)
        for j in range(y.shape[0]):
            yl[j] = y[j, m]
        for r in range(d):
            sal[r] = al[r, m]
            for c in range(d):
                sS[r, c] = S[r, c, m]
        p = mem[m] if prm.shape[0] > 1 else 0
        general_affine(yl, d, prm[p], seg[m], con[p], scr)
        for r in range(d):
            dm[r, m] = sb[r]
            for c in range(d):
                M[r, c, m] = sM[r, c]
        _lane_flow(y, out, m, d, kap[m], False, M, MG, al, dm, nu, g2, e2r, trS, phi)


@jitable("always")
def _conv_store(m, nS, ndS, trS, dmv, a2, dmm, atol, cv, rel):
    """The relative rate ``rel[m]`` and ``cv[m] = [R, |Sigma'|_F, tr Sigma]`` from the sums
    of squares of :func:`conv` (``nS`` already its root)."""
    rS = np.sqrt(ndS) / (nS + atol)
    rm = np.sqrt(dmv) / (np.sqrt(a2) + np.sqrt(nS) + atol)
    cv[m, 0] = np.sqrt(ndS) + np.sqrt(dmm)
    cv[m, 1] = np.sqrt(ndS)
    cv[m, 2] = trS
    rel[m] = max(rm, rS)


@jitable()
def conv(S, M, al, dm, atol, cv, rel):
    r"""The convergence measures of every lane at its last field evaluation (once per
    accepted step, not per stage): ``rel`` (L,) the relative rate of
    :meth:`~transformer_pde.gaussian.system.MomentSystem.conv_measure`,
    :math:`\max(|\alpha'| / (|\alpha| + |\Sigma|_F^{1/2} + a), |\Sigma'|_F / (|\Sigma|_F +
    a))` with :math:`\Sigma' = M\Sigma + \Sigma M^\top`; ``cv`` (L, 3) ``[R, |Sigma'|_F,
    tr Sigma]`` with ``R = |Sigma'|_F + |(alpha alpha^T)'|_F`` (the rate tested for
    algebraic convergence).  For ``d = 2`` written out (the same operations in the same
    order)."""
    d, L = al.shape
    if d == 2:
        for m in range(L):
            s00, s01, s10, s11 = S[0, 0, m], S[0, 1, m], S[1, 0, m], S[1, 1, m]
            m00, m01, m10, m11 = M[0, 0, m], M[0, 1, m], M[1, 0, m], M[1, 1, m]
            trS = s00 + s11
            nS = s00 * s00 + s01 * s01 + s10 * s10 + s11 * s11
            x00 = (m00 * s00 + s00 * m00) + (m01 * s10 + s01 * m01)
            x01 = (m00 * s01 + s00 * m10) + (m01 * s11 + s01 * m11)
            x10 = (m10 * s00 + s10 * m00) + (m11 * s10 + s11 * m01)
            x11 = (m10 * s01 + s10 * m10) + (m11 * s11 + s11 * m11)
            ndS = x00 * x00 + x01 * x01 + x10 * x10 + x11 * x11
            a0, a1, d0, d1 = al[0, m], al[1, m], dm[0, m], dm[1, m]
            dmv = d0 * d0 + d1 * d1
            a2 = a0 * a0 + a1 * a1
            y00 = d0 * a0 + a0 * d0
            y01 = d0 * a1 + a0 * d1
            y10 = d1 * a0 + a1 * d0
            y11 = d1 * a1 + a1 * d1
            dmm = y00 * y00 + y01 * y01 + y10 * y10 + y11 * y11
            _conv_store(m, np.sqrt(nS), ndS, trS, dmv, a2, dmm, atol, cv, rel)
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
        dmv = 0.0
        a2 = 0.0
        dmm = 0.0
        for i in range(d):
            dmv += dm[i, m] * dm[i, m]
            a2 += al[i, m] * al[i, m]
            for j in range(d):
                x = dm[i, m] * al[j, m] + al[i, m] * dm[j, m]
                dmm += x * x
        _conv_store(m, np.sqrt(nS), ndS, trS, dmv, a2, dmm, atol, cv, rel)
