r"""Anderson mixing (type II) for fixed-point iterations :math:`x = G(x)`.

Writing the residual :math:`r(x) = G(x) - x`, plain iteration is :math:`x \leftarrow x + r`.
Anderson mixing keeps the last ``m`` secant pairs
:math:`(\Delta x_k, \Delta r_k) = (x_{k+1} - x_k,\ r_{k+1} - r_k)` as the columns of
:math:`\Delta X, \Delta R` and steps to

.. math:: x_{+} = x + r - (\Delta X + \Delta R)\,\gamma, \qquad
          \gamma = \arg\min_\gamma |r - \Delta R\,\gamma|_2 ,

the plain step from the point of the affine span of the recent iterates whose linearised
residual is smallest (Walker & Ni 2011, "Anderson acceleration for fixed-point
iterations").  For a linear contraction it is GMRES in disguise; for the smooth
Sinkhorn maps of this package it cuts the iteration count several-fold.  The
least-squares problem is solved through its normal equations with a Tikhonov term
:math:`10^{-12}\operatorname{tr}(\Delta R^\top\Delta R)`, which keeps the
:math:`m\times m` solve well posed when the residual differences become collinear near
convergence; a singular or non-finite solve clears the memory and takes the plain step.

The memory works on any array namespace with ``stack`` and ``@`` (NumPy, CuPy): the
small :math:`m\times m` system is solved on the host.  Callers add their own safeguard
(restart from a plain iterate when the residual grows, as in
:func:`transformer_pde.sinkhorn.sinkhorn_loop`): Anderson mixing alone is not globally
convergent.

This module imports nothing from the package.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Anderson"]


class Anderson:
    r"""Anderson mixing of :math:`x \mapsto x + r(x)` with a reusable memory of ``m`` pairs.

    Parameters
    ----------
    m : int
        Memory (number of secant pairs kept); ``m <= 0`` gives the plain step
        :math:`x + r`.

    Notes
    -----
    :meth:`new_problem` keeps the secant pairs (the Jacobian of a warm-started nearby
    problem is close to the previous one) but never pairs iterates of two different
    problems; :meth:`reset` forgets everything.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.array([[0.9, 0.05], [0.0, 0.8]]); b = np.array([1.0, 2.0])
    >>> acc, x = Anderson(5), np.zeros(2)
    >>> for _ in range(6):
    ...     x = acc.step(np, x, A @ x + b - x)
    >>> bool(np.allclose(x, np.linalg.solve(np.eye(2) - A, b)))
    True
    """

    def __init__(self, m: int):
        self.m = int(m)
        self.dX: list = []
        self.dR: list = []
        self.x_prev: Any = None
        self.r_prev: Any = None

    def reset(self) -> None:
        """Forget every secant pair and the previous iterate."""
        self.dX.clear()
        self.dR.clear()
        self.x_prev = self.r_prev = None

    def new_problem(self, n: int) -> None:
        """Start a new (nearby) problem of size ``n``: keep the secant pairs when their
        size matches, forget the previous iterate."""
        self.x_prev = self.r_prev = None
        if self.dX and self.dX[0].shape[0] != n:
            self.reset()

    def step(self, xp: Any, x: Any, r: Any) -> Any:
        r"""The next iterate from ``x`` and its residual ``r`` (arrays of namespace ``xp``)."""
        if self.m <= 0:
            return x + r
        if self.x_prev is not None:
            self.dX.append(x - self.x_prev)
            self.dR.append(r - self.r_prev)
            if len(self.dX) > self.m:
                self.dX.pop(0)
                self.dR.pop(0)
        self.x_prev, self.r_prev = x, r
        return self._mix(xp, x, r, self.dX, self.dR)

    def peek(self, xp: Any, x: Any, r: Any) -> Any:
        r"""The iterate :meth:`step` would return from ``(x, r)``, leaving the memory as it
        is (the secant pair of ``x`` is used but not stored)."""
        if self.m <= 0:
            return x + r
        dX, dR = self.dX, self.dR
        if self.x_prev is not None:
            dX = (dX + [x - self.x_prev])[-self.m:]
            dR = (dR + [r - self.r_prev])[-self.m:]
        return self._mix(xp, x, r, dX, dR, reset=False)

    def _mix(self, xp: Any, x: Any, r: Any, dX: list, dR_list: list,
             reset: bool = True) -> Any:
        """The mixed step from ``x, r`` with secant columns ``dX, dR_list``; a failed
        solve takes the plain step (and clears the memory when ``reset``)."""
        if not dX:
            return x + r
        dR = xp.stack(dR_list, axis=1)
        # the m x m system on the host: tolist() copies from any backend (a leaf module,
        # no backend import), exactly for float64
        M = np.asarray((dR.T @ dR).tolist(), dtype=float)
        b = np.asarray((dR.T @ r).tolist(), dtype=float)
        reg = 1e-12 * max(float(np.trace(M)), 1e-300)
        try:
            gamma = np.linalg.solve(M + reg * np.eye(M.shape[0]), b)
        except np.linalg.LinAlgError:
            gamma = None
        if gamma is None or not np.all(np.isfinite(gamma)):
            if reset:
                self.reset()
            return x + r
        dXR = xp.stack(dX, axis=1) + dR
        return x + r - dXR @ xp.asarray(gamma.astype(dR.dtype))

    def get_state(self) -> dict[str, Any]:
        """The memory as plain data: ``{"m", "dX", "dR", "x_prev", "r_prev"}`` (the arrays
        themselves, not copies); :meth:`from_state` rebuilds an equal memory."""
        return {"m": self.m, "dX": list(self.dX), "dR": list(self.dR), "x_prev": self.x_prev,
                "r_prev": self.r_prev}

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> Anderson:
        """The memory whose :meth:`get_state` is ``data``.

        Raises
        ------
        KeyError, TypeError, ValueError
            ``data`` is not such a mapping.
        """
        acc = cls(int(data["m"]))
        acc.dX, acc.dR = list(data["dX"]), list(data["dR"])
        acc.x_prev, acc.r_prev = data["x_prev"], data["r_prev"]
        return acc
