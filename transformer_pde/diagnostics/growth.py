r"""Growth of a run: :func:`classify` it as converged, finite-time blow-up or diverging.

The outcome uses the package's one status vocabulary (:class:`transformer_pde.results.Status`):

==============================  =============================================================
``Status.CONVERGED``            mean and covariance stopped moving
``Status.BLOWUP``               finite-time blow-up, with the estimated :math:`T^*`
``Status.DIVERGING``            unbounded growth without finite-time blow-up
``Status.OK``                   *undecided*: the run reached its end still moving, with no
                                law detected (run longer)
the run's own early status      undecided because the run ended early (``nonfinite``,
                                ``failed``, ``max_steps``, ``interrupted``) with too few
                                points to decide
==============================  =============================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import results_display as display
from .. import validation
from ..attention import KINDS, Attention, Layers
from ..errors import ArgumentError
from ..results import ResultKind, Status, kind_of, require_kind
from .common import trajectory_moments

__all__ = ["Classification", "classify", "exponential_growth_bound"]


@dataclass(repr=False)
class Classification(display.Summarised):
    r"""Outcome of a run (see :func:`classify`).

    Its ``repr`` (and the HTML table Jupyter shows) is a few lines: the outcome, the
    estimated :math:`T^*` of a blow-up, the message and the fitted rates, never the whole
    ``evidence`` dict; ``str`` is the one-line ``"<kind>: <message>"``.

    Attributes
    ----------
    kind : Status
        ``converged``, ``blowup``, ``diverging``, ``ok`` (undecided: still moving at the
        end) or, for a run that ended early without enough points to decide, the run's own
        status (see the module docstring).  A ``str`` enum: ``c.kind == "blowup"`` works.
    blowup_time : float or None
        Estimated :math:`T^*` for ``"blowup"``.
    evidence : dict
        ``growth_rate`` (d log s/dt at the end, :math:`s = \operatorname{tr}\Sigma + |\alpha|^2`),
        ``trace_growth_rate`` (d log tr Σ/dt at the end), ``exp_rate`` and ``exp_residual``
        (fit log s = λ t + c), ``blowup_fit_time`` and ``blowup_residual`` (fit
        s = c / (T* − t)), ``change`` (relative change over the final window),
        ``status`` of the run, ``message``, ``excluded_overshoot`` (the state saved past
        ``max_norm`` was left out of the fits), ``growth_bound`` (the kind's a-priori
        exponential growth bound, when one applies).
    """

    kind: Status
    blowup_time: float | None
    evidence: dict

    @property
    def status(self) -> Status:
        """Same as :attr:`kind` (the name used by trajectories)."""
        return self.kind

    def __str__(self) -> str:
        extra = f" at T* ~ {self.blowup_time:.6g}" if self.blowup_time is not None else ""
        return f"{self.kind}{extra}: {self.evidence.get('message', '')}"

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries: the finite evidence only (a
        diverging run has no blow-up time, so no ``T*`` row)."""
        ev = self.evidence
        rows = [("message", str(ev.get("message", "")))]
        if self.blowup_time is not None:
            rows.append(("T*", display.number(self.blowup_time)))
        for key, name in (("growth_rate", "d log E|x|^2/dt"),   # at the end
                          ("change", "rel. change"),            # over the final window
                          ("growth_bound", "max|x| rate bound")):
            value = ev.get(key)
            if value is not None and np.isfinite(value):
                rows.append((name, display.number(value)))
        rows.append(("run", f"{ev.get('status', '?')}, {ev.get('n_points', '?')} finite points"))
        return f"Classification(kind={str(self.kind)!r})", rows


def exponential_growth_bound(traj: Any) -> float | None:
    r"""Rate :math:`v` with :math:`\max_i|x_i(t)| \le \max_i|x_i(0)|\,e^{vt}` for a particle
    run of a normalised attention kind (softmax, l2, sinkhorn), or ``None`` when no such
    a-priori bound is known.

    A normalised head averages the tokens with weights summing to one, so
    :math:`|\Gamma_\mu(x)| \le \|W_O\| (\sum_h \|V_h\|^2)^{1/2} \max_j |x_j|`: the largest
    token norm grows at most exponentially and a finite-time blow-up is impossible.
    :math:`v` is the largest value of that constant over the layers of ``V`` and ``W_O``
    (constant or :class:`~transformer_pde.Layers`); callables of time may grow without
    bound, so they give ``None``.  Gaussian runs have unbounded support and can blow up:
    ``None``.
    """
    if require_kind(traj, "traj") is not ResultKind.PARTICLES:
        return None
    att = traj.attention
    if not isinstance(att, Attention) or not KINDS[att.kind].normalized:
        return None
    mats = {}
    for name in ("V", "W_O"):
        value = getattr(att, name)
        if value is None:
            mats[name] = None
        elif isinstance(value, Layers):
            mats[name] = list(value.values)
        elif isinstance(value, np.ndarray):
            mats[name] = [value]
        else:  # a callable of time
            return None
    k = att.d // att.heads
    per = att.heads // (att.kv_heads or att.heads)  # query heads sharing one value map
    v = max(math.sqrt(sum(float(np.linalg.norm(V[(h // per) * k:(h // per + 1) * k], 2)) ** 2
                          for h in range(att.heads))) for V in mats["V"])
    wo = 1.0 if mats["W_O"] is None else max(float(np.linalg.norm(W, 2)) for W in mats["W_O"])
    return wo * v


def classify(traj: Any, *, window: float = 0.3, conv_tol: float = 1e-3,
             growth_tol: float = 0.5, min_points: int = 5) -> Classification:
    r"""Classify a Gaussian or particle run as converged, finite-time blow-up, diverging
    (:math:`t\to\infty`) or undecided, from the saved moments.

    With :math:`s(t) = \operatorname{tr}\Sigma(t) + |\alpha(t)|^2` (second moment; token
    mean and covariance for particles) on the final ``window`` fraction of the saved times (at least
    ``min_points`` points):

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
    * otherwise **undecided** (still moving at the end: run longer), reported as
      ``Status.OK`` (or as the run's own status when it ended early: see the module
      docstring).

    What is known about the run is used as well:

    * a particle run stopped at ``max_norm`` (status ``blowup``) saves the state that
      crossed the threshold, an overshoot of one step that is far off any growth law
      (``x' = x^3/2`` with Euler steps of 0.01 jumps from 35 to 4e24): it is left out of
      the fits (``evidence["excluded_overshoot"]``);
    * particle runs of normalised kinds (softmax, l2, sinkhorn) with constant or
      :class:`~transformer_pde.Layers` values grow at most exponentially
      (:func:`exponential_growth_bound`), so they are never ``blowup``: growth is
      ``diverging``, also when the run stopped at ``max_norm``.

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
    ev: dict[str, Any] = {"status": status}
    if kind_of(traj) is ResultKind.PARTICLES and status == "blowup" and len(times) > 1:
        # the state saved at a max_norm stop overshoots the threshold by one step
        times, means, covs = times[:-1], means[:-1], covs[:-1]
        ev["excluded_overshoot"] = True
    rate = exponential_growth_bound(traj)
    if rate is not None:
        ev["growth_bound"] = rate
    finite = np.array([np.all(np.isfinite(c)) and np.all(np.isfinite(m))
                       for m, c in zip(means, covs, strict=True)])
    n = int(np.argmin(finite)) if not finite.all() else len(times)
    times, means, covs = times[:n], means[:n], covs[:n]
    stopped = status in ("blowup", "nonfinite") or not finite.all()
    ev["n_points"] = n
    solver_T = getattr(traj, "blowup_time", None)
    if solver_T is not None and not np.isfinite(solver_T):
        solver_T = None  # Gaussian solver: nan unless it detected a blow-up
    if n < min_points:
        if stopped and solver_T is not None and rate is None:
            ev["message"] = "too few points to fit; the solver reported a blow-up"
            return Classification(Status.BLOWUP, float(solver_T), ev)
        if status == "blowup" and rate is not None:
            ev["message"] = (f"exceeded max_norm; growth is at most exponential "
                             f"(rate <= {rate:.3g}) for kind={traj.attention.kind!r}")
            return Classification(Status.DIVERGING, None, ev)
        ev["message"] = f"only {n} finite saved points (need {min_points})"
        return Classification(_undecided(status), None, ev)
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
        ev.update(blowup_fit_time=None if T_fit is None else float(T_fit),
                  blowup_residual=res_blow)
        if T_fit is not None and res_blow < res_exp:
            T = max(float(T_fit), float(times[-1]))
            if rate is None:
                ev["message"] = (f"E|x|^2 follows c/(T* - t) (log-residual {res_blow:.2g} < "
                                 f"exponential {res_exp:.2g}), T* ~ {T:.6g}")
                return Classification(Status.BLOWUP, T, ev)
            ev["message"] = (f"E|x|^2 grows (fit exp({lam:.3g} t), log-residual "
                             f"{res_exp:.2g}); the c/(T* - t) law fits better (T* ~ {T:.6g}) "
                             f"but kind={traj.attention.kind!r} grows at most exponentially "
                             f"(|Gamma(x)| <= {rate:.3g} max|x|): no finite-time blow-up")
            return Classification(Status.DIVERGING, None, ev)
        law = (f"c/(T* - t) law log-residual {res_blow:.2g}" if math.isfinite(res_blow)
               else "no c/(T* - t) law fits")  # 1/E|x|^2 does not fall to 0 at a finite time
        ev["message"] = (f"E|x|^2 grows like exp({lam:.3g} t) (log-residual {res_exp:.2g}; "
                         f"{law})")
        return Classification(Status.DIVERGING, None, ev)
    if growing and stopped and solver_T is not None and rate is None:
        ev["message"] = "run stopped at a blow-up; too few positive points to fit"
        return Classification(Status.BLOWUP, float(solver_T), ev)
    if change < conv_tol:
        ev["message"] = f"relative change {change:.2g} < {conv_tol:g} over the final window"
        return Classification(Status.CONVERGED, None, ev)
    ev["message"] = (f"still moving (relative change {change:.2g} over the final window) "
                     "without monotone growth: run longer")
    return Classification(_undecided(status), None, ev)


def _undecided(run_status: str) -> Status:
    """``Status.OK`` for a run that reached its end undecided, else the run's own early
    status (``nonfinite``, ``failed``, ``max_steps``, ``interrupted``)."""
    try:
        st = Status.parse(run_status)
    except ValueError:
        return Status.OK
    return st if st in (Status.NONFINITE, Status.FAILED, Status.MAX_STEPS,
                        Status.INTERRUPTED) else Status.OK
