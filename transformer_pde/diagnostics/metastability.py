r"""Metastability of attention flows on the sphere: :func:`interaction_energy`, :func:`merge_events`.

At large :math:`\beta` tokens on :math:`S^{d-1}` first gather into a few tight clusters,
which then stay apart for times of order :math:`e^{\beta(1 - \cos\varphi)}`
(:math:`\varphi` the angle between two clusters) before merging pairwise: a staircase
of plateaus.  Two diagnostics measure it along a run:

* :func:`interaction_energy`, the energy

  .. math:: E_\beta(\mu) = \frac{1}{2\beta} \sum_{i,j} w_i w_j\, e^{\beta\langle x_i, x_j\rangle - c},

  which the self-attention flows on the sphere increase (it jumps up at every merge and
  is flat on the plateaus);
* :func:`merge_events`, the number of clusters at every saved time and the times at
  which it drops.

Before the plateaus, tokens spread uniformly on the circle leave the uniform state through
its unstable Fourier modes.  :func:`circle_modes` measures the modes
:math:`c_k(t) = \sum_j w_j e^{-ik\theta_j(t)}` along a run, and :func:`fit_mode_growth`
their exponential growth rates in the linear phase, to compare with
:func:`~transformer_pde.reductions.modes.mode_growth_rate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree
from scipy.special import logsumexp

from .. import validation
from ..errors import ArgumentError, ArgumentTypeError, ScoreOverflowError
from ..results import ResultKind, kind_of

__all__ = ["MergeEvents", "ModeGrowth", "circle_modes", "fit_mode_growth", "interaction_energy",
           "merge_events"]

#: log of the largest float64
_LOG_MAX = math.log(float(np.finfo(float).max))


def _states(obj: Any, name: str) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(states (T, N, d), weights or None, times or None)`` of a particle trajectory or
    of an array of states ((T, N, d), or one state (N, d))."""
    if kind_of(obj) is not None:
        if kind_of(obj) != ResultKind.PARTICLES:
            raise ArgumentTypeError(f"{name} must be a ParticleTrajectory or an array of "
                                    f"token states, got {type(obj).__name__}")
        if obj.states is None:
            raise ArgumentError(f"{name} holds no states (it was saved with SaveAt(fn=...))")
        return np.asarray(obj.states, dtype=float), np.asarray(obj.weights, dtype=float), \
            np.asarray(obj.times, dtype=float)
    X = validation.real_array(name, obj, what="array")
    if X.ndim == 2:
        X = X[None]
    if X.ndim != 3 or 0 in X.shape:
        raise ArgumentError(f"{name} must be states of shape (T, N, d) or one state (N, d), "
                            f"got shape {np.shape(obj)}")
    if not np.all(np.isfinite(X)):
        raise ArgumentError(f"{name} contains NaN or inf")
    return X.astype(float, copy=False), None, None


def interaction_energy(traj_or_states: Any, beta: float, *, shift: float = 0.0,
                       weights: Any = None) -> np.ndarray:
    r"""The interaction energy :math:`E_\beta` at every saved time.

    .. math:: E_\beta(\mu) = \frac{1}{2\beta} \sum_{i,j=1}^N w_i w_j\,
              e^{\beta\langle x_i, x_j\rangle - c},
              \qquad \mu = \sum_i w_i \delta_{x_i},\quad c = \text{shift}.

    It is evaluated as :math:`\exp(\mathrm{logsumexp}_{ij}(\beta\langle x_i, x_j\rangle
    + \log w_i + \log w_j) - c - \log 2\beta)`, so it is finite whenever the result is:
    with unit tokens and ``shift=beta`` every term is at most :math:`w_i w_j/2\beta`, for
    any :math:`\beta` (``1e4`` included).

    **Monotonicity.**  For tokens on the unit sphere with :math:`Q = K = V = I` both
    self-attention flows increase :math:`E_\beta`.  With :math:`A_i = \sum_j w_j
    e^{\beta\langle x_i, x_j\rangle - c} x_j`, the symmetry of the kernel gives
    :math:`\dot E_\beta = \sum_i w_i \langle \dot x_i, A_i\rangle`.  Unnormalised
    attention (``kind="exp"``) moves :math:`\dot x_i = P_{x_i} A_i =
    w_i^{-1}\nabla_{x_i} E_\beta` (the gradient ascent of :math:`E_\beta` on
    :math:`(S^{d-1})^N` for the metric :math:`\sum_i w_i |\dot x_i|^2`), so
    :math:`\dot E_\beta = \sum_i w_i |P_{x_i} A_i|^2 \ge 0`.  Softmax attention moves
    :math:`\dot x_i = P_{x_i} A_i / Z_i` with :math:`Z_i = \sum_j w_j e^{\beta\langle x_i,
    x_j\rangle - c}`: the same gradient for the metric :math:`\sum_i w_i Z_i |\dot
    x_i|^2`, hence :math:`\dot E_\beta = \sum_i w_i |P_{x_i} A_i|^2 / Z_i \ge 0` too.  The
    shift cancels from these signs (it rescales :math:`E_\beta` by :math:`e^{-c}`).

    Parameters
    ----------
    traj_or_states : ParticleTrajectory or array (T, N, d) or (N, d)
        A run of :func:`~transformer_pde.simulate` (its states and weights) or states.
    beta : float
        Inverse temperature (> 0), the ``beta`` of the attention.
    shift : float, default 0.0
        The constant :math:`c`; pass the attention's ``shift`` to get the energy the
        shifted flow increases, and ``shift=beta`` to keep it finite at large ``beta``.
    weights : array (N,), optional
        Token masses (normalised to sum 1); default the trajectory's weights, or uniform.

    Returns
    -------
    ndarray (T,)
        :math:`E_\beta` of each state.

    Raises
    ------
    ArgumentTypeError, ArgumentError
        Malformed states, weights, ``beta`` (not positive) or ``shift`` (not finite).
    ScoreOverflowError
        The energy itself exceeds the float range (large ``beta`` without ``shift``; the
        message suggests ``shift=beta``).
    """
    X, w_traj, _ = _states(traj_or_states, "traj_or_states")
    beta = validation.positive("beta", beta)
    shift = validation.scalar("shift", shift)
    w = validation.weights("weights", w_traj if weights is None else weights, X.shape[1])
    keep = w > 0
    X, logw = X[:, keep], np.log(w[keep])
    pair = logw[:, None] + logw[None, :]
    out = np.empty(X.shape[0])
    for t, Xt in enumerate(X):
        G = Xt @ Xt.T
        out[t] = logsumexp(beta * G + pair) - shift - math.log(2.0 * beta)
    if not np.all(out < _LOG_MAX):
        raise ScoreOverflowError(
            f"the interaction energy with beta={beta:g} and shift={shift:g} exceeds the float "
            f"range (log E = {float(out.max()):.4g}); pass shift=beta (for unit tokens every "
            "term is then at most 1/(2 beta)) and read the energy as e^(-shift) E")
    return np.exp(out)


@dataclass
class MergeEvents:
    r"""Clusters along a run and the times at which they merge (:func:`merge_events`).

    Attributes
    ----------
    times : ndarray (T,)
        Saved times.
    counts : ndarray (T,) of int
        Number of clusters (connected components at distance ``tol``) at each time.
    events : list of (float, int, int)
        ``(time, clusters before, clusters after)`` for every saved time at which the
        count drops: the first saved time at which the merge is seen.
    splits : list of (float, int, int)
        The same for a count that rises: tokens of one component moving apart by more
        than ``tol``.  Along a clustering flow this means ``tol`` is too small (below the
        spread of a cluster) or too close to the gap between two clusters.
    tol : float
        The distance used.
    """

    times: np.ndarray
    counts: np.ndarray
    events: list[tuple[float, int, int]] = field(default_factory=list)
    splits: list[tuple[float, int, int]] = field(default_factory=list)
    tol: float = 0.0

    @property
    def merge_times(self) -> np.ndarray:
        """The times of :attr:`events`, as an array."""
        return np.array([e[0] for e in self.events], dtype=float)


def _count(X: np.ndarray, tol: float) -> int:
    """Connected components of the graph {(i, j): |x_i - x_j| <= tol}."""
    n = X.shape[0]
    pairs = cKDTree(X).query_pairs(tol, output_type="ndarray")
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    return int(connected_components(graph, directed=False)[0])


def merge_events(traj: Any, *, tol: float = 1e-2, times: Any = None) -> MergeEvents:
    r"""Count clusters at every saved time of a run and find the times at which they merge.

    Two tokens are linked when :math:`|x_i - x_j| \le` ``tol``; the clusters are the
    connected components of that graph (single linkage at a fixed distance,
    :func:`scipy.sparse.csgraph.connected_components`), so a cluster is a set of tokens
    joined by chains of short steps.

    **Choosing tol.**  At large :math:`\beta` the tokens of one cluster contract towards
    each other at a rate of order the cluster's mass (independent of :math:`\beta`),
    while distinct clusters stay at angles of order one for the whole plateau: on a
    plateau the intra-cluster diameters are many orders of magnitude below the gaps.  Any
    ``tol`` between the two counts the same clusters: pick it well below the smallest
    gap you want to resolve (chains must not bridge two clusters) and above the spread
    of a cluster once formed; for unit tokens ``1e-2`` to ``1e-4`` are typical.  A merge
    is seen when the two clusters come within ``tol``; under the pairing law
    :math:`\tan(\varphi/2) = \tan(\varphi_0/2)\,e^{-2s}` the last stretch from
    ``10 * tol`` to ``tol`` takes :math:`\Delta s = \tfrac12\ln 10`, short against the
    plateaus, so the event times barely depend on ``tol`` (check by recounting with
    ``tol / 10``).  A non-empty :attr:`MergeEvents.splits` says ``tol`` is too small.
    Merges are resolved to the saved times: save on a geometric grid
    (``SaveAt(ts=np.geomspace(...))``) for plateaus on a logarithmic time scale.

    Parameters
    ----------
    traj : ParticleTrajectory or array (T, N, d)
        A run of :func:`~transformer_pde.simulate`, or states.
    tol : float, default 1e-2
        Linking distance (> 0).
    times : array (T,), optional
        Times of the states when ``traj`` is an array (default ``0, 1, ..., T-1``); not
        allowed with a trajectory, which has its own.

    Returns
    -------
    MergeEvents

    Raises
    ------
    ArgumentTypeError, ArgumentError
        Malformed states or times, ``tol`` not positive, ``times`` given with a trajectory.
    """
    X, _, own = _states(traj, "traj")
    tol = validation.positive("tol", tol)
    if own is not None:
        if times is not None:
            raise ArgumentError("times: a ParticleTrajectory carries its own times; pass "
                                "times only with an array of states")
        t = own
    elif times is None:
        t = np.arange(X.shape[0], dtype=float)
    else:
        t = validation.real_array("times", times, what="vector")
        if t.shape != (X.shape[0],) or not np.all(np.isfinite(t)):
            raise ArgumentError(f"times must be {X.shape[0]} finite numbers (one per state), "
                                f"got shape {t.shape}")
    counts = np.array([_count(Xt, tol) for Xt in X], dtype=int)
    events, splits = [], []
    for k in range(1, len(counts)):
        entry = (float(t[k]), int(counts[k - 1]), int(counts[k]))
        if counts[k] < counts[k - 1]:
            events.append(entry)
        elif counts[k] > counts[k - 1]:
            splits.append(entry)
    return MergeEvents(np.asarray(t, dtype=float), counts, events, splits, tol)


def circle_modes(traj_or_states: Any, ks: Any, *, weights: Any = None) -> np.ndarray:
    r"""Fourier modes of the tokens on the circle at every saved time.

    .. math:: c_k(t) = \sum_{j=1}^N w_j\, e^{-ik\theta_j(t)}, \qquad
              \theta_j = \operatorname{atan2}(x_{j,2}, x_{j,1}),

    the Fourier coefficients of the empirical measure (:math:`c_0 = 1`; for i.i.d.
    uniform tokens of equal mass :math:`\mathbb E|c_k|^2 = 1/N`, :math:`k \ne 0`).

    Parameters
    ----------
    traj_or_states : ParticleTrajectory or array (T, N, 2) or (N, 2)
        A run of :func:`~transformer_pde.simulate` on the circle (its states and weights),
        or states; only the directions of the tokens count.
    ks : int or array_like of int
        The modes :math:`k`.
    weights : array (N,), optional
        Token masses (normalised to sum 1); default the trajectory's weights, or uniform.

    Returns
    -------
    ndarray (T, K) complex
        :math:`c_k` at each saved time, one column per entry of ``ks``.

    Raises
    ------
    ArgumentTypeError, ArgumentError
        Malformed states (not 2 coordinates, a token at the origin), ``ks`` not
        integers, bad ``weights``.
    """
    X, w_traj, _ = _states(traj_or_states, "traj_or_states")
    if X.shape[2] != 2:
        raise ArgumentError(f"traj_or_states: circle_modes needs tokens in the plane (d = 2), "
                            f"got d = {X.shape[2]}")
    k = validation.real_array("ks", ks)
    if k.ndim > 1 or k.size == 0 or not np.all(np.isfinite(k)) or np.any(k != np.round(k)):
        raise ArgumentError(f"ks must be one integer or a vector of integers, got {ks!r:.60}")
    k = np.atleast_1d(k)
    w = validation.weights("weights", w_traj if weights is None else weights, X.shape[1])
    if np.any((X[..., 0] == 0) & (X[..., 1] == 0)):
        raise ArgumentError("traj_or_states: a token at the origin has no angle")
    theta = np.arctan2(X[..., 1], X[..., 0])
    return np.stack([np.exp(-1j * kk * theta) @ w for kk in k], axis=-1)


@dataclass
class ModeGrowth:
    r"""Growth rates of Fourier modes fitted in the linear phase (:func:`fit_mode_growth`).

    Attributes
    ----------
    rates : ndarray (K,)
        Fitted :math:`\hat\lambda_k`.
    stderr : ndarray (K,)
        Their standard errors: jackknife over the draws; NaN for one draw (the scatter
        between draws, from the quadratic terms, is then unknown: the residuals of one
        smooth curve do not measure it).
    t_end : float
        End of the fitted window :math:`[0, t_{end}]` (the linear phase).
    points : int
        Saved times in the window.
    draws : int
        Number of independent runs pooled.
    """

    rates: np.ndarray
    stderr: np.ndarray
    t_end: float
    points: int
    draws: int


def _pooled_slopes(t: np.ndarray, amp2: np.ndarray) -> np.ndarray:
    """Least-squares slopes of ``log(mean over draws of amp2) / 2`` against ``t``
    (``amp2``: (D, T, K))."""
    y = 0.5 * np.log(amp2.mean(axis=0))
    u = t - t.mean()
    return u @ (y - y.mean(axis=0)) / (u @ u)


def fit_mode_growth(times: Any, modes: Any, *, t_end: float | None = None,
                    amplitude: float = 0.05) -> ModeGrowth:
    r"""Exponential growth rates of Fourier modes in the linear phase of one or many runs.

    Near the uniform state the modes of a run from i.i.d. uniform tokens grow as
    :math:`c_k(t) = c_k(0)e^{\lambda_k t}` up to quadratic terms (products
    :math:`c_m c_{k-m}`, relatively of order :math:`\max_m |c_m|`), so over draws
    :math:`\mathbb E|c_k(t)|^2 = e^{2\lambda_k t}\,\mathbb E|c_k(0)|^2`.  The rate is the
    least-squares slope of

    .. math:: g_k(t) = \tfrac12 \log\Big(\frac1D\sum_{d=1}^D |c^{(d)}_k(t)|^2\Big)

    over the saved times in :math:`[0, t_{end}]`.  Pooling the squared amplitudes before
    the logarithm averages out the quadratic terms (their phases are independent of
    :math:`c_k(0)`), which a per-draw fit of :math:`\log|c_k|` would not: a draw whose
    :math:`|c_k(0)|` happens to be small is dominated by them.  The standard error is the
    jackknife over the draws (leave one draw out); with one draw there is none (NaN).

    Parameters
    ----------
    times : array (T,)
        Saved times, increasing.
    modes : array (T, K) or (D, T, K)
        :math:`c_k` of one run, or of ``D`` independent runs saved at the same times
        (:func:`circle_modes`).
    t_end : float, optional
        End of the linear phase.  Default: the last saved time at which the pooled
        root-mean-square amplitude :math:`(\frac1D\sum_d|c^{(d)}_k|^2)^{1/2}` of every
        mode is at most ``amplitude``.
    amplitude : float, default 0.05
        The amplitude up to which the dynamics count as linear (quadratic terms below
        about that fraction), when ``t_end`` is not given.

    Returns
    -------
    ModeGrowth

    Raises
    ------
    ArgumentTypeError, ArgumentError
        Malformed ``times`` or ``modes``, a mode that vanishes, or a window with fewer
        than three saved times (naming ``t_end`` or ``amplitude``).
    """
    t = validation.real_array("times", times, what="vector")
    if t.ndim != 1 or t.size < 3 or not np.all(np.isfinite(t)) or np.any(np.diff(t) <= 0):
        raise ArgumentError(f"times must be at least three increasing finite numbers, got "
                            f"shape {np.shape(times)}")
    c = np.asarray(modes)
    if not np.issubdtype(c.dtype, np.number) or c.ndim not in (2, 3):
        raise ArgumentError(f"modes must be complex numbers of shape (T, K) or (D, T, K), "
                            f"got {c.dtype} of shape {c.shape}")
    c = c[None] if c.ndim == 2 else c
    if c.shape[1] != t.size or 0 in c.shape:
        raise ArgumentError(f"modes must have one row per saved time ({t.size}), got shape "
                            f"{np.shape(modes)}")
    amp2 = np.abs(c.astype(complex)) ** 2
    if not np.all(np.isfinite(amp2)) or np.any(amp2.mean(axis=0) == 0):
        raise ArgumentError("modes must be finite and no mode may vanish at a saved time")
    if t_end is None:
        amplitude = validation.positive("amplitude", amplitude)
        linear = np.all(np.sqrt(amp2.mean(axis=0)) <= amplitude, axis=1)
        n = int(np.argmin(linear)) if not np.all(linear) else t.size
        name, what = "amplitude", f"amplitude={amplitude:g}"
    else:
        t_end = validation.scalar("t_end", t_end)
        n = int(np.searchsorted(t, t_end, side="right"))
        name, what = "t_end", f"t_end={t_end:g}"
    if n < 3:
        raise ArgumentError(f"{name}: the linear phase ({what}) holds {n} saved time(s); "
                            "the fit needs at least three (save more often, or raise it)")
    tw, a = t[:n], amp2[:, :n]
    rates = _pooled_slopes(tw, a)
    D = a.shape[0]
    se = np.full(rates.shape, np.nan)
    if D > 1:
        jack = np.array([_pooled_slopes(tw, np.delete(a, i, axis=0)) for i in range(D)])
        se = np.sqrt((D - 1) / D * ((jack - jack.mean(axis=0)) ** 2).sum(axis=0))
    return ModeGrowth(rates, se, float(tw[-1]), n, D)
