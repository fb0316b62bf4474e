r"""One Gaussian initial condition: :func:`solve` and its result :class:`GaussianTrajectory`."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from scipy.integrate import solve_ivp

from ..attention import Attention
from .. import results_display as display
from ..errors import ArgumentError, IntegrityError, SolverNotConverged
from ..io.saving import GAUSSIAN_FORMAT, read_gaussian, save_gaussian
from ..integrate.breakpoints import jump_times, layer_tables
from ..results import HasStatus, ResultKind, Status, check_warn, warn_stop
from .affine import check_attention, check_mean_cov, psd_factor
from .system import (
    CLASSIFY_SIZE,
    MomentSystem,
    NonFinite,
    budget_event,
    check_solver_args,
    check_t_eval,
    checked_rhs,
    classify_members,
    conv_events,
    conv_rates,
    converged_codes,
    reported_states,
    set_window,
    time_event,
)

__all__ = ["GaussianTrajectory", "solve"]

logger = logging.getLogger(__name__)


class GaussianFile(display.Summarised):
    """Saving and loading of the Gaussian results (:class:`GaussianTrajectory` and
    :class:`~transformer_pde.gaussian.GaussianBatch`): one NPZ format per class."""

    #: the file format of the class (:mod:`transformer_pde.io.saving`)
    _FILE_FORMAT: ClassVar[str] = GAUSSIAN_FORMAT

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the result to the NPZ file ``path`` with the SHA-256 digest of every
        array (:func:`transformer_pde.io.saving.save_gaussian`); :meth:`load` restores it
        exactly.  The file is written beside ``path`` and renamed into place.

        Parameters
        ----------
        path : str or Path
            Target NPZ file (``.nc`` / ``.zarr`` are refused: save ``to_xarray()``, where
            the class has it, with :func:`transformer_pde.io.labelled.save_dataset` for
            those).
        overwrite : bool, default False
            Replace an existing file; without it an existing ``path`` is an
            :class:`~transformer_pde.errors.ArgumentError` naming it.

        Returns
        -------
        Path
        """
        return save_gaussian(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read a file written by :meth:`save`, after checking every array against its
        digest and the invariants of :func:`transformer_pde.io.saving.check_gaussian`.

        Raises
        ------
        IntegrityError
            The file is damaged or edited, or holds the other kind of Gaussian result
            (use :func:`transformer_pde.gaussian.load` for either); the message names
            the file.
        FileNotFoundError
            No such file.
        """
        fmt, fields = read_gaussian(path)
        if fmt != cls._FILE_FORMAT:
            other = "GaussianBatch" if cls._FILE_FORMAT == GAUSSIAN_FORMAT else \
                "GaussianTrajectory"
            raise IntegrityError(f"{path} holds a {other}, not a {cls.__name__} "
                                 f"(use {other}.load or transformer_pde.gaussian.load)")
        return cls(**fields)


@dataclass(repr=False)
class GaussianTrajectory(HasStatus, GaussianFile):
    r"""Result of :func:`solve` (and one member of a :class:`GaussianBatch`).

    Attributes
    ----------
    times : ndarray (T,)
        The accepted steps, or the ``t_eval`` times reached (after a convergence: all of
        them, so ``times`` may extend past ``t_final``).
    means : ndarray (T, d)
    covs : ndarray (T, d, d)
        Symmetric PSD by construction (:math:`\Sigma = FF^\top`).
    status : Status
        ``"ok"`` (reached ``t_max`` undecided), ``"converged"``, ``"blowup"``,
        ``"diverging"`` or ``"max_steps"`` (:class:`~transformer_pde.results.Status`).
    blowup_time : float
        Estimated :math:`T^*` (``nan`` unless ``status == "blowup"``).
    limit : ndarray (d, d)
        :math:`\Sigma/\operatorname{tr}\Sigma` at the end (extrapolated to :math:`T^*` on
        blow-up).
    t_final : float
        Time of the last state (on the blow-up threshold for blow-ups).
    message : str
    nfev : int
        Right-hand-side evaluations.
    final_mean, final_cov : ndarray
        State at ``t_final`` (also when ``t_eval`` does not contain it).
    """

    times: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    status: Status
    blowup_time: float
    limit: np.ndarray
    t_final: float
    message: str
    nfev: int = 0
    final_mean: np.ndarray | None = None
    final_cov: np.ndarray | None = None

    #: :class:`~transformer_pde.results.ResultKind` of the result protocol
    result_kind: ClassVar[ResultKind] = ResultKind.GAUSSIAN

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """``(means, covs)`` at ``times``, shapes ``(T, d)`` and ``(T, d, d)``."""
        return self.means, self.covs

    def to_xarray(self) -> Any:
        """The trajectory as a labelled :class:`xarray.Dataset` (``means (time, dim)``,
        ``covs (time, row, col)``, ``limit``; status, T*, message as attributes):
        :func:`transformer_pde.io.labelled.gaussian_dataset`.  Save it with
        :func:`transformer_pde.io.labelled.save_dataset` (``.nc`` or ``.zarr``)."""
        from ..io.labelled import gaussian_dataset  # noqa: PLC0415  (xarray only when asked)

        return gaussian_dataset(self)

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        d = int(np.shape(self.means)[-1])
        rows = [("times", display.time_span(self.times)),
                ("t_final", display.number(self.t_final))]
        if str(self.status) == "blowup":
            rows.append(("blowup_time", display.number(self.blowup_time)))
        if self.final_cov is not None and np.all(np.isfinite(self.final_cov)):
            rows.append(("final tr(cov)", display.number(np.trace(self.final_cov))))
        rows += [("means, covs", f"{display.array_summary(self.means)}, "
                                 f"{display.array_summary(self.covs)}"),
                 ("nfev", str(self.nfev)), ("message", display.shorten(self.message))]
        return f"GaussianTrajectory(status='{self.status}', d={d})", rows


def solve(att: Attention, mean0: Any, cov0: Any, *, t_max: float, rtol: float = 1e-10,
          atol: float = 1e-12, blowup_threshold: float = 1e8, converge_tol: float = 1e-10,
          convergence: str = "auto", t_eval: Any = None, warn: bool = True
          ) -> GaussianTrajectory:
    r"""Integrate the Gaussian moment ODEs from :math:`\mathcal N(\alpha_0, \Sigma_0)` up to ``t_max``.

    Uses :func:`scipy.integrate.solve_ivp` (DOP853) on the reparametrised system of
    :mod:`transformer_pde.gaussian` (:math:`\Sigma = FF^\top`, time :math:`s` with
    :math:`ds = (1 + \kappa\nu)dt`), with terminal events ``size = blowup_threshold``,
    convergence and ``t = t_max``; piecewise-constant :class:`~transformer_pde.Layers`
    parameters are integrated segment by segment.  A run that reaches the threshold is
    continued (without output) to size ``max(blowup_threshold, 1e10)``, where blow-up or
    divergence is decided and :math:`T^*` and ``limit`` are measured: they do not depend on
    the threshold (the path is cut at it).

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
        Size :math:`\nu = \operatorname{tr}\Sigma` (:math:`+|\alpha|^2` for ``linear``) at
        which the path stops (the last state lies on it).
    converge_tol : float
        Tolerance of the convergence criterion.
    convergence : {"auto", "relative", "absolute", "trace"}
        When the run is ``"converged"`` (rates per unit ``t``):

        * ``"relative"``: :math:`\|\Sigma'\|_F \le \text{tol}\,(\|\Sigma\|_F + \text{atol})`
          and :math:`\|\alpha'\| \le \text{tol}\,(\|\alpha\| + \|\Sigma\|_F^{1/2} + \text{atol})`;
        * ``"auto"`` (default): the relative criterion, or an algebraic approach to a
          stationary state (:math:`\Sigma \to 0` or to a line like :math:`1/t`, which the
          relative criterion never accepts): the rate
          :math:`R = \|\Sigma'\|_F + \|(\alpha\alpha^\top)'\|_F` decays like
          :math:`t^{-k}` with :math:`k \ge 1.05` (integrable, so the state has a limit) and
          the measured :math:`k` stays within :math:`10^{-3}` (relative) while :math:`t`
          doubles;
        * ``"absolute"``: :math:`\|\Sigma'\|_F <` ``converge_tol`` (the paper's criterion for
          converging runs, e.g. ``converge_tol=1e-4``; the mean is not tested);
        * ``"trace"``: :math:`\operatorname{tr}\Sigma <` ``converge_tol`` (the paper's
          ``tol_low``).
    t_eval : array_like, optional
        Times at which to report the state (dense output, inverted in ``s``): finite,
        strictly increasing, in ``[0, t_max]``; by default the accepted steps.  Times after
        a convergence are reported too (integrated on without the convergence test, or
        the state held where it is exactly stationary); times after any other stop are
        not (``times`` ends there).
    warn : bool, default True
        Issue the warning below; ``False`` leaves the status as the only report.

    Returns
    -------
    GaussianTrajectory
        A blow-up, divergence or convergence is an answer: reported in ``status``
        (``"blowup"``, ``"diverging"``, ``"converged"``) and ``message`` only.

    Warns
    -----
    EarlyStopWarning
        When the run ends without an answer: its step budget spent (status
        ``"max_steps"``), an overflow of the moment equations (status ``"nonfinite"``:
        e.g. a mean growing like :math:`e^{t}` past the float range; the last finite state
        is kept) or a failed solve (``"failed"``).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Naming the argument: wrong types (bools for numbers included) or shapes, NaN or
        inf, entries of ``mean0`` / ``cov0`` above
        :data:`~transformer_pde.gaussian.affine.MOMENT_MAX` (their squares would leave the
        float range), tolerances or ``t_max`` not > 0, ``t_eval`` not strictly
        increasing in ``[0, t_max]``.
    """
    att = check_attention(att)
    m0, c0 = check_mean_cov(mean0, cov0, att.d, "mean0", "cov0")
    check_solver_args(t_max, rtol, atol, blowup_threshold, converge_tol, convergence)
    t_eval = check_t_eval(t_eval, float(t_max))
    warn = check_warn(warn)
    tr = solve_from_factor(att, 0.0, m0, psd_factor(c0), t_max=float(t_max), rtol=rtol,
                           atol=atol, blowup_threshold=blowup_threshold,
                           converge_tol=converge_tol, convergence=convergence, t_eval=t_eval)
    warn_stop(tr.status, tr.message, warn=warn)
    return tr


STIFF_STEPS = 1500  # explicit steps per segment before switching to the stiff method
#: The method a stiff member is continued with: scipy's LSODA (BDF with the Jacobian of
#: :func:`_fd_jacobian`).  Radau at the default rtol = 1e-10 leaves the slow manifold of
#: stiff linear members (tr Sigma reaches 1e8 at t = 2.40 instead of 0.589, which LSODA at
#: rtol 1e-8 ... 1e-12, BDF, and Radau at rtol 1e-6 / 1e-8 agree on), and costs ~7x more
#: steps where it stays on it.
STIFF_METHOD = "LSODA"
IMPLICIT_STEPS = 5000  # stiff-method steps per segment before giving up (status "max_steps")
#: The stiff method runs in chunks of this many steps; from the second chunk on, a member
#: whose projected step count to its next stop exceeds what is left of ``IMPLICIT_STEPS``
#: stops there ("stiff", status ``max_steps``) instead of spending the rest of the budget.
IMPLICIT_CHUNK = 500


def _continue_past(sysm: MomentSystem, att: Attention, Y: np.ndarray, log_thr_c: float,
                   rtol: float, atol_vec: np.ndarray, method: str, atol: float,
                   convergence: str, converge_tol: float) -> tuple[np.ndarray, int]:
    """State continued from ``Y`` (on the drawing threshold) to size ``exp(log_thr_c)`` (code
    1), convergence (2, 5, 6) or the step budget (3), without output (for the blow-up test,
    T* and the limit, or to see a transient crossing converge)."""
    ev_conv, ev_alg, _ = conv_events(sysm, atol, convergence, converge_tol)
    idx = np.zeros(1, dtype=int)
    tables = layer_tables(att)
    t0 = float(Y[0])
    stops = [*jump_times(tables, t0, math.inf).tolist(), math.inf]
    fun = checked_rhs(sysm, idx)

    def ev_size(_s, y):
        return float(sysm.log_size(y[None], idx)[0]) - log_thr_c
    ev_size.terminal = True
    ev_size.direction = 1
    s0 = 0.0
    t_lo = t0
    for stop in stops:
        if math.isfinite(stop):
            set_window(sysm, t_lo, stop)
        else:
            sysm.lo[:] = t_lo + 1e-7 * max(1.0, abs(t_lo))
            sysm.hi[:] = math.inf
        sol = solve_ivp(fun, (s0, 1e300), Y, method=method, rtol=rtol, atol=atol_vec,
                        events=[ev_size, time_event(stop), budget_event(STIFF_STEPS), ev_conv,
                                ev_alg], **({"jac": _fd_jacobian(sysm)}
                                            if method == STIFF_METHOD else {}))
        if sol.status == -1:
            break
        if sol.t_events[0].size:
            return sol.y_events[0][0], 1
        if sol.t_events[3].size:
            return sol.y_events[3][0], 6 if convergence in ("absolute", "trace") else 2
        if sol.t_events[4].size:
            return sol.y_events[4][0], 5
        if sol.t_events[1].size:
            Y = sol.y_events[1][0].copy()
            Y[0] = stop
            s0 = float(sol.t_events[1][0])
            t_lo = stop
            continue
        Y = sol.y[:, -1]
        break
    return Y, 3


def solve_from_factor(att: Attention, t0: float, m0: np.ndarray, F0: np.ndarray, *,
                      t_max: float, rtol: float, atol: float, blowup_threshold: float,
                      converge_tol: float, t_eval: Any, convergence: str = "auto",
                      method: str = "DOP853") -> GaussianTrajectory:
    r""":func:`solve` from time ``t0`` and factor ``F0`` (inputs already validated; no warning).

    Integrates with ``method`` (DOP853) and switches to ``STIFF_METHOD`` (LSODA) once a
    segment has taken
    ``STIFF_STEPS`` explicit steps (stiffness: e.g. a collapsing eigen-direction of
    :math:`\Sigma` decaying much faster than the rest evolves)."""
    sysm = MomentSystem([att], 1)
    idx = np.zeros(1, dtype=int)
    Y0 = sysm.pack(np.array([t0]), m0[None], F0[None], idx)[0]
    log_thr = math.log(blowup_threshold)
    log_thr_c = math.log(max(blowup_threshold, CLASSIFY_SIZE))
    atol_vec = np.full(sysm.n, atol)
    atol_vec[1] = rtol            # rho is a log: its error is a relative error of F
    stops = [*jump_times(layer_tables(att), t0, t_max).tolist(), float(t_max)]
    if float(np.exp(sysm.log_size(Y0[None], idx))[0]) >= blowup_threshold:
        raise ArgumentError(f"the initial size already exceeds blowup_threshold="
                            f"{blowup_threshold}")

    stiff: dict = {}
    Y, reason, seg_y, sols, nfev, method = _integrate_segments(
        sysm, Y0, t0, stops, log_thr, rtol, atol, atol_vec, convergence, converge_tol, method,
        stiff)
    Yc = None
    creason = np.array([-1])
    if reason == 1 and log_thr_c > log_thr:
        try:
            Yc_, creason[0] = _continue_past(sysm, att, Y.copy(), log_thr_c, rtol, atol_vec,
                                             method, atol, convergence, converge_tol)
            Yc = Yc_[None]
        except NonFinite:
            pass   # overflow while measuring: classified at the threshold itself
    status, Tstar, limit, msgs = classify_members(sysm, Y[None], idx, converge_tol,
                                                  np.array([reason]), Yc, convergence, creason,
                                                  log_thr)
    if reason == 3 and stiff:
        msgs[0] = _stiff_message(sysm, Y, t_max, stiff)
    elif reason == 3:
        msgs[0] = (f"stopped at t={Y[0]:.6g} before t_max={t_max:g}: step budget "
                   f"({STIFF_STEPS} explicit + {IMPLICIT_STEPS} implicit steps per segment) "
                   "spent")
    t_end, hold = float(Y[0]), None
    if reason in (2, 5, 6) and t_eval is not None and np.any(np.asarray(t_eval) > Y[0]):
        # converged before the last output time: the states at the later output times are
        # integrated on (no convergence test) or, where the state is exactly stationary,
        # held; status, message and final state stay those of the convergence
        t_end, hold, more = _output_continuation(sysm, att, Y, float(np.max(t_eval)), rtol,
                                                 atol, atol_vec, method, log_thr)
        sols = sols + more
    t_all, means, covs = reported_states(sysm, Y, seg_y, sols, t_eval, t0, t_end, hold)
    _, fm, fc = sysm.moments(Y[None], idx)
    return GaussianTrajectory(np.asarray(t_all), means, covs, status[0], float(Tstar[0]),
                              limit[0], float(Y[0]), msgs[0], nfev, fm[0], fc[0])


def _stiff_message(sysm: MomentSystem, Y: np.ndarray, t_max: float, stiff: dict) -> str:
    """The message of a run stopped as stiff (:func:`_integrate_segments`): the spread of
    the eigenvalues of :math:`M` at the last state, the stiff method's progress, and what
    to do."""
    _, info = sysm.rhs(Y[None], np.zeros(1, dtype=int), full=True)
    lam = np.linalg.eigvals(info["M"][0])
    k = int(np.argmin(lam.real))
    fast, rest = lam[k], np.delete(lam, k)
    slow = float(np.max(np.abs(rest))) if rest.size else 0.0
    return (f"stiff: stopped at t={Y[0]:.6g} before t_max={t_max:g}: M has the eigenvalue "
            f"{fast.real:.3g} (a direction of Sigma contracting that fast) while its others "
            f"are at most {slow:.3g} in modulus; the "
            f"implicit ({STIFF_METHOD}) steps advance t by {stiff['dt']:.3g} per {stiff['chunk']} "
            f"steps here and would need about {stiff['projected']:.2g} more (budget left: "
            f"{stiff['left']}). The states up to t_final are accurate; to go further, "
            f"shorten t_max or loosen rtol / atol")


def _output_continuation(sysm: MomentSystem, att: Attention, Y: np.ndarray, t_last: float,
                         rtol: float, atol: float, atol_vec: np.ndarray, method: str,
                         log_thr: float) -> tuple[float, np.ndarray | None, list]:
    """The path after a convergence at ``Y[0]`` up to the last output time ``t_last``, for
    the output times only: integrated as the run (size threshold, step budget) without the
    convergence test, so that a converged run reports every requested time.

    Returns ``(t_end, hold, sols)``: the time up to which states are known, the state held
    up to ``t_last`` when the path reaches an exactly stationary state (zero covariance
    and mean rates: the state stays; ``None`` otherwise) and the dense solutions as in
    :func:`_integrate_segments`.  A path that stops at the threshold, its budget or an
    overflow reports the times it reached only."""
    t0 = float(Y[0])
    stops = [*jump_times(layer_tables(att), t0, t_last).tolist(), t_last]
    try:
        Ye, reason, _, sols, _, _ = _integrate_segments(
            sysm, Y.copy(), t0, stops, log_thr, rtol, atol, atol_vec, "relative", 0.0, method)
    except RuntimeError:   # pragma: no cover - a failed solve: the converged part only
        return t0, None, []
    if reason == 2:        # relative rates exactly 0 (Sigma' = 0, alpha' = 0): held
        return t_last, Ye, sols
    return (t_last if reason == 0 else float(Ye[0])), None, sols


def _segment_end(sol: Any, stop: float, method: str, convergence: str
                 ) -> tuple[int, np.ndarray, bool, str]:
    """How one ``solve_ivp`` call of :func:`_integrate_segments` ended.

    Returns ``(reason, Y, done, method)``: the reason code (as :func:`classify_members`),
    the state where it ended, whether the segment is done (``False`` after a switch to
    the stiff method) and the method to go on with.  Events: ``[size, time, convergence, budget,
    algebraic convergence]``."""
    if sol.t_events[0].size:
        return 1, sol.y_events[0][0], True, method
    if sol.t_events[2].size:
        return (6 if convergence in ("absolute", "trace") else 2), sol.y_events[2][0], True, \
            method
    if sol.t_events[4].size:
        return 5, sol.y_events[4][0], True, method
    if sol.t_events[1].size:
        Y = sol.y_events[1][0].copy()
        Y[0] = stop
        return 0, Y, True, method
    if sol.t_events[3].size and method != STIFF_METHOD:
        logger.info("solve: stiff at t=%.6g, switching to %s", sol.y_events[3][0][0],
                    STIFF_METHOD)
        return 0, sol.y_events[3][0], False, STIFF_METHOD
    if sol.t_events[3].size:
        return 3, sol.y_events[3][0], True, method   # the implicit budget spent as well
    return 0, sol.y[:, -1], True, method  # pragma: no cover - span is huge


def _fd_jacobian(sysm: MomentSystem):
    r"""Jacobian of the reparametrised system for the stiff method: central differences, all
    :math:`2n` shifted states in one vectorised right-hand-side call (scipy's default
    forward differences cost :math:`n` calls and overflow in their step search on stiff
    members); steps :math:`h_j = \epsilon^{1/3}\max(|y_j|, 1)`, error
    :math:`O(h^2)` relative, far below what the Newton iteration needs."""
    def jac(_s, y):
        n = y.size
        h = 6e-6 * np.maximum(np.abs(y), 1.0)
        Ys = np.repeat(y[None], 2 * n, axis=0)
        j = np.arange(n)
        Ys[j, j] += h
        Ys[n + j, j] -= h
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            f = sysm.rhs(Ys, np.zeros(2 * n, dtype=int))
            J = ((f[:n] - f[n:]) / (2.0 * h)[:, None]).T
        return np.where(np.isfinite(J), J, 0.0)
    return jac


def _projected_steps(sysm: MomentSystem, Ya: np.ndarray, Yb: np.ndarray, steps: int,
                     stop: float, log_thr: float, convergence: str, converge_tol: float,
                     atol: float) -> float:
    """Steps still needed from ``Yb`` to the nearest of: the time ``stop``, the size
    threshold ``exp(log_thr)`` and (relative / auto criteria) convergence, extrapolated
    linearly from the progress of the last ``steps`` steps (``Ya`` to ``Yb``) in ``t``,
    log size and log relative rate (``inf`` without progress)."""
    idx = np.zeros(2, dtype=int)
    Y2 = np.stack([Ya, Yb])
    proj = [math.inf]
    dt = float(Yb[0] - Ya[0])
    if dt > 0:
        proj.append(steps * (stop - float(Yb[0])) / dt)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        lsz = sysm.log_size(Y2, idx)
        if lsz[1] > lsz[0]:
            proj.append(steps * (log_thr - lsz[1]) / (lsz[1] - lsz[0]))
        if convergence in ("relative", "auto") and converge_tol > 0:
            lr = np.log(np.maximum(conv_rates(sysm, Y2, idx, atol)[0], 1e-300))
            if lr[1] < lr[0]:
                proj.append(steps * (lr[1] - math.log(converge_tol)) / (lr[0] - lr[1]))
    return max(min(proj), 0.0)


def _integrate_segments(sysm: MomentSystem, Y0: np.ndarray, t0: float, stops: list,
                        log_thr: float, rtol: float, atol: float, atol_vec: np.ndarray,
                        convergence: str, converge_tol: float, method: str,
                        stiff: dict | None = None
                        ) -> tuple[np.ndarray, int, list, list, int, str]:
    """The path of :func:`solve_from_factor` from ``Y0`` (time ``t0``), segment by segment
    between ``stops`` (layer breakpoints, then ``t_max``).

    ``STIFF_METHOD`` (after ``STIFF_STEPS`` explicit steps of a segment) runs in chunks of
    ``IMPLICIT_CHUNK`` steps with the Jacobian of :func:`_fd_jacobian`; from the second chunk
    on, when the steps projected to the next stop (:func:`projected_steps`) exceed what
    is left of ``IMPLICIT_STEPS``, the path stops there (code 3) and ``stiff`` (a dict,
    when given) receives ``projected``, ``dt`` (the last chunk's advance in ``t``),
    ``chunk`` and ``left``.

    Returns ``(Y, reason, seg_y, sols, nfev, method)``: the final state, its reason code
    (as :func:`classify_members`; 7: overflow, the last finite state kept), the states of
    the accepted steps per call, ``(dense solution, t start, t end)`` per call, the number
    of right-hand-side evaluations and the method in use at the end."""
    idx = np.zeros(1, dtype=int)
    seg_y: list[np.ndarray] = []
    sols: list[tuple[Any, float, float]] = []
    nfev = 0
    reason = 0
    s0 = 0.0
    t_lo = t0
    Y = Y0
    alg = np.full((1, 4), np.inf)
    fun = checked_rhs(sysm, idx)
    last = [Y0]   # the last finite state the events saw (accepted steps)

    def ev_size(_s, y):
        if np.all(np.isfinite(y)):
            last[0] = y.copy()
        return float(sysm.log_size(y[None], idx)[0]) - log_thr
    ev_size.terminal = True
    ev_size.direction = 1

    ev_conv, ev_alg, _ = conv_events(sysm, atol, convergence, converge_tol)
    jac = _fd_jacobian(sysm)
    for stop in stops:
        set_window(sysm, t_lo, stop)
        ev_time = time_event(stop)
        seg_done = False
        used = 0                     # stiff-method steps spent in this segment
        while not seg_done:
            c0 = int(converged_codes(convergence, conv_rates(sysm, Y[None], idx, atol),
                                     converge_tol, Y[None, 0], alg)[0])
            if c0:
                reason = c0          # already stationary: events only see sign changes
                break
            implicit = method == STIFF_METHOD
            budget = min(IMPLICIT_CHUNK, IMPLICIT_STEPS - used) if implicit else STIFF_STEPS
            events = [ev_size, ev_time, ev_conv, budget_event(budget), ev_alg]
            t_start = float(Y[0])
            Y_start = Y
            # unbounded s-span: the events (size, t = stop, convergence) end each segment
            try:
                sol = solve_ivp(fun, (s0, 1e300), Y, method=method, rtol=rtol, atol=atol_vec,
                                events=events, dense_output=True,
                                **({"jac": jac} if implicit else {}))
            except NonFinite:   # overflow: stop at the last finite accepted state
                reason = 7
                Y = last[0]
                seg_y.append(Y[None])
                break
            nfev += sol.nfev
            if sol.status == -1:    # scipy could not take a step (e.g. an atol below float64)
                raise SolverNotConverged(
                    f"the moment ODE's integrator failed at t = {float(sol.y[0, -1]):.6g} "
                    f"({sol.message}); rtol = {rtol:g} and atol = {atol:g} may ask for more "
                    f"than float64 resolves: loosen them")
            reason, Y, seg_done, method = _segment_end(sol, stop, method, convergence)
            if implicit and reason == 3:           # a chunk of stiff-method steps spent
                used += budget
                left = IMPLICIT_STEPS - used
                proj = _projected_steps(sysm, Y_start, Y, budget, stop, log_thr, convergence,
                                        converge_tol, atol)
                if left > 0 and (used < 2 * IMPLICIT_CHUNK or proj <= left):
                    reason, seg_done = 0, False   # on with the next chunk
                elif stiff is not None and left > 0:
                    stiff.update(projected=proj, dt=float(Y[0]) - t_start, chunk=budget,
                                 left=left)
            s_end = float(sol.t_events[next(i for i, e in enumerate(sol.t_events) if e.size)][0]) \
                if any(e.size for e in sol.t_events) else float(sol.t[-1])
            keep = sol.t < s_end
            seg_y.append(np.vstack([sol.y.T[keep], Y[None]]))
            sols.append((sol, t_start, float(Y[0])))
            s0 = s_end
        t_lo = stop
        if reason != 0:
            break
    return Y, reason, seg_y, sols, nfev, method
