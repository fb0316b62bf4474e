r"""One time loop for fixed and adaptive steps, with the run options it reads.

:class:`TimeLoop` advances :math:`\dot y = F(t, y)` from :math:`t = 0` to :math:`t_{max}`
with a solver of :mod:`~.solvers`, saving where a :class:`SaveAt` says, stopping on the
events of :class:`Limits` (a state above ``max_norm``, a non-finite state, the step
budget) and reporting through :class:`Monitor` (progress bar, periodic log lines,
checkpoints).  It ends with a :class:`~transformer_pde.results.Status` and a message.

**Steps and stops.**  The run is cut into segments ending at the *stops*: the save times
of ``SaveAt(ts=...)`` (or only :math:`t_{max}`).  A fixed-step solver takes, in a segment
of length :math:`L`, :math:`n = \lceil L/\Delta t - 10^{-9}\rceil` steps of size
:math:`\Delta t` (the last one shorter, landing exactly on the stop): the step count is
decided relative to the step, so ``t_max = 1e-11, dt = 1e-13`` takes exactly 100 steps.
An adaptive solver lands on every save time of its grid (``SaveAt(every=k)``: the
multiples of :math:`k\,\Delta t`) and on every jump of a piecewise-constant parameter
(:mod:`~.breakpoints`).

**Left limits.**  Stages evaluated at the right end of a step get ``left=True``, so that a
step over :math:`[\ell h, (\ell+1)h]` only sees layer :math:`\ell` of a
:class:`~transformer_pde.Layers` table.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, SinkhornNotConverged, SolverNotConverged
from ..results import Status
from ..validation import positive
from .breakpoints import is_jump
from .controller import clip_step

__all__ = ["LoopState", "Limits", "Monitor", "Progress", "SaveAt", "TimeLoop", "n_fixed_steps"]

logger = logging.getLogger("transformer_pde.integrate")

#: a remainder of a segment below this fraction of ``dt`` is not a step of its own
STEP_TOL = 1e-9


def n_fixed_steps(length: float, dt: float) -> int:
    r"""Number of fixed steps covering a segment: :math:`\max(1, \lceil L/\Delta t - 10^{-9}\rceil)`."""
    return max(1, math.ceil(length / dt - STEP_TOL))


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
        try:
            return min(cap, 0.5 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
            return cap


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
        (attention, tokens, solver, times, saving, block, field options; callables of
        time by their values where the checkpointed part of the run used them), else
        :class:`~transformer_pde.errors.CheckpointError` names what differs; a file that
        was edited, truncated or corrupted is an
        :class:`~transformer_pde.errors.IntegrityError`.  A finished run also writes its
        final checkpoint, so resuming it returns at once.

    Notes
    -----
    Ctrl-C (``KeyboardInterrupt``) ends a run with status ``interrupted`` and keeps the
    states saved so far, but writes no checkpoint (the interrupted step may have
    half-updated the warm starts): the last periodic checkpoint stays the one to resume
    from.
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
        if enabled:
            try:
                from tqdm.auto import tqdm  # noqa: PLC0415 - optional, only when asked
                self.bar = tqdm(total=total, initial=t0, desc=desc, unit="t",
                                bar_format="{l_bar}{bar}| {n:.3g}/{total:.3g} "
                                           "[{elapsed}<{remaining}]")
            except ImportError:  # pragma: no cover
                self.bar = None

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
def _opt_int(name: str, value: Any) -> int | None:
    return None if value is None else _req_int(name, value)


def _req_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"loop state {name!r} must be an integer, got {value!r}")
    return int(value)


def _req_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"loop state {name!r} must be a real number, got {value!r}")
    return float(value)


@dataclass
class LoopState:
    r"""Where a :class:`TimeLoop` run stands: everything needed to continue it exactly.

    Attributes
    ----------
    t : float
        Current time.
    y : array (backend)
        Current state.
    n_steps, n_rejected : int
        Attempted steps so far, and rejected ones (adaptive solvers).
    stop : int
        Index of the segment being integrated (see the module docstring).
    seg_left : int or None
        Fixed steps left in that segment (``None``: not yet decided).
    step_idx : int
        Fixed steps taken so far (for ``SaveAt(every=k)``).
    h : float
        Next trial step (adaptive solvers).
    fy : array (backend) or None
        Field at ``(t, y)`` (first-same-as-last), ``None`` until evaluated.
    ctrl_prev : float
        The step-size controller's memory (previous error).
    save_k : int
        Index of the next save time of the adaptive grid.
    done : bool
        The run reached ``t_max``.
    """

    #: version of the plain data of :meth:`get_state`
    VERSION: ClassVar[int] = 1

    t: float = 0.0
    y: Any = None
    n_steps: int = 0
    n_rejected: int = 0
    stop: int = 0
    seg_left: int | None = None
    step_idx: int = 0
    h: float = 0.0
    fy: Any = None
    ctrl_prev: float = 1.0
    save_k: int = 1
    done: bool = False

    def get_state(self) -> dict[str, Any]:
        """Plain data (floats, ints, bools, arrays) with a ``"version"`` key; the arrays are
        the state's own (not copies)."""
        out: dict[str, Any] = {"version": self.VERSION}
        out.update({f.name: getattr(self, f.name) for f in fields(self)})
        return out

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state`'s data.

        Raises
        ------
        ValueError
            An unknown version, a missing or unknown key, or a value of the wrong type
            (the message names the key)."""
        if not isinstance(state, dict) or state.get("version") != self.VERSION:
            got = state.get("version") if isinstance(state, dict) else state
            raise ValueError(f"loop state version {got!r} is not supported (expected "
                             f"{self.VERSION})")
        names = {f.name for f in fields(self)}
        keys = set(state) - {"version"}
        if keys != names:
            raise ValueError(f"loop state keys differ: missing {sorted(names - keys)}, "
                             f"unknown {sorted(keys - names)}")
        if not isinstance(state["done"], (bool, np.bool_)):
            raise ValueError(f"loop state 'done' must be a bool, got {state['done']!r}")
        self.t = _req_float("t", state["t"])
        self.h = _req_float("h", state["h"])
        self.ctrl_prev = _req_float("ctrl_prev", state["ctrl_prev"])
        for name in ("n_steps", "n_rejected", "stop", "step_idx", "save_k"):
            setattr(self, name, _req_int(name, state[name]))
        self.seg_left = _opt_int("seg_left", state["seg_left"])
        self.y, self.fy, self.done = state["y"], state["fy"], bool(state["done"])

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LoopState":
        """A new :class:`LoopState` from :meth:`get_state`'s data (see :meth:`set_state`)."""
        out = cls()
        out.set_state(state)
        return out


class TimeLoop:
    r"""Advance a state with a solver, saving, stopping on events, reporting.

    Parameters
    ----------
    solver : solver object (see :mod:`~.solvers`)
    field : callable ``field(t, y, left, stage) -> dy``
        The right-hand side; ``left`` asks for left limits of piecewise-constant
        parameters, ``stage`` is the index of the evaluation within a fixed step
        (``None`` for adaptive steps), for warm starts.
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
    progress : _Progress-like object with ``update(t)``
    checkpoint : callable ``checkpoint(loop_state: LoopState) -> None``, optional
        Called every ``checkpoint_every`` seconds after an accepted step.
    """

    def __init__(self, solver: Any, field: Callable[..., Any], *, t_max: float, dt: float,
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
        self.adaptive = bool(getattr(solver, "adaptive", False))
        # stops: ends of the segments (save times with ts, else only t_max)
        if saveat.ts is not None:
            stops = [float(s) for s in saveat.ts if 0.0 < s < self.t_max] + [self.t_max]
            self._save_at_stop = {float(s) for s in saveat.ts if s <= self.t_max}
        else:
            stops = [self.t_max]
            self._save_at_stop = None
        self.stops = stops

    # .................................................................. preflight
    def planned_steps(self) -> int | None:
        """Number of steps of a fixed-step run (``None`` for adaptive solvers)."""
        if self.adaptive:
            return None
        total, t = 0, 0.0
        for s in self.stops:
            total += n_fixed_steps(s - t, self.dt)
            t = s
        return total

    def planned_saves(self) -> int:
        """Number of states the run will save if it reaches ``t_max``."""
        if self.saveat.ts is not None:
            return len(self._save_at_stop)
        every = self.saveat.every
        if self.adaptive:
            return n_fixed_steps(self.t_max, self.dt * every) + 1
        return math.ceil(self.planned_steps() / every) + 1

    # .................................................................. pieces
    def _f(self, tau: float, z: Any) -> Any:
        # Stages evaluated at the right end of the current step use the left limit of
        # piecewise-constant parameters, so a step inside layer l never sees layer l + 1.
        st = self._stage
        if st is not None:
            self._stage = st + 1
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
        ``(status, message, state)``.  ``KeyboardInterrupt`` ends the run with
        status ``interrupted`` (the states saved so far are kept); failures of an inner
        solve or of a user callable end it with ``failed``."""
        st = replace(state)
        self._last_ckpt = time.monotonic()
        if st.done:   # a finished run (resumed from its final checkpoint)
            return Status.OK, f"reached t_max={self.t_max:g} in {st.n_steps} steps", st
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                if self.adaptive:
                    status, msg = self._run_adaptive(st)
                else:
                    status, msg = self._run_fixed(st)
        except KeyboardInterrupt:
            status, msg = Status.INTERRUPTED, (
                f"interrupted by the user (KeyboardInterrupt) at t={st.t:.6g}; the "
                f"states saved up to t={self.last_saved:.6g} are kept")
        except (SinkhornNotConverged, SolverNotConverged) as exc:
            status, msg = Status.FAILED, str(exc)
        except Exception as exc:  # noqa: BLE001 - a user callable (parameter, fn) went bad mid-run
            status, msg = Status.FAILED, (
                f"{type(exc).__name__} in the step from t={st.t:.6g}: {exc}; the states "
                f"saved up to t={self.last_saved:.6g} are kept")
            self.exception = exc
        if status == Status.OK:
            st.done = True
            msg = f"reached t_max={self.t_max:g} in {st.n_steps} steps"
        return status, msg, st

    def _maybe_checkpoint(self, st: LoopState) -> None:
        if self.checkpoint_fn is None:
            return
        now = time.monotonic()
        if now - self._last_ckpt >= self.checkpoint_every:
            self.checkpoint_fn(st)
            self._last_ckpt = time.monotonic()

    def _budget(self, st: LoopState) -> tuple[Status, str]:
        return Status.MAX_STEPS, (f"max_steps={self.limits.max_steps} reached at "
                                  f"t={st.t:.6g} before t_max={self.t_max:g}")

    def _run_fixed(self, st: LoopState) -> tuple[Status, str]:
        solver, dt = self.solver, self.dt
        every = self.saveat.every
        multistep = getattr(solver, "multistep", False)
        nstops = len(self.stops)
        while st.stop < nstops:
            stop = self.stops[st.stop]
            if st.seg_left is None:
                st.seg_left = n_fixed_steps(stop - st.t, dt)
            while st.seg_left > 0:
                t, y = st.t, st.y
                last = st.seg_left == 1
                h = min(dt, stop - t)
                self._step_end = t + h
                self._stage = 0
                y_new = solver.step(self._f, t, y, h)
                st.n_steps += 1
                t_new = stop if last else t + h
                bad, msg = self._check(y_new, t, t_new)
                if bad == Status.NONFINITE:
                    return bad, msg
                st.y, st.t = y_new, t_new
                st.seg_left -= 1
                st.step_idx += 1
                if multistep and is_jump(self.tables, t_new):
                    solver.reset()  # multistep history must not reach across a jump
                end = last and st.stop == nstops - 1
                if self._save_at_stop is None:
                    do_save = st.step_idx % every == 0 or end
                else:
                    do_save = last and t_new in self._save_at_stop
                if bad == Status.BLOWUP or do_save:
                    self.save(t_new, y_new)
                if self.progress is not None:
                    self.progress.update(t_new)
                if bad == Status.BLOWUP:
                    return bad, msg
                if st.n_steps >= self.limits.max_steps and not end:
                    return self._budget(st)
                self._maybe_checkpoint(st)
            st.stop += 1
            st.seg_left = None
        return Status.OK, ""

    def _save_time(self, st: LoopState) -> tuple[float, bool]:
        """Next save time of the adaptive grid and whether it is the final one."""
        if self.saveat.ts is not None:
            k = st.stop
            return self.stops[k], k == len(self.stops) - 1
        n = n_fixed_steps(self.t_max, self.dt * self.saveat.every)
        k = st.save_k
        if k >= n:
            return self.t_max, True
        return min(k * (self.dt * self.saveat.every), self.t_max), False

    def _run_adaptive(self, st: LoopState) -> tuple[Status, str]:
        solver = self.solver
        ctrl = solver.controller()
        ctrl.prev = st.ctrl_prev
        self._stage = None
        self._step_end = math.inf
        if st.fy is None:
            st.fy = self._f(st.t, st.y)
        while True:
            t_save, final = self._save_time(st)
            while st.t < t_save:
                t, y, h = st.t, st.y, st.h
                h_try = clip_step(t, h, t_save, self.tables)
                self._step_end = t + h_try
                y_new, err, f_new = solver.attempt(self._f, t, y, h_try, st.fy)
                self._step_end = math.inf
                st.n_steps += 1
                if st.n_steps >= self.limits.max_steps:
                    return self._budget(st)
                if not (err <= 1.0):
                    st.n_rejected += 1
                    st.h = h_try * ctrl.factor(err, False)
                    st.ctrl_prev = ctrl.prev
                    if st.h < max(1e-12 * self.dt, 8 * np.finfo(float).eps * abs(t)):
                        return Status.NONFINITE, (
                            f"step size underflow at t={t:.6g} (error {err:.3g}); the flow is "
                            "likely blowing up")
                    continue
                landed = h_try >= t_save - t or t_save - (t + h_try) <= 1e-12 * abs(t_save)
                t_new = t_save if landed else t + h_try
                bad, msg = self._check(y_new, t, t_new)
                if bad == Status.NONFINITE:
                    st.n_rejected += 1
                    st.h = h_try * 0.2
                    continue
                h_next = h_try * ctrl.factor(err, True)
                st.ctrl_prev = ctrl.prev
                # keep the controller's step when the save point clipped it
                st.h = max(h_next, h) if h_try < h else h_next
                st.y, st.t, st.fy = y_new, t_new, f_new
                if is_jump(self.tables, t_new):
                    # first-same-as-last would reuse the left limit of the old layer's
                    # parameters: evaluate the new layer's field instead
                    st.fy = self._f(t_new, y_new)
                if self.progress is not None:
                    self.progress.update(t_new)
                if bad == Status.BLOWUP:
                    self.save(t_new, y_new)
                    return bad, msg
                if st.t < t_save:
                    self._maybe_checkpoint(st)
            if self._save_at_stop is None or st.t in self._save_at_stop:
                self.save(st.t, st.y)
            if self.saveat.ts is not None:
                st.stop += 1
            else:
                st.save_k += 1
            if final:
                return Status.OK, ""
            self._maybe_checkpoint(st)
