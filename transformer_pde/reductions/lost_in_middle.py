r"""Lost in the middle: the kinetic retrieval profile of causal ALiBi attention on the circle.

Duerinckx, Geshkovski and Rossi (arXiv 2605.09213) study :math:`N` tokens
:math:`\theta_j \in \mathbb S^1` at positions :math:`u_j = j/N`, i.i.d. uniform at
:math:`t = 0`, moving by causal attention whose weights carry the ALiBi factor
:math:`e^{-\lambda(u_j - u_k)}` (normalised over the earlier tokens; the force
:math:`\partial_\theta e^{\beta\cos(\theta - \theta_k)}`; softmax attention with
:math:`V = \beta I_0(\beta) I` has the same linearisation).  The uniform law is stationary; a perturbation of the law
of the tokens at position :math:`u` in Fourier mode :math:`n` obeys, in the limit
:math:`N \to \infty`,

.. math:: \partial_t \hat h_u = a_n \int_0^u w_\lambda(u, u')\,\hat h_{u'}\,du', \qquad
          w_\lambda(u, u') = \frac{\lambda e^{-\lambda(u - u')}}{1 - e^{-\lambda u}},

with :math:`a_n` the growth rate of mode :math:`n` (:func:`mode_rates`).  Its Green
function from a source at :math:`s` to the last position :math:`u = 1` sums the causal
chains :math:`s < u_1 < \dots < u_k < 1` (:math:`k + 1` edges, time-ordered):

.. math:: g_n(t; s) = \frac{\lambda e^{\lambda s}}{e^\lambda - 1}\,
          \psi_{a_n t}(Y_\lambda(s)), \qquad
          Y_\lambda(s) = \log\frac{e^\lambda - 1}{e^{\lambda s} - 1}
                       = \int_s^1 \frac{\lambda\,du}{1 - e^{-\lambda u}},

.. math:: \psi_c(y) = \sum_{k \ge 0} \frac{c^{k+1} y^k}{k!\,(k+1)!}
          = \sqrt{c/y}\; I_1\big(2\sqrt{c y}\big)

(the product of the chain's weights telescopes to the prefactor times
:math:`\prod_i \lambda/(1 - e^{-\lambda u_i})`, whose ordered integral is :math:`Y^k/k!`).
For tokens, :math:`g_n(t; s) = \lim_N N\,\mathbb E[\cos n(\theta_N(t) - \theta_j(0))]`
with :math:`j/N \to s`: the correlation of the last token at time :math:`t` with the
source token's initial angle.  The *retrieval profile* weighs the modes with the Fourier
coefficients :math:`\omega_{n,M} = e^{-\pi^2 n^2/(2M^2)}` of a wrapped Gaussian of width
:math:`\pi/M` (a soft accuracy),

.. math:: S_t(s) = \sum_{n=1}^{n_{\max}} \omega_{n,M}\, g_n(t; s),

and its slope at the right end, :math:`\partial_s S_t(1) \propto
t \sum_n \omega_n b_n - t^2 \sum_n \omega_n b_n^2 / (2(1 - e^{-\lambda}))`
(:math:`b_n = a_n`, from :math:`\psi_c(0) = c`, :math:`\partial_y\psi_c(0) = c^2/2`), changes
sign at the critical time :func:`critical_time`
:math:`t_c = 2(1 - e^{-\lambda}) \sum_n \omega_n b_n / \sum_n \omega_n b_n^2`: before it
the profile rises towards the last token (recency); after it the right end falls and the
profile is U-shaped, lowest in the middle.

:func:`measure_retrieval` estimates :math:`g_n` and :math:`S_t` from particle runs
(see its notes); the guide *Lost in the middle* runs both sides.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import exprel, ive, j1

from .. import validation
from ..errors import ArgumentError
from .args import check_beta, check_model
from .modes import mode_growth_rate

__all__ = ["critical_time", "measure_retrieval", "mode_rates", "mode_response", "psi",
           "retrieval_profile", "soft_weights"]

#: below this :math:`|c y|` :func:`psi` sums its power series (eight terms: error below
#: :math:`10^{-2\cdot 8}/(8!\,9!)`), above it uses the Bessel functions
_SERIES_X = 1e-2


def _log_exprel(x: np.ndarray) -> np.ndarray:
    r""":math:`\log((e^x - 1)/x)` for :math:`x \ge 0`, finite for every float ``x``."""
    x = np.asarray(x, dtype=float)
    big = x > 1.0
    xb = np.where(big, x, 1.0)
    with np.errstate(over="ignore"):
        small = np.log(exprel(np.where(big, 0.0, x)))
    return np.where(big, xb + np.log(-np.expm1(-xb)) - np.log(xb), small)


def _series(x: np.ndarray) -> np.ndarray:
    r""":math:`F(x) = \sum_k x^k/(k!(k+1)!)` by its first eight terms (:math:`|x|` small)."""
    out = np.zeros_like(x)
    term = np.ones_like(x)
    for k in range(8):
        out = out + term
        term = term * x / ((k + 1) * (k + 2))
    return out


def psi(c: Any, y: Any) -> np.ndarray:
    r""":math:`\psi_c(y) = \sum_{k\ge0} c^{k+1} y^k/(k!(k+1)!)` for real :math:`c` and
    :math:`y \ge 0` (broadcast).

    With :math:`x = c y`: :math:`\psi_c(y) = c\,F(x)`, :math:`F(x) = I_1(2\sqrt x)/\sqrt x`
    for :math:`x > 0` (scaled Bessel function ``ive``, in the log domain, so the result is
    finite wherever it is below the float range), :math:`F(x) = J_1(2\sqrt{-x})/\sqrt{-x}`
    for :math:`x < 0`, and the power series for :math:`|x| <` 1e-2.  Relative accuracy
    about 1e-15 where :math:`x \ge 0`.

    Raises
    ------
    ArgumentError
        A non-finite argument or a negative ``y``.
    """
    c = validation.finite_array("c", c)
    y = validation.finite_array("y", y)
    if np.any(y < 0):
        raise ArgumentError("y must be >= 0 (Y_lambda(s) of a position s in (0, 1])")
    c, y = np.broadcast_arrays(c, y)
    return _psi(c, y)


def _psi(c: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = c * y
    out = c * _series(np.where(np.abs(x) < _SERIES_X, x, 0.0))
    pos = x >= _SERIES_X
    if np.any(pos):
        xp = np.where(pos, x, 1.0)
        z = 2.0 * np.sqrt(xp)
        with np.errstate(over="ignore", divide="ignore"):
            logf = np.log(ive(1, z)) + z - 0.5 * np.log(xp)
            big = np.log(np.abs(np.where(pos, c, 1.0))) + logf
            out = np.where(pos, np.sign(c) * np.exp(big), out)
    neg = x <= -_SERIES_X
    if np.any(neg):
        r = np.sqrt(np.where(neg, -x, 1.0))
        out = np.where(neg, c * j1(2.0 * r) / r, out)
    return out


def soft_weights(n_max: int, M: float) -> np.ndarray:
    r""":math:`\omega_{n,M} = e^{-\pi^2 n^2/(2M^2)}`, :math:`n = 1, \dots, n_{\max}`: the
    Fourier coefficients of the wrapped Gaussian of width :math:`\pi/M`."""
    n_max = validation.integer("n_max", n_max, minimum=1)
    M = validation.positive("M", M)
    n = np.arange(1, n_max + 1, dtype=float)
    return np.exp(-0.5 * (math.pi * n / M) ** 2)


def mode_rates(beta: float, n_max: int, *, model: str = "usa") -> np.ndarray:
    r"""The rates :math:`a_n`, :math:`n = 1, \dots, n_{\max}`, of the linearised causal flow
    on the circle: :math:`a_n = n^2 I_n(\beta)` for the unnormalised kernel
    :math:`e^{\beta\cos}` with force :math:`\partial_\theta e^{\beta\cos(\theta - \theta')}`
    (``"usa"``, the paper's model), :math:`a_n = n^2 I_n(\beta)/I_0(\beta)` for softmax with
    :math:`V = \beta I` (``"sa"``): :math:`\beta` times
    :func:`~transformer_pde.reductions.mode_growth_rate` in :math:`d = 2`."""
    beta, model = check_beta(beta), check_model(model)
    n_max = validation.integer("n_max", n_max, minimum=1)
    return beta * np.atleast_1d(mode_growth_rate(beta, 2, np.arange(1, n_max + 1),
                                                 model=model))


def _check_lam(lam: Any) -> float:
    return validation.nonnegative("lam", lam)


def _check_positions(s: Any) -> np.ndarray:
    s = validation.finite_array("s", s)
    if np.any(s <= 0) or np.any(s > 1):
        raise ArgumentError("s must lie in (0, 1] (source positions; Y_lambda(0) is infinite)")
    return s


def _log_prefactor_and_Y(s: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    r""":math:`\log(\lambda e^{\lambda s}/(e^\lambda - 1))` and :math:`Y_\lambda(s)`, stable
    for every :math:`\lambda \ge 0` (:math:`\lambda = 0`: 0 and :math:`\log(1/s)`)."""
    lp = lam * s - _log_exprel(np.float64(lam))
    Y = _log_exprel(np.float64(lam)) - _log_exprel(lam * s) - np.log(s)
    return lp, np.maximum(Y, 0.0)


def mode_response(t: Any, s: Any, rate: float, lam: float) -> np.ndarray:
    r""":math:`g(t; s) = \frac{\lambda e^{\lambda s}}{e^\lambda - 1}\,\psi_{a t}(Y_\lambda(s))`:
    the response of the last token's law (mode rate :math:`a` = ``rate``) at time ``t`` to
    a source at position ``s`` (module docstring); ``t`` >= 0 and ``s`` in (0, 1] broadcast."""
    t = validation.finite_array("t", t)
    if np.any(t < 0):
        raise ArgumentError("t must be >= 0")
    s = _check_positions(s)
    rate = validation.scalar("rate", rate)
    lp, Y = _log_prefactor_and_Y(s, _check_lam(lam))
    t, Y, lp = np.broadcast_arrays(t, Y, lp)
    return np.exp(lp) * _psi(rate * t, Y)


def retrieval_profile(t: Any, s: Any, beta: float, lam: float, *, M: float = 8.0,
                      n_max: int = 20, model: str = "usa") -> np.ndarray:
    r"""The kinetic retrieval profile :math:`S_t(s) = \sum_{n \le n_{\max}} \omega_{n,M}
    g_n(t; s)` (module docstring).

    Parameters
    ----------
    t : float or array
        Times :math:`\ge 0`.
    s : float or array
        Source positions in :math:`(0, 1]` (broadcast with ``t``).
    beta : float
        Inverse temperature :math:`\beta \ge 0` of the kernel :math:`e^{\beta\cos}`.
    lam : float
        ALiBi slope :math:`\lambda \ge 0`.
    M : float, default 8.0
        Resolution of the soft accuracy: :math:`\omega_{n,M} = e^{-\pi^2 n^2/(2M^2)}`.
    n_max : int, default 20
        Number of Fourier modes.
    model : {"usa", "sa"}, default "usa"
        The rates :math:`a_n` (:func:`mode_rates`).

    Returns
    -------
    ndarray
        :math:`S_t(s)`, the broadcast shape of ``t`` and ``s``.

    Examples
    --------
    >>> from transformer_pde.reductions.lost_in_middle import retrieval_profile
    >>> S = retrieval_profile(1.0, [0.1, 0.5, 1.0], beta=1.0, lam=1.0)
    >>> bool(S[1] < S[0] and S[1] < S[2])          # lowest in the middle
    True
    """
    a = mode_rates(beta, n_max, model=model)
    w = soft_weights(n_max, M)
    t = validation.finite_array("t", t)
    if np.any(t < 0):
        raise ArgumentError("t must be >= 0")
    s = _check_positions(s)
    lp, Y = _log_prefactor_and_Y(s, _check_lam(lam))
    t, Y, lp = np.broadcast_arrays(t, Y, lp)
    out = np.zeros(t.shape)
    for wn, an in zip(w, a, strict=True):
        if an != 0.0:
            out = out + wn * _psi(an * t, Y)
    return np.exp(lp) * out


def critical_time(beta: float, lam: float, *, M: float = 8.0, n_max: int = 20,
                  model: str = "usa") -> float:
    r"""The time :math:`t_c = 2(1 - e^{-\lambda}) \sum_n \omega_{n,M} b_n /
    \sum_n \omega_{n,M} b_n^2` (:math:`b_n = a_n`, :func:`mode_rates`) at which the slope of
    :math:`S_t` at :math:`s = 1` changes sign (module docstring); ``inf`` at
    :math:`\beta = 0` (every rate vanishes: no profile)."""
    b = mode_rates(beta, n_max, model=model)
    w = soft_weights(n_max, M)
    lam = _check_lam(lam)
    num, den = float(np.sum(w * b)), float(np.sum(w * b * b))
    if den == 0.0:
        return math.inf
    return 2.0 * (-math.expm1(-lam)) * num / den


def measure_retrieval(theta0: Any, theta_probe: Any, positions: Any, edges: Any, *,
                      n_max: int = 20) -> tuple[np.ndarray, np.ndarray]:
    r"""Estimate :math:`g_n` on position bins from particle runs, by regression.

    Parameters
    ----------
    theta0 : array (R, N)
        Initial angles of the :math:`N` prompt tokens in each of :math:`R` independent
        runs (i.i.d. uniform).
    theta_probe : array (R, P) or (T, R, P)
        Angles at time :math:`t` (at :math:`T` times) of :math:`P` probes per run: tokens
        of zero weight at the last position, started at equally spaced angles, so that
        :math:`Z_n = \frac1P\sum_p e^{i n\theta_p(t)}` is the law of the last token given
        the prompt (zero weight: the probes move by the prompt's field and move nobody).
    positions : array (N,)
        The prompt's positions in (0, 1].
    edges : array (B + 1,)
        Bin edges of the source positions.
    n_max : int
        Modes :math:`n = 1, \dots, n_{\max}`.

    Returns
    -------
    G : ndarray (T, n_max, B) (or (n_max, B))
        Regression estimates of the bin averages of :math:`g_n(t; \cdot)`.
    se : ndarray, same shape
        Their standard errors (least squares, from the residuals).

    Notes
    -----
    To first order in the prompt, :math:`Z_n = \frac1N\sum_k g_n(t; u_k) e^{in\theta_k(0)}
    + \varepsilon`.  Regressing :math:`Z_n` (real and imaginary parts, one equation pair
    per run) on the bin features :math:`X_b = \frac1N\sum_{k \in b} e^{in\theta_k(0)}`
    fits all bins at once, so the other bins' contributions (of size
    :math:`N^{-1/2}`) are not noise: what is left, :math:`\varepsilon`, is of higher order,
    and the estimates converge at the rate of that residual.  Needs :math:`2R > B`.
    """
    th0 = validation.finite_array("theta0", theta0)
    tp_ = validation.finite_array("theta_probe", theta_probe)
    if th0.ndim != 2:
        raise ArgumentError(f"theta0 must have shape (R, N), got {th0.shape}")
    single = tp_.ndim == 2
    if single:
        tp_ = tp_[None]
    R, N = th0.shape
    if tp_.ndim != 3 or tp_.shape[1] != R:
        raise ArgumentError(f"theta_probe must have shape (R, P) or (T, R, P) with R={R}, "
                            f"got {np.shape(theta_probe)}")
    u = validation.finite_array("positions", positions)
    e = validation.finite_array("edges", edges)
    if u.shape != (N,):
        raise ArgumentError(f"positions must have shape (N,) = ({N},), got {u.shape}")
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise ArgumentError("edges must be an increasing array of at least 2 bin edges")
    n_max = validation.integer("n_max", n_max, minimum=1)
    B = e.size - 1
    if 2 * R <= B:
        raise ArgumentError(f"measure_retrieval needs 2R > B equations: R={R} runs for B={B} "
                            "bins")
    bin_of = np.searchsorted(e, u, side="right") - 1
    bin_of[u == e[-1]] = B - 1
    inside = (bin_of >= 0) & (bin_of < B)
    onehot = np.zeros((N, B))
    onehot[np.flatnonzero(inside), bin_of[inside]] = 1.0 / N
    T = tp_.shape[0]
    G = np.empty((T, n_max, B))
    se = np.empty((T, n_max, B))
    for n in range(1, n_max + 1):
        X = np.exp(1j * n * th0) @ onehot                     # (R, B)
        A = np.concatenate([X.real, X.imag])                  # (2R, B)
        pinv = np.linalg.pinv(A)
        cov = np.linalg.pinv(A.T @ A)
        for ti in range(T):
            Z = np.exp(1j * n * tp_[ti]).mean(axis=1)         # (R,)
            y = np.concatenate([Z.real, Z.imag])
            coef = pinv @ y
            resid = y - A @ coef
            dof = max(A.shape[0] - B, 1)
            s2 = float(resid @ resid) / dof
            G[ti, n - 1] = coef
            se[ti, n - 1] = np.sqrt(np.maximum(np.diag(cov) * s2, 0.0))
    return (G[0], se[0]) if single else (G, se)
