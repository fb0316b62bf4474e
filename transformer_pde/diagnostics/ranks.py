r"""Ranks of a covariance (:func:`numerical_rank`, :func:`effective_rank`,
:func:`stable_rank`) and their evolution along a run (:func:`rank_profile`,
:func:`rank_collapse`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation
from ..errors import ArgumentError
from ..results import ResultKind, kind_of
from .common import entropy, trajectory_moments

__all__ = ["SPECTRUM_RTOL", "RankCollapse", "RankProfile", "effective_rank", "numerical_rank",
           "rank_collapse",
           "rank_profile", "stable_rank"]


#: Relative resolution of the spectrum in :func:`effective_rank` and :func:`stable_rank`:
#: a covariance that comes out of a computation (an ODE solve, an extrapolation to the
#: blow-up time) is PSD only to its accuracy; a negative eigenvalue down to
#: ``-SPECTRUM_RTOL * sum(|eigenvalues|)`` counts as zero, one below is an error.
SPECTRUM_RTOL = 1e-6


def _spectrum(S: Any, psd_rtol: float = SPECTRUM_RTOL, psd_atol: float = 0.0) -> np.ndarray:
    """Eigenvalues of the covariance ``S`` (validated, negative round-off set to 0), largest
    first."""
    lam = np.linalg.eigvalsh(validation.covariance("S", S, psd_rtol=psd_rtol,
                                                   psd_atol=psd_atol))
    return np.clip(lam, 0.0, None)[::-1]


def numerical_rank(S: Any, rtol: float = 1e-6, atol: float = 0.0) -> int:
    r"""Number of eigenvalues of the PSD matrix ``S`` above ``max(rtol * lambda_max, atol)``.

    ``S`` must be symmetric positive semi-definite (the package's one rule,
    :func:`transformer_pde.validation.covariance`) at the resolution of the count: a
    negative eigenvalue below :math:`-\max(\mathrm{rtol}\sum_i|\lambda_i|, \mathrm{atol})`
    raises ``ArgumentError`` instead of being clipped silently; one above counts as zero.

    Zero for the zero matrix.  Invariant under :math:`S \mapsto c\,U S U^\top` (scaling,
    rotation) when ``atol = 0``; ``atol`` is an absolute floor for covariances that are
    pure round-off (e.g. of coincident tokens far from the origin)."""
    rtol = validation.scalar("rtol", rtol)
    if not 0 <= rtol < 1:
        raise ArgumentError(f"rtol must be in [0, 1), got {rtol!r}")
    atol = validation.nonnegative("atol", atol)
    lam = _spectrum(S, max(rtol, validation.PSD_RTOL), atol)
    if lam[0] <= atol:
        return 0
    return int(np.sum(lam > max(rtol * lam[0], atol)))


def effective_rank(S: Any) -> float:
    r"""Entropy (effective) rank :math:`\exp(-\sum_i p_i \log p_i)` with
    :math:`p_i = \lambda_i / \sum_j \lambda_j` (Roy & Vetterli 2007).

    Between 1 (rank one) and :math:`d` (isotropic); 0 for the zero matrix.  ``S`` must be
    symmetric PSD to :data:`SPECTRUM_RTOL` (negative eigenvalues within it count as zero)."""
    lam = _spectrum(S)
    total = lam.sum()
    if total <= 0:
        return 0.0
    return float(math.exp(entropy(lam / total)))


def stable_rank(S: Any) -> float:
    r"""Stable rank :math:`\operatorname{tr} S / \lambda_{\max}(S)` of a covariance ``S``.

    Equals :math:`\|Y\|_F^2 / \|Y\|_2^2` for the centred data matrix :math:`Y` whose
    covariance is ``S``; between 1 and :math:`d`; 0 for the zero matrix.  ``S`` must be
    symmetric PSD to :data:`SPECTRUM_RTOL` (negative eigenvalues within it count as zero)."""
    lam = _spectrum(S)
    if lam[0] <= 0:
        return 0.0
    return float(lam.sum() / lam[0])


@dataclass
class RankProfile:
    """Ranks of the token covariance at each saved time (see :func:`rank_profile`)."""

    times: np.ndarray
    numerical: np.ndarray
    effective: np.ndarray
    stable: np.ndarray


def rank_profile(traj: Any, rtol: float = 1e-6) -> RankProfile:
    """:func:`numerical_rank` (with ``rtol``), :func:`effective_rank` and :func:`stable_rank`
    of the covariance of the tokens (particles, weighted) or of :math:`\\Sigma(t)` (Gaussian)
    at every saved time.  Non-finite saved states give NaN / -1.

    For particles, covariance eigenvalues below :math:`(10^3\\epsilon_{mach})^2 E|x|^2` are
    round-off of the centring and count as zero (a cloud collapsed to one point has rank 0).
    """
    times, means, covs = trajectory_moments(traj)
    floors = np.zeros(len(times))
    if kind_of(traj) is ResultKind.PARTICLES:
        m2 = np.trace(covs, axis1=1, axis2=2) + np.sum(means ** 2, axis=1)
        floors = (1e3 * np.finfo(float).eps) ** 2 * m2
    num, eff, stb = [], [], []
    for S, floor in zip(covs, floors, strict=True):
        if not np.all(np.isfinite(S)):
            num.append(-1)
            eff.append(np.nan)
            stb.append(np.nan)
            continue
        if _spectrum(S, max(rtol, validation.PSD_RTOL))[0] <= floor:
            S = np.zeros_like(S)
        num.append(numerical_rank(S, rtol))
        eff.append(effective_rank(S))
        stb.append(stable_rank(S))
    return RankProfile(times, np.asarray(num, dtype=int), np.asarray(eff), np.asarray(stb))


@dataclass
class RankCollapse:
    """When the numerical rank of the token covariance drops (see :func:`rank_collapse`).

    Attributes
    ----------
    collapsed : bool
        Whether the final rank is below the initial rank.
    time : float or None
        First saved time at which the rank is below the initial rank.
    initial_rank, final_rank : int
    min_effective_rank : float
        Smallest effective rank seen.
    events : list of (float, int)
        Every saved time at which the numerical rank changes, with the new rank.
    profile : RankProfile
    """

    collapsed: bool
    time: float | None
    initial_rank: int
    final_rank: int
    min_effective_rank: float
    events: list
    profile: RankProfile


def rank_collapse(traj: Any, rtol: float = 1e-6) -> RankCollapse:
    r"""Detect rank collapse of the token cloud along a trajectory.

    The numerical rank (eigenvalues above ``rtol`` times the largest, so insensitive to
    the overall growth or shrinking of the cloud) is tracked over the saved times; the
    result says when it first drops below its initial value, to what, and lists every
    change.  Rank one is the paper's Lemma 4.3 attractor for diverging covariances.
    """
    prof = rank_profile(traj, rtol)
    ranks = prof.numerical
    ok = ranks >= 0
    if not np.any(ok):
        raise ValueError("traj has no finite saved state")
    r = ranks[ok]
    t = prof.times[ok]
    events = [(float(t[k]), int(r[k])) for k in range(1, len(r)) if r[k] != r[k - 1]]
    below = np.flatnonzero(r < r[0])
    return RankCollapse(bool(r[-1] < r[0]), float(t[below[0]]) if below.size else None,
                        int(r[0]), int(r[-1]), float(np.nanmin(prof.effective[ok])),
                        events, prof)
