r"""Interacting-particle engine: evolve empirical token measures under an attention flow.

For tokens :math:`X_i(t)` with weights :math:`w_i`, :func:`simulate` integrates

.. math:: \dot X_i = \Gamma_{\mu_t}(X_i), \qquad \mu_t = \sum_j w_j \delta_{X_j(t)},

where :math:`\Gamma` is the attention velocity field (:func:`velocity`).  Depth is time:
one explicit Euler step of size 1 is one residual attention layer.  The result is a
:class:`ParticleTrajectory` that can be saved to and loaded from NPZ.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .attention import Attention
from .fields import FieldEvaluator, SinkhornNotConverged, _check_points, velocity
from .blocks import BlockStepper
from .integrate.breakpoints import is_jump, layer_tables, next_jump
from .integrators import PIController, SolverNotConverged, get_solver

__all__ = ["ParticleTrajectory", "simulate", "load", "velocity", "STATUSES"]

logger = logging.getLogger(__name__)

#: possible values of :attr:`ParticleTrajectory.status`
STATUSES = ("ok", "blowup", "nonfinite", "failed")


@dataclass
class ParticleTrajectory:
    """Saved states of a particle simulation.

    Attributes
    ----------
    times : ndarray (T,)
        Saved times.
    states : ndarray (T, N, d)
        Token positions at the saved times (host memory, the simulation's dtype).
    weights : ndarray (N,)
        Normalised token weights.
    positions : ndarray (N,) or None
        Token positions in [0, 1] (masked attention); they never move.
    status : {"ok", "blowup", "nonfinite", "failed"}
        ``ok``: reached ``t_max``; ``blowup``: max |x| exceeded ``max_norm`` (the
        offending state is the last one saved); ``nonfinite``: a step produced NaN/inf
        (not saved); ``failed``: an inner solve (Sinkhorn) did not converge.
    message : str
        Human-readable account of how the run ended (when and why).
    attention : Attention or None
        The specification that was simulated (``None`` after loading one made of
        callables, which cannot be stored).
    info : dict
        Method, backend, step counts, Sinkhorn iterations per evaluation, ...
    """

    times: np.ndarray
    states: np.ndarray
    weights: np.ndarray
    positions: np.ndarray | None
    status: str
    message: str
    attention: Attention | None = None
    info: dict = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """True when the run reached ``t_max``."""
        return self.status == "ok"

    @property
    def final(self) -> np.ndarray:
        """Last saved state (N, d)."""
        return self.states[-1]

    @property
    def t_final(self) -> float:
        return float(self.times[-1])

    def __len__(self) -> int:
        return len(self.times)

    def __repr__(self) -> str:
        T, N, d = self.states.shape
        return (f"ParticleTrajectory(saved={T}, N={N}, d={d}, t=[{self.times[0]:g}, "
                f"{self.times[-1]:g}], status={self.status!r})")

    # ------------------------------------------------------------------ I/O
    def save(self, path: str | Path) -> Path:
        """Write the trajectory to ``path`` (NPZ).  :func:`load` restores it exactly."""
        path = Path(path)
        arrays: dict[str, Any] = {
            "times": self.times, "states": self.states, "weights": self.weights,
        }
        if self.positions is not None:
            arrays["positions"] = self.positions
        meta: dict[str, Any] = {"format": "transformer-pde-trajectory", "version": 1,
                                "status": self.status, "message": self.message,
                                "info": self.info, "attention": None}
        if self.attention is not None:
            spec = self.attention.to_dict()
            att_meta = {}
            for key, value in spec.items():
                if isinstance(value, np.ndarray):
                    arrays[f"att__{key}"] = value
                    att_meta[key] = {"array": f"att__{key}"}
                elif isinstance(value, dict):  # Layers table
                    arrays[f"att__{key}__layers"] = value["layers"]
                    att_meta[key] = {"layers": f"att__{key}__layers",
                                     "layer_time": value["layer_time"], "t0": value["t0"]}
                else:
                    att_meta[key] = value
            meta["attention"] = att_meta
        arrays["meta"] = np.array(json.dumps(meta, default=_json_default))
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)
        return path


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot store {type(o).__name__} in trajectory metadata")


def load(path: str | Path) -> ParticleTrajectory:
    """Read a :class:`ParticleTrajectory` written by :meth:`ParticleTrajectory.save`."""
    with np.load(Path(path), allow_pickle=False) as z:
        if "meta" not in z:
            raise ValueError(f"{path} is not a transformer-pde trajectory (no 'meta' entry)")
        meta = json.loads(str(z["meta"]))
        att = None
        att_meta = meta.get("attention")
        if att_meta is not None and att_meta.get("serialisable", True):
            spec = {}
            for key, value in att_meta.items():
                if isinstance(value, dict) and "array" in value:
                    spec[key] = z[value["array"]]
                elif isinstance(value, dict) and "layers" in value:
                    spec[key] = {"layers": z[value["layers"]], "layer_time": value["layer_time"],
                                 "t0": value["t0"]}
                else:
                    spec[key] = value
            att = Attention.from_dict(spec)
        return ParticleTrajectory(
            times=z["times"], states=z["states"], weights=z["weights"],
            positions=z["positions"] if "positions" in z else None,
            status=meta["status"], message=meta["message"], attention=att,
            info=meta.get("info", {}))


# ------------------------------------------------------------------ progress
class _Progress:
    """tqdm bar when available and requested, else periodic log lines."""

    def __init__(self, total: float, enabled: bool, desc: str):
        self.total = total
        self.bar = None
        self.enabled = enabled
        self.last_logged = -1
        self.done = 0.0
        if enabled:
            try:
                from tqdm.auto import tqdm  # noqa: PLC0415
                self.bar = tqdm(total=total, desc=desc, unit="t",
                                bar_format="{l_bar}{bar}| {n:.3g}/{total:.3g} [{elapsed}<{remaining}]")
            except ImportError:
                self.bar = None

    def update(self, t: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(t - self.done)
        else:
            pct = int(100 * t / self.total) if self.total > 0 else 100
            if pct // 10 > self.last_logged:
                self.last_logged = pct // 10
                logger.info("simulate: t = %.4g / %.4g (%d%%)", t, self.total, pct)
        self.done = t

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------------ simulate
def _check_positive(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {value!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def simulate(att: Attention, X0: Any, *, t_max: float, dt: float, method: Any = "rk4",
             backend: Any = "numpy", weights: Any = None, positions: Any = None,
             save_every: int = 1, max_norm: float = 1e8, progress: bool = False,
             rtol: float = 1e-6, atol: float = 1e-9, dtype: Any = None,
             sinkhorn_tol: float = 1e-9, sinkhorn_max_iter: int = 2000,
             max_steps: int = 10_000_000, constraint: str | None = None,
             mlp: Any = None, layernorm: Any = None,
             splitting: str = "strang") -> ParticleTrajectory:
    r"""Integrate the particle attention flow :math:`\dot X_i = \Gamma_{\mu_t}(X_i)` on :math:`[0, t_{max}]`.

    Parameters
    ----------
    att : Attention
        The velocity field (parameters may depend on time).
    X0 : array (N, d)
        Initial tokens.  float32 input runs in float32; anything else in float64.
    t_max : float
        Final time (> 0).
    dt : float
        Step size for ``euler``/``rk4``; the saving interval unit and the first trial
        step for ``dopri5``.  A last partial step lands exactly on ``t_max``.
    method : {"euler", "heun", "ab2", "ab3", "implicit_midpoint", "rk4", "dopri5"} or solver object
        ``euler`` with ``dt = 1`` is exactly a stack of residual attention layers;
        ``dopri5`` is adaptive (controlled by ``rtol``/``atol``).
    backend : {"numpy", "numba", "cupy", "auto"}
        Where fields are computed; the state stays on that backend between steps and
        only saved states are copied to the host.
    weights, positions : array (N,), optional
        Token masses and positions (positions required for masked attention).
    save_every : int
        Save every ``save_every``-th step (times ``k * dt * save_every``) and the end.
    max_norm : float
        Stop with status ``blowup`` once some :math:`|X_i|_\infty` exceeds this.
    progress : bool
        Show a progress bar (tqdm if installed, else ``logging`` INFO lines).
    rtol, atol : float
        Tolerances of ``dopri5``.
    dtype : numpy dtype, optional
        Override the working precision (float32 or float64).
    sinkhorn_tol, sinkhorn_max_iter
        Inner Sinkhorn solve controls (warm-started from the previous evaluation).
    max_steps : int
        Safety cap on the number of (attempted) steps.
    constraint : {None, "sphere"}
        ``"sphere"``: tokens stay on the unit sphere (``X0`` rows must have norm 1 to 1e-6);
        fields are projected on the tangent space and each step ends with the retraction
        :math:`x/|x|` (see :mod:`transformer_pde.blocks`).
    mlp : transformer_pde.blocks.MLP, optional
        Token-wise MLP field added to attention (a full Transformer block).
    layernorm : transformer_pde.blocks.LayerNorm or pair of them, optional
        Pre-norm (inside the fields) or post-norm (projection after each sub-flow).
    splitting : {"strang", "lie", "none"}
        How attention and MLP flows are combined (only used with ``mlp``).  The block
        options need a fixed-step ``method``.

    Returns
    -------
    ParticleTrajectory
        ``status`` says whether the run reached ``t_max``; every state saved before a
        blow-up, a non-finite step or a failed inner solve is kept.

    Examples
    --------
    >>> import numpy as np, transformer_pde as tp
    >>> att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    >>> X0 = np.random.default_rng(0).normal(size=(50, 2))
    >>> traj = tp.simulate(att, X0, t_max=1.0, dt=0.1)
    >>> traj.states.shape, traj.status
    ((11, 50, 2), 'ok')
    """
    if not isinstance(att, Attention):
        raise TypeError(f"att must be a transformer_pde.Attention, got {type(att).__name__}")
    X0n = _check_points("X0", np.asarray(X0) if not hasattr(X0, "get") else X0.get(), att.d)
    t_max = _check_positive("t_max", t_max)
    dt = _check_positive("dt", dt)
    max_norm = _check_positive("max_norm", max_norm)
    if isinstance(save_every, bool) or not isinstance(save_every, (int, np.integer)) \
            or save_every < 1:
        raise ValueError(f"save_every must be an integer >= 1, got {save_every!r}")
    if dtype is None:
        dtype = X0n.dtype if X0n.dtype in (np.float32, np.float64) else np.float64
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    solver = get_solver(method, rtol=rtol, atol=atol)
    block = BlockStepper.wrap(solver, att.d, mlp=mlp, layernorm=layernorm,
                              constraint=constraint, splitting=splitting)
    if block is not None:
        X0n = block.initial(X0n)
        solver = block
    # every piecewise-constant Layers table of the run (attention, MLP, LayerNorms)
    tables = layer_tables(att, *(block.tables if block is not None else ()))
    n = X0n.shape[0]
    ev = FieldEvaluator(att, n, weights=weights, positions=positions, backend=backend,
                        dtype=dtype, sinkhorn_tol=sinkhorn_tol,
                        sinkhorn_max_iter=sinkhorn_max_iter)
    be = ev.be
    y = be.asarray(X0n, dtype)
    step_end = [0.0]
    stage = [None]   # index of the next evaluation within a fixed-step step (None: adaptive)

    def f(tau: float, z: Any) -> Any:
        # Stages evaluated at the right end of the current step use the left limit of
        # piecewise-constant parameters, so a step inside layer l never sees layer l + 1.
        # The stage index lets Sinkhorn warm-start stage i from stage i of earlier steps.
        ev.stage = stage[0]
        if stage[0] is not None:
            stage[0] += 1
        return ev(tau, z, left=tau >= step_end[0])

    solver.reset()

    times = [0.0]
    states = [np.array(X0n, dtype=dtype)]
    status, message = "ok", ""
    n_steps = n_rejected = 0
    t = 0.0
    save_dt = dt * save_every
    bar = _Progress(t_max, progress, f"simulate[{att.kind}]")
    tol_t = 1e-12 * max(1.0, t_max)

    def save():
        # copy the current state (t, y) to the host
        times.append(t)
        states.append(be.to_numpy(y).copy())

    def check(y_new, t_new):
        if not bool(be.xp.all(be.xp.isfinite(y_new))):
            return "nonfinite", (f"non-finite token coordinates in the step from t={t:.6g} to "
                                 f"t={t_new:.6g}; the last finite state (t={times[-1]:.6g}) "
                                 "is kept")
        mx = float(be.xp.max(be.xp.abs(y_new)))
        if mx > max_norm:
            return "blowup", (f"max |x| = {mx:.3g} exceeded max_norm={max_norm:g} at "
                              f"t={t_new:.6g}")
        return None, ""

    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if not getattr(solver, "adaptive", False):
                step_idx = 0
                while t < t_max - tol_t:
                    h = min(dt, t_max - t)
                    step_end[0] = t + h
                    stage[0] = 0
                    y_new = solver.step(f, t, y, h)
                    step_idx += 1
                    n_steps += 1
                    t_new = t_max if t_max - (t + h) <= tol_t else t + h
                    bad, msg = check(y_new, t_new)
                    if bad == "nonfinite":
                        status, message = bad, msg
                        break
                    y, t = y_new, t_new
                    if getattr(solver, "multistep", False) and is_jump(tables, t):
                        solver.reset()  # multistep history must not reach across a jump
                    if bad == "blowup" or step_idx % save_every == 0 or t >= t_max - tol_t:
                        save()
                    bar.update(t)
                    if bad == "blowup":
                        status, message = bad, msg
                        break
                    if n_steps >= max_steps:
                        status, message = "failed", f"max_steps={max_steps} reached at t={t:.6g}"
                        break
            else:
                ctrl = PIController(solver.order)
                h = dt
                step_end[0] = np.inf
                fy = f(t, y)
                k = 1
                while t < t_max - tol_t and status == "ok":
                    t_save = min(k * save_dt, t_max)
                    while t < t_save - tol_t:
                        # land on layer boundaries: an embedded pair cannot step over
                        # a jump of the parameters at its tolerance
                        h_try = min(h, t_save - t, next_jump(tables, t) - t)
                        step_end[0] = t + h_try
                        y_new, err, f_new = solver.attempt(f, t, y, h_try, fy)
                        step_end[0] = np.inf
                        n_steps += 1
                        if n_steps >= max_steps:
                            status, message = "failed", f"max_steps={max_steps} reached at t={t:.6g}"
                            break
                        if not (err <= 1.0):
                            n_rejected += 1
                            h = h_try * ctrl.factor(err, False)
                            if h < 1e-14 * max(1.0, abs(t)):
                                status, message = "nonfinite", (
                                    f"step size underflow at t={t:.6g} (error {err:.3g}); the "
                                    "flow is likely blowing up")
                                break
                            continue
                        t_new = t_save if t_save - (t + h_try) <= tol_t else t + h_try
                        bad, msg = check(y_new, t_new)
                        if bad == "nonfinite":
                            n_rejected += 1
                            h = h_try * 0.2
                            continue
                        h_next = h_try * ctrl.factor(err, True)
                        # keep the controller's step when the save point clipped it
                        h = max(h_next, h) if h_try < h else h_next
                        y, t, fy = y_new, t_new, f_new
                        if is_jump(tables, t):
                            # first-same-as-last would reuse the left limit of the old
                            # layer's parameters: evaluate the new layer's field instead
                            fy = f(t, y)
                        bar.update(t)
                        if bad == "blowup":
                            status, message = bad, msg
                            save()
                            break
                    if status != "ok":
                        break
                    save()
                    k += 1
    except (SinkhornNotConverged, SolverNotConverged) as exc:
        status, message = "failed", str(exc)
    finally:
        bar.close()
    if status == "ok":
        message = f"reached t_max={t_max:g} in {n_steps} steps"
    else:
        logger.warning("simulate stopped: %s", message)
    info: dict[str, Any] = {"method": getattr(solver, "name", str(method)),
                            "backend": be.name, "dt": dt, "t_max": t_max,
                            "n_steps": n_steps, "n_rejected": n_rejected,
                            "dtype": str(dtype), "save_every": int(save_every)}
    info.update(ev.info)
    if block is not None:
        info.update(block.describe())
    return ParticleTrajectory(
        times=np.asarray(times, dtype=float), states=np.stack(states),
        weights=ev.weights, positions=ev.positions, status=status, message=message,
        attention=att, info=info)
