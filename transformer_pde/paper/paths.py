r"""Initial covariances and batched Gaussian paths for the paper's 2-D figures."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["STATUS_COLOURS", "slice_covariances", "solve_paths"]


def slice_covariances(n: int, *, radius: float = 0.7, trace: float = 1.0, init: str = "circle",
                      seed: int = 0) -> np.ndarray:
    r"""``n`` initial 2×2 covariances with trace ``trace``.

    ``init="circle"``: :math:`\Sigma/\operatorname{tr}\Sigma` on the circle of radius ``radius``
    of the unit disc, :math:`\Sigma = \tfrac{v}{2}\begin{pmatrix}1 + r\cos\theta & r\sin\theta\\
    r\sin\theta & 1 - r\cos\theta\end{pmatrix}`, :math:`\theta` evenly spaced;
    ``init="random"``: :math:`FF^\top` with standard normal :math:`F`, rescaled to the trace.
    """
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if not (0 <= radius < 1):
        raise ValueError(f"radius must be in [0, 1), got {radius!r}")
    if not (math.isfinite(trace) and trace > 0):
        raise ValueError(f"trace must be finite and > 0, got {trace!r}")
    if init == "circle":
        th = np.linspace(0.0, 2.0 * np.pi, int(n), endpoint=False)
        u, w = radius * np.cos(th), radius * np.sin(th)
        S = np.stack([np.stack([1 + u, w], -1), np.stack([w, 1 - u], -1)], -2)
        return 0.5 * trace * S
    if init == "random":
        F = np.random.default_rng(seed).normal(size=(int(n), 2, 2))
        S = F @ np.swapaxes(F, -1, -2)
        return trace * S / np.trace(S, axis1=1, axis2=2)[:, None, None]
    raise ValueError(f"init must be 'circle' or 'random', got {init!r}")

def solve_paths(att: Any, covs0: Any, *, t_max: float, n_eval: int = 400, means0: Any = None,
                **options: Any) -> list:
    r"""Gaussian runs from many initial covariances, each reported at ``n_eval`` evenly spaced
    times up to its own end.

    A first batched pass (:func:`~transformer_pde.gaussian.solve_batch`) finds where each run
    stops (``t_max``, convergence, or :math:`\operatorname{tr}\Sigma` = ``blowup_threshold``
    just before a blow-up); a second pass per run (:func:`~transformer_pde.gaussian.solve`)
    reports it at ``linspace(0, t_end, n_eval)`` from the solver's dense output, so curves
    stay smooth right up to a blow-up.  ``options`` go to both solvers (``rtol``, ``atol``,
    ``blowup_threshold``, ``converge_tol``).

    Returns
    -------
    list of GaussianTrajectory
    """
    from .. import gaussian  # noqa: PLC0415 (numba, scipy: ~1 s, paid when solving)

    covs0 = np.asarray(covs0, dtype=float)
    d = covs0.shape[-1]
    means0 = np.zeros((len(covs0), d)) if means0 is None else np.asarray(means0, dtype=float)
    ends = gaussian.solve_batch(att, means0, covs0, t_max=t_max, **options).t_final
    # np.unique: a run that stops at t = 0 is reported at that one time
    return [gaussian.solve(att, m0, S0, t_max=t_max,
                           t_eval=np.unique(np.linspace(0.0, t_end, int(n_eval))), **options)
            for m0, S0, t_end in zip(means0, covs0, ends, strict=True)]


#: colours of the Gaussian statuses in figures
STATUS_COLOURS = {"converged": "tab:blue", "blowup": "tab:red", "diverging": "tab:orange",
                  "ok": "tab:gray", "max_steps": "tab:purple"}
