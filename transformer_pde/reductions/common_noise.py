r"""Two tokens on the sphere driven by a common matrix noise: the antipodal probability.

Two unit tokens follow the attention flow (:math:`Q = K = V = I`, inverse temperature
:math:`\beta`, strength ``drift``) plus a *common* matrix Brownian motion :math:`W_t`
(:math:`d\times d`, independent entries of variance :math:`\sigma^2 t`) that every token
sees, read on the sphere (projected Stratonovich SDE, which is also the limit of the
normalised residual update :math:`x \mapsto (x + \delta)/|x + \delta|`):

* ``placement="token"`` — the noise multiplies the token,
  :math:`dx_i = P_{x_i}\big(\lambda A_i\,dt + \sigma\,dW_t\,x_i\big)`; this is the engine's
  ``Noise(common=A)`` with the :math:`d^2` matrices :math:`A_{ab} = \sigma E_{ab}`
  (:func:`common_noise_matrices`);
* ``placement="value"`` — the noise multiplies the attention output (a random value
  matrix), :math:`dx_i = P_{x_i}\big(\lambda A_i\,dt + \sigma\,dW_t\,A_i\big)` in the Ito
  form of the normalised layer update,

with :math:`A_i = p\,x_i + q\,x_j` the attention average (self weight :math:`p`, cross
weight :math:`q`).  The cosine :math:`\rho = \langle x_1, x_2\rangle` is a one-dimensional
diffusion :math:`d\rho = b(\rho)\,dt + \sqrt{a(\rho)}\,dB_t` (:func:`pair_coefficients`) with

.. math::
    b = (1-\rho^2)\big[2\lambda q + \sigma^2\big(T(d-2) - S\rho\big)\big], \qquad
    a = 2\sigma^2 S\,(1-\rho^2)^2,

:math:`S = 1, T = 0` for the token placement and :math:`S = p^2+q^2, T = 2pq` for the
value placement.  Both ends :math:`\rho = \pm1` are unattainable in finite time and
:math:`\rho_t \to \pm1` almost surely; with the scale density
:math:`s'(\rho) = \exp(-\int^\rho 2b/a)`,

.. math:: P(\rho_t \to -1 \mid \rho_0) = \frac{s(1) - s(\rho_0)}{s(1) - s(-1)},

positive exactly when :math:`s'` is integrable at :math:`-1`, i.e. when the exponent
:math:`c_-` of :math:`s'(\rho) \sim (1+\rho)^{-c_-}` is below 1 (:func:`scale_exponents`,
:func:`critical_beta`).  :func:`antipodal_probability` evaluates the ratio by composite
Gauss quadrature with the endpoint powers integrated exactly (Gauss–Jacobi); the derivation
is on the documentation page *Common noise: two tokens driven antipodal*.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.linalg import eigh_tridiagonal
from scipy.special import gammaln, roots_legendre

from ..errors import ArgumentError, SolverNotConverged
from ..validation import choice, integer, nonnegative, positive, real_array
from .args import OVERFLOW_EXPONENT, check_beta, check_model, check_shift

__all__ = ["PLACEMENTS", "RTOL", "antipodal_probability", "common_noise_matrices",
           "critical_beta", "pair_coefficients", "scale_exponents"]

#: where the common noise enters: on the token (``"token"``) or on the attention output
#: (``"value"``, a random value matrix)
PLACEMENTS = ("token", "value")
#: relative agreement required between the quadratures of two orders (on the smaller of
#: :math:`P` and :math:`1-P`)
RTOL = 1e-9
#: Gauss nodes per panel of the two quadratures compared
_ORDERS = (20, 30)
#: most panels of one quadrature
_MAX_PANELS = 200_000


def common_noise_matrices(d: Any, sigma: Any = 1.0) -> np.ndarray:
    r"""The :math:`d^2` matrices :math:`\sigma E_{ab}` of a matrix Brownian motion.

    :math:`\sigma\,dW_t\,x = \sum_{a,b} (\sigma E_{ab} x)\,dB^{ab}_t` with :math:`W_t` a
    :math:`d\times d` matrix of independent Brownian motions :math:`B^{ab}`, so
    ``Noise(common=common_noise_matrices(d, sigma))`` is the token placement of this module.

    Parameters
    ----------
    d : int
        Dimension :math:`d \ge 1`.
    sigma : float
        Noise level :math:`\sigma \ge 0`.

    Returns
    -------
    ndarray, shape (d*d, d, d)
        ``out[a*d + b]`` is :math:`\sigma E_{ab}` (one entry :math:`\sigma` at row ``a``,
        column ``b``).

    Examples
    --------
    >>> from transformer_pde.reductions.common_noise import common_noise_matrices
    >>> A = common_noise_matrices(2, 0.5)
    >>> A.shape, float(A[1, 0, 1])
    ((4, 2, 2), 0.5)
    """
    d = integer("d", d, minimum=1)
    sigma = nonnegative("sigma", sigma)
    out = np.zeros((d * d, d, d))
    a, b = np.divmod(np.arange(d * d), d)
    out[np.arange(d * d), a, b] = sigma
    return out


class _Pair:
    """The checked parameters of the two-token diffusion and its :math:`G = (1-\\rho^2)2b/a`."""

    def __init__(self, beta: Any, d: Any, sigma: Any, placement: Any, model: Any,
                 drift: Any, shift: Any) -> None:
        self.beta = check_beta(beta)
        self.d = integer("d", d, minimum=2)
        self.sigma = positive("sigma", sigma)
        self.placement = choice("placement", placement, PLACEMENTS)
        self.model = check_model(model)
        self.drift = nonnegative("drift", drift)
        self.shift = check_shift(shift, self.model)
        if self.model == "usa" and self.beta - self.shift > OVERFLOW_EXPONENT:
            raise ArgumentError(f"beta - shift = {self.beta - self.shift:g} > "
                                f"{OVERFLOW_EXPONENT:g}: the unnormalised weights overflow "
                                "(pass shift close to beta)")
        self.lam = self.drift / self.sigma ** 2

    def weights(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Self weight :math:`p` and the ratio :math:`w = q/p = e^{-\\beta(1-\\rho)}`."""
        w = np.exp(-self.beta * (1.0 - r))
        if self.model == "sa":
            return 1.0 / (1.0 + w), w
        return np.full_like(r, 0.5 * math.exp(self.beta - self.shift)), w

    def G(self, r: Any) -> np.ndarray:
        r""":math:`G(\rho) = (1-\rho^2)\,2b/a` (smooth on :math:`[-1, 1]`)."""
        r = np.asarray(r, dtype=float)
        p, w = self.weights(r)
        if self.placement == "token":
            return 2.0 * self.lam * w * p - r
        return (2.0 * self.lam * w / p + 2.0 * w * (self.d - 2)) / (1.0 + w * w) - r

    def exponents(self) -> tuple[float, float]:
        g = self.G(np.array([-1.0, 1.0]))
        return 0.5 * float(g[0]), 0.5 * float(g[1])

    def coefficients(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p, w = self.weights(r)
        q = w * p
        if self.placement == "token":
            S, T = np.ones_like(r), np.zeros_like(r)
        else:
            S, T = p * p + q * q, 2.0 * p * q
        one = 1.0 - r * r
        b = one * (2.0 * self.drift * q + self.sigma ** 2 * (T * (self.d - 2) - S * r))
        return b, 2.0 * self.sigma ** 2 * S * one * one


def pair_coefficients(rho: Any, beta: Any, d: Any, sigma: Any = 1.0, *,
                      placement: str = "token", model: str = "sa", drift: Any = 1.0,
                      shift: Any = 0.0) -> tuple[np.ndarray, np.ndarray]:
    r"""Drift :math:`b(\rho)` and diffusion :math:`a(\rho)` of the cosine of two tokens.

    :math:`d\rho = b\,dt + \sqrt a\,dB_t` with
    :math:`b = (1-\rho^2)[2\lambda q + \sigma^2(T(d-2) - S\rho)]`,
    :math:`a = 2\sigma^2 S(1-\rho^2)^2` (module docstring; :math:`\lambda` = ``drift``).

    Parameters
    ----------
    rho : float or array_like
        Cosines in :math:`[-1, 1]`.
    beta : float
        Inverse temperature :math:`\beta \ge 0`.
    d : int
        Dimension :math:`d \ge 2` (the token placement does not depend on it).
    sigma : float
        Noise level :math:`\sigma > 0` (entries of :math:`W_t` have variance :math:`\sigma^2 t`).
    placement : {"token", "value"}
        Where the common noise enters.
    model : {"sa", "usa"}
        Softmax (:math:`p = e^\beta/(e^\beta + e^{\beta\rho})`, :math:`q = 1-p`) or the
        unnormalised kernel (:math:`p = e^{\beta-\mathrm{shift}}/2`,
        :math:`q = e^{\beta\rho-\mathrm{shift}}/2`).
    drift : float
        Strength :math:`\lambda \ge 0` of the attention velocity :math:`P_x A_i`.
    shift : float
        Shift of the unnormalised exponent (``model="usa"`` only).

    Returns
    -------
    (ndarray, ndarray)
        :math:`b(\rho)` and :math:`a(\rho)`, the shape of ``rho``.

    Examples
    --------
    >>> from transformer_pde.reductions.common_noise import pair_coefficients
    >>> b, a = pair_coefficients(0.5, 0.0, 3, 1.0, drift=0.0)
    >>> float(b), float(a)      # -sigma^2 rho (1 - rho^2), 2 sigma^2 (1 - rho^2)^2
    (-0.375, 1.125)
    """
    pair = _Pair(beta, d, sigma, placement, model, drift, shift)
    r = _check_rho(rho)
    return pair.coefficients(r)


def scale_exponents(beta: Any, d: Any, sigma: Any = 1.0, *, placement: str = "token",
                    model: str = "sa", drift: Any = 1.0,
                    shift: Any = 0.0) -> tuple[float, float]:
    r"""The exponents of the scale density at the two ends.

    :math:`s'(\rho) \sim (1+\rho)^{-c_-}` as :math:`\rho \to -1` and
    :math:`s'(\rho) \sim (1-\rho)^{c_+}` as :math:`\rho \to 1`, with
    :math:`c_\pm = G(\pm1)/2`, :math:`G = (1-\rho^2)\,2b/a`.  The antipodal end is reached
    with positive probability iff :math:`c_- < 1`; :math:`c_+ \ge -1/2 > -1` always, so
    merging always has positive probability.  Token placement, softmax:
    :math:`c_- = \tfrac12 + \lambda/(\sigma^2(1+e^{2\beta}))`.

    Parameters
    ----------
    beta, d, sigma, placement, model, drift, shift
        As in :func:`pair_coefficients`.

    Returns
    -------
    (float, float)
        :math:`(c_-, c_+)`.

    Examples
    --------
    >>> from transformer_pde.reductions.common_noise import scale_exponents
    >>> scale_exponents(0.0, 3, 1.0, drift=0.0)
    (0.5, -0.5)
    """
    return _Pair(beta, d, sigma, placement, model, drift, shift).exponents()


def critical_beta(d: Any, sigma: Any = 1.0, *, placement: str = "token", model: str = "sa",
                  drift: Any = 1.0, shift: Any = 0.0) -> float:
    r"""The inverse temperature above which two tokens end antipodal with positive probability.

    :math:`c_-(\beta)` (:func:`scale_exponents`) decreases with :math:`\beta` to
    :math:`1/2`; the critical :math:`\beta_c` solves :math:`c_-(\beta_c) = 1` (0 when
    :math:`c_-(0) < 1`).  For :math:`\beta > \beta_c` the antipodal probability is positive,
    for :math:`\beta \le \beta_c` it is 0.  Closed forms (softmax):
    :math:`\beta_c = \tfrac12\log(2\lambda/\sigma^2 - 1)` (token placement,
    :math:`2\lambda > 2\sigma^2`), :math:`\beta_c = \tfrac12\operatorname{arccosh}(d-2)`
    (value placement, ``drift=0``, :math:`d \ge 3`).  Root found by Brent's method to
    ``xtol=1e-13``.

    Parameters
    ----------
    d, sigma, placement, model, drift, shift
        As in :func:`pair_coefficients`.

    Returns
    -------
    float
        :math:`\beta_c \ge 0`.

    Examples
    --------
    >>> import math
    >>> from transformer_pde.reductions.common_noise import critical_beta
    >>> abs(critical_beta(10, placement="value", drift=0.0) - math.acosh(8) / 2) < 1e-12
    True
    """
    def excess(beta: float) -> float:
        return _Pair(beta, d, sigma, placement, model, drift, shift).exponents()[0] - 1.0

    if excess(0.0) < 0.0:
        return 0.0
    hi = 1.0
    while excess(hi) >= 0.0:
        hi *= 2.0
        if hi > OVERFLOW_EXPONENT:
            raise ArgumentError("the antipodal end stays unreachable for every beta <= "
                                f"{OVERFLOW_EXPONENT:g} (drift / sigma^2 too large)")
    return float(brentq(excess, 0.0, hi, xtol=1e-13, rtol=4 * np.finfo(float).eps))


def _check_rho(rho: Any) -> np.ndarray:
    r = np.asarray(real_array("rho", rho), dtype=float)
    if not np.all(np.isfinite(r)) or np.any(np.abs(r) > 1.0):
        raise ArgumentError("rho must be cosines in [-1, 1]")
    return r


def antipodal_probability(beta: Any, d: Any, rho0: Any, sigma: Any = 1.0, *,
                          placement: str = "token", model: str = "sa", drift: Any = 1.0,
                          shift: Any = 0.0) -> Any:
    r"""Probability that two tokens driven by a common matrix noise end antipodal.

    :math:`P(\rho_t \to -1 \mid \rho_0) = \int_{\rho_0}^1 s' \big/ \int_{-1}^1 s'` with
    :math:`s' = (1+\rho)^{-c_-}(1-\rho)^{c_+}e^{-H(\rho)}` and :math:`H` the integral of the
    smooth remainder of :math:`2b/a` after its two poles (module docstring).  Computed by
    composite Gauss quadrature on panels no wider than the scales of the integrand
    (:math:`1/\beta`, :math:`1/c_+`, :math:`\sigma^2/\lambda`), Gauss–Jacobi on the two end
    panels so that the powers :math:`(1\pm\rho)^{\cdot}` are integrated exactly, :math:`H`
    by spectral integration on the same panels, all in logarithms (no overflow);
    :math:`P` and :math:`1-P` from suffix and prefix sums of positive terms (both to full
    relative accuracy).  Two orders are compared and must agree to ``RTOL`` = 1e-9 on the
    smaller of :math:`P` and :math:`1-P`.  :math:`P = 0` exactly when :math:`c_- \ge 1`
    (and :math:`\rho_0 > -1`); :math:`\rho_0 = -1` gives 1, :math:`\rho_0 = 1` gives 0.
    Values below the float range come out as 0.

    Parameters
    ----------
    beta, d, sigma, placement, model, drift, shift
        As in :func:`pair_coefficients`.
    rho0 : float or array_like
        Initial cosines :math:`\rho_0 \in [-1, 1]`.

    Returns
    -------
    float or ndarray
        :math:`P(\rho_t \to -1)`, the shape of ``rho0``.

    Raises
    ------
    SolverNotConverged
        If the two quadratures disagree (not observed for valid arguments).

    Examples
    --------
    >>> import math
    >>> from transformer_pde.reductions.common_noise import antipodal_probability
    >>> p = antipodal_probability(1.0, 3, 0.0, 1.0, drift=0.0)    # no attention: angle / pi
    >>> abs(p - 0.5) < 1e-12
    True
    >>> antipodal_probability(0.5, 3, 0.0, 0.5) == 0.0    # sigma^2 (1 + e^{2 beta}) < 2 drift
    True
    """
    pair = _Pair(beta, d, sigma, placement, model, drift, shift)
    r0 = _check_rho(rho0)
    flat = r0.ravel()
    c_minus, c_plus = pair.exponents()
    out = np.where(flat == -1.0, 1.0, 0.0)
    inner = (flat > -1.0) & (flat < 1.0)
    if c_minus < 1.0 and np.any(inner):
        out[inner] = _quadrature(pair, flat[inner], c_minus, c_plus)
    return float(out[0]) if r0.ndim == 0 else out.reshape(r0.shape)


# ------------------------------------------------------------------ quadrature
def _panel_width(pair: _Pair, c_minus: float, c_plus: float) -> float:
    scale = (1.0 + pair.beta + abs(c_plus) + abs(c_minus) + 2.0 * pair.lam
             + (pair.d if pair.placement == "value" else 0))
    if pair.model == "usa":
        scale += 2.0 * pair.lam * math.exp(min(pair.beta - pair.shift, OVERFLOW_EXPONENT))
    return min(0.1, 1.0 / scale)


def _integration_matrix(x: np.ndarray, wx: np.ndarray, y: np.ndarray) -> np.ndarray:
    r""":math:`M` with :math:`\int_{-1}^{y_j} f \approx \sum_k M_{jk} f(x_k)` (Legendre
    interpolation of :math:`f` at the Gauss nodes :math:`x_k`)."""
    n = x.size
    Px = np.polynomial.legendre.legvander(x, n)          # P_m(x_k), m <= n
    Py = np.polynomial.legendre.legvander(y, n)
    Iy = np.empty((y.size, n))                           # int_{-1}^{y} P_m
    Iy[:, 0] = y + 1.0
    for m in range(1, n):
        Iy[:, m] = (Py[:, m + 1] - Py[:, m - 1]) / (2 * m + 1)
    coef = (2 * np.arange(n) + 1) / 2.0                  # c_m = coef_m sum_k w_k P_m(x_k) f_k
    return Iy @ (coef[:, None] * Px[:, :n].T * wx[None, :])


def _quadrature(pair: _Pair, rho0: np.ndarray, c_minus: float, c_plus: float) -> np.ndarray:
    width = _panel_width(pair, c_minus, c_plus)
    npan = int(math.ceil(2.0 / width))
    if npan > _MAX_PANELS:
        raise ArgumentError(f"antipodal_probability needs more than {_MAX_PANELS} panels "
                            f"for beta={pair.beta:g}, d={pair.d}, drift / sigma^2="
                            f"{pair.lam:.3g} (the integrand varies on scales below "
                            f"{2 / _MAX_PANELS:.0e}): lower beta or d, or raise sigma")
    edges = np.unique(np.concatenate([np.linspace(-1.0, 1.0, npan + 1), rho0,
                                      _graded(rho0, width)]))
    results = [_probabilities(pair, edges, rho0, c_minus, c_plus, n) for n in _ORDERS]
    (p1, q1), (p2, q2) = results
    if not all(np.all(np.isfinite(v)) for v in (p1, q1, p2, q2)):
        raise SolverNotConverged("antipodal_probability: the quadrature overflowed (drift / "
                                 f"sigma^2 = {pair.lam:.3g}, beta = {pair.beta:g}, d = {pair.d})")
    small1, small2 = np.minimum(p1, q1), np.minimum(p2, q2)
    scale = np.maximum(np.abs(small2), np.finfo(float).tiny)
    if np.any(np.abs(small1 - small2) > RTOL * scale + 1e-300):
        raise SolverNotConverged("antipodal_probability: the quadratures of "
                                 f"{_ORDERS[0]} and {_ORDERS[1]} nodes per panel disagree "
                                 f"(max relative {np.max(np.abs(small1 - small2) / scale):.2e})")
    return np.where(p2 <= q2, p2, 1.0 - q2)


def _jacobi_rule(n: int, alpha: float, beta: float) -> tuple[np.ndarray, np.ndarray]:
    r"""Gauss–Jacobi nodes and log-weights for :math:`(1-y)^\alpha(1+y)^\beta` on
    :math:`[-1, 1]` (Golub–Welsch; the total mass in logarithms, so that a large
    :math:`\alpha` does not overflow as it does in ``scipy.special.roots_jacobi``)."""
    k = np.arange(1, n)
    s = 2 * k + alpha + beta
    diag = np.empty(n)
    diag[0] = (beta - alpha) / (alpha + beta + 2)
    diag[1:] = (beta * beta - alpha * alpha) / (s * (s + 2))
    off = np.sqrt(4 * k * (k + alpha) * (k + beta) * (k + alpha + beta)
                  / (s * s * (s + 1) * (s - 1)))
    x, V = eigh_tridiagonal(diag, off)
    log_mass = ((alpha + beta + 1) * math.log(2.0) + gammaln(alpha + 1) + gammaln(beta + 1)
                - gammaln(alpha + beta + 2))
    with np.errstate(divide="ignore"):       # a weight below the float range: log 0 = -inf
        return x, log_mass + 2.0 * np.log(np.abs(V[0]))


def _graded(rho0: np.ndarray, width: float) -> np.ndarray:
    """Breakpoints doubling their distance to the nearer end from each ``rho0`` near it, so
    that no panel is longer than its distance to an end singularity (``1 - rho0`` or
    ``1 + rho0`` times 2, 4, ... up to ``width``)."""
    out = []
    for dist, sign in ((1.0 + rho0, -1.0), (1.0 - rho0, 1.0)):
        dist = dist[dist < width]
        if dist.size:
            k = np.arange(1, int(math.ceil(math.log2(width / dist.min()))) + 1)
            steps = dist[:, None] * 2.0 ** k[None, :]
            steps = steps[steps < width]
            out.append(sign * (1.0 - steps))
    return np.concatenate(out) if out else np.empty(0)


def _probabilities(pair: _Pair, edges: np.ndarray, rho0: np.ndarray, c_minus: float,
                   c_plus: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(P, 1 - P)`` at ``rho0`` (breakpoints among ``edges``) with ``n`` nodes per panel."""
    lo, hi = edges[:-1], edges[1:]
    half = 0.5 * (hi - lo)
    x, wx = roots_legendre(n)
    # H on every panel: spectral integration of h = [G - linear]/(1 - r^2) from the panel start
    g_lo, g_hi = 2.0 * c_minus, 2.0 * c_plus

    def h(r: np.ndarray) -> np.ndarray:
        r = np.clip(r, -1.0 + 1e-9, 1.0 - 1e-9)   # a divided difference: bounded, smooth
        return (pair.G(r) - 0.5 * g_lo * (1.0 - r) - 0.5 * g_hi * (1.0 + r)) / (1.0 - r * r)

    rx = lo[:, None] + half[:, None] * (1.0 + x[None, :])
    hx = h(rx)
    H_start = np.concatenate([[0.0], np.cumsum(half * (hx @ wx))[:-1]])
    # the left panel integrates (1 + y)^{-c_-} g = g(-1)(1 + y)^{-c_-} + (1 + y)^{1-c_-}
    # (g - g(-1))/(1 + y): the first exactly, the second with the weight (1 + y)^{1-c_-}
    # (a Jacobi weight near (1 + y)^{-1} has inaccurate nodes when c_- -> 1)
    nodes = {"mid": (x, np.log(wx)), "left": _jacobi_rule(n, 0.0, 1.0 - c_minus),
             "right": _jacobi_rule(n, c_plus, 0.0)}
    kind = np.full(lo.size, "mid", dtype=object)
    kind[0], kind[-1] = "left", "right"
    logs = np.full((lo.size, n), -np.inf)
    for name, (y, log_wy) in nodes.items():
        sel = kind == name
        M = _integration_matrix(x, wx, y)
        H = H_start[sel, None] + half[sel, None] * (hx[sel] @ M.T)
        # 1 +- r from the panel's ends (exact near the ends), not from the rounded r
        one_plus = (1.0 + lo[sel, None]) + half[sel, None] * (1.0 + y[None, :])
        one_minus = (1.0 - hi[sel, None]) + half[sel, None] * (1.0 - y[None, :])
        # log of s' / 2^{c_+} without the power a Jacobi weight integrates exactly
        log_f = -H
        log_pref = np.log(half[sel])                              # dr = half dy
        if name == "left":      # 1 + r = half (1 + y)
            log_pref = log_pref - c_minus * np.log(half[sel])
        else:
            log_f = log_f - c_minus * np.log(one_plus)
        if name == "right":     # (1 - r)/2 = (half/2)(1 - y): the weight takes (1 - y)^{c_+}
            log_pref = log_pref + c_plus * np.log(0.5 * half[sel])
        else:
            log_f = log_f + c_plus * np.log(0.5 * one_minus)
        if name == "left":      # g(-1) = e^{-H(-1)} = 1
            g = np.expm1(log_f[0])                                # g - g(-1)
            bracket = (2.0 ** (1.0 - c_minus) / (1.0 - c_minus)
                       + float(np.sum(np.exp(log_wy) * g / (1.0 + y))))
            logs[0, 0] = float(log_pref[0]) + math.log(bracket)
        else:
            logs[sel] = log_wy[None, :] + log_f + log_pref[:, None]
    K = np.max(logs)
    panel = np.exp(logs - K).sum(axis=1)
    prefix = np.concatenate([[0.0], np.cumsum(panel)])           # int_{-1}^{edges[k]}
    suffix = np.concatenate([np.cumsum(panel[::-1])[::-1], [0.0]])  # int_{edges[k]}^{1}
    total = prefix[-1]
    k = np.searchsorted(edges, rho0)
    return suffix[k] / total, prefix[k] / total
