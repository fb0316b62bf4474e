r"""Stability of the flow in Wasserstein distance: :func:`stability_bound` (the a-priori
bound of the paper's Theorem 3.1 for softmax attention), :func:`stability_profile` for
particles and :func:`gaussian_stability_profile` for Gaussians."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .. import validation
from ..attention import Attention
from ..errors import ArgumentError
from ..integrate.solvers import get_solver
from ..particles import simulate
from .distances import bures_wasserstein, token_distance

__all__ = ["StabilityProfile", "gaussian_stability_profile", "stability_bound",
           "stability_profile"]

logger = logging.getLogger(__name__)


@dataclass
class StabilityProfile:
    r"""Output of :func:`stability_profile` / :func:`gaussian_stability_profile`.

    Attributes
    ----------
    times : ndarray (T,)
    w2 : ndarray (T,)
        :math:`W_2(\mu_t, \nu_t)` (Bures--Wasserstein for Gaussians, conditional for masked).
    ratio : ndarray (T,)
        ``w2 / w2[0]``.
    bound : ndarray (T,) or None
        A-priori bound on ``ratio`` (:func:`stability_bound`); None where no bound is
        available (kinds other than unmasked softmax, Gaussians).
    radius_bound : ndarray (T,) or None
        A-priori support radius :math:`R(t)` used in the bound.
    radius : ndarray (T,) or None
        Observed support radius :math:`\max_i |x_i(t)|` of both clouds (particles only).
    traj_x, traj_y : trajectory
        The two runs.
    info : dict
        Constants and method used.
    """

    times: np.ndarray
    w2: np.ndarray
    ratio: np.ndarray
    bound: np.ndarray | None
    radius_bound: np.ndarray | None
    radius: np.ndarray | None
    traj_x: Any
    traj_y: Any
    info: dict = field(default_factory=dict)

    @property
    def max_ratio_over_bound(self) -> float:
        """``max_t ratio(t) / bound(t)``: at most 1 when the bound holds (nan without bound)."""
        if self.bound is None:
            return float("nan")
        return float(np.max(self.ratio / self.bound))


def _softmax_constants(P, R: float) -> tuple[float, float, float]:
    """(v, L_x, L_mu) of Theorem 3.1's derivation at frozen parameters P and radius R."""
    wo = 1.0 if P.W_O is None else float(np.linalg.norm(P.W_O, 2))
    v2 = lx2 = lm2 = 0.0
    for head in P.heads:
        nv = float(np.linalg.norm(head.V, 2))
        ah = abs(P.beta) * float(np.linalg.norm(head.A, 2)) * R * R
        v2 += nv * nv
        lx2 += (nv * ah) ** 2
        if nv > 0 and ah > 300.0:  # e^{2 a_h} overflows: the bound is infinite from here on
            lm2 = math.inf
        else:
            lm2 += (nv * math.exp(ah) * (1.0 + ah)) ** 2
    return wo * math.sqrt(v2), wo * math.sqrt(lx2), wo * math.sqrt(lm2)


def stability_bound(att: Attention, R0: float, times: Any, *, n_sub: int = 8
                    ) -> tuple[np.ndarray, np.ndarray]:
    r"""A-priori bound on :math:`W_2(\mu_t,\nu_t)/W_2(\mu_0,\nu_0)` for softmax attention
    and measures supported in the ball :math:`B(0, R_0)`.

    **Statement.**  If :math:`\mu_0, \nu_0` are supported in :math:`B(0, R_0)`, then for the
    softmax flow (any number of heads, temperature :math:`\beta`, output matrix :math:`W_O`)

    .. math:: W_2(\mu_t, \nu_t) \le \exp\Big(\int_0^t L(s)\,ds\Big)\, W_2(\mu_0, \nu_0),
              \qquad L = L_x + L_\mu ,

    with, writing :math:`\|\cdot\|` for spectral norms, :math:`A_h = K_h^\top Q_h` and
    :math:`a_h(s) = |\beta|\,\|A_h\| R(s)^2`,

    .. math::
        v &= \|W_O\| \big(\textstyle\sum_h \|V_h\|^2\big)^{1/2}, \qquad
        R(t) = R_0 \exp\Big(\int_0^t v(s)\,ds\Big), \\
        L_x &= \|W_O\| \big(\textstyle\sum_h \|V_h\|^2 a_h^2\big)^{1/2}, \qquad
        L_\mu = \|W_O\| \big(\textstyle\sum_h \|V_h\|^2 e^{2 a_h} (1 + a_h)^2\big)^{1/2}.

    **Derivation.**  The bound of the support (:math:`R(t)`), the Lipschitz constants in the
    query (:math:`L_x`) and in the measure (:math:`L_\mu`) and the Grönwall argument on a
    pushed-forward coupling are derived on the documentation's theory page
    ``docs/theory/stability.md``.  The argument holds for any measures, empirical ones
    included, with any weights; it is tight for :math:`A = 0, V = vI` and translated
    measures (ratio :math:`e^{vt}` exactly), and very loose when :math:`a_h \gtrsim 1`.

    **Quadrature.**  Each interval between consecutive ``times`` is split into ``n_sub``
    pieces; :math:`\int v` uses the parameters at each piece's midpoint (exact for constant
    parameters and for :class:`~transformer_pde.Layers` whose boundaries fall on piece ends),
    and :math:`\int L` uses the same parameters with the radius at the piece's right end
    (an upper sum, since :math:`R` is non-decreasing).

    Parameters
    ----------
    att : Attention
        Unmasked softmax attention.
    R0 : float
        Radius of a ball centred at 0 containing both initial supports.
    times : array (T,)
        Increasing times starting at 0.
    n_sub : int
        Quadrature pieces per interval.

    Returns
    -------
    bound : ndarray (T,)
        :math:`\exp(\int_0^t L)` (``inf`` once it overflows).
    radius : ndarray (T,)
        :math:`R(t)`.
    """
    if not isinstance(att, Attention):
        raise TypeError(f"att must be a transformer_pde.Attention, got {type(att).__name__}")
    if att.kind != "softmax" or att.masked:
        raise ValueError("stability_bound is derived for unmasked softmax attention only, got "
                         f"kind={att.kind!r}, masked={att.masked}")
    if att.rotary is not None:
        raise ArgumentError("stability_bound is derived for position-free scores; att has "
                            "rotary positions (att.rotary), for which the bound is not derived")
    if att.alibi is not None:
        raise ArgumentError("stability_bound is derived for position-free scores; att has "
                            "ALiBi slopes (att.alibi), for which the bound is not derived")
    if att.has_bias:
        raise ArgumentError("stability_bound is derived for linear query/key/value maps; att has "
                            "bias vectors (b_Q/b_K/b_V/b_O), for which the bound does not hold")
    R0 = validation.nonnegative("R0", R0)
    t = validation.finite_array("times", times)
    if t.ndim != 1 or t.size == 0 or t[0] != 0.0 or np.any(np.diff(t) <= 0):
        raise ValueError("times must be a strictly increasing 1-D array starting at 0")
    n_sub = validation.integer("n_sub", n_sub, minimum=1)
    int_v = 0.0
    int_L = 0.0
    bound = [1.0]
    radius = [R0]
    for t0, t1 in zip(t[:-1], t[1:], strict=True):
        edges = np.linspace(t0, t1, int(n_sub) + 1)
        for s0, s1 in zip(edges[:-1], edges[1:], strict=True):
            P = att.at(0.5 * (s0 + s1))
            v, _, _ = _softmax_constants(P, 0.0)
            int_v += v * (s1 - s0)
            R1 = R0 * math.exp(min(int_v, 700.0))
            _, lx, lm = _softmax_constants(P, R1)
            int_L += (lx + lm) * (s1 - s0)
        with np.errstate(over="ignore"):
            bound.append(float(np.exp(int_L)))
            radius.append(float(R0 * np.exp(int_v)))
    return np.asarray(bound), np.asarray(radius)


def stability_profile(att: Attention, X0: Any, Y0: Any, *, t_max: float, dt: float = 0.05,
                      weights_x: Any = None, weights_y: Any = None, positions: Any = None,
                      solver: Any = "rk4", w2_method: str = "exact", n_sub: int = 8,
                      **simulate_kwargs: Any) -> StabilityProfile:
    r"""Run the particle flows of :math:`\mu_0` (tokens ``X0``) and :math:`\nu_0` (``Y0``) and
    compare :math:`W_2(\mu_t,\nu_t)/W_2(\mu_0,\nu_0)` with the a-priori bound.

    Both runs use the same saving times, so the ratio is available at every saved time.
    For unmasked softmax attention the bound of :func:`stability_bound` (the paper's
    Theorem 3.1 for compactly supported data) is returned with :math:`R_0` the largest
    initial token norm; it bounds the exact flow, and the time-stepping error of the
    integrator (RK4 by default) is far below it for moderate ``dt``.  For masked attention
    (``positions`` given, shared by both clouds) the distance is
    :func:`conditional_wasserstein` and no bound is given.

    Parameters
    ----------
    att : Attention
    X0, Y0 : array (N, d), (M, d)
        Initial tokens of the two measures (different from each other).
    t_max, dt, solver
        Passed to :func:`~transformer_pde.simulate` (``saveat`` too, via kwargs).
    weights_x, weights_y : array, optional
        Token masses.
    positions : array (N,), optional
        Token positions (masked attention; ``N = M`` with the same positions).
    w2_method : str
        ``method`` of :func:`wasserstein`.
    n_sub : int
        Quadrature pieces per saved interval for the bound.
    **simulate_kwargs
        Further arguments of :func:`~transformer_pde.simulate` (``field``, ``saveat``, ...).

    Returns
    -------
    StabilityProfile
    """
    if not isinstance(att, Attention):
        raise TypeError(f"att must be a transformer_pde.Attention, got {type(att).__name__}")
    w2_method = validation.choice("w2_method", w2_method, ("exact", "sliced", "sinkhorn", "auto"))
    Xa = validation.points("X0", X0, att.d, column=True, keep_float32=False)
    Ya = validation.points("Y0", Y0, att.d, column=True, keep_float32=False)
    wx = validation.weights("weights_x", weights_x, Xa.shape[0])
    wy = validation.weights("weights_y", weights_y, Ya.shape[0])
    w2_0 = token_distance(Xa, Ya, wx, wy, positions, w2_method)
    if w2_0 == 0.0:
        raise ValueError("X0 and Y0 define the same measure (W2 = 0): the ratio is undefined")
    common = dict(t_max=t_max, dt=dt, solver=solver, positions=positions, **simulate_kwargs)
    tx = simulate(att, Xa, weights=wx, **common)
    ty = simulate(att, Ya, weights=wy, **common)
    n = min(len(tx.times), len(ty.times))
    if not np.allclose(tx.times[:n], ty.times[:n]):
        raise RuntimeError("the two runs saved at different times")  # pragma: no cover
    if tx.status != "ok" or ty.status != "ok":
        logger.warning("stability_profile: a run stopped early (%s / %s); profile truncated",
                       tx.message, ty.message)
    times = tx.times[:n]
    w2 = np.array([w2_0] + [token_distance(tx.states[k], ty.states[k], wx, wy, positions, w2_method)
                            for k in range(1, n)])
    radius = np.maximum(np.linalg.norm(tx.states[:n], axis=2).max(axis=1),
                        np.linalg.norm(ty.states[:n], axis=2).max(axis=1))
    bound = radius_bound = None
    info: dict[str, Any] = {"w2_method": "conditional" if positions is not None else w2_method,
                            "dt": dt, "method": get_solver(solver).name}
    if att.kind == "softmax" and not att.masked and att.rotary is None and att.alibi is None \
            and not att.has_bias:
        bound, radius_bound = stability_bound(att, float(radius[0]), times, n_sub=n_sub)
        info["R0"] = float(radius[0])
        info["bound"] = "Theorem 3.1 (softmax, compact support): see stability_bound"
    else:
        info["bound"] = f"no a-priori bound implemented for kind={att.kind!r}, masked={att.masked}"
    return StabilityProfile(times, w2, w2 / w2_0, bound, radius_bound, radius, tx, ty, info)


def gaussian_stability_profile(att: Attention, gauss0: Sequence[Any], gauss1: Sequence[Any], *,
                               t_max: float, n_times: int = 101,
                               **solve_kwargs: Any) -> StabilityProfile:
    r"""Bures--Wasserstein stability of the Gaussian moment flow.

    Solves the mean/covariance ODEs (:func:`transformer_pde.gaussian.solve`) from
    ``gauss0 = (mean0, cov0)`` and ``gauss1 = (mean1, cov1)`` and returns
    :math:`BW(\mu_t,\nu_t)/BW(\mu_0,\nu_0)` on ``n_times`` equally spaced times in
    :math:`[0, t_{max}]`, as far as both runs go (a run stops at a blow-up or when it
    has converged).  Gaussians are
    not compactly supported, so Theorem 3.1 does not apply and ``bound`` is None.
    """
    # deferred: SciPy takes seconds to import; only this path needs it
    from .. import gaussian  # noqa: PLC0415

    m0, S0 = gauss0
    m1, S1 = gauss1
    w0 = bures_wasserstein(m0, S0, m1, S1)
    if w0 == 0.0:
        raise ValueError("the two Gaussians coincide (BW = 0): the ratio is undefined")
    n_times = validation.integer("n_times", n_times, minimum=2)
    grid = np.linspace(0.0, float(t_max), int(n_times))
    ta = gaussian.solve(att, m0, S0, t_max=t_max, t_eval=grid, **solve_kwargs)
    tb = gaussian.solve(att, m1, S1, t_max=t_max, t_eval=grid, **solve_kwargs)
    (ma, Sa), (mb, Sb) = _on_grid(ta, grid), _on_grid(tb, grid)
    n = min(len(ma), len(mb))  # a run may stop early at a blow-up
    times = grid[:n]
    w2 = np.array([bures_wasserstein(ma[k], Sa[k], mb[k], Sb[k]) for k in range(n)])
    return StabilityProfile(times, w2, w2 / w0, None, None, None, ta, tb,
                            {"w2_method": "bures_wasserstein",
                             "bound": "none: Gaussians are not compactly supported"})


def _on_grid(traj: Any, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Moments of a Gaussian run saved at ``grid``; a run that stopped because it
    converged is continued by its (stationary) final state."""
    n = len(traj.times)
    if not np.allclose(traj.times, grid[:n]):
        raise RuntimeError("gaussian.solve did not save at t_eval")  # pragma: no cover
    means, covs = np.asarray(traj.means), np.asarray(traj.covs)
    if n < len(grid) and traj.status == "converged":
        pad = len(grid) - n
        means = np.concatenate([means, np.repeat(means[-1:], pad, axis=0)])
        covs = np.concatenate([covs, np.repeat(covs[-1:], pad, axis=0)])
    return means, covs
