"""Helpers shared by the diagnostics modules: argument checks and the moments of a run."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..fields import check_weights

__all__ = ["as_points", "as_weights", "as_symmetric", "weighted_moments", "entropy",
           "trajectory_moments"]


def as_points(name: str, X: Any, d: int | None = None) -> np.ndarray:
    arr = np.asarray(X, dtype=float)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"{name} must have shape (N, d) with N >= 1, got {np.shape(X)}")
    if d is not None and arr.shape[1] != d:
        raise ValueError(f"{name} must have d={d} columns, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def as_weights(name: str, w: Any, n: int) -> np.ndarray:
    try:
        return check_weights(w, n)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def as_symmetric(name: str, S: Any, d: int | None = None) -> np.ndarray:
    arr = np.asarray(S, dtype=float)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.size == 0:
        raise ValueError(f"{name} must be a square (d, d) matrix, got shape {arr.shape}")
    if d is not None and arr.shape[0] != d:
        raise ValueError(f"{name} must be {d} x {d}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return 0.5 * (arr + arr.T)


def weighted_moments(X: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = w @ X
    Y = X - m
    C = (Y * w[:, None]).T @ Y
    return m, 0.5 * (C + C.T)


def entropy(w: np.ndarray) -> float:
    p = w[w > 0]
    return float(-(p * np.log(p)).sum())


def trajectory_moments(traj: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, means (T, d), covs (T, d, d)) of a particle or Gaussian trajectory."""
    if hasattr(traj, "covs") and hasattr(traj, "means"):
        return (np.asarray(traj.times, dtype=float), np.asarray(traj.means, dtype=float),
                np.asarray(traj.covs, dtype=float))
    if hasattr(traj, "states"):
        states = np.asarray(traj.states, dtype=float)
        w = np.asarray(traj.weights, dtype=float)
        means = np.einsum("n,tnd->td", w, states)
        Y = states - means[:, None, :]
        covs = np.einsum("n,tni,tnj->tij", w, Y, Y)
        return np.asarray(traj.times, dtype=float), means, 0.5 * (covs + covs.transpose(0, 2, 1))
    raise TypeError("traj must be a ParticleTrajectory (times, states, weights) or a Gaussian "
                    f"trajectory (times, means, covs), got {type(traj).__name__}")
