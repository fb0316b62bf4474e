r"""The paper's time stepping, as an independent reference: projected explicit Euler on the
covariance ODE, with the paper's stopping rules, vectorised over many initial covariances.

This module does not use :mod:`transformer_pde.gaussian` or
:class:`~transformer_pde.Attention`: it writes the right-hand sides
:math:`\Sigma' = F(\Sigma)` again, directly from the paper's raw :math:`(Q, K, V)` and its
scalings, so that comparing it with the library is a check of both.  For a Gaussian token
measure the field is affine, :math:`\Gamma(x) = Mx + b`, and :math:`\Sigma' = M\Sigma +
\Sigma M^\top` with (paper scalings, see ``docs/conventions.md``)

* softmax, :math:`H` heads, :math:`k = d/H`: :math:`M = \sum_h E_h V_h \Sigma A_h`,
  :math:`A_h = K_h^\top Q_h/\sqrt k` (rows :math:`hk \dots (h+1)k-1`; a single head uses
  :math:`k = d`);
* L2, kernel :math:`\exp(-|\tilde Q x - Ky|^2)` with :math:`\tilde Q = Q/\sqrt d`: tilting
  :math:`N(\alpha, \Sigma)` by :math:`\exp(2\langle \tilde Q x, Ky\rangle - |Ky|^2)` gives
  the covariance :math:`(\Sigma^{-1} + 2K^\top K)^{-1} = \Sigma(I + 2G\Sigma)^{-1}`,
  :math:`G = K^\top K`, so :math:`M = 2V\Sigma(I + 2G\Sigma)^{-1}K^\top\tilde Q`;
* Sinkhorn, :math:`\varepsilon` (1 in the paper), :math:`A = K^\top Q`: with
  :math:`S = \Sigma`, :math:`R = (4S^{1/2}A^\top SAS^{1/2} + \varepsilon^2 I)^{1/2}`, the
  optimal coupling's cross-covariance :math:`C = 2S^{1/2}(\varepsilon I + R)^{-1}S^{1/2}
  A^\top S` and :math:`\Sigma' = VC^\top + CV^\top`.

The step is :math:`\Sigma_{n+1} = \Pi(\Sigma_n + hF(\Sigma_n))` with :math:`\Pi` the
projection on the positive semidefinite cone (symmetrise, clip negative eigenvalues).  At
each step :math:`n` (time :math:`nh`) the run stops as ``"exceeded"`` if
:math:`\operatorname{tr}\Sigma_n` > ``tol_high``, else as ``"converged"`` if
:math:`\|F(\Sigma_n)\|_F` < ``tol_low``; after ``max_iter`` steps it ends as ``"max_iter"``.
These three outcomes are the paper's vocabulary, not :class:`transformer_pde.results.Status`:
"exceeded" is an Euler run crossing a threshold, which is neither a proved blow-up nor a
divergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


__all__ = ["EulerResult", "euler_reference", "euler_run", "moment_rhs"]

_OUTCOMES = ("converged", "exceeded", "max_iter")


def _sym(S: np.ndarray) -> np.ndarray:
    return 0.5 * (S + np.swapaxes(S, -1, -2))


def _psd_sqrt(S: np.ndarray) -> np.ndarray:
    lam, U = np.linalg.eigh(_sym(S))
    return (U * np.sqrt(np.clip(lam, 0.0, None))[..., None, :]) @ np.swapaxes(U, -1, -2)


def _T(M: np.ndarray) -> np.ndarray:
    return np.swapaxes(M, -1, -2)


def _pad(M: np.ndarray, d: int) -> np.ndarray:
    """Complete the rows of ``M`` (..., r, d) with zero rows up to d."""
    if M.shape[-2] == d:
        return M
    pad = np.zeros(M.shape[:-2] + (d - M.shape[-2], d))
    return np.concatenate([M, pad], axis=-2)


def _heads(Q: np.ndarray, K: np.ndarray, V: np.ndarray, heads: int):
    """Per head: (rows slice, V_h, A_h) with the paper's scaling (leading batch axes kept)."""
    d = Q.shape[-1]
    if heads == 1:
        return [(slice(0, d), V, _T(K) @ Q / math.sqrt(d))]
    if d % heads:
        raise ValueError(f"heads={heads} must divide d={d}")
    k = d // heads
    Q, K = _pad(Q, d), _pad(K, d)
    out = []
    for h in range(heads):
        rows = slice(h * k, (h + 1) * k)
        out.append((rows, V[..., rows, :], _T(K[..., rows, :]) @ Q[..., rows, :] / math.sqrt(k)))
    return out


def moment_rhs(kind: str, Q: Any, K: Any, V: Any, covs: Any, *, heads: int = 1,
               eps: float = 1.0) -> np.ndarray:
    r"""The covariance right-hand side :math:`F(\Sigma)` with the paper's scalings.

    Parameters
    ----------
    kind : {"softmax", "l2", "sinkhorn"}
    Q, K : array_like (r, d) or (B, r, d)
        Query and key matrices, :math:`r \le d` rows (missing rows count as zero); with a
        leading axis, one per covariance.
    V : array_like (d, d) or (B, d, d)
    covs : array_like (..., d, d)
        Covariances (batched).
    heads : int
        Number of heads (softmax only).
    eps : float
        Sinkhorn regularisation.

    Returns
    -------
    ndarray (..., d, d)
        :math:`\Sigma'`, symmetric.
    """
    Q, K, V = (np.asarray(a, dtype=float) for a in (Q, K, V))
    S = np.asarray(covs, dtype=float)
    d = Q.shape[-1]
    if kind == "softmax":
        M = np.zeros(np.broadcast_shapes(S.shape, V.shape))
        for rows, Vh, Ah in _heads(Q, K, V, int(heads)):
            M[..., rows, :] = Vh @ S @ Ah
        MS = M @ S
        return MS + np.swapaxes(MS, -1, -2)
    if int(heads) != 1:
        raise ValueError(f"heads must be 1 for kind={kind!r}, got {heads}")
    if kind == "l2":
        A = _T(K) @ Q / math.sqrt(d)
        G = _T(K) @ K
        # S (I + 2 G S)^{-1} = (I + 2 S G)^{-1} S: solve (I + 2 S G) P = S
        P = np.linalg.solve(np.eye(d) + 2.0 * S @ G, S)
        M = 2.0 * V @ P @ A
        MS = M @ S
        return MS + np.swapaxes(MS, -1, -2)
    if kind == "sinkhorn":
        A = _T(K) @ Q
        R2 = _psd_sqrt(S)
        R = _psd_sqrt(4.0 * R2 @ _T(A) @ S @ A @ R2 + eps ** 2 * np.eye(d))
        C = 2.0 * R2 @ np.linalg.solve(eps * np.eye(d) + R, R2 @ _T(A) @ S)
        VC = V @ _T(C)
        return VC + np.swapaxes(VC, -1, -2)
    raise ValueError(f"kind must be 'softmax', 'l2' or 'sinkhorn', got {kind!r}")


def _project_psd(S: np.ndarray) -> np.ndarray:
    """Symmetrise and clip negative eigenvalues (only the members that need it)."""
    S = _sym(S)
    if S.shape[-1] == 2:
        bad = (S[:, 0, 0] < 0) | (S[:, 1, 1] < 0) | (S[:, 0, 0] * S[:, 1, 1] < S[:, 0, 1] ** 2)
    else:
        try:  # all positive definite (the common case): nothing to project
            np.linalg.cholesky(S)
            return S
        except np.linalg.LinAlgError:
            bad = np.linalg.eigvalsh(S)[:, 0] < 0
    if bad.any():
        lam, U = np.linalg.eigh(S[bad])
        S[bad] = (U * np.clip(lam, 0.0, None)[:, None, :]) @ np.swapaxes(U, -1, -2)
    return S


@dataclass
class EulerResult:
    """Result of :func:`euler_reference` (``B`` initial covariances).

    Attributes
    ----------
    outcome : ndarray (B,) of str
        ``"converged"``, ``"exceeded"`` or ``"max_iter"`` (the paper's vocabulary).
    n_steps : ndarray (B,) of int
        Steps taken before the stop.
    t_stop : ndarray (B,)
        ``n_steps * step``.
    covs : ndarray (B, d, d)
        The covariance at the stop.
    times : ndarray (T,) or None
        With ``save_every``: the saved times ``0, save_every * step, ...``.
    path : ndarray (B, T, d, d) or None
        With ``save_every``: the covariances at ``times`` (NaN after a run stopped).
    """

    outcome: np.ndarray
    n_steps: np.ndarray
    t_stop: np.ndarray
    covs: np.ndarray
    times: np.ndarray | None = None
    path: np.ndarray | None = None

    def counts(self) -> dict[str, int]:
        """Number of runs per outcome."""
        return {o: int(np.sum(self.outcome == o)) for o in _OUTCOMES}


def euler_reference(kind: str, Q: Any, K: Any, V: Any, covs0: Any, *, step: float,
                    tol_low: float, tol_high: float, max_iter: int, heads: int = 1,
                    eps: float = 1.0, save_every: int | None = None) -> EulerResult:
    r"""The paper's projected explicit Euler with its stopping rules, over many initial
    covariances at once (see the module docstring).

    Parameters
    ----------
    kind, Q, K, V, heads, eps
        As in :func:`moment_rhs` (the paper's scalings are applied here); ``Q, K, V`` with
        a leading axis of length ``B`` give each run its own parameters.
    covs0 : array_like (B, d, d)
        Initial covariances.
    step : float
        Euler step :math:`h`.
    tol_low, tol_high : float
        ``converged`` when :math:`\|\Sigma'\|_F` < ``tol_low``; ``exceeded`` when
        :math:`\operatorname{tr}\Sigma` > ``tol_high``.
    max_iter : int
        Step budget.
    save_every : int, optional
        Keep the path every ``save_every`` steps (for drawing).

    Returns
    -------
    EulerResult

    Examples
    --------
    The paper's "zero" softmax panel from its first initial covariance:

    >>> from transformer_pde.paper import paper_run
    >>> r = paper_run("zero", "trad")
    >>> res = euler_reference(r.kind, r.Q, r.K, r.V, r.covariances()[:1], heads=r.heads,
    ...                       step=r.rule.step, tol_low=r.rule.tol_low,
    ...                       tol_high=r.rule.tol_high, max_iter=r.rule.max_iter)
    >>> str(res.outcome[0])
    'converged'
    """
    S = np.array(covs0, dtype=float)
    if S.ndim != 3 or S.shape[1] != S.shape[2]:
        raise ValueError(f"covs0 must have shape (B, d, d), got {S.shape}")
    if not (step > 0 and tol_low > 0 and tol_high > 0 and int(max_iter) >= 0):
        raise ValueError("step, tol_low and tol_high must be > 0 and max_iter >= 0, got "
                         f"{step}, {tol_low}, {tol_high}, {max_iter}")
    B, d = S.shape[0], S.shape[1]
    max_iter = int(max_iter)
    outcome = np.full(B, "max_iter", dtype=object)
    n_steps = np.full(B, max_iter)
    final = np.empty_like(S)
    T = None if save_every is None else max_iter // int(save_every) + 1
    path = None if T is None else np.full((B, T, d, d), np.nan)
    Q, K, V = (np.asarray(a, dtype=float) for a in (Q, K, V))
    batched = Q.ndim == 3
    if batched and not (Q.shape[0] == K.shape[0] == V.shape[0] == B):
        raise ValueError(f"per-member Q, K, V need {B} members, got {Q.shape[0]}, "
                         f"{K.shape[0]}, {V.shape[0]}")
    idx = np.arange(B)
    cur = _project_psd(S)
    for n in range(max_iter + 1):
        if path is not None and n % int(save_every) == 0:
            path[idx, n // int(save_every)] = cur
        F = moment_rhs(kind, Q, K, V, cur, heads=heads, eps=eps)
        exceeded = np.trace(cur, axis1=1, axis2=2) > tol_high
        converged = ~exceeded & (np.sqrt(np.sum(F * F, axis=(1, 2))) < tol_low)
        stop = exceeded | converged
        if n == max_iter:
            stop[:] = True
        if stop.any():
            j = idx[stop]
            outcome[j[exceeded[stop]]] = "exceeded"
            outcome[j[converged[stop]]] = "converged"
            n_steps[j] = n
            final[j] = cur[stop]
            keep = ~stop
            idx, cur, F = idx[keep], cur[keep], F[keep]
            if batched:
                Q, K, V = Q[keep], K[keep], V[keep]
            if idx.size == 0:
                break
        cur = _project_psd(cur + step * F)
    times = None if T is None else np.arange(T) * int(save_every) * step
    return EulerResult(outcome.astype(str), n_steps, n_steps * float(step), final, times, path)


def euler_run(run: Any, covs0: Any = None, *, save_every: int | None = None) -> EulerResult:
    """:func:`euler_reference` for a :class:`~transformer_pde.paper.PaperRun` (its grid
    unless ``covs0`` is given)."""
    r = run
    return euler_reference(r.kind, r.Q, r.K, r.V, r.covariances() if covs0 is None else covs0,
                           heads=r.heads, step=r.rule.step, tol_low=r.rule.tol_low,
                           tol_high=r.rule.tol_high, max_iter=r.rule.max_iter,
                           save_every=save_every)


