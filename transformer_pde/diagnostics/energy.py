r"""Kinetic energy of a flow against its optimal-transport cost (:func:`kinetic_energy`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation
from ..attention import Attention
from ..backends import DEFAULT_BACKEND
from ..errors import ArgumentError
from ..fields import velocity
from ..results import ResultKind, require_kind
from .common import trajectory_moments
from .distances import bures_wasserstein, token_distance

__all__ = ["KineticEnergy", "kinetic_energy"]


@dataclass
class KineticEnergy:
    r"""Kinetic energy of a flow against its optimal-transport cost (:func:`kinetic_energy`).

    Attributes
    ----------
    energy : float
        :math:`E = \int_0^T \int |\Gamma_{\mu_t}|^2 d\mu_t\,dt` (trapezoidal rule on the
        saved times).
    transport : float
        :math:`W_2^2(\mu_0, \mu_T)/T`.
    ratio : float
        ``energy / transport`` (>= 1 up to quadrature error; 1 only for constant-speed
        straight-line transport that is optimal).
    times, power : ndarray
        Saved times and :math:`\int |\Gamma_{\mu_t}|^2 d\mu_t` at each of them.
    """

    energy: float
    transport: float
    ratio: float
    times: np.ndarray
    power: np.ndarray


def kinetic_energy(traj: Any, att: Attention | None = None, *, w2_method: str = "exact",
                   backend: Any = DEFAULT_BACKEND) -> KineticEnergy:
    r"""Kinetic energy :math:`\int_0^T\!\int|\Gamma_{\mu_t}(x)|^2\,d\mu_t(x)\,dt` of a particle
    trajectory, compared with :math:`W_2^2(\mu_0,\mu_T)/T`.

    By the Benamou--Brenier formula :math:`W_2^2(\mu_0,\mu_T) = \min T\int_0^T\!\int |v_t|^2
    d\mu_t\,dt` over velocity fields transporting :math:`\mu_0` to :math:`\mu_T`, so the
    ratio ``energy / transport`` is at least 1, with equality only when the tokens move on
    straight lines at constant speed along an optimal map.  The time integral uses the
    trapezoidal rule on the saved times (save densely: its error is :math:`O(\Delta t^2)`).
    The field is re-evaluated with :func:`~transformer_pde.velocity` (``att`` defaults to
    ``traj.attention``).  For masked runs the transport cost is the conditional distance.

    A Gaussian trajectory (``times``, ``means``, ``covs``; ``att`` required) uses the affine
    field :math:`\Gamma(x) = Mx + b` of :func:`transformer_pde.gaussian.affine_field`:
    :math:`\int|\Gamma|^2 d\mu = \operatorname{tr}(M\Sigma M^\top) + |M\alpha + b|^2`, and
    :func:`bures_wasserstein` for the transport cost.
    """
    kind = require_kind(traj, "traj", (ResultKind.PARTICLES, ResultKind.GAUSSIAN))
    if kind is ResultKind.GAUSSIAN:
        return _gaussian_kinetic_energy(traj, att)
    if traj.states is None:
        raise ArgumentError("traj holds no states (it was saved with SaveAt(fn=...)): the "
                            "kinetic energy re-evaluates the field at the saved states")
    att = traj.attention if att is None else att
    if not isinstance(att, Attention):
        raise ValueError("att is required (the trajectory does not carry its attention)")
    w2_method = validation.choice("w2_method", w2_method, ("exact", "sliced", "sinkhorn", "auto"))
    times = np.asarray(traj.times, dtype=float)
    if len(times) < 2 or not np.all(np.isfinite(traj.states)):
        raise ValueError("traj needs at least two finite saved states")
    w = np.asarray(traj.weights, dtype=float)
    power = np.array([
        float(w @ np.sum(velocity(att, X, weights=w, positions=traj.positions, t=float(t),
                                  backend=backend) ** 2, axis=1))
        for t, X in zip(times, np.asarray(traj.states, dtype=float), strict=True)])
    w2 = token_distance(traj.states[0], traj.states[-1], w, w, traj.positions, w2_method)
    return _kinetic(times, power, w2)


def _kinetic(times: np.ndarray, power: np.ndarray, w2: float) -> KineticEnergy:
    """Trapezoidal energy of ``power`` over ``times`` against ``w2**2 / T``."""
    energy = float(np.sum(0.5 * (power[1:] + power[:-1]) * np.diff(times)))
    transport = w2 * w2 / float(times[-1] - times[0])
    ratio = energy / transport if transport > 0 else math.inf
    return KineticEnergy(energy, transport, ratio, times, power)


def _gaussian_kinetic_energy(traj: Any, att: Attention | None) -> KineticEnergy:
    # deferred: SciPy takes seconds to import; only this path needs it
    from ..gaussian import affine_field  # noqa: PLC0415

    if not isinstance(att, Attention):
        raise ValueError("att is required for a Gaussian trajectory")
    times, means, covs = trajectory_moments(traj)
    if len(times) < 2 or not (np.all(np.isfinite(means)) and np.all(np.isfinite(covs))):
        raise ValueError("traj needs at least two finite saved states")
    power = []
    for t, m, S in zip(times, means, covs, strict=True):
        M, b = affine_field(att, m, S, float(t))
        power.append(float(np.trace(M @ S @ M.T) + np.sum((M @ m + b) ** 2)))
    return _kinetic(times, np.asarray(power),
                    bures_wasserstein(means[0], covs[0], means[-1], covs[-1]))
