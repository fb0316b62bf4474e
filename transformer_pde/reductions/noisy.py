r"""Noisy attention on the sphere: the critical noise and the type of the phase transition.

With independent noise :math:`\sigma\,dW` on every token, the mean-field equation of the
unnormalised attention (``Attention("exp", I, I, I, beta=beta, shift=c)``, USA) on
:math:`S^{d-1}` becomes the McKean–Vlasov (Fokker–Planck) equation

.. math:: \partial_t\mu + \nabla\cdot(\mu\,P_x\Gamma_\mu) = \frac{\sigma^2}{2}\Delta\mu,
          \qquad P_x\Gamma_\mu(x) = P_x\!\int e^{\beta\langle x, y\rangle - c}\,y\,d\mu(y).

A degree-:math:`\ell` harmonic perturbation of the uniform measure grows at the rate
:math:`\lambda_\ell - \tfrac{\sigma^2}{2}\ell(\ell+d-2)`
(:func:`~transformer_pde.reductions.modes.mode_growth_rate` minus the eigenvalue of the
diffusion).  Since :math:`\lambda_\ell/(\ell(\ell+d-2)) \propto I_{\ell+d/2-1}(\beta)`
decreases in :math:`\ell`, the first harmonic is the first to lose stability as the noise
decreases: the uniform state is linearly stable exactly when :math:`\sigma > \sigma_\#`,

.. math:: \frac{\sigma_\#^2}{2} = \frac{\lambda_1}{d-1}
          = \frac{e^{-c}}{\beta}\,\Gamma(\tfrac d2)\Big(\frac2\beta\Big)^{d/2-1}
            I_{d/2}(\beta),
          \qquad K_\# = \frac{1}{\sigma_\#^2}
          = \frac{e^{c}\,\beta^{d/2}}{2^{d/2}\,\Gamma(d/2)\,I_{d/2}(\beta)}.

With :math:`c = 0` this is the linear-stability threshold of Mun–Rosenzweig (arXiv
2604.16288 on the circle, 2606.05140 on :math:`S^{d-1}`), whose noise is
:math:`\frac{1}{2K}\Delta`: their coupling :math:`K` is :math:`1/\sigma^2` in the
library's convention, and their kernel is the library's at ``shift=0`` (a shift :math:`c`
multiplies the interaction by :math:`e^{-c}`, so :math:`K_\#` by :math:`e^{c}`).

The bifurcating branch of stationary states has, in the first moment
:math:`m = \int\langle x, e\rangle\,d\mu` (:math:`e` its axis),

.. math:: \frac{K}{K_\#} = 1 + C\,m^2 + O(m^4), \qquad
          C = \frac{d\,(1 - d\,r)}{(d+2)(1-r)}, \quad r = \frac{I_{d/2+1}(\beta)}{I_{d/2}(\beta)},

so the transition is continuous (the branch leaves towards :math:`K > K_\#`, lower noise)
when :math:`r < 1/d` and discontinuous (a subcritical branch, a fold, hysteresis) when
:math:`r > 1/d`: the switch is at :math:`\beta_*` with
:math:`I_{d/2+1}(\beta_*)/I_{d/2}(\beta_*) = 1/d` (:func:`transition_beta`).  The
derivation is on the documentation page *Noisy transformers*.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import ive

from ..errors import ArgumentError
from ..validation import choice, integer, nonnegative, real_array
from .args import check_beta, check_model, check_shift
from .modes import mode_growth_rate

__all__ = ["NOISE_QUANTITIES", "TRANSITION_XTOL", "amplitude_coefficient", "critical_noise",
           "noisy_mode_growth_rate", "transition_beta", "transition_kind"]

#: what :func:`critical_noise` returns: the noise amplitude :math:`\sigma` of
#: ``Noise(sigma=...)``, the diffusion coefficient :math:`D = \sigma^2/2`, or the papers'
#: coupling :math:`K = 1/\sigma^2`
NOISE_QUANTITIES = ("sigma", "diffusion", "coupling")
#: absolute tolerance of the root :func:`transition_beta` (the ratio of Bessel functions
#: has slope about 0.2 there, so its residual is about :math:`10^{-15}`)
TRANSITION_XTOL = 1e-13


def _diffusion(beta: float, d: int, shift: float) -> float:
    """:math:`D_\\# = \\lambda_1^{USA}/(d-1)`."""
    return float(mode_growth_rate(beta, d, 1, model="usa", shift=shift)) / (d - 1.0)


def critical_noise(beta: float, d: int, *, shift: float = 0.0,
                   quantity: str = "sigma") -> float:
    r"""The noise level at which the uniform measure on :math:`S^{d-1}` loses linear
    stability under noisy unnormalised attention (kind ``"exp"``, :math:`Q = K = V = I`).

    .. math:: D_\# = \frac{\sigma_\#^2}{2} = \frac{\lambda_1^{USA}}{d-1}, \qquad
              K_\# = \frac{1}{\sigma_\#^2}
              = \frac{e^{c}\,\beta^{d/2}}{2^{d/2}\Gamma(d/2) I_{d/2}(\beta)}

    (:math:`\lambda_1^{USA}` of :func:`~transformer_pde.reductions.modes.mode_growth_rate`).
    The uniform state is linearly stable for :math:`\sigma > \sigma_\#` and unstable
    (its first harmonic grows) for :math:`\sigma < \sigma_\#`.

    Parameters
    ----------
    beta : float
        Finite :math:`\beta \ge 0` (:math:`K_\# = d/2` at :math:`\beta = 0`).
    d : int
        Ambient dimension (:math:`S^{d-1}`, :math:`d \ge 2`).
    shift : float, default 0.0
        The :math:`c` of the kernel :math:`e^{\beta\langle x, y\rangle - c}`.
    quantity : {"sigma", "diffusion", "coupling"}
        ``"sigma"``: the amplitude :math:`\sigma_\#` of the individual noise
        :math:`\sigma\,dW` (the ``sigma`` of the engine's noise); ``"diffusion"``:
        :math:`D_\# = \sigma_\#^2/2`, the coefficient of :math:`\Delta` in the PDE
        (``diffusion`` of :func:`~transformer_pde.meanfield.solve_circle`);
        ``"coupling"``: :math:`K_\# = 1/\sigma_\#^2`, Mun–Rosenzweig's
        :math:`K_\#^{(d)}(\beta)` (their noise :math:`\frac1{2K}\Delta`) at ``shift=0``.

    Returns
    -------
    float

    Examples
    --------
    >>> from transformer_pde.reductions.noisy import critical_noise
    >>> round(critical_noise(2.0, 2, quantity="coupling"), 6)   # 2 / (2 I_1(2))
    0.628679
    """
    beta = check_beta(beta)
    d = integer("d", d, minimum=2)
    shift = check_shift(shift, "usa")
    quantity = choice("quantity", quantity, NOISE_QUANTITIES)
    D = _diffusion(beta, d, shift)
    if not (D > 0 and math.isfinite(D)):
        raise ArgumentError(f"the critical noise at beta={beta:g}, d={d}, shift={shift:g} "
                            f"is out of the float range (D = {D!r}); choose shift near beta")
    if quantity == "diffusion":
        return D
    if quantity == "sigma":
        return math.sqrt(2.0 * D)
    return 1.0 / (2.0 * D)


def noisy_mode_growth_rate(beta: float, d: int, degree: Any, sigma: float, *,
                           model: str = "usa", shift: float = 0.0) -> Any:
    r"""Linear growth rate of a degree-:math:`\ell` harmonic perturbation of the uniform
    measure on :math:`S^{d-1}` under attention with individual noise :math:`\sigma\,dW`.

    .. math:: \lambda_\ell(\sigma) = \lambda_\ell - \frac{\sigma^2}{2}\,\ell(\ell+d-2),

    :math:`\lambda_\ell` of :func:`~transformer_pde.reductions.modes.mode_growth_rate` and
    :math:`\ell(\ell+d-2)` the eigenvalue of :math:`-\Delta` on degree-:math:`\ell`
    harmonics (:math:`k^2` on the circle).  Exact for the linearised McKean–Vlasov
    equation: the uniform measure is invariant under the noise, so the diffusion adds
    to the linear operator without coupling to the drift.

    Parameters
    ----------
    beta, d, degree, model, shift
        As in :func:`~transformer_pde.reductions.modes.mode_growth_rate`.
    sigma : float
        Noise amplitude :math:`\sigma \ge 0` (the diffusion coefficient is
        :math:`\sigma^2/2`).

    Returns
    -------
    float or ndarray
        The shape of ``degree``.

    Examples
    --------
    >>> from transformer_pde.reductions.noisy import critical_noise, noisy_mode_growth_rate
    >>> s = critical_noise(3.0, 3)
    >>> abs(noisy_mode_growth_rate(3.0, 3, 1, s)) < 1e-14
    True
    """
    sigma = nonnegative("sigma", sigma)
    d = integer("d", d, minimum=2)
    model = check_model(model)
    rate = mode_growth_rate(beta, d, degree, model=model, shift=shift)
    ell = real_array("degree", degree).astype(float)
    out = rate - 0.5 * sigma * sigma * ell * (ell + d - 2.0)
    return float(out) if np.ndim(out) == 0 else out


def _ratio(beta: float, d: int) -> float:
    r""":math:`r = I_{d/2+1}(\beta)/I_{d/2}(\beta)` (0 at :math:`\beta = 0`)."""
    if beta == 0.0:
        return 0.0
    return float(ive(d / 2.0 + 1.0, beta) / ive(d / 2.0, beta))


def transition_beta(d: int) -> float:
    r"""The inverse temperature :math:`\beta_*` at which the noise-driven transition of
    the uniform state on :math:`S^{d-1}` changes from continuous to discontinuous:

    .. math:: \frac{I_{d/2+1}(\beta_*)}{I_{d/2}(\beta_*)} = \frac1d,

    the zero of the amplitude coefficient :math:`C` (:func:`amplitude_coefficient`).  The
    ratio increases from 0 to 1 in :math:`\beta`, so the root is unique; Brent's method
    to :data:`TRANSITION_XTOL`.

    Parameters
    ----------
    d : int
        :math:`d \ge 2`.

    Returns
    -------
    float
        :math:`\beta_*` (2.446918 for :math:`d = 2`, 1.816155 for :math:`d = 3`).

    Examples
    --------
    >>> from transformer_pde.reductions.noisy import transition_beta
    >>> round(transition_beta(2), 6), round(transition_beta(3), 6)
    (2.446918, 1.816155)
    """
    d = integer("d", d, minimum=2)
    hi = 4.0
    while _ratio(hi, d) <= 1.0 / d:        # the ratio is about beta/(d+2) for small beta
        hi *= 2.0
    return float(brentq(lambda b: _ratio(b, d) - 1.0 / d, 1e-3, hi, xtol=TRANSITION_XTOL,
                        rtol=4 * np.finfo(float).eps, maxiter=200))


def amplitude_coefficient(beta: float, d: int) -> float:
    r"""The coefficient :math:`C` of the branch of stationary states near the
    bifurcation: :math:`K/K_\# = 1 + C m^2 + O(m^4)`, :math:`m` the first moment.

    .. math:: C = \frac{d\,(1 - d\,r)}{(d+2)(1-r)}, \qquad
              r = \frac{I_{d/2+1}(\beta)}{I_{d/2}(\beta)}.

    :math:`C > 0`: the branch exists for :math:`K > K_\#` (lower noise), the transition
    is continuous (supercritical); :math:`C < 0`: the branch bends back to higher noise,
    the transition is discontinuous (subcritical).  Independent of ``shift`` (which
    rescales :math:`K` and :math:`K_\#` alike).  Derived on the documentation page
    *Noisy transformers* by expanding the self-consistency
    :math:`\mu \propto e^{\kappa\,W*\mu}` to third order in :math:`m`.

    Examples
    --------
    >>> from transformer_pde.reductions.noisy import amplitude_coefficient
    >>> amplitude_coefficient(0.0, 2)          # the Kuramoto limit: d/(d+2)
    0.5
    """
    beta = check_beta(beta)
    d = integer("d", d, minimum=2)
    r = _ratio(beta, d)
    return d * (1.0 - d * r) / ((d + 2.0) * (1.0 - r))


def transition_kind(beta: float, d: int) -> str:
    r"""``"continuous"`` when :math:`\beta \le \beta_*` (:func:`transition_beta`),
    ``"discontinuous"`` above: the type of the transition of the uniform state as the
    noise decreases through :math:`\sigma_\#`.

    Examples
    --------
    >>> from transformer_pde.reductions.noisy import transition_kind
    >>> transition_kind(2.0, 2), transition_kind(3.0, 2)
    ('continuous', 'discontinuous')
    """
    beta = check_beta(beta)
    return "continuous" if beta <= transition_beta(d) else "discontinuous"
