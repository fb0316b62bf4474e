r"""One time loop for fixed and adaptive steps, with the run options it reads.

:class:`TimeLoop` advances :math:`\dot y = F(t, y)` from :math:`t = 0` to :math:`t_{max}`
with a solver of :mod:`~.solvers`, saving where a :class:`SaveAt` says, stopping on the
events of :class:`Limits` (a state above ``max_norm``, a non-finite state, the step
budget) and reporting through :class:`Monitor` (progress bar, periodic log lines,
checkpoints).  It ends with a :class:`~transformer_pde.results.Status` and a message.

**One loop body.**  Every step goes through the same body: a step-size controller
(:mod:`~.controller`) proposes a step towards the next *target*, the solver tries it, the
controller accepts it or sizes a retry, and the accepted state is checked, saved and
reported.  Fixed-step solvers are driven by :class:`~.controller.ConstantStepSize`,
embedded pairs by their :class:`~.controller.PIController` (``solver.controller()``).

**Steps and targets.**  The run is cut into segments ending at the *stops*: the save
times of ``SaveAt(ts=...)`` (or only :math:`t_{max}`; :func:`~.plan.segment_stops`).  A
fixed-step solver takes, in a segment of length :math:`L`,
:math:`n = \max(1, \lceil L/\Delta t - 10^{-9}\rceil)` steps of size :math:`\Delta t` (the
last one shorter, landing exactly on the stop): the step count is decided relative to the
step, so ``t_max = 1e-11, dt = 1e-13`` takes exactly 100 steps.  An adaptive solver lands
on every save time of its grid (``SaveAt(every=k)``: the multiples of :math:`k\,\Delta t`;
``SaveAt(ts=...)``: the stops) and on every jump of a piecewise-constant parameter
(:mod:`~.breakpoints`).  Fixed steps save every ``every``-th step, adaptive ones at the
grid points they land on.

**Step budget.**  ``Limits.max_steps`` counts attempted steps.  A fixed-step run that
needs more is refused before it starts (:func:`~.plan.check_step_budget`); an adaptive
run stops with status ``max_steps`` after the attempt that uses up the budget (that
attempt is not taken).

**Left limits.**  Stages evaluated at the right end of a step get ``left=True``, so that a
step over :math:`[\ell h, (\ell+1)h]` only sees layer :math:`\ell` of a
:class:`~transformer_pde.Layers` table.

**Exceptions.**  The run owns what its computation raises (:func:`owned`): status
``failed``; Ctrl-C ends it with status ``interrupted``; anything else (an exception of a
signal handler such as a caller's timeout, ``MemoryError``, ``SystemExit``) passes
through with a note.  None of them writes a checkpoint, so the last periodic one, always
whole, is what a resume continues (:meth:`TimeLoop.run`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import (ArgumentError, ArgumentTypeError, SinkhornNotConverged,
                      SolverNotConverged)
from ..extras import progress_bar
from ..results import Status
from ..validation import positive
from .breakpoints import is_jump
from .controller import ConstantStepSize, Step, n_fixed_steps
from .solvers import AdaptiveSolver, Solver
from .plan import (check_step_budget, physical_memory, planned_saves, planned_steps,
                   segment_stops)
from .state import LoopState

__all__ = ["Limits", "Monitor", "Progress", "SaveAt", "TimeLoop", "owned"]

logger = logging.getLogger("transformer_pde.integrate")


# ------------------------------------------------------------------ options
@dataclass(frozen=True, eq=False)
class SaveAt:
    r"""What a run keeps (anchor: diffrax ``SaveAt``).

    Parameters
    ----------
    every : int, optional
        Save the initial state, every ``every``-th step of size ``dt`` (times
        :math:`k\cdot\mathrm{every}\cdot\Delta t`; for adaptive solvers the grid the steps
        land on) and the final state.  Default 1 unless ``ts`` is given.
    ts : array_like (T,), optional
        Save exactly at these times (sorted, distinct, in :math:`[0, t_{max}]`); steps are
        shortened to land on them.  Not together with ``every``.
    fn : callable ``fn(t, X, weights) -> array``, optional
        Keep ``fn``'s value (a statistic: moments, cluster counts, ...) at each save time
        instead of the state: ``X`` is the (N, d) host array (float64 or float32) and
        ``weights`` the normalised token weights.  Memory is then :math:`T \times` the size
        of ``fn``'s output instead of :math:`T\times N\times d`; the trajectory keeps the
        values in ``traj.values``, the weighted moments in ``traj.moments()`` and only the
        last state.
    """

    every: int | None = None
    ts: Any = None
    fn: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.every is not None and self.ts is not None:
            raise ArgumentError("SaveAt: give every or ts, not both")
        if self.ts is None:
            every = 1 if self.every is None else self.every
            if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
                raise ArgumentError(f"SaveAt: every must be an integer >= 1, got {every!r}")
            set_(self, "every", int(every))
        else:
            try:
                ts = np.array(self.ts, dtype=float).ravel()
            except (TypeError, ValueError):
                raise ArgumentTypeError(f"SaveAt: ts must be an array of times, got {self.ts!r}") from None
            if np.iscomplexobj(self.ts):
                raise ArgumentTypeError("SaveAt: ts must be real")
            if ts.size == 0 or not np.all(np.isfinite(ts)) or np.any(ts < 0) \
                    or np.any(np.diff(ts) <= 0):
                raise ArgumentError("SaveAt: ts must be a non-empty, strictly increasing array "
                                    f"of finite times >= 0, got {self.ts!r}")
            ts.setflags(write=False)
            set_(self, "ts", ts)
        if self.fn is not None and not callable(self.fn):
            raise ArgumentTypeError(f"SaveAt: fn must be callable, got {type(self.fn).__name__}")


@dataclass(frozen=True, eq=False)
class Limits:
    """When a run stops early, and which runs are refused up front.

    Parameters
    ----------
    max_norm : float, default 1e8
        Stop with status ``blowup`` once some :math:`|x_i|_\\infty` exceeds it (that state
        is saved).
    max_steps : int, default 1_000_000
        Step budget (attempted steps).  A fixed-step run needing more is refused before
        it starts; an adaptive run that exhausts it stops with status ``max_steps``.
    max_memory : float, optional
        Bytes the saved states may take (default: 8 GiB or half the physical memory,
        whichever is smaller).  A run whose saves would need more is refused before it
        starts.
    """

    max_norm: float = 1e8
    max_steps: int = 1_000_000
    max_memory: float | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "max_norm", positive("max_norm", self.max_norm))
        ms = self.max_steps
        if isinstance(ms, bool) or not isinstance(ms, (int, np.integer)):
            raise ArgumentTypeError(f"max_steps must be an integer, got {ms!r}")
        if ms < 1:
            raise ArgumentError(f"max_steps must be >= 1, got {ms!r}")
        set_(self, "max_steps", int(ms))
        if self.max_memory is not None:
            set_(self, "max_memory", positive("max_memory", self.max_memory))

    def memory_limit(self) -> float:
        """``max_memory``, or the smaller of 8 GiB and half the physical memory."""
        if self.max_memory is not None:
            return self.max_memory
        cap = 8.0 * 2 ** 30
        memory = physical_memory()
        return cap if memory is None else min(cap, 0.5 * memory)


@dataclass(frozen=True, eq=False)
class Monitor:
    """Progress reports and checkpoints of a run.

    Parameters
    ----------
    progress : bool, default False
        Show a tqdm progress bar (in :math:`t`) and log an INFO line on the
        ``transformer_pde`` logger every ``report_every`` seconds.
    report_every : float, default 30.0
        Seconds between progress log lines.
    checkpoint : str or Path, optional
        File to which the whole state of the run (time, tokens, saved states, solver
        history, Sinkhorn warm starts, counters) is written every ``checkpoint_every``
        seconds and at the end of a finished run (atomically: a temporary file renamed
        over it; format in :mod:`~.checkpoint`).  The path is checked before the first
        step: its folder must exist and accept new files, and it must not be a folder, a
        device or another special file, nor an existing file other than a checkpoint
        (never overwritten).  A write that fails during the run (full disk, folder
        removed) issues a :class:`~transformer_pde.errors.CheckpointWarning` and the run
        goes on.
    checkpoint_every : float, default 60.0
        Seconds between checkpoints.
    resume : bool, default False
        Continue from ``checkpoint`` when that file exists (else start afresh).  The
        resumed run equals an uninterrupted one bit for bit: the file holds the state,
        the saved states, the counters, the solver's history (Adams–Bashforth), the
        step-size controller and the Sinkhorn warm starts; only the progress bar and the
        checkpoint timer start again.  The file must come from the same problem
        (attention, tokens, solver, times, saving, block, field options, limits; callables
        of time by their values where the checkpointed part of the run used them: probe
        and stage times), else :class:`~transformer_pde.errors.CheckpointError` names what
        differs; a file that was edited, truncated or corrupted, or whose loop state
        breaks an invariant of the run, is an
        :class:`~transformer_pde.errors.IntegrityError`.  A finished run also writes its
        final checkpoint, so resuming it returns at once.

    Notes
    -----
    Ctrl-C (``KeyboardInterrupt``) ends a run with status ``interrupted`` and keeps the
    states saved so far; an exception the run does not own (:func:`owned`: a caller's
    timeout raised by a signal handler, ``MemoryError``, ``SystemExit``) propagates.
    Neither writes a checkpoint (the interrupted step may have half-updated the warm
    starts): the last periodic checkpoint, always whole, stays the one to resume from.
    """

    progress: bool = False
    report_every: float = 30.0
    checkpoint: str | Path | None = None
    checkpoint_every: float = 60.0
    resume: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name in ("progress", "resume"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ArgumentTypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
            set_(self, name, bool(getattr(self, name)))
        set_(self, "report_every", positive("report_every", self.report_every))
        set_(self, "checkpoint_every", positive("checkpoint_every", self.checkpoint_every))
        if self.checkpoint is not None:
            if not isinstance(self.checkpoint, (str, os.PathLike)):
                raise ArgumentTypeError(
                    f"checkpoint must be a path, got {type(self.checkpoint).__name__}")
            set_(self, "checkpoint", Path(self.checkpoint))
        elif self.resume:
            raise ArgumentError("resume=True needs checkpoint=PATH")


# ------------------------------------------------------------------ progress
class Progress:
    """tqdm bar in t and INFO log lines every ``every`` seconds."""

    def __init__(self, total: float, enabled: bool, every: float, desc: str, t0: float = 0.0):
        self.total, self.enabled, self.every, self.desc = total, enabled, every, desc
        self.bar = None
        self.done = t0
        self.last = time.monotonic()
        if enabled:  # a final text line survives in executed notebooks (see progress_bar)
            self.bar = progress_bar(total=total, initial=t0, desc=desc, unit="t",
                                    bar_format="{l_bar}{bar}| {n:.3g}/{total:.3g} "
                                               "[{elapsed}<{remaining}]")

    def update(self, t: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(t - self.done)
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            pct = 100.0 * t / self.total if self.total > 0 else 100.0
            logger.info("%s: t = %.6g / %.6g (%.1f%%)", self.desc, t, self.total, pct)
        self.done = t

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------------ the loop
def _code(handler: Any) -> Any:
    """The code object a Python signal handler runs (function, method, callable object or
    ``functools.partial``); ``None`` for ``SIG_DFL``, ``SIG_IGN`` and builtins."""
    for _ in range(8):
        inner = getattr(handler, "func", None)   # functools.partial
        if inner is None:
            break
        handler = inner
    fn = getattr(handler, "__func__", handler)   # a bound method
    code = getattr(fn, "__code__", None)
    if code is None and callable(handler):
        call = type(handler).__call__   # a callable object
        code = getattr(getattr(call, "__func__", call), "__code__", None)
    return code


def owned(exc: BaseException) -> bool:
    """Whether a run owns ``exc``: it then ends the run with status ``failed``.

    A run owns the exceptions (``Exception``) raised by its own computation: the field
    and its callables of time, the solver, ``SaveAt.fn``, the library's errors,
    ``FloatingPointError``, ``LinAlgError``, and any error of a user callable.  It does
    not own, and lets through: exceptions outside ``Exception`` (``SystemExit``,
    ``GeneratorExit``; ``KeyboardInterrupt`` ends the run with status ``interrupted``),
    ``MemoryError`` (the process, not the problem, ran out), and any exception raised by a
    Python signal handler installed with :func:`signal.signal` (its traceback, or that of
    the exception it was raised from or during, passes through the handler's code): a
    caller's timeout (``SIGALRM`` raising ``TimeoutError`` or a class of its own), a
    scheduler's ``SIGTERM``."""
    if not isinstance(exc, Exception) or isinstance(exc, MemoryError):
        return False
    codes = set()
    for sig in signal.valid_signals():
        try:
            codes.add(_code(signal.getsignal(sig)))
        except (OSError, ValueError):   # pragma: no cover - a signal Python cannot query
            continue
    codes.discard(None)
    todo, seen = [exc], set()
    while todo and codes:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code in codes:
                return False
            tb = tb.tb_next
        todo += [e.__cause__, e.__context__]
    return True


class TimeLoop:
    r"""Advance a state with a solver, saving, stopping on events, reporting.

    Parameters
    ----------
    solver : Solver or AdaptiveSolver
        Fixed-step (``step``) or adaptive (``attempt`` and ``controller()``), as checked by
        :func:`~.solvers.get_solver`.
    field : callable ``field(t, y, left, stage) -> dy``
        The right-hand side; ``left`` asks for left limits of piecewise-constant
        parameters, ``stage`` is the index of the evaluation within a fixed step
        (``None`` for adaptive steps, which may be retried), for warm starts.
    t_max, dt : float
        Final time; step size (fixed) or save-grid unit and first trial step (adaptive).
    saveat : SaveAt
    limits : Limits
    tables : list of Layers
        Piecewise-constant parameters: adaptive steps land on their jumps, multistep
        histories restart there.
    xp : array namespace of the state
    save : callable ``save(t, y)``
        Called at every save time with the (backend) state.
    progress : Progress-like object with ``update(t)``
    checkpoint : callable ``checkpoint(loop_state: LoopState) -> bool | None``, optional
        Called every ``checkpoint_every`` seconds after an accepted step; ``False``: the
        write failed.

    Attributes
    ----------
    controller : ConstantStepSize or PIController
        Sizes the steps: ``ConstantStepSize(dt)`` for a fixed-step solver,
        ``solver.controller()`` for an adaptive one.
    evaluations : EvaluationTimes or None
        When set (:class:`~.state.EvaluationTimes`), gets the times of the field's
        evaluations of every attempted step (checkpoints probe callables there).
    checkpointed : float or None
        Loop time of the last checkpoint written in this run.
    """

    def __init__(self, solver: Solver | AdaptiveSolver, field: Callable[..., Any], *, t_max: float, dt: float,
                 saveat: SaveAt, limits: Limits, tables: Sequence[Any], xp: Any,
                 save: Callable[[float, Any], None], progress: Any = None,
                 checkpoint: Callable[[LoopState], None] | None = None,
                 checkpoint_every: float = 60.0):
        self.solver, self.field = solver, field
        self.t_max, self.dt = float(t_max), float(dt)
        self.saveat, self.limits = saveat, limits
        self.tables = list(tables)
        self.xp = xp
        self._save = save
        self.progress = progress
        self.checkpoint_fn = checkpoint
        self.checkpoint_every = float(checkpoint_every)
        self._step_end = 0.0
        self._stage: int | None = None
        self.last_saved = 0.0
        self.checkpointed: float | None = None   # loop time of the last checkpoint written
        self.evaluations: Any = None   # records the times of the field's evaluations
        self._taus: list[float] = []
        self.adaptive = bool(solver.adaptive)
        self.controller = solver.controller() if self.adaptive else ConstantStepSize(self.dt)
        self.stops = segment_stops(self.t_max, saveat)
        self._save_at_stop = (None if saveat.ts is None else
                              {float(s) for s in saveat.ts if s <= self.t_max})
        # adaptive runs with SaveAt(every=k) land on the multiples of k * dt
        self._grid = (n_fixed_steps(self.t_max, self.dt * saveat.every)
                      if self.adaptive and saveat.ts is None else None)

    # .................................................................. plan
    def planned_steps(self) -> int | None:
        """Number of steps of a fixed-step run (``None`` for adaptive solvers):
        :func:`~.plan.planned_steps`."""
        return planned_steps(self.t_max, self.dt, self.saveat, adaptive=self.adaptive)

    def planned_saves(self) -> int:
        """Number of states the run will save if it reaches ``t_max``:
        :func:`~.plan.planned_saves`."""
        return planned_saves(self.t_max, self.dt, self.saveat, adaptive=self.adaptive)

    @property
    def n_targets(self) -> int:
        """Number of targets of the run (:meth:`target` takes ``0 .. n_targets - 1``)."""
        return len(self.stops) if self._grid is None else self._grid

    def target(self, index: int) -> tuple[float, bool]:
        """Target number ``index`` of the run and whether it is the last one.

        The stops (:func:`~.plan.segment_stops`), or for an adaptive run saving
        ``every=k`` the grid :math:`j k \\Delta t` (:math:`j = 1, 2, \\dots`) ending at
        :math:`t_{max}`."""
        if self._grid is None:
            return self.stops[index], index == len(self.stops) - 1
        k = index + 1
        if k >= self._grid:
            return self.t_max, True
        return min(k * (self.dt * self.saveat.every), self.t_max), False

    # .................................................................. pieces
    def _f(self, tau: float, z: Any) -> Any:
        # Stages evaluated at the right end of the current step use the left limit of
        # piecewise-constant parameters, so a step inside layer l never sees layer l + 1.
        st = self._stage
        if st is not None:
            self._stage = st + 1
        if self.evaluations is not None:
            self._taus.append(tau)
        return self.field(tau, z, tau >= self._step_end, st)

    def _check(self, y_new: Any, t: float, t_new: float) -> tuple[Status | None, str]:
        xp = self.xp
        # one reduction, so one host sync per step on a GPU: max |x| is NaN or inf exactly
        # when some coordinate is not finite (max propagates NaN)
        mx = float(xp.max(xp.abs(y_new)))
        if not math.isfinite(mx):
            return Status.NONFINITE, (
                f"non-finite token coordinates in the step from t={t:.6g} to t={t_new:.6g}; "
                f"the last finite state (t={self.last_saved:.6g}) is kept")
        if mx > self.limits.max_norm:
            return Status.BLOWUP, (f"max |x| = {mx:.3g} exceeded max_norm="
                                   f"{self.limits.max_norm:g} at t={t_new:.6g}")
        return None, ""

    def _attempt(self, st: LoopState, step: Step) -> tuple[Any, float, Any]:
        """The solver's trial step: ``(y_new, err, f_new)`` (fixed steps: error 0, no
        first-same-as-last value)."""
        self._step_end = st.t + step.h
        if self.adaptive:
            self._stage = None
            out = self.solver.attempt(self._f, st.t, st.y, step.h, st.fy)
        else:
            self._stage = 0   # stage indices: fixed steps are never retried
            out = self.solver.step(self._f, st.t, st.y, step.h), 0.0, None
        self._step_end = math.inf
        if self.evaluations is not None:   # this attempt's times (and any evaluation before)
            self.evaluations.add(self._taus)
            self._taus = []
        return out

    def _due(self, st: LoopState, step: Step, final: bool) -> bool:
        """Whether the state just reached is saved."""
        if self._save_at_stop is not None:
            return step.lands and st.t in self._save_at_stop
        if self._grid is not None:
            return step.lands
        return (st.n_steps - st.n_rejected) % self.saveat.every == 0 or (step.lands and final)

    def save(self, t: float, y: Any) -> None:
        self._save(t, y)
        self.last_saved = t

    def initial_state(self, y0: Any) -> LoopState:
        """The loop state at ``t = 0`` (what a checkpoint stores)."""
        return LoopState(t=0.0, y=y0, h=self.dt)

    # .................................................................. run
    def run(self, state: LoopState) -> tuple[Status, str, LoopState]:
        """Run from ``state`` (see :meth:`initial_state`) to the end.

        ``state`` itself is not changed: the run advances a copy.  Returns
        ``(status, message, state)``.  Exceptions are sorted by :func:`owned`: those the
        run owns (a failed inner solve, a user callable going bad, a numerical error)
        end it with status ``failed``; ``KeyboardInterrupt`` ends it with status
        ``interrupted`` (the states saved so far are kept in both cases); any other
        (a caller's timeout raised by a signal handler, ``MemoryError``, ``SystemExit``)
        propagates with a note saying where the run stood.  None of them writes a
        checkpoint: the step in flight may have half-updated the solver's history or the
        warm starts, so the last periodic checkpoint (written whole, atomically) stays
        the one a resume continues from, and the resumed run equals an uninterrupted one.

        Raises
        ------
        ArgumentError
            A fixed-step run that needs more than ``max_steps`` steps
            (:func:`~.plan.check_step_budget`), before any step."""
        check_step_budget(self.t_max, self.dt, self.saveat, self.limits, adaptive=self.adaptive)
        st = replace(state)
        self._last_ckpt = time.monotonic()
        if st.done:   # a finished run (resumed from its final checkpoint)
            return Status.OK, f"reached t_max={self.t_max:g} in {st.n_steps} steps", st
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                status, msg = self._run(st)
        except KeyboardInterrupt:
            status, msg = Status.INTERRUPTED, (
                f"interrupted by the user (KeyboardInterrupt) at t={st.t:.6g}; the "
                f"states saved up to t={self.last_saved:.6g} are kept")
        except Exception as exc:   # sorted by owned(): the rest propagates
            if not owned(exc):
                exc.add_note(f"transformer-pde: the run stopped at t={st.t:.6g} without a "
                             f"result; {self._resume_note()}")
                raise
            status, msg = Status.FAILED, (
                str(exc) if isinstance(exc, (SinkhornNotConverged, SolverNotConverged)) else
                f"{type(exc).__name__} in the step from t={st.t:.6g}: {exc}; the states "
                f"saved up to t={self.last_saved:.6g} are kept")
            self.exception = exc
        if status == Status.OK:
            st.done = True
            msg = f"reached t_max={self.t_max:g} in {st.n_steps} steps"
        return status, msg, st

    def _resume_note(self) -> str:
        if self.checkpoint_fn is None:
            return "it wrote no checkpoint"
        if self.checkpointed is None:
            return "it wrote no checkpoint in this call (a resume continues from an earlier one)"
        return f"its last checkpoint (t={self.checkpointed:.6g}) resumes it"

    def _maybe_checkpoint(self, st: LoopState) -> None:
        if self.checkpoint_fn is None:
            return
        now = time.monotonic()
        if now - self._last_ckpt >= self.checkpoint_every:
            if self.checkpoint_fn(st) is not False:
                self.checkpointed = st.t
            self._last_ckpt = time.monotonic()

    def _run(self, st: LoopState) -> tuple[Status, str]:
        """The loop body shared by fixed and adaptive steps (see the module docstring)."""
        ctrl, solver = self.controller, self.solver
        multistep = bool(solver.multistep)
        self._stage, self._step_end = None, math.inf
        if self.adaptive and st.fy is None:
            st.fy = self._f(st.t, st.y)
        while True:
            target, final = self.target(st.target)
            step = ctrl.propose(st, target, final, self.tables)
            t = st.t
            y_new, err, f_new = self._attempt(st, step)
            st.n_steps += 1
            if st.n_steps >= self.limits.max_steps and not step.final:
                return Status.MAX_STEPS, (f"max_steps={self.limits.max_steps} reached at "
                                          f"t={st.t:.6g} before t_max={self.t_max:g}")
            bad, msg = self._check(y_new, t, step.t_end) if err <= 1.0 else (None, "")
            if not (err <= 1.0) or bad == Status.NONFINITE:
                h_retry = ctrl.reject(st, step, err)
                if h_retry is None:          # a constant step size cannot retry
                    return bad, msg
                st.n_rejected += 1
                st.h = h_retry
                if not (err <= 1.0) and h_retry < max(1e-12 * self.dt,
                                                      8 * np.finfo(float).eps * abs(t)):
                    return Status.NONFINITE, (
                        f"step size underflow at t={t:.6g} (error {err:.3g}); the flow is "
                        "likely blowing up")
                continue
            ctrl.accept(st, step, err)
            st.y, st.t = y_new, step.t_end
            if f_new is not None:
                st.fy = f_new
            if is_jump(self.tables, st.t):
                if multistep:
                    solver.reset()   # multistep history must not reach across a jump
                if st.fy is not None:
                    # first-same-as-last would reuse the left limit of the old layer's
                    # parameters: evaluate the new layer's field instead
                    st.fy = self._f(st.t, st.y)
            if bad == Status.BLOWUP or self._due(st, step, final):
                self.save(st.t, st.y)
            if self.progress is not None:
                self.progress.update(st.t)
            if bad == Status.BLOWUP:
                return bad, msg
            if step.lands:
                st.target += 1
                if final:
                    return Status.OK, ""
            self._maybe_checkpoint(st)
