"""Helpers shared by the diagnostics modules: moments of a cloud or of a run, entropy."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..results import ResultKind, require_kind

__all__ = ["entropy", "trajectory_moments", "weighted_moments"]


def weighted_moments(X: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (symmetrised) covariance of the points ``X`` with weights ``w``."""
    m = w @ X
    Y = X - m
    C = (Y * w[:, None]).T @ Y
    return m, 0.5 * (C + C.T)


def entropy(w: np.ndarray) -> float:
    """Shannon entropy :math:`-\\sum_i w_i \\log w_i` of a probability vector (0 log 0 = 0)."""
    p = w[w > 0]
    return float(-(p * np.log(p)).sum())


def trajectory_moments(traj: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, means (T, d), covs (T, d, d)) of a particle or Gaussian trajectory.

    Raises :class:`~transformer_pde.errors.ArgumentTypeError` naming ``traj`` for anything
    else (a :class:`~transformer_pde.gaussian.GaussianBatch` included: pass one member)."""
    kind = require_kind(traj, "traj", (ResultKind.PARTICLES, ResultKind.GAUSSIAN))
    times = np.asarray(traj.times, dtype=float)
    if kind is ResultKind.GAUSSIAN or traj.states is None:
        # Gaussian paths; particle runs saved with SaveAt(fn=...) kept their moments
        means, covs = traj.moments()
        return times, np.asarray(means, dtype=float), np.asarray(covs, dtype=float)
    states = np.asarray(traj.states, dtype=float)
    w = np.asarray(traj.weights, dtype=float)
    means = np.einsum("n,tnd->td", w, states)
    Y = states - means[:, None, :]
    covs = np.einsum("n,tni,tnj->tij", w, Y, Y)
    return times, means, 0.5 * (covs + covs.transpose(0, 2, 1))
