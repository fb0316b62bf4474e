r"""The options that plan a run, how many steps and saves it takes, and the checks made
before it starts or resumes.

:class:`SaveAt` says what a run keeps and :class:`Limits` when it stops early and which
runs are refused up front.

A run from :math:`t = 0` to :math:`t_{max}` is cut into segments ending at the *stops*:
the save times of ``SaveAt(ts=...)`` inside :math:`(0, t_{max})`, then :math:`t_{max}`
(:func:`segment_stops`).  A fixed-step solver takes :func:`~.controller.n_fixed_steps`
steps in each segment (:func:`planned_steps`): ``t_max=0.07, dt=0.01`` takes 7 steps,
not :math:`\lceil 0.07/0.01\rceil = 8` (the quotient is ``7.000000000000001`` in floating
point; the count is decided relative to the step).  An adaptive solver's step count is
not known in advance (``None``).  :func:`planned_saves` counts the states a run keeps if
it reaches :math:`t_{max}`, and :func:`preflight` refuses, before anything is computed, a
run whose steps exceed ``Limits.max_steps`` or whose saved states exceed
``Limits.max_memory`` (:class:`~transformer_pde.errors.ArgumentError`).  These are the
counts the time loop (:class:`~.loop.TimeLoop`) follows, so a caller that checks a run
up front (the command line) refuses exactly the runs :func:`~transformer_pde.simulate`
refuses.  A run resumed from a checkpoint starts from a loop state that
:func:`check_resumed` has checked against the run's invariants and limits;
:class:`EvaluationTimes` keeps the stage times at which checkpoints compare callables.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, CheckpointError, IntegrityError
from ..validation import positive
from .controller import ERR_FLOOR, n_fixed_steps

__all__ = ["EvaluationTimes", "Limits", "SaveAt", "check_resumed", "check_step_budget",
           "physical_memory", "planned_saves", "planned_steps", "preflight", "segment_stops"]


def physical_memory() -> int | None:
    """Physical memory of this machine in bytes (``SC_PHYS_PAGES * SC_PAGE_SIZE``), or
    ``None`` where the platform does not report it (no ``os.sysconf``, or a value that
    is not positive).  The one reading of it that the memory checks before a run share
    (:meth:`~transformer_pde.Limits.memory_limit`, the command line's configuration
    checks)."""
    try:
        memory = int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None
    return memory if memory > 0 else None


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



# ------------------------------------------------------------------ counts
def segment_stops(t_max: float, saveat: Any = None) -> list[float]:
    """Ends of the segments of a run: the times of ``saveat.ts`` strictly inside
    :math:`(0, t_{max})`, then ``t_max`` (only ``t_max`` without ``ts``)."""
    t_max = float(t_max)
    ts = None if saveat is None else saveat.ts
    if ts is None:
        return [t_max]
    return [float(s) for s in ts if 0.0 < s < t_max] + [t_max]


def planned_steps(t_max: float, dt: float, saveat: Any = None, *,
                  adaptive: bool = False) -> int | None:
    r"""Number of steps of a fixed-step run, ``None`` for an adaptive one.

    Parameters
    ----------
    t_max, dt : float
        Final time and step size (> 0).
    saveat : SaveAt, optional
        With ``ts``, steps land on every save time, so each segment between stops is
        counted on its own (:func:`segment_stops`).
    adaptive : bool, default False
        The solver is adaptive (``solver.adaptive``).

    Returns
    -------
    int or None
        :math:`\sum_k` :func:`~.controller.n_fixed_steps` of each segment; e.g. 7 for
        ``t_max=0.07, dt=0.01`` and 4 for ``t_max=1.0, dt=0.3`` (the last step 0.1 long).
    """
    if adaptive:
        return None
    total, t = 0, 0.0
    for s in segment_stops(t_max, saveat):
        total += n_fixed_steps(s - t, float(dt))
        t = s
    return total


def planned_saves(t_max: float, dt: float, saveat: Any, *, adaptive: bool = False) -> int:
    r"""Number of states a run saves if it reaches ``t_max``.

    ``SaveAt(ts=...)``: the save times up to ``t_max``; ``SaveAt(every=k)``: the initial
    state, every :math:`k`-th fixed step and the final state
    (:math:`\lceil n/k\rceil + 1` for :math:`n` fixed steps), or for an adaptive solver the
    grid of multiples of :math:`k\,\Delta t` it lands on
    (``n_fixed_steps(t_max, k * dt) + 1``)."""
    if saveat.ts is not None:
        return len({float(s) for s in saveat.ts if s <= float(t_max)})
    every = saveat.every
    if adaptive:
        return n_fixed_steps(float(t_max), float(dt) * every) + 1
    return math.ceil(planned_steps(t_max, dt, saveat) / every) + 1


def check_step_budget(t_max: float, dt: float, saveat: Any, limits: Any, *,
                      adaptive: bool = False) -> None:
    """Refuse a fixed-step run that needs more than ``limits.max_steps`` steps.

    Raises
    ------
    ArgumentError
        The message names ``t_max``, ``dt``, the step count and ``max_steps``."""
    steps = planned_steps(t_max, dt, saveat, adaptive=adaptive)
    if steps is not None and steps > limits.max_steps:
        raise ArgumentError(
            f"t_max={float(t_max):g} with dt={dt:g} needs {steps} steps, more than "
            f"max_steps={limits.max_steps}; increase dt or Limits(max_steps=...)")


def preflight(t_max: float, dt: float, *, saveat: Any, limits: Any, adaptive: bool,
              state_shape: tuple[int, ...], dtype: Any) -> None:
    """Refuse, before it starts, a run that cannot finish within its limits.

    Parameters
    ----------
    t_max, dt : float
    saveat : SaveAt
    limits : Limits
        ``max_steps`` (fixed-step runs: :func:`check_step_budget`) and
        :meth:`~transformer_pde.Limits.memory_limit`.
    adaptive : bool
        The solver is adaptive.
    state_shape : tuple of int
        Shape of one saved state, e.g. ``(N, d)`` tokens.
    dtype : dtype
        Working precision of the saved states.

    Raises
    ------
    ArgumentError
        Too many steps, or :func:`planned_saves` states of ``state_shape`` and ``dtype``
        would need more than the memory limit (not checked with ``SaveAt(fn=...)``, which
        keeps a statistic instead of the states).  The message names the limit to raise.
    """
    check_step_budget(t_max, dt, saveat, limits, adaptive=adaptive)
    if saveat.fn is not None:
        return
    saves = planned_saves(t_max, dt, saveat, adaptive=adaptive)
    size = math.prod(int(k) for k in state_shape)
    need = float(saves) * size * np.dtype(dtype).itemsize
    cap = limits.memory_limit()
    if need > cap:
        shape = " x ".join(str(int(k)) for k in state_shape)
        raise ArgumentError(
            f"the {saves} saved states of {shape} tokens would need "
            f"{need / 2 ** 30:.3g} GiB, more than max_memory={cap / 2 ** 30:.3g} GiB; "
            "save fewer with SaveAt(every=k) or SaveAt(ts=...), keep a statistic with "
            "SaveAt(fn=...), or raise Limits(max_memory=...)")


# ------------------------------------------------------------------ resuming
class EvaluationTimes:
    """The times at which a run evaluated its field, kept for probing callables of time.

    :meth:`add` takes the evaluation times of one attempted step (its stage times
    :math:`t_n + c_i h`, rejected attempts included: they chose the next step size).
    Kept, as whole attempts: the first ``first`` and the last ``last`` attempts and up to
    ``spread`` attempts evenly spread over the run (every ``stride``-th attempt, the
    stride doubling whenever more would be kept), so memory and probing cost stay bounded
    however long the run."""

    def __init__(self, first: int = 2, last: int = 2, spread: int = 16):
        self._first: list[tuple[float, ...]] = []
        self._n_first, self._n_spread = int(first), int(spread)
        self._last: deque[tuple[float, ...]] = deque(maxlen=int(last))
        self._spread: dict[int, tuple[float, ...]] = {}
        self.stride, self.count = 1, 0

    def add(self, times: Sequence[float]) -> None:
        """Record the evaluation times of the next attempted step."""
        group = tuple(float(s) for s in times)
        i, self.count = self.count, self.count + 1
        if len(self._first) < self._n_first:
            self._first.append(group)
        self._last.append(group)
        if i % self.stride == 0:
            self._spread[i] = group
            if len(self._spread) > self._n_spread:
                self.stride *= 2
                self._spread = {k: g for k, g in self._spread.items() if k % self.stride == 0}

    def times(self) -> list[float]:
        """The recorded times, sorted, each once."""
        groups = [*self._first, *self._last, *self._spread.values()]
        return sorted({s for g in groups for s in g})


def _invariants(loop: Any, st: Any, shape: tuple[int, ...], dtype: Any,
                saved_times: Sequence[float]) -> str | None:
    """The first invariant of a run that the loop state ``st`` breaks, in words, or ``None``."""
    t, n_targets = st.t, loop.n_targets
    if not (math.isfinite(t) and 0.0 <= t <= loop.t_max):
        return f"t={t!r} is not a finite time in [0, t_max={loop.t_max!r}]"
    if st.done != (t == loop.t_max) or (st.done and st.target != n_targets):
        return f"done={st.done} at t={t!r} and target {st.target} of {n_targets}"
    if not st.done:
        if not 0 <= st.target < n_targets:
            return f"target={st.target} is not the index of one of the {n_targets} targets"
        if not (t < loop.target(st.target)[0]
                and (st.target == 0 or loop.target(st.target - 1)[0] <= t)):
            return f"t={t!r} does not lie before target {st.target} and after the one before"
    if not (0 <= st.n_rejected <= st.n_steps) or (t > 0 and st.n_steps == 0) \
            or (not loop.adaptive and st.n_rejected):
        return f"counters n_steps={st.n_steps}, n_rejected={st.n_rejected} at t={t!r}"
    if not (math.isfinite(st.h) and st.h > 0) or (not loop.adaptive and st.h != loop.dt):
        return f"step size h={st.h!r}"
    if not (math.isfinite(st.err_prev) and st.err_prev >= ERR_FLOOR) \
            or (not loop.adaptive and st.err_prev != 1.0):
        return f"error history err_prev={st.err_prev!r}"
    if loop.adaptive and st.steps_left is not None:
        return f"steps_left={st.steps_left!r} in an adaptive run"
    if not loop.adaptive and not st.done:
        if st.steps_left is None:
            if t != 0.0 and t != loop.target(st.target - 1)[0]:
                return f"steps_left=None at t={t!r}, inside a segment"
        elif abs(st.steps_left - n_fixed_steps(loop.target(st.target)[0] - t, loop.dt)) > 1:
            return f"steps_left={st.steps_left} from t={t!r} to target {st.target}"
    for name in ("y", "fy"):
        value = getattr(st, name)
        if value is None and (name == "y" or not loop.adaptive):
            if name == "y":
                return "no state y"
            continue
        if name == "fy" and not loop.adaptive:
            return "a field value fy in a fixed-step run"
        if tuple(getattr(value, "shape", ())) != tuple(shape) \
                or getattr(value, "dtype", None) != np.dtype(dtype):
            return (f"{name} of shape {getattr(value, 'shape', None)} and dtype "
                    f"{getattr(value, 'dtype', type(value).__name__)}, not the run's "
                    f"{tuple(shape)} {np.dtype(dtype)}")
        if not math.isfinite(float(loop.xp.max(loop.xp.abs(value)))):
            return f"{name} has non-finite entries"
    saved = np.asarray(saved_times, dtype=float)
    if saved.size == 0 or not np.all(np.isfinite(saved)) or np.any(np.diff(saved) <= 0) \
            or saved[0] < 0 or saved[-1] > t:
        return f"saved times {saved.tolist()[:8]} are not increasing within [0, t={t!r}]"
    return None


def check_resumed(loop: Any, st: Any, *, shape: tuple[int, ...], dtype: Any,
                  saved_times: Sequence[float], source: Any,
                  saved_states: Sequence[Any] | None = None) -> None:
    r"""Check a loop state restored from a checkpoint against the run that resumes it.

    A checkpoint whose digests match may still hold a state no run could have reached (a
    bug, or an edit signed again with the library's own digests).  Before the first step
    the restored state must satisfy: :math:`t` finite in :math:`[0, t_{max}]`, ``done``
    exactly at :math:`t_{max}`; the target index that of the next target after :math:`t`
    (:meth:`~.loop.TimeLoop.target`); counters :math:`0 \le n_{rejected} \le n_{steps}`
    (no rejections with fixed steps); the step size :math:`h > 0` finite (:math:`\Delta t`
    with fixed steps) and the error history finite and at least
    :data:`~.controller.ERR_FLOOR`; fixed steps left in the segment as
    :func:`~.controller.n_fixed_steps` counts them (within one); the state ``y`` (and a
    first-same-as-last field value ``fy``) of the run's shape and dtype, finite; the saved
    times strictly increasing in :math:`[0, t]`.  And the run's limits must not have
    stopped it before the checkpoint: fewer attempted steps than ``max_steps``, the state
    and the saved states within ``max_norm``.

    Parameters
    ----------
    loop : TimeLoop
    st : LoopState
    shape, dtype
        The run's state (``(N, d)`` tokens) and working precision.
    saved_times : sequence of float
        The times saved so far (the saver's, restored from the same checkpoint).
    source : str or Path
        The checkpoint, named in the errors.
    saved_states : sequence of arrays, optional
        The states saved so far (host arrays), which must be finite and of the run's
        shape and dtype as well.

    Raises
    ------
    IntegrityError
        An invariant is broken; the message names the checkpoint and the invariant.
    CheckpointError
        The checkpoint went further than this run's limits allow (``limits.max_steps``,
        ``limits.max_norm`` named): a fresh run would have stopped before it.
    """
    broken = _invariants(loop, st, shape, dtype, saved_times)
    for k, x in enumerate((saved_states or ()) if broken is None else ()):
        if tuple(getattr(x, "shape", ())) != tuple(shape) \
                or getattr(x, "dtype", None) != np.dtype(dtype) or not np.all(np.isfinite(x)):
            broken = (f"saved state {k} of shape {getattr(x, 'shape', None)} is not a finite "
                      f"{tuple(shape)} {np.dtype(dtype)} array")
            break
    if broken is not None:
        raise IntegrityError(f"checkpoint {source}: its loop state breaks an invariant of the "
                             f"run: {broken} (the file was edited after it was written, or "
                             "written by a faulty program); start afresh (resume=False)")
    limits = loop.limits
    at_most = limits.max_steps if (st.done and not loop.adaptive) else limits.max_steps - 1
    if st.n_steps > at_most:
        raise CheckpointError(
            f"checkpoint {source} comes from a different run: limits.max_steps (the checkpoint "
            f"took {st.n_steps} steps; max_steps={limits.max_steps} now would have stopped the "
            "run before); resume with a larger Limits(max_steps=...) or start afresh")
    top = max([float(loop.xp.max(loop.xp.abs(st.y)))]
              + [float(np.max(np.abs(x))) for x in (saved_states or ()) if np.size(x)])
    if top > limits.max_norm:
        raise CheckpointError(
            f"checkpoint {source} comes from a different run: limits.max_norm (its states "
            f"reach max |x| = {top:.3g}, above max_norm={limits.max_norm:g} now, which "
            "would have stopped the run before); resume with the same Limits or start afresh")
