r"""Linear instability of the uniform measure on the sphere: growth rates of harmonics.

The mean-field equation :math:`\partial_t\mu + \nabla_S\cdot(\mu\,P_x\Gamma_\mu) = 0` on
:math:`S^{d-1}` has the uniform measure :math:`\sigma` as a stationary state.  A
perturbation :math:`\mu = \sigma(1 + \varepsilon Y_\ell)` by a spherical harmonic of degree
:math:`\ell` grows like :math:`e^{\lambda_\ell t}`, with :math:`\lambda_\ell` from the
Funk–Hecke formula (derivation on the documentation page *Exact reductions on the
sphere*).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import gammaln, ive

from ..errors import ArgumentError
from ..validation import integer, real_array
from .args import check_beta, check_model, check_shift

__all__ = ["mode_growth_rate", "most_unstable_degree"]


def _log_rate(beta: float, d: int, ell: np.ndarray, model: str, shift: float) -> np.ndarray:
    r""":math:`\log\lambda_\ell` for :math:`\beta > 0` (scaled Bessel functions:
    :math:`I_\nu(\beta) = \mathrm{ive}(\nu, \beta)\,e^\beta`)."""
    nu = d / 2.0 - 1.0
    with np.errstate(divide="ignore"):
        out = np.log(ell * (ell + d - 2.0)) + np.log(ive(ell + nu, beta)) - math.log(beta)
    if model == "sa":
        return out - math.log(ive(nu, beta))
    return out + gammaln(nu + 1.0) + nu * math.log(2.0 / beta) + beta - shift


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
        :math:`\beta \ge 0`.
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
    ``scipy.special.ive`` (exponentially scaled Bessel functions) and logarithms keep
    large :math:`\beta` finite: :math:`\lambda^{USA}` grows like :math:`e^\beta`, and
    ``shift=beta`` returns :math:`e^{-\beta}\lambda^{USA}`.

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
        with np.errstate(over="ignore"):
            out = np.exp(_log_rate(beta, d, ell, model, shift))
    return float(out) if out.ndim == 0 else out


def most_unstable_degree(beta: float, d: int, *, model: str = "sa") -> int:
    r"""The degree :math:`\ell^* = \arg\max_{\ell\ge1}\lambda_\ell` of the fastest-growing
    harmonic (:func:`mode_growth_rate`; the smallest one on a tie).

    The two models differ by an :math:`\ell`-independent factor, so they share
    :math:`\ell^*`.  For :math:`\ell \ge L = \lceil 2\beta\rceil + 10` the ratio
    :math:`\lambda_{\ell+1}/\lambda_\ell < (1+\frac1\ell)(1+\frac{1}{\ell+d-2})\,
    \frac{\beta}{2\ell+d} < 1` (termwise in the series,
    :math:`I_{\mu+1}(\beta) < \frac{\beta}{2\mu+2} I_\mu(\beta)`), so the search over
    :math:`1 \le \ell \le L` is exhaustive.

    Parameters
    ----------
    beta : float
        :math:`\beta \ge 0` (:math:`\ell^* = 1` at :math:`\beta = 0`).
    d : int
        :math:`d \ge 2`.
    model : {"sa", "usa"}

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
    ell = np.arange(1.0, math.ceil(2.0 * beta) + 11.0)
    return int(ell[np.argmax(_log_rate(beta, d, ell, "sa", 0.0))])
