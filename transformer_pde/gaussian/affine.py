r"""Affine velocity fields of Gaussian token measures, and the argument checks shared by the
Gaussian solvers.

For :math:`\mu = \mathcal N(\alpha, \Sigma)` the softmax, linear, L2 and Sinkhorn attention
fields are affine, :math:`\Gamma_\mu(x) = Mx + b` (:func:`affine_field`); the moment ODEs are
:math:`\alpha' = M\alpha + b`, :math:`\Sigma' = M\Sigma + \Sigma M^\top` (:func:`moment_ode`).

The lower-case helpers without a leading underscore (``check_attention``, ``check_mean_cov``,
``psd_factor``, ``sym``, ``ParamBatch``, ``stack_params``, ``head_affine``, ``affine_batch``)
are shared with the sibling modules of :mod:`transformer_pde.gaussian`; they are not part of
the package's public API (not in ``__all__``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import validation
from ..attention import KINDS, Attention, AttentionParams
from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["affine_field", "moment_ode", "sinkhorn_cross_covariance"]


# =========================================================================== validation
def check_attention(att: Any) -> Attention:
    if not isinstance(att, Attention):
        raise ArgumentTypeError(f"att must be an Attention, got {type(att).__name__}")
    if not KINDS[att.kind].affine_on_gaussians:
        raise ArgumentError(
            f"att.kind={att.kind!r} is not affine on Gaussian measures (Gaussians do not stay "
            "Gaussian); the Gaussian module supports "
            f"{sorted(k for k, v in KINDS.items() if v.affine_on_gaussians)}")
    if att.masked:
        raise ArgumentError("att.masked=True is not supported by the Gaussian module: a masked "
                         "flow acts on (position, x) measures; use the particle engine")
    if getattr(att, "rotary", None) is not None:
        raise ArgumentError(
            "att.rotary is set: rotary positions rotate queries and keys by token positions, "
            "which Gaussian measures do not carry; use the particle engine (simulate)")
    if getattr(att, "alibi", None) is not None:
        raise ArgumentError(
            "att.alibi is set: ALiBi biases the scores by token positions, which Gaussian "
            "measures do not carry; use the particle engine (simulate)")
    if att.has_bias:
        # The field stays affine on Gaussians with biases (softmax: the tilt becomes
        # beta K^T (Q x + b_Q), values V y + b_V, output + b_O; b_K cancels), but the closed
        # forms and compiled solvers here take linear maps only.
        raise ArgumentError(
            "att has bias vectors (b_Q/b_K/b_V/b_O): the Gaussian module does not implement "
            "affine query/key/value maps yet; use the particle engine (simulate)")
    return att


#: Largest ``|mean|`` entry and ``|cov|`` entry the Gaussian module accepts: the moment
#: equations form products of up to three moments (e.g. :math:`\alpha^\top\Sigma A\alpha`,
#: :math:`\Sigma A \Sigma`), which stay below the float64 range (1.8e308) from here.
MOMENT_MAX = 1e100


def check_time(name: str, t: Any) -> float:
    """A finite real time (bools, complex numbers, NaN and inf rejected)."""
    return validation.scalar(name, t)


def check_mean_cov(mean: Any, cov: Any, d: int, mname: str = "mean", cname: str = "cov",
                   batch: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Real finite mean(s) and covariance(s) under the package's one PSD rule
    (:func:`transformer_pde.validation.covariance`), entries at most :data:`MOMENT_MAX` in
    magnitude; returns the symmetric part."""
    m = validation.finite_array(mname, mean)
    if m.size and float(np.max(np.abs(m))) > MOMENT_MAX:
        raise ArgumentError(f"{mname} must have entries of magnitude <= {MOMENT_MAX:g} (the "
                            f"moment equations square it), got max |{mname}| = "
                            f"{float(np.max(np.abs(m))):.3g}: rescale the problem")
    if batch:
        if m.ndim != 2 or m.shape[1] != d:
            raise ArgumentError(f"{mname} must have shape (B, d) = (B, {d}), got {m.shape}")
        c = validation.real_array(cname, cov)
        if c.ndim != 3 or c.shape[1:] != (d, d) or c.shape[0] != m.shape[0]:
            raise ArgumentError(f"{cname} must have shape (B, d, d) = ({m.shape[0]}, {d}, {d}), "
                                f"got {c.shape}")
    elif m.shape != (d,):
        raise ArgumentError(f"{mname} must have shape (d,) = ({d},), got {m.shape}")
    c = validation.covariance(cname, cov, d, batch=batch)
    if c.size and float(np.max(np.abs(c))) > MOMENT_MAX:
        raise ArgumentError(f"{cname} must have entries of magnitude <= {MOMENT_MAX:g} (the "
                            f"moment equations multiply it by itself), got max |{cname}| = "
                            f"{float(np.max(np.abs(c))):.3g}: rescale the problem")
    return m, c


def psd_factor(cov: np.ndarray) -> np.ndarray:
    """Symmetric square root ``F`` (``F F^T = cov``) of validated PSD matrices (..., d, d);
    eigenvalues at round-off level below zero (>= -1e-12 tr, checked) are set to 0."""
    lam, U = np.linalg.eigh(cov)
    return (U * np.sqrt(np.maximum(lam, 0.0))[..., None, :]) @ np.swapaxes(U, -1, -2)


# =========================================================================== affine fields
@dataclass
class ParamBatch:
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

    def take(self, idx: np.ndarray) -> "ParamBatch":
        if self.P == 1:
            return self
        return ParamBatch(self.kind, self.d, [q[idx] for q in self.Q], [k[idx] for k in self.K],
                       [v[idx] for v in self.V], self.rows,
                       None if self.W_O is None else self.W_O[idx],
                       self.beta[idx], self.eps[idx], self.l2b[idx])


def stack_params(ps: Sequence[AttentionParams]) -> ParamBatch:
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
    return ParamBatch(p0.kind, p0.d, Q, K, V, rows, W,
                   np.array([p.beta for p in ps], float), np.array([p.eps for p in ps], float),
                   np.array([p.l2_beta for p in ps], float))


def sym(X: np.ndarray) -> np.ndarray:
    return 0.5 * (X + np.swapaxes(X, -1, -2))


def head_affine(kind: str, Q: np.ndarray, K: np.ndarray, V: np.ndarray, beta: np.ndarray,
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
            F = psd_factor(S)
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
    else:  # pragma: no cover - guarded by check_attention
        raise ValueError(f"kind {kind!r} is not affine on Gaussians")
    return M, b


def affine_batch(pb: ParamBatch, mean: np.ndarray, S: np.ndarray, F: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    B, d = mean.shape
    M = np.zeros((B, d, d))
    b = np.zeros((B, d))
    for Q, K, V, rows in zip(pb.Q, pb.K, pb.V, pb.rows, strict=True):
        Mh, bh = head_affine(pb.kind, Q, K, V, pb.beta, pb.eps, pb.l2b, mean, S, F)
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
      Schrödinger potential extended to all :math:`x`.  On the support it equals the form
      :math:`M = VC^\top S^{-1}` of the project's conventions (``docs/conventions.md``) with
      :math:`C = 2S^{1/2}(\varepsilon I + R)^{-1}S^{1/2}A^\top S`,
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
        Time at which time-dependent parameters are evaluated (finite).

    Returns
    -------
    M : ndarray, shape (d, d)
    b : ndarray, shape (d,)

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Non-affine kind (sigmoid/relu/exp), masked attention, wrong shapes or types, NaN or
        inf, non-symmetric or indefinite ``cov``, entries of ``mean`` or ``cov`` above
        :data:`MOMENT_MAX`, non-finite ``t``; a field that overflows.
    """
    att = check_attention(att)
    m, c = check_mean_cov(mean, cov, att.d)
    t = check_time("t", t)
    pb = stack_params([att.at(t)])
    with np.errstate(over="ignore", invalid="ignore"):
        M, b = affine_batch(pb, m[None], c[None])
    if not (np.all(np.isfinite(M)) and np.all(np.isfinite(b))):
        raise ArgumentError("the affine field overflows for this mean and cov (max |mean| = "
                            f"{np.abs(m).max():.3g}, max |cov| = {np.abs(c).max():.3g}): "
                            "rescale the problem")
    return M[0], b[0]


def moment_ode(att: Attention, mean: Any, cov: Any, t: float = 0.0
               ) -> tuple[np.ndarray, np.ndarray]:
    r"""Right-hand side of the moment ODEs: :math:`(\alpha', \Sigma') = (M\alpha + b,\ M\Sigma + \Sigma M^\top)`.

    For ``kind="linear"`` this is the closed form :math:`M = \beta V(\Sigma + \alpha\alpha^\top)A`,
    :math:`b = 0`, i.e. :math:`\alpha' = \beta V(\Sigma+\alpha\alpha^\top)A\alpha`; in 1-D with
    :math:`\alpha = 0`, :math:`\sigma' = 2\beta v a\sigma^2` (finite-time blow-up, see
    :func:`exact_linear_1d`).  See :func:`affine_field` for every kind, the arguments (``t``
    finite) and the errors.

    Returns
    -------
    dmean : ndarray (d,)
    dcov : ndarray (d, d)
    """
    M, b = affine_field(att, mean, cov, t)
    m = np.asarray(mean, float)
    c = sym(np.asarray(cov, float))
    dm, dc = M @ m + b, M @ c + c @ M.T
    if not (np.all(np.isfinite(dm)) and np.all(np.isfinite(dc))):
        raise ArgumentError("the moment equations overflow for this mean and cov (max |mean| "
                            f"= {np.abs(m).max():.3g}, max |cov| = {np.abs(c).max():.3g}): "
                            "rescale the problem")
    return dm, dc


def sinkhorn_cross_covariance(A: Any, cov: Any, eps: float = 1.0) -> np.ndarray:
    r"""Cross-covariance :math:`C = E_\pi[(x-\alpha)(y-\alpha)^\top]` of the entropic optimal
    self-coupling of :math:`\mathcal N(\alpha, S)` for cost :math:`-y^\top A x` (``x`` the query).

    Computed as :math:`C = S M_0^\top` with :math:`M_0 = 2S^{1/2}(\varepsilon I + R')^{-1}S^{1/2}A`
    (see :func:`affine_field`); equal to the cross-covariance of ``docs/conventions.md``,
    :math:`C = 2 S^{1/2}(\varepsilon I + R)^{-1}S^{1/2}A^\top S`.  Include the temperature in ``A``.

    Parameters
    ----------
    A : array_like (d, d)
        Finite real matrix.
    cov : array_like (d, d)
        Symmetric positive semi-definite, entries at most :data:`MOMENT_MAX`.
    eps : float
        Entropic regularisation, finite and > 0.

    Returns
    -------
    ndarray (d, d)

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Naming the argument: wrong type or shape, NaN or inf, ``cov`` not PSD,
        ``eps <= 0``; a result that overflows.
    """
    eps = validation.positive("eps", eps)
    A = validation.finite_array("A", A)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ArgumentError(f"A must be a square matrix, got shape {A.shape}")
    S = check_mean_cov(np.zeros(A.shape[0]), cov, A.shape[0], "mean", "cov")[1]
    d = S.shape[0]
    one = np.ones(1)
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            M0, _ = head_affine("sinkhorn", A[None], np.eye(d)[None], np.eye(d)[None], one,
                                np.array([float(eps)]), one, np.zeros((1, d)), S[None])
            C = S @ M0[0].T
    except np.linalg.LinAlgError:  # eigh of an overflowed matrix
        C = np.full((d, d), np.nan)
    if not np.all(np.isfinite(C)):
        raise ArgumentError(f"the cross-covariance overflows (max |A| = {np.abs(A).max():.3g}, "
                            f"max |cov| = {np.abs(S).max():.3g}, eps = {eps:.3g}): rescale")
    return C

