r"""Many independent token systems in one run: :func:`simulate_ensemble`.

An *ensemble* is :math:`B` independent systems of :math:`n` tokens each, all driven by
the same attention (and block), started from :math:`B` initial configurations
``X0[b]``.  System :math:`b` follows

.. math:: \dot x^{(b)}_i = \Gamma_{\mu^{(b)}_t}\big(x^{(b)}_i\big), \qquad
          \mu^{(b)}_t = \sum_{j=1}^n w_j\,\delta_{x^{(b)}_j(t)},

and never sees the tokens of another system.  The ensemble is one run of the particle
engine, :func:`~transformer_pde.simulate`, over :math:`Bn` tokens in :math:`B` segments
(block-diagonal key ranges): every backend, kind, solver, block and checkpoint of the
engine applies, and one call replaces :math:`B` calls of :func:`~transformer_pde.simulate`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..attention import Attention
from ..backends import DEFAULT_BACKEND, to_host
from ..blocks import Block
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate.loop import Limits, Monitor, SaveAt
from ..noise import Noise
from ..results import ResultKind, check_warn, warn_stop
from .. import results_display as display
from .. import validation
from ..validation import real_array
from .identity import SystemStatistic
from .options import FieldOptions
from .simulation import simulate
from .trajectory import ParticleTrajectory, SavedRun, weighted_moments

__all__ = ["EnsembleTrajectory", "ensemble_moments", "simulate_ensemble"]


def ensemble_moments(states: np.ndarray, weights: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    r"""Per-system weighted means :math:`m^{(b)} = \sum_i w_i x^{(b)}_i` and covariances.

    Parameters
    ----------
    states : ndarray (T, B, n, d)
    weights : ndarray (n,)
        Normalised token weights (the same for every system).

    Returns
    -------
    means : ndarray (T, B, d)
    covs : ndarray (T, B, d, d)
        :math:`\Sigma^{(b)} = \sum_i w_i (x^{(b)}_i - m^{(b)})(x^{(b)}_i - m^{(b)})^\top`.
    """
    X = np.asarray(states)
    T, B, n, d = X.shape
    m, c = weighted_moments(X.reshape(T * B, n, d), weights)
    return m.reshape(T, B, d), c.reshape(T, B, d, d)


@dataclass(repr=False)
class EnsembleTrajectory(SavedRun):
    """Saved states of :math:`B` systems integrated together by :func:`simulate_ensemble`.

    Follows the package's result protocol (``times``, ``status``, ``message``,
    ``success``, ``moments()``) with one more axis, the system :math:`b`.  It is not a
    :class:`~transformer_pde.ParticleTrajectory`: ``result_kind`` is ``None``, so the
    diagnostics and plots that take one refuse it with a clear error; pass them a member,
    :meth:`member`.

    Attributes
    ----------
    times : ndarray (T,)
        Saved times (common to all systems).
    states : ndarray (T, B, n, d) or None
        Token positions of every system at the saved times; ``None`` when a statistic was
        saved instead (``SaveAt(fn=...)``).
    weights : ndarray (n,)
        Normalised token weights (every system has the same).
    positions : ndarray (n,) or None
        Token positions in [0, 1] (masked attention), the same for every system.
    status : Status
        How the run of the whole ensemble ended (one status: the systems share the time
        steps, so a non-finite state or a blow-up in any system stops all of them).
    message : str
    attention : Attention
    info : dict
        Method, backend, step counts, ``n_systems``, ``n_tokens``, ...
    values : ndarray (T, ...) or None
        ``SaveAt(fn=...)``'s value at each saved time.
    last : ndarray (B, n, d)
        The last saved state.
    """

    #: not a :class:`~transformer_pde.results.ResultKind` of a single trajectory: functions
    #: that take one refuse an ensemble; give them :meth:`member`
    result_kind: ClassVar[ResultKind | None] = None

    @property
    def n_systems(self) -> int:
        """The number :math:`B` of systems."""
        return int(self.last.shape[0])

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """``(means (T, B, d), covs (T, B, d, d))`` of every system at the saved times
        (:func:`ensemble_moments`).

        Raises
        ------
        ArgumentError
            The states were not kept (``SaveAt(fn=...)``)."""
        if self.states is None:
            raise ArgumentError("this ensemble kept SaveAt(fn=...)'s values, not its states: "
                                "its moments were not saved")
        return ensemble_moments(self.states, self.weights)

    def member(self, b: int) -> ParticleTrajectory:
        """System ``b`` as a :class:`~transformer_pde.ParticleTrajectory` (views of the
        states, the ensemble's status and message)."""
        B = self.n_systems
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not -B <= b < B:
            raise ArgumentError(f"b must be an integer in [{-B}, {B}), got {b!r}")
        states = None if self.states is None else self.states[:, b]
        return ParticleTrajectory(times=self.times, states=states, weights=self.weights,
                                  positions=self.positions, status=self.status,
                                  message=self.message, attention=self.attention,
                                  info=dict(self.info, member=int(b)), last=self.last[b])

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        B, n, d = self.last.shape
        rows = [("times", display.time_span(self.times)),
                ("states", display.array_summary(self.states) if self.states is not None
                 else f"not kept; values {display.array_summary(self.values)}"),
                ("message", self.message)]
        return (f"EnsembleTrajectory(status='{self.status}', saved={len(self.times)}, B={B}, "
                f"n={n}, d={d})", rows)



# ------------------------------------------------------------------ simulate_ensemble
def _initial(att: Any, X0: Any) -> np.ndarray:
    if not isinstance(att, Attention):
        raise ArgumentTypeError(f"att must be a transformer_pde.Attention, got "
                                f"{type(att).__name__}")
    X = real_array("X0", to_host(X0), keep_float32=True)
    if X.ndim != 3 or X.shape[2] != att.d or X.shape[0] < 1 or X.shape[1] < 1:
        raise ArgumentError(f"X0 must have shape (B, n, d) with B, n >= 1 and d={att.d} (the "
                            f"dimension of att), got {X.shape}")
    return X


def simulate_ensemble(att: Attention, X0: Any, *, t_max: float, dt: float,
                      solver: Any = "rk4", saveat: SaveAt | None = None,
                      weights: Any = None, positions: Any = None, block: Any = None,
                      backend: Any = DEFAULT_BACKEND, limits: Limits | None = None,
                      monitor: Monitor | None = None, warn: bool = True,
                      field: FieldOptions | None = None,
                      noise: Noise | None = None) -> EnsembleTrajectory:
    r"""Integrate :math:`B` independent token systems of the same attention together.

    System :math:`b` starts from ``X0[b]`` and follows the flow that
    :func:`~transformer_pde.simulate` integrates for ``X0[b]`` alone (same attention,
    weights, positions and block).  The ensemble *is* one :func:`~transformer_pde.simulate`
    run of the :math:`Bn` tokens ``X0.reshape(B * n, d)`` in :math:`B` segments of
    :math:`n` tokens (``segments=[n] * B``: block-diagonal key ranges, each system its
    own measure), so every attention kind, backend, solver, block and checkpoint of
    :func:`~transformer_pde.simulate` serves ensembles too.

    Parameters
    ----------
    att : Attention
        Any kind the field evaluates in segments, any heads, masking, rotary positions,
        ``W_O`` and biases; parameters may depend on time.
    X0 : array (B, n, d)
        Initial tokens of the :math:`B` systems.  float32 input runs in float32.
    t_max, dt : float
        Final time and step (fixed-step solvers), as in :func:`~transformer_pde.simulate`.
    solver : str or solver object, default "rk4"
        Any solver of :mod:`transformer_pde.integrate`.  An adaptive solver chooses one
        step size for the whole ensemble (its error norm is taken over all systems), so
        its systems differ from separate adaptive runs within the tolerance.
    saveat : SaveAt, optional
        ``every`` or ``ts`` as for :func:`~transformer_pde.simulate`; ``fn(t, X,
        weights)`` receives the read-only (B, n, d) states and one system's weights (n,).
    weights, positions : array (n,), optional
        Token masses (normalised; uniform by default) and positions in [0, 1] (required
        for masked, rotary or ALiBi attention), the same for every system.
    block : None, "sphere" or Block
        ``"sphere"`` is ``Block(constraint="sphere")``: tokens on :math:`S^{d-1}`, the
        field projected on the tangent space
        :math:`P_x y = y - \langle x, y\rangle x / |x|^2` and every step followed by the
        retraction :math:`x \mapsto x/|x|` (the initial tokens must have norm 1).  A
        :class:`~transformer_pde.Block` may also carry an MLP and LayerNorms (all
        token-wise); its constraint must be a ``Sphere`` or ``PostLayerNorm``.
    backend : str or backend object, default "auto"
        As ``FieldOptions(backend=...)`` of :func:`~transformer_pde.simulate`
        (``"auto"`` counts the :math:`Bn` tokens).
    limits : Limits, optional
        ``max_norm``, ``max_steps``, ``max_memory`` for the whole ensemble.
    monitor : Monitor, optional
        Progress, checkpoints and resuming, as for :func:`~transformer_pde.simulate`
        (the checkpoint's run identity records the segments).
    warn : bool, default True
        Issue an :class:`~transformer_pde.errors.EarlyStopWarning` when the run ends
        without an answer (``nonfinite``, ``failed``, ``max_steps``, ``interrupted``);
        ``False`` leaves the status as the only report.
    field : FieldOptions, optional
        As for :func:`~transformer_pde.simulate` (e.g. ``FieldOptions(method="harmonic")``:
        the moments are taken per system); its backend replaces ``backend``, which must
        then be left at its default.
    noise : Noise, optional
        Brownian noise as for :func:`~transformer_pde.simulate` (with a stochastic
        ``solver``).  Member :math:`b` draws its own stream of the path of
        ``(noise.seed, noise.path)``, the stream of system ``noise.system + b``:
        independent individual noise and its own common Brownian motions :math:`B_k`, so
        the members are independent samples, and member :math:`b` is the single run
        ``simulate(att, X0[b], ..., noise=Noise(..., system=b))`` (the same increments).

    Returns
    -------
    EnsembleTrajectory
        ``states`` of shape (T, B, n, d).  One status for the ensemble: a blow-up is
        reported there only; a stop without an answer also warns (see
        :class:`~transformer_pde.results.Status`).

    Raises
    ------
    ArgumentError, ArgumentTypeError, CheckpointError, IntegrityError
        As :func:`~transformer_pde.simulate`; also ``X0`` not of shape (B, n, d) and a
        constraint that is not token-wise.

    Notes
    -----
    Member :math:`b` equals ``simulate(att, X0[b], ...)`` with the same fixed-step solver
    and ``dt`` to rounding (the NumPy reference reduces each system's keys alone, so the
    two agree to about :math:`10^{-15}`).

    Examples
    --------
    >>> import numpy as np, transformer_pde as tp
    >>> from transformer_pde.particles.ensemble import simulate_ensemble
    >>> X0 = np.random.default_rng(0).normal(size=(4, 10, 3))
    >>> X0 /= np.linalg.norm(X0, axis=-1, keepdims=True)
    >>> att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), beta=1.0)
    >>> ens = simulate_ensemble(att, X0, t_max=1.0, dt=0.1, block="sphere", backend="numpy")
    >>> ens.states.shape, str(ens.status)
    ((11, 4, 10, 3), 'ok')
    """
    X = _initial(att, X0)
    B, n, d = X.shape
    w = validation.weights("weights", weights, n)
    pos = validation.positions("positions", positions, n, required=att.masked)
    if isinstance(block, str):
        if block != "sphere":
            raise ArgumentError(f"block must be None, 'sphere' or a transformer_pde.Block, "
                                f"got {block!r}")
        block = Block(constraint="sphere")
    if saveat is not None and isinstance(saveat, SaveAt) and saveat.fn is not None:
        saveat = dataclasses.replace(saveat, fn=SystemStatistic(saveat.fn, (B, n, d)))
    warn = check_warn(warn)
    if field is None:
        field = FieldOptions(backend=backend)
    elif not (isinstance(backend, str) and backend == DEFAULT_BACKEND):
        raise ArgumentError("backend: give the backend inside field=FieldOptions(backend=...) "
                            "when passing field")
    traj = simulate(att, X.reshape(B * n, d), t_max=t_max, dt=dt, solver=solver,
                    saveat=saveat, weights=np.tile(w, B),
                    positions=None if pos is None else np.tile(pos, B), block=block,
                    field=field, limits=limits, monitor=monitor,
                    warn=False, segments=[n] * B, noise=noise)
    warn_stop(traj.status, traj.message, warn=warn)
    info = {k: v for k, v in traj.info.items() if k != "segments"}
    info.update(n_systems=B, n_tokens=n)
    return EnsembleTrajectory(
        times=traj.times,
        states=None if traj.states is None else traj.states.reshape(-1, B, n, d),
        weights=traj.weights[:n], positions=pos, status=traj.status, message=traj.message,
        attention=att, info=info, values=traj.values, last=traj.last.reshape(B, n, d))
