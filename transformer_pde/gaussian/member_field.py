r"""Scalar pieces of the integrator of :func:`~transformer_pde.gaussian.solve_batch`
(:mod:`~transformer_pde.gaussian.lockstep`), as plain code that numba compiles where the
kernel calls it and the interpreter runs as is: :func:`jitable`, the PI rule, the
convergence decision of one member (:func:`member_converged`) and the affine field of the
l2 and Sinkhorn kinds at one member's state (:func:`general_affine`; per head as
:func:`transformer_pde.gaussian.affine.head_affine`).  Parameters of one member: ``prm``
(segment, head, [value map :math:`W_O E_h V_h`, score matrix :math:`\beta K_h^\top Q_h`,
key Gram matrix :math:`K_h^\top K_h`], d, d) and ``con = [kind code, kappa, 2 l2_beta,
eps]``.

Not part of the package's public API.  numba's on-disk cache of the kernel of
:mod:`~transformer_pde.gaussian.lockstep` is keyed on that module's source: after editing
this module or :mod:`.lockstep_field`, delete the ``lockstep*`` ``.nbi`` / ``.nbc`` files
of ``gaussian/__pycache__``.
"""

from __future__ import annotations

import numpy as np

from ..integrate.controller import pi_factor
from .system import ALG_K_MIN, ALG_STEADY

__all__: list[str] = []  # not public API

try:  # numba is optional: without it the functions stay plain Python
    from numba.extending import overload as _overload
except ImportError:  # pragma: no cover
    _overload = None

#: Kind codes of ``con[0]``.
KIND_CODES = {"softmax": 0, "linear": 1, "l2": 2, "sinkhorn": 3}


def jitable(inline: str = "never"):
    """Keep a function plain for the interpreter and let numba compile it where a compiled
    kernel calls it (literal arguments stay literal; IEEE division: ``x / 0`` is inf or
    NaN as in the interpreter's NumPy scalars, and loops with divisions vectorise)."""
    def wrap(fn):
        if _overload is not None:
            @_overload(fn, inline=inline, strict=False, prefer_literal=True,
                       jit_options={"error_model": "numpy"})
            def _ov(*args):
                return fn
        return fn
    return wrap


#: The package's PI step-size rule (:func:`~transformer_pde.integrate.controller.pi_factor`),
#: callable from the compiled kernels.
pi_rule = jitable("always")(pi_factor)


@jitable()
def general_affine(y, d, prm, seg, con, scr):
    """The affine field ``M, b`` of an l2 / Sinkhorn member at the state ``y`` (n,) into
    ``scr[2]``, ``scr[6]``: ``M = sum_h Vf_h M0_h``, ``b = sum_h Vf_h b0_h`` (per head
    :func:`_head_l2` / :func:`_head_sinkhorn`) with the parameters ``prm[seg]`` (head, [Vf,
    A, G], d, d) and ``con``; reads Sigma, alpha from ``scr[0]``, ``scr[5]``; the scratch
    ``scr = (S, S2, M, T, MG, alpha, b, b0, W1, W2, F)`` of (d, d) and (d,) arrays."""
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
