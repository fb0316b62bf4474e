r"""How far every token is from the first one, depth by depth (:func:`distance_to_first`).

Under a causal mask the first token attends only to itself: with
:math:`V = Q = K = I` on the sphere it never moves, and every other token is drawn to it.
In a trained decoder the first token is often an *attention sink*.  Both are read from the
same numbers: at every saved depth, each token's cosine and Euclidean distance to token 0
and the token norms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..validation import real_array

__all__ = ["FirstTokenDistances", "distance_to_first"]


@dataclass(frozen=True, eq=False)
class FirstTokenDistances:
    r"""Distances of every token to the first token, at every saved depth.

    Arrays of shape (T, n) are indexed ``[depth, token]``; column 0 is token 0 itself
    (cosine exactly 1, distances exactly 0 where its norm is non-zero).  Where a token (or
    token 0) is the zero vector its cosine, ``one_minus_cosine`` and ``angle`` are NaN.

    Attributes
    ----------
    times : ndarray (T,) or None
        The depths of the states, when known.
    cosine : ndarray (T, n)
        :math:`c_i = \langle x_i, x_0\rangle / (|x_i|\,|x_0|)`, in :math:`[-1, 1]`.
    one_minus_cosine : ndarray (T, n)
        :math:`1 - c_i`, evaluated as :math:`\tfrac12|\hat x_i - \hat x_0|^2`
        (:math:`\hat x = x/|x|`), which keeps its relative accuracy as tokens merge
        (where ``1 - cosine`` would be rounding noise below about 1e-16).
    angle : ndarray (T, n)
        The angle :math:`\arccos c_i`, evaluated as :math:`2\arcsin(|\hat x_i - \hat x_0|/2)`
        (accurate at small angles).
    distance : ndarray (T, n)
        The Euclidean distance :math:`|x_i - x_0|`.
    radius : ndarray (T, n)
        The token norms :math:`|x_i|`.
    """

    times: np.ndarray | None
    cosine: np.ndarray
    one_minus_cosine: np.ndarray
    angle: np.ndarray
    distance: np.ndarray
    radius: np.ndarray

    @property
    def min_cosine(self) -> np.ndarray:
        r"""Per depth (T,): :math:`\min_{i \ge 1} c_i`, the cosine of the token farthest (in
        angle) from token 0; 1 for a single token.  NaN where a cosine is NaN."""
        return self.cosine[:, 1:].min(axis=1, initial=1.0)

    @property
    def max_one_minus_cosine(self) -> np.ndarray:
        r"""Per depth (T,): :math:`\max_{i \ge 1} (1 - c_i)` (accurate near 0); 0 for a
        single token."""
        return self.one_minus_cosine[:, 1:].max(axis=1, initial=0.0)

    @property
    def mean_cosine(self) -> np.ndarray:
        r"""Per depth (T,): the mean of :math:`c_i` over the tokens :math:`i \ge 1` (1 for a
        single token)."""
        if self.cosine.shape[1] < 2:
            return np.ones(self.cosine.shape[0])
        return self.cosine[:, 1:].mean(axis=1)

    @property
    def radius_mean(self) -> np.ndarray:
        """Per depth (T,): the mean token norm (all tokens, token 0 included)."""
        return self.radius.mean(axis=1)

    @property
    def radius_min(self) -> np.ndarray:
        """Per depth (T,): the smallest token norm."""
        return self.radius.min(axis=1)

    @property
    def radius_max(self) -> np.ndarray:
        """Per depth (T,): the largest token norm."""
        return self.radius.max(axis=1)

    def as_dict(self) -> dict[str, list]:
        """Plain lists for a JSON report: the per-depth summaries (``min_cosine``,
        ``mean_cosine``, ``max_one_minus_cosine``, ``radius_mean``, ``radius_min``,
        ``radius_max``, ``radius_first``) and, when known, ``times``; NaN stays NaN."""
        out = {"min_cosine": self.min_cosine, "mean_cosine": self.mean_cosine,
               "max_one_minus_cosine": self.max_one_minus_cosine,
               "radius_mean": self.radius_mean, "radius_min": self.radius_min,
               "radius_max": self.radius_max, "radius_first": self.radius[:, 0]}
        if self.times is not None:
            out = {"times": self.times, **out}
        return {k: [float(v) for v in vals] for k, vals in out.items()}


def distance_to_first(states: Any, times: Any = None) -> FirstTokenDistances:
    r"""Each token's cosine, angle and Euclidean distance to token 0, and the token norms.

    For states :math:`x_i(t_k)` (the saved states of a run, or the hidden states of a
    network layer by layer, tokens in sequence order),

    .. math::
        c_i(t_k) = \frac{\langle x_i, x_0\rangle}{|x_i|\,|x_0|}, \qquad
        1 - c_i = \tfrac12\,\Big|\frac{x_i}{|x_i|} - \frac{x_0}{|x_0|}\Big|^2, \qquad
        \delta_i(t_k) = |x_i - x_0|, \qquad r_i(t_k) = |x_i| .

    Parameters
    ----------
    states : array (T, n, d), or a :class:`~transformer_pde.ParticleTrajectory`
        Token states at ``T`` depths (a single state (n, d) is taken as ``T = 1``).  A run
        gives its ``states`` and ``times``.
    times : array (T,), optional
        The depths, stored in the result (default: a run's ``times``, else ``None``).

    Returns
    -------
    FirstTokenDistances
        Arrays (T, n) and per-depth summaries (``min_cosine``, ``max_one_minus_cosine``,
        ``radius_mean``, ...; ``as_dict()`` for a JSON report).

    Raises
    ------
    ArgumentError
        ``states`` not of shape (T, n, d) with :math:`n, d \ge 1`, non-finite states, or
        ``times`` not of length T.

    Examples
    --------
    >>> import numpy as np
    >>> S = np.array([[[1.0, 0.0], [0.0, 2.0]], [[1.0, 0.0], [1.0, 1.0]]])
    >>> r = distance_to_first(S, times=[0.0, 1.0])
    >>> r.cosine[:, 1].round(6).tolist(), r.distance[:, 1].round(6).tolist()
    ([0.0, 0.707107], [2.236068, 1.0])
    >>> r.radius_max.round(6).tolist()
    [2.0, 1.414214]
    """
    if times is None and hasattr(states, "states"):
        times = getattr(states, "times", None)
    raw = getattr(states, "states", states)
    if raw is None:
        raise ArgumentError("states: the run kept no states (it was saved with "
                            "SaveAt(fn=...)); run it with SaveAt(every=...) or SaveAt(ts=...)")
    S = np.array(real_array("states", raw), dtype=float)
    if S.ndim == 2:
        S = S[None]
    if S.ndim != 3 or S.shape[1] < 1 or S.shape[2] < 1:
        raise ArgumentError(f"states must have shape (T, n, d) with n, d >= 1, got {S.shape}")
    if not np.all(np.isfinite(S)):
        raise ArgumentError("states contain NaN or inf (a run that stopped as non-finite: "
                            "pass the states before the failure)")
    if times is not None:
        times = np.array(real_array("times", times), dtype=float).ravel()
        if times.shape != (S.shape[0],):
            raise ArgumentError(f"times must have {S.shape[0]} entries (one per state), got "
                                f"{times.size}")
    radius = np.sqrt((S * S).sum(axis=2))
    with np.errstate(invalid="ignore", divide="ignore"):   # zero tokens: NaN, no warning
        unit = S / np.where(radius > 0, radius, np.nan)[..., None]
    chord = np.sqrt(((unit - unit[:, :1]) ** 2).sum(axis=2))
    one_minus = 0.5 * chord * chord
    cosine = np.clip(np.einsum("tnd,td->tn", unit, unit[:, 0]), -1.0, 1.0)
    cosine[:, 0] = np.where(radius[:, 0] > 0, 1.0, np.nan)
    angle = 2.0 * np.arcsin(np.minimum(chord / 2.0, 1.0))
    distance = np.sqrt(((S - S[:, :1]) ** 2).sum(axis=2))
    return FirstTokenDistances(times=times, cosine=cosine, one_minus_cosine=one_minus,
                               angle=angle, distance=distance, radius=radius)
