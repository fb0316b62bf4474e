r"""What noise a run carries: :class:`Noise`, checked at construction.

A noisy run integrates, for the tokens :math:`X_i` of one system,

.. math:: dX_i = \Gamma_{\mu_t}(X_i)\,dt + \sigma\,dW_i
          + \sum_{k=1}^K (A_k X_i)\circ dB_k ,

with :math:`W_i` independent :math:`d`-dimensional Brownian motions (one per token,
*individual* noise) and :math:`B_k` scalar Brownian motions shared by all the tokens of
the system (*common* noise).  ``convention`` says how the multiplicative common term is
read (Stratonovich :math:`\circ dB_k` or Itô :math:`dB_k`); the additive individual term is
the same in both readings on :math:`\mathbb R^d`.  On the sphere every term is projected on
the tangent space (:mod:`~transformer_pde.noise.term`).  ``(seed, path)`` names the Brownian
path; every system of a run (an ensemble member, a packed segment) draws its own stream of
it, named by its index ``system + s`` (:mod:`~transformer_pde.noise.brownian`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..validation import choice, finite_array, integer, nonnegative, positive

__all__ = ["CONVENTIONS", "Noise"]

#: how the common (multiplicative) noise term is read
CONVENTIONS = ("stratonovich", "ito")


@dataclass(frozen=True, eq=False)
class Noise:
    r"""Brownian forcing of a particle run (see the module docstring for the SDE).

    Parameters
    ----------
    sigma : float, default 0.0
        Individual noise level :math:`\sigma \ge 0`: :math:`+\sigma\,dW_i`, one independent
        :math:`d`-dimensional Brownian motion per token.  On the sphere it generates
        :math:`(\sigma^2/2)\Delta_{S^{d-1}}` (Laplace–Beltrami), so the papers'
        :math:`\frac{1}{2K}\Delta` is :math:`\sigma^2 = 1/K`.
    common : array (K, d, d) or (d, d), optional
        Matrices :math:`A_k` of the common noise :math:`+\sum_k (A_k X_i)\circ dB_k`, the
        :math:`B_k` shared by the tokens of one system (each ensemble member and each
        packed segment has its own).  A (d, d) array is one matrix (:math:`K = 1`).  Its
        ``d`` is checked against the tokens when the run starts.
    convention : {"stratonovich", "ito"}, default "stratonovich"
        How the common term is read.
    seed : int, default 0
        Names the random stream (>= 0).
    path : int, default 0
        Names one Brownian path of the stream (>= 0): runs with equal ``(seed, path)``
        (and base step) see the same path on every backend and thread count.
    base_dt : float, optional
        Step of the coarsest grid of the path (default: the run's ``dt``).  A run may
        use ``dt = base_dt / 2**L``: its increments are the Brownian-bridge refinement of
        the coarse ones, so runs at different ``dt`` see the same path at the coarse times.
    system : int, default 0
        Index of the run's first system (>= 0).  System :math:`s` of the run (segment
        :math:`s` of :func:`~transformer_pde.simulate`, member :math:`s` of
        :func:`~transformer_pde.simulate_ensemble`; 0 for a single system) draws the
        stream of index ``system + s``, which depends only on ``(seed, path)``, that index
        and the system's own size.  So member ``b`` of an ensemble run with
        ``Noise(seed=S, path=P)`` is the single run ``simulate(X0[b],
        noise=Noise(seed=S, path=P, system=b))``, and a system's noise does not depend on
        the systems packed with it.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Naming the argument: negative or non-finite ``sigma``, ``common`` not of shape
        (K, d, d) or not finite, an unknown ``convention``, a non-integer or negative
        ``seed``, ``path`` or ``system``, a non-positive ``base_dt``.
    """

    sigma: float = 0.0
    common: Any = None
    convention: str = "stratonovich"
    seed: int = 0
    path: int = 0
    base_dt: float | None = None
    system: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "sigma", nonnegative("noise.sigma", self.sigma))
        set_(self, "convention", choice("noise.convention", self.convention, CONVENTIONS))
        set_(self, "seed", integer("noise.seed", self.seed, minimum=0))
        set_(self, "path", integer("noise.path", self.path, minimum=0))
        set_(self, "system", integer("noise.system", self.system, minimum=0))
        if self.base_dt is not None:
            set_(self, "base_dt", positive("noise.base_dt", self.base_dt))
        if self.common is not None:
            A = finite_array("noise.common", self.common)
            if A.ndim == 2:
                A = A[None]
            if A.ndim != 3 or A.shape[0] < 1 or A.shape[1] != A.shape[2] or A.shape[1] < 1:
                raise ArgumentError(f"noise.common must be an array of shape (K, d, d) or "
                                    f"(d, d) with K, d >= 1, got shape {np.shape(self.common)}")
            A = A.copy()
            A.setflags(write=False)
            set_(self, "common", A)

    @property
    def n_common(self) -> int:
        """The number :math:`K` of common Brownian motions (0 without common noise)."""
        return 0 if self.common is None else int(self.common.shape[0])

    @property
    def is_zero(self) -> bool:
        """No noise at all: ``sigma == 0`` and no common term."""
        return self.sigma == 0.0 and self.common is None

    def check_dimension(self, d: int) -> None:
        """Refuse common matrices of another dimension than the tokens' ``d``."""
        if self.common is not None and self.common.shape[1] != d:
            raise ArgumentError(f"noise.common has matrices of shape {self.common.shape[1:]} "
                                f"but the tokens have d={d}: they must be ({d}, {d})")

    def commuting(self, rtol: float = 1e-12) -> bool:
        r"""Whether the common matrices commute, :math:`A_k A_l = A_l A_k` (to ``rtol``
        relative to :math:`\max_k |A_k|^2`)."""
        A = self.common
        if A is None or A.shape[0] < 2:
            return True
        scale = max(float(np.max(np.abs(A))) ** 2 * A.shape[1], np.finfo(float).tiny)
        comm = np.einsum("kij,ljm->klim", A, A) - np.einsum("lij,kjm->klim", A, A)
        return float(np.max(np.abs(comm))) <= rtol * scale

    def commutative(self) -> bool:
        r"""Whether the noise fields commute on :math:`\mathbb R^d`: additive noise alone
        (no common term), or common noise alone (:math:`\sigma = 0`) with commuting
        matrices.  Individual noise :math:`\sigma e_j` and a common field :math:`A_k x`
        have the Lie bracket :math:`\sigma A_k e_j \ne 0`, so together they do not
        commute."""
        return self.common is None or (self.sigma == 0.0 and self.commuting())

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary for a trajectory's ``info["noise"]``."""
        return {"sigma": self.sigma, "n_common": self.n_common, "convention": self.convention,
                "seed": self.seed, "path": self.path, "base_dt": self.base_dt,
                "system": self.system}

    def __repr__(self) -> str:
        common = "None" if self.common is None else f"<{self.n_common} matrices>"
        return (f"Noise(sigma={self.sigma:g}, common={common}, convention={self.convention!r}, "
                f"seed={self.seed}, path={self.path}, base_dt={self.base_dt!r}, "
                f"system={self.system})")
