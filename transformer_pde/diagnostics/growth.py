r"""Growth of a run: :func:`classify` it as converged, finite-time blow-up or diverging."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validation
from ..errors import ArgumentError
from .common import trajectory_moments

__all__ = ["Classification", "classify"]


@dataclass
class Classification:
    r"""Outcome of a run (see :func:`classify`).

    Attributes
    ----------
    kind : {"converged", "blowup", "diverging", "undecided"}
    blowup_time : float or None
        Estimated :math:`T^*` for ``"blowup"``.
    evidence : dict
        ``growth_rate`` (d log s/dt at the end, :math:`s = \operatorname{tr}\Sigma + |\alpha|^2`),
        ``trace_growth_rate`` (d log tr Σ/dt at the end), ``exp_rate`` and ``exp_residual``
        (fit log s = λ t + c), ``blowup_fit_time`` and ``blowup_residual`` (fit
        s = c / (T* − t)), ``change`` (relative change over the final window),
        ``status`` of the run, ``message``.
    """

    kind: str
    blowup_time: float | None
    evidence: dict

    def __str__(self) -> str:
        extra = f" at T* ~ {self.blowup_time:.6g}" if self.blowup_time is not None else ""
        return f"{self.kind}{extra}: {self.evidence.get('message', '')}"


def classify(traj: Any, *, window: float = 0.3, conv_tol: float = 1e-3,
             growth_tol: float = 0.5, min_points: int = 5) -> Classification:
    r"""Classify a Gaussian or particle run as converged, finite-time blow-up, diverging
    (:math:`t\to\infty`) or undecided, from the saved moments.

    With :math:`s(t) = \operatorname{tr}\Sigma(t) + |\alpha(t)|^2` (second moment; token
    mean and covariance for particles) on the final ``window`` fraction of the saved times (at least ``min_points`` points):

    * **growing** when :math:`s` increases on the window by a factor at least
      ``1 + growth_tol``, or the run stopped early with status ``blowup``/``nonfinite``.
      Two laws are fitted by least squares: exponential :math:`\log s = \lambda t + c` and
      finite-time blow-up :math:`s = c/(T^* - t)` (linear fit of :math:`1/s`, the law of
      the 1-D softmax solution :math:`\sigma_0/(1 - 2va\sigma_0 t)` and of the leading
      eigenvalue in general).  Residuals are compared in :math:`\log s`: the blow-up law
      wins (``"blowup"``, :math:`T^*` from the fit, never earlier than the last finite
      time) when its residual is smaller and :math:`T^*` is finite; else ``"diverging"``.
      A run that stopped at a blow-up with too few points to fit is ``"blowup"`` with the
      solver's ``blowup_time`` if it has one.
    * **converged** when mean and covariance change by less than ``conv_tol`` over the
      window, relative to their largest size along the run (covers convergence to a
      Dirac mass).
    * otherwise **undecided** (still moving at the end: run longer).

    Evidence (rates, fitted :math:`T^*`, residuals) is returned either way.
    """
    window = validation.scalar("window", window)
    if not 0 < window <= 1:
        raise ArgumentError(f"window must be in (0, 1], got {window!r}")
    min_points = validation.integer("min_points", min_points, minimum=3)
    conv_tol = validation.nonnegative("conv_tol", conv_tol)
    growth_tol = validation.nonnegative("growth_tol", growth_tol)
    times, means, covs = trajectory_moments(traj)
    status = str(getattr(traj, "status", "ok"))
    finite = np.array([np.all(np.isfinite(c)) and np.all(np.isfinite(m))
                       for m, c in zip(means, covs)])
    n = int(np.argmin(finite)) if not finite.all() else len(times)
    times, means, covs = times[:n], means[:n], covs[:n]
    stopped = status in ("blowup", "nonfinite") or not finite.all()
    ev: dict[str, Any] = {"status": status, "n_points": n}
    solver_T = getattr(traj, "blowup_time", None)
    if solver_T is not None and not np.isfinite(solver_T):
        solver_T = None  # Gaussian solver: nan unless it detected a blow-up
    if n < min_points:
        if stopped and solver_T is not None:
            ev["message"] = "too few points to fit; the solver reported a blow-up"
            return Classification("blowup", float(solver_T), ev)
        ev["message"] = f"only {n} finite saved points (need {min_points})"
        return Classification("undecided", None, ev)
    trace = np.trace(covs, axis1=1, axis2=2)
    s = trace + np.sum(means ** 2, axis=1)  # second moment E|x|^2: the mean may diverge too
    t_start = times[-1] - window * (times[-1] - times[0])
    i0 = min(int(np.searchsorted(times, t_start)), n - int(min_points))
    tw, sw = times[i0:], s[i0:]
    # relative change over the window
    cov_scale = max(float(np.max(np.linalg.norm(covs, axis=(1, 2)))), 1e-300)
    mean_scale = max(float(np.max(np.linalg.norm(means, axis=1))), math.sqrt(float(s.max())),
                     1e-300)
    change = max(float(np.max(np.linalg.norm(covs[i0:] - covs[-1], axis=(1, 2)))) / cov_scale,
                 float(np.max(np.linalg.norm(means[i0:] - means[-1], axis=1))) / mean_scale)
    ev["change"] = change
    pos = sw > 0
    if pos.sum() >= 3:
        g = np.diff(np.log(sw[pos])) / np.diff(tw[pos])
        ev["growth_rate"] = float(g[-1])
    trw = trace[i0:]
    if np.all(trw > 0):
        ev["trace_growth_rate"] = float(np.log(trw[-1] / trw[-2]) / (tw[-1] - tw[-2]))
    growing = (sw[0] > 0 and sw[-1] >= (1.0 + growth_tol) * sw[0]
               and np.all(np.diff(sw) > 0)) or stopped
    if growing and pos.sum() >= 3:
        tp_, sp = tw[pos], sw[pos]
        ls = np.log(sp)
        lam, c = np.polyfit(tp_, ls, 1)
        res_exp = float(np.sqrt(np.mean((ls - (lam * tp_ + c)) ** 2)))
        ev.update(exp_rate=float(lam), exp_residual=res_exp)
        b, a = np.polyfit(tp_, 1.0 / sp, 1)
        res_blow = math.inf
        T_fit = None
        if b < 0:
            T_fit = -a / b
            pred = a + b * tp_
            if np.all(pred > 0):
                res_blow = float(np.sqrt(np.mean((ls + np.log(pred)) ** 2)))
        ev.update(blowup_fit_time=T_fit, blowup_residual=res_blow)
        if T_fit is not None and res_blow < res_exp:
            T = max(float(T_fit), float(times[-1]))
            ev["message"] = (f"E|x|^2 follows c/(T* - t) (log-residual {res_blow:.2g} < "
                             f"exponential {res_exp:.2g}), T* ~ {T:.6g}")
            return Classification("blowup", T, ev)
        ev["message"] = (f"E|x|^2 grows like exp({lam:.3g} t) (log-residual {res_exp:.2g}; "
                         f"blow-up law {res_blow:.2g})")
        return Classification("diverging", None, ev)
    if growing and stopped and solver_T is not None:
        ev["message"] = "run stopped at a blow-up; too few positive points to fit"
        return Classification("blowup", float(solver_T), ev)
    if change < conv_tol:
        ev["message"] = f"relative change {change:.2g} < {conv_tol:g} over the final window"
        return Classification("converged", None, ev)
    ev["message"] = (f"still moving (relative change {change:.2g} over the final window) "
                     "without monotone growth: run longer")
    return Classification("undecided", None, ev)
