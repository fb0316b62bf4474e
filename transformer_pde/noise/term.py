r"""The diffusion part of a noisy run on its backend: :class:`NoiseTerm`.

For a step with Brownian increments :math:`\Delta W_i` (per token) and
:math:`\Delta B_{s,k}` (per system :math:`s`), the term computes

* the **displacement** :math:`G(x)\Delta Z = \sigma\Delta W_i + M_s x_i` with
  :math:`M_s = \sum_k A_k \Delta B_{s,k}`, projected on the tangent space
  :math:`P_x u = u - \langle x,u\rangle x/|x|^2` on the sphere;
* the **Milstein term** :math:`\tfrac12 M_s^2 x_i` (commuting :math:`A_k`:
  :math:`\tfrac12\sum_{k,l} A_k A_l x\,\Delta B_k\Delta B_l`);
* the **convention correction** :math:`T(x)`, the difference between the Itô and the
  Stratonovich drift of the common term, which an Itô scheme (Euler–Maruyama) adds for a
  Stratonovich SDE and a Stratonovich scheme (Heun, Milstein in Stratonovich form)
  subtracts for an Itô one.  On :math:`\mathbb R^d`,
  :math:`T(x) = \tfrac12\sum_k A_k^2 x`.  On the sphere, with
  :math:`v_k = P_x A_k x`, the Stratonovich SDE :math:`dx = \sum_k v_k(x)\circ dB_k` has
  the Itô drift :math:`\tfrac12\sum_k Dv_k[v_k] = T(x) - \tfrac12\sum_k |v_k|^2 x` with the
  tangential part

  .. math:: T(x) = \tfrac12 \sum_k \big(P_x(A_k v_k) - \langle x, A_k x\rangle\, v_k\big);

  the normal part :math:`-\tfrac12\sum_k|v_k|^2 x` (and :math:`-\tfrac{(d-1)\sigma^2}{2}x`
  of the individual noise) is what the retraction :math:`x \mapsto x/|x|` after a step of
  tangent increments supplies (:math:`|x + P_x u|^2 = 1 + |P_x u|^2`).  On the sphere the
  Itô reading is the process whose Itô drift has the tangential part :math:`P_x\Gamma`
  (with the normal part that keeps it on the sphere); the individual noise is always the
  Stratonovich (Laplace–Beltrami) one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..blocks.normalization import tangent_project
from .spec import Noise

__all__ = ["Increment", "NoiseTerm"]


@dataclass(frozen=True)
class Increment:
    """One step's Brownian increments as the term uses them.

    Attributes
    ----------
    dW : backend array (N, d) or None
        :math:`\\sigma\\Delta W_i` (``None`` when :math:`\\sigma = 0`).
    M : backend array or None
        :math:`M_s = \\sum_k A_k\\Delta B_{s,k}` in the layout of :meth:`NoiseTerm._apply`
        (``None`` without common noise).
    M2 : backend array or None
        :math:`M_s^2` (only for the Milstein scheme).
    dB : ndarray (S, K) or None
        The common increments on the host.
    """

    dW: Any
    M: Any
    M2: Any
    dB: Any


class NoiseTerm:
    r"""The diffusion of a run (see the module docstring).

    Parameters
    ----------
    noise : Noise
    sizes : sequence of int
        Token counts of the systems (segments), summing to :math:`N`.  ``dims`` is the
        number of Brownian coordinates of each, :math:`K + n_s d`.
    d : int
    dtype : numpy dtype
        Working precision of the state.
    to_device : callable ``host float64 array -> backend array``
        Moves arrays to the run's backend in ``dtype``.
    xp : array namespace of the backend
    sphere : bool
        Tokens on the unit sphere: project on the tangent space, sphere correction.
    """

    def __init__(self, noise: Noise, sizes: Any, d: int, dtype: Any,
                 to_device: Callable[[np.ndarray], Any], xp: Any, sphere: bool = False):
        self.noise, self.d, self.xp, self.sphere = noise, int(d), xp, bool(sphere)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.n_tokens = int(self.sizes.sum())
        self.K = noise.n_common
        self.dim = self.n_tokens * self.d + self.sizes.size * self.K
        self.dtype, self.to_device = np.dtype(dtype), to_device
        # the columns of a step's increment (BrownianPath): system by system, its K
        # common coordinates first, then its tokens' individual ones
        self.dims = self.sizes * self.d + self.K
        starts = np.concatenate([[0], np.cumsum(self.dims)])[:-1]
        idx = [np.arange(s + self.K, s + self.K + n * self.d)
               for s, n in zip(starts, self.sizes, strict=True)]
        self._individual = np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)
        self._common = starts[:, None] + np.arange(self.K)[None, :]
        self._equal = bool(np.all(self.sizes == self.sizes[0]))
        self._system = np.repeat(np.arange(self.sizes.size), self.sizes)
        if self.K:
            A = noise.common
            self._A = to_device(A)
            self._T = to_device(0.5 * np.einsum("kij,kjl->il", A, A))   # (1/2) sum_k A_k^2

    # ------------------------------------------------------------------ increments
    def increments(self, z: np.ndarray, milstein: bool = False) -> Increment:
        """Split the host increment ``z`` (D,) of one step into :class:`Increment`."""
        dW = None
        if self.noise.sigma != 0.0:
            dW = self.to_device(self.noise.sigma * z[self._individual].reshape(-1, self.d))
        if not self.K:
            return Increment(dW, None, None, None)
        dB = z[self._common]                                       # (S, K)
        M = np.einsum("sk,kij->sij", dB, self.noise.common)        # (S, d, d)
        M2 = np.einsum("sij,sjl->sil", M, M) if milstein else None
        return Increment(dW, self._layout(M), None if M2 is None else self._layout(M2), dB)

    def _layout(self, M: np.ndarray) -> Any:
        """Per-system matrices on the device: one (d, d) for one system, (S, d, d) for
        equal systems, one per token (N, d, d) otherwise."""
        if M.shape[0] == 1:
            return self.to_device(M[0])
        return self.to_device(M if self._equal else M[self._system])

    def _apply(self, M: Any, y: Any) -> Any:
        """:math:`M_s x_i` for every token (``M`` from :meth:`_layout`)."""
        if M.ndim == 2:
            return y @ M.T
        if M.shape[0] == self.n_tokens and not self._equal:
            return self.xp.einsum("nij,nj->ni", M, y)
        S = M.shape[0]
        return self.xp.einsum("sij,snj->sni", M, y.reshape(S, -1, self.d)).reshape(y.shape)

    # ------------------------------------------------------------------ terms
    def displacement(self, y: Any, inc: Increment) -> Any:
        r""":math:`G(y)\Delta Z` (projected on the tangent space on the sphere)."""
        u = inc.dW
        if inc.M is not None:
            m = self._apply(inc.M, y)
            u = m if u is None else u + m
        if u is None:
            return None
        return tangent_project(y, u) if self.sphere else u

    def milstein(self, y: Any, inc: Increment) -> Any:
        r""":math:`\tfrac12 M_s^2 y` (``None`` without common noise)."""
        return None if inc.M2 is None else 0.5 * self._apply(inc.M2, y)

    def correction(self, y: Any, form: str) -> Any:
        r"""The drift a scheme of the given ``form`` (``"ito"``: Euler–Maruyama,
        ``"stratonovich"``: Heun, Milstein) adds for the run's convention: :math:`+T(y)`,
        :math:`-T(y)` or ``None`` (see the module docstring)."""
        if not self.K or form == self.noise.convention:
            return None
        T = self._tangential(y) if self.sphere else y @ self._T.T
        return T if form == "ito" else -T

    def _tangential(self, y: Any) -> Any:
        r""":math:`\tfrac12\sum_k (P_y(A_k v_k) - \langle y, A_k y\rangle v_k)`,
        :math:`v_k = P_y A_k y`."""
        out = None
        for k in range(self.K):
            A = self._A[k]
            Ay = y @ A.T
            v = tangent_project(y, Ay)
            r2 = (y * y).sum(axis=1, keepdims=True)
            term = tangent_project(y, v @ A.T) - ((y * Ay).sum(axis=1, keepdims=True) / r2) * v
            out = term if out is None else out + term
        return 0.5 * out
