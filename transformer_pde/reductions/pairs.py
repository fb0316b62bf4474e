r"""Two-token reductions: the causal pair and the pairing angle of large :math:`\beta`.

* :func:`causal_pair` — two tokens under causal softmax attention (:math:`V = I`) on the
  sphere: the first sees only itself and stays put, the second moves along the great
  circle towards it.
* :func:`pairing_angle` — the angle of a pair following :math:`y_1' = P_{y_1}y_2`,
  :math:`y_2' = P_{y_2}y_1`: the merging of the closest pair at large :math:`\beta` in a
  rescaled time, with the mutual weight frozen (derivations on the documentation page
  *Exact reductions on the sphere*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.integrate import solve_ivp
from scipy.special import expit

from .. import results_display as display
from ..errors import ArgumentError, SolverNotConverged
from ..validation import real_array, scalar
from .args import check_beta, check_times

__all__ = ["CausalPair", "causal_pair", "pairing_angle"]

#: tolerances of the DOP853 solve in :math:`z = \log\frac{1+\rho}{1-\rho}`
RTOL, ATOL = 2.5e-14, 1e-16


@dataclass(frozen=True, eq=False, repr=False)
class CausalPair(display.Summarised):
    r"""The causal pair at the requested times.

    Attributes
    ----------
    t : ndarray
        The times (shape of the ``t`` given).
    rho : ndarray
        :math:`\rho(t) = \langle x_1, x_2(t)\rangle`.
    one_minus_rho : ndarray
        :math:`1-\rho(t)` to full relative accuracy.
    beta, rho0
        The inputs.
    """

    t: np.ndarray
    rho: np.ndarray
    one_minus_rho: np.ndarray
    beta: float
    rho0: float

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        rows = [("t", display.path_text(self.t) + f" ({np.size(self.t)} times)"),
                ("rho", display.path_text(self.rho)),
                ("1 - rho", display.path_text(self.one_minus_rho))]
        return (f"CausalPair(beta={display.number(self.beta)}, "
                f"rho0={display.number(self.rho0)})", rows)


def causal_pair(beta: float, rho0: float, t: Any) -> CausalPair:
    r"""Two unit tokens under causal softmax attention (:math:`Q = K = V = I`) on the sphere.

    The first token attends only to itself, so :math:`\dot x_1 = P_{x_1}x_1 = 0`; the
    second attends to both,
    :math:`A_2 = (e^{\beta\rho}x_1 + e^\beta x_2)/(e^{\beta\rho} + e^\beta)`, and
    :math:`\rho = \langle x_1, x_2\rangle` obeys

    .. math::
        \dot\rho = \langle x_1, P_{x_2}A_2\rangle
                 = \frac{e^{\beta\rho}(1-\rho^2)}{e^{\beta\rho} + e^{\beta}} .

    Integrated (DOP853, ``rtol=2.5e-14``) in :math:`z = \log\frac{1+\rho}{1-\rho}`, where
    :math:`\dot z = 2/(1 + e^{\beta(1-\rho)})` is smooth and bounded, so :math:`1 - \rho`
    and :math:`1 + \rho` keep their relative accuracy; :math:`\rho_0 = \pm1` are fixed.

    Parameters
    ----------
    beta : float
        :math:`\beta \ge 0`.
    rho0 : float
        :math:`\rho(0) \in [-1, 1]`.
    t : float or array_like
        Non-decreasing times :math:`\ge 0`.

    Returns
    -------
    CausalPair

    Examples
    --------
    >>> from transformer_pde.reductions.pairs import causal_pair
    >>> sol = causal_pair(2.5, 0.0, [0.0, 1.0, 10.0])
    >>> bool(0.0 == sol.rho[0] < sol.rho[1] < sol.rho[2] < 1.0)
    True
    """
    beta = check_beta(beta)
    rho0 = scalar("rho0", rho0)
    if not -1.0 <= rho0 <= 1.0:
        raise ArgumentError(f"rho0 must lie in [-1, 1], got {rho0!r}")
    times, scalar_in = check_times(t)
    shape = () if scalar_in else times.shape
    if abs(rho0) == 1.0:
        rho = np.full(times.shape, rho0)
        return CausalPair(t=times.reshape(shape), rho=rho.reshape(shape),
                          one_minus_rho=(1.0 - rho).reshape(shape), beta=beta, rho0=rho0)

    def gap(z: float) -> float:
        return 2.0 * math.exp(-z) / (1.0 + math.exp(-z)) if z > 0 else 2.0 / (1.0 + math.exp(z))

    def rhs(_: float, y: np.ndarray) -> list[float]:
        return [2.0 * float(expit(-beta * gap(y[0])))]

    z0 = math.log((1.0 + rho0) / (1.0 - rho0))
    grid, where = np.unique(times, return_inverse=True)
    if grid[-1] > 0.0:
        sol = solve_ivp(rhs, (0.0, grid[-1]), [z0], method="DOP853", t_eval=grid, rtol=RTOL,
                        atol=ATOL)
        if sol.status != 0:
            raise SolverNotConverged(f"causal_pair: the DOP853 solve failed: {sol.message}")
        z = sol.y[0][where.ravel()]
    else:
        z = np.full(times.shape, z0)
    rho = np.tanh(z / 2.0)
    one_minus = np.array([gap(v) for v in z])
    return CausalPair(t=times.reshape(shape), rho=rho.reshape(shape),
                      one_minus_rho=one_minus.reshape(shape), beta=beta, rho0=rho0)


def pairing_angle(phi0: float, s: Any) -> Any:
    r"""Angle between two tokens following :math:`y_1' = P_{y_1}y_2`, :math:`y_2' = P_{y_2}y_1`.

    This pair system is the two-token attention flow with the mutual weight frozen.  At
    large :math:`\beta` the closest pair of a configuration (angle :math:`\varphi_0`) sees
    each other with the weight :math:`e^{-\beta(1-\cos\varphi)}` relative to itself (every
    other token is exponentially smaller), so with the time change
    :math:`dt = e^{\beta(1-\cos\varphi_0)}\,ds` the pair follows this system while the
    weight has not changed, :math:`\beta(\cos\varphi - \cos\varphi_0) \ll 1`; at
    :math:`\beta = 0` two tokens follow it exactly with :math:`s = t/2`.  Along it
    :math:`(\cos\varphi)' = 2\langle P_{y_1}y_2, y_2\rangle = 2\sin^2\varphi`, i.e.
    :math:`\varphi' = -2\sin\varphi`, whose solution is

    .. math:: \tan\frac{\varphi(s)}{2} = \tan\frac{\varphi_0}{2}\,e^{-2s}.

    Parameters
    ----------
    phi0 : float
        Initial angle in :math:`[0, \pi]` (:math:`\pi`, antipodal, stays :math:`\pi`).
    s : float or array_like
        Rescaled times :math:`\ge 0`.

    Returns
    -------
    float or ndarray
        :math:`\varphi(s)` (the shape of ``s``).

    Examples
    --------
    >>> import math
    >>> from transformer_pde.reductions.pairs import pairing_angle
    >>> round(pairing_angle(math.pi / 2, math.log(3) / 2), 12) == round(2 * math.atan(1 / 3), 12)
    True
    """
    phi0 = scalar("phi0", phi0)
    if not 0.0 <= phi0 <= math.pi:
        raise ArgumentError(f"phi0 must lie in [0, pi], got {phi0!r}")
    s_arr = real_array("s", s)
    if not np.all(np.isfinite(s_arr)) or np.any(s_arr < 0):
        raise ArgumentError("s must be finite times >= 0")
    if phi0 == math.pi:
        out = np.full(s_arr.shape, math.pi)
    else:
        out = 2.0 * np.arctan(math.tan(phi0 / 2.0) * np.exp(-2.0 * s_arr))
    return float(out) if out.ndim == 0 else out
