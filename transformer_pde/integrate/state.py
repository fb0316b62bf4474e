r"""Where a run stands, and the checks a restored one must pass.

:class:`LoopState` is everything a :class:`~.loop.TimeLoop` run needs to continue exactly:
time, state, counters, the step-size controller's memory.  A checkpoint stores it as
plain, versioned data (:meth:`LoopState.get_state`).  A state read back from a checkpoint
is checked by :func:`check_resumed` against the invariants of the run that resumes it
(digests prove only that a file is the one written, not that what was written is
sound), and :class:`EvaluationTimes` keeps the stage times at which checkpoints compare a
run's callables of time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from ..errors import ArgumentTypeError, CheckpointError, IntegrityError
from ..validation import integer, scalar
from .controller import ERR_FLOOR, n_fixed_steps

__all__ = ["EvaluationTimes", "LoopState", "check_resumed"]


def _number(name: str, value: Any, *, integral: bool = False) -> Any:
    """A number of restored loop-state data by :mod:`~transformer_pde.validation`'s rules
    (NaN and inf allowed); a wrong type is a ``ValueError`` too, as every defect of the
    data is."""
    try:
        return integer(f"loop state {name!r}", value) if integral else \
            scalar(f"loop state {name!r}", value, finite=False)
    except ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None


@dataclass
class LoopState:
    r"""Where a :class:`TimeLoop` run stands: everything needed to continue it exactly.

    Attributes
    ----------
    t : float
        Current time.
    y : array (backend)
        Current state.
    fy : array (backend) or None
        Field at ``(t, y)`` for first-same-as-last pairs (adaptive solvers), ``None``
        until evaluated and for fixed-step solvers.
    n_steps, n_rejected : int
        Attempted steps so far, and rejected ones (adaptive solvers); the accepted ones
        are ``n_steps - n_rejected`` (fixed steps: every ``every``-th is saved).
    target : int
        Index of the next target the steps land on (:meth:`TimeLoop.target`).
    h : float
        Next trial step of an adaptive solver (``dt`` for fixed steps).
    steps_left : int or None
        Fixed steps left before the target (:class:`~.controller.ConstantStepSize`;
        ``None``: not yet counted).
    err_prev : float
        Scaled error norm of the last accepted adaptive step (the PI controller's
        history, 1 initially).
    done : bool
        The run reached ``t_max``.
    """

    #: version of the plain data of :meth:`get_state`
    VERSION: ClassVar[int] = 2

    t: float = 0.0
    y: Any = None
    fy: Any = None
    n_steps: int = 0
    n_rejected: int = 0
    target: int = 0
    h: float = 0.0
    steps_left: int | None = None
    err_prev: float = 1.0
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
        CheckpointError
            (a ``ValueError``) data of an earlier version: it was written by an earlier
            version of the package, whose loop kept other data, and cannot be continued.
        ValueError
            An unknown version, a missing or unknown key, or a value of the wrong type
            (the message names the key)."""
        got = state.get("version") if isinstance(state, dict) else state
        if isinstance(got, int) and not isinstance(got, bool) and 1 <= got < self.VERSION:
            raise CheckpointError(
                f"the loop state is of version {got}, written by an earlier version of "
                f"transformer-pde; this one continues version {self.VERSION} only: start "
                "afresh (resume=False)")
        if not isinstance(state, dict) or got != self.VERSION:
            raise ValueError(f"loop state version {got!r} is not supported (expected "
                             f"{self.VERSION})")
        names = {f.name for f in fields(self)}
        keys = set(state) - {"version"}
        if keys != names:
            raise ValueError(f"loop state keys differ: missing {sorted(names - keys)}, "
                             f"unknown {sorted(keys - names)}")
        if not isinstance(state["done"], (bool, np.bool_)):
            raise ValueError(f"loop state 'done' must be a bool, got {state['done']!r}")
        self.t, self.h, self.err_prev = (_number(k, state[k]) for k in ("t", "h", "err_prev"))
        for name in ("n_steps", "n_rejected", "target"):
            setattr(self, name, _number(name, state[name], integral=True))
        self.steps_left = None if state["steps_left"] is None else \
            _number("steps_left", state["steps_left"], integral=True)
        self.y, self.fy, self.done = state["y"], state["fy"], bool(state["done"])

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LoopState":
        """A new :class:`LoopState` from :meth:`get_state`'s data (see :meth:`set_state`)."""
        out = cls()
        out.set_state(state)
        return out


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
            if t != 0.0 and (st.target == 0 or t != loop.target(st.target - 1)[0]):
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
