r"""Synchronisation of tokens on the circle: does every token end at one point?

Tokens :math:`x_i = (\cos\theta_i, \sin\theta_i)` on :math:`S^1` under isotropic attention
:math:`Q = K = V = I` at inverse temperature :math:`\beta` (any sign) move by

.. math:: \dot\theta_i = \frac{1}{Z_i}\sum_j w_j\, g(\theta_j - \theta_i), \qquad
          g(u) = e^{\beta\cos u}\sin u,

with :math:`Z_i = 1` for unnormalised attention (kind ``"exp"``, the self-attention
dynamics of Polyanskiy--Rigollet--Yao, arXiv 2507.22857) and
:math:`Z_i = \sum_j w_j e^{\beta\cos(\theta_j - \theta_i)}` for softmax.  Synchronisation
means that all tokens converge to one point.

**Criterion.**  :func:`largest_gap` is the largest angle between consecutive tokens.  When
it exceeds :math:`\pi` the tokens lie in an arc of width :math:`\ell < \pi`, and then they
synchronise: the extreme token :math:`\theta_{\max}` sees every other token at an angle
in :math:`(-\ell, 0]`, where :math:`g \le 0`, and the token :math:`\theta_{\min}` at the angle
:math:`-\ell`, so :math:`\dot\theta_{\max} \le -c\sin\ell` and likewise
:math:`\dot\theta_{\min} \ge c\sin\ell`, with :math:`c = \min_j w_j\, e^{-|\beta|} /
\max_i Z_i > 0`.  Hence :math:`\dot\ell \le -2c\sin\ell`: the arc shrinks to a point,
exponentially fast.  For both kinds (:math:`Z_i \le e^{|\beta|}`).  So
``largest_gap > pi + margin`` is a *certificate* of synchronisation of the computed state
(the margin covers the integration error of the state).  A run is classified
(:func:`synchronization_runs`) as

* ``synchronised`` -- certified as above at some check time :math:`t \le T`;
* ``equilibrium`` -- not certified, and every token moved by less than
  ``speed_tol`` :math:`\times\Delta` over the last check interval :math:`\Delta`: the
  state has stopped away from synchronisation (its stability is checked, for small
  :math:`n`, by :func:`equilibrium_spectrum`);
* ``undecided`` -- neither by the final time :math:`T`.

The order parameter :math:`r = |\sum_j w_j e^{i\theta_j}|` (:func:`order_parameter`) is
reported too; it tends to 1 under synchronisation but is no certificate.

**Non-synchronised equilibria.**  :math:`p` clusters of mass :math:`1/p` at the vertices
of a regular :math:`p`-gon are an equilibrium for every :math:`\beta`.  Linearising
:math:`\dot\theta` there (:func:`polygon_spectrum`) gives the rigid modes of the clusters,

.. math:: \mu_m = \frac1p\sum_{l=1}^{p-1} g'(2\pi l/p)\,\big(\cos(2\pi m l/p) - 1\big),
          \qquad m = 1, \dots, p - 1,

and, when clusters hold several tokens, the modes inside a cluster,
:math:`\nu = -\frac1p\sum_{l=0}^{p-1} g'(2\pi l/p)`, with
:math:`g'(u) = e^{\beta\cos u}(\cos u - \beta\sin^2 u)` (divided by
:math:`Z = \frac1p\sum_l e^{\beta\cos(2\pi l/p)}` for softmax).  For :math:`p = 3`,
:math:`\mu_1 = \mu_2 = e^{-\beta/2}(\tfrac12 + \tfrac34\beta)`, negative exactly when
:math:`\beta < -2/3`, and then :math:`\nu < 0` too: three equal clusters at 120° are a
stable equilibrium, so for :math:`n` divisible by 3 a set of initial states of positive
measure does not synchronise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation
from ..attention import Attention
from ..blocks import Block
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate import SaveAt
from ..particles import FieldOptions, simulate

__all__ = ["VERDICTS", "SYNCHRONISED", "EQUILIBRIUM", "UNDECIDED", "SyncRuns",
           "circle_angles", "circle_clusters", "circle_initial_states", "equilibrium_spectrum",
           "largest_gap", "order_parameter", "polygon_spectrum", "synchronization_runs"]

#: the verdicts of :func:`synchronization_runs`, by code
VERDICTS: tuple[str, ...] = ("synchronised", "equilibrium", "undecided")
SYNCHRONISED, EQUILIBRIUM, UNDECIDED = 0, 1, 2
_KINDS = ("exp", "softmax")
_INITS = ("uniform", "triangle")


def _circle_states(name: str, X: Any) -> np.ndarray:
    """Finite states of shape (..., n, 2) with n >= 1."""
    a = validation.finite_array(name, X)
    if a.ndim < 2 or a.shape[-1] != 2 or a.shape[-2] == 0:
        raise ArgumentError(f"{name} must hold tokens on the circle, shape (..., n, 2) with "
                            f"n >= 1, got shape {a.shape}")
    return a


def circle_angles(X: Any) -> np.ndarray:
    r"""Angles :math:`\theta_i = \operatorname{atan2}(x_{i,2}, x_{i,1}) \in (-\pi, \pi]` of
    tokens ``X`` of shape (..., n, 2); returns shape (..., n)."""
    a = _circle_states("X", X)
    return np.arctan2(a[..., 1], a[..., 0])


def order_parameter(X: Any, weights: Any = None) -> np.ndarray:
    r"""Order parameter :math:`r = |\sum_j w_j x_j|` of unit tokens ``X`` (..., n, d):
    :math:`|\sum_j w_j e^{i\theta_j}|` on the circle, 1 exactly when all tokens coincide.

    ``weights`` (n,) are normalised (uniform by default).  Returns shape (...)."""
    a = validation.finite_array("X", X)
    if a.ndim < 2 or a.shape[-2] == 0:
        raise ArgumentError(f"X must have shape (..., n, d) with n >= 1, got {a.shape}")
    w = validation.weights("weights", weights, a.shape[-2])
    return np.linalg.norm(np.einsum("...nd,n->...d", a, w), axis=-1)


def largest_gap(X: Any) -> np.ndarray:
    r"""Largest angle between consecutive tokens on the circle (..., n, 2), in
    :math:`(0, 2\pi]` (:math:`2\pi` when all tokens coincide).  Above :math:`\pi` the tokens
    lie in an open half-circle and synchronise (see the module notes)."""
    th = np.sort(np.mod(circle_angles(X), 2.0 * np.pi), axis=-1)
    gaps = np.diff(th, axis=-1)
    wrap = th[..., :1] + 2.0 * np.pi - th[..., -1:]
    return np.concatenate([gaps, wrap], axis=-1).max(axis=-1)


def circle_clusters(X: Any, gap: float = 1e-3) -> np.ndarray:
    """Number of groups of tokens on the circle (..., n, 2) separated by gaps larger than
    ``gap`` radians (1 when no gap is that large)."""
    gap = validation.positive("gap", gap)
    th = np.sort(np.mod(circle_angles(X), 2.0 * np.pi), axis=-1)
    gaps = np.concatenate([np.diff(th, axis=-1),
                           th[..., :1] + 2.0 * np.pi - th[..., -1:]], axis=-1)
    return np.maximum((gaps > gap).sum(axis=-1), 1)


def _kernel_parts(beta: float, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:math:`(e^{\\beta\\cos u}, g'(u))` with :math:`g(u) = e^{\\beta\\cos u}\\sin u`."""
    e = np.exp(beta * np.cos(u))
    return e, e * (np.cos(u) - beta * np.sin(u) ** 2)


def polygon_spectrum(p: int, beta: float, kind: str = "exp") -> tuple[np.ndarray, float]:
    r"""Eigenvalues of the linearised angle dynamics at ``p`` equal clusters on the
    vertices of a regular ``p``-gon (formulas in the module notes).

    Returns ``(mu, nu)``: ``mu`` (p - 1,) the rigid modes :math:`m = 1, \dots, p-1` of the
    clusters (the mode :math:`m = 0`, a rotation, is 0) and ``nu`` the eigenvalue of the
    motions inside a cluster (multiplicity :math:`n - p` for :math:`n` tokens, absent when
    every cluster is one token).  The equilibrium is linearly stable when every entry of
    ``mu`` (and ``nu`` when clusters hold several tokens) is negative.
    """
    p = validation.integer("p", p, minimum=2)
    beta = validation.scalar("beta", beta)
    kind = validation.choice("kind", kind, _KINDS)
    u = 2.0 * np.pi * np.arange(p) / p
    e, gp = _kernel_parts(beta, u)
    m = np.arange(1, p)
    mu = (gp[None, 1:] * (np.cos(np.outer(m, u[1:])) - 1.0)).sum(axis=1) / p
    nu = -gp.sum() / p
    if kind == "softmax":
        z = e.mean()
        mu, nu = mu / z, nu / z
    return mu, float(nu)


def equilibrium_spectrum(X: Any, beta: float, kind: str = "exp", weights: Any = None,
                         max_tokens: int = 4096) -> np.ndarray:
    r"""Eigenvalues of the linearised angle dynamics at an equilibrium ``X`` (n, 2),
    without the rotation mode: ``n - 1`` real numbers, ascending.

    The Jacobian of :math:`\dot\theta_i = \sum_j w_j g(\theta_j - \theta_i)` (kind
    ``"exp"``) is :math:`J = MW` with :math:`M_{ij} = g'(\theta_j - \theta_i)` (i ≠ j),
    :math:`M_{ii} = -\sum_{j\ne i} w_j g'(\theta_j - \theta_i)/w_i`, :math:`W` the diagonal
    of the weights: :math:`M` is symmetric (:math:`g'` is even), so :math:`J` is similar to
    :math:`S = W^{1/2} M W^{1/2}`.  For softmax, at an equilibrium (where the numerators
    vanish) :math:`J = D^{-1}MW` with :math:`D = \operatorname{diag}(Z_i)`, similar to the
    symmetric :math:`D^{-1/2} S D^{-1/2}`.  The rotation :math:`\delta\theta = 1` is the
    null vector :math:`u = (D W)^{1/2}\mathbf 1` of the symmetric form; the eigenvalues
    returned are those on :math:`u^\perp`.  The equilibrium is linearly stable when the
    largest is negative.  Exact only at an equilibrium (for softmax); O(n^3) work, refused
    above ``max_tokens`` tokens.
    """
    a = _circle_states("X", X)
    if a.ndim != 2:
        raise ArgumentError(f"X must be one state of shape (n, 2), got shape {a.shape}")
    beta = validation.scalar("beta", beta)
    kind = validation.choice("kind", kind, _KINDS)
    max_tokens = validation.integer("max_tokens", max_tokens, minimum=2)
    n = a.shape[0]
    if n < 2:
        raise ArgumentError("X must hold at least 2 tokens for a spectrum")
    if n > max_tokens:
        raise ArgumentError(f"X has {n} tokens, more than max_tokens={max_tokens} "
                            f"(the spectrum costs O(n^3))")
    w = validation.weights("weights", weights, n)
    th = np.arctan2(a[:, 1], a[:, 0])
    diff = th[None, :] - th[:, None]               # theta_j - theta_i
    e, M = _kernel_parts(beta, diff)
    np.fill_diagonal(M, 0.0)
    M[np.diag_indices(n)] = -(M @ w) / w
    sw = np.sqrt(w)
    S = sw[:, None] * M * sw[None, :]
    scale = np.ones(n) if kind == "exp" else e @ w
    S = S / np.sqrt(np.outer(scale, scale))
    u = np.sqrt(scale * w)
    u /= np.linalg.norm(u)
    # Householder reflection H with H u = e_1: H S H has a zero first row and column
    v = u.copy()
    v[0] += math.copysign(1.0, u[0])
    v /= np.linalg.norm(v)
    HS = S - 2.0 * np.outer(v, v @ S)
    HSH = HS - 2.0 * np.outer(HS @ v, v)
    return np.linalg.eigvalsh(0.5 * (HSH[1:, 1:] + HSH[1:, 1:].T))


def circle_initial_states(rng: np.random.Generator, count: int, n: int,
                          init: str = "uniform", spread: float = 0.3) -> np.ndarray:
    r"""``count`` random initial states of ``n`` tokens on the circle, shape (count, n, 2).

    ``"uniform"``: i.i.d. uniform angles.  ``"triangle"``: token :math:`i` in group
    :math:`i \bmod 3`, the groups at angles :math:`\phi + 2\pi k/3` (:math:`\phi` uniform),
    each token moved by an i.i.d. :math:`N(0, \text{spread}^2)` angle -- states near the
    three-cluster equilibrium."""
    if not isinstance(rng, np.random.Generator):
        raise ArgumentTypeError(f"rng must be a numpy.random.Generator, got "
                                f"{type(rng).__name__}")
    count = validation.integer("count", count, minimum=1)
    n = validation.integer("n", n, minimum=1)
    init = validation.choice("init", init, _INITS)
    spread = validation.nonnegative("spread", spread)
    if init == "uniform":
        th = rng.uniform(0.0, 2.0 * np.pi, size=(count, n))
    else:
        phi = rng.uniform(0.0, 2.0 * np.pi, size=(count, 1))
        th = phi + 2.0 * np.pi * (np.arange(n) % 3) / 3.0 \
            + spread * rng.standard_normal((count, n))
    return np.stack([np.cos(th), np.sin(th)], axis=-1)


@dataclass(frozen=True)
class SyncRuns:
    """What :func:`synchronization_runs` found for each of its ``B`` systems.

    Attributes
    ----------
    verdict : ndarray (B,) of int8
        Index into :data:`VERDICTS`: 0 synchronised, 1 equilibrium, 2 undecided.
    t_decided : ndarray (B,)
        The check time of the verdict (NaN when undecided).
    order, gap, speed : ndarray (B,)
        Order parameter, :func:`largest_gap` and the largest mean angular speed over the
        last check interval (NaN at time 0), at ``t_decided`` (at the final time when
        undecided).
    clusters : ndarray (B,) of int64
        :func:`circle_clusters` of the state at ``t_decided``.
    states : ndarray (B, n, 2)
        The tokens at ``t_decided``.
    status : tuple of str
        The run status of each system (``"ok"``, or why its run stopped).
    """

    verdict: np.ndarray
    t_decided: np.ndarray
    order: np.ndarray
    gap: np.ndarray
    speed: np.ndarray
    clusters: np.ndarray
    states: np.ndarray
    status: tuple

    def fraction(self, verdict: str = "synchronised") -> float:
        """Fraction of the systems with this verdict."""
        code = VERDICTS.index(validation.choice("verdict", verdict, VERDICTS))
        return float(np.mean(self.verdict == code))


def _angle_moved(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Largest angle between matching unit tokens of X and Y (B, n, 2): (B,)."""
    cross = X[..., 0] * Y[..., 1] - X[..., 1] * Y[..., 0]
    dot = (X * Y).sum(axis=-1)
    return np.abs(np.arctan2(cross, dot)).max(axis=-1)


def synchronization_runs(beta: float, X0: Any, *, kind: str = "exp", t_max: float = 200.0,
                         dt: float = 0.05, check_every: float = 1.0, margin: float = 1e-2,
                         speed_tol: float = 1e-8, cluster_gap: float = 1e-3,
                         field: FieldOptions | None = None) -> SyncRuns:
    r"""Run ``B`` token systems on the circle and classify each as synchronised, stopped
    at an equilibrium, or undecided (criterion in the module notes).

    The systems run together as one :func:`~transformer_pde.simulate` of ``B`` segments
    (each its own measure, exactly as if run alone), RK4 with step ``dt`` on the sphere
    (tangent field, retraction; the engine's sphere constraint needs a fixed-step solver),
    in intervals of ``check_every``; at time 0 and after every interval the undecided
    systems are checked, and decided ones leave the run.  The verdict of a system depends
    only on its own trajectory and the check times, never on the other systems.

    Parameters
    ----------
    beta : float
        Inverse temperature, any sign.
    X0 : array (B, n, 2) or (n, 2)
        Initial unit tokens.
    kind : {"exp", "softmax"}
        Unnormalised (the dynamics of Polyanskiy--Rigollet--Yao) or normalised attention.
    t_max, dt, check_every : float
        Final time :math:`T`, RK4 step, interval between checks.
    margin : float
        Certified synchronised when :func:`largest_gap` :math:`> \pi +` ``margin``; choose
        it above the error of the integrated angles (RK4's is :math:`O(dt^4)`).
    speed_tol : float
        Equilibrium when no token moved more than ``speed_tol * check_every`` radians over
        the last interval.
    cluster_gap : float
        Gap separating clusters in :attr:`SyncRuns.clusters`.
    field : FieldOptions, optional
        How the field is evaluated (backend, method); default NumPy (the verdicts do not
        depend on which backends a machine has).
    """
    beta = validation.scalar("beta", beta)
    kind = validation.choice("kind", kind, _KINDS)
    X = _circle_states("X0", X0)
    if X.ndim == 2:
        X = X[None]
    if X.ndim != 3:
        raise ArgumentError(f"X0 must have shape (B, n, 2) or (n, 2), got {np.shape(X0)}")
    if np.max(np.abs(np.linalg.norm(X, axis=-1) - 1.0)) > 1e-10:
        raise ArgumentError("X0 must hold unit tokens (|x| = 1 to 1e-10)")
    t_max = validation.positive("t_max", t_max)
    dt = validation.positive("dt", dt)
    check_every = validation.positive("check_every", check_every)
    margin = validation.nonnegative("margin", margin)
    speed_tol = validation.positive("speed_tol", speed_tol)
    cluster_gap = validation.positive("cluster_gap", cluster_gap)
    if field is None:
        field = FieldOptions(backend="numpy")
    elif not isinstance(field, FieldOptions):
        raise ArgumentTypeError(f"field must be a FieldOptions, got {type(field).__name__}")
    B, n = X.shape[:2]
    X = X.astype(float, copy=True)
    att = Attention(kind, np.eye(2), np.eye(2), np.eye(2), beta=beta)
    verdict = np.full(B, UNDECIDED, dtype=np.int8)
    t_dec = np.full(B, np.nan)
    speed = np.full(B, np.nan)
    status = ["ok"] * B
    active = np.arange(B)
    prev: np.ndarray | None = None
    t, h = 0.0, check_every
    while True:
        cert = largest_gap(X[active]) > math.pi + margin
        if prev is not None:
            speed[active] = _angle_moved(prev, X[active]) / h
            stopped = ~cert & (speed[active] < speed_tol)
        else:
            stopped = np.zeros(active.size, dtype=bool)
        verdict[active[cert]] = SYNCHRONISED
        verdict[active[stopped]] = EQUILIBRIUM
        t_dec[active[cert | stopped]] = t
        active = active[~(cert | stopped)]
        if active.size == 0 or t >= t_max * (1.0 - 1e-12):
            break
        h = min(check_every, t_max - t)
        k = active.size
        traj = simulate(att, X[active].reshape(k * n, 2), t_max=h, dt=min(dt, h),
                        solver="rk4", block=Block(constraint="sphere"), field=field,
                        saveat=SaveAt(every=max(1, math.ceil(h / min(dt, h)))),
                        segments=[n] * k, warn=False)
        run_status = getattr(traj.status, "value", str(traj.status))
        if run_status != "ok":
            for i in active:
                status[i] = run_status
            break
        prev = X[active].copy()
        X[active] = np.asarray(traj.states[-1], dtype=float).reshape(k, n, 2)
        t = t + h
    return SyncRuns(verdict=verdict, t_decided=t_dec, order=order_parameter(X),
                    gap=largest_gap(X), speed=speed,
                    clusters=circle_clusters(X, cluster_gap).astype(np.int64), states=X,
                    status=tuple(status))
