r"""The particle run: :func:`simulate`, assembled from separate parts.

:func:`simulate` checks its arguments (:class:`RunSpec`), builds the solver (wrapped in
a :class:`~transformer_pde.blocks.BlockStepper` for a block), the field evaluator
(:class:`~transformer_pde.fields.FieldEvaluator`), the saver (host copies of the saved
states, or ``SaveAt.fn``'s statistic and the moments), the time loop
(:class:`~transformer_pde.integrate.TimeLoop`), refuses a run that cannot finish
(:func:`~transformer_pde.integrate.preflight`), opens or continues its checkpoint, runs
the loop and assembles the :class:`~transformer_pde.particles.ParticleTrajectory`.  The
stateful parts (loop state, solver, field evaluator, saver) are checkpointed together by
:class:`RunParts`, each as plain versioned data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..attention import Attention
from ..backends import get_backend, to_host
from ..blocks import Block, BlockStepper, PostLayerNorm, Sphere
from ..errors import ArgumentError, ArgumentTypeError, CheckpointError, IntegrityError
from ..fields import FieldEvaluator
from ..integrate.breakpoints import layer_tables
from ..integrate.checkpoint import CheckpointWriter, RunIdentity, check_path, read_checkpoint
from ..integrate.loop import Limits, LoopState, Monitor, Progress, SaveAt, TimeLoop, owned
from ..integrate.plan import preflight
from ..integrate.solvers import get_solver, restore_solver_state, solver_state
from ..integrate.state import check_resumed
from ..noise import Noise, is_sde_solver, sde_stepper
from ..results import Status, check_warn, warn_stop
from ..validation import points, positive
from .identity import run_identity
from .options import FieldOptions
from .trajectory import ParticleTrajectory, weighted_moments

__all__ = ["RunParts", "RunSpec", "Saver", "simulate"]

logger = logging.getLogger("transformer_pde.particles")


# ------------------------------------------------------------------ saving
def _statistic(out: Any, t: float) -> np.ndarray:
    """``SaveAt(fn=...)``'s return value as a real numeric array (a copy), or
    :class:`ArgumentError` naming what was returned."""
    what = f"{type(out).__name__} {out!r}"[:200]
    if out is None or isinstance(out, (str, bytes, dict)):
        raise ArgumentError(f"SaveAt(fn=...) must return a real numeric array, got {what} at "
                            f"t={t:.6g}")
    try:
        v = np.array(out)
    except (ValueError, TypeError) as exc:
        raise ArgumentError(f"SaveAt(fn=...) must return a real numeric array, got {what} at "
                            f"t={t:.6g} ({exc})") from None
    if v.dtype.kind not in "biuf":
        raise ArgumentError(f"SaveAt(fn=...) must return a real numeric array (bool, integer "
                            f"or float), got {what} (dtype {v.dtype}) at t={t:.6g}")
    return v


class Saver:
    """Copies saved states to the host (or keeps ``SaveAt.fn``'s value and the moments).

    Parameters
    ----------
    be : backend
        The backend of the run's state (``to_numpy`` copies a state to the host).
    fn : callable ``fn(t, X, weights) -> array`` or None
        ``SaveAt.fn``: keep its value and the weighted moments instead of the states.
    weights : ndarray (N,)
        Normalised token weights (in each segment).
    segments : ndarray of int, optional
        Segment sizes: the moments kept with ``fn`` are those of each segment's measure.
    """

    def __init__(self, be: Any, fn: Any, weights: np.ndarray, segments: Any = None):
        self.be, self.fn, self.weights, self.segments = be, fn, weights, segments
        self.times: list[float] = []
        self.states: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.means: list[np.ndarray] = []
        self.covs: list[np.ndarray] = []
        self.last: np.ndarray | None = None
        self.shape: tuple | None = None

    def __call__(self, t: float, y: Any) -> None:
        """Keep the state ``y`` at time ``t`` (or ``SaveAt.fn``'s value and the moments).

        ``fn(t, X, weights)`` gets read-only views (an in-place edit raises instead of
        changing the run) and must return a real numeric array (bool, integer or float) of
        the same shape at every call; anything else raises :class:`ArgumentError` naming
        ``SaveAt(fn=...)`` and what it returned.  At the first save :func:`simulate` raises
        it; later, the time loop ends the run with status ``failed``, keeping the earlier
        saves."""
        x = self.be.to_numpy(y).copy()
        if self.fn is not None:
            xv, wv = x.view(), np.asarray(self.weights).view()
            xv.flags.writeable = wv.flags.writeable = False
            try:
                out = self.fn(t, xv, wv)
            except ValueError as exc:
                if "read-only" not in str(exc):
                    raise
                raise ArgumentError(f"SaveAt(fn=...) must not modify the state or the weights "
                                    f"in place (copy them first): {exc}") from exc
            v = _statistic(out, t)
            if self.shape is None:
                self.shape = v.shape
            elif v.shape != self.shape:
                raise ArgumentError(f"SaveAt(fn=...) returned shape {v.shape} at t={t:.6g}, "
                                    f"but {self.shape} before")
            m, c = weighted_moments(x[None], self.weights, self.segments)
            self.values.append(v)
            self.means.append(m[0])
            self.covs.append(c[0])
        else:
            self.states.append(x)
        self.times.append(t)
        self.last = x

    #: version of the plain data of :meth:`get_state`
    STATE_VERSION = 1

    def get_state(self) -> dict[str, Any]:
        """What was saved so far, as plain versioned data (lists of host arrays)."""
        return {"version": self.STATE_VERSION, "times": [float(t) for t in self.times],
                "states": list(self.states), "values": list(self.values),
                "means": list(self.means), "covs": list(self.covs), "last": self.last,
                "shape": None if self.shape is None else [int(k) for k in self.shape]}

    def set_state(self, s: dict[str, Any]) -> None:
        """Restore :meth:`get_state` (``ValueError`` on data of another version or shape)."""
        keys = {"version", "times", "states", "values", "means", "covs", "last", "shape"}
        if not isinstance(s, dict) or s.get("version") != self.STATE_VERSION or set(s) != keys:
            raise ValueError(f"saver state is not of version {self.STATE_VERSION}")
        n_saved = len(s["states"]) if self.fn is None else len(s["values"])
        if n_saved != len(s["times"]) or not s["times"]:
            raise ValueError(f"saver state holds {len(s['times'])} times for {n_saved} saves")
        self.times = [float(t) for t in s["times"]]
        self.states, self.values = list(s["states"]), list(s["values"])
        self.means, self.covs = list(s["means"]), list(s["covs"])
        self.last = s["last"]
        self.shape = None if s["shape"] is None else tuple(int(k) for k in s["shape"])


# ------------------------------------------------------------------ arguments
def _option(name: str, value: Any, cls: type, default: Any) -> Any:
    if value is None:
        return default
    if not isinstance(value, cls):
        raise ArgumentTypeError(f"{name} must be a transformer_pde.{cls.__name__} or None, got "
                                f"{type(value).__name__}")
    return value


@dataclass(frozen=True, eq=False)
class RunSpec:
    """The checked arguments of a :func:`simulate` run (:meth:`of`).

    Attributes
    ----------
    att : Attention
    X0 : ndarray (N, d)
        The initial tokens on the host (before a constraint's renormalisation).
    t_max, dt : float
    saveat, block, field, limits, monitor
        The option objects (defaults filled in).
    dtype : numpy dtype
        Working precision: ``field.dtype``, else float32 for float32 tokens, else float64.
    backend : backend object
        ``field.backend`` resolved once for the run (``"auto"`` by the number of tokens):
        the field, the state, the saver, the loop's array namespace and the checkpoint
        all use this object.
    segments : sequence of int or None
        Sizes of the independent token groups (checked by the field evaluator).
    noise : Noise or None
        The Brownian forcing (``None``: the deterministic flow).
    """

    att: Attention
    X0: np.ndarray
    t_max: float
    dt: float
    saveat: SaveAt
    block: Block | None
    field: FieldOptions
    limits: Limits
    monitor: Monitor
    dtype: np.dtype
    backend: Any
    segments: Any = None
    noise: Noise | None = None

    @classmethod
    def of(cls, att: Any, X0: Any, t_max: Any, dt: Any, saveat: Any, block: Any, field: Any,
           limits: Any, monitor: Any, segments: Any = None, noise: Any = None) -> "RunSpec":
        """Check :func:`simulate`'s arguments (``ArgumentError`` / ``ArgumentTypeError``
        naming the argument), fill in the defaults and resolve the backend."""
        if not isinstance(att, Attention):
            raise ArgumentTypeError(
                f"att must be a transformer_pde.Attention, got {type(att).__name__}")
        X0n = points("X0", to_host(X0), att.d)
        t_max = positive("t_max", t_max)
        dt = positive("dt", dt)
        saveat = _option("saveat", saveat, SaveAt, SaveAt())
        block = _option("block", block, Block, None)
        fopts = _option("field", field, FieldOptions, FieldOptions())
        limits = _option("limits", limits, Limits, Limits())
        monitor = _option("monitor", monitor, Monitor, Monitor())
        noise = _option("noise", noise, Noise, None)
        fopts.check(att, block)
        if saveat.ts is not None and saveat.ts[-1] > t_max:
            raise ArgumentError(f"SaveAt(ts=...) asks for t={saveat.ts[-1]:g} > t_max={t_max:g}")
        dtype = fopts.dtype
        if dtype is None:
            dtype = X0n.dtype if X0n.dtype in (np.float32, np.float64) else np.dtype(np.float64)
        be = get_backend(fopts.backend, n_tokens=X0n.shape[0])
        return cls(att, X0n, t_max, dt, saveat, block, fopts, limits, monitor, np.dtype(dtype),
                   be, segments, noise)


# ------------------------------------------------------------------ parts
def _solver(solver: Any, spec: RunSpec, sizes: Any) -> tuple[Any, BlockStepper | None,
                                                              np.ndarray]:
    """The run's own solver (a :class:`BlockStepper` around it for a block), the stepper
    (or ``None``) and the initial tokens (renormalised by a constraint).  With several
    ``sizes`` (segments) the block's constraint must act token by token.  With noise the
    solver is a stochastic scheme bound to the run's Brownian path
    (:func:`~transformer_pde.noise.sde_stepper`)."""
    if spec.noise is None:
        if is_sde_solver(solver):
            raise ArgumentError(
                f"solver={getattr(solver, 'name', solver)!r} is a stochastic solver: pass "
                "noise=Noise(...), or use a deterministic solver such as 'euler' or 'rk4'")
        solver = get_solver(solver)
    else:
        c = None if spec.block is None else spec.block.constraint
        be, dtype = spec.backend, spec.dtype
        solver = sde_stepper(solver, spec.noise, d=spec.att.d, dt=spec.dt, t_max=spec.t_max,
                             sizes=[spec.X0.shape[0]] if sizes is None else sizes,
                             ts=spec.saveat.ts, dtype=dtype, xp=be.xp,
                             to_device=lambda a: be.asarray(a, dtype),
                             sphere=isinstance(c, Sphere))
    if spec.block is None:
        return solver, None, spec.X0
    c = spec.block.constraint
    if sizes is not None and sizes.size > 1 and c is not None \
            and not isinstance(c, (Sphere, PostLayerNorm)):
        raise ArgumentError(
            f"block: with segments the constraint applies to the tokens of all segments as "
            f"one array, which is right only for token-wise constraints (Sphere, "
            f"PostLayerNorm); {type(c).__name__} is not known to be one (run each segment "
            "alone)")
    stepper = BlockStepper(solver, spec.block, spec.att.d)
    return stepper, stepper, stepper.initial(spec.X0)


def _rhs(ev: FieldEvaluator) -> Any:
    """The loop's field ``rhs(t, z, left, stage)``: the stage index lets Sinkhorn warm-start
    stage i from stage i of earlier steps."""
    def rhs(tau: float, z: Any, left: bool, stage: int | None) -> Any:
        ev.stage = stage
        return ev(tau, z, left=left)
    return rhs


class RunParts:
    """The stateful parts of a run, checkpointed together as plain versioned data:
    ``{"loop": LoopState.get_state(), "solver": ..., "field": FieldEvaluator.get_state(),
    "saver": ...}``."""

    def __init__(self, solver: Any, ev: FieldEvaluator, saver: Saver):
        self.solver, self.ev, self.saver = solver, ev, saver

    def collect(self, st: LoopState) -> tuple[dict[str, Any], list[float]]:
        """The state data of every part at loop state ``st``, and the saved times."""
        return ({"loop": st.get_state(), "solver": solver_state(self.solver),
                 "field": self.ev.get_state(), "saver": self.saver.get_state()},
                self.saver.times)

    def restore(self, data: dict[str, Any], source: Any) -> LoopState:
        """Restore :meth:`collect`'s data; returns the loop state.

        Raises
        ------
        CheckpointError
            Run state of an earlier version of the package (it cannot be continued).
        IntegrityError
            Data of the wrong shape (the message names ``source``)."""
        try:
            state = LoopState.from_state(data["loop"])
            restore_solver_state(self.solver, data["solver"])
            self.ev.set_state(data["field"])
            self.saver.set_state(data["saver"])
        except CheckpointError as exc:
            raise CheckpointError(f"checkpoint {source}: {exc}") from None
        except (KeyError, ValueError, TypeError) as exc:
            raise IntegrityError(f"checkpoint {source}: inconsistent state ({exc})") from None
        return state


def _checkpoint(spec: RunSpec, X0: np.ndarray, ev: FieldEvaluator, solver: Any
                ) -> tuple[RunIdentity | None, dict[str, Any] | None]:
    """Check the checkpoint path before the first step; the run's identity, and the state
    data of the checkpoint to resume from (``None`` when starting afresh)."""
    path = spec.monitor.checkpoint
    if path is None:
        return None, None
    check_path(path, resume=spec.monitor.resume)
    identity = run_identity(
        att=spec.att, X0=X0, weights=ev.weights, positions=ev.positions, dtype=spec.dtype,
        backend=spec.backend.name, field_options=spec.field.evaluator_kwargs(), solver=solver,
        t_max=spec.t_max, dt=spec.dt, saveat=spec.saveat, block=spec.block, limits=spec.limits,
        segments=ev.sizes, noise=spec.noise)
    if not (spec.monitor.resume and path.exists()):
        return identity, None
    return identity, read_checkpoint(path, identity, lambda a: spec.backend.asarray(a, a.dtype))


def _start(spec: RunSpec, loop: TimeLoop, parts: RunParts, X0: np.ndarray,
           resumed: dict[str, Any] | None) -> LoopState:
    """The loop state to run from: the checkpoint's, or ``t = 0`` with the initial save."""
    parts.solver.reset()
    if resumed is not None:
        state = parts.restore(resumed, spec.monitor.checkpoint)
        saver = parts.saver
        check_resumed(loop, state, shape=X0.shape, dtype=spec.dtype, saved_times=saver.times,
                      saved_states=saver.states if spec.saveat.fn is None else None,
                      source=spec.monitor.checkpoint)
        loop.last_saved, loop.checkpointed = saver.times[-1], state.t
        logger.info("simulate: resuming from %s at t=%.6g", spec.monitor.checkpoint, state.t)
        return state
    y0 = spec.backend.asarray(X0, spec.dtype)
    state = loop.initial_state(y0)
    if spec.saveat.ts is None or spec.saveat.ts[0] == 0.0:
        try:
            parts.saver(0.0, y0)
        except Exception as exc:
            if not owned(exc):          # a caller's timeout, MemoryError: not a bad SaveAt
                raise
            raise ArgumentError(f"SaveAt(fn=...) failed on the initial state: "
                                f"{type(exc).__name__}: {exc}") from exc
    return state


def _run(spec: RunSpec, loop: TimeLoop, parts: RunParts, state: LoopState,
         identity: RunIdentity | None) -> tuple[Status, str, LoopState]:
    """Run the loop with its progress report and checkpoints (a final one when it
    reaches ``t_max``)."""
    writer = None
    if identity is not None:
        writer = CheckpointWriter(spec.monitor.checkpoint, identity, parts.collect)
        loop.checkpoint_fn = writer
        if identity.callables:   # the stage times at which checkpoints probe them
            loop.evaluations = identity.evaluations
        loop.checkpoint_every = spec.monitor.checkpoint_every
    loop.progress = Progress(spec.t_max, spec.monitor.progress, spec.monitor.report_every,
                             f"simulate[{spec.att.kind}]", t0=state.t)
    try:
        status, message, state = loop.run(state)
    finally:
        loop.progress.close()
    if writer is not None and status == Status.OK:
        writer(state)   # a failed write warns (CheckpointWarning); the result is returned
    return status, message, state


def _result(spec: RunSpec, solver: Any, stepper: BlockStepper | None, parts: RunParts,
            state: LoopState, status: Status, message: str) -> ParticleTrajectory:
    """The trajectory: the saves, the status and the run information."""
    ev, saver, saveat, dtype = parts.ev, parts.saver, spec.saveat, spec.dtype
    info: dict[str, Any] = {"method": solver.name, "backend": spec.backend.name,
                            "dt": spec.dt, "t_max": spec.t_max, "n_steps": state.n_steps,
                            "n_rejected": state.n_rejected, "dtype": str(np.dtype(dtype)),
                            "save_every": saveat.every}
    if ev.sizes is not None:
        info["segments"] = [int(s) for s in ev.sizes]
    info.update(ev.info)
    if stepper is not None:
        info.update(stepper.describe())
    sde = solver if stepper is None else stepper.inner
    if getattr(sde, "stochastic", False):
        info["noise"] = sde.describe()
    if not saver.times:
        # SaveAt(ts) without 0 and a run that stopped before ts[0]: keep the last state
        # computed (at its own time) rather than return an empty trajectory
        saver(float(state.t), state.y)
    n, d = spec.X0.shape
    return ParticleTrajectory(
        times=np.asarray(saver.times, dtype=float),
        states=np.stack(saver.states) if saveat.fn is None and saver.states else
        (np.empty((0, n, d), dtype=dtype) if saveat.fn is None else None),
        weights=ev.weights, positions=ev.positions, status=status, message=message,
        attention=spec.att, info=info,
        values=np.stack(saver.values) if saver.values else None, last=saver.last,
        saved_means=np.stack(saver.means) if saver.means else None,
        saved_covs=np.stack(saver.covs) if saver.covs else None)


# ------------------------------------------------------------------ simulate
def _overflow_hint(att: Attention, status: Status, message: str) -> str:
    """A non-finite stop of the unnormalised ``exp`` kernel: say how ``shift`` avoids it."""
    if status != Status.NONFINITE or att.kind != "exp":
        return message
    return (f"{message}; the unnormalised kernel e^(beta * score - shift) may overflow: pass "
            "Attention(..., shift=c) with c near beta times the largest score (the same flow, "
            "its time rescaled by e^c)")


def simulate(att: Attention, X0: Any, *, t_max: float, dt: float, solver: Any = "rk4",
             saveat: SaveAt | None = None, weights: Any = None, positions: Any = None,
             block: Block | None = None, field: FieldOptions | None = None,
             limits: Limits | None = None, monitor: Monitor | None = None,
             warn: bool = True, segments: Any = None,
             noise: Noise | None = None) -> ParticleTrajectory:
    r"""Integrate the particle attention flow :math:`\dot X_i = \Gamma_{\mu_t}(X_i)` on :math:`[0, t_{max}]`.

    With ``noise`` the stochastic flow
    :math:`dX_i = \Gamma_{\mu_t}(X_i)\,dt + \sigma\,dW_i + \sum_k (A_k X_i)\circ dB_k`
    (:class:`~transformer_pde.noise.Noise`; projected on the tangent space with the sphere
    constraint) with a stochastic solver.

    Parameters
    ----------
    att : Attention
        The velocity field (parameters may depend on time).
    X0 : array (N, d)
        Initial tokens.  float32 input runs in float32; anything else in float64.
    t_max : float
        Final time (> 0).
    dt : float
        Step size of a fixed-step solver (a last partial step lands exactly on ``t_max``);
        the save-grid unit and the first trial step of an adaptive one.
    solver : str or solver object, default "rk4"
        ``"euler"``, ``"heun"``, ``"rk4"``, ``"ab2"``, ``"ab3"``, ``"implicit_midpoint"``,
        ``"dopri5"``, ``"dop853"`` (default options), or an object carrying its options
        such as ``Dopri5(rtol=1e-8, atol=1e-10)`` or ``ImplicitMidpoint(tol=1e-12)``
        (:mod:`transformer_pde.integrate`); the run works on its own copy, so one object
        may serve many runs, also concurrent ones.  ``"euler"`` with ``dt = 1`` is exactly a stack
        of residual attention layers.
    saveat : SaveAt, optional
        What to keep: ``SaveAt(every=k)`` (default every step), ``SaveAt(ts=times)`` or
        ``SaveAt(fn=statistic)`` (keep a statistic instead of the (T, N, d) states).
    weights, positions : array (N,), optional
        Token masses (normalised, in each segment) and positions in [0, 1] (required for
        masked, rotary or ALiBi attention).
    block : Block, optional
        Full Transformer block: MLP, LayerNorm, constraint (sphere, post-norm), splitting;
        needs a fixed-step solver, except ``Block(constraint=Sphere())`` alone, which an
        adaptive one integrates by projection
        (:meth:`~transformer_pde.blocks.BlockStepper.attempt`).  With segments its
        constraint must be token-wise (``Sphere``, ``PostLayerNorm``).
    field : FieldOptions, optional
        Backend (default ``"auto"``), dtype, Sinkhorn tolerances, the evaluation method
        (``method="harmonic"``: the exact harmonic field of isotropic attention).
    limits : Limits, optional
        ``max_norm`` (blow-up event), ``max_steps``, ``max_memory``; runs that would exceed
        the last two are refused before they start.
    monitor : Monitor, optional
        Progress bar / periodic log lines, checkpoints every so many seconds and resuming
        from them.
    warn : bool, default True
        Issue an :class:`~transformer_pde.errors.EarlyStopWarning` when the run ends
        without an answer (``nonfinite``, ``failed``, ``max_steps``, ``interrupted``);
        ``False`` leaves the status as the only report.
    segments : sequence of int, optional
        Packed sequences: sizes :math:`n_1, \dots, n_S` (each >= 1, summing to N) of
        consecutive groups of tokens that never see each other.  Segment :math:`s` is its
        own measure :math:`\mu^{(s)} = \sum_{j \in s} w_j \delta_{X_j}` (weights normalised
        within it) and moves exactly as if run alone with the same tokens, weights and
        positions (masks apply inside each segment); the segments share the time steps
        (an adaptive solver's error norm is taken over all of them) and one status.
        ``info["segments"]`` records the sizes, the moments are per segment and
        :meth:`~transformer_pde.ParticleTrajectory.segment` gives one of them.
        With noise every segment is an independent system (its own common :math:`B_k`):
        segment :math:`s` draws the stream of system ``noise.system + s``.
    noise : Noise, optional
        Individual and common Brownian noise (see :class:`~transformer_pde.noise.Noise`).
        Needs a stochastic ``solver``: ``"euler_maruyama"``, ``"heun_stratonovich"`` or
        ``"milstein"`` (or their objects), fixed steps with ``t_max`` and the save times
        multiples of ``dt``; ``info["noise"]`` records it.  A deterministic solver with
        noise, or a stochastic one without, is refused.

    Returns
    -------
    ParticleTrajectory
        ``status`` says how the run ended; every state saved before a blow-up, a non-finite
        step, a failure (inner solve, user callable) or an interruption is kept.  A blow-up
        is an answer, reported in ``status`` only; a stop without an answer also warns
        (see :class:`~transformer_pde.results.Status`).

    Notes
    -----
    **Ctrl-C.**  A ``KeyboardInterrupt`` during the run ends it: ``simulate`` returns the
    trajectory saved so far with status ``interrupted`` (and warns) instead of raising.
    With ``Monitor(checkpoint=path)`` the run can later be continued with
    ``Monitor(checkpoint=path, resume=True)`` from the last checkpoint; the resumed run
    equals an uninterrupted one bit for bit.  An exception the run does not own
    (:func:`~transformer_pde.integrate.loop.owned`: one raised by a signal handler, such
    as a caller's timeout, or ``MemoryError``) propagates instead; the last checkpoint
    resumes the run.

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Invalid arguments, options that do not apply, or a run refused up front (too many
        steps for ``max_steps``, saved states larger than ``max_memory``).
    CheckpointError
        (an ``ArgumentError``) before the first step: a ``Monitor(checkpoint=...)`` path
        that cannot or must not be written (missing or read-only folder, a folder, a
        device, an existing file that is not a checkpoint), or, with ``resume=True``, a
        checkpoint of another run (the message names the fields that differ) or one whose
        run state an earlier version of the package wrote.
    IntegrityError
        With ``resume=True``: the checkpoint file is not one of this library, of an
        unknown format version, truncated, corrupt or edited (the message names it).

    Examples
    --------
    >>> import numpy as np, transformer_pde as tp
    >>> att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    >>> X0 = np.random.default_rng(0).normal(size=(50, 2))
    >>> traj = tp.simulate(att, X0, t_max=1.0, dt=0.1)
    >>> traj.states.shape, str(traj.status)
    ((11, 50, 2), 'ok')
    """
    spec = RunSpec.of(att, X0, t_max, dt, saveat, block, field, limits, monitor, segments,
                      noise)
    warn = check_warn(warn)
    ev = FieldEvaluator(att, spec.X0.shape[0], weights=weights, positions=positions,
                        segments=spec.segments, dtype=spec.dtype, backend=spec.backend,
                        **spec.field.evaluator_kwargs())
    solver, stepper, X0 = _solver(solver, spec, ev.sizes)
    parts = RunParts(solver, ev, Saver(spec.backend, spec.saveat.fn, ev.weights, ev.sizes))
    tables = layer_tables(att, stepper.tables if stepper is not None else None)
    loop = TimeLoop(solver, _rhs(ev), t_max=spec.t_max, dt=spec.dt, saveat=spec.saveat,
                    limits=spec.limits, tables=tables, xp=spec.backend.xp, save=parts.saver)
    preflight(spec.t_max, spec.dt, saveat=spec.saveat, limits=spec.limits,
              adaptive=loop.adaptive, state_shape=X0.shape, dtype=spec.dtype)
    identity, resumed = _checkpoint(spec, X0, ev, solver)
    state = _start(spec, loop, parts, X0, resumed)
    status, message, state = _run(spec, loop, parts, state, identity)
    message = _overflow_hint(att, status, message)
    warn_stop(status, message, warn=warn)   # stacklevel: names the caller of simulate
    return _result(spec, solver, stepper, parts, state, status, message)
