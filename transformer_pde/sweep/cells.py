"""Built-in cell functions: the studies users repeat most.

Each is a frozen dataclass (picklable, so Dask can ship it) whose fields are the options of
the cell; a grid axis with the name of a field overrides that field cell by cell.  Each
declares its outputs (``OUTPUTS``, returned by ``outputs(grid)``) and a JSON configuration
(``config()``) that identifies the study in its store.  Statuses are stored as integer codes: the index in
:class:`transformer_pde.results.Status` (the study's ``status_codes`` attribute lists them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np

from ..attention import Attention
from ..errors import ArgumentError
from ..particles import FieldOptions
# the paper's functions are called through the module, so that a test (or a user) patching
# transformer_pde.paper.rank_sweep_trials reaches the cells
from .. import paper
from ..results import Status
from .grid import Grid
from .particle_runs import softmax_pair_run, sphere_run
from .study import Output

__all__ = ["RankCell", "RankSweepCell", "ConeCell", "ConePathCell", "ClusterCell",
           "StabilityCell", "SyncCell", "status_code", "STATUS_CODES", "CELLS"]

#: ``status`` outputs hold ``STATUS_CODES.index(status)``
STATUS_CODES: tuple[str, ...] = tuple(s.value for s in Status)


def status_code(status: Any) -> int:
    return STATUS_CODES.index(Status.parse(status).value)


class _Cell:
    """Shared plumbing: options from fields, overridden by grid axes of the same name, and
    the outputs each cell declares in ``OUTPUTS``."""

    #: the cell's outputs, name -> :class:`~transformer_pde.sweep.Output`
    OUTPUTS: ClassVar[dict[str, Output]] = {}

    def outputs(self, grid: Grid) -> dict:
        self.check_axes(grid)
        return dict(self.OUTPUTS)

    def options(self, params: dict) -> dict:
        opts = asdict(self)
        unknown = set(params) - set(opts)
        if unknown:
            raise ArgumentError(f"{type(self).__name__} has no option {sorted(unknown)[0]!r} "
                                f"(grid axes must be among {sorted(opts)})")
        opts.update(params)
        return opts

    def check_axes(self, grid: Grid) -> None:
        names = {f.name for f in fields(self)}
        for axis in grid.axes:
            if axis not in names:
                raise ArgumentError(f"grid axis {axis!r} is not an option of "
                                    f"{type(self).__name__} (options: {sorted(names)})")

    def config(self) -> dict:
        return {"cell": type(self).__name__, **asdict(self)}


def _matrix(name: str, value: Any, shape: tuple | None = None) -> np.ndarray:
    a = np.asarray(value, dtype=float)
    if shape is not None and a.shape != shape:
        raise ArgumentError(f"{name} must have shape {shape}, got {a.shape}")
    return a


@dataclass(frozen=True)
class RankCell(_Cell):
    r"""One trial of the rank study: :func:`transformer_pde.paper.rank_trial`.

    ``distribution="paper"`` is the paper's experiment (:math:`Q \in \mathbb R^{\lfloor d/2
    \rfloor\times d}`, :math:`K = -Q`, :math:`V = I` or :math:`W^\top W`,
    :math:`\Sigma_0 = SS^\top`, converged runs only, rank = eigenvalues of :math:`\Sigma`
    above ``threshold``); ``"square"`` is the square draw of
    :func:`~transformer_pde.paper.rank_sweep` (not the paper's).  The exact moment ODE is
    solved until :math:`\|\Sigma'\|_F <` ``converge_tol``; a run that does not converge
    draws a new :math:`\Sigma_0` (at most ``max_redraws`` times).

    Outputs: ``rank`` (-1 when no draw converged), ``redraws``, ``t_stop``.
    """

    kind: str = "softmax"
    d: int = 3
    value: str = "identity"
    distribution: str = "paper"
    threshold: float = 0.1
    converge_tol: float = 1e-4
    t_max: float = 2000.0
    max_redraws: int = 20

    OUTPUTS = {"rank": Output((), "int64"), "redraws": Output((), "int64"),
               "t_stop": Output()}

    def __call__(self, params: dict, rng: np.random.Generator) -> dict:
        o = self.options(params)
        tr = paper.rank_trial(str(o["kind"]), int(o["d"]), str(o["value"]), rng,
                        distribution=str(o["distribution"]), threshold=float(o["threshold"]),
                        converge_tol=float(o["converge_tol"]), t_max=float(o["t_max"]),
                        max_redraws=int(o["max_redraws"]))
        return {"rank": tr.rank, "redraws": tr.redraws, "t_stop": tr.t_stop}


@dataclass(frozen=True)
class ConeCell(_Cell):
    r"""One initial covariance of a 2-D phase grid: Gaussian moment solve from
    :math:`\Sigma_0 = [[(v+u)/2, w/2], [w/2, (v-u)/2]]` with :math:`v` = ``trace``.

    Grid axes are usually ``u`` and ``w``; points outside the cone (:math:`u^2 + w^2 \ge v^2`)
    fail with a message.  Outputs: ``status`` (code), ``blowup_time`` (NaN unless blow-up),
    ``t_final`` and ``limit`` (:math:`\Sigma/\operatorname{tr}\Sigma` at the end, 2×2).
    """

    kind: str = "softmax"
    Q: tuple = ((1.0, 0.0), (0.0, 1.0))
    K: tuple = ((1.0, 0.0), (0.0, 1.0))
    V: tuple = ((1.0, 0.0), (0.0, 1.0))
    heads: int = 1
    beta: float = 1.0
    eps: float = 1.0
    u: float = 0.0
    w: float = 0.0
    trace: float = 1.0
    t_max: float = 20.0
    blowup_threshold: float = 1e8
    rtol: float = 1e-10

    OUTPUTS = {"status": Output((), "int8"), "blowup_time": Output(), "t_final": Output(),
               "limit": Output((2, 2), dims=("row", "col"))}

    def __call__(self, params: dict, rng: np.random.Generator) -> dict:
        from .. import gaussian  # noqa: PLC0415 (numba, scipy: ~1 s, paid where a cell runs)

        o = self.options(params)
        u, w, v = float(o["u"]), float(o["w"]), float(o["trace"])
        if u * u + w * w >= v * v:
            raise ArgumentError(f"(u, w) = ({u}, {w}) is not strictly inside the cone of "
                                f"trace {v}")
        cov0 = np.array([[(v + u) / 2, w / 2], [w / 2, (v - u) / 2]])
        extra = {"eps": o["eps"]} if o["kind"] == "sinkhorn" else {}
        if o["kind"] != "l2":
            extra["beta"] = o["beta"]
        att = Attention(o["kind"], _matrix("Q", o["Q"]), _matrix("K", o["K"]),
                        _matrix("V", o["V"], (2, 2)), heads=int(o["heads"]), **extra)
        traj = gaussian.solve(att, np.zeros(2), cov0, t_max=float(o["t_max"]),
                              blowup_threshold=float(o["blowup_threshold"]),
                              rtol=float(o["rtol"]))
        return {"status": status_code(traj.status), "blowup_time": float(traj.blowup_time),
                "t_final": float(traj.t_final), "limit": np.asarray(traj.limit, dtype=float)}


@dataclass(frozen=True)
class ClusterCell(_Cell):
    r"""Cluster count of ``n`` tokens on the unit sphere of :math:`\mathbb R^d` under
    softmax self-attention :math:`Q = K = V = I` at inverse temperature ``beta``
    (the clustering regime of tokens on the sphere), after time ``t_max``.

    Tokens start i.i.d. uniform on the sphere (drawn from the cell's generator).  The run
    uses RK4 with step ``dt`` on the sphere (tangent projection and retraction) and the
    clusters are :func:`transformer_pde.diagnostics.clusters` of the final state.
    Outputs: ``n_clusters``, ``largest`` (mass of the largest cluster), ``status`` (code),
    ``t_final``.
    """

    beta: float = 1.0
    d: int = 3
    n: int = 64
    t_max: float = 20.0
    dt: float = 0.1
    backend: str = "numba"

    OUTPUTS = {"n_clusters": Output((), "int64"), "largest": Output(),
               "status": Output((), "int8"), "t_final": Output()}

    def __call__(self, params: dict, rng: np.random.Generator) -> dict:
        from .. import diagnostics  # noqa: PLC0415 (numba, scipy: ~1 s, paid where a cell runs)

        o = self.options(params)
        d, n = int(o["d"]), int(o["n"])
        X0 = rng.normal(size=(n, d))
        X0 /= np.linalg.norm(X0, axis=1, keepdims=True)
        traj = sphere_run(float(o["beta"]), X0, t_max=float(o["t_max"]), dt=float(o["dt"]),
                          backend=str(o["backend"]))
        cl = diagnostics.clusters(traj.states[-1])
        return {"n_clusters": int(cl.n_clusters), "largest": float(cl.masses.max()),
                "status": status_code(traj.status), "t_final": float(traj.times[-1])}


@dataclass(frozen=True)
class StabilityCell(_Cell):
    r"""Stability of the softmax flow to a perturbation of the initial tokens.

    ``n`` tokens uniform in the ball of radius ``radius`` of :math:`\mathbb R^d`, a copy
    moved by i.i.d. :math:`N(0, \delta^2)` (``delta``), both evolved by softmax attention with
    random :math:`Q, K, V` (entries :math:`N(0, s^2/d)`, ``scale`` = s) up to ``t_max``.
    Outputs: ``w2_0`` and ``w2_t`` (exact :math:`W_2` between the two token measures at 0
    and ``t_max``), ``ratio`` = ``w2_t / w2_0`` and ``bound``, the a-priori bound of
    :func:`transformer_pde.diagnostics.stability_bound` on that ratio (``ratio <= bound``).
    """

    delta: float = 1e-2
    d: int = 2
    n: int = 64
    radius: float = 1.0
    scale: float = 1.0
    t_max: float = 1.0
    dt: float = 0.05

    OUTPUTS = {"w2_0": Output(), "w2_t": Output(), "ratio": Output(), "bound": Output()}

    def __call__(self, params: dict, rng: np.random.Generator) -> dict:
        from .. import diagnostics  # noqa: PLC0415 (numba, scipy: ~1 s, paid where a cell runs)

        o = self.options(params)
        d, n, R = int(o["d"]), int(o["n"]), float(o["radius"])
        s = float(o["scale"]) / math.sqrt(d)
        Q, K, V = (rng.normal(scale=s, size=(d, d)) for _ in range(3))
        direction = rng.normal(size=(n, d))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        X0 = direction * R * rng.uniform(size=(n, 1)) ** (1.0 / d)
        Y0 = X0 + float(o["delta"]) * rng.normal(size=(n, d))
        att, XT, YT = softmax_pair_run(Q, K, V, X0, Y0, t_max=float(o["t_max"]),
                                       dt=float(o["dt"]))
        w0 = diagnostics.wasserstein(X0, Y0, method="exact")
        wt = diagnostics.wasserstein(XT, YT, method="exact")
        R0 = float(max(np.linalg.norm(X0, axis=1).max(), np.linalg.norm(Y0, axis=1).max()))
        bound, _ = diagnostics.stability_bound(att, R0, np.array([0.0, float(o["t_max"])]))
        return {"w2_0": float(w0), "w2_t": float(wt), "ratio": float(wt / w0),
                "bound": float(np.asarray(bound)[-1])}


@dataclass(frozen=True)
class RankSweepCell(_Cell):
    r"""One draw of :func:`transformer_pde.paper.rank_sweep` (the ``ranks`` command).

    The grid axes are ``kind``, ``value``, ``d`` and ``trial`` (``0 … draws-1``); the other
    fields are :func:`~transformer_pde.paper.rank_sweep`'s keywords.  The draw's parameters
    come from ``rank_sweep``'s own random streams (seeded by ``(seed, d, …)``), not from
    the cell's generator, so a study gives exactly the numbers of ``rank_sweep`` with the
    same arguments, whatever the scheduling (:func:`~transformer_pde.paper.rank_sweep_trials`).
    :meth:`run_batch` solves the draws of a task that share (kind, value, d) in one batched
    solve, as ``rank_sweep`` does.

    Outputs: ``rank`` (numerical rank of the limit; -1 when the paper's study kept no
    converged draw) and ``status`` (code, see ``STATUS_CODES``).
    """

    kind: str = "softmax"
    d: int = 3
    value: str = "identity"
    trial: int = 0
    draws: int = 100
    seed: int = 0
    t_max: float = 30.0
    blowup_threshold: float = 1e3
    rtol: float = 1e-3
    solver_rtol: float = 1e-6
    solver_atol: float = 1e-9
    max_steps: int = 2000
    distribution: str = "square"
    threshold: float = 0.1
    converge_tol: float = 1e-4
    max_redraws: int = 20

    OUTPUTS = {"rank": Output((), "int64"), "status": Output((), "int8")}

    def __call__(self, params: dict, rng: np.random.Generator) -> dict:
        return self._solve([params])[0]

    def run_batch(self, params_list: list, rngs: list) -> list:
        """The cells of one task, grouped by (kind, value, d): one batched solve each."""
        return self._solve(params_list)

    def _solve(self, params_list: list) -> list:
        opts = [self.options(p) for p in params_list]
        groups: dict[tuple, list[int]] = {}
        for j, o in enumerate(opts):
            groups.setdefault((o["kind"], int(o["d"]), o["value"]), []).append(j)
        out: list = [None] * len(opts)
        for (kind, d, value), members in groups.items():
            o = {k: v for k, v in opts[members[0]].items()
                 if k not in ("kind", "d", "value", "trial")}
            ranks, status = paper.rank_sweep_trials(kind, d, [int(opts[j]["trial"]) for j in members],
                                              value=value, **o)
            for j, r, s in zip(members, ranks, status, strict=True):
                out[j] = {"rank": int(r), "status": status_code(s)}
        return out


@dataclass(frozen=True)
class ConePathCell:
    r"""One run of the ``cone`` command: the Gaussian path from ``covs0[run]`` under
    ``attention``, reported at ``n_eval`` evenly spaced times up to its own end
    (:func:`transformer_pde.paper.solve_paths`, whose numbers it equals).

    The grid has one axis, ``run`` (indices into ``covs0``).  ``solver`` holds the keyword
    options of :func:`transformer_pde.gaussian.solve` as ``(name, value)`` pairs; ``label``
    identifies ``attention`` in the study's fingerprint (the CLI uses its ``[attention]``
    table).  :meth:`run_batch` finds the ends of a task's runs in one batched solve.

    Outputs: ``n_times`` (points reported: ``n_eval``, or fewer when the solve stopped
    before the end of the batched pass, at a blow-up), ``times (time)`` and
    ``covs (time, row, col)`` (NaN after ``n_times``), ``status`` (code), ``blowup_time``,
    ``t_final`` and ``limit (row, col)``.
    """

    attention: Any
    covs0: tuple
    t_max: float
    n_eval: int
    solver: tuple = ()
    label: str = ""

    def outputs(self, grid: Grid) -> dict:
        if tuple(grid.axes) != ("run",):
            raise ArgumentError(f"ConePathCell needs the single grid axis 'run', got "
                                f"{list(grid.axes)}")
        n = int(self.n_eval)
        return {"n_times": Output((), "int64"), "times": Output((n,), dims=("time",)),
                "covs": Output((n, 2, 2), dims=("time", "row", "col")),
                "status": Output((), "int8"), "blowup_time": Output(), "t_final": Output(),
                "limit": Output((2, 2), dims=("row", "col"))}

    def config(self) -> dict:
        return {"cell": type(self).__name__, "attention": self.label,
                "covs0": np.asarray(self.covs0, dtype=float).tolist(), "t_max": self.t_max,
                "n_eval": self.n_eval, "solver": dict(self.solver)}

    def __call__(self, params: dict, rng: np.random.Generator) -> dict:
        return self.run_batch([params], [rng])[0]

    def run_batch(self, params_list: list, rngs: list) -> list:
        idx = [int(p["run"]) for p in params_list]
        runs = paper.solve_paths(self.attention, np.asarray(self.covs0, dtype=float)[idx],
                           t_max=float(self.t_max), n_eval=int(self.n_eval),
                           **dict(self.solver))
        n = int(self.n_eval)
        out = []
        for r in runs:
            k = len(r.times)
            times, covs = np.full(n, np.nan), np.full((n, 2, 2), np.nan)
            times[:k], covs[:k] = r.times, r.covs
            out.append({"n_times": k, "times": times, "covs": covs,
                        "status": status_code(r.status), "blowup_time": float(r.blowup_time),
                        "t_final": float(r.t_final), "limit": np.asarray(r.limit, dtype=float)})
        return out


@dataclass(frozen=True)
class SyncCell(_Cell):
    r"""One random initial state of ``n`` tokens on the circle under isotropic attention
    (:math:`Q = K = V = I`) at inverse temperature ``beta`` (any sign): does it synchronise?

    The state is drawn by :func:`~transformer_pde.diagnostics.circle_initial_states`
    (``init`` ``"uniform"``: i.i.d. uniform angles; ``"triangle"``: three groups at 120°
    moved by :math:`N(0, \text{spread}^2)` angles) and classified by
    :func:`~transformer_pde.diagnostics.synchronization_runs` (RK4 step ``dt`` on the
    circle up to ``t_max``, checks every ``check_every``): synchronised when the tokens lie
    in an open half-circle (``largest gap > pi + margin``, a certificate), equilibrium when
    no token moved more than ``speed_tol * check_every`` over the last interval,
    undecided otherwise.  ``kind`` is ``"exp"`` (unnormalised, the dynamics of
    Polyanskiy--Rigollet--Yao, arXiv 2507.22857) or ``"softmax"``; ``backend`` and
    ``method`` choose how the field is evaluated (``FieldOptions``).

    Outputs: ``verdict`` (0 synchronised, 1 equilibrium, 2 undecided), ``t_decided``
    (NaN when undecided), ``order`` (order parameter), ``gap`` (largest gap), ``speed``,
    ``clusters`` (groups separated by more than 1e-3 rad), all at the verdict's time;
    ``max_eig``, the largest eigenvalue of the linearisation without the rotation
    (:func:`~transformer_pde.diagnostics.equilibrium_spectrum`: negative for a stable
    equilibrium) for equilibria of at most ``spectrum_max_n`` tokens, else NaN; ``status``
    (code of the run's status).  :meth:`run_batch` runs the draws of a task that share
    their options as one ensemble; each verdict is that of its run alone.
    """

    beta: float = -0.5
    n: int = 64
    kind: str = "exp"
    init: str = "uniform"
    spread: float = 0.3
    t_max: float = 200.0
    dt: float = 0.05
    check_every: float = 1.0
    margin: float = 1e-2
    speed_tol: float = 1e-8
    backend: str = "numpy"
    method: str = "direct"
    spectrum_max_n: int = 256

    OUTPUTS = {"verdict": Output((), "int8"), "t_decided": Output(), "order": Output(),
               "gap": Output(), "speed": Output(), "clusters": Output((), "int64"),
               "max_eig": Output(), "status": Output((), "int8")}

    def __call__(self, params: dict, rng: np.random.Generator) -> dict:
        return self.run_batch([params], [rng])[0]

    def run_batch(self, params_list: list, rngs: list) -> list:
        """The cells of one task, grouped by their options: one ensemble run each."""
        from .. import diagnostics  # noqa: PLC0415 (numba, scipy: ~1 s, paid where a cell runs)

        opts = [self.options(p) for p in params_list]
        groups: dict[str, list[int]] = {}
        for j, o in enumerate(opts):
            groups.setdefault(repr(sorted(o.items())), []).append(j)
        out: list = [None] * len(opts)
        for members in groups.values():
            o = opts[members[0]]
            n, beta, kind = int(o["n"]), float(o["beta"]), str(o["kind"])
            X0 = np.stack([diagnostics.circle_initial_states(
                rngs[j], 1, n, str(o["init"]), float(o["spread"]))[0] for j in members])
            field = FieldOptions(backend=str(o["backend"]), method=str(o["method"]))
            r = diagnostics.synchronization_runs(
                beta, X0, kind=kind, t_max=float(o["t_max"]), dt=float(o["dt"]),
                check_every=float(o["check_every"]), margin=float(o["margin"]),
                speed_tol=float(o["speed_tol"]), field=field)
            for b, j in enumerate(members):
                eig = math.nan
                if r.verdict[b] == 1 and 2 <= n <= int(o["spectrum_max_n"]):
                    eig = float(diagnostics.equilibrium_spectrum(r.states[b], beta, kind)[-1])
                out[j] = {"verdict": int(r.verdict[b]), "t_decided": float(r.t_decided[b]),
                          "order": float(r.order[b]), "gap": float(r.gap[b]),
                          "speed": float(r.speed[b]), "clusters": int(r.clusters[b]),
                          "max_eig": eig, "status": status_code(r.status[b])}
        return out


#: built-in cell functions by the name used in study configuration files
CELLS: dict[str, type] = {"ranks": RankCell, "cone": ConeCell, "clusters": ClusterCell,
                          "stability": StabilityCell, "synchronization": SyncCell}
