r"""Equiangular tokens on the sphere: the attention flow as one or two scalar ODEs.

If :math:`n` unit tokens start with the same inner product :math:`\rho_0` for every pair,
the flow :math:`\dot\theta_i = s\,P_{\theta_i} A_i`, :math:`A_i = \sum_j w_{ij}\theta_j`,
commutes with every permutation of the tokens, so the configuration stays equiangular:
the state is :math:`\rho(t)` (and a common radius :math:`r(t)` for the normalisation
schemes whose residual stream leaves the sphere).  With :math:`u = 1-\rho`,

.. math::
    \tau = \langle A_i, \theta_k\rangle - \rho\,\langle A_i, \theta_i\rangle
         = \frac{e^{\beta\rho}(1-\rho)(1+(n-1)\rho)}{Z}, \qquad
    a = \langle \theta_i, A_i\rangle = \frac{e^{\beta} + (n-1)\rho e^{\beta\rho}}{Z},

    |A_i|^2 = \frac{e^{2\beta} + 2(n-1)\rho e^{\beta} e^{\beta\rho}
                    + (n-1)(1+(n-2)\rho) e^{2\beta\rho}}{Z^2},

:math:`Z = e^\beta + (n-1)e^{\beta\rho}` for softmax (``"sa"``) and
:math:`Z = n e^{\mathrm{shift}}` for the unnormalised kernel (``"usa"``).  A scheme
:math:`\dot\theta = s\,P_\theta A`, :math:`\dot r = g\,\langle\theta, A\rangle` gives
:math:`\dot\rho = 2 s\tau` and :math:`\dot r = g a`.  The ODE is integrated in
:math:`v = \log\frac{1+(n-1)\rho}{1-\rho}` and :math:`\log r`: since
:math:`\tau = (1-\rho)(1+(n-1)\rho)\,k` with :math:`k = e^{\beta\rho}/Z`,
:math:`\dot v = 2 n s k` is smooth and bounded for all :math:`\rho`, and both
:math:`1-\rho` (near :math:`\rho = 1`) and :math:`1+(n-1)\rho` (near the regular simplex
:math:`\rho = -1/(n-1)`) keep their relative accuracy (the derivation is on the
documentation page *Exact reductions on the sphere*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy.integrate import solve_ivp

from .. import results_display as display
from ..errors import ArgumentError, SolverNotConverged
from ..validation import choice, positive, scalar
from .args import (OVERFLOW_EXPONENT, check_beta, check_model, check_n, check_rho,
                   check_shift, check_times, lower_rho)

__all__ = ["EquiangularSolution", "SCHEMES", "equiangular", "equiangular_rates", "gap_and_rho"]

#: the normalisation schemes :math:`\dot\theta = s P_\theta A`, :math:`\dot r = g\langle\theta, A\rangle`
SCHEMES = ("post", "pre", "peri", "ngpt", "cod", "mix")
#: tolerances of the DOP853 solve in :math:`(\log(1-\rho), \log r)`
RTOL, ATOL = 2.5e-14, 1e-16


@dataclass(frozen=True, eq=False)
class EquiangularSolution:
    r"""The equiangular flow at the requested times.

    Attributes
    ----------
    t : ndarray
        The times (the shape of the ``t`` given: 0-d for a scalar).
    rho : ndarray
        The common inner product :math:`\rho(t) = \langle\theta_i, \theta_j\rangle`.
    r : ndarray
        The common norm :math:`r(t) = |x_i(t)|` of the residual stream (1 for the schemes
        that stay on the sphere).
    one_minus_rho : ndarray
        :math:`1-\rho(t)` to full relative accuracy (the integrated variable), which
        ``1 - rho`` loses once :math:`\rho` is within a few rounding units of 1.
    beta, n, rho0, model, normalization, r0, alpha, switch, shift
        The inputs.
    """

    t: np.ndarray
    rho: np.ndarray
    r: np.ndarray
    one_minus_rho: np.ndarray
    beta: float
    n: int
    rho0: float
    model: str
    normalization: str
    r0: float
    alpha: float
    switch: float | None
    shift: float

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        rows = [("t", display.path_text(self.t) + f" ({np.size(self.t)} times)"),
                ("rho", display.path_text(self.rho)), ("r", display.path_text(self.r)),
                ("inputs", f"rho0={display.number(self.rho0)}, "
                           f"normalization={self.normalization!r}, r0={display.number(self.r0)}")]
        return (f"EquiangularSolution(model={self.model!r}, beta={display.number(self.beta)}, "
                f"n={self.n})", rows)

    def __repr__(self) -> str:
        return display.summary_text(*self._summary())

    def _repr_html_(self) -> str:
        return display.summary_html(*self._summary())


def gap_and_rho(v: float, n: int) -> tuple[float, float]:
    r"""``(1 - rho, rho)`` from :math:`v = \log\frac{1+(n-1)\rho}{1-\rho}`, each to full
    relative accuracy: :math:`1-\rho = n/(e^v + n - 1)`,
    :math:`\rho = (e^v - 1)/(e^v + n - 1)`."""
    if v > 0:
        q = math.exp(-v)
        den = 1.0 + (n - 1) * q
        return n * q / den, -math.expm1(-v) / den
    ev = math.exp(v)
    den = ev + (n - 1)
    return n / den, math.expm1(v) / den


def equiangular_rates(u: float, rho: float, beta: float, n: int, model: str = "sa",
                      shift: float = 0.0) -> tuple[float, float, float, float]:
    r"""The pieces of the equiangular rates at :math:`\rho = 1 - u`, free of overflow.

    Returns ``(k, a, k_A, a_A)``: :math:`k = \tau/(u(1+(n-1)\rho))`, :math:`a`,
    :math:`k/|A|` and :math:`a/|A|`, with (dividing numerators and denominators by
    :math:`e^\beta`, :math:`e = e^{-\beta u}`)

    .. math::
        k = f\,e, \quad a = f\,(1 + (n-1)\rho e), \quad
        |A| = f\sqrt{1 + 2(n-1)\rho e + (n-1)(1+(n-2)\rho)e^2},

    :math:`f = 1/(1+(n-1)e)` (SA) or :math:`f = e^{\beta-\mathrm{shift}}/n` (USA, where
    :math:`f e` is evaluated as one exponential).  The ratios by :math:`|A|` do not depend
    on the model.  :math:`|A| = 0` (only :math:`\beta = 0`, :math:`\rho = -1/(n-1)`) gives
    infinite ratios."""
    e = math.exp(-beta * u)
    num_a = 1.0 + (n - 1) * rho * e
    num_a2 = 1.0 + 2 * (n - 1) * rho * e + (n - 1) * (1.0 + (n - 2) * rho) * e * e
    norm = math.sqrt(max(num_a2, 0.0))
    k_A = e / norm if norm > 0 else math.inf
    a_A = num_a / norm if norm > 0 else math.inf
    if model == "sa":
        den = 1.0 + (n - 1) * e
        return e / den, num_a / den, k_A, a_A
    k = math.exp((beta - shift) - beta * u) / n
    big = math.exp(beta - shift) / n
    return k, big + (n - 1) * rho * k, k_A, a_A


def _check_options(normalization: Any, r0: Any, alpha: Any,
                   switch: Any) -> tuple[str, float, float, float | None]:
    scheme = choice("normalization", normalization, SCHEMES)
    r0 = positive("r0", r0)
    if scheme in ("post", "ngpt", "mix") and r0 != 1.0:
        raise ArgumentError(f"r0={r0:g}: normalization={scheme!r} keeps the tokens on the unit "
                            "sphere (r = 1), so r0 must be 1")
    alpha_v = scalar("alpha", alpha)
    if scheme == "ngpt":
        alpha_v = positive("alpha", alpha)
    elif alpha_v != 1.0:
        raise ArgumentError(f"alpha={alpha_v:g} applies only to normalization='ngpt' (leave "
                            "alpha=1.0)")
    if scheme == "mix":
        if switch is None:
            raise ArgumentError("normalization='mix' needs switch > 0: the time at which "
                                "post-LN gives way to pre-LN")
        switch = positive("switch", switch)
    elif switch is not None:
        raise ArgumentError(f"switch={switch!r} applies only to normalization='mix' (leave "
                            "switch=None)")
    return scheme, r0, alpha_v, switch


def _field(scheme: str, beta: float, n: int, model: str, shift: float, alpha: float,
           fixed: bool, rho0: float) -> Callable[[float, np.ndarray], list[float]]:
    """Right-hand side in ``(v, log r)`` of one scheme (``fixed``: :math:`\\rho` stays
    at ``rho0``)."""

    def rhs(t: float, y: np.ndarray) -> list[float]:
        u, rho = (1.0 - rho0, rho0) if fixed else gap_and_rho(y[0], n)
        r = math.exp(y[1])
        k, a, k_A, a_A = equiangular_rates(u, rho, beta, n, model, shift)
        if scheme == "post":
            dv, dr = 2.0 * n * k, 0.0
        elif scheme == "pre":
            dv, dr = 2.0 * n * k / r, a / r
        elif scheme == "peri":
            dv, dr = 2.0 * n * k_A / r, a_A / r
        elif scheme == "ngpt":
            dv, dr = 2.0 * n * alpha * k_A, 0.0
        else:   # cod
            c = 1.0 / math.sqrt(1.0 + t)
            dv, dr = 2.0 * n * c * k / r, c * a / r
        return [0.0 if fixed else dv, dr]

    return rhs


def _solve(rhs: Callable[..., Any], t0: float, y0: np.ndarray, ts: np.ndarray,
           t_end: float) -> tuple[np.ndarray, np.ndarray]:
    """DOP853 from ``(t0, y0)`` to ``t_end``, saved at ``ts`` (in ``[t0, t_end]``);
    returns ``(values (2, len(ts)), final state)``."""
    if t_end <= t0:
        return np.repeat(y0[:, None], ts.size, axis=1), y0
    grid, where = np.unique(np.append(ts, t_end), return_inverse=True)
    sol = solve_ivp(rhs, (t0, t_end), y0, method="DOP853", t_eval=grid, rtol=RTOL, atol=ATOL)
    if sol.status != 0:
        raise SolverNotConverged(f"equiangular: the DOP853 solve on [{t0:.6g}, {t_end:.6g}] "
                                 f"failed: {sol.message}")
    vals = sol.y[:, where.ravel()]
    return vals[:, :-1], vals[:, -1]


def equiangular(beta: float, n: int, rho0: float, t: Any, *, model: str = "sa",
                normalization: str = "post", r0: float = 1.0, alpha: float = 1.0,
                switch: float | None = None, shift: float = 0.0) -> EquiangularSolution:
    r"""The flow of :math:`n` equiangular tokens: :math:`\rho(t)` and :math:`r(t)`.

    Tokens :math:`x_i = r\theta_i` with :math:`\langle\theta_i,\theta_j\rangle = \rho_0`
    (:math:`i \ne j`) stay equiangular under every scheme
    :math:`\dot\theta = s\,P_\theta A`, :math:`\dot r = g\,\langle\theta, A\rangle`, and

    .. math::
        \dot\rho = 2 s\,\tau(\rho), \qquad \dot r = g\,a(\rho),

    with :math:`\tau, a, |A|` of :func:`equiangular_rates` (post-LN softmax:
    :math:`\dot\rho = 2e^{\beta\rho}(1-\rho)(1+(n-1)\rho)/(e^\beta + (n-1)e^{\beta\rho})`;
    unnormalised: :math:`\dot\rho = \tfrac2n e^{\beta\rho - \mathrm{shift}}(1-\rho)(1+(n-1)\rho)`).
    The schemes:

    ========  ==========================  =====================  ======================================
    scheme    :math:`s`                   :math:`g`              residual stream
    ========  ==========================  =====================  ======================================
    ``post``  :math:`1`                   :math:`0`              :math:`\dot x = P_x A` (:math:`r = 1`)
    ``pre``   :math:`1/r`                 :math:`1`              :math:`\dot x = A(\Theta)`
    ``peri``  :math:`1/(r|A|)`            :math:`1/|A|`          :math:`\dot x = A/|A|`
    ``ngpt``  :math:`\alpha/|A|`          :math:`0`              :math:`\dot x = \alpha P_x(A/|A|)`
    ``cod``   :math:`1/(r\sqrt{1+t})`     :math:`1/\sqrt{1+t}`   :math:`\dot x = A(\Theta)/\sqrt{1+t}`
    ``mix``   ``post``, then ``pre``      :math:`0`, then 1      ``post`` before ``switch``, then ``pre``
    ========  ==========================  =====================  ======================================

    Parameters
    ----------
    beta : float
        Inverse temperature :math:`\beta \ge 0`.
    n : int
        Number of tokens (:math:`\ge 2`).
    rho0 : float
        Initial inner product, in :math:`[-1/(n-1), 1]`.  :math:`\rho_0 = 1` stays 1 and
        :math:`\rho_0 = -1/(n-1)` (regular simplex) is a fixed point of :math:`\rho`.
    t : float or array_like
        Non-decreasing times :math:`\ge 0`.
    model : {"sa", "usa"}
        Softmax or unnormalised attention (weights :math:`e^{\beta\langle x,y\rangle - \mathrm{shift}}/n`).
    normalization : {"post", "pre", "peri", "ngpt", "cod", "mix"}
    r0 : float
        Initial norm :math:`r(0) > 0`; must be 1 for ``post``, ``ngpt`` and ``mix``.
    alpha : float
        Step size of ``ngpt`` (> 0); only for ``ngpt``.
    switch : float, optional
        Time of the switch of ``mix`` (> 0); only for ``mix``.
    shift : float
        Constant subtracted from the USA exponent: it rescales time by
        :math:`e^{\mathrm{shift}}` (``shift=beta`` keeps the kernel below 1).  Only for
        ``model="usa"``.

    Returns
    -------
    EquiangularSolution

    Raises
    ------
    ArgumentError
        ``rho0`` outside :math:`[-1/(n-1), 1]`, an option of another scheme, ``r0 != 1``
        for a scheme on the sphere, an unnormalised kernel whose rate
        :math:`e^{\beta-\mathrm{shift}}` exceeds :math:`e^{700}` (pass ``shift``), or
        ``peri``/``ngpt`` at :math:`\beta = 0`, :math:`\rho_0 = -1/(n-1)`, where
        :math:`A = 0`.
    SolverNotConverged
        The DOP853 solve failed.

    Notes
    -----
    DOP853 (``scipy.integrate.solve_ivp``, ``rtol=2.5e-14``) integrates
    :math:`v = \log\frac{1+(n-1)\rho}{1-\rho}` and :math:`\log r`; post-LN softmax reads
    :math:`\dot v = 2n\,e^{-\beta u}/(1+(n-1)e^{-\beta u})`, :math:`u = 1-\rho =
    n/(e^v + n - 1)`, and at :math:`\beta = 0` simply :math:`\dot v = 2`.  The absolute
    error in :math:`\rho` is about :math:`10^{-13}` and the relative error of
    ``one_minus_rho`` about :math:`10^{-12}`, up to :math:`\rho = 1 - 10^{-14}` and beyond,
    where the time itself is well conditioned.  On a long plateau (:math:`\beta \gg 1`
    and :math:`\rho` far from 1, where :math:`\dot\rho \sim e^{-\beta(1-\rho)}` is tiny),
    an error :math:`\delta` of the state shifts the later path by :math:`\delta/\dot v` in
    time, and :math:`\rho` is then only as accurate as that shift allows.

    Examples
    --------
    >>> from transformer_pde.reductions.equiangular_flow import equiangular
    >>> sol = equiangular(4.0, 8, 0.0, [0.0, 1.0, 5.0])
    >>> bool(sol.rho[0] == 0.0 and sol.rho[1] < sol.rho[2] < 1.0)
    True
    """
    beta, n, model = check_beta(beta), check_n(n), check_model(model)
    shift = check_shift(shift, model)
    rho0 = check_rho("rho0", rho0, n)
    scheme, r0, alpha, switch = _check_options(normalization, r0, alpha, switch)
    times, scalar_in = check_times(t)
    fixed = rho0 == 1.0 or rho0 == lower_rho(n)
    if model == "usa" and scheme != "peri" and scheme != "ngpt" \
            and beta - shift > OVERFLOW_EXPONENT:
        raise ArgumentError(f"beta - shift = {beta - shift:g} > {OVERFLOW_EXPONENT:g}: the "
                            "unnormalised kernel e^(beta<x,y> - shift) overflows float64; pass "
                            "shift=beta (a constant shift only rescales time by e^shift)")
    if scheme in ("peri", "ngpt") and beta == 0.0 and rho0 == lower_rho(n):
        raise ArgumentError(f"rho0 = -1/(n-1) at beta=0: A = 0, so normalization={scheme!r} "
                            "(which divides by |A|) is undefined")
    y0 = np.array([0.0 if fixed else math.log((1.0 + (n - 1) * rho0) / (1.0 - rho0)),
                   math.log(r0)])
    t_max = float(times[-1])
    if scheme == "mix":
        first = times[times < switch]
        vals1, y_mid = _solve(_field("post", beta, n, model, shift, alpha, fixed, rho0), 0.0,
                              y0, first, min(switch, t_max))
        vals2, _ = _solve(_field("pre", beta, n, model, shift, alpha, fixed, rho0), switch,
                          y_mid, times[times >= switch], t_max)
        vals = np.concatenate([vals1, vals2], axis=1)
    else:
        vals, _ = _solve(_field(scheme, beta, n, model, shift, alpha, fixed, rho0), 0.0, y0,
                         times, t_max)
    if fixed:
        gap, rho = np.full(times.shape, 1.0 - rho0), np.full(times.shape, rho0)
    else:
        gap, rho = np.array([gap_and_rho(v, n) for v in vals[0]]).reshape(-1, 2).T
    r = np.exp(vals[1])
    shape = () if scalar_in else times.shape
    return EquiangularSolution(
        t=times.reshape(shape), rho=rho.reshape(shape), r=r.reshape(shape),
        one_minus_rho=gap.reshape(shape), beta=beta, n=n, rho0=rho0, model=model,
        normalization=scheme, r0=r0, alpha=alpha, switch=switch, shift=shift)
