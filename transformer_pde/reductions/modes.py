r"""Linear instability of the uniform measure on the sphere: growth rates of harmonics.

The mean-field equation :math:`\partial_t\mu + \nabla_S\cdot(\mu\,P_x\Gamma_\mu) = 0` on
:math:`S^{d-1}` has the uniform measure :math:`\sigma` as a stationary state.  A
perturbation :math:`\mu = \sigma(1 + \varepsilon Y_\ell)` by a spherical harmonic of degree
:math:`\ell` grows like :math:`e^{\lambda_\ell t}`, with :math:`\lambda_\ell` from the
Funk–Hecke formula (derivation on the documentation page *Exact reductions on the
sphere*).
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction
from typing import Any

import numpy as np
from scipy.special import gammaln, ive

from ..errors import ArgumentError
from ..validation import integer, real_array
from .args import check_beta, check_model, check_shift

__all__ = ["DEBYE_RADIUS", "EXHAUSTIVE_BETA", "SERIES_BETA", "log_ive", "mode_growth_rate",
           "most_unstable_degree"]

#: :func:`log_ive` uses Debye's expansion where :math:`\sqrt{\mu^2+\beta^2}` is at least
#: this (ten terms: within :math:`10^{-15}` of the exact half-integer orders there, measured),
#: ``scipy.special.ive`` below
DEBYE_RADIUS = 60.0
#: :func:`log_ive` sums the power series up to this :math:`\beta` (where ``ive`` can underflow)
SERIES_BETA = 2.0
#: :func:`most_unstable_degree` compares all degrees up to :math:`2\beta + 10` in floating
#: point up to this :math:`\beta`, and bisects in exact decimal arithmetic above
EXHAUSTIVE_BETA = 1e4
#: number of terms :math:`U_0, \dots, U_{K-1}` of Debye's expansion
_DEBYE_TERMS = 10


def _debye_polynomials(count: int) -> list[dict[int, Fraction]]:
    r"""Debye's polynomials :math:`U_0 = 1`, :math:`U_{k+1}(p) = \tfrac12 p^2(1-p^2)U_k'(p)
    + \tfrac18\int_0^p (1-5t^2)U_k(t)\,dt` (DLMF 10.41.9), exactly, as ``{power: coef}``."""
    polys = [{0: Fraction(1)}]
    for _ in range(count - 1):
        new: dict[int, Fraction] = {}
        for pw, c in polys[-1].items():
            if pw:
                new[pw + 1] = new.get(pw + 1, Fraction(0)) + c * pw / 2
                new[pw + 3] = new.get(pw + 3, Fraction(0)) - c * pw / 2
            new[pw + 1] = new.get(pw + 1, Fraction(0)) + c / (8 * (pw + 1))
            new[pw + 3] = new.get(pw + 3, Fraction(0)) - 5 * c / (8 * (pw + 3))
        polys.append({pw: c for pw, c in new.items() if c})
    return polys


#: :math:`V_k(p) = U_k(p)/p^k` (a polynomial: :math:`U_k` starts at :math:`p^k`), as
#: exact ``{power: coef}`` and as float coefficients of increasing powers
_V_EXACT = [{pw - k: c for pw, c in u.items()} for k, u in enumerate(
    _debye_polynomials(_DEBYE_TERMS))]
_V_FLOAT = [np.array([float(v.get(j, 0)) for j in range(max(v) + 1)]) for v in _V_EXACT]


def _debye_parts(mu: np.ndarray, beta: float) -> tuple[np.ndarray, ...]:
    r"""The pieces of Debye's expansion of :math:`\log(e^{-\beta} I_\mu(\beta))`,
    :math:`\rho = \sqrt{\mu^2+\beta^2}`, :math:`p = \mu/\rho`:

    .. math::
        \log(e^{-\beta}I_\mu(\beta)) = \underbrace{\frac{\mu^2}{\rho+\beta}}_{\rho-\beta}
            - \mu\,\mathrm{asinh}\frac{\mu}{\beta} - \tfrac12\log(2\pi\rho)
            + \log\sum_k \frac{V_k(p)}{\rho^k},

    (DLMF 10.41.3 with :math:`U_k(p)/\mu^k = V_k(p)/\rho^k`, also at :math:`\mu = 0`).
    Returns ``(rho - beta, mu asinh(mu/beta), log rho, log S)``."""
    rho = np.hypot(mu, beta)
    p = mu / rho
    series = np.zeros_like(rho)
    for k in range(_DEBYE_TERMS - 1, -1, -1):     # Horner in 1/rho
        series = series / rho + np.polynomial.polynomial.polyval(p, _V_FLOAT[k])
    # rho - beta = mu^2/(rho + beta), halved first: rho + beta overflows near 1.8e308
    quad = mu * (mu / (0.5 * rho + 0.5 * beta)) * 0.5
    return quad, mu * np.arcsinh(mu / beta), np.log(rho), np.log(series)


def log_ive(mu: Any, beta: float) -> np.ndarray:
    r""":math:`\log(e^{-\beta} I_\mu(\beta))` for :math:`\mu \ge 0`, :math:`\beta > 0`,
    finite wherever :math:`I_\mu(\beta) > 0` (``scipy.special.ive`` alone is NaN beyond
    :math:`\beta \approx 10^{9}` and underflows for :math:`\mu \gg \beta`).

    Debye's uniform expansion (:func:`_debye_parts`, ten terms) where
    :math:`\sqrt{\mu^2+\beta^2} \ge` :data:`DEBYE_RADIUS`, ``log(ive)`` below.  Relative
    accuracy of the logarithm about :math:`10^{-16}` times the size of its largest piece
    (:math:`\tfrac12\log(2\pi\rho)` or :math:`\mu\,\mathrm{asinh}(\mu/\beta)`)."""
    mu = np.asarray(mu, dtype=float)
    out = np.empty(np.broadcast(mu, beta).shape)
    far = np.hypot(mu, beta) >= DEBYE_RADIUS
    if np.any(far):
        quad, ash, log_rho, log_s = _debye_parts(mu[far] if mu.ndim else mu, beta)
        out[far] = quad - ash - 0.5 * (math.log(2 * math.pi) + log_rho) + log_s
    small = ~far & (beta <= SERIES_BETA)
    if np.any(small):
        out[small] = _log_ive_series(mu[small] if mu.ndim else mu, beta)
    mid = ~far & ~small
    if np.any(mid):
        with np.errstate(divide="ignore"):
            out[mid] = np.log(ive(mu[mid] if mu.ndim else mu, beta))
    return out


def _log_ive_series(mu: np.ndarray, beta: float) -> np.ndarray:
    r""":math:`\log(e^{-\beta}I_\mu(\beta))` from the power series (DLMF 10.25.2) in
    logarithms, :math:`\mu\log\frac\beta2 - \log\Gamma(\mu+1) - \beta +
    \log\sum_k \frac{(\beta^2/4)^k}{k!\,(\mu+1)_k}`, for :math:`\beta \le 2`: the terms
    fall by :math:`1/(k+1)^2` at least, so 40 of them leave below :math:`10^{-90}`
    (``ive`` itself underflows to 0 once :math:`(\beta/2)^\mu/\Gamma(\mu+1) < 10^{-308}`,
    e.g. :math:`\beta = 10^{-300}`)."""
    with np.errstate(divide="ignore"):
        return (mu * (math.log(beta) - math.log(2.0)) - gammaln(mu + 1.0) - beta
                + _log_series(mu, beta))


def _log_series(mu: Any, beta: float) -> np.ndarray:
    r""":math:`\log\sum_{k<40} \frac{(\beta^2/4)^k}{k!\,(\mu+1)_k}` (:math:`\beta \le 2`)."""
    mu = np.asarray(mu, dtype=float)
    q = beta * beta / 4.0
    term = np.ones_like(mu)
    total = np.ones_like(mu)
    for k in range(40):
        term = term * q / ((k + 1.0) * (mu + k + 1.0))
        total = total + term
    return np.log(total)


def _log_ive_ratio(mu: np.ndarray, nu: float, beta: float) -> np.ndarray:
    r""":math:`\log(I_\mu(\beta)/I_\nu(\beta))`: where both orders are in Debye's range
    the pieces are subtracted one by one, so the common :math:`-\tfrac12\log(2\pi\beta)`
    cancels exactly (it is :math:`-345` at :math:`\beta = 10^{300}`, where the ratio is
    :math:`1 - O(1/\beta)`)."""
    mu = np.asarray(mu, dtype=float)
    if math.hypot(nu, beta) < DEBYE_RADIUS:
        return log_ive(mu, beta) - float(log_ive(nu, beta))
    q1, a1, r1, s1 = _debye_parts(mu, beta)
    q0, a0, r0, s0 = _debye_parts(np.asarray(nu, dtype=float), beta)
    # log rho_mu - log rho_nu = 1/2 log1p((mu^2 - nu^2)/(nu^2 + beta^2))
    dlog_rho = 0.5 * np.log1p((mu - nu) * (mu + nu) / (nu * nu + beta * beta))
    return (q1 - q0) - (a1 - a0) - 0.5 * dlog_rho + (s1 - s0)


def _rate_parts(beta: float, d: int, ell: np.ndarray, model: str,
                shift: float) -> tuple[np.ndarray, np.ndarray]:
    r""":math:`\lambda_\ell = F\,e^{R}` for :math:`\beta > 0`: the front
    :math:`F = \ell(\ell+d-2)/\beta`, formed as :math:`(\ell/\sqrt\beta)((\ell+d-2)/\sqrt\beta)`
    (no overflow at :math:`\beta \approx 10^{308}`, a few rounding units), and the
    logarithm :math:`R` of the Bessel part (:func:`log_ive`)."""
    nu = d / 2.0 - 1.0
    if beta <= SERIES_BETA:
        # the series: lambda = L/2 (beta/2)^(l-1) Gamma(nu+1)/Gamma(l+nu+1) S_{l+nu}/S_nu
        # (SA) or S_{l+nu} e^{-shift} (USA), no log of a front ~ 1/beta to cancel
        rest = (gammaln(nu + 1.0) - gammaln(ell + nu + 1.0) + _log_series(ell + nu, beta)
                - (float(_log_series(nu, beta)) if model == "sa" else shift))
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            front = 0.5 * ell * (ell + (d - 2.0)) * (0.5 * beta) ** (ell - 1.0)
            # where the power underflows or the front overflows: all of it in the exponent
            log_front = (np.log(0.5 * ell) + np.log(ell + (d - 2.0))
                         + (ell - 1.0) * (math.log(beta) - math.log(2.0)))
        good = np.isfinite(front) & (front > 0)
        return np.where(good, front, 1.0), np.where(good, rest, rest + log_front)
    root = math.sqrt(beta)
    with np.errstate(over="ignore"):     # inf for ell ~ 1e154: _rate then uses logs
        front = (ell / root) * ((ell + (d - 2.0)) / root)
    if model == "sa":
        return front, _log_ive_ratio(ell + nu, nu, beta)
    return front, (log_ive(ell + nu, beta) + gammaln(nu + 1.0)
                   + nu * (math.log(2.0) - math.log(beta)) + (beta - shift))


def _log_front(front: np.ndarray, beta: float, d: int, ell: np.ndarray) -> np.ndarray:
    r""":math:`\log F` of the front of :func:`_rate_parts`: ``log(front)`` where it is
    finite, :math:`\log(\ell(\ell+d-2)/\beta)` term by term where it overflows."""
    with np.errstate(divide="ignore"):
        return np.where(np.isfinite(front), np.log(front),
                        np.log(ell) + np.log(ell + (d - 2.0)) - math.log(beta))


def _log_rate(beta: float, d: int, ell: np.ndarray, model: str, shift: float) -> np.ndarray:
    r""":math:`\log\lambda_\ell` for :math:`\beta > 0` (:func:`_rate_parts`)."""
    front, rest = _rate_parts(beta, d, ell, model, shift)
    return _log_front(front, beta, d, ell) + rest


def _rate(beta: float, d: int, ell: np.ndarray, model: str, shift: float) -> np.ndarray:
    r""":math:`\lambda_\ell` for :math:`\beta > 0`: :math:`F e^R` where :math:`e^R` is in
    range (no logarithm of the front, whose rounding would cost
    :math:`10^{-16}\,|\log F|` relative), :math:`e^{\log F + R}` otherwise."""
    front, rest = _rate_parts(beta, d, ell, model, shift)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        direct = front * np.exp(rest)
        return np.where((np.abs(rest) < 700.0) & np.isfinite(front), direct,
                        np.exp(_log_front(front, beta, d, ell) + rest))


def mode_growth_rate(beta: float, d: int, degree: Any, *, model: str = "sa",
                     shift: float = 0.0) -> Any:
    r"""Linear growth rate of a degree-:math:`\ell` harmonic perturbation of the uniform
    measure on :math:`S^{d-1}`.

    With :math:`\nu = d/2 - 1`,

    .. math::
        \lambda_\ell^{USA} = \frac{\ell(\ell+d-2)}{\beta}\,\Gamma(\nu+1)
            \Big(\frac{2}{\beta}\Big)^{\nu} I_{\ell+\nu}(\beta)\,e^{-\mathrm{shift}},
        \qquad
        \lambda_\ell^{SA} = \frac{\ell(\ell+d-2)}{\beta}\,
            \frac{I_{\ell+\nu}(\beta)}{I_\nu(\beta)},

    (:math:`d = 2`: :math:`k^2 I_k(\beta)/\beta` and :math:`k^2 I_k(\beta)/(\beta I_0(\beta))`),
    and at :math:`\beta = 0` (both models) :math:`\lambda_1 = (d-1)/d`,
    :math:`\lambda_{\ell\ge2} = 0`.

    Parameters
    ----------
    beta : float
        Finite :math:`\beta \ge 0` (``inf`` and NaN raise, naming ``beta``).
    d : int
        Dimension of the ambient space (:math:`S^{d-1}`, :math:`d \ge 2`).
    degree : int or array_like of int
        Degrees :math:`\ell \ge 1`.
    model : {"sa", "usa"}
    shift : float
        Shift of the USA exponent: the rate is multiplied by :math:`e^{-\mathrm{shift}}`;
        USA only.

    Returns
    -------
    float or ndarray
        The rates (the shape of ``degree``); ``inf`` only where the true USA rate exceeds
        the float range (pass ``shift``).

    Notes
    -----
    Every float :math:`\beta` gets its finite rate: the Bessel functions are taken in
    logarithms (:func:`log_ive`: Debye's uniform expansion where
    :math:`\sqrt{\mu^2+\beta^2} \ge 60`, the power series for :math:`\beta \le 2`, where
    ``ive`` underflows at :math:`\beta = 10^{-300}`, and ``scipy.special.ive`` in between,
    which alone is NaN beyond :math:`\beta \approx 10^{9}`), the SA ratio
    :math:`I_{\ell+\nu}/I_\nu = 1 - \ell(\ell+d-2)/(2\beta) + \dots` piece by piece, and
    the front :math:`\ell(\ell+d-2)/\beta` without overflow.  Relative accuracy about
    :math:`10^{-14}` (a few units of :math:`10^{-16}` times :math:`|\log\lambda|` for USA).
    :math:`\lambda^{USA}` grows like :math:`e^\beta`, and ``shift=beta`` returns
    :math:`e^{-\beta}\lambda^{USA}`; a rate below the smallest double is 0.

    Examples
    --------
    >>> from transformer_pde.reductions.modes import mode_growth_rate
    >>> round(mode_growth_rate(4.0, 2, 3), 6), round(mode_growth_rate(4.0, 2, 3, model="usa"), 6)
    (0.664389, 7.508871)
    """
    beta, model = check_beta(beta), check_model(model)
    shift = check_shift(shift, model)
    d = integer("d", d, minimum=2)
    raw = real_array("degree", degree)
    if not np.all(np.isfinite(raw)) or np.any(raw != np.round(raw)) or np.any(raw < 1):
        raise ArgumentError(f"degree must be integers >= 1, got {degree!r:.60}")
    ell = raw.astype(float)
    if beta == 0.0:
        out = np.where(ell == 1.0, (d - 1.0) / d, 0.0) * (math.exp(-shift) if model == "usa"
                                                           else 1.0)
    else:
        out = _rate(beta, d, ell, model, shift)
    return float(out) if out.ndim == 0 else out


def _degree_step(ell: int, d: int, beta: Fraction, prec: int) -> decimal.Decimal:
    r""":math:`g(\ell) = \log(\lambda_{\ell+1}/\lambda_\ell)` in decimal arithmetic of
    ``prec`` digits, with Debye's expansion of both Bessel functions
    (:math:`\beta \ge` :data:`EXHAUSTIVE_BETA`, so its omitted terms are below
    :math:`\beta^{-10}`)."""
    with decimal.localcontext() as ctx:
        ctx.prec = prec
        ctx.Emax, ctx.Emin = decimal.MAX_EMAX, decimal.MIN_EMIN
        Dec = decimal.Decimal

        def dec(x: Fraction) -> decimal.Decimal:
            return Dec(x.numerator) / Dec(x.denominator)

        b = dec(beta)
        coefs = [[dec(v.get(pw, Fraction(0))) for pw in range(max(v), -1, -1)]
                 for v in _V_EXACT]

        def log_i(mu: decimal.Decimal) -> decimal.Decimal:
            # log(e^{-beta} I_mu(beta)) + 1/2 log(2 pi) (_debye_parts, in decimals)
            rho = (mu * mu + b * b).sqrt()
            p = mu / rho
            series = Dec(0)
            for v in reversed(coefs):         # Horner in 1/rho, and in p within V_k
                term = Dec(0)
                for c in v:
                    term = term * p + c
                series = series / rho + term
            x = mu / b
            asinh = (x + (1 + x * x).sqrt()).ln()
            return mu * mu / (rho + b) - mu * asinh - rho.ln() / 2 + series.ln()

        mu = dec(Fraction(2 * ell + d - 2, 2))     # ell + nu
        ratio = dec(Fraction((ell + 1) * (ell + d - 1), ell * (ell + d - 2)))
        return ratio.ln() + (log_i(mu + 1) - log_i(mu))


def most_unstable_degree(beta: float, d: int, *, model: str = "sa") -> int:
    r"""The degree :math:`\ell^* = \arg\max_{\ell\ge1}\lambda_\ell` of the fastest-growing
    harmonic (:func:`mode_growth_rate`; the smallest one on a tie).

    The two models differ by an :math:`\ell`-independent factor, so they share
    :math:`\ell^*`.  For :math:`\ell \ge L = \lceil 2\beta\rceil + 10` the ratio
    :math:`\lambda_{\ell+1}/\lambda_\ell < (1+\frac1\ell)(1+\frac{1}{\ell+d-2})\,
    \frac{\beta}{2\ell+d} < 1` (termwise in the series,
    :math:`I_{\mu+1}(\beta) < \frac{\beta}{2\mu+2} I_\mu(\beta)`), so the search over
    :math:`1 \le \ell \le L` is exhaustive.

    Up to :math:`\beta =` :data:`EXHAUSTIVE_BETA` every degree up to :math:`L` is compared
    in floating point.  Above, :math:`\ell^*` (about :math:`\sqrt{2\beta}`, an integer of
    up to 155 digits at :math:`\beta = 10^{308}`) is the first :math:`\ell` with
    :math:`g(\ell) = \log(\lambda_{\ell+1}/\lambda_\ell) \le 0`.  :math:`g` decreases in
    :math:`\ell` (:math:`(\ell+1)(\ell+d-1)/(\ell(\ell+d-2))` does, and so does
    :math:`I_{\mu+1}(\beta)/I_\mu(\beta)` in :math:`\mu`: Turán's inequality
    :math:`I_\mu^2 > I_{\mu-1}I_{\mu+1}`), so a bisection finds it; :math:`g` is
    evaluated in decimal arithmetic with :math:`1.6\log_{10}\beta + 40` digits and
    Debye's expansion, far finer than its slope :math:`\approx 2/\beta` near
    :math:`\ell^*`.

    Parameters
    ----------
    beta : float
        Finite :math:`\beta \ge 0` (:math:`\ell^* = 1` at :math:`\beta = 0`).
    d : int
        :math:`d \ge 2`.
    model : {"sa", "usa"}

    Returns
    -------
    int
        :math:`\ell^*` (a Python ``int``, exact at any float :math:`\beta`).

    Examples
    --------
    >>> from transformer_pde.reductions.modes import most_unstable_degree
    >>> [most_unstable_degree(b, 2) for b in (1, 2, 4, 5, 9, 20)]
    [1, 2, 3, 3, 4, 6]
    """
    beta, model = check_beta(beta), check_model(model)
    d = integer("d", d, minimum=2)
    if beta == 0.0:
        return 1
    if beta <= EXHAUSTIVE_BETA:
        ell = np.arange(1.0, math.ceil(2.0 * beta) + 11.0)
        return int(ell[np.argmax(_log_rate(beta, d, ell, "sa", 0.0))])
    exact = Fraction(beta)
    prec = int(1.6 * math.log10(beta)) + 40

    def rising(ell: int) -> bool:
        return _degree_step(ell, d, exact, prec) > 0

    # l(l + d - 2) = 2 beta to leading order: start from that root and widen until
    # g(lo) > 0 >= g(hi)
    root = math.isqrt(int(exact * 8) + (d - 2) ** 2)
    guess = max(1, (root - (d - 2)) // 2)
    width = 16
    lo, hi = max(1, guess - width), guess + width
    while lo > 1 and not rising(lo):
        lo, width = max(1, lo - width), 2 * width
    while rising(hi):
        hi, width = hi + width, 2 * width
    if not rising(lo):
        return lo                     # lo = 1 and lambda_2 <= lambda_1
    while hi - lo > 1:                # rising(lo), not rising(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if rising(mid) else (lo, mid)
    return hi
