r"""The right-hand side of the per-member integrator (:mod:`transformer_pde.gaussian.member`):
the reparametrised moment system of one Gaussian and its convergence measures, as plain
scalar code that numba compiles where a kernel calls it and the interpreter runs as is.

The state is ``[t, rho, G (d*d), alpha_tilde (d)]`` (:class:`~.system.MomentSystem`);
with :math:`\Sigma = e^{2\rho}GG^\top`, :math:`\alpha = \varphi\tilde\alpha` and the affine
field :math:`M, b` of the kind (per head as
:func:`transformer_pde.gaussian.affine.head_affine`), :func:`member_rhs` returns
:math:`dY/ds` (:mod:`transformer_pde.gaussian`).  Parameters of one member: ``prm``
(segment, head, [value map :math:`W_O E_h V_h`, score matrix :math:`\beta K_h^\top Q_h`,
key Gram matrix :math:`K_h^\top K_h`], d, d) and ``con = [kind code, kappa, 2 l2_beta,
eps]``.

Not part of the package's public API: the names are shared with
:mod:`~transformer_pde.gaussian.member` only.  numba's on-disk cache of the kernels of
:mod:`~transformer_pde.gaussian.member` is keyed on that module's source: after editing this
module, delete the ``member*`` and ``lockstep*`` ``.nbi`` / ``.nbc`` files of
``gaussian/__pycache__``.
"""

from __future__ import annotations

import numpy as np

from ..integrate.controller import pi_factor
from .system import ALG_K_MIN, ALG_STEADY

__all__: list[str] = []

try:  # numba is optional: without it the functions stay plain Python
    from numba.extending import overload as _overload
except ImportError:  # pragma: no cover
    _overload = None

#: Kind codes of ``con[0]``.
KIND_CODES = {"softmax": 0, "linear": 1, "l2": 2, "sinkhorn": 3}


def jitable(inline: str = "never"):
    """Keep a function plain for the interpreter and let numba compile it where a compiled
    kernel calls it (literal arguments such as ``d = 2`` stay literal: unrolled loops)."""
    def wrap(fn):
        if _overload is not None:
            @_overload(fn, inline=inline, strict=False, prefer_literal=True)
            def _ov(*args):
                return fn
        return fn
    return wrap


#: The package's PI step-size rule (:func:`~transformer_pde.integrate.controller.pi_factor`),
#: callable from the compiled kernels.
pi_rule = jitable("always")(pi_factor)


def member_rhs(y, out, d, prm, seg, con, scr, general):
    """dY/ds of one member into ``out`` with the parameters ``prm[seg]`` (head, [Vf, A, G],
    d, d); leaves S, M, alpha, alpha' in the scratch (read by :func:`member_conv`) and returns
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
    @_overload(member_rhs, strict=False, prefer_literal=True)
    def _rhs_typed(y, out, d, prm, seg, con, scr, general):
        # ``general`` is a literal in the batch kernels: only its field is compiled
        value = getattr(general, "literal_value", None)
        if value is None:
            return member_rhs
        if value:
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


@jitable("always")
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


@jitable("always")
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


@jitable()
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


@jitable("always")
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


@jitable()
def _matmul(out, X, Y, d):
    """``out = X @ Y`` (d x d)."""
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for k in range(d):
                acc += X[i, k] * Y[k, j]
            out[i, j] = acc


@jitable()
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


@jitable()
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


@jitable()
def member_conv(d, S, M, al, dmean, atol, cv):
    """Convergence measures from the scratch of the last :func:`member_rhs` call (evaluated once
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


@jitable()
def member_converged(mode, rel, cv, conv_tol, t, alg):
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
