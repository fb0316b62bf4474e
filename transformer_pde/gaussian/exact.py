r"""Exact solutions of the Gaussian moment ODEs (references for the solvers and the tests).

1-D softmax and linear laws, softmax with :math:`V = I` (any :math:`d`), commuting symmetric
:math:`V, A, \Sigma_0`, rank-one softmax covariances (paper, Lemma 4.3), and the 1-D L2 and
Sinkhorn variance rates.

The arguments are checked by the package's rules (:mod:`transformer_pde.validation`): a
variance (``var0``, ``var``) must be ``>= 0``, a covariance (``cov0``) symmetric positive
semi-definite, numbers and times finite; otherwise an
:class:`~transformer_pde.errors.ArgumentError` (or ``ArgumentTypeError``) names the
argument.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.integrate import solve_ivp
from scipy.linalg import expm

from .. import validation
from ..errors import ArgumentError, SolverNotConverged
from .affine import psd_factor, sym

__all__ = [
    "blowup_time_identity_value",
    "blowup_time_softmax_1d",
    "exact_linear_1d",
    "exact_rank_one_softmax",
    "exact_softmax_1d",
    "exact_softmax_commuting",
    "exact_softmax_identity_value",
    "l2_variance_rate_1d",
    "sinkhorn_variance_rate_1d",
]


def _scalars_1d(v: Any, a: Any, mean0: Any, var0: Any, beta: Any
                ) -> tuple[float, float, float, float, float]:
    """The scalar arguments of the 1-D references: finite reals, ``var0 >= 0`` (a variance);
    :class:`~transformer_pde.errors.ArgumentError` / ``ArgumentTypeError`` naming the
    argument otherwise."""
    return (validation.scalar("v", v), validation.scalar("a", a),
            validation.scalar("mean0", mean0), validation.nonnegative("var0", var0),
            validation.scalar("beta", beta))


def _square(name: str, value: Any, d: int | None = None) -> np.ndarray:
    """A finite real square matrix (``d x d`` when given), else an error naming ``name``."""
    X = validation.matrix(name, value)
    if X.shape[0] != X.shape[1] or (d is not None and X.shape[0] != d):
        want = f"({d}, {d})" if d is not None else "square"
        raise ArgumentError(f"{name} must be {want}, got shape {X.shape}")
    return X


def exact_softmax_1d(v: float, a: float, mean0: float, var0: float, t: Any, beta: float = 1.0
                     ) -> tuple[np.ndarray, np.ndarray]:
    r"""Exact 1-D softmax moments: :math:`\sigma' = 2 v a\sigma^2`, :math:`\alpha' = v(1 + a\sigma)\alpha`.

    .. math::

        \sigma(t) = \frac{\sigma_0}{1 - 2 v a \sigma_0 t},\qquad
        \alpha(t) = \alpha_0\, e^{v t}\,(1 - 2 v a\sigma_0 t)^{-1/2}

    with :math:`a \to \beta a`; valid for :math:`t < T^*` (:func:`blowup_time_softmax_1d`).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Naming the argument: ``var0 < 0`` (a variance), non-real or non-finite numbers,
        non-finite times ``t``.
    """
    v, a, mean0, var0, beta = _scalars_1d(v, a, mean0, var0, beta)
    a = beta * a
    t = validation.finite_array("t", t)
    den = 1.0 - 2.0 * v * a * var0 * t
    if mean0 == 0.0:       # 0, also where e^{vt} overflows (0 * inf would be nan)
        return np.zeros_like(den), var0 / den
    return mean0 * np.exp(v * t) / np.sqrt(den), var0 / den


def blowup_time_softmax_1d(v: float, a: float, var0: float, beta: float = 1.0) -> float:
    r""":math:`T^* = 1/(2 v \beta a \sigma_0)` if :math:`v\beta a\sigma_0 > 0`, else ``inf``."""
    v, a, _, var0, beta = _scalars_1d(v, a, 0.0, var0, beta)
    r = 2.0 * v * beta * a * var0
    return 1.0 / r if r > 0 else math.inf


def exact_linear_1d(v: float, a: float, mean0: float, var0: float, t: Any, beta: float = 1.0
                    ) -> tuple[np.ndarray, np.ndarray, float]:
    r"""Exact 1-D moments of the ``linear`` kind (:math:`M = v(\sigma + \alpha^2)a`, :math:`b=0`).

    Both :math:`\sigma` and :math:`m = \alpha^2` solve :math:`x' = 2va(\sigma + m)x`, so
    :math:`m/\sigma` is constant and

    .. math::

        \sigma(t) = \frac{\sigma_0}{1 - 2va(\sigma_0 + \alpha_0^2)t},\quad
        \alpha(t) = \alpha_0\sqrt{\sigma(t)/\sigma_0},\quad
        T^* = \frac{1}{2va(\sigma_0 + \alpha_0^2)}

    (for :math:`\alpha_0 = 0`: :math:`\sigma' = 2va\sigma^2`, the same law as softmax).
    Requires ``var0 > 0`` (else :class:`~transformer_pde.errors.ArgumentError` naming it);
    :math:`a \to \beta a`.  Returns ``(mean(t), var(t), T*)``.
    """
    v, a, mean0, var0, beta = _scalars_1d(v, a, mean0, var0, beta)
    validation.positive("var0", var0)
    a = beta * a
    t = validation.finite_array("t", t)
    r = 2.0 * v * a * (var0 + mean0 ** 2)
    den = 1.0 - r * t
    var = var0 / den
    return mean0 / np.sqrt(den), var, (1.0 / r if r > 0 else math.inf)


def exact_softmax_identity_value(A: Any, cov0: Any, t: float, beta: float = 1.0) -> np.ndarray:
    r"""Exact softmax covariance for :math:`V = I`: :math:`\Sigma(t) = (\Sigma_0^{-1} - t(A + A^\top))^{-1}`.

    Computed as :math:`\Sigma_0^{1/2}(I - t\Sigma_0^{1/2} B \Sigma_0^{1/2})^{-1}\Sigma_0^{1/2}`,
    :math:`B = \beta(A + A^\top)`, so singular :math:`\Sigma_0` are allowed. Valid for
    :math:`t < T^*` (:func:`blowup_time_identity_value`).
    """
    A = validation.scalar("beta", beta) * _square("A", A)
    d = A.shape[0]
    S0 = validation.covariance("cov0", cov0, d)
    t = validation.scalar("t", t)
    R = psd_factor(S0)
    X = np.eye(d) - t * (R @ (A + A.T) @ R)
    return sym(R @ np.linalg.solve(X, R))


def blowup_time_identity_value(A: Any, cov0: Any, beta: float = 1.0) -> float:
    r""":math:`T^* = 1/\lambda_{\max}(\Sigma_0^{1/2}\beta(A + A^\top)\Sigma_0^{1/2})` (``inf`` if
    :math:`\lambda_{\max} \le 0`) for softmax with :math:`V = I`."""
    A = validation.scalar("beta", beta) * _square("A", A)
    R = psd_factor(validation.covariance("cov0", cov0, A.shape[0]))
    lam = np.linalg.eigvalsh(sym(R @ (A + A.T) @ R))[-1]
    return 1.0 / lam if lam > 0 else math.inf


def exact_softmax_commuting(V: Any, A: Any, mean0: Any, cov0: Any, t: float, beta: float = 1.0
                            ) -> tuple[np.ndarray, np.ndarray, float]:
    r"""Exact softmax moments when :math:`V`, :math:`A`, :math:`\Sigma_0` are symmetric and commute.

    In a common orthonormal eigenbasis :math:`U` (:math:`V = U\,\mathrm{diag}(v)U^\top`, etc.) the
    ODE decouples into 1-D problems (:func:`exact_softmax_1d`) for the coordinates
    :math:`U^\top\alpha` and eigenvalues :math:`\sigma_i`:
    :math:`\sigma_i(t) = \sigma_i/(1 - 2v_ia_i\sigma_i t)`,
    :math:`(U^\top\alpha)_i(t) = (U^\top\alpha_0)_i e^{v_i t}(1 - 2v_ia_i\sigma_it)^{-1/2}`,
    :math:`T^* = \min_i 1/(2v_ia_i\sigma_i)` over positive denominators.

    Returns ``(mean(t), cov(t), T*)``.  Raises ``ValueError`` if the matrices are not symmetric
    or do not commute (relative tolerance 1e-10).
    """
    V = _square("V", V)
    d = V.shape[0]
    A = validation.scalar("beta", beta) * _square("A", A, d)
    S0 = validation.covariance("cov0", cov0, d)
    m0 = validation.vector("mean0", mean0, d)
    t = validation.scalar("t", t)
    mats = {"V": V, "A": A}
    for n, X in mats.items():
        if np.abs(X - X.T).max() > 1e-10 * max(np.abs(X).max(), 1e-300):
            raise ValueError(f"{n} must be symmetric for the commuting reference")
    for (n1, X), (n2, Y) in [(("V", V), ("A", A)), (("V", V), ("cov0", S0)),
                             (("A", A), ("cov0", S0))]:
        sc = max(np.abs(X).max() * np.abs(Y).max(), 1e-300)
        if np.abs(X @ Y - Y @ X).max() > 1e-10 * sc:
            raise ValueError(f"{n1} and {n2} do not commute")
    rng = np.random.default_rng(12345)
    c = rng.uniform(0.5, 1.5, 3)
    _, U = np.linalg.eigh(c[0] * V + c[1] * math.pi * A + c[2] * math.e * S0)
    v = np.einsum("ji,jk,ki->i", U, V, U)
    a = np.einsum("ji,jk,ki->i", U, A, U)
    s = np.einsum("ji,jk,ki->i", U, S0, U)
    den = 1.0 - 2.0 * v * a * s * t
    r = 2.0 * v * a * s
    Tstar = float(np.min(1.0 / r[r > 0])) if np.any(r > 0) else math.inf
    cov = (U * (s / den)) @ U.T
    mean = U @ ((U.T @ m0) * np.exp(v * t) / np.sqrt(den))
    return mean, cov, Tstar


def exact_rank_one_softmax(V: Any, A: Any, u0: Any, t: Any, beta: float = 1.0,
                           rtol: float = 1e-13) -> np.ndarray:
    r"""Rank-one softmax covariance :math:`\Sigma(t) = u(t)u(t)^\top` (paper, Lemma 4.3).

    With :math:`\Sigma = uu^\top`, :math:`M = V uu^\top A` and :math:`u' = (u^\top A u)\,Vu`:
    rank one stays rank one.  With the clock :math:`d\tau = u^\top A u\,dt`,
    :math:`u = e^{\tau V}u_0` and :math:`\tau(t)` solves the scalar ODE
    :math:`\tau' = \phi(\tau) = u_0^\top e^{\tau V^\top} A e^{\tau V} u_0` (solved here to
    ``rtol``; :math:`T^* = \int_0^\infty d\tau/\phi` when finite).

    Returns ``u(t)`` with shape ``(len(t), d)`` (``t`` sorted, before blow-up).
    """

    V = _square("V", V)
    A = validation.scalar("beta", beta) * _square("A", A, V.shape[0])
    u0 = validation.vector("u0", u0, V.shape[0])
    ts = np.atleast_1d(validation.finite_array("t", t))
    lam, P = np.linalg.eig(V)
    diag = np.linalg.cond(P) < 1e8

    def u_of(tau: float) -> np.ndarray:
        if diag:
            return np.real(P @ (np.exp(tau * lam) * np.linalg.solve(P, u0)))
        return expm(tau * V) @ u0

    def phi(_t: float, y: np.ndarray) -> np.ndarray:
        u = u_of(y[0])
        return np.array([u @ A @ u])

    sol = solve_ivp(phi, (0.0, float(ts.max())), [0.0], method="DOP853", t_eval=ts,
                    rtol=rtol, atol=1e-14)
    if sol.status != 0:
        raise SolverNotConverged(f"rank-one reference failed: {sol.message}")
    return np.stack([u_of(tau) for tau in sol.y[0]])


def l2_variance_rate_1d(v: float, q: float, k: float, var: float, l2_beta: float = 0.5) -> float:
    r"""1-D L2 law :math:`\sigma' = 4\beta' v a\sigma^2/(1 + 2\beta' k^2\sigma)`, :math:`a = kq`."""
    var = validation.nonnegative("var", var)
    return 4.0 * l2_beta * v * k * q * var ** 2 / (1.0 + 2.0 * l2_beta * k * k * var)


def sinkhorn_variance_rate_1d(v: float, a: float, var: float, eps: float = 1.0) -> float:
    r"""1-D Sinkhorn law :math:`\sigma' = (v/a)(\sqrt{\varepsilon^2 + 4a^2\sigma^2} - \varepsilon)`,
    written as :math:`4va\sigma^2/(\varepsilon + \sqrt{\varepsilon^2 + 4a^2\sigma^2})` (valid at a = 0)."""
    var = validation.nonnegative("var", var)
    return 4.0 * v * a * var ** 2 / (eps + math.sqrt(eps * eps + 4.0 * a * a * var * var))
