r"""Fourier machinery of the mean-field equation on the circle.

A probability density :math:`\mu` on :math:`[0, 2\pi)` is stored by its Fourier
coefficients

.. math:: \hat\mu_k = \frac{1}{2\pi}\int_0^{2\pi} \mu(\theta)\, e^{-ik\theta}\, d\theta,
          \qquad \mu(\theta) = \sum_{k\in\mathbb Z} \hat\mu_k e^{ik\theta},
          \qquad \hat\mu_{-k} = \overline{\hat\mu_k},

of which :math:`k = 0, \dots, n-1` are kept (``n`` *modes*; :math:`\hat\mu_0 = 1/(2\pi)`).
With :math:`K(\theta) = e^{\beta\cos\theta} = \sum_m I_m(\beta) e^{im\theta}` the
convolution is diagonal, :math:`\widehat{(K*\mu)}_m = 2\pi I_m(\beta)\hat\mu_m`, and the
velocities of the two models are

.. math:: v_{SA} = \frac{1}{\beta}\,\partial_\theta \log (K*\mu), \qquad
          v_{USA} = \frac{1}{\beta}\,\partial_\theta (K*\mu).

:class:`CircleField` evaluates :math:`\partial_t\hat\mu_k = -ik\,\widehat{(\mu v)}_k`
pseudo-spectrally: :math:`\mu` and :math:`v` on a grid of :math:`M = 3n` points (then the
product is exact for every kept mode: the 3/2 rule), one real FFT back.  The factor
:math:`e^{\beta}` of :math:`I_m(\beta) = e^{\beta}\,\mathrm{ive}(m, \beta)` is never formed:
it cancels in the logarithmic derivative of SA and is a time scale for USA (the caller
integrates in :math:`\tau = e^{\beta - c} t`).  The mean is exactly constant: the
derivative of :math:`\hat\mu_0` is set to zero, not computed.

With noise, a diffusion :math:`D\,\partial_\theta^2\mu` adds :math:`-Dk^2\hat\mu_k`
exactly (the McKean–Vlasov equation).

The state handed to the time loop is the complex vector :math:`(\hat\mu_0, \dots,
\hat\mu_{n-1})` viewed as ``2n`` real numbers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import ive

__all__ = ["CircleField", "as_complex", "as_real", "circle_growth_rate", "evaluate",
           "pad", "tail_share", "kernel_coefficients"]

MODELS = ("sa", "usa")


def as_real(c: np.ndarray) -> np.ndarray:
    """The complex coefficients ``c`` (n,) as the real state (2n,) of the time loop."""
    return np.ascontiguousarray(c, dtype=np.complex128).view(np.float64)


def as_complex(y: np.ndarray) -> np.ndarray:
    """Inverse of :func:`as_real` (a view when ``y`` is contiguous)."""
    return np.ascontiguousarray(y, dtype=np.float64).view(np.complex128)


def pad(c: np.ndarray, n: int) -> np.ndarray:
    """The coefficients ``c`` (last axis) zero-padded (or cut) to ``n`` modes: padding is
    exact interpolation of the trigonometric polynomial."""
    out = np.zeros(c.shape[:-1] + (n,), dtype=np.complex128)
    m = min(n, c.shape[-1])
    out[..., :m] = c[..., :m]
    return out


def tail_share(c: np.ndarray, n: int | None = None) -> float:
    r"""Relative :math:`L^2` share of the top third of an ``n``-mode spectrum.

    .. math:: \tau(\mu) = \Big(\frac{2\sum_{k \ge \lceil 2n/3\rceil} |\hat\mu_k|^2}
              {|\hat\mu_0|^2 + 2\sum_{k\ge 1} |\hat\mu_k|^2}\Big)^{1/2}
              = \frac{\|P_{top}\,\mu\|_{L^2}}{\|\mu\|_{L^2}}

    over the coefficients ``c`` (:math:`k = 0, 1, \dots`); coefficients beyond ``n`` (when
    ``c`` is longer) count in the top part, since they would be dropped."""
    n = c.shape[-1] if n is None else int(n)
    e = np.abs(c) ** 2
    total = e[0] + 2.0 * e[1:].sum()
    if not total > 0:
        return math.inf
    return float(math.sqrt(2.0 * e[math.ceil(2 * n / 3):].sum() / total))


def evaluate(c: np.ndarray, m: int) -> np.ndarray:
    r"""The real trigonometric polynomial :math:`\sum_{|k|<n} \hat\mu_k e^{ik\theta}` at
    :math:`\theta_j = 2\pi j/m`, :math:`j = 0..m-1`, for coefficients ``c`` (..., n).

    Exact for every ``m``: modes beyond the Nyquist frequency are folded onto the grid
    (:math:`e^{ik\theta_j}` is :math:`m`-periodic in :math:`k`)."""
    c = np.asarray(c, dtype=np.complex128)
    n = c.shape[-1]
    if 2 * n - 1 <= m:
        spec = np.zeros(c.shape[:-1] + (m // 2 + 1,), dtype=np.complex128)
        spec[..., :n] = c
        return np.fft.irfft(spec, n=m, axis=-1) * m
    flat = c.reshape(-1, n)
    full = np.zeros((flat.shape[0], m), dtype=np.complex128)
    k = np.arange(n)
    np.add.at(full, (slice(None), k % m), flat)
    np.add.at(full, (slice(None), (-k[1:]) % m), np.conj(flat[:, 1:]))
    return (np.fft.ifft(full, axis=-1) * m).real.reshape(c.shape[:-1] + (m,))


def kernel_coefficients(beta: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    r"""``(w, a)``: :math:`w_k = 2\pi\,\mathrm{ive}(k, \beta) = 2\pi I_k(\beta) e^{-\beta}`
    and :math:`a_k = w_k/\beta` (its limit :math:`\pi\,\delta_{k1}` at :math:`\beta = 0`)
    for :math:`k = 0..n-1`."""
    k = np.arange(n)
    w = 2.0 * np.pi * ive(k, beta)
    if beta > 0:
        a = w / beta
    else:
        a = np.zeros(n)
        if n > 1:
            a[1] = np.pi
    return w, a


class CircleField:
    r"""Right-hand side :math:`\partial_\tau \hat\mu_k` of the circle equation, ``n`` modes.

    Parameters
    ----------
    n : int
        Number of modes kept (:math:`k = 0..n-1`).
    beta : float
        Inverse temperature :math:`\beta \ge 0`.
    model : {"sa", "usa"}
        ``"sa"``: :math:`v = \beta^{-1}\partial_\theta\log(K*\mu)`;
        ``"usa"``: :math:`v = e^{-\beta}\beta^{-1}\partial_\theta(K*\mu)` (the time
        :math:`\tau = e^{\beta - c}t` absorbs :math:`e^{\beta - c}`).
    diffusion : float, default 0.0
        :math:`D_\tau \ge 0` of the term :math:`D_\tau\,\partial_\theta^2\mu`, exact in
        Fourier: :math:`-D_\tau k^2\hat\mu_k` (in the time of the field: the caller
        divides the diffusion coefficient of :math:`t` by the time scale).

    Notes
    -----
    Called as ``field(t, y, left, stage)`` by :class:`~transformer_pde.integrate.TimeLoop`
    (``left`` and ``stage`` are not used: the field does not depend on time).
    """

    def __init__(self, n: int, beta: float, model: str, diffusion: float = 0.0):
        self.n, self.beta, self.model = int(n), float(beta), model
        self.m = 3 * self.n
        self.ik = 1j * np.arange(self.n)
        self.diffusion = float(diffusion)
        self.damping = self.diffusion * np.arange(self.n, dtype=float) ** 2
        w, a = kernel_coefficients(self.beta, self.n)
        self.w = w
        self.da = self.ik * a        # velocity coefficients (USA) / numerator (SA)

    def grid(self, c: np.ndarray) -> np.ndarray:
        """The trigonometric polynomial of ``c`` (n modes) on the ``3n``-point grid."""
        spec = np.zeros(self.m // 2 + 1, dtype=np.complex128)
        spec[:self.n] = c
        return np.fft.irfft(spec, n=self.m) * self.m

    def velocity(self, c: np.ndarray) -> np.ndarray:
        r"""The velocity :math:`v` on the ``3n``-point grid (USA: divided by
        :math:`e^{\beta - c}`)."""
        num = self.grid(self.da * c)
        if self.model == "usa":
            return num
        return num / self.grid(self.w * c)

    def __call__(self, t: float, y: Any, left: bool = False, stage: Any = None) -> np.ndarray:
        c = as_complex(y)
        flux = np.fft.rfft(self.grid(c) * self.velocity(c))[:self.n] / self.m
        out = -self.ik * flux
        if self.diffusion:
            out -= self.damping * c
        out[0] = 0.0                 # the mass is exactly conserved
        return as_real(out)


def circle_growth_rate(beta: float, k: int, model: str = "sa", shift: float = 0.0) -> float:
    r"""Linear growth rate of mode ``k`` about the uniform density on the circle.

    .. math:: \lambda_k^{SA} = \frac{k^2 I_k(\beta)}{\beta\, I_0(\beta)}, \qquad
              \lambda_k^{USA} = \frac{k^2 I_k(\beta)}{\beta}\, e^{-c}

    (limits :math:`1/2` for :math:`k = 1`, :math:`0` for :math:`k \ge 2` at
    :math:`\beta = 0`; :math:`c` the ``shift`` of USA)."""
    if k == 0:
        return 0.0
    w, a = kernel_coefficients(float(beta), k + 1)
    if model == "sa":
        return float(k * k * a[k] / w[0])
    return float(k * k * a[k] * math.exp(float(beta) - float(shift)) / (2.0 * np.pi))
