r"""Gaussian token measures: closed-form mean/covariance ODEs, blow-up detection, batched solves.

For :math:`\mu = \mathcal N(\alpha, \Sigma)` the softmax, linear, L2 and Sinkhorn attention
fields are affine, :math:`\Gamma_\mu(x) = Mx + b`, so the continuity equation keeps Gaussians
Gaussian and reduces to

.. math::

    \alpha' = M\alpha + b, \qquad \Sigma' = M\Sigma + \Sigma M^\top

(Castin, Ablin, Carrillo, Peyré, *A Unified Perspective on the Dynamics of Deep
Transformers*, 2025, arXiv:2501.18322, Section 4; conventions of ``SPEC.md``).

Integration
-----------
The covariance is carried as a factor, :math:`\Sigma = FF^\top` with :math:`F' = MF`, which solves
the Lyapunov-type equation exactly, so :math:`\Sigma` is symmetric positive semi-definite by
construction and :math:`\operatorname{rank}\Sigma` is constant along the flow (no clipping).
To make finite-time blow-up cheap and accurate, the state is integrated in a reparametrised
time :math:`s` with

.. math::

    \frac{ds}{dt} = w = 1 + \kappa\,\nu, \qquad \nu = \operatorname{tr}\Sigma
    \; (+\,|\alpha|^2 \text{ for the linear kind}),

:math:`\kappa = \sum_h \|W_O E_h V_h\|_2\,\|A_h\|_2` (a rate scale taken at ``t = 0``; for
``l2`` :math:`A_h` is multiplied by :math:`2\beta'`), and in log-polar variables
:math:`F = e^{\rho} G` with :math:`\|G\|_F = 1`, :math:`\alpha = \varphi\,\tilde\alpha`,
:math:`\varphi = (1 + \kappa\operatorname{tr}\Sigma)^{1/2}`:

.. math::

    \frac{d\rho}{ds} = \frac{\langle G, MG\rangle}{w},\quad
    \frac{dG}{ds} = \frac{MG - \langle G, MG\rangle G}{w},\quad
    \frac{dt}{ds} = \frac1w,\quad
    \frac{d\tilde\alpha}{ds} = \frac{\alpha' - \alpha\,\varphi'/\varphi}{\varphi w}.

Near a Riccati-type singularity (:math:`\operatorname{tr}\Sigma \sim c/(T^*-t)`) :math:`\rho`
is asymptotically linear in :math:`s` and :math:`G` converges, so an adaptive Runge--Kutta
method crosses the blow-up region in a few steps, and :math:`t(s)\to T^*`.

Statuses
--------
``"blowup"``
    :math:`\nu` reached ``blowup_threshold``, the kind's growth law admits a finite-time
    singularity (:func:`blowup_law`), and the growth looks like one: with
    :math:`\tau = \nu/\nu'` (time-to-blow-up of the local power law) and
    :math:`q = -d\tau/dt` (:math:`= 1/p` for :math:`\nu \propto (T^*-t)^{-p}`),
    :math:`q > q_{\max}/2`, where :math:`q_{\max}` is the largest :math:`q` the law allows
    (:math:`q = 0` for exponential growth), and :math:`q \le 1.5\,q_{\max}` (a singularity
    of the law has :math:`q \to 1/p \le q_{\max}`; a larger :math:`q` is a transient of
    oscillating growth); :math:`q` is a central difference of :math:`\tau` along the flow.
    The blow-up time is :math:`T^* = t + \tau/q` (exact for a pure power law; the error for a
    Riccati singularity is :math:`O(\tau^2)`, i.e. :math:`\sim 10^{-16}T^*` at
    :math:`\nu = 10^8`).  ``limit`` is :math:`\Sigma/\operatorname{tr}\Sigma` extrapolated
    linearly to :math:`T^*`.
``"diverging"``
    :math:`\nu` reached ``blowup_threshold`` and either the law excludes a finite-time
    singularity (Sinkhorn; L2 whose key matrices all have rank ``d``: their :math:`M` stays
    bounded as :math:`\Sigma` grows, so the growth is at most exponential) or
    :math:`q` is outside :math:`(q_{\max}/2, 1.5\,q_{\max}]` (growth without a finite-time
    singularity, e.g. :math:`\nu \propto e^{\lambda t}`).  At a low threshold a transient
    :math:`q` can mislead either way (rotating, exponentially growing modes make :math:`q`
    oscillate): use a threshold of :math:`10^8` or more to classify.  ``limit`` is the current
    :math:`\Sigma/\operatorname{tr}\Sigma`.
``"converged"``
    :math:`\|\Sigma'\|_F \le \text{tol}\,(\|\Sigma\|_F + \text{atol})` and
    :math:`\|\alpha'\| \le \text{tol}\,(\|\alpha\| + \|\Sigma\|_F^{1/2} + \text{atol})`
    with ``tol = converge_tol`` (rates per unit ``t``).
``"running"``
    ``t_max`` reached (or the step budget spent) with none of the above.

Growth laws
-----------
Because :math:`\nu' = 2\operatorname{tr}(M\Sigma)` (plus the mean term), a bound
:math:`\|M\| \le C\nu^{r-1}` gives :math:`\nu' \le C'\nu^{r}`, which excludes blow-up for
:math:`r = 1` and forces :math:`p \ge 1/(r-1)`, i.e. :math:`q \le q_{\max} = r-1`, otherwise:

* softmax, linear (any heads): :math:`M` is linear in :math:`\Sigma` (:math:`+\alpha\alpha^\top`):
  :math:`r = 2`, :math:`q_{\max} = 1` (Riccati, :math:`p = 1`); blow-up if :math:`q > 1/2`.
* sinkhorn: :math:`\|M_0\Sigma\| \le \|\Sigma\|` for every :math:`A` (with
  :math:`Z = S^{1/2}AS^{1/2}`, :math:`M_0S = 2S^{1/2}(\varepsilon I + R')^{-1}ZS^{1/2}` and
  :math:`\|(\varepsilon I + R')^{-1}Z\| \le 1/2`): :math:`r = 1`, never blows up.
* l2 (:math:`c = 2\beta'`): by push-through :math:`M = cV\Sigma K^\top(I + cK\Sigma K^\top)^{-1}Q`.
  If :math:`K` has rank ``d`` (:math:`G = K^\top K` invertible),
  :math:`\Sigma K^\top(I + cK\Sigma K^\top)^{-1} = G^{-1}K^\top X(I + X)^{-1}/c` with
  :math:`X = cK\Sigma K^\top \succeq 0`, so :math:`\|M\| \le \|V\|\|Q\|/(c\,\sigma_{\min}(K))`:
  :math:`r = 1`, never blows up (SPEC).  If :math:`K` is rank-deficient (always for a head of
  a multi-head layer, :math:`K_h` is :math:`k\times d` with :math:`k < d`), :math:`\Sigma` can
  grow along :math:`\ker K` undamped; only :math:`\|\Sigma^{1/2}K^\top(I + cK\Sigma
  K^\top)^{-1}\| \le 1/(2\sqrt c)` holds, so :math:`\|M\| = O(\nu^{1/2})`: :math:`r = 3/2`,
  :math:`q_{\max} = 1/2`, and blow-ups **do** occur, e.g. ``K = diag(1, 0)``,
  ``Q = [[0, 1], [0, 0]]``, ``V = diag(0, 1)``, :math:`\beta' = 1/2`,
  :math:`\Sigma_0 = uu^\top`, :math:`u = (1, u_2)`: :math:`u_1` stays 1,
  :math:`u_2' = u_2^2/2`, :math:`T^* = 2/u_2(0)`, :math:`\nu \sim 4/(T^*-t)^2`.  Blow-up if
  :math:`q > 1/4`.

The law is taken from the parameters at the time the threshold is reached.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy.integrate import solve_ivp

from .attention import KINDS, Attention, AttentionParams, Layers
from .errors import ArgumentError

__all__ = [
    "GaussianBatch",
    "GaussianTrajectory",
    "affine_field",
    "blowup_law",
    "blowup_time_identity_value",
    "blowup_time_softmax_1d",
    "exact_linear_1d",
    "exact_rank_one_softmax",
    "exact_softmax_1d",
    "exact_softmax_commuting",
    "exact_softmax_identity_value",
    "l2_variance_rate_1d",
    "moment_ode",
    "sinkhorn_cross_covariance",
    "sinkhorn_variance_rate_1d",
    "solve",
    "solve_batch",
]

logger = logging.getLogger(__name__)

STATUSES = ("converged", "blowup", "diverging", "running")


# =========================================================================== validation
def _check_att(att: Any) -> Attention:
    if not isinstance(att, Attention):
        raise TypeError(f"att must be an Attention, got {type(att).__name__}")
    if not KINDS[att.kind].affine_on_gaussians:
        raise ValueError(
            f"att.kind={att.kind!r} is not affine on Gaussian measures (Gaussians do not stay "
            "Gaussian); the Gaussian module supports "
            f"{sorted(k for k, v in KINDS.items() if v.affine_on_gaussians)}")
    if att.masked:
        raise ValueError("att.masked=True is not supported by the Gaussian module: a masked "
                         "flow acts on (position, x) measures; use the particle engine")
    if att.has_bias:
        # The field stays affine on Gaussians with biases (softmax: the tilt becomes
        # beta K^T (Q x + b_Q), values V y + b_V, output + b_O; b_K cancels), but the closed
        # forms and compiled solvers here take linear maps only.
        raise ArgumentError(
            "att has bias vectors (b_Q/b_K/b_V/b_O): the Gaussian module does not implement "
            "affine query/key/value maps yet; use the particle engine (simulate)")
    return att


def _check_mean_cov(mean: Any, cov: Any, d: int, mname: str = "mean", cname: str = "cov",
                    batch: bool = False) -> tuple[np.ndarray, np.ndarray]:
    try:
        m = np.asarray(mean, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{mname} must be a real array") from None
    try:
        c = np.asarray(cov, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"{cname} must be a real array") from None
    if batch:
        if m.ndim != 2 or m.shape[1] != d:
            raise ValueError(f"{mname} must have shape (B, d) = (B, {d}), got {m.shape}")
        if c.ndim != 3 or c.shape[1:] != (d, d) or c.shape[0] != m.shape[0]:
            raise ValueError(f"{cname} must have shape (B, d, d) = ({m.shape[0]}, {d}, {d}), "
                             f"got {c.shape}")
    else:
        if m.shape != (d,):
            raise ValueError(f"{mname} must have shape (d,) = ({d},), got {m.shape}")
        if c.shape != (d, d):
            raise ValueError(f"{cname} must have shape (d, d) = ({d}, {d}), got {c.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{mname} contains NaN or inf")
    if not np.all(np.isfinite(c)):
        raise ValueError(f"{cname} contains NaN or inf")
    cc = c if batch else c[None]
    scale = np.maximum(np.abs(cc).max(axis=(1, 2)), 1e-300)
    asym = np.abs(cc - np.swapaxes(cc, 1, 2)).max(axis=(1, 2))
    bad = np.nonzero(asym > 1e-12 * scale)[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{cname} must be symmetric" + (f" (member {i})" if batch else "")
                         + f": max |C - C^T| = {asym[i]:.3g}")
    lam = np.linalg.eigvalsh(_sym(cc))
    tr = np.maximum(np.abs(lam).sum(axis=1), 1e-300)
    bad = np.nonzero(lam[:, 0] < -1e-12 * tr)[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{cname} must be positive semi-definite"
                         + (f" (member {i})" if batch else "")
                         + f": smallest eigenvalue {lam[i, 0]:.3g}")
    return m, _sym(c)


def _psd_factor(cov: np.ndarray) -> np.ndarray:
    """Symmetric square root ``F`` (``F F^T = cov``) of validated PSD matrices (..., d, d);
    eigenvalues at round-off level below zero (>= -1e-12 tr, checked) are set to 0."""
    lam, U = np.linalg.eigh(cov)
    return (U * np.sqrt(np.maximum(lam, 0.0))[..., None, :]) @ np.swapaxes(U, -1, -2)


# =========================================================================== affine fields
@dataclass
class _PBatch:
    """Parameters of ``P`` members (P = 1 broadcasts), stacked per head."""

    kind: str
    d: int
    Q: list[np.ndarray]      # per head (P, k, d)
    K: list[np.ndarray]
    V: list[np.ndarray]      # per head (P, c, d)
    rows: list[slice]
    W_O: np.ndarray | None   # (P, d, d)
    beta: np.ndarray         # (P,)
    eps: np.ndarray
    l2b: np.ndarray

    @property
    def P(self) -> int:
        return self.beta.shape[0]

    def take(self, idx: np.ndarray) -> "_PBatch":
        if self.P == 1:
            return self
        return _PBatch(self.kind, self.d, [q[idx] for q in self.Q], [k[idx] for k in self.K],
                       [v[idx] for v in self.V], self.rows,
                       None if self.W_O is None else self.W_O[idx],
                       self.beta[idx], self.eps[idx], self.l2b[idx])


def _stack_params(ps: Sequence[AttentionParams]) -> _PBatch:
    p0 = ps[0]
    H = len(p0.heads)
    Q = [np.stack([p.heads[h].Q for p in ps]) for h in range(H)]
    K = [np.stack([p.heads[h].K for p in ps]) for h in range(H)]
    V = [np.stack([p.heads[h].V for p in ps]) for h in range(H)]
    rows = [p0.heads[h].rows for h in range(H)]
    if any(p.W_O is not None for p in ps):
        W = np.stack([np.eye(p.d) if p.W_O is None else p.W_O for p in ps])
    else:
        W = None
    return _PBatch(p0.kind, p0.d, Q, K, V, rows, W,
                   np.array([p.beta for p in ps], float), np.array([p.eps for p in ps], float),
                   np.array([p.l2_beta for p in ps], float))


def _sym(X: np.ndarray) -> np.ndarray:
    return 0.5 * (X + np.swapaxes(X, -1, -2))


def _head_affine(kind: str, Q: np.ndarray, K: np.ndarray, V: np.ndarray, beta: np.ndarray,
                 eps: np.ndarray, l2b: np.ndarray, mean: np.ndarray, S: np.ndarray,
                 F: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One head, batched: Q, K (P,k,d), V (P,c,d), mean (B,d), S (B,d,d) -> M (B,c,d), b (B,c)."""
    KT = np.swapaxes(K, -1, -2)
    A = KT @ Q                                              # (P, d, d)
    d = S.shape[-1]
    I = np.eye(d)
    if kind == "softmax":
        A = beta[:, None, None] * A
        M = V @ (S @ A)
        b = np.einsum("bcd,bd->bc", np.broadcast_to(V, M.shape[:1] + V.shape[1:]), mean)
    elif kind == "linear":
        A = beta[:, None, None] * A
        second = S + mean[:, :, None] * mean[:, None, :]
        M = V @ (second @ A)
        b = np.zeros(M.shape[:2])
    elif kind == "l2":
        lb = (2.0 * l2b)[:, None, None]
        G = KT @ K
        T1 = I + lb * (G @ S)                               # I + 2b' G S  (invertible)
        M = lb * (V @ (S @ np.linalg.solve(T1, np.broadcast_to(A, T1.shape))))
        T2 = I + lb * (S @ G)                               # I + 2b' S G
        inner = np.linalg.solve(T2, mean[..., None])[..., 0]
        b = np.einsum("bcd,bd->bc", np.broadcast_to(V, M.shape[:1] + V.shape[1:]), inner)
    elif kind == "sinkhorn":
        A = beta[:, None, None] * A
        if F is None:
            F = _psd_factor(S)
        # S^1/2 = U diag(sv) U^T from the SVD of the factor F (F F^T = S): accurate for
        # ill-conditioned / singular S (an eigh of S loses the small directions)
        U, sv, _ = np.linalg.svd(F)
        Sh = (U * sv[..., None, :]) @ np.swapaxes(U, -1, -2)
        ShA = Sh @ A
        Z = ShA @ F                                         # Z Z^T = S^1/2 A S A^T S^1/2
        X, zeta, _ = np.linalg.svd(Z)
        e = eps[:, None]
        h = 1.0 / (e + np.sqrt(e * e + 4.0 * zeta * zeta))  # (eps I + R')^-1 eigenvalues
        inv = (X * h[..., None, :]) @ np.swapaxes(X, -1, -2)
        M0 = 2.0 * (Sh @ inv @ ShA)                         # E[y | x] = alpha + M0 (x - alpha)
        M = V @ M0
        Vb = np.broadcast_to(V, M.shape[:1] + V.shape[1:])
        b = np.einsum("bcd,bd->bc", Vb, mean) - np.einsum("bcd,bd->bc", M, mean)
    else:  # pragma: no cover - guarded by _check_att
        raise ValueError(f"kind {kind!r} is not affine on Gaussians")
    return M, b


def _affine_batch(pb: _PBatch, mean: np.ndarray, S: np.ndarray, F: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    B, d = mean.shape
    M = np.zeros((B, d, d))
    b = np.zeros((B, d))
    for Q, K, V, rows in zip(pb.Q, pb.K, pb.V, pb.rows):
        Mh, bh = _head_affine(pb.kind, Q, K, V, pb.beta, pb.eps, pb.l2b, mean, S, F)
        M[:, rows] += Mh
        b[:, rows] += bh
    if pb.W_O is not None:
        M = pb.W_O @ M
        b = np.einsum("bij,bj->bi", np.broadcast_to(pb.W_O, M.shape), b)
    return M, b


def affine_field(att: Attention, mean: Any, cov: Any, t: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    r"""Affine velocity field :math:`\Gamma_\mu(x) = Mx + b` of :math:`\mu = \mathcal N(\alpha,\Sigma)`.

    Per head (:math:`A = \beta K^\top Q`, :math:`S = \Sigma`; multi-head: the head's rows
    :math:`E_h M_h`, :math:`E_h b_h` are summed and ``W_O`` multiplies the result):

    * ``softmax``: :math:`M = V S A`, :math:`b = V\alpha`.
    * ``linear``: :math:`M = V(S + \alpha\alpha^\top)A`, :math:`b = 0`.
    * ``l2`` (:math:`\beta'` = ``l2_beta``, :math:`G = K^\top K`):
      :math:`M = 2\beta' V S (I + 2\beta' G S)^{-1} A_0`, :math:`b = V(I + 2\beta' S G)^{-1}\alpha`
      with :math:`A_0 = K^\top Q` (``beta`` is 1 for this kind).
    * ``sinkhorn`` (:math:`\varepsilon` = ``eps``): with
      :math:`R' = (\varepsilon^2 I + 4 S^{1/2} A S A^\top S^{1/2})^{1/2}`,

      .. math:: M = 2 V S^{1/2} (\varepsilon I + R')^{-1} S^{1/2} A, \qquad b = V\alpha - M\alpha.

      This is the conditional mean :math:`E_\pi[y \mid x] = \alpha + M_0(x-\alpha)` of the
      entropic optimal self-coupling :math:`\pi` (cost :math:`-\beta y^\top A x`), using the
      Schrödinger potential extended to all :math:`x`.  On the support it equals SPEC's
      :math:`M = VC^\top S^{-1}` with :math:`C = 2S^{1/2}(\varepsilon I + R)^{-1}S^{1/2}A^\top S`,
      :math:`R = (\varepsilon^2 I + 4S^{1/2}A^\top S A S^{1/2})^{1/2}` (push-through identity
      :math:`X f(X^\top X) = f(XX^\top)X`), but it needs no inverse of :math:`S` or :math:`A`:
      it holds for singular covariances and rank-deficient :math:`A`.  Symmetric square roots
      use ``eigh``.

    Parameters
    ----------
    att : Attention
        Unmasked attention of kind ``softmax``, ``linear``, ``l2`` or ``sinkhorn``.
    mean : array_like, shape (d,)
    cov : array_like, shape (d, d)
        Symmetric positive semi-definite (singular allowed).
    t : float
        Time at which time-dependent parameters are evaluated.

    Returns
    -------
    M : ndarray, shape (d, d)
    b : ndarray, shape (d,)

    Raises
    ------
    ValueError, TypeError
        Non-affine kind (sigmoid/relu/exp), masked attention, wrong shapes, NaN,
        non-symmetric or indefinite ``cov``.
    """
    att = _check_att(att)
    m, c = _check_mean_cov(mean, cov, att.d)
    pb = _stack_params([att.at(t)])
    M, b = _affine_batch(pb, m[None], c[None])
    return M[0], b[0]


def moment_ode(att: Attention, mean: Any, cov: Any, t: float = 0.0
               ) -> tuple[np.ndarray, np.ndarray]:
    r"""Right-hand side of the moment ODEs: :math:`(\alpha', \Sigma') = (M\alpha + b,\ M\Sigma + \Sigma M^\top)`.

    For ``kind="linear"`` this is the closed form :math:`M = \beta V(\Sigma + \alpha\alpha^\top)A`,
    :math:`b = 0`, i.e. :math:`\alpha' = \beta V(\Sigma+\alpha\alpha^\top)A\alpha`; in 1-D with
    :math:`\alpha = 0`, :math:`\sigma' = 2\beta v a\sigma^2` (finite-time blow-up, see
    :func:`exact_linear_1d`).  See :func:`affine_field` for every kind.
    """
    M, b = affine_field(att, mean, cov, t)
    m = np.asarray(mean, float)
    c = _sym(np.asarray(cov, float))
    return M @ m + b, M @ c + c @ M.T


# =========================================================================== exact references
def exact_softmax_1d(v: float, a: float, mean0: float, var0: float, t: Any, beta: float = 1.0
                     ) -> tuple[np.ndarray, np.ndarray]:
    r"""Exact 1-D softmax moments: :math:`\sigma' = 2 v a\sigma^2`, :math:`\alpha' = v(1 + a\sigma)\alpha`.

    .. math::

        \sigma(t) = \frac{\sigma_0}{1 - 2 v a \sigma_0 t},\qquad
        \alpha(t) = \alpha_0\, e^{v t}\,(1 - 2 v a\sigma_0 t)^{-1/2}

    with :math:`a \to \beta a`; valid for :math:`t < T^*` (:func:`blowup_time_softmax_1d`).
    """
    a = beta * a
    t = np.asarray(t, float)
    den = 1.0 - 2.0 * v * a * var0 * t
    return mean0 * np.exp(v * t) / np.sqrt(den), var0 / den


def blowup_time_softmax_1d(v: float, a: float, var0: float, beta: float = 1.0) -> float:
    r""":math:`T^* = 1/(2 v \beta a \sigma_0)` if :math:`v\beta a\sigma_0 > 0`, else ``inf``."""
    r = 2.0 * v * beta * a * var0
    return 1.0 / r if r > 0 else math.inf


def exact_linear_1d(v: float, a: float, mean0: float, var0: float, t: Any, beta: float = 1.0
                    ) -> tuple[np.ndarray, np.ndarray, float]:
    r"""Exact 1-D moments of the ``linear`` kind (:math:`M = v(\sigma + \alpha^2)a`, :math:`b=0`).

    Both :math:`\sigma` and :math:`m = \alpha^2` solve :math:`x' = 2va(\sigma + m)x`, so
    :math:`m/\sigma` is constant and

    .. math::

        \sigma(t) = \frac{\sigma_0}{1 - 2va(\sigma_0 + \alpha_0^2)t},\quad
        \alpha(t) = \alpha_0\sqrt{\sigma(t)/\sigma_0},\quad
        T^* = \frac{1}{2va(\sigma_0 + \alpha_0^2)}

    (for :math:`\alpha_0 = 0`: :math:`\sigma' = 2va\sigma^2`, the same law as softmax).
    Requires ``var0 > 0``; :math:`a \to \beta a`.  Returns ``(mean(t), var(t), T*)``.
    """
    a = beta * a
    t = np.asarray(t, float)
    r = 2.0 * v * a * (var0 + mean0 ** 2)
    den = 1.0 - r * t
    var = var0 / den
    return mean0 / np.sqrt(den), var, (1.0 / r if r > 0 else math.inf)


def exact_softmax_identity_value(A: Any, cov0: Any, t: float, beta: float = 1.0) -> np.ndarray:
    r"""Exact softmax covariance for :math:`V = I`: :math:`\Sigma(t) = (\Sigma_0^{-1} - t(A + A^\top))^{-1}`.

    Computed as :math:`\Sigma_0^{1/2}(I - t\Sigma_0^{1/2} B \Sigma_0^{1/2})^{-1}\Sigma_0^{1/2}`,
    :math:`B = \beta(A + A^\top)`, so singular :math:`\Sigma_0` are allowed. Valid for
    :math:`t < T^*` (:func:`blowup_time_identity_value`).
    """
    A = beta * np.asarray(A, float)
    S0 = np.asarray(cov0, float)
    R = _psd_factor(S0)
    d = S0.shape[0]
    X = np.eye(d) - t * (R @ (A + A.T) @ R)
    return _sym(R @ np.linalg.solve(X, R))


def blowup_time_identity_value(A: Any, cov0: Any, beta: float = 1.0) -> float:
    r""":math:`T^* = 1/\lambda_{\max}(\Sigma_0^{1/2}\beta(A + A^\top)\Sigma_0^{1/2})` (``inf`` if
    :math:`\lambda_{\max} \le 0`) for softmax with :math:`V = I`."""
    A = beta * np.asarray(A, float)
    R = _psd_factor(np.asarray(cov0, float))
    lam = np.linalg.eigvalsh(_sym(R @ (A + A.T) @ R))[-1]
    return 1.0 / lam if lam > 0 else math.inf


def exact_softmax_commuting(V: Any, A: Any, mean0: Any, cov0: Any, t: float, beta: float = 1.0
                            ) -> tuple[np.ndarray, np.ndarray, float]:
    r"""Exact softmax moments when :math:`V`, :math:`A`, :math:`\Sigma_0` are symmetric and commute.

    In a common orthonormal eigenbasis :math:`U` (:math:`V = U\,\mathrm{diag}(v)U^\top`, etc.) the
    ODE decouples into 1-D problems (:func:`exact_softmax_1d`) for the coordinates
    :math:`U^\top\alpha` and eigenvalues :math:`\sigma_i`:
    :math:`\sigma_i(t) = \sigma_i/(1 - 2v_ia_i\sigma_i t)`,
    :math:`(U^\top\alpha)_i(t) = (U^\top\alpha_0)_i e^{v_i t}(1 - 2v_ia_i\sigma_it)^{-1/2}`,
    :math:`T^* = \min_i 1/(2v_ia_i\sigma_i)` over positive denominators.

    Returns ``(mean(t), cov(t), T*)``.  Raises ``ValueError`` if the matrices are not symmetric
    or do not commute (relative tolerance 1e-10).
    """
    V = np.asarray(V, float)
    A = beta * np.asarray(A, float)
    S0 = np.asarray(cov0, float)
    m0 = np.asarray(mean0, float)
    mats = {"V": V, "A": A, "cov0": S0}
    for n, X in mats.items():
        if np.abs(X - X.T).max() > 1e-10 * max(np.abs(X).max(), 1e-300):
            raise ValueError(f"{n} must be symmetric for the commuting reference")
    for (n1, X), (n2, Y) in [(("V", V), ("A", A)), (("V", V), ("cov0", S0)),
                             (("A", A), ("cov0", S0))]:
        sc = max(np.abs(X).max() * np.abs(Y).max(), 1e-300)
        if np.abs(X @ Y - Y @ X).max() > 1e-10 * sc:
            raise ValueError(f"{n1} and {n2} do not commute")
    rng = np.random.default_rng(12345)
    c = rng.uniform(0.5, 1.5, 3)
    _, U = np.linalg.eigh(c[0] * V + c[1] * math.pi * A + c[2] * math.e * S0)
    v = np.einsum("ji,jk,ki->i", U, V, U)
    a = np.einsum("ji,jk,ki->i", U, A, U)
    s = np.einsum("ji,jk,ki->i", U, S0, U)
    den = 1.0 - 2.0 * v * a * s * t
    r = 2.0 * v * a * s
    Tstar = float(np.min(1.0 / r[r > 0])) if np.any(r > 0) else math.inf
    cov = (U * (s / den)) @ U.T
    mean = U @ ((U.T @ m0) * np.exp(v * t) / np.sqrt(den))
    return mean, cov, Tstar


def exact_rank_one_softmax(V: Any, A: Any, u0: Any, t: Any, beta: float = 1.0,
                           rtol: float = 1e-13) -> np.ndarray:
    r"""Rank-one softmax covariance :math:`\Sigma(t) = u(t)u(t)^\top` (paper, Lemma 4.3).

    With :math:`\Sigma = uu^\top`, :math:`M = V uu^\top A` and :math:`u' = (u^\top A u)\,Vu`:
    rank one stays rank one.  With the clock :math:`d\tau = u^\top A u\,dt`,
    :math:`u = e^{\tau V}u_0` and :math:`\tau(t)` solves the scalar ODE
    :math:`\tau' = \phi(\tau) = u_0^\top e^{\tau V^\top} A e^{\tau V} u_0` (solved here to
    ``rtol``; :math:`T^* = \int_0^\infty d\tau/\phi` when finite).

    Returns ``u(t)`` with shape ``(len(t), d)`` (``t`` sorted, before blow-up).
    """
    from scipy.linalg import expm

    V = np.asarray(V, float)
    A = beta * np.asarray(A, float)
    u0 = np.asarray(u0, float)
    ts = np.atleast_1d(np.asarray(t, float))
    lam, P = np.linalg.eig(V)
    diag = np.linalg.cond(P) < 1e8

    def u_of(tau: float) -> np.ndarray:
        if diag:
            return np.real(P @ (np.exp(tau * lam) * np.linalg.solve(P, u0)))
        return expm(tau * V) @ u0

    def phi(_t: float, y: np.ndarray) -> np.ndarray:
        u = u_of(y[0])
        return np.array([u @ A @ u])

    sol = solve_ivp(phi, (0.0, float(ts.max())), [0.0], method="DOP853", t_eval=ts,
                    rtol=rtol, atol=1e-14)
    if sol.status != 0:
        raise RuntimeError(f"rank-one reference failed: {sol.message}")
    return np.stack([u_of(tau) for tau in sol.y[0]])


def l2_variance_rate_1d(v: float, q: float, k: float, var: float, l2_beta: float = 0.5) -> float:
    r"""1-D L2 law :math:`\sigma' = 4\beta' v a\sigma^2/(1 + 2\beta' k^2\sigma)`, :math:`a = kq`."""
    return 4.0 * l2_beta * v * k * q * var ** 2 / (1.0 + 2.0 * l2_beta * k * k * var)


def sinkhorn_variance_rate_1d(v: float, a: float, var: float, eps: float = 1.0) -> float:
    r"""1-D Sinkhorn law :math:`\sigma' = (v/a)(\sqrt{\varepsilon^2 + 4a^2\sigma^2} - \varepsilon)`,
    written as :math:`4va\sigma^2/(\varepsilon + \sqrt{\varepsilon^2 + 4a^2\sigma^2})` (valid at a = 0)."""
    return 4.0 * v * a * var ** 2 / (eps + math.sqrt(eps * eps + 4.0 * a * a * var * var))


def sinkhorn_cross_covariance(A: Any, cov: Any, eps: float = 1.0) -> np.ndarray:
    r"""Cross-covariance :math:`C = E_\pi[(x-\alpha)(y-\alpha)^\top]` of the entropic optimal
    self-coupling of :math:`\mathcal N(\alpha, S)` for cost :math:`-y^\top A x` (``x`` the query).

    Computed as :math:`C = S M_0^\top` with :math:`M_0 = 2S^{1/2}(\varepsilon I + R')^{-1}S^{1/2}A`
    (see :func:`affine_field`); equal to SPEC's
    :math:`C = 2 S^{1/2}(\varepsilon I + R)^{-1}S^{1/2}A^\top S`.  Include the temperature in ``A``.
    """
    A = np.asarray(A, float)
    S = _sym(np.asarray(cov, float))
    d = S.shape[0]
    one = np.ones(1)
    M0, _ = _head_affine("sinkhorn", A[None], np.eye(d)[None], np.eye(d)[None], one,
                         np.array([float(eps)]), one, np.zeros((1, d)), S[None])
    return S @ M0[0].T


def _q_max(p: AttentionParams) -> float:
    """Largest q = 1/p of a blow-up allowed by the growth law of ``p`` (0: none); see module doc."""
    if p.kind in ("softmax", "linear"):
        return 1.0
    if p.kind == "l2":
        d = p.d
        full = all(np.linalg.matrix_rank(hd.K) == d for hd in p.heads)
        return 0.0 if full else 0.5
    return 0.0          # sinkhorn


def blowup_law(att: Attention, t: float = 0.0) -> float:
    r"""Largest blow-up rate :math:`q_{\max} = 1/p_{\min}` allowed by the growth law of ``att`` at ``t``.

    :math:`\nu = \operatorname{tr}\Sigma` (:math:`+|\alpha|^2` for ``linear``) can blow up like
    :math:`(T^*-t)^{-p}` only with :math:`p \ge 1/q_{\max}` (module docstring, *Growth laws*):

    * ``1`` for ``softmax`` and ``linear`` (Riccati, :math:`p = 1`);
    * ``0.5`` for ``l2`` when some head's key matrix :math:`K_h` has rank :math:`< d`
      (:math:`\|M\| = O(\nu^{1/2})`, :math:`p = 2`): growth along :math:`\ker K_h` is not
      damped by :math:`(I + 2\beta' G\Sigma)^{-1}`;
    * ``0`` (no finite-time blow-up) for ``sinkhorn`` and for ``l2`` with every :math:`K_h`
      of rank ``d``: :math:`M` stays bounded as :math:`\Sigma` grows, so the growth is at most
      exponential.

    The solvers call a run that reaches ``blowup_threshold`` ``"blowup"`` only when
    :math:`q_{\max}/2 < q \le 1.5\,q_{\max}` (module docstring, *Statuses*).  Ranks use :func:`numpy.linalg.matrix_rank` (default tolerance):
    an ill-conditioned but full-rank ``K`` cannot blow up, though it may grow like a blow-up
    until :math:`\nu \sim 1/(2\beta'\sigma_{\min}(K)^2)`.
    """
    att = _check_att(att)
    return _q_max(att.at(float(t)))


# =========================================================================== results
@dataclass
class GaussianTrajectory:
    """Result of :func:`solve`.

    Attributes
    ----------
    times : ndarray (T,)
    means : ndarray (T, d)
    covs : ndarray (T, d, d)
        Symmetric PSD by construction (:math:`\\Sigma = FF^\\top`).
    status : {"converged", "blowup", "diverging", "running"}
    blowup_time : float
        Estimated :math:`T^*` (``nan`` unless ``status == "blowup"``).
    limit : ndarray (d, d)
        :math:`\\Sigma/\\operatorname{tr}\\Sigma` at the end (extrapolated to :math:`T^*` on blow-up).
    t_final : float
        Time of the last state.
    message : str
    nfev : int
        Right-hand-side evaluations.
    final_mean, final_cov : ndarray
        State at ``t_final`` (also when ``t_eval`` does not contain it).
    """

    times: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    status: str
    blowup_time: float
    limit: np.ndarray
    t_final: float
    message: str
    nfev: int = 0
    final_mean: np.ndarray | None = None
    final_cov: np.ndarray | None = None


@dataclass
class GaussianBatch:
    """Result of :func:`solve_batch` (``B`` members).

    Attributes
    ----------
    status : ndarray (B,) of str
    blowup_time : ndarray (B,)  (``nan`` unless blow-up)
    t_final : ndarray (B,)
    means, covs : ndarray (B, d), (B, d, d)
        Final states (at the blow-up threshold for blow-ups).
    limit : ndarray (B, d, d)
        :math:`\\Sigma/\\operatorname{tr}\\Sigma`, extrapolated to :math:`T^*` on blow-up.
    n_steps : ndarray (B,)
        Accepted explicit steps per member (members handed to Radau add ``nfev // 8``).
    t_eval : ndarray (T,) or None
    traj_means, traj_covs : ndarray (B, T, d), (B, T, d, d) or None
        States at ``t_eval`` (NaN after a member terminated).
    messages : list of str (B)
        Per-member explanation of the status.
    """

    status: np.ndarray
    blowup_time: np.ndarray
    t_final: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    limit: np.ndarray
    n_steps: np.ndarray
    t_eval: np.ndarray | None = None
    traj_means: np.ndarray | None = None
    traj_covs: np.ndarray | None = None
    messages: list = field(default_factory=list)

    def __len__(self) -> int:
        return self.status.shape[0]

    def counts(self) -> dict[str, int]:
        """Number of members per status."""
        return {s: int(np.sum(self.status == s)) for s in STATUSES}


# =========================================================================== the s-time system
class _System:
    """Reparametrised moment system for a batch of members (see module docstring).

    State row: ``[t, rho, G (d*d, row-major), alpha_tilde (d)]``.
    """

    def __init__(self, atts: Sequence[Attention], B: int):
        self.atts = list(atts)
        a0 = self.atts[0]
        self.d = a0.d
        self.kind = a0.kind
        self.gamma = 1.0 if self.kind == "linear" else 0.0
        self.dynamic = any(a.time_dependent for a in self.atts)
        self.per_member = len(self.atts) > 1
        self.n = 2 + self.d * self.d + self.d
        p0 = [a.at(0.0) for a in self.atts]
        self.kappa = np.array([_rate_scale(p) for p in p0])   # (P,)
        self.static = None if self.dynamic else _stack_params(p0)
        self.lo = np.full(B, -np.inf)   # clamp window for evaluating parameters
        self.hi = np.full(B, np.inf)

    def q_max(self, t: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """:func:`blowup_law` of each member at its time ``t``."""
        if self.kind != "l2":
            return np.full(len(idx), _q_max(self.atts[0].at(0.0)))
        out = np.empty(len(idx))
        for j, (i, tt) in enumerate(zip(idx, t)):
            a = self.atts[i] if self.per_member else self.atts[0]
            out[j] = _q_max(a.at(float(tt) if a.time_dependent else 0.0))
        return out

    def kap(self, idx: np.ndarray) -> np.ndarray:
        return self.kappa if not self.per_member else self.kappa[idx]

    def params(self, t: np.ndarray, idx: np.ndarray) -> _PBatch:
        if self.static is not None:
            return self.static.take(idx)
        lo, hi = self.lo[idx], self.hi[idx]
        tc = np.minimum(np.maximum(t, lo), hi)
        sel = [self.atts[i] for i in idx] if self.per_member else [self.atts[0]] * len(idx)
        return _stack_params([a.at(float(tt)) for a, tt in zip(sel, tc)])

    # ---------------------------------------------------------------- packing
    def pack(self, t: np.ndarray, means: np.ndarray, F: np.ndarray, idx: np.ndarray) -> np.ndarray:
        B, d = means.shape
        nrm = np.sqrt(np.sum(F * F, axis=(1, 2)))
        pos = nrm > 0
        rho = np.where(pos, np.log(np.where(pos, nrm, 1.0)), 0.0)
        G = np.where(pos[:, None, None], F / np.where(pos, nrm, 1.0)[:, None, None], 0.0)
        trS = nrm ** 2
        phi = np.sqrt(1.0 + self.kap(idx) * trS)
        Y = np.empty((B, self.n))
        Y[:, 0] = t
        Y[:, 1] = rho
        Y[:, 2:2 + d * d] = G.reshape(B, d * d)
        Y[:, 2 + d * d:] = means / phi[:, None]
        return Y

    def unpack(self, Y: np.ndarray, idx: np.ndarray):
        d = self.d
        B = Y.shape[0]
        t = Y[:, 0]
        rho = Y[:, 1]
        G = Y[:, 2:2 + d * d].reshape(B, d, d)
        g2 = np.sum(G * G, axis=(1, 2))
        e2r = np.exp(2.0 * rho)
        trS = e2r * g2
        phi = np.sqrt(1.0 + self.kap(idx) * trS)
        mean = Y[:, 2 + d * d:] * phi[:, None]
        return t, rho, G, g2, e2r, trS, phi, mean

    def moments(self, Y: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t, rho, G, g2, e2r, trS, phi, mean = self.unpack(Y, idx)
        F = np.exp(rho)[:, None, None] * G
        return t, mean, F @ np.swapaxes(F, 1, 2)

    # ---------------------------------------------------------------- right-hand side
    def rhs(self, Y: np.ndarray, idx: np.ndarray, full: bool = False):
        t, rho, G, g2, e2r, trS, phi, mean = self.unpack(Y, idx)
        F = np.exp(rho)[:, None, None] * G
        S = F @ np.swapaxes(F, 1, 2)
        M, b = _affine_batch(self.params(t, idx), mean, S, F if self.kind == "sinkhorn" else None)
        kap = self.kap(idx)
        nu = trS + self.gamma * np.sum(mean * mean, axis=1)
        w = 1.0 + kap * nu
        MG = M @ G
        gmg = np.sum(G * MG, axis=(1, 2))
        mu = gmg / np.where(g2 > 0, g2, 1.0)
        dmean = np.einsum("bij,bj->bi", M, mean) + b
        dtrS = 2.0 * e2r * gmg
        dlogphi = 0.5 * kap * dtrS / (phi * phi)
        dY = np.empty_like(Y)
        d = self.d
        dY[:, 0] = 1.0 / w
        dY[:, 1] = mu / w
        dY[:, 2:2 + d * d] = ((MG - mu[:, None, None] * G) / w[:, None, None]).reshape(len(t), -1)
        dY[:, 2 + d * d:] = (dmean - mean * dlogphi[:, None]) / (phi * w)[:, None]
        if full:
            return dY, dict(t=t, mean=mean, S=S, M=M, b=b, dmean=dmean, nu=nu,
                            dnu=dtrS + 2.0 * self.gamma * np.sum(mean * dmean, axis=1))
        return dY

    # ---------------------------------------------------------------- diagnostics
    def log_size(self, Y: np.ndarray, idx: np.ndarray) -> np.ndarray:
        t, rho, G, g2, e2r, trS, phi, mean = self.unpack(Y, idx)
        if self.gamma == 0.0:
            return 2.0 * rho + np.log(np.maximum(g2, 1e-300))
        return np.log(np.maximum(trS + np.sum(mean * mean, axis=1), 1e-300))

    def conv_measure(self, Y: np.ndarray, idx: np.ndarray, atol: float) -> np.ndarray:
        """max(relative covariance rate, relative mean rate) per unit t."""
        _, info = self.rhs(Y, idx, full=True)
        S, M = info["S"], info["M"]
        dS = M @ S
        dS = dS + np.swapaxes(dS, 1, 2)
        nS = np.sqrt(np.sum(S * S, axis=(1, 2)))
        rS = np.sqrt(np.sum(dS * dS, axis=(1, 2))) / (nS + atol)
        rm = np.linalg.norm(info["dmean"], axis=1) / (
            np.linalg.norm(info["mean"], axis=1) + np.sqrt(nS) + atol)
        return np.maximum(rS, rm)

    def tau_q(self, Y: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
        r"""tau = nu/nu' and q = -dtau/dt (central differences along F' = MF, alpha' )."""
        _, info = self.rhs(Y, idx, full=True)
        tau = info["nu"] / info["dnu"]
        t, rho, G, *_ = self.unpack(Y, idx)
        mean = info["mean"]
        F = np.exp(rho)[:, None, None] * G
        dF = info["M"] @ F
        h = 1e-4 * np.abs(tau)
        taus = []
        for sgn in (1.0, -1.0):
            Fp = F + sgn * h[:, None, None] * dF
            mp = mean + sgn * h[:, None] * info["dmean"]
            Yp = self.pack(t + sgn * h, mp, Fp, idx)
            _, ip = self.rhs(Yp, idx, full=True)
            taus.append(ip["nu"] / ip["dnu"])
        q = -(taus[0] - taus[1]) / (2.0 * h)
        return tau, q, info


def _rate_scale(p: AttentionParams) -> float:
    k = 0.0
    for hd in p.heads:
        V = hd.V
        A = hd.A * (2.0 * p.l2_beta if p.kind == "l2" else abs(p.beta))
        nv = np.linalg.norm(V, 2)
        if p.W_O is not None:
            nv = np.linalg.norm(p.W_O[:, hd.rows] @ V, 2)
        k += nv * np.linalg.norm(A, 2)
    return float(k) if k > 0 else 1.0


def _finish(sysm: _System, Y: np.ndarray, idx: np.ndarray, converge_tol: float,
            reason: np.ndarray) -> tuple[list, np.ndarray, np.ndarray, list]:
    """Classify terminal states. ``reason``: 0 = t stop/budget, 1 = size threshold, 2 = converged."""
    B = Y.shape[0]
    status = ["running"] * B
    Tstar = np.full(B, np.nan)
    t, mean, S = sysm.moments(Y, idx)
    tr = np.trace(S, axis1=1, axis2=2)
    limit = S / np.where(tr > 0, tr, 1.0)[:, None, None]
    msgs = [""] * B
    big = np.nonzero(reason == 1)[0]
    if big.size:
        tau, q, info = sysm.tau_q(Y[big], idx[big])
        qmax = sysm.q_max(t[big], idx[big])
        # a singularity of the law has q -> 1/p <= q_max: a larger q is a transient of
        # oscillating growth (seen for l2 with singular K), not a blow-up
        isb = (np.isfinite(q) & (qmax > 0) & (q > 0.5 * qmax) & (q <= 1.5 * qmax)
               & (tau > 0))
        rem = np.where(isb, tau / np.where(isb, q, 1.0), np.nan)
        Sm, Mm = info["S"], info["M"]
        dS = Mm @ Sm
        dS = dS + np.swapaxes(dS, 1, 2)
        trj = np.trace(Sm, axis1=1, axis2=2)
        trd = np.trace(dS, axis1=1, axis2=2)
        pos = trj > 0
        trj_ = np.where(pos, trj, 1.0)
        # extrapolate the direction to T*: d(S/trS)/dt = (S' - Shat trS')/trS
        dhat = (dS - Sm / trj_[:, None, None] * trd[:, None, None]) / trj_[:, None, None]
        lim_b = _sym(Sm / trj_[:, None, None] + np.nan_to_num(rem)[:, None, None] * dhat)
        sel = big[isb]
        Tstar[sel] = t[sel] + rem[isb]
        lsel = isb & pos
        limit[big[lsel]] = lim_b[lsel]
        # messages from Python floats (formatting NumPy scalars is several times slower)
        nu_l, q_l, qm_l = info["nu"].tolist(), q.tolist(), qmax.tolist()
        t_l, T_l = t.tolist(), Tstar.tolist()
        for j, i in enumerate(big.tolist()):
            if isb[j]:
                status[i] = "blowup"
                msgs[i] = (f"finite-time blow-up: size {nu_l[j]:.3g} at t={t_l[i]:.10g}, "
                           f"q={q_l[j]:.4g} (power law exponent {1 / q_l[j]:.4g}), "
                           f"T*={T_l[i]:.12g}")
            else:
                status[i] = "diverging"
                why = (f"the {sysm.kind} law has bounded M (no finite-time blow-up)"
                       if qm_l[j] <= 0 else f"q={q_l[j]:.3g} <= {0.5 * qm_l[j]:g}"
                       if not q_l[j] > 0.5 * qm_l[j] else
                       f"q={q_l[j]:.3g} > {1.5 * qm_l[j]:g}: faster than the law allows "
                       f"(oscillating growth)")
                msgs[i] = (f"diverging without finite-time blow-up: size {nu_l[j]:.3g} "
                           f"at t={t_l[i]:.6g}, {why}")
    for i in np.nonzero(reason == 2)[0]:
        status[i] = "converged"
        msgs[i] = f"converged at t={t[i]:.6g} (relative rates <= {converge_tol:g})"
    for i in np.nonzero(reason == 0)[0]:
        msgs[i] = msgs[i] or f"reached t={t[i]:.6g} undecided"
    return status, Tstar, limit, msgs


def _breakpoints(atts: Sequence[Attention], t_max: float) -> list[float]:
    bps: set[float] = set()
    for a in atts:
        for name in ("Q", "K", "V", "W_O"):
            v = getattr(a, name)
            if isinstance(v, Layers):
                for l in range(1, v.n_layers):
                    tb = v.t0 + l * v.layer_time
                    if 0.0 < tb < t_max:
                        bps.add(float(tb))
    return sorted(bps)


def _check_solver_args(t_max: float, rtol: float, atol: float, blowup_threshold: float,
                       converge_tol: float) -> None:
    for n, v in (("t_max", t_max), ("rtol", rtol), ("atol", atol),
                 ("blowup_threshold", blowup_threshold), ("converge_tol", converge_tol)):
        if not (isinstance(v, (int, float, np.floating, np.integer)) and np.isfinite(v) and v > 0):
            raise ValueError(f"{n} must be a finite number > 0, got {v!r}")
    if rtol < 1e-14:
        raise ValueError(f"rtol must be >= 1e-14, got {rtol}")


# =========================================================================== solve
def solve(att: Attention, mean0: Any, cov0: Any, *, t_max: float, rtol: float = 1e-10,
          atol: float = 1e-12, blowup_threshold: float = 1e8, converge_tol: float = 1e-10,
          t_eval: Any = None) -> GaussianTrajectory:
    r"""Integrate the Gaussian moment ODEs from :math:`\mathcal N(\alpha_0, \Sigma_0)` up to ``t_max``.

    Uses :func:`scipy.integrate.solve_ivp` (DOP853) on the reparametrised system of the module
    docstring (:math:`\Sigma = FF^\top`, time :math:`s` with :math:`ds = (1 + \kappa\nu)dt`),
    with terminal events ``size = blowup_threshold``, convergence and ``t = t_max``;
    piecewise-constant :class:`Layers` parameters are integrated segment by segment.

    Parameters
    ----------
    att : Attention
        Unmasked ``softmax``, ``linear``, ``l2`` or ``sinkhorn`` attention (time-dependent allowed).
    mean0 : array_like (d,)
    cov0 : array_like (d, d)
        Symmetric PSD (singular allowed; the rank is preserved).
    t_max : float
        Final time.
    rtol, atol : float
        Tolerances of the integrator (``atol`` also floors the convergence test).
    blowup_threshold : float
        Size :math:`\nu = \operatorname{tr}\Sigma` (:math:`+|\alpha|^2` for ``linear``) at which
        the run is classified as blow-up or diverging.
    converge_tol : float
        Relative rate below which the run is ``"converged"``.
    t_eval : array_like, optional
        Times at which to report the state (dense output, inverted in ``s``); by default the
        accepted steps.

    Returns
    -------
    GaussianTrajectory
    """
    att = _check_att(att)
    m0, c0 = _check_mean_cov(mean0, cov0, att.d, "mean0", "cov0")
    _check_solver_args(t_max, rtol, atol, blowup_threshold, converge_tol)
    return _solve_core(att, 0.0, m0, _psd_factor(c0), t_max=float(t_max), rtol=rtol, atol=atol,
                       blowup_threshold=blowup_threshold, converge_tol=converge_tol,
                       t_eval=t_eval)


_STIFF_STEPS = 1500  # explicit steps per segment before switching to the implicit Radau method
_IMPLICIT_STEPS = 500  # Radau steps per segment before giving up ("running", with a message)
_STIFF_STEPS_BATCH = 4000  # step attempts per member of solve_batch before the Radau hand-off


def _solve_core(att: Attention, t0: float, m0: np.ndarray, F0: np.ndarray, *, t_max: float,
                rtol: float, atol: float, blowup_threshold: float, converge_tol: float,
                t_eval: Any, method: str = "DOP853") -> GaussianTrajectory:
    r""":func:`solve` from time ``t0`` and factor ``F0`` (inputs already validated).

    Integrates with ``method`` (DOP853) and switches to Radau once a segment has taken
    ``_STIFF_STEPS`` explicit steps (stiffness: e.g. a collapsing eigen-direction of
    :math:`\Sigma` decaying much faster than the rest evolves)."""
    sysm = _System([att], 1)
    idx = np.zeros(1, dtype=int)
    Y0 = sysm.pack(np.array([t0]), m0[None], F0[None], idx)[0]
    log_thr = math.log(blowup_threshold)
    atol_vec = np.full(sysm.n, atol)
    atol_vec[1] = rtol            # rho is a log: its error is a relative error of F
    stops = [b for b in _breakpoints([att], t_max) if b > t0] + [float(t_max)]
    if float(np.exp(sysm.log_size(Y0[None], idx))[0]) >= blowup_threshold:
        raise ValueError(f"the initial size already exceeds blowup_threshold={blowup_threshold}")

    seg_y: list[np.ndarray] = []
    sols: list[tuple[Any, float, float]] = []
    nfev = 0
    reason = 0
    s0 = 0.0
    t_lo = t0
    Y = Y0

    def fun(_s, y):
        return sysm.rhs(y[None], idx)[0]

    def ev_size(_s, y):
        return float(sysm.log_size(y[None], idx)[0]) - log_thr
    ev_size.terminal = True
    ev_size.direction = 1

    def ev_conv(_s, y):
        return math.log(max(float(sysm.conv_measure(y[None], idx, atol)[0]), 1e-300)) \
            - math.log(converge_tol)
    ev_conv.terminal = True
    ev_conv.direction = -1

    for stop in stops:
        eta = 1e-7 * max(1.0, abs(stop))
        sysm.lo[:] = t_lo + min(eta, 0.25 * (stop - t_lo))
        sysm.hi[:] = stop - min(eta, 0.25 * (stop - t_lo))

        def ev_time(_s, y, stop=stop):
            return y[0] - stop
        ev_time.terminal = True
        ev_time.direction = 1

        seg_done = False
        while not seg_done:
            if float(sysm.conv_measure(Y[None], idx, atol)[0]) <= converge_tol:
                reason = 2          # already stationary: events only see sign changes
                break
            count = [0, math.inf]

            def ev_budget(s_, y, count=count):
                # a function of s only (root finding re-evaluates it): positive until the
                # step budget is spent, then crosses zero just before the current step's end
                count[0] += 1
                if count[0] > (_STIFF_STEPS if method != "Radau" else _IMPLICIT_STEPS) \
                        and count[1] == math.inf:
                    count[1] = s_ - 1e-12 * max(1.0, abs(s_))
                return count[1] - s_ if count[1] < math.inf else 1.0
            ev_budget.terminal = True
            events = [ev_size, ev_time, ev_conv, ev_budget]
            t_start = float(Y[0])
            # unbounded s-span: the events (size, t = stop, convergence) end each segment
            sol = solve_ivp(fun, (s0, 1e300), Y, method=method, rtol=rtol, atol=atol_vec,
                            events=events, dense_output=True)
            nfev += sol.nfev
            if sol.status == -1:
                raise RuntimeError(f"solve_ivp failed: {sol.message}")
            seg_done = True
            if sol.t_events[0].size:
                reason = 1
                Y = sol.y_events[0][0]
            elif sol.t_events[2].size:
                reason = 2
                Y = sol.y_events[2][0]
            elif sol.t_events[1].size:
                reason = 0
                Y = sol.y_events[1][0].copy()
                Y[0] = stop
            elif sol.t_events[3].size and method != "Radau":
                logger.info("solve: stiff at t=%.6g, switching to Radau", sol.y_events[3][0][0])
                Y = sol.y_events[3][0]
                method = "Radau"
                seg_done = False
            elif sol.t_events[3].size:
                reason = 4       # step budget of the implicit method spent as well
                Y = sol.y_events[3][0]
            else:  # pragma: no cover - span is huge
                reason = 0
                Y = sol.y[:, -1]
            s_end = float(sol.t_events[[i for i, e in enumerate(sol.t_events) if e.size][0]][0]) \
                if any(e.size for e in sol.t_events) else float(sol.t[-1])
            keep = sol.t < s_end
            seg_y.append(np.vstack([sol.y.T[keep], Y[None]]))
            sols.append((sol, t_start, float(Y[0])))
            s0 = s_end
        t_lo = stop
        if reason != 0:
            break

    status, Tstar, limit, msgs = _finish(sysm, Y[None], idx, converge_tol,
                                         np.array([0 if reason == 4 else reason]))
    if reason == 4:
        msgs[0] = (f"stopped at t={Y[0]:.6g}: step budget ({_STIFF_STEPS} explicit + "
                   f"{_IMPLICIT_STEPS} implicit steps per segment) spent")
        logger.warning("Gaussian solve: %s", msgs[0])
    if not seg_y:
        seg_y = [Y[None]]
    Yall = np.vstack(seg_y)
    if t_eval is None:
        t_all, means, covs = sysm.moments(Yall, np.zeros(len(Yall), int))
    else:
        te = np.sort(np.asarray(t_eval, float).ravel())
        t_end = float(Y[0])
        te = te[(te >= t0) & (te <= t_end)]
        rows = []
        done = np.zeros(te.size, bool)
        for sol, lo_t, hi_t in sols:
            sel = ~done & (te >= lo_t) & (te <= hi_t)
            if np.any(sel):
                rows.append(_invert_time(sol.sol, sel, te))
                done |= sel
        if not sols:
            rows = [np.repeat(Y[None], int(np.sum(te == t0)), axis=0)]
        Ye = np.vstack(rows) if rows else np.zeros((0, sysm.n))
        _, means, covs = sysm.moments(Ye, np.zeros(len(Ye), int))
        t_all = te[:len(Ye)]
    _, fm, fc = sysm.moments(Y[None], idx)
    return GaussianTrajectory(np.asarray(t_all), means, covs, status[0], float(Tstar[0]),
                              limit[0], float(Y[0]), msgs[0], nfev, fm[0], fc[0])


def _invert_time(dense, sel: np.ndarray, te: np.ndarray) -> np.ndarray:
    """States at times ``te[sel]`` from a dense output in ``s`` (bisection; t(s) increasing)."""
    targets = te[sel]
    lo = np.full(targets.shape, dense.t_min)
    hi = np.full(targets.shape, dense.t_max)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        tm = dense(mid)[0]
        below = tm < targets
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
        if np.all(hi - lo <= 4e-16 * np.maximum(np.abs(hi), 1.0)):
            break
    Ys = np.atleast_2d(dense(0.5 * (lo + hi)).T)
    Ys[:, 0] = targets
    return Ys


# =========================================================================== batch integrator
# Dormand-Prince 5(4) tableau (FSAL); local extrapolation with the 5th-order solution.
_DP_A = [
    [],
    [1 / 5],
    [3 / 40, 9 / 40],
    [44 / 45, -56 / 15, 32 / 9],
    [19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729],
    [9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656],
]
_DP_B = np.array([35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84])
_DP_E = np.array([71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40])


# --------------------------------------------------------------------------- compiled fast path
try:  # numba is optional: the NumPy integrator below is the reference implementation
    import numba as _nb
except ImportError:  # pragma: no cover
    _nb = None


def _dop853_tableau() -> tuple[np.ndarray, ...]:
    """Coefficients of scipy's DOP853 (a private scipy module: without it, no fast path)."""
    try:
        from scipy.integrate._ivp import dop853_coefficients as c  # noqa: PLC0415
    except ImportError:  # pragma: no cover
        return ()
    s = c.N_STAGES
    return (np.ascontiguousarray(c.A[:s, :s], float), np.ascontiguousarray(c.B, float),
            np.ascontiguousarray(c.E5, float), np.ascontiguousarray(c.E3, float))


_DOP853 = _dop853_tableau() if _nb is not None else ()


# The per-member loop for softmax / linear with constant parameters: the NumPy path's algorithm
# (per-member step control, landing on stops, events) with the 8th-order DOP853 pair instead of
# Dormand--Prince 5(4): at rtol 1e-10 it needs about 0.6x the right-hand-side evaluations.
def _nb_rhs(y, out, d, linear, Vf, Ah, kap, S, S2, M, T, MG, al, bvec, dmean):
    """dY/ds of one member into ``out``; leaves S, M, alpha, alpha' in the scratch arrays
    (read by :func:`_nb_conv`) and returns the size nu."""
    n_g = d * d
    rho = y[1]
    g2 = 0.0
    for i in range(n_g):
        g2 += y[2 + i] * y[2 + i]
    e2r = np.exp(2.0 * rho)
    trS = e2r * g2
    phi = np.sqrt(1.0 + kap * trS)
    for i in range(d):
        al[i] = phi * y[2 + n_g + i]
    for i in range(d):
        for j in range(i + 1):
            acc = 0.0
            for k in range(d):
                acc += y[2 + i * d + k] * y[2 + j * d + k]
            S[i, j] = e2r * acc
            S[j, i] = S[i, j]
            S2[i, j] = S[i, j] + (al[i] * al[j] if linear else 0.0)
            S2[j, i] = S2[i, j]
    for i in range(d):
        bvec[i] = 0.0
        for j in range(d):
            M[i, j] = 0.0
    H = Vf.shape[0]
    for h in range(H):
        # T = S2 @ A_h ; M += Vf_h @ T
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for k in range(d):
                    acc += S2[i, k] * Ah[h, k, j]
                T[i, j] = acc
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for k in range(d):
                    acc += Vf[h, i, k] * T[k, j]
                M[i, j] += acc
        if not linear:
            for i in range(d):
                acc = 0.0
                for k in range(d):
                    acc += Vf[h, i, k] * al[k]
                bvec[i] += acc
    gmg = 0.0
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for k in range(d):
                acc += M[i, k] * y[2 + k * d + j]
            MG[i, j] = acc
            gmg += y[2 + i * d + j] * acc
    mu = gmg / g2 if g2 > 0 else 0.0
    a2 = 0.0
    for i in range(d):
        acc = bvec[i]
        for k in range(d):
            acc += M[i, k] * al[k]
        dmean[i] = acc
        a2 += al[i] * al[i]
    nu = trS + (a2 if linear else 0.0)
    w = 1.0 + kap * nu
    iw = 1.0 / w
    dtrS = 2.0 * e2r * gmg
    dlogphi = 0.5 * kap * dtrS / (phi * phi)
    out[0] = iw
    out[1] = mu * iw
    for i in range(d):
        for j in range(d):
            out[2 + i * d + j] = (MG[i, j] - mu * y[2 + i * d + j]) * iw
    ipw = iw / phi
    for i in range(d):
        out[2 + n_g + i] = (dmean[i] - al[i] * dlogphi) * ipw
    return nu


def _nb_conv(d, S, M, al, dmean, atol):
    """Convergence measure of :meth:`_System.conv_measure` from the scratch of the last
    :func:`_nb_rhs` call (evaluated once per accepted step, not per stage)."""
    nS = 0.0
    ndS = 0.0
    for i in range(d):
        for j in range(d):
            nS += S[i, j] * S[i, j]
            acc = 0.0
            for k in range(d):
                acc += M[i, k] * S[k, j] + S[i, k] * M[j, k]
            ndS += acc * acc
    nS = np.sqrt(nS)
    rS = np.sqrt(ndS) / (nS + atol)
    dm = 0.0
    a2 = 0.0
    for i in range(d):
        dm += dmean[i] * dmean[i]
        a2 += al[i] * al[i]
    rm = np.sqrt(dm) / (np.sqrt(a2) + np.sqrt(nS) + atol)
    return rS if rS > rm else rm


def _nb_member(m, Y, d, linear, Vfm, Ahm, km, rtol, atol_vec, atol, stops, eval_pos, thr,
               conv_tol, budget, traj, reason, n_steps, cA, cB, cE5, cE3):
    """DOP853 (Hairer--Norsett--Wanner: 12 stages, FSAL, 5th- and 3rd-order error estimates
    combined as in ``scipy.integrate.DOP853``) for member ``m``; all state is local, so
    members can run in parallel."""
    n = Y.shape[1]
    S = np.empty((d, d))
    S2 = np.empty((d, d))
    M = np.empty((d, d))
    T = np.empty((d, d))
    MG = np.empty((d, d))
    al = np.empty(d)
    bv = np.empty(d)
    dm = np.empty(d)
    ns = cB.shape[0]
    K = np.empty((ns + 1, n))
    ytmp = np.empty(n)
    ynew = np.empty(n)
    nst = stops.shape[0]
    y = Y[m].copy()
    _nb_rhs(y, K[0], d, linear, Vfm, Ahm, km, S, S2, M, T, MG, al, bv, dm)
    if _nb_conv(d, S, M, al, dm, atol) <= conv_tol:
        reason[m] = 2
        return
    # initial step (Hairer--Wanner heuristic)
    d0 = 0.0
    d1 = 0.0
    for i in range(n):
        sc = atol_vec[i] + rtol * abs(y[i])
        d0 += (y[i] / sc) ** 2
        d1 += (K[0, i] / sc) ** 2
    d0 = np.sqrt(d0 / n)
    d1 = np.sqrt(d1 / n)
    h = 1e-6 if (d0 < 1e-5 or d1 < 1e-5) else 0.01 * d0 / d1
    if h > 0.1:
        h = 0.1
    k = 0
    natt = 0
    nacc = 0
    res = -1
    while True:
        st = stops[k]
        gap = st - y[0]
        h_aim = gap / K[0, 0]
        aiming = h_aim <= h
        hh = h_aim if aiming else h
        for i in range(1, ns):
            for j in range(n):
                acc = 0.0
                for l in range(i):
                    acc += cA[i, l] * K[l, j]
                ytmp[j] = y[j] + hh * acc
            _nb_rhs(ytmp, K[i], d, linear, Vfm, Ahm, km, S, S2, M, T, MG, al, bv, dm)
        for j in range(n):
            acc = 0.0
            for l in range(ns):
                acc += cB[l] * K[l, j]
            ynew[j] = y[j] + hh * acc
        nu = _nb_rhs(ynew, K[ns], d, linear, Vfm, Ahm, km, S, S2, M, T, MG, al, bv, dm)
        e5 = 0.0
        e3 = 0.0
        finite = True
        for j in range(n):
            a5 = 0.0
            a3 = 0.0
            for l in range(ns + 1):
                a5 += cE5[l] * K[l, j]
                a3 += cE3[l] * K[l, j]
            sc = atol_vec[j] + rtol * max(abs(y[j]), abs(ynew[j]))
            e5 += (a5 / sc) ** 2
            e3 += (a3 / sc) ** 2
            if not np.isfinite(ynew[j]):
                finite = False
        if not finite:
            en = np.inf
        elif e5 == 0.0 and e3 == 0.0:
            en = 0.0
        else:
            en = abs(hh) * e5 / np.sqrt((e5 + 0.01 * e3) * n)
        ok = en <= 1.0
        tn = ynew[0]
        tol_l = 1e-12 * max(1.0, abs(st))
        over = ok and (tn > st + tol_l)
        landed = ok and (not over) and aiming and abs(tn - st) <= tol_l
        accept = ok and not over
        if en == 0.0:
            fac = 5.0
        elif np.isfinite(en):
            fac = min(5.0, max(0.2, 0.9 * en ** -0.125))
        else:
            fac = 0.2
        if not ok:
            fac = min(fac, 0.9)
        h_new = hh * fac
        if over:
            h_new = hh * gap / max(tn - y[0], 1e-300)
        if accept and aiming:
            h_new = max(h, h_new)
        natt += 1
        h = h_new
        if accept:
            nacc += 1
            y[:] = ynew
            K[0, :] = K[ns, :]
            if landed:
                y[0] = st
                if eval_pos[k] >= 0:
                    traj[m, eval_pos[k], :] = y
                if k == nst - 1:
                    res = 0
                    break
                k += 1
            if nu >= thr:
                res = 1
                break
            # S, M, alpha, alpha' in the scratch are those of ynew (the last RHS call)
            if _nb_conv(d, S, M, al, dm, atol) <= conv_tol:
                res = 2
                break
        if natt >= budget:
            res = 3
            break
    Y[m, :] = y
    reason[m] = res
    n_steps[m] = nacc


def _nb_run(Y, d, linear, Vf, Ah, kap, rtol, atol_vec, atol, stops, eval_pos, log_thr,
            conv_tol, budget, traj, reason, n_steps, cA, cB, cE5, cE3):
    """All members, one after the other (small batches: no thread start-up, quick compile)."""
    P = Vf.shape[0]
    thr = np.exp(log_thr)
    for m in range(Y.shape[0]):
        p = m if P > 1 else 0     # P is 1 (shared parameters) or B
        _nb_member(m, Y, d, linear, Vf[p], Ah[p], kap[p], rtol, atol_vec, atol, stops,
                   eval_pos, thr, conv_tol, budget, traj, reason, n_steps, cA, cB, cE5, cE3)


def _nb_run_par(Y, d, linear, Vf, Ah, kap, rtol, atol_vec, atol, stops, eval_pos, log_thr,
                conv_tol, budget, traj, reason, n_steps, cA, cB, cE5, cE3):
    """All members in parallel (``prange``): each member's state is local to
    :func:`_nb_member` and it writes only its own rows of the outputs."""
    P = Vf.shape[0]
    thr = np.exp(log_thr)
    for m in _prange(Y.shape[0]):
        mi = np.int64(m)          # (a prange index may be unsigned: keep integer arithmetic)
        p = mi if P > 1 else np.int64(0)
        _nb_member(mi, Y, d, linear, Vf[p], Ah[p], kap[p], rtol, atol_vec, atol, stops,
                   eval_pos, thr, conv_tol, budget, traj, reason, n_steps, cA, cB, cE5, cE3)


_prange = range
_PAR_MIN_MEMBERS = 256   # batches at least this large use the parallel kernel
if _nb is not None:
    _prange = _nb.prange
    _nb_rhs = _nb.njit(cache=True, inline="always")(_nb_rhs)
    _nb_conv = _nb.njit(cache=True)(_nb_conv)
    _nb_member = _nb.njit(cache=True)(_nb_member)
    _nb_run = _nb.njit(cache=True)(_nb_run)
    _nb_run_par = _nb.njit(cache=True, parallel=True)(_nb_run_par)


def _fast_path(sysm: "_System", atts: Sequence[Attention], Y: np.ndarray, stops: np.ndarray,
               eval_pos: np.ndarray, rtol: float, atol_vec: np.ndarray, atol: float,
               log_thr: float, conv_tol: float, budget: int, traj: np.ndarray):
    d = sysm.d
    Vf, Ah = [], []
    for a in atts:
        p = a.at(0.0)
        W = np.eye(d) if p.W_O is None else p.W_O
        Vf.append(np.stack([W[:, hd.rows] @ hd.V for hd in p.heads]))
        Ah.append(np.stack([p.beta * hd.A for hd in p.heads]))
    B = Y.shape[0]
    reason = np.full(B, -1, dtype=np.int64)
    n_steps = np.zeros(B, dtype=np.int64)
    par = B >= _PAR_MIN_MEMBERS and _nb.get_num_threads() > 1
    run = _nb_run_par if par else _nb_run
    with _nb.parallel_chunksize(8):   # dynamic scheduling: members differ in cost
        run(Y, d, sysm.kind == "linear", np.ascontiguousarray(np.stack(Vf)),
                np.ascontiguousarray(np.stack(Ah)), np.ascontiguousarray(sysm.kappa, float),
                float(rtol), atol_vec, float(atol), stops, eval_pos, float(log_thr),
                float(conv_tol), int(budget), traj, reason, n_steps, *_DOP853)
    return reason, n_steps


def solve_batch(att: Attention | Sequence[Attention], means0: Any, covs0: Any, *, t_max: float,
                rtol: float = 1e-10, atol: float = 1e-12, blowup_threshold: float = 1e8,
                converge_tol: float = 1e-10, t_eval: Any = None, max_steps: int = 100_000,
                use_numba: bool = True) -> GaussianBatch:
    r"""Integrate many Gaussian initial conditions (and optionally parameter sets) together.

    All members are advanced simultaneously by one vectorised adaptive Dormand--Prince 5(4)
    integrator (DOP853 on the numba path, see ``use_numba``) on the reparametrised system of
    the module docstring, **with a step size, error control and event handling per member** (NumPy arrays of shape ``(B, ...)``; members
    that terminate leave the active set).  Members land exactly (to :math:`10^{-12}` relative)
    on ``t_eval`` points, :class:`Layers` breakpoints and ``t_max`` by secant-adjusted steps in
    :math:`s`.  Statuses and :math:`T^*` follow :func:`solve` (same classification), and the
    results agree with :func:`solve` member by member to about ``1e3 * rtol``.

    Parameters
    ----------
    att : Attention or sequence of B Attention
        One specification for all members, or one per member (same kind, ``d`` and heads).
    means0 : array_like (B, d)
    covs0 : array_like (B, d, d)
    t_max, rtol, atol, blowup_threshold, converge_tol
        As in :func:`solve`.
    t_eval : array_like (T,), optional
        Common output times; ``traj_means`` / ``traj_covs`` hold NaN after a member terminated.
    max_steps : int
        Step attempts per member of the explicit method, capped at 4000; a member that needs
        more (typically a stiff one: a collapsing direction of :math:`\Sigma` decaying much
        faster than the rest evolves) is continued alone with the implicit Radau method (see :func:`solve`).
    use_numba : bool
        For ``softmax`` / ``linear`` with constant parameters, run the same per-member
        algorithm compiled with numba, with the 8th-order DOP853 pair instead of
        Dormand--Prince 5(4) (about 0.6x the right-hand-side evaluations at ``rtol = 1e-10``),
        one member after the other, or, from 256 members on, in parallel over members
        (``prange``, numba's thread count; members are independent, so the results are
        identical).  The first call compiles (~10 s, ~20 s with the parallel kernel; cached on
        disk).  Otherwise, or with ``False`` (or without numba), the NumPy implementation.

    Returns
    -------
    GaussianBatch
    """
    if isinstance(att, Attention):
        atts = [_check_att(att)]
    else:
        atts = [_check_att(a) for a in att]
        if not atts:
            raise ValueError("att must be an Attention or a non-empty sequence of them")
        a0 = atts[0]
        for i, a in enumerate(atts):
            if (a.kind, a.d, a.heads, a.W_O is None) != (a0.kind, a0.d, a0.heads, a0.W_O is None):
                raise ValueError(f"att[{i}] differs from att[0] in kind, d, heads or W_O presence")
    d = atts[0].d
    m0, c0 = _check_mean_cov(means0, covs0, d, "means0", "covs0", batch=True)
    B = m0.shape[0]
    if len(atts) > 1 and len(atts) != B:
        raise ValueError(f"att has {len(atts)} members but means0 has {B}")
    _check_solver_args(t_max, rtol, atol, blowup_threshold, converge_tol)
    sysm = _System(atts, B)
    all_idx = np.arange(B)
    Y = sysm.pack(np.zeros(B), m0, _psd_factor(c0), all_idx)
    log_thr = math.log(blowup_threshold)
    if np.any(sysm.log_size(Y, all_idx) >= log_thr):
        i = int(np.argmax(sysm.log_size(Y, all_idx)))
        raise ValueError(f"member {i}: the initial size already exceeds blowup_threshold")
    n = sysm.n
    atol_vec = np.full(n, atol)
    atol_vec[1] = rtol

    te = None if t_eval is None else np.unique(np.asarray(t_eval, float).ravel())
    if te is not None:
        te = te[(te >= 0) & (te <= t_max)]
    stops = np.unique(np.concatenate([
        np.asarray(_breakpoints(atts, t_max), float),
        np.array([float(t_max)]),
        te[te > 0] if te is not None else np.zeros(0)]))
    traj_m = traj_c = None
    if te is not None:
        traj_m = np.full((B, te.size, d), np.nan)
        traj_c = np.full((B, te.size, d, d), np.nan)
        if te.size and te[0] == 0.0:
            traj_m[:, 0] = m0
            traj_c[:, 0] = c0
    te_pos = {float(v): i for i, v in enumerate(te)} if te is not None else {}
    eval_pos = np.array([te_pos.get(float(v), -1) for v in stops], dtype=np.int64)
    # full states landed on at t_eval (row eval_pos[k] for stop k), NaN until reached; both
    # integrators fill it, the moments are taken once after them
    trY = np.full((B, 1 if te is None else max(te.size, 1), n), np.nan)

    kstop = np.zeros(B, dtype=int)
    t_prev_stop = np.zeros(B)

    def set_window(ia):
        st = stops[kstop[ia]]
        lo = t_prev_stop[ia]
        eta = np.minimum(1e-7 * np.maximum(1.0, np.abs(st)), 0.25 * (st - lo))
        sysm.lo[ia] = lo + eta
        sysm.hi[ia] = st - eta

    set_window(all_idx)
    fast = (use_numba and _nb is not None and len(_DOP853) == 4 and not sysm.dynamic
            and sysm.kind in ("softmax", "linear"))
    if fast:
        # the compiled kernel does the initial convergence check and step choice per member
        reason, n_steps = _fast_path(sysm, atts, Y, stops, eval_pos, rtol, atol_vec, atol,
                                     log_thr, converge_tol, min(max_steps, _STIFF_STEPS_BATCH),
                                     trY)
        active = np.zeros(B, dtype=bool)
    else:
        f = sysm.rhs(Y, all_idx)
        conv0 = sysm.conv_measure(Y, all_idx, atol) <= converge_tol
        reason = np.where(conv0, 2, -1)
        active = ~conv0
        # initial step (Hairer-Wanner heuristic, vectorised)
        scale = atol_vec + rtol * np.abs(Y)
        d0 = np.sqrt(np.mean((Y / scale) ** 2, axis=1))
        d1 = np.sqrt(np.mean((f / scale) ** 2, axis=1))
        h = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.maximum(d1, 1e-300))
        h = np.minimum(h, 0.1)
        n_steps = np.zeros(B, dtype=int)
        n_att = np.zeros(B, dtype=int)
    land_tol = 1e-12

    # the NumPy integrator (no member is active after the numba path)
    while np.any(active):
        ia = np.nonzero(active)[0]
        yA, fA, hA = Y[ia], f[ia], h[ia]
        st = stops[kstop[ia]]
        gap = st - yA[:, 0]
        h_aim = gap / fA[:, 0]                  # dt/ds = fA[:,0]
        aiming = h_aim <= hA
        hA = np.where(aiming, h_aim, hA)
        K = [fA]
        for i in range(1, 6):
            acc = np.zeros_like(yA)
            for j, a in enumerate(_DP_A[i]):
                if a != 0.0:
                    acc += a * K[j]
            K.append(sysm.rhs(yA + hA[:, None] * acc, ia))
        acc = np.zeros_like(yA)
        for j in range(6):
            if _DP_B[j] != 0.0:
                acc += _DP_B[j] * K[j]
        ynew = yA + hA[:, None] * acc
        fnew = sysm.rhs(ynew, ia)
        K.append(fnew)
        err = np.zeros_like(yA)
        for j in range(7):
            if _DP_E[j] != 0.0:
                err += _DP_E[j] * K[j]
        err *= hA[:, None]
        sc = atol_vec + rtol * np.maximum(np.abs(yA), np.abs(ynew))
        en = np.sqrt(np.mean((err / sc) ** 2, axis=1))
        en = np.where(np.all(np.isfinite(ynew), axis=1), en, np.inf)
        ok = en <= 1.0
        tn = ynew[:, 0]
        over = ok & (tn > st + land_tol * np.maximum(1.0, np.abs(st)))
        landed = ok & ~over & aiming & (np.abs(tn - st) <= land_tol * np.maximum(1.0, np.abs(st)))
        accept = ok & ~over
        fac = np.where(en == 0, 5.0, np.clip(0.9 * np.where(en > 0, en, 1.0) ** -0.2, 0.2, 5.0))
        fac = np.where(ok, fac, np.minimum(fac, 0.9))
        h_new = hA * fac
        # overshoot of a stop: secant correction in s
        h_new = np.where(over, hA * gap / np.maximum(tn - yA[:, 0], 1e-300), h_new)
        # after an aimed, accepted step keep the previous (larger) proposal
        h_new = np.where(accept & aiming, np.maximum(h[ia], h_new), h_new)
        n_att[ia] += 1
        n_steps[ia] += accept
        acc_i = ia[accept]
        Y[acc_i] = ynew[accept]
        f[acc_i] = fnew[accept]
        h[ia] = h_new
        # landings
        for j in np.nonzero(landed)[0]:
            i = ia[j]
            Y[i, 0] = stops[kstop[i]]
            tt = float(stops[kstop[i]])
            if eval_pos[kstop[i]] >= 0:
                trY[i, eval_pos[kstop[i]]] = Y[i]
            t_prev_stop[i] = tt
            if kstop[i] == stops.size - 1:
                reason[i] = 0
                active[i] = False
            else:
                kstop[i] += 1
                set_window(np.array([i]))
                f[i] = sysm.rhs(Y[i:i + 1], np.array([i]))[0]
        # events on accepted, still-active members
        chk = acc_i[active[acc_i]]
        if chk.size:
            big = sysm.log_size(Y[chk], chk) >= log_thr
            reason[chk[big]] = 1
            active[chk[big]] = False
            rest = chk[~big]
            if rest.size:
                conv = sysm.conv_measure(Y[rest], rest, atol) <= converge_tol
                reason[rest[conv]] = 2
                active[rest[conv]] = False
        stiff = active & (n_att >= min(max_steps, _STIFF_STEPS_BATCH))
        if np.any(stiff):
            reason[stiff] = 3
            active[stiff] = False

    if te is not None:
        bi, ti = np.nonzero(np.isfinite(trY[:, :, 0]))
        if bi.size:
            _, mm, SS = sysm.moments(trY[bi, ti], bi)
            traj_m[bi, ti] = mm
            traj_c[bi, ti] = SS

    status, Tstar, limit, msgs = _finish(sysm, Y, all_idx, converge_tol,
                                         np.where(reason == 3, 0, reason))
    t_fin, means, covs = sysm.moments(Y, all_idx)
    # members that became stiff: continue one by one with the implicit Radau method
    for i in np.nonzero(reason == 3)[0]:
        logger.info("solve_batch: member %d stiff at t=%.6g, continuing with Radau", i, t_fin[i])
        a_i = atts[i] if len(atts) > 1 else atts[0]
        F_i = np.exp(Y[i, 1]) * Y[i, 2:2 + d * d].reshape(d, d)
        rem = None if te is None else te[te > t_fin[i]]
        tr = _solve_core(a_i, float(t_fin[i]), means[i], F_i, t_max=float(t_max), rtol=rtol,
                         atol=atol, blowup_threshold=blowup_threshold,
                         converge_tol=converge_tol, t_eval=rem, method="Radau")
        status[i], Tstar[i], limit[i], msgs[i] = tr.status, tr.blowup_time, tr.limit, tr.message
        t_fin[i] = tr.t_final
        if te is not None and len(tr.times):
            pos = np.searchsorted(te, tr.times)
            traj_m[i, pos] = tr.means
            traj_c[i, pos] = tr.covs
        means[i], covs[i] = tr.final_mean, tr.final_cov
        n_steps[i] += tr.nfev // 8
    return GaussianBatch(np.array(status), Tstar, t_fin, means, covs, limit, n_steps, te,
                         traj_m, traj_c, msgs)
