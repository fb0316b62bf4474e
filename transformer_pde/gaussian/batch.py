r"""Many Gaussian initial conditions at once: :func:`solve_batch` and :class:`GaussianBatch`."""

from __future__ import annotations

import logging
import math
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .. import validation
from ..attention import Attention, Layers
from ..backends import compile_notice
from .. import results_display as display
from ..errors import ArgumentError, ArgumentTypeError, EarlyStopWarning
from ..io.saving import GAUSSIAN_BATCH_FORMAT, GAUSSIAN_FORMAT, read_gaussian
from ..results import ResultKind, Status
from . import lockstep, member
from .affine import check_attention, check_mean_cov, psd_factor
from .system import (
    CLASSIFY_SIZE,
    CONVERGENCE_MODES,
    MomentSystem,
    check_flag,
    check_solver_args,
    check_t_eval,
    classify_members,
    layer_breakpoints,
)
from .trajectory import STIFF_METHOD, GaussianFile, GaussianTrajectory, solve_from_factor

__all__ = ["GaussianBatch", "compile_kernel", "load", "solve_batch"]

#: the most members :func:`solve_batch` integrates in the interpreter while its kernel
#: compiles on the background thread (a cold cache); an interpreted step costs about a
#: hundred compiled ones, so a larger batch waits for the compiler instead
_INTERPRET_WHILE_COMPILING = 16
#: set while :func:`compile_kernel` runs: its own small solve compiles, never falls back
_COMPILING = threading.local()


def compile_kernel(general: bool = False) -> None:
    """Compile, or load from Numba's disk cache, the kernel of :func:`solve_batch`: the one
    of softmax and linear members, or with ``general`` the one of l2 and Sinkhorn members
    (``transformer-pde warmup`` calls it; so does the background thread of a first small
    call)."""
    Q = np.array([[0.4, 0.1], [-0.2, 0.6]])
    covs = np.array([[[0.6, 0.1], [0.1, 0.4]], [[0.3, 0.0], [0.0, 0.7]]])
    _COMPILING.on = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EarlyStopWarning)
            if general:
                solve_batch(Attention("sinkhorn", Q, np.eye(2), np.eye(2)), np.zeros((1, 2)),
                            covs[:1], t_max=0.1)
            else:
                solve_batch(Attention("softmax", Q, np.eye(2), np.eye(2)), np.zeros((2, 2)),
                            covs, t_max=1.0)
    finally:
        _COMPILING.on = False


def _compiled(use_numba: bool, kind: str, n_members: int) -> bool:
    """Whether this call runs the compiled kernel: ``use_numba``, unless the kernel is
    neither compiled nor in the disk cache and the batch is small — then the same
    integrator runs in the interpreter (the same steps; results equal to rounding) while
    the kernel compiles on the background thread, so a first call never waits for it."""
    if not (use_numba and lockstep.AVAILABLE) or n_members > _INTERPRET_WHILE_COMPILING \
            or getattr(_COMPILING, "on", False):
        return use_numba
    general = kind in ("l2", "sinkhorn")
    kernel = lockstep.lanes_general if general else lockstep.lanes_affine
    what = "l2 / sinkhorn" if general else "softmax / linear"
    return compile_notice.ready_or_background(f"solve_batch kernel ({what})",
                                              [(kernel, "float64")],
                                              lambda: compile_kernel(general))

logger = logging.getLogger(__name__)

_STIFF_STEPS_BATCH = 4000  # step attempts per member of solve_batch before the stiff hand-off


def _tabulated(att: Attention) -> bool:
    """Whether every time-dependent parameter of ``att`` is a :class:`~transformer_pde.Layers`
    table (constant between breakpoints: the member integrator takes it as a table)."""
    return not any(callable(v) and not isinstance(v, Layers)
                   for v in (att.Q, att.K, att.V, att.W_O))


@dataclass(repr=False)
class GaussianBatch(GaussianFile):
    r"""Result of :func:`solve_batch` (``B`` members).

    Attributes
    ----------
    status : ndarray (B,) of str
        Values of :class:`~transformer_pde.results.Status` (``"ok"``, ``"converged"``,
        ``"blowup"``, ``"diverging"``, ``"max_steps"``), so ``res.status == "blowup"``
        selects members.
    blowup_time : ndarray (B,)  (``nan`` unless blow-up)
    t_final : ndarray (B,)
        Time of the final state (on the blow-up threshold for blow-ups).
    means, covs : ndarray (B, d), (B, d, d)
        Final states (on the blow-up threshold, :math:`\nu = ` ``blowup_threshold`` to
        1e-12 relative, for members that reached it).
    limit : ndarray (B, d, d)
        :math:`\Sigma/\operatorname{tr}\Sigma`, extrapolated to :math:`T^*` on blow-up
        (linearly from the continuation size; where that leaves the positive semi-definite
        cone, the shape at that size, and the member's message says so).
    n_steps : ndarray (B,)
        Accepted explicit steps per member up to the final state (stiff members handed to
        LSODA add ``nfev // 2``, about its steps; members with callable parameters count ``nfev // 12`` of
        :func:`solve`'s DOP853).
    t_eval : ndarray (T,) or None
    traj_means, traj_covs : ndarray (B, T, d), (B, T, d, d) or None
        States at ``t_eval``: NaN after a member stopped without converging; after a
        convergence, the states of the path integrated on (without the convergence test)
        or, for an exactly stationary state, that state.
    messages : list of str (B)
        Per-member explanation of the status.
    """

    status: np.ndarray
    blowup_time: np.ndarray
    t_final: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    limit: np.ndarray
    n_steps: np.ndarray
    t_eval: np.ndarray | None = None
    traj_means: np.ndarray | None = None
    traj_covs: np.ndarray | None = None
    messages: list = field(default_factory=list)

    #: :class:`~transformer_pde.results.ResultKind` of the result protocol
    result_kind: ClassVar[ResultKind] = ResultKind.GAUSSIAN_BATCH
    _FILE_FORMAT: ClassVar[str] = GAUSSIAN_BATCH_FORMAT

    def __len__(self) -> int:
        return self.status.shape[0]

    @property
    def success(self) -> np.ndarray:
        """Per member: :attr:`Status.success <transformer_pde.results.Status.success>`."""
        return np.array([Status(s).success for s in self.status], dtype=bool)

    @property
    def times(self) -> np.ndarray:
        """The common output times ``t_eval`` (empty without ``t_eval``)."""
        return np.zeros(0) if self.t_eval is None else self.t_eval

    @property
    def message(self) -> str:
        """One sentence: the number of members per status."""
        c = {k: v for k, v in self.counts().items() if v}
        return f"{len(self)} members: " + ", ".join(f"{v} {k}" for k, v in c.items())

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """``(means, covs)`` at ``t_eval``, shapes ``(B, T, d)`` and ``(B, T, d, d)`` (NaN
        after a member stopped); raises if the batch was solved without ``t_eval``."""
        if self.t_eval is None:
            raise ArgumentError("moments() needs states at common times: call solve_batch "
                                "with t_eval (the final states are .means and .covs)")
        return self.traj_means, self.traj_covs

    def counts(self) -> dict[str, int]:
        """Number of members per status (every :class:`~transformer_pde.results.Status`)."""
        return {s.value: int(np.sum(self.status == s.value)) for s in Status}

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        B, d = np.shape(self.means)
        rows = [("status", display.counts_text(self.counts())),
                ("t_eval", display.time_span(self.t_eval, "times") if self.t_eval is not None
                 else "none (final states only)"),
                ("t_final", display.stats_text(self.t_final))]
        blow = self.status == "blowup"
        if np.any(blow):
            rows.append(("blowup_time", display.stats_text(self.blowup_time[blow])))
        rows += [("final means, covs", f"{display.array_summary(self.means)}, "
                                       f"{display.array_summary(self.covs)}"),
                 ("steps", display.stats_text(self.n_steps))]
        return f"GaussianBatch(members={B}, d={d})", rows

    def __getitem__(self, i: int) -> GaussianTrajectory:
        """Member ``i`` as a :class:`GaussianTrajectory` (its states at ``t_eval`` up to its
        stop, then its final state)."""
        i = int(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"member {i} out of range for a batch of {len(self)}")
        i %= len(self)
        if self.t_eval is not None:
            keep = np.isfinite(self.traj_covs[i, :, 0, 0])
            times, ms, cs = self.t_eval[keep], self.traj_means[i, keep], self.traj_covs[i, keep]
        else:
            times = np.zeros(0)
            ms = np.zeros((0,) + self.means.shape[1:])
            cs = np.zeros((0,) + self.covs.shape[1:])
        if not times.size or times[-1] < self.t_final[i]:
            times = np.append(times, self.t_final[i])
            ms = np.concatenate([ms, self.means[i][None]])
            cs = np.concatenate([cs, self.covs[i][None]])
        return GaussianTrajectory(times, ms, cs, Status(self.status[i]),
                                  float(self.blowup_time[i]), self.limit[i],
                                  float(self.t_final[i]), self.messages[i], 0,
                                  self.means[i], self.covs[i])


def solve_batch(att: Attention | Sequence[Attention], means0: Any, covs0: Any, *, t_max: float,
                rtol: float = 1e-10, atol: float = 1e-12, blowup_threshold: float = 1e8,
                converge_tol: float = 1e-10, convergence: str = "auto", t_eval: Any = None,
                max_steps: int = 100_000, use_numba: bool = True, warn: bool = True
                ) -> GaussianBatch:
    r"""Integrate many Gaussian initial conditions (and optionally parameter sets) together.

    Each member is integrated by the DOP853 integrator of
    :mod:`transformer_pde.gaussian.lockstep` on the reparametrised system of
    :mod:`transformer_pde.gaussian`, **with its own step size, error control and event
    handling**.  Members land exactly (to :math:`10^{-12}` relative) on ``t_eval`` points,
    :class:`~transformer_pde.Layers` breakpoints, ``t_max`` and the size threshold by
    secant-adjusted steps in :math:`s`.  Statuses, :math:`T^*` and limits follow
    :func:`solve` (same classification, measured past the threshold as there), and the
    results agree with :func:`solve` member by member to about ``1e3 * rtol``.  Members whose
    parameters are callables of ``t`` (not :class:`~transformer_pde.Layers` tables) are
    integrated one by one by :func:`solve`'s integrator.

    Parameters
    ----------
    att : Attention or sequence of B Attention
        One specification for all members, or one per member (same kind, ``d`` and heads).
    means0 : array_like (B, d)
    covs0 : array_like (B, d, d)
    t_max, rtol, atol, blowup_threshold, converge_tol, convergence
        As in :func:`solve`.
    t_eval : array_like (T,), optional
        Common output times (finite, strictly increasing, in ``[0, t_max]``);
        ``traj_means`` / ``traj_covs`` hold NaN after a member stopped without converging
        (a converged member is integrated on to the last output time, as in :func:`solve`).
    max_steps : int
        Step attempts per member (>= 1) of the explicit method, capped at 4000; a member that needs
        more (typically a stiff one: a collapsing direction of :math:`\Sigma` decaying much
        faster than the rest evolves) is continued alone with the stiff method (LSODA)
        (see :func:`solve`).
    use_numba : bool
        (A bool: anything else raises :class:`~transformer_pde.errors.ArgumentTypeError`.)
        ``True``: the integrator compiled by numba, in SIMD lanes
        (:mod:`~transformer_pde.gaussian.lockstep`: the states of 64 members side by side,
        each with its own steps, stops and events; l2 and sinkhorn evaluate their field lane
        by lane); from
        :data:`~transformer_pde.gaussian.member.PAR_MIN_MEMBERS` members on, chunks of
        members run on numba's threads (members are independent, so the results are
        identical for any thread count).  The first call compiles the kernel (cached on
        disk; ``transformer-pde warmup`` compiles it ahead of time); a batch of at most 16
        members does not wait for that: while the kernel compiles on a background thread
        it runs on the interpreter as with ``False``.  ``False`` (or without
        numba): the same integrator run by the interpreter member by member: the same
        steps and statuses, states equal up to rounding (a few ulps per step), at a much
        higher cost per member.
    warn : bool, default True
        Issue the warning below; ``False`` leaves the statuses as the only report.

    Returns
    -------
    GaussianBatch
        Blow-ups, divergences and convergences are answers, reported in ``status`` only.

    Warns
    -----
    EarlyStopWarning
        Once per call, when members ended without an answer (step budget, overflow:
        status ``"nonfinite"``, a failed solve), with the counts.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        As :func:`solve` (``means0`` / ``covs0`` for ``mean0`` / ``cov0``), and for
        ``use_numba`` not a bool or ``max_steps`` not an integer >= 1.
    """
    atts = _check_atts(att)
    d = atts[0].d
    m0, c0 = check_mean_cov(means0, covs0, d, "means0", "covs0", batch=True)
    B = m0.shape[0]
    if len(atts) > 1 and len(atts) != B:
        raise ArgumentError(f"att has {len(atts)} members but means0 has {B}")
    check_solver_args(t_max, rtol, atol, blowup_threshold, converge_tol, convergence)
    t_eval = check_t_eval(t_eval, float(t_max))
    use_numba = check_flag("use_numba", use_numba)
    warn = check_flag("warn", warn)
    max_steps = validation.integer("max_steps", max_steps, minimum=1)
    sysm = MomentSystem(atts, B)
    use_numba = _compiled(use_numba, sysm.kind, B)
    all_idx = np.arange(B)
    Y = sysm.pack(np.zeros(B), m0, psd_factor(c0), all_idx)
    log_thr = math.log(blowup_threshold)
    log_thr_c = math.log(max(blowup_threshold, CLASSIFY_SIZE))
    if np.any(sysm.log_size(Y, all_idx) >= log_thr):
        i = int(np.argmax(sysm.log_size(Y, all_idx)))
        raise ArgumentError(f"member {i}: the initial size already exceeds blowup_threshold")
    n = sysm.n
    atol_vec = np.full(n, atol)
    atol_vec[1] = rtol            # rho is a log: its error is a relative error of F
    budget = min(int(max_steps), _STIFF_STEPS_BATCH)

    te = None if t_eval is None else np.unique(np.asarray(t_eval, float).ravel())
    if te is not None:
        te = te[(te >= 0) & (te <= t_max)]
    bps = layer_breakpoints(atts, 0.0, math.inf)
    stop_tab, cont_tab = _stop_tables(bps, te, float(t_max))
    traj_m, traj_c = _output_arrays(te, m0, c0)
    # full states landed on at t_eval (row eval_pos[k] for stop k), NaN until reached; the
    # moments are taken once after the integration
    trY = np.full((B, 1 if te is None else max(te.size, 1), n), np.nan)
    ctl = member.controls(rtol, atol, log_thr, log_thr_c, converge_tol,
                          CONVERGENCE_MODES[convergence], budget)
    # members whose parameters are callables of t (no table of constant segments) are
    # integrated one by one by solve's integrator below
    smooth = [a.time_dependent and not _tabulated(a) for a in atts]
    handed = np.arange(B) if all(smooth) else np.nonzero(smooth)[0] if len(atts) > 1 \
        else np.zeros(0, dtype=int)
    run = np.setdiff1d(np.arange(B), handed)
    reason = np.full(B, -1)
    creason = np.full(B, -1)
    n_steps = np.zeros(B, dtype=int)
    Yc = Y.copy()
    if run.size:
        atts_r = [atts[i] for i in run] if len(atts) > 1 else atts
        prm, con = member.param_table(atts_r, sysm.kind, bps)
        Yr, trYr = np.ascontiguousarray(Y[run]), np.ascontiguousarray(trY[run])
        reason[run], n_steps[run], Yc[run], creason[run] = member.run_members(
            MomentSystem(atts_r, run.size), Yr, trYr, prm, con, stop_tab, cont_tab, ctl,
            atol_vec, use_numba)
        Y[run], trY[run] = Yr, trYr
        if te is not None:
            _converged_outputs(atts, sysm.kind, run, reason, Y, trY, te, bps, rtol, atol,
                               log_thr, budget, atol_vec, use_numba)
    reason[handed] = 4

    if te is not None:
        _fill_outputs(sysm, trY, traj_m, traj_c)

    status, Tstar, limit, msgs = classify_members(
        sysm, Y, all_idx, converge_tol, np.where(np.isin(reason, (3, 4)), 0, reason), Yc,
        convergence, creason, log_thr)
    t_fin, means, covs = sysm.moments(Y, all_idx)
    # members that became stiff: continued one by one with the stiff method (LSODA);
    # members with parameters that are callables of t: solve's integrator (scipy's DOP853)
    for i in np.nonzero((reason == 3) | (reason == 4))[0]:
        method = STIFF_METHOD if reason[i] == 3 else "DOP853"
        logger.info("solve_batch: member %d at t=%.6g continued with %s", i, t_fin[i], method)
        F_i = np.exp(Y[i, 1]) * Y[i, 2:2 + d * d].reshape(d, d)
        tr = _solve_one(atts[i] if len(atts) > 1 else atts[0], float(t_fin[i]), means[i], F_i,
                        None if te is None else te[te > t_fin[i]], method, t_max=float(t_max),
                        rtol=rtol, atol=atol, blowup_threshold=blowup_threshold,
                        converge_tol=converge_tol, convergence=convergence)
        status[i], Tstar[i], limit[i], msgs[i] = tr.status, tr.blowup_time, tr.limit, tr.message
        t_fin[i] = tr.t_final
        if te is not None and len(tr.times):
            pos = np.searchsorted(te, tr.times)
            traj_m[i, pos] = tr.means
            traj_c[i, pos] = tr.covs
        means[i], covs[i] = tr.final_mean, tr.final_cov
        n_steps[i] += tr.nfev // (2 if method == STIFF_METHOD else 12)
    value = {st: st.value for st in Status}          # (enum attribute access is slow)
    res = GaussianBatch(np.array([value[s] for s in status]), Tstar, t_fin, means, covs, limit,
                        n_steps, te, traj_m, traj_c, msgs)
    if warn:
        _warn_unanswered(res, float(t_max))
    return res


def _converged_outputs(atts: list, kind: str, run: np.ndarray, reason: np.ndarray,
                       Y: np.ndarray, trY: np.ndarray, te: np.ndarray, bps: np.ndarray,
                       rtol: float, atol: float, log_thr: float, budget: int,
                       atol_vec: np.ndarray, use_numba: bool) -> None:
    """The states at the output times ``te`` after a member of ``run`` converged (codes 2,
    5, 6), written into ``trY``: the member is integrated on from its final state by the
    same kernel without the convergence test (only an exactly stationary state, relative
    rates 0, stops it; that state is then held at the later times); the size threshold,
    the step budget or an overflow leave the later rows NaN.  ``Y`` (the final states, on
    the convergence) is not changed."""
    if not te.size:                 # no output times: nothing to report after convergence
        return
    cont = run[np.isin(reason[run], (2, 5, 6)) & (Y[run, 0] < te[-1])]
    if not cont.size:
        return
    atts_k = [atts[i] for i in cont] if len(atts) > 1 else atts
    prm, con = member.param_table(atts_k, kind, bps)
    stop_tab, cont_tab = _stop_tables(bps, te, float(te[-1]))
    ctl = member.controls(rtol, atol, log_thr, log_thr, 0.0, CONVERGENCE_MODES["relative"],
                          budget)
    Yk, trYk = np.ascontiguousarray(Y[cont]), np.ascontiguousarray(trY[cont])
    code, _, _, _ = member.run_members(MomentSystem(atts_k, cont.size), Yk, trYk, prm, con,
                                       stop_tab, cont_tab, ctl, atol_vec, use_numba)
    for j in np.nonzero(code == 2)[0]:       # exactly stationary: held
        later = te > Yk[j, 0]
        trYk[j, later] = Yk[j]
        trYk[j, later, 0] = te[later]
    trY[cont] = trYk


def _warn_unanswered(res: GaussianBatch, t_max: float) -> None:
    """One :class:`~transformer_pde.errors.EarlyStopWarning` for the members of ``res``
    that ended without an answer (``status.success`` false), with their counts and the
    first one's message; nothing when every member answered."""
    bad = np.isin(res.status, [st.value for st in Status if not st.success])
    if np.any(bad):
        counts = {k: v for k, v in res.counts().items() if v and not Status(k).success}
        first = int(np.argmax(bad))
        warnings.warn(f"solve_batch: {int(bad.sum())} of {bad.size} members ended without an "
                      f"answer before t_max={t_max:g} "
                      f"({', '.join(f'{v} {k}' for k, v in counts.items())}); "
                      f"member {first}: {res.messages[first]}", EarlyStopWarning,
                      stacklevel=3)


def load(path: str | Path) -> GaussianTrajectory | GaussianBatch:
    """Read a Gaussian result written by
    :meth:`~transformer_pde.gaussian.GaussianTrajectory.save` or
    :meth:`~transformer_pde.gaussian.GaussianBatch.save`: whichever the file holds, after
    checking every array against its digest and the invariants of
    :func:`transformer_pde.io.saving.check_gaussian`.

    Raises
    ------
    IntegrityError
        The file is damaged, edited, or not a Gaussian result; the message names it.
    FileNotFoundError
        No such file.
    """
    fmt, fields = read_gaussian(path)
    return GaussianTrajectory(**fields) if fmt == GAUSSIAN_FORMAT else GaussianBatch(**fields)


def _check_atts(att: Attention | Sequence[Attention]) -> list[Attention]:
    """``att`` of :func:`solve_batch` as a non-empty list of checked specifications that
    agree in kind, ``d``, heads and ``W_O`` presence (else :class:`ArgumentError` /
    :class:`ArgumentTypeError`)."""
    if isinstance(att, Attention):
        return [check_attention(att)]
    if not isinstance(att, Sequence) or isinstance(att, (str, bytes)):
        raise ArgumentTypeError("att must be an Attention or a sequence of them, got "
                                f"{type(att).__name__}")
    atts = [check_attention(a) for a in att]
    if not atts:
        raise ArgumentError("att must be an Attention or a non-empty sequence of them")
    a0 = atts[0]
    for i, a in enumerate(atts):
        if (a.kind, a.d, a.heads, a.W_O is None) != (a0.kind, a0.d, a0.heads, a0.W_O is None):
            raise ArgumentError(f"att[{i}] differs from att[0] in kind, d, heads or W_O "
                                "presence")
    return atts


def _stop_tables(bps: np.ndarray, te: np.ndarray | None, t_max: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The ``(3, n)`` stop tables ``[time, output row or -1, parameter segment]`` of
    :func:`~transformer_pde.gaussian.member.run_members`: of the run (layer breakpoints
    ``bps`` below ``t_max``, ``t_max`` and the positive output times ``te``) and of the
    continuation past the threshold (the breakpoints, then ``inf``)."""
    stops = np.unique(np.concatenate([
        bps[bps < t_max], np.array([t_max]), te[te > 0] if te is not None else np.zeros(0)]))
    te_pos = {float(v): i for i, v in enumerate(te)} if te is not None else {}
    eval_pos = np.array([te_pos.get(float(v), -1) for v in stops], dtype=float)
    stops_c = np.concatenate([bps, [math.inf]])
    stop_tab = np.stack([stops, eval_pos, np.searchsorted(bps, stops)]).astype(float)
    cont_tab = np.stack([stops_c, np.full(stops_c.size, -1.0), np.searchsorted(bps, stops_c)])
    return stop_tab, cont_tab


def _solve_one(att: Attention, t0: float, mean: np.ndarray, F: np.ndarray, t_eval: Any,
               method: str, **kw: Any) -> GaussianTrajectory:
    """One member of :func:`solve_batch` continued from ``t0`` by :func:`solve_from_factor`
    with ``method``; its :class:`~transformer_pde.errors.EarlyStopWarning` is silenced (the
    batch warns once)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EarlyStopWarning)
        return solve_from_factor(att, t0, mean, F, t_eval=t_eval, method=method, **kw)


def _output_arrays(te: np.ndarray | None, m0: np.ndarray, c0: np.ndarray
                   ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(traj_means, traj_covs)`` of :func:`solve_batch`, (B, T, d) and (B, T, d, d), NaN
    but for the initial states at ``te[0] == 0``; ``(None, None)`` without output times."""
    if te is None:
        return None, None
    B, d = m0.shape
    traj_m = np.full((B, te.size, d), np.nan)
    traj_c = np.full((B, te.size, d, d), np.nan)
    if te.size and te[0] == 0.0:
        traj_m[:, 0] = m0
        traj_c[:, 0] = c0
    return traj_m, traj_c


def _fill_outputs(sysm: MomentSystem, trY: np.ndarray, traj_m: np.ndarray,
                  traj_c: np.ndarray) -> None:
    """Write the moments of the packed states ``trY`` (B, T, n) landed on at the output
    times into ``traj_m`` / ``traj_c`` (rows not reached, NaN, are left as they are)."""
    bi, ti = np.nonzero(np.isfinite(trY[:, :, 0]))
    if bi.size:
        _, mm, SS = sysm.moments(trY[bi, ti], bi)
        traj_m[bi, ti] = mm
        traj_c[bi, ti] = SS
