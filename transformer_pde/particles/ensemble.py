r"""Many independent token systems in one run: :func:`simulate_ensemble`.

An *ensemble* is :math:`B` independent systems of :math:`n` tokens each, all driven by
the same attention (and block), started from :math:`B` initial configurations
``X0[b]``.  System :math:`b` follows

.. math:: \dot x^{(b)}_i = \Gamma_{\mu^{(b)}_t}\big(x^{(b)}_i\big), \qquad
          \mu^{(b)}_t = \sum_{j=1}^n w_j\,\delta_{x^{(b)}_j(t)},

and never sees the tokens of another system.  The :math:`B` systems are integrated
together, as one state of shape :math:`(Bn, d)`, by the package's
:class:`~transformer_pde.integrate.TimeLoop` and solvers; the attention field of all
systems is one batched computation (``numpy.matmul`` on :math:`(B, n, k)` arrays, a
log-sum-exp per row), so one call replaces :math:`B` calls of
:func:`~transformer_pde.simulate` and uses the BLAS threads for all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..attention import Attention
from ..attention.rotary import require_positions
from ..blocks import Block, BlockStepper, PostLayerNorm, Sphere
from ..errors import ArgumentError, ArgumentTypeError
from ..integrate.breakpoints import layer_tables
from ..integrate.loop import Limits, SaveAt, TimeLoop, owned
from ..integrate.plan import preflight
from ..integrate.solvers import get_solver
from ..results import ResultKind, Status, check_warn, warn_stop
from .. import results_display as display
from .. import validation
from ..validation import positive, real_array
from .trajectory import ParticleTrajectory

__all__ = ["ENSEMBLE_KINDS", "EnsembleTrajectory", "ensemble_moments", "simulate_ensemble"]

#: attention kinds whose field :func:`simulate_ensemble` evaluates for all systems at once
ENSEMBLE_KINDS = ("softmax", "exp")
#: above this log-normaliser (float64, float32) the ``exp`` kind scales by a power of two
_EXP_SPLIT = {8: 700.0, 4: 80.0}


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
    X = np.asarray(states, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    m = np.einsum("n,tbnd->tbd", w, X)
    C = X - m[:, :, None, :]
    S = np.einsum("n,tbnd,tbne->tbde", w, C, C)
    return m, 0.5 * (S + np.swapaxes(S, -1, -2))


@dataclass
class EnsembleTrajectory:
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

    times: np.ndarray
    states: np.ndarray | None
    weights: np.ndarray
    positions: np.ndarray | None
    status: Status
    message: str
    attention: Attention | None = None
    info: dict = field(default_factory=dict)
    values: np.ndarray | None = None
    last: np.ndarray | None = None

    #: not a :class:`~transformer_pde.results.ResultKind` of a single trajectory: functions
    #: that take one refuse an ensemble; give them :meth:`member`
    result_kind: ClassVar[ResultKind | None] = None

    def __post_init__(self) -> None:
        self.status = Status.parse(self.status)
        if self.last is None and self.states is not None:
            self.last = self.states[-1]

    @property
    def success(self) -> bool:
        """``status.success``."""
        return self.status.success

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

    def __len__(self) -> int:
        return len(self.times)

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        """Title and rows of the text and HTML summaries (never the arrays)."""
        B, n, d = self.last.shape
        rows = [("times", display.time_span(self.times)),
                ("states", display.array_summary(self.states) if self.states is not None
                 else f"not kept; values {display.array_summary(self.values)}"),
                ("message", self.message)]
        return (f"EnsembleTrajectory(status='{self.status}', saved={len(self.times)}, B={B}, "
                f"n={n}, d={d})", rows)

    def __repr__(self) -> str:
        return display.summary_text(*self._summary())

    def _repr_html_(self) -> str:
        return display.summary_html(*self._summary())


# ------------------------------------------------------------------ the batched field
def _times_exp(out: np.ndarray, lse: np.ndarray) -> np.ndarray:
    r"""``out * exp(lse)`` (``lse`` of shape ``out.shape[:-1] + (1,)``), finite whenever the
    product is: rows with a large ``lse`` are scaled as :math:`2^e (\text{out}\,e^r)`,
    :math:`\mathrm{lse} = e\ln 2 + r` (``ldexp`` is exact)."""
    split = _EXP_SPLIT[out.dtype.itemsize]
    big = np.isfinite(lse) & (lse > split)
    if not big.any():
        return out * np.exp(lse)
    e = np.minimum(np.where(big, np.floor(np.where(big, lse, 0.0) / math.log(2.0)), 0.0),
                   2100.0)
    r = (lse - e * math.log(2.0)).astype(out.dtype)
    return np.ldexp(out * np.exp(r), e.astype(np.int32))


class BatchedField:
    r"""The attention field of :math:`B` systems of :math:`n` tokens, evaluated at once.

    For each head (score heads of :attr:`AttentionParams.score_heads
    <transformer_pde.attention.AttentionParams.score_heads>`: biases that cancel are
    removed), with :math:`q = \beta(XQ^\top + b_Q)`, :math:`k = XK^\top + b_K`,
    :math:`v = XV^\top + b_V` of shape :math:`(B, n, \cdot)`,

    .. math:: \ell_{bij} = \langle q_{bi}, k_{bj}\rangle + \log w_j, \qquad
              \mathrm{lse}_{bi} = \log\textstyle\sum_j e^{\ell_{bij}}, \qquad
              \bar v_{bi} = \sum_j e^{\ell_{bij} - \mathrm{lse}_{bi}} v_{bj},

    (keys after a query's position masked with :math:`-\infty` for masked attention;
    with rotary positions :math:`q` and :math:`k` are rotated by their tokens' positions);
    ``softmax`` returns :math:`\bar v`, ``exp`` returns :math:`e^{\mathrm{lse}}\,\bar v
    = \sum_j w_j e^{\langle q, k_j\rangle} v_j`.  Then ``W_O`` and ``b_O``.

    Parameters
    ----------
    att : Attention
        Of a kind in :data:`ENSEMBLE_KINDS`.
    shape : tuple (B, n, d)
    weights : ndarray (n,)
    positions : ndarray (n,) or None
    dtype : numpy dtype
    """

    def __init__(self, att: Attention, shape: tuple[int, int, int], weights: np.ndarray,
                 positions: np.ndarray | None, dtype: Any):
        self.att, self.shape, self.dtype = att, shape, np.dtype(dtype)
        with np.errstate(divide="ignore"):
            self.logw = np.log(weights).astype(self.dtype)
        self.hidden = None
        if att.masked:
            # query i sees key j when s_j <= s_i
            self.hidden = positions[None, :] > positions[:, None]
        self.positions = positions
        self._rot: dict[int, Any] = {}   # rotary tables by head width

    def _head(self, P: Any, head: Any, X: np.ndarray) -> np.ndarray:
        dt = self.dtype

        B, n, d = X.shape
        flat = X.reshape(B * n, d)

        def proj(M: np.ndarray, b: np.ndarray | None) -> np.ndarray:
            if M.shape == (d, d) and np.array_equal(M, np.eye(d)):
                out = X          # the identity map (Q = K = V = I) is exact: skip it
            else:   # one (B n, d) x (d, k) product: a BLAS call (a stacked 3-D @ 2-D is not)
                out = (flat @ M.T.astype(dt)).reshape(B, n, M.shape[0])
            return out if b is None else out + b.astype(dt)

        q, k = proj(head.Q, head.bQ), proj(head.K, head.bK)
        if P.rotary is not None:   # the same positions in every system
            m = q.shape[2]
            if m not in self._rot:
                self._rot[m] = P.rotary.table(self.positions, m, np, dt)
            q, k = self._rot[m].apply(q), self._rot[m].apply(k)
        logits = (q * P.beta) @ np.swapaxes(k, 1, 2) + self.logw
        if self.hidden is not None:
            logits = np.where(self.hidden, -np.inf, logits)
        mx = logits.max(axis=2, keepdims=True)
        p = np.exp(logits - mx)
        s = p.sum(axis=2, keepdims=True)
        out = (p @ proj(head.V, head.bV)) / s
        if P.kind == "exp":
            out = _times_exp(out, mx + np.log(s))
        return out

    def __call__(self, t: float, z: np.ndarray, left: bool) -> np.ndarray:
        """The field at the flat state ``z`` of shape (B n, d), as (B n, d)."""
        B, n, d = self.shape
        P = self.att.at(t, left=left)
        X = z.reshape(B, n, d)
        heads = P.score_heads
        if len(heads) == 1:
            out = self._head(P, heads[0], X)
        else:
            out = np.empty_like(X)
            for head in heads:
                out[..., head.rows] = self._head(P, head, X)
        if P.W_O is not None:
            out = out @ P.W_O.T.astype(self.dtype)
        if P.b_O is not None:
            out = out + P.b_O.astype(self.dtype)
        return out.reshape(B * n, d)


# ------------------------------------------------------------------ arguments
def _initial(att: Any, X0: Any) -> np.ndarray:
    if not isinstance(att, Attention):
        raise ArgumentTypeError(f"att must be a transformer_pde.Attention, got "
                                f"{type(att).__name__}")
    if att.kind not in ENSEMBLE_KINDS:
        raise ArgumentError(f"simulate_ensemble evaluates the kinds {list(ENSEMBLE_KINDS)} "
                            f"for all systems at once; att.kind={att.kind!r} is not one of "
                            "them (run its systems with simulate)")
    X = real_array("X0", X0, keep_float32=True)
    if X.ndim != 3 or X.shape[2] != att.d or X.shape[0] < 1 or X.shape[1] < 1:
        raise ArgumentError(f"X0 must have shape (B, n, d) with B, n >= 1 and d={att.d} (the "
                            f"dimension of att), got {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ArgumentError("X0 contains NaN or inf")
    return X


def _block(block: Any) -> Block | None:
    if block is None:
        return None
    if isinstance(block, str):
        if block != "sphere":
            raise ArgumentError(f"block must be None, 'sphere' or a transformer_pde.Block, "
                                f"got {block!r}")
        return Block(constraint="sphere")
    if not isinstance(block, Block):
        raise ArgumentTypeError(f"block must be None, 'sphere' or a transformer_pde.Block, "
                                f"got {type(block).__name__}")
    c = block.constraint
    if c is not None and not isinstance(c, (Sphere, PostLayerNorm)):
        raise ArgumentError(
            f"block: simulate_ensemble applies a constraint to the tokens of all systems as "
            f"one array, which is right only for token-wise constraints (Sphere, "
            f"PostLayerNorm); {type(c).__name__} is not known to be one (use simulate)")
    return block


def _saveat(saveat: Any, t_max: float) -> SaveAt:
    if saveat is None:
        return SaveAt()
    if not isinstance(saveat, SaveAt):
        raise ArgumentTypeError(f"saveat must be a transformer_pde.SaveAt or None, got "
                                f"{type(saveat).__name__}")
    if saveat.ts is not None and saveat.ts[-1] > t_max:
        raise ArgumentError(f"SaveAt(ts=...) asks for t={saveat.ts[-1]:g} > t_max={t_max:g}")
    return saveat


class _Saver:
    """Keeps host copies of the saved states (B, n, d), or ``SaveAt.fn``'s value."""

    def __init__(self, shape: tuple[int, int, int], fn: Any, weights: np.ndarray):
        self.shape, self.fn, self.weights = shape, fn, weights
        self.times: list[float] = []
        self.states: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.last: np.ndarray | None = None

    def __call__(self, t: float, y: np.ndarray) -> None:
        x = np.array(y).reshape(self.shape)
        if self.fn is not None:
            xv = x.view()
            xv.flags.writeable = False
            v = np.array(self.fn(t, xv, self.weights))
            if v.dtype.kind not in "biuf":
                raise ArgumentError(f"SaveAt(fn=...) must return a real numeric array, got "
                                    f"dtype {v.dtype} at t={t:.6g}")
            if self.values and v.shape != self.values[0].shape:
                raise ArgumentError(f"SaveAt(fn=...) returned shape {v.shape} at t={t:.6g}, "
                                    f"but {self.values[0].shape} before")
            self.values.append(v)
        else:
            self.states.append(x)
        self.times.append(float(t))
        self.last = x


# ------------------------------------------------------------------ simulate_ensemble
def simulate_ensemble(att: Attention, X0: Any, *, t_max: float, dt: float,
                      solver: Any = "rk4", saveat: SaveAt | None = None,
                      weights: Any = None, positions: Any = None, block: Any = None,
                      backend: str = "numpy", limits: Limits | None = None,
                      warn: bool = True) -> EnsembleTrajectory:
    r"""Integrate :math:`B` independent token systems of the same attention together.

    System :math:`b` starts from ``X0[b]`` and follows the flow that
    :func:`~transformer_pde.simulate` integrates for ``X0[b]`` alone (same attention,
    weights, positions and block); the field of all systems is computed at once by
    :class:`BatchedField` and the flat state :math:`(Bn, d)` is advanced by the package's
    :class:`~transformer_pde.integrate.TimeLoop`.

    Parameters
    ----------
    att : Attention
        ``kind`` in :data:`ENSEMBLE_KINDS` (``"softmax"``: SA, ``"exp"``: USA, weights
        :math:`w_j` inside the sum), any heads (grouped key/value heads too), masking,
        rotary positions, ``W_O`` and biases; parameters may depend on time.
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
        weights)`` receives the read-only (B, n, d) states.
    weights, positions : array (n,), optional
        Token masses (normalised; uniform by default) and positions in [0, 1] (required
        for masked or rotary attention), the same for every system.
    block : None, "sphere" or Block
        ``"sphere"`` is ``Block(constraint="sphere")``: tokens on :math:`S^{d-1}`, the
        field projected on the tangent space
        :math:`P_x y = y - \langle x, y\rangle x / |x|^2` and every step followed by the
        retraction :math:`x \mapsto x/|x|` (the initial tokens must have norm 1).  A
        :class:`~transformer_pde.Block` may also carry an MLP and LayerNorms (all
        token-wise); its constraint must be a ``Sphere`` or ``PostLayerNorm``.
    backend : {"numpy"}
        The batched field is computed with NumPy (``matmul`` over the systems).
    limits : Limits, optional
        ``max_norm``, ``max_steps``, ``max_memory`` for the whole ensemble.
    warn : bool, default True
        Issue an :class:`~transformer_pde.errors.EarlyStopWarning` when the run ends
        without an answer (``nonfinite``, ``failed``, ``max_steps``, ``interrupted``);
        ``False`` leaves the status as the only report.

    Returns
    -------
    EnsembleTrajectory
        ``states`` of shape (T, B, n, d).  One status for the ensemble: a blow-up is
        reported there only; a stop without an answer also warns (see
        :class:`~transformer_pde.results.Status`).

    Raises
    ------
    ArgumentError, ArgumentTypeError
        Invalid arguments, a kind outside :data:`ENSEMBLE_KINDS`, another backend, a
        constraint that is not token-wise, block options with an adaptive solver, runs
        refused up front by ``limits``.

    Notes
    -----
    Member :math:`b` equals ``simulate(att, X0[b], ...)`` with the same fixed-step solver
    and ``dt`` up to rounding (about :math:`10^{-15}` relative per step): the batched
    products sum in another order than the reference backend's, so the two are not bit
    for bit identical.  Scores are formed directly: tokens so large that
    :math:`\beta\langle Qx, Ky\rangle` overflows end the run with status ``nonfinite``
    (:func:`~transformer_pde.simulate` rescales such scores).

    Examples
    --------
    >>> import numpy as np, transformer_pde as tp
    >>> from transformer_pde.particles.ensemble import simulate_ensemble
    >>> X0 = np.random.default_rng(0).normal(size=(4, 10, 3))
    >>> X0 /= np.linalg.norm(X0, axis=-1, keepdims=True)
    >>> att = tp.Attention("softmax", np.eye(3), np.eye(3), np.eye(3), beta=1.0)
    >>> ens = simulate_ensemble(att, X0, t_max=1.0, dt=0.1, block="sphere")
    >>> ens.states.shape, str(ens.status)
    ((11, 4, 10, 3), 'ok')
    """
    X = _initial(att, X0)
    if backend != "numpy":
        raise ArgumentError(f"backend must be 'numpy' (the batched field is computed with "
                            f"NumPy matmul), got {backend!r}")
    t_max, dt = positive("t_max", t_max), positive("dt", dt)
    warn = check_warn(warn)
    saveat = _saveat(saveat, t_max)
    if limits is None:
        limits = Limits()
    elif not isinstance(limits, Limits):
        raise ArgumentTypeError(f"limits must be a transformer_pde.Limits or None, got "
                                f"{type(limits).__name__}")
    B, n, d = X.shape
    w = validation.weights("weights", weights, n)
    require_positions(att.rotary, positions)
    pos = validation.positions("positions", positions, n, required=att.masked)
    blk = _block(block)
    dtype = X.dtype
    y0 = X.reshape(B * n, d)
    run_solver = get_solver(solver)
    stepper = None
    if blk is not None:
        stepper = BlockStepper(run_solver, blk, d)
        run_solver = stepper
        y0 = stepper.initial(y0)
    y0 = np.ascontiguousarray(y0, dtype=dtype)
    ev = BatchedField(att, (B, n, d), w, pos, dtype)
    saver = _Saver((B, n, d), saveat.fn, w)
    tables = layer_tables(att, stepper.tables if stepper is not None else None)
    loop = TimeLoop(run_solver, lambda tau, z, left, stage: ev(tau, z, left), t_max=t_max,
                    dt=dt, saveat=saveat, limits=limits, tables=tables, xp=np, save=saver)
    preflight(t_max, dt, saveat=saveat, limits=limits, adaptive=loop.adaptive,
              state_shape=y0.shape, dtype=dtype)
    run_solver.reset()
    state = loop.initial_state(y0)
    if saveat.ts is None or saveat.ts[0] == 0.0:
        try:
            saver(0.0, y0)
        except Exception as exc:
            if not owned(exc):          # a caller's timeout, MemoryError: not a bad SaveAt
                raise
            raise ArgumentError(f"SaveAt(fn=...) failed on the initial state: "
                                f"{type(exc).__name__}: {exc}") from exc
    status, message, state = loop.run(state)
    warn_stop(status, message, warn=warn)
    if not saver.times:
        saver(float(state.t), state.y)
    info: dict[str, Any] = {"method": getattr(run_solver, "name", str(run_solver)),
                            "backend": "numpy", "dt": dt, "t_max": t_max,
                            "n_steps": state.n_steps, "n_rejected": state.n_rejected,
                            "dtype": str(dtype), "n_systems": B, "n_tokens": n}
    if stepper is not None:
        info.update(stepper.describe())
    return EnsembleTrajectory(
        times=np.asarray(saver.times, dtype=float),
        states=np.stack(saver.states) if saver.states else None, weights=w, positions=pos,
        status=status, message=message, attention=att, info=info,
        values=np.stack(saver.values) if saver.values else None, last=saver.last)
