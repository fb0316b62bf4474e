r"""The lane loops of the lockstep kernel (:mod:`~transformer_pde.gaussian.lockstep`).

Arrays are structure-of-arrays with the lane index innermost (``y[component, lane]``).
The moment field of the affine kinds (per head :math:`h`, value map :math:`V_h^f`, score
matrix :math:`A_h`) at the packed state :math:`[t, \rho, G, \tilde\alpha]` is

.. math::

    \Sigma = e^{2\rho} G G^\top, \quad \alpha = \varphi\tilde\alpha, \quad
    \varphi = \sqrt{1 + \kappa\, e^{2\rho}\|G\|_F^2}, \quad
    M = \sum_h V_h^f\, \Sigma_2 A_h, \quad b = \sum_h V_h^f \alpha \;(\text{softmax}),

with :math:`\Sigma_2 = \Sigma` (softmax) or :math:`\Sigma + \alpha\alpha^\top` (linear), and
the flow of :mod:`.member_field`.  :func:`field_d2` computes it for :math:`d = 2` in a few
loops over lanes with every per-lane quantity in registers (the compiler turns them into
vector instructions); :func:`field_any` for any :math:`d` with one short loop over lanes
per scalar operation.  Both perform the operations of
:func:`~transformer_pde.gaussian.member_field.member_rhs` in the same order (no products
contracted into fused multiply-adds), so the results do not depend on the lane.
:func:`stage` forms a Runge–Kutta stage and :func:`errors` the embedded error sums, each
as one loop over all components and lanes per coefficient.  Not public API.
"""

from __future__ import annotations

import math


__all__ = ["errors", "field_any", "field_d2", "stage"]

try:  # numba is optional: without it the lockstep kernel is not used
    import numba as _nb
except ImportError:  # pragma: no cover
    _nb = None


def njit(fn):
    """``fn`` compiled by numba (cached, releasing the GIL, IEEE division) when numba is
    installed, else ``fn`` itself."""
    if _nb is None:  # pragma: no cover
        return fn
    return _nb.njit(cache=True, nogil=True, error_model="numpy")(fn)


@njit
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


@njit
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


@njit
def field_d2(y, out, kap, P, lin, S, M, al, dm, nu, w):
    """The field at the states ``y`` (n, L) of ``d = 2`` members into ``out``; ``S``, ``M``
    (2, 2, L), ``al``, ``dm`` (2, L) receive :math:`\\Sigma`, :math:`M`, :math:`\\alpha`,
    :math:`\\alpha'` and ``nu`` (L,) the size (as :func:`field_any`); ``w`` (8, L) is
    scratch."""
    L = y.shape[1]
    e2r, phi, s00, s01, s11, cc = w[0], w[1], w[2], w[3], w[4], w[5]
    for m in range(L):
        e2r[m] = math.exp(2.0 * y[1, m])
    for m in range(L):
        g00, g01, g10, g11 = y[2, m], y[3, m], y[4, m], y[5, m]
        g2 = g00 * g00 + g01 * g01 + g10 * g10 + g11 * g11
        tr = e2r[m] * g2
        ph = math.sqrt(1.0 + kap[m] * tr)
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


@njit
def field_any(ytmp, out, kap, P, lin, S, S2, T, M, MG, al, dm, nu, v):
    """The field at the states ``ytmp`` (n, L) of members of any ``d`` into ``out``;
    ``S``, ``M`` (d, d, L), ``al``, ``dm`` (d, L) receive :math:`\\Sigma`, :math:`M`,
    :math:`\\alpha`, :math:`\\alpha'` and ``nu`` (L,) the size :math:`\\operatorname{tr}
    \\Sigma` (softmax) or :math:`\\operatorname{tr}\\Sigma + |\\alpha|^2` (linear); ``S2``,
    ``T``, ``MG`` (d, d, L) and ``v`` (8, L) are scratch."""
    n, L = ytmp.shape
    d = S.shape[0]
    nG = d * d
    g2, e2r, trS, phi, acc, gmg, a2, mu = v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    for m in range(L):
        # --- the field at ytmp: Sigma, S2, alpha (the state) ---
        g2[m] = 0.0
        for q in range(nG):
            g2[m] += ytmp[2 + q, m] * ytmp[2 + q, m]
        e2r[m] = math.exp(2.0 * ytmp[1, m])
        trS[m] = e2r[m] * g2[m]
        phi[m] = math.sqrt(1.0 + kap[m] * trS[m])
        for r in range(d):
            al[r, m] = phi[m] * ytmp[2 + nG + r, m]
        for r in range(d):
            for c in range(r + 1):
                acc[m] = 0.0
                for k in range(d):
                    acc[m] += ytmp[2 + r * d + k, m] * ytmp[2 + c * d + k, m]
                acc[m] = e2r[m] * acc[m]
                S[r, c, m] = acc[m]
                S[c, r, m] = acc[m]
                if lin:
                    acc[m] = acc[m] + al[r, m] * al[c, m]
                S2[r, c, m] = acc[m]
                S2[c, r, m] = acc[m]
        # --- M = sum_h V^f_h S2 A_h, b = sum_h V^f_h alpha (softmax), in dm ---
        for r in range(d):
            dm[r, m] = 0.0
            for c in range(d):
                M[r, c, m] = 0.0
        for h in range(P.shape[0]):
            for r in range(d):
                for c in range(d):
                    acc[m] = 0.0
                    for k in range(d):
                        acc[m] += S2[r, k, m] * P[h, 1, k, c, m]
                    T[r, c, m] = acc[m]
            for r in range(d):
                for c in range(d + (0 if lin else 1)):
                    acc[m] = 0.0
                    for k in range(d):
                        acc[m] += P[h, 0, r, k, m] * (T[k, c, m] if c < d else al[k, m])
                    if c < d:
                        M[r, c, m] += acc[m]
                    else:
                        dm[r, m] += acc[m]
        # --- the flow of [t, rho, G, alpha~]; dm becomes alpha' ---
        gmg[m] = 0.0
        a2[m] = 0.0
        for r in range(d):
            for c in range(d):
                acc[m] = 0.0
                for k in range(d):
                    acc[m] += M[r, k, m] * ytmp[2 + k * d + c, m]
                MG[r, c, m] = acc[m]
                gmg[m] += ytmp[2 + r * d + c, m] * acc[m]
        for r in range(d):
            acc[m] = dm[r, m]
            for k in range(d):
                acc[m] += M[r, k, m] * al[k, m]
            dm[r, m] = acc[m]
            a2[m] += al[r, m] * al[r, m]
        mu[m] = gmg[m] / g2[m] if g2[m] > 0 else 0.0
        nu[m] = trS[m] + a2[m] if lin else trS[m] + 0.0
        out[0, m] = 1.0 / (1.0 + kap[m] * nu[m])
        out[1, m] = mu[m] * out[0, m]
        acc[m] = 0.5 * kap[m] * (2.0 * e2r[m] * gmg[m]) / (phi[m] * phi[m])
        for r in range(d):
            for c in range(d):
                out[2 + r * d + c, m] = ((MG[r, c, m] - mu[m] * ytmp[2 + r * d + c, m])
                                         * out[0, m])
        for r in range(d):
            out[2 + nG + r, m] = (dm[r, m] - al[r, m] * acc[m]) * (out[0, m] / phi[m])
