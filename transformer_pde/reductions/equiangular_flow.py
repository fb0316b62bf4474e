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
from scipy.optimize import brentq

from .. import results_display as display
from ..errors import ArgumentError, SolverNotConverged
from ..validation import choice, positive, scalar
from .args import (OVERFLOW_EXPONENT, check_beta, check_model, check_n, check_rho,
                   check_shift, check_times, lower_rho)

__all__ = ["EquiangularSolution", "SCHEMES", "equiangular", "equiangular_rates", "gap_and_rho",
           "saturation_level"]

#: the normalisation schemes :math:`\dot\theta = s P_\theta A`, :math:`\dot r = g\langle\theta, A\rangle`
SCHEMES = ("post", "pre", "peri", "ngpt", "cod", "mix")
#: tolerances of the DOP853 solve in :math:`(\log(1-\rho), \log r)`
RTOL, ATOL = 2.5e-14, 1e-16


@dataclass(frozen=True, eq=False, repr=False)
class EquiangularSolution(display.Summarised):
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


def _over_r(x: float, log_r: float) -> float:
    r""":math:`x/r` from :math:`\log r`, also where :math:`r` itself overflows (a trial
    stage of a fast USA kernel, or a radius past the float range): through logarithms
    when :math:`|\log r| > 700` (``x >= 0``; the rates are).  A quotient past the float
    range is ``inf`` (only in a trial stage far off the path, which the solver rejects)."""
    if abs(log_r) < 700.0:
        return x / math.exp(log_r)
    if x <= 0:
        return 0.0
    e = math.log(x) - log_r
    return math.exp(e) if e < 709.0 else math.inf


def _field(scheme: str, beta: float, n: int, model: str, shift: float, alpha: float,
           fixed: bool, rho0: float) -> Callable[[float, np.ndarray], list[float]]:
    """Right-hand side in ``(v, log r)`` of one scheme (``fixed``: :math:`\\rho` stays
    at ``rho0``)."""

    def rhs(t: float, y: np.ndarray) -> list[float]:
        u, rho = (1.0 - rho0, rho0) if fixed else gap_and_rho(y[0], n)
        log_r = float(y[1])
        k, a, k_A, a_A = equiangular_rates(u, rho, beta, n, model, shift)
        if scheme == "post":
            dv, dr = 2.0 * n * k, 0.0
        elif scheme == "pre":
            dv, dr = 2.0 * n * _over_r(k, log_r), _over_r(a, log_r)
        elif scheme == "peri":
            dv, dr = 2.0 * n * _over_r(k_A, log_r), _over_r(a_A, log_r)
        elif scheme == "ngpt":
            dv, dr = 2.0 * n * alpha * k_A, 0.0
        else:   # cod
            c = 1.0 / math.sqrt(1.0 + t)
            dv, dr = 2.0 * n * c * _over_r(k, log_r), c * _over_r(a, log_r)
        return [0.0 if fixed else dv, dr]

    return rhs


def saturation_level(n: int) -> float:
    r"""The value of :math:`v = \log\frac{1+(n-1)\rho}{1-\rho}` from which the equiangular
    flow is *saturated*: :math:`1 - \rho = n/(e^v + n - 1) < n e^{-v}` is below half the
    smallest subnormal double (:math:`e^{-745.2}`), so :math:`1-\rho` rounds to 0 and
    :math:`\rho` to 1, and :math:`v` only grows from there."""
    return 746.2 + math.log(n)


def _tail(scheme: str, beta: float, n: int, model: str, shift: float, rho: float | None,
          t_c: float, y_c: np.ndarray, ts: np.ndarray) -> np.ndarray:
    r"""``(v, log r)`` at the times ``ts >= t_c`` of a flow whose :math:`\rho` no longer
    moves from ``(t_c, y_c)`` on, in closed form: a fixed point ``rho`` (1 or
    :math:`-1/(n-1)`), or (``rho=None``) a saturated flow, :math:`\rho = 1` to the last
    bit.  The rates :math:`a` and :math:`a/|A|` (:func:`equiangular_rates`) are then
    constant (at :math:`\rho = 1`: :math:`a = 1` for SA, :math:`e^{\beta - \mathrm{shift}}`
    for USA, and :math:`a/|A| = 1`), so with :math:`\tau = t - t_c` ``post``/``ngpt`` keep
    :math:`r`, ``pre`` has :math:`r = r_c + a\tau`, ``peri`` :math:`r = r_c + (a/|A|)\tau`,
    ``cod`` :math:`r = r_c + 2a(\sqrt{1+t} - \sqrt{1+t_c})`.  :math:`\log r` is formed as
    a ``logaddexp``, so :math:`r` is ``inf`` only where it exceeds the float range.  In a
    saturated flow the remaining :math:`1-\rho` shifts the rates by a relative
    :math:`O(\beta (1-\rho))`, below :math:`10^{-15}` for any float :math:`\beta`."""
    _, a, _, a_A = equiangular_rates(0.0 if rho is None else 1.0 - rho,
                                     1.0 if rho is None else rho, beta, n, model, shift)
    tau = ts - t_c
    log_rc = float(y_c[1])
    with np.errstate(divide="ignore"):
        if scheme in ("pre", "peri", "cod"):
            rate = a if scheme != "peri" else a_A
            if scheme == "cod":
                # 2 (sqrt(1+t) - sqrt(1+t_c)) without cancellation
                tau = 2.0 * tau / (np.sqrt(1.0 + ts) + math.sqrt(1.0 + t_c))
            log_r = np.logaddexp(log_rc, (math.log(rate) if rate > 0 else -math.inf)
                                 + np.log(tau))
        else:
            log_r = np.full(ts.shape, log_rc)
    return np.stack([np.full(ts.shape, max(float(y_c[0]), saturation_level(n))), log_r])


def _solve(rhs: Callable[..., Any], t0: float, y0: np.ndarray, ts: np.ndarray,
           t_end: float, tail: Callable[[float, np.ndarray, np.ndarray], np.ndarray],
           v_sat: float) -> tuple[np.ndarray, np.ndarray]:
    """DOP853 from ``(t0, y0)`` to ``t_end``, saved at ``ts`` (in ``[t0, t_end]``);
    returns ``(values (2, len(ts)), final state)``.  The solve stops where ``v`` reaches
    ``v_sat`` (a terminal event; at once if ``y0`` is there) and ``tail(t_c, y_c, times)``
    answers the later times."""
    if t_end <= t0:
        return np.repeat(y0[:, None], ts.size, axis=1), y0
    grid, where = np.unique(np.append(ts, t_end), return_inverse=True)
    if y0[0] >= v_sat:
        vals = tail(t0, y0, grid)[:, where.ravel()]
        return vals[:, :-1], vals[:, -1]
    def saturated(t: float, y: np.ndarray) -> float:
        return float(y[0]) - v_sat
    saturated.terminal = True     # type: ignore[attr-defined]
    saturated.direction = 1.0     # type: ignore[attr-defined]
    # invalid: scipy's DOP853 error norm is 0/0 when both embedded errors are exactly 0 (a
    # rate below the rounding of v); it rejects that step and retries a smaller one
    with np.errstate(invalid="ignore"):
        # in the local time tau = t - t0: a fast transient right after t0 (pre-LN r under
        # a large USA kernel after the switch of "mix") needs the fine float spacing near 0
        sol = solve_ivp(lambda tau, y: rhs(t0 + tau, y), (0.0, t_end - t0), y0,
                        method="DOP853", t_eval=grid - t0, rtol=RTOL, atol=ATOL,
                        events=saturated)
    done = len(sol.t)        # the grid times reached (sol.y is empty when none)
    if sol.status == 1:       # saturated at t_c: the closed form from there on
        t_c, y_c = t0 + float(sol.t_events[0][0]), sol.y_events[0][0]
        vals = np.concatenate([np.reshape(sol.y, (2, done)), tail(t_c, y_c, grid[done:])],
                              axis=1)
    elif sol.status != 0:
        # steps below the spacing of t: the rise to rho = 1 is shorter than the float
        # resolution of its (late) time; go on from the last grid time with v as the clock
        t_a, y_a = (float(grid[done - 1]), sol.y[:, -1]) if done else (t0, y0)
        vals = np.concatenate([np.reshape(sol.y, (2, done)),
                               _solve_in_v(rhs, t_a, y_a, grid[done:], tail, v_sat)], axis=1)
    else:
        vals = sol.y
    if np.isnan(vals).any():
        raise SolverNotConverged(f"equiangular: the DOP853 solve on [{t0:.6g}, {t_end:.6g}] "
                                 "produced NaN")
    vals = vals[:, where.ravel()]
    return vals[:, :-1], vals[:, -1]


def _solve_in_v(rhs: Callable[..., Any], t_a: float, y_a: np.ndarray, ts: np.ndarray,
                tail: Callable[[float, np.ndarray, np.ndarray], np.ndarray],
                v_sat: float) -> np.ndarray:
    r"""``(v, log r)`` at the times ``ts > t_a``, integrating with :math:`v` (which only
    grows) as the independent variable: :math:`dt/dv = 1/\dot v`,
    :math:`d\log r/dv = (d\log r/dt)/\dot v`, from :math:`v_a` to ``v_sat`` (DOP853 with
    dense output), each time found by Brent's method on :math:`t(v)`, and the times past
    saturation from ``tail``.  A time is then as accurate as :math:`t(v)`, to
    ``RTOL`` relative (the conditioning of the late rise itself)."""
    def field(v: float, z: np.ndarray) -> list[float]:
        dv, dlog_r = rhs(float(z[0]), np.array([v, z[1]]))
        if not dv > 0:
            return [math.inf, math.inf]     # a rate below the float range: no answer
        return [1.0 / dv, dlog_r / dv]

    v_a = float(y_a[0])
    if v_a >= v_sat:
        return tail(t_a, y_a, ts)
    with np.errstate(invalid="ignore"):
        sol = solve_ivp(field, (v_a, v_sat), np.array([t_a, y_a[1]]), method="DOP853",
                        rtol=RTOL, atol=ATOL, dense_output=True)
    if sol.status != 0 or not np.all(np.isfinite(sol.y[:, -1])):
        raise SolverNotConverged(f"equiangular: the DOP853 solve from t={t_a:.6g} with v "
                                 f"as the clock failed: {sol.message}")
    t_c = float(sol.y[0, -1])
    out = np.empty((2, ts.size))
    late = ts >= t_c
    if np.any(late):
        out[:, late] = tail(t_c, np.array([v_sat, sol.y[1, -1]]), ts[late])
    for i in np.flatnonzero(~late):
        v_i = brentq(lambda v, target=ts[i]: float(sol.sol(v)[0]) - target, v_a, v_sat,
                     xtol=1e-14, rtol=4 * np.finfo(float).eps)
        out[:, i] = [v_i, float(sol.sol(v_i)[1])]
    return out


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
        The DOP853 solve failed (also with :math:`v` as the clock, below).

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

    **Long times.**  Once :math:`v` reaches :func:`saturation_level` (:math:`1-\rho` below
    the smallest double), the solve stops and the later times come from the closed form of
    the saturated rates (:math:`\rho = 1`, :math:`r` linear in :math:`t` or in
    :math:`\sqrt{1+t}`), so any time up to the float maximum costs the time to saturate,
    and :math:`v` never overflows.  ``r`` is ``inf`` only where the true :math:`r` exceeds
    the float range (a USA kernel with a large :math:`e^{\beta - \mathrm{shift}}\,t`).
    Where the final rise to :math:`\rho = 1` is shorter than the spacing of the float times
    around it (SA after a plateau of length :math:`\sim e^{\beta(1-\rho_0)} \gtrsim 10^{15}`,
    USA with :math:`e^{\beta - \mathrm{shift}} \gtrsim e^{35}`), the steps in :math:`t` would
    fall below that spacing: the solve then goes on from the last requested time with
    :math:`v` as the independent variable (:math:`dt/dv = 1/\dot v`) and finds each later
    time on :math:`t(v)`; a time inside the rise is then as accurate as :math:`t(v)`, a
    relative :math:`10^{-14}`, as on a plateau.

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
    # a fixed point is answered in closed form from t = 0 (v_sat = -inf), a moving rho
    # from its saturation on
    v_sat = -math.inf if fixed else saturation_level(n)

    def tail(part: str) -> Callable[[float, np.ndarray, np.ndarray], np.ndarray]:
        return lambda t_c, y_c, ts: _tail(part, beta, n, model, shift,
                                          rho0 if fixed else None, t_c, y_c, ts)

    if scheme == "mix":
        first = times[times < switch]
        vals1, y_mid = _solve(_field("post", beta, n, model, shift, alpha, fixed, rho0), 0.0,
                              y0, first, min(switch, t_max), tail("post"), v_sat)
        vals2, _ = _solve(_field("pre", beta, n, model, shift, alpha, fixed, rho0), switch,
                          y_mid, times[times >= switch], t_max, tail("pre"), v_sat)
        vals = np.concatenate([vals1, vals2], axis=1)
    else:
        vals, _ = _solve(_field(scheme, beta, n, model, shift, alpha, fixed, rho0), 0.0, y0,
                         times, t_max, tail(scheme), v_sat)
    if fixed:
        gap, rho = np.full(times.shape, 1.0 - rho0), np.full(times.shape, rho0)
    else:
        gap, rho = np.array([gap_and_rho(v, n) for v in vals[0]]).reshape(-1, 2).T
    with np.errstate(over="ignore"):   # r = inf where it exceeds the float range
        r = np.exp(vals[1])
    shape = () if scalar_in else times.shape
    return EquiangularSolution(
        t=times.reshape(shape), rho=rho.reshape(shape), r=r.reshape(shape),
        one_minus_rho=gap.reshape(shape), beta=beta, n=n, rho0=rho0, model=model,
        normalization=scheme, r0=r0, alpha=alpha, switch=switch, shift=shift)
