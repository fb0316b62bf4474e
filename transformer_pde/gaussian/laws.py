r"""Growth laws of the Gaussian moment flow: which kinds can blow up in finite time, and how fast.

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
  :math:`r = 1`, never blows up.  If :math:`K` is rank-deficient (always for a head of
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

import numpy as np

from ..attention import Attention, AttentionParams
from .affine import check_attention

__all__ = ["blowup_law"]


def law_q_max(p: AttentionParams) -> float:
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
    :math:`(T^*-t)^{-p}` only with :math:`p \ge 1/q_{\max}` (this module's docstring):

    * ``1`` for ``softmax`` and ``linear`` (Riccati, :math:`p = 1`);
    * ``0.5`` for ``l2`` when some head's key matrix :math:`K_h` has rank :math:`< d`
      (:math:`\|M\| = O(\nu^{1/2})`, :math:`p = 2`): growth along :math:`\ker K_h` is not
      damped by :math:`(I + 2\beta' G\Sigma)^{-1}`;
    * ``0`` (no finite-time blow-up) for ``sinkhorn`` and for ``l2`` with every :math:`K_h`
      of rank ``d``: :math:`M` stays bounded as :math:`\Sigma` grows, so the growth is at most
      exponential.

    The solvers call a run that reaches ``blowup_threshold`` ``"blowup"`` only when
    :math:`q_{\max}/2 < q \le 1.5\,q_{\max}` (:mod:`transformer_pde.gaussian`, *Statuses*).  Ranks use
    :func:`numpy.linalg.matrix_rank` (default tolerance):
    an ill-conditioned but full-rank ``K`` cannot blow up, though it may grow like a blow-up
    until :math:`\nu \sim 1/(2\beta'\sigma_{\min}(K)^2)`.
    """
    att = check_attention(att)
    return law_q_max(att.at(float(t)))



def rate_scale(p: AttentionParams) -> float:
    k = 0.0
    for hd in p.heads:
        V = hd.V
        A = hd.A * (2.0 * p.l2_beta if p.kind == "l2" else abs(p.beta))
        nv = np.linalg.norm(V, 2)
        if p.W_O is not None:
            nv = np.linalg.norm(p.W_O[:, hd.rows] @ V, 2)
        k += nv * np.linalg.norm(A, 2)
    return float(k) if k > 0 else 1.0
