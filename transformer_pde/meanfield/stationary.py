r"""Stationary states of noisy unnormalised attention on the sphere, by continuation.

With independent noise :math:`\sigma\,dW` the mean-field equation of the unnormalised
attention (kind ``"exp"``, :math:`Q = K = V = I`, ``shift`` :math:`c`) on
:math:`S^{d-1}` is the McKean–Vlasov equation
:math:`\partial_t\mu = -\nabla\cdot(\mu\nabla\Phi_\mu) + D\Delta\mu`,
:math:`D = \sigma^2/2`, :math:`\Phi_\mu = \frac{e^{-c}}{\beta} W*\mu`,
:math:`W*\mu(x) = \int e^{\beta\langle x, y\rangle}\,d\mu(y)`: a Wasserstein gradient flow of
the free energy

.. math:: \mathcal F(\mu) = D\int\mu\log\mu - \frac{e^{-c}}{2\beta}\iint
          e^{\beta\langle x, y\rangle}\,d\mu(x)\,d\mu(y).

Its stationary states solve the self-consistency (Gibbs) equation
:math:`\mu \propto \exp(\Phi_\mu/D)`.  For a state symmetric about an axis :math:`e`
(*zonal*), :math:`\mu = f(\langle x, e\rangle)\,\sigma_{d}` with :math:`\sigma_d` the
uniform probability measure, write :math:`f = \sum_\ell a_\ell P_\ell` in the Gegenbauer
polynomials normalised by :math:`P_\ell(1) = 1` (cosines :math:`T_\ell` on the circle,
Legendre on :math:`S^2`).  Funk–Hecke makes the convolution diagonal,
:math:`W*(P_\ell(\langle\cdot, e\rangle)) = \hat w_\ell P_\ell`,
:math:`\hat w_\ell = \Gamma(\tfrac d2)(\tfrac2\beta)^{d/2-1} I_{\ell+d/2-1}(\beta)`, and with
:math:`x = K/K_\#` (:math:`K = 1/\sigma^2`,
:func:`~transformer_pde.reductions.noisy.critical_noise`) the equation is

.. math:: f = \frac{e^{U}}{\langle e^{U}\rangle}, \qquad
          U(t) = x\sum_{\ell\ge1}\rho_\ell\,a_\ell\,P_\ell(t), \qquad
          \rho_\ell = \frac{I_{\ell+d/2-1}(\beta)}{I_{d/2}(\beta)},

a system for the coefficients :math:`a_\ell = \langle P_\ell f\rangle/\langle P_\ell^2\rangle`
(averages over the law of :math:`t = \langle y, e\rangle`,
:math:`\propto(1-t^2)^{(d-3)/2}dt`: one-dimensional Gauss–Jacobi quadrature).
:func:`stationary_branch` follows the branch that bifurcates from the uniform state at
:math:`K_\#`, parametrised by the first moment :math:`m = \int\langle x, e\rangle\,d\mu
= a_1/d` (so it passes folds in the noise), with Newton's method on
:math:`(a_2, \dots, a_L, \log x)`.

**Stability.**  A stationary state of this gradient flow is linearly stable exactly when
the Hessian of :math:`\mathcal F/D`,
:math:`H[\varphi] = \int\varphi^2/f\,d\sigma_d - \kappa\langle\varphi, W*\varphi\rangle`
(:math:`\kappa\hat w_\ell = x\rho_\ell`), is non-negative on perturbations of zero mass,
with the rotations as its only null directions (the linearised operator is
:math:`\nabla\cdot(f\nabla\,\cdot)` composed with :math:`H`, whose unstable eigenvalues are
counted by the negative ones of :math:`H`).  :math:`H` splits by the azimuthal sector
:math:`s` of the perturbation; in sector :math:`s` the harmonics are
:math:`(1-t^2)^{s/2}C^{(s+d/2-1)}_{\ell-s}(t)` times a harmonic of degree :math:`s` on
:math:`S^{d-2}` (on the circle: :math:`\cos\ell\theta` and :math:`\sin\ell\theta`), and
Rayleigh–Ritz on the degrees up to ``degrees`` gives its eigenvalues from above.  Sectors
with :math:`x\rho_s \max f < 1` are positive (:math:`H \ge (1/\max f - x\rho_s)
\|\varphi\|^2` there) and are not computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import eval_chebyt, eval_gegenbauer, ive, roots_jacobi

from .. import results_display as display
from ..errors import ArgumentError
from ..reductions.noisy import amplitude_coefficient, critical_noise
from ..results import HasStatus, Status, check_warn, warn_stop
from ..validation import integer, positive, scalar

__all__ = ["StationaryBranch", "stationary_branch"]

#: Newton's method stops when the largest residual of the coefficients is below this
NEWTON_TOL = 1e-12
#: coefficients :math:`\rho_\ell` below this are dropped (their terms are below rounding)
RHO_CUTOFF = 1e-18
#: a branch point is kept only when the self-consistency holds to this on a quadrature
#: of twice the nodes (the check that the nodes resolve the density)
RESOLUTION_TOL = 1e-9


@dataclass(repr=False)
class StationaryBranch(display.Summarised, HasStatus):
    r"""The branch of zonal stationary states bifurcating from the uniform state
    (:func:`stationary_branch`).

    Attributes
    ----------
    beta, shift : float
    d : int
    order : ndarray (P,)
        First moment :math:`m = \int\langle x, e\rangle\,d\mu` of each state (on the circle
        :math:`m = |\int e^{i\theta}d\mu| = 2\pi|\hat\mu_1|`), from 0 (the bifurcation
        point) up.
    coupling : ndarray (P,)
        :math:`K = 1/\sigma^2` at which the state is stationary.
    sigma : ndarray (P,)
        The noise amplitude :math:`\sigma = K^{-1/2}`.
    stable : ndarray (P,) of bool
        Linear stability (the Hessian of the free energy; see the module).
    margin : ndarray (P,)
        The smallest eigenvalue of the Hessian of :math:`\mathcal F/D` over the computed
        sectors, the rotations' null eigenvalue left out; its sign is ``stable``.
    free_energy : ndarray (P,)
        :math:`(\mathcal F(\mu) - \mathcal F(\sigma_d))/D`; negative where the state is
        below the uniform one.
    coefficients : ndarray (P, L+1)
        :math:`a_\ell` of :math:`f = \sum a_\ell P_\ell` (:math:`a_0 = 1`).
    rho : ndarray (L+1,)
        :math:`\rho_\ell = I_{\ell+d/2-1}(\beta)/I_{d/2}(\beta)`.
    critical : float
        :math:`K_\#`.
    fold : float
        The smallest coupling on the branch when it turns there (a subcritical branch:
        the noise :math:`K^{-1/2}` above which the clustered states disappear), else NaN.
    coexistence : float
        The coupling :math:`K_c` where a stable branch state has the free energy of the
        uniform one (a discontinuous transition: :math:`K_c < K_\#`), else NaN.
    status : Status
        ``"ok"`` (reached ``max_order``) or ``"failed"`` (Newton's method or the
        resolution check failed; the states up to there are kept).
    message : str
    """

    beta: float
    d: int
    shift: float
    order: np.ndarray
    coupling: np.ndarray
    sigma: np.ndarray
    stable: np.ndarray
    margin: np.ndarray
    free_energy: np.ndarray
    coefficients: np.ndarray
    rho: np.ndarray
    critical: float
    fold: float
    coexistence: float
    status: Status
    message: str

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        rows = [("order", display.stats_text(self.order)),
                ("K/K_#", display.stats_text(self.coupling / self.critical)),
                ("stable", f"{int(self.stable.sum())} of {self.stable.size}"),
                ("fold", f"{self.fold:.6g}"), ("coexistence", f"{self.coexistence:.6g}"),
                ("message", self.message)]
        return (f"StationaryBranch(status='{self.status}', beta={self.beta:g}, d={self.d}, "
                f"K_#={self.critical:.6g}, points={self.order.size})", rows)

    def potential(self, index: int, t: np.ndarray) -> np.ndarray:
        r""":math:`U(t) - \log\langle e^U\rangle = \log f(t)` of state ``index`` at the
        cosines ``t`` (:math:`t = \langle x, e\rangle \in [-1, 1]`)."""
        basis = _basis(self.d, self.rho.size - 1, np.asarray(t, dtype=float))
        x = self.coupling[index] / self.critical
        u = x * np.tensordot(self.rho[1:] * self.coefficients[index, 1:], basis[1:], axes=1)
        q = _Quadrature(self.d, max(4 * self.rho.size + 64, 256), self.rho.size - 1)
        uq = x * (self.rho[1:] * self.coefficients[index, 1:]) @ q.basis[1:]
        top = float(uq.max())
        return u - top - math.log(float(q.weights @ np.exp(uq - top)))

    def density(self, index: int, t: np.ndarray) -> np.ndarray:
        r"""The density :math:`f(t)` of state ``index`` with respect to the uniform
        probability measure, at the cosines ``t``; on the circle the density in
        :math:`\theta` (integral 1 over :math:`[0, 2\pi)`) is :math:`f(\cos\theta)/(2\pi)`."""
        return np.exp(self.potential(index, t))


# ------------------------------------------------------------------ numerics
def _basis(d: int, n: int, t: np.ndarray, sector: int = 0) -> np.ndarray:
    r"""Rows :math:`\ell = 0..n`: :math:`P_\ell(t)` normalised by :math:`P_\ell(1) = 1`
    (sector 0), or :math:`(1-t^2)^{s/2}C^{(s+\nu)}_{\ell-s}(t)` for :math:`\ell \ge s` (rows
    below :math:`s` zero) in sector :math:`s \ge 1`."""
    nu = d / 2.0 - 1.0
    out = np.zeros((n + 1,) + t.shape)
    for ell in range(sector, n + 1):
        if sector == 0:
            out[ell] = (eval_chebyt(ell, t) if nu == 0 else
                        eval_gegenbauer(ell, nu, t) / eval_gegenbauer(ell, nu, 1.0))
        else:
            out[ell] = (np.sqrt(np.clip(1.0 - t * t, 0.0, None)) ** sector
                        * eval_gegenbauer(ell - sector, sector + nu, t))
    return out


class _Quadrature:
    """Gauss–Jacobi nodes and weights of the law of :math:`t = \\langle y, e\\rangle`
    (:math:`\\propto (1-t^2)^{(d-3)/2}`, weights summing to one), and the sector-0 basis."""

    def __init__(self, d: int, nodes: int, degree: int):
        a = (d - 3) / 2.0
        self.t, w = roots_jacobi(nodes, a, a)
        self.weights = w / w.sum()
        self.basis = _basis(d, degree, self.t)
        self.norms = (self.basis ** 2) @ self.weights

    def state(self, a: np.ndarray, x: float, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(f, U)`` at the nodes for coefficients ``a`` (:math:`\\ell \\ge 1`) and ``x``."""
        u = x * (rho[1:] * a[1:]) @ self.basis[1:]
        e = np.exp(u - u.max())
        return e / (self.weights @ e), u

    def residual(self, a: np.ndarray, x: float, rho: np.ndarray) -> np.ndarray:
        f, _ = self.state(a, x, rho)
        return (self.basis[1:] * f) @ self.weights / self.norms[1:] - a[1:]


def _newton(q: _Quadrature, a: np.ndarray, x: float, rho: np.ndarray,
            max_iter: int = 40) -> tuple[np.ndarray, float] | None:
    r"""Solve the self-consistency with :math:`a_1` held: unknowns
    :math:`(a_2..a_L, \log x)`; ``None`` when Newton's method does not converge."""
    a = a.copy()
    pw = q.basis[1:] * q.weights                       # (L, nodes)
    for _ in range(max_iter):
        f, u = q.state(a, x, rho)
        mean = (q.basis[1:] * f) @ q.weights           # <P_l f>
        r = mean / q.norms[1:] - a[1:]
        if not np.all(np.isfinite(r)):
            return None
        if np.max(np.abs(r)) < NEWTON_TOL:
            return a, x
        cov = (pw * f) @ q.basis[1:].T - np.outer(mean, mean)      # Cov_f(P_l, P_k)
        jac = np.empty((r.size, r.size))
        jac[:, :-1] = (x * rho[2:] * cov[:, 1:]) / q.norms[1:, None]
        jac[np.arange(1, r.size), np.arange(r.size - 1)] -= 1.0
        cu = (pw * f) @ u - mean * (q.weights @ (f * u))            # Cov_f(P_l, U)
        jac[:, -1] = cu / q.norms[1:]
        try:
            step = np.linalg.solve(jac, -r)
        except np.linalg.LinAlgError:
            return None
        a[2:] += step[:-1]
        x *= math.exp(max(min(step[-1], 1.0), -1.0))
    return None


def _sector_min(q: _Quadrature, d: int, f: np.ndarray, x: float, rho: np.ndarray,
                sector: int, degree: int) -> np.ndarray:
    """Sorted eigenvalues of the orthonormalised Hessian in one sector."""
    basis = _basis(d, degree, q.t, sector)[max(sector, 1):]
    ell = np.arange(max(sector, 1), degree + 1)
    rho = np.concatenate([rho, np.zeros(max(0, degree + 1 - rho.size))])   # below rounding
    bw = basis * q.weights
    gram = bw @ basis.T
    h = (bw / f) @ basis.T - np.diag(x * rho[ell] * np.diag(gram))
    scale = 1.0 / np.sqrt(np.diag(gram))
    return np.linalg.eigvalsh(h * scale[:, None] * scale[None, :])


def _stability(q: _Quadrature, d: int, a: np.ndarray, x: float, rho: np.ndarray,
               degree: int) -> float:
    """The Hessian's smallest eigenvalue, the rotation (sector 1's eigenvalue nearest
    zero) left out."""
    f, _ = q.state(a, x, rho)
    top = float(f.max())
    sectors = 2 if d == 2 else max(s for s in range(1, rho.size)
                                   if s == 1 or x * rho[s] * top >= 1.0) + 1
    low = math.inf
    for s in range(sectors):
        ev = _sector_min(q, d, f, x, rho, s, degree)
        if s == 1:
            ev = np.delete(ev, int(np.argmin(np.abs(ev))))
        if ev.size:
            low = min(low, float(ev[0]))
    return low


def _free_energy(q: _Quadrature, a: np.ndarray, x: float, rho: np.ndarray) -> float:
    f, _ = q.state(a, x, rho)
    entropy = float(q.weights @ (f * np.log(f)))
    return entropy - 0.5 * x * float(np.sum(rho[1:] * a[1:] ** 2 * q.norms[1:]))


def _rho(beta: float, d: int) -> np.ndarray:
    nu = d / 2.0 - 1.0
    ell = np.arange(0, 400)
    r = ive(ell + nu, beta) / ive(1.0 + nu, beta)
    keep = int(np.argmax(r[1:] < RHO_CUTOFF)) + 1 if np.any(r[1:] < RHO_CUTOFF) else r.size
    return r[:max(keep, 3)]


def _crossing(x: np.ndarray, y: np.ndarray) -> float:
    """Linear interpolation of ``x`` where ``y`` first changes sign from + to -."""
    idx = np.nonzero((y[:-1] > 0) & (y[1:] <= 0))[0]
    if idx.size == 0:
        return math.nan
    i = int(idx[0])
    return float(x[i] + (x[i + 1] - x[i]) * y[i] / (y[i] - y[i + 1]))


def stationary_branch(beta: float, d: int = 2, *, shift: float = 0.0,
                      max_order: float = 0.9, step: float = 0.01, nodes: int = 192,
                      degrees: int = 48, warn: bool = True) -> StationaryBranch:
    r"""The branch of zonal stationary states of noisy unnormalised attention on
    :math:`S^{d-1}` that bifurcates from the uniform state at :math:`K_\#`, with their
    stability and free energy (see the module for the equations).

    The branch is followed in its first moment :math:`m` from 0 to ``max_order`` in steps
    of ``step`` (halved where Newton's method fails, down to ``step/1024``), starting
    from the amplitude expansion :math:`K/K_\# = 1 + Cm^2`
    (:func:`~transformer_pde.reductions.noisy.amplitude_coefficient`) and predicting
    each state from the two before it.  Every state is checked on a quadrature of twice
    the nodes (:data:`RESOLUTION_TOL`).

    Parameters
    ----------
    beta : float
        :math:`\beta > 0`.
    d : int, default 2
        :math:`S^{d-1}` (:math:`d = 2`: the circle).
    shift : float, default 0.0
        The :math:`c` of the kernel :math:`e^{\beta\langle x, y\rangle - c}`: scales every
        coupling by :math:`e^{c}` (the shapes of the states do not depend on it).
    max_order : float, default 0.9
        Last first moment, in :math:`(0, 1)`; states close to a point mass need many
        nodes.
    step : float, default 0.01
        Step in :math:`m`.
    nodes : int, default 192
        Gauss–Jacobi nodes of the quadrature.
    degrees : int, default 48
        Highest degree of the perturbations in the stability check (Rayleigh–Ritz), at
        most ``nodes // 2``.
    warn : bool, default True
        Issue an :class:`~transformer_pde.errors.EarlyStopWarning` when the branch stops
        before ``max_order``.

    Returns
    -------
    StationaryBranch

    Examples
    --------
    >>> from transformer_pde.meanfield.stationary import stationary_branch
    >>> b = stationary_branch(4.0, 2, max_order=0.8, step=0.05)
    >>> bool(b.fold < b.critical), bool(b.stable[-1]), bool(b.stable[1])
    (True, True, False)
    """
    beta = positive("beta", beta)
    d = integer("d", d, minimum=2)
    shift = scalar("shift", shift)
    max_order = positive("max_order", max_order)
    if max_order >= 1:
        raise ArgumentError(f"max_order must be < 1 (a first moment of 1 is a point mass), "
                            f"got {max_order!r}")
    step = positive("step", step)
    nodes = integer("nodes", nodes, minimum=16)
    degrees = integer("degrees", degrees, minimum=2)
    if degrees > nodes // 2:
        raise ArgumentError(f"degrees={degrees} must be at most nodes // 2 = {nodes // 2}")
    warn = check_warn(warn)
    critical = critical_noise(beta, d, shift=shift, quantity="coupling")
    rho = _rho(beta, d)
    L = rho.size - 1
    q, fine = _Quadrature(d, nodes, L), _Quadrature(d, 2 * nodes, L)
    big = max(degrees, L)
    qh = _Quadrature(d, max(nodes, 2 * big + 2), L)
    C = amplitude_coefficient(beta, d)
    states: list[tuple[float, np.ndarray, float]] = [(0.0, np.eye(L + 1)[0], 1.0)]
    status, message, m, h = Status.OK, "", 0.0, step
    while m < max_order - 1e-12:
        target = min(m + h, max_order)
        a = np.zeros(L + 1)
        a[0], a[1] = 1.0, d * target
        if len(states) >= 2 and states[-1][0] > 0:
            (m0, a0, x0), (m1, a1, x1) = states[-2], states[-1]
            w = (target - m1) / (m1 - m0)
            a[2:] = a1[2:] + w * (a1[2:] - a0[2:])
            x = x1 + w * (x1 - x0)
        else:                                   # the amplitude expansion
            x = 1.0 + C * target * target
            a[2] = x * x * a[1] ** 2 * (d - 1) / (2 * d * (1 - x * rho[2]))
        found = _newton(q, a, max(x, 1e-6), rho)
        if found is not None and np.max(np.abs(fine.residual(*found, rho))) > RESOLUTION_TOL:
            status, message = Status.FAILED, (
                f"the state at m={target:.6g} is not resolved by nodes={nodes} (the "
                f"self-consistency fails by more than {RESOLUTION_TOL:g} on twice the "
                "nodes): raise nodes or lower max_order")
            break
        if found is None:
            if h <= step / 1024:
                status, message = Status.FAILED, (
                    f"Newton's method failed at m={target:.6g} with the step in m at "
                    f"{h:.3g}: the branch cannot be followed past m={m:.6g}")
                break
            h /= 2.0
            continue
        states.append((target, found[0], found[1]))
        m, h = target, min(step, 2.0 * h)
    if status == Status.OK:
        message = (f"followed the branch from m=0 to m={m:.6g} in {len(states) - 1} states "
                   f"({L} coefficients, {nodes} nodes)")
    order = np.array([s[0] for s in states])
    xs = np.array([s[2] for s in states])
    coeffs = np.stack([s[1] for s in states])
    # the first point is the bifurcation point (the uniform state at K_#): neutral
    margin = np.array([0.0] + [_stability(qh, d, s[1], s[2], rho, degrees)
                               for s in states[1:]])
    energy = np.array([_free_energy(q, s[1], s[2], rho) for s in states])
    interior = np.argmin(xs)
    fold = float(xs[interior] * critical) if 0 < interior < xs.size - 1 else math.nan
    coexist = math.nan
    if not math.isnan(fold):
        upper = slice(int(interior), None)
        coexist = _crossing(xs[upper], energy[upper]) * critical
    warn_stop(status, message, warn=warn)
    return StationaryBranch(
        beta=beta, d=d, shift=shift, order=order, coupling=xs * critical,
        sigma=1.0 / np.sqrt(xs * critical), stable=margin > 0, margin=margin,
        free_energy=energy, coefficients=coeffs, rho=rho, critical=critical, fold=fold,
        coexistence=coexist, status=status, message=message)
