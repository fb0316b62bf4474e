r"""One softmax layer over a long equiangular context: the exact cosine and its limit.

For :math:`n` unit tokens with :math:`\langle x_i, x_j\rangle = \rho` (:math:`i \ne j`) and
:math:`\beta_n = \gamma\log n`, one attention layer
:math:`\mathrm{ATT}(x_i) = \sum_j \mathsf A_{ij}x_j` maps the pair cosine :math:`\rho` to an
explicit function of :math:`(n, \gamma, \rho)` whose :math:`n \to \infty` limit has a phase
transition at :math:`\gamma = 1/(1-\rho)` (derivation on the documentation page *Exact
reductions on the sphere*).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ArgumentError
from ..validation import integer, nonnegative, scalar

__all__ = ["long_context_cosine", "long_context_limit"]


def _rho(rho: Any) -> float:
    r = scalar("rho", rho)
    if not 0.0 < r < 1.0:
        raise ArgumentError(f"rho must lie in (0, 1), got {rho!r}")
    return r


def long_context_cosine(n: int, gamma: float, rho: float) -> float:
    r"""Cosine between the outputs of one softmax layer at two of :math:`n` equiangular
    tokens, with :math:`\beta_n = \gamma\log n`.

    With :math:`\mathrm{ATT}(x_i) = (a-b)\,x_i + b\,S`, :math:`S = \sum_j x_j`,

    .. math::
        a = \frac{n^\gamma}{n^\gamma + (n-1)n^{\gamma\rho}}, \quad
        b = \frac{n^{\gamma\rho}}{n^\gamma + (n-1)n^{\gamma\rho}}, \quad
        s = 1 + (n-1)\rho, \quad c = s\,\big(2(a-b)b + n b^2\big),

        \cos = \frac{\langle\mathrm{ATT}(x_i), \mathrm{ATT}(x_k)\rangle}{|\mathrm{ATT}(x_i)|^2}
             = \frac{(a-b)^2\rho + c}{(a-b)^2 + c}.

    Evaluated with :math:`q = n^{-\gamma(1-\rho)}` and the common factor
    :math:`(1 + (n-1)q)^{-2}` removed, so :math:`n = 10^9` (or any :math:`n` below the float
    range) does not overflow.

    Parameters
    ----------
    n : int
        Number of tokens (:math:`\ge 2`).
    gamma : float
        :math:`\gamma \ge 0`.
    rho : float
        Pair cosine in :math:`(0, 1)`.

    Examples
    --------
    >>> from transformer_pde.reductions.limits import long_context_cosine
    >>> round(long_context_cosine(1000, 2.0, 0.5), 6)
    0.80028
    """
    n = integer("n", n, minimum=2)
    gamma = nonnegative("gamma", gamma)
    rho = _rho(rho)
    q = math.exp(-gamma * (1.0 - rho) * math.log(n))
    one_minus_q = -math.expm1(-gamma * (1.0 - rho) * math.log(n))
    s = 1.0 + (n - 1) * rho
    c = s * (2.0 * one_minus_q * q + n * q * q)
    d2 = one_minus_q * one_minus_q
    return (d2 * rho + c) / (d2 + c)


def long_context_limit(gamma: float, rho: float) -> float:
    r"""The :math:`n \to \infty` limit of :func:`long_context_cosine`.

    .. math::
        \lim_{n\to\infty}\cos = \begin{cases}
            1 & \gamma < 1/(1-\rho) \quad\text{(every output near the mean)}\\
            4\rho/(1+3\rho) & \gamma = 1/(1-\rho)\\
            \rho & \gamma > 1/(1-\rho) \quad\text{(every output near its own token)}
        \end{cases}

    Parameters
    ----------
    gamma, rho : float
        As in :func:`long_context_cosine`.

    Examples
    --------
    >>> from transformer_pde.reductions.limits import long_context_limit
    >>> long_context_limit(2.0, 0.5)
    0.8
    """
    gamma = nonnegative("gamma", gamma)
    rho = _rho(rho)
    critical = gamma * (1.0 - rho)
    if critical < 1.0:
        return 1.0
    if critical == 1.0:
        return 4.0 * rho / (1.0 + 3.0 * rho)
    return rho
