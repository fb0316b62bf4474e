r"""Hitting times of the post-LN equiangular flow in closed form.

The post-LN equiangular ODE (:func:`~transformer_pde.reductions.equiangular`)
is separable.  With :math:`u = 1 - \rho` and :math:`c = n/(n-1)` it reads
:math:`\dot u = -2u(n-(n-1)u)\,q(u)`, :math:`q = e^{-\beta u}/(1+(n-1)e^{-\beta u})`
(softmax) or :math:`q = e^{\beta - \beta u - \mathrm{shift}}/n` (unnormalised), and the
partial fractions :math:`\frac{1}{u(n-(n-1)u)} = \frac1n\big(\frac1u + \frac{1}{c-u}\big)`
with :math:`\int e^{\beta u}/u\,du = \mathrm{Ei}(\beta u)` and
:math:`\int e^{\beta u}/(c-u)\,du = -e^{\beta c}\mathrm{Ei}(\beta u - \beta c)` integrate it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.integrate import quad
from scipy.special import expi

from ..errors import ArgumentError
from ..validation import real_array
from .args import check_beta, check_model, check_n, check_rho, check_shift, lower_rho

__all__ = ["PEAK_FORM_MIN", "equiangular_time"]

#: largest :math:`\beta c` for which the closed form is evaluated (``exp(600)`` is finite
#: with a wide margin, and ``E_1`` of arguments up to 600 is a normal float)
CLOSED_FORM_MAX = 600.0
#: the closed form is used when the difference keeps at least this fraction of the size of
#: its terms (at most three digits lost to cancellation); quadrature otherwise
CANCELLATION = 1e-3


def _terms(u: float, beta: float, n: int, model: str) -> list[float]:
    """The terms of :math:`F(u)` (softmax) or :math:`G(u)` (unnormalised)."""
    c = n / (n - 1.0)
    out = [float(expi(beta * u)), -math.exp(beta * c) * float(expi(beta * (u - c)))]
    if model == "sa":
        out += [(n - 1) * math.log(u), -(n - 1) * math.log(n - (n - 1) * u)]
    return out


def _closed(beta: float, n: int, u0: float, u: float, model: str, shift: float) -> float | None:
    """The closed form, or ``None`` where it overflows or cancels."""
    if beta == 0.0 or beta * n / (n - 1.0) > CLOSED_FORM_MAX:
        return None
    f0, f1 = _terms(u0, beta, n, model), _terms(u, beta, n, model)
    diff = sum(f0) - sum(f1)
    scale = sum(abs(x) for x in f0 + f1)
    if not (math.isfinite(diff) and abs(diff) >= CANCELLATION * scale):
        return None
    if model == "sa":
        return diff / (2.0 * n)
    return 0.5 * math.exp(shift - beta) * diff


#: from :math:`\beta u_0` = this on, the peak of :math:`e^{\beta u}` at :math:`u_0` is
#: integrated in :math:`s = \beta(u_0 - u)` (:func:`_peak_time`)
PEAK_FORM_MIN = 1600.0


def _peak_time(beta: float, n: int, u0: float, u: float, model: str, shift: float) -> float:
    r"""The time for :math:`\beta u_0 \ge` :data:`PEAK_FORM_MIN`, where :math:`e^{\beta w}`
    is a peak of width :math:`1/\beta` at :math:`w = u_0` that no quadrature over
    :math:`[u, u_0]` resolves at :math:`\beta = 10^{6}` and beyond.  With
    :math:`g(w) = 1/(2w(n-(n-1)w))`,

    .. math::
        t_{SA} = \int_u^{u_0}(e^{\beta w} + n - 1)\,g\,dw = e^{\beta u_0}\,\frac J\beta
          + \frac{n-1}{2n}\Big[\log\frac{w}{n-(n-1)w}\Big]_u^{u_0}, \qquad
        t_{USA} = n\,e^{\mathrm{shift}-\beta}\,e^{\beta u_0}\,\frac J\beta,

    :math:`J = \int_0^{\min(S, 800)} e^{-s} g(u_0 - s/\beta)\,ds` (integrated in
    :math:`x = e^{-s}`, a smooth integrand on :math:`[e^{-S}, 1]`),
    :math:`S = \beta(u_0 - u)` (the rest is below :math:`e^{-800}` of it: there
    :math:`w \ge u_0/2`, so :math:`g` is smooth and bounded on the range), in logarithms:
    ``inf`` only where the time exceeds the float range."""
    S = min(beta * (u0 - u), 800.0)

    def integrand(x: float) -> float:      # x = e^{-s}: e^{-s} ds = -dx, w = u0 + log(x)/beta
        w = u0 + math.log(x) / beta if x > 0 else u0 - 800.0 / beta
        return 1.0 / (2.0 * w * (n - (n - 1) * w))

    J, _ = quad(integrand, math.exp(-S), 1.0, epsabs=0.0, epsrel=1e-13, limit=200)
    if not J > 0.0:
        return 0.0 if model == "usa" else _elementary(n, u0, u)
    if model == "usa":
        # the large exponents first: shift - beta + beta u0 is often small
        log_t = ((shift - beta) + beta * u0) + math.log(n) - math.log(beta) + math.log(J)
        return math.exp(log_t) if log_t < 709.0 else math.inf
    log_peak = beta * u0 - math.log(beta) + math.log(J)
    peak = math.exp(log_peak) if log_peak < 709.0 else math.inf
    return peak + _elementary(n, u0, u)


def _elementary(n: int, u0: float, u: float) -> float:
    r""":math:`\frac{n-1}{2n}\big[\log\frac{w}{n-(n-1)w}\big]_u^{u_0}` (the softmax part
    of the time that :math:`e^{\beta w}` does not weigh)."""
    return (n - 1) / (2.0 * n) * (math.log(u0 / u) - math.log((n - (n - 1) * u0)
                                                              / (n - (n - 1) * u)))


def _quadrature(beta: float, n: int, u0: float, u: float, model: str, shift: float) -> float:
    r""":math:`t = \int_{\log u}^{\log u_0} h(v)\,dv`, :math:`h = u\,|dt/du|` at :math:`u = e^v`,
    scaled by its value's exponential factor at :math:`u_0` (the largest on the path);
    :func:`_peak_time` from :math:`\beta u_0 \ge` :data:`PEAK_FORM_MIN` on."""
    if beta * u0 >= PEAK_FORM_MIN:
        return _peak_time(beta, n, u0, u, model, shift)
    if model == "sa":
        log_scale = beta * u0

        def h(v: float) -> float:
            w = math.exp(v)
            return (math.exp(beta * (w - u0)) + (n - 1) * math.exp(-log_scale)) \
                / (2.0 * (n - (n - 1) * w))
    else:
        log_scale = shift - beta + beta * u0

        def h(v: float) -> float:
            w = math.exp(v)
            return n * math.exp(beta * (w - u0)) / (2.0 * (n - (n - 1) * w))
    # the peak of e^{beta w} at w = u0 has width ~1/(beta u0) in v = log w: breakpoints
    # there, so that a long interval (u -> 0) does not hide it from the quadrature
    lo, hi = math.log(u), math.log(u0)
    marks = sorted({hi - k / (beta * u0) for k in (1.0, 10.0, 100.0)} - {lo, hi})
    val, _ = quad(h, lo, hi, epsabs=0.0, epsrel=1e-13, limit=500,
                  points=[m for m in marks if lo < m < hi] or None)
    if val <= 0.0:
        return 0.0
    log_t = log_scale + math.log(val)
    return math.exp(log_t) if log_t < 709.0 else math.inf


def _time_b0(n: int, u0: float, u: float, model: str, shift: float) -> float:
    r""":math:`\beta = 0`: :math:`\frac{1+(n-1)\rho}{1-\rho} = \frac{1+(n-1)\rho_0}{1-\rho_0}
    e^{2t}` (times :math:`e^{\mathrm{shift}}` for USA)."""
    t = 0.5 * (math.log((n - (n - 1) * u) / u) - math.log((n - (n - 1) * u0) / u0))
    return t * (math.exp(shift) if model == "usa" else 1.0)


def equiangular_time(beta: float, n: int, rho0: float, rho: Any, *, model: str = "sa",
                     shift: float = 0.0) -> Any:
    r"""Time at which the post-LN equiangular flow from :math:`\rho_0` reaches :math:`\rho`.

    With :math:`u = 1-\rho`, :math:`u_0 = 1-\rho_0`, :math:`c = n/(n-1)`:

    .. math::
        t_{SA} = \frac{F(u_0) - F(u)}{2n}, \quad
        F(u) = \mathrm{Ei}(\beta u) - e^{\beta c}\,\mathrm{Ei}(\beta u - \beta c)
               + (n-1)\ln u - (n-1)\ln(n - (n-1)u),

        t_{USA} = \frac{e^{\mathrm{shift}-\beta}}{2}\,\big(G(u_0) - G(u)\big), \quad
        G(u) = \mathrm{Ei}(\beta u) - e^{\beta c}\,\mathrm{Ei}(\beta u - \beta c),

    and at :math:`\beta = 0` (both models, USA times :math:`e^{\mathrm{shift}}`)
    :math:`\frac{1+(n-1)\rho}{1-\rho} = \frac{1+(n-1)\rho_0}{1-\rho_0}\,e^{2t}`.

    Parameters
    ----------
    beta : float
        :math:`\beta \ge 0`.
    n : int
        Number of tokens (:math:`\ge 2`).
    rho0 : float
        Initial inner product in :math:`[-1/(n-1), 1]`.
    rho : float or array_like
        Target inner products in :math:`[\rho_0, 1]` (the flow increases :math:`\rho`).
    model : {"sa", "usa"}
    shift : float
        Shift of the USA exponent (time scales by :math:`e^{\mathrm{shift}}`); USA only.

    Returns
    -------
    float or ndarray
        The times (the shape of ``rho``): 0 at :math:`\rho = \rho_0`, ``inf`` at
        :math:`\rho = 1 > \rho_0` and from the fixed point :math:`\rho_0 = -1/(n-1)`, and
        ``inf`` where the time exceeds the float range.

    Raises
    ------
    ArgumentError
        ``rho0`` outside :math:`[-1/(n-1), 1]`, a ``rho`` outside :math:`[\rho_0, 1]`.

    Notes
    -----
    ``scipy.special.expi`` evaluates :math:`\mathrm{Ei}`.  Where :math:`\beta c > 600`
    (:math:`e^{\beta c}` near overflow) or the difference of the closed forms keeps less
    than :math:`10^{-3}` of the size of its terms (:math:`\rho` close to :math:`\rho_0`:
    cancellation), the time is computed instead by adaptive quadrature
    (``scipy.integrate.quad``, relative tolerance :math:`10^{-13}`) of
    :math:`dt/d\log u` over :math:`\log u`, whose integrand is bounded.  Both give about 12
    significant digits.  From :math:`\beta(1-\rho_0) \ge 1600` on, the peak of
    :math:`e^{\beta u}` at :math:`u_0` (width :math:`1/\beta`) is integrated in
    :math:`s = \beta(u_0 - u)` and the result kept in logarithms, so every float
    :math:`\beta` gets its time, ``inf`` where it exceeds the float range (before, the
    quadrature missed the peak and returned 0 from :math:`\beta \approx 10^{6}` on).

    Examples
    --------
    >>> from transformer_pde.reductions.hitting import equiangular_time
    >>> round(float(equiangular_time(2.0, 32, 0.0, 1 - 1e-3)), 6)
    5.458394
    """
    beta, n, model = check_beta(beta), check_n(n), check_model(model)
    shift = check_shift(shift, model)
    rho0 = check_rho("rho0", rho0, n)
    target = real_array("rho", rho)
    if not np.all(np.isfinite(target)):
        raise ArgumentError("rho contains NaN or inf")
    if np.any(target < rho0) or np.any(target > 1.0):
        raise ArgumentError(f"rho must lie in [rho0, 1] = [{rho0:.6g}, 1]: the post-LN "
                            "equiangular flow increases rho")
    u0 = 1.0 - rho0
    out = np.empty(target.shape)
    for idx, r in np.ndenumerate(target):
        u = 1.0 - float(r)
        if r == rho0:
            out[idx] = 0.0
        elif u == 0.0 or rho0 == lower_rho(n):
            out[idx] = math.inf
        elif beta == 0.0:
            out[idx] = _time_b0(n, u0, u, model, shift)
        else:
            t = _closed(beta, n, u0, u, model, shift)
            out[idx] = _quadrature(beta, n, u0, u, model, shift) if t is None else t
    return out[()] if out.ndim == 0 else out
