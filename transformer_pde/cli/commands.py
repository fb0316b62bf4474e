r"""The ``transformer-pde`` commands: each reads its options, calls the library and writes
its files through an :class:`~transformer_pde.cli.output.OutputDir` (checked before the
run; nothing is left behind when the run fails).

Each ``run_*`` function is usable from Python and returns the command's summary
dictionary (the content of its ``summary.json``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import CheckpointError, ConfigError, TransformerPDEError
from ..io.container import save_npz
from ..io.jsonfmt import dumps
from .config import (Table, build_attention, build_simulate, build_tokens, check_memory,
                     covariance, library_call, read_options, sections,
                     typed_parameters)
from .output import OutputDir, OutputError

__all__ = [
    "CLUSTER_TOL",
    "UsageError",
    "RANK_RTOL",
    "StudyInterrupted",
    "benchmark_scripts",
    "run_bench",
    "run_cone",
    "run_demo",
    "run_gaussian",
    "run_ranks",
    "run_simulate",
]

logger = logging.getLogger("transformer_pde.cli")

#: single-linkage scale of the cluster counts: a fraction of the cloud radius (largest
#: distance to the mean), as in :func:`transformer_pde.diagnostics.clusters`
CLUSTER_TOL = 0.02
#: relative tolerance of the covariance numerical rank reported by the CLI
RANK_RTOL = 1e-6


class UsageError(TransformerPDEError):
    """The command line asks for something that cannot be done (exit status 2)."""


# =========================================================================== helpers
def _cloud_rank(X: np.ndarray) -> int:
    """Numerical rank (relative tolerance :data:`RANK_RTOL`) of the covariance of a cloud."""
    from ..diagnostics import numerical_rank  # noqa: PLC0415

    Y = X - X.mean(axis=0)
    return numerical_rank(Y.T @ Y / X.shape[0], RANK_RTOL)


def _clusters(X: np.ndarray, tol: float) -> tuple[int, np.ndarray]:
    """Number of clusters and labels (single linkage at ``tol`` times the cloud radius)."""
    from ..diagnostics import clusters  # noqa: PLC0415

    res = clusters(X, tol=tol)
    return res.n_clusters, res.labels


def _depth_figure(times: np.ndarray, Z: np.ndarray, labels: np.ndarray, title: str) -> Any:
    """Tokens of a 1-D run against depth (one line per token, coloured by final cluster)."""
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    colours = [f"C{k % 10}" for k in labels]
    for i in range(Z.shape[1]):
        ax.plot(times, Z[:, i, 0], color=colours[i], lw=0.8, alpha=0.8)
    ax.set_xlabel("depth t")
    ax.set_ylabel("token x (d = 1)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig


# =========================================================================== demo
def run_demo(out: str | Path = "transformer-pde-demo", *, n: int = 256, seed: int = 0,
             t_max: float = 6.0, dt: float = 0.05, backend: str = "numpy",
             gif: bool = False, cluster_tol: float = CLUSTER_TOL, force: bool = False) -> dict:
    r"""Run the demo and write its files; returns the summary dictionary.

    Tokens :math:`x_i(0) \sim N(0, I_2)`, :math:`N = 256`, softmax attention with
    :math:`Q = K = V = I`, integrated with RK4 (:math:`h = 0.05`) to :math:`t = 6`.
    With :math:`V = I` the tokens grow like :math:`e^{t}`; in the co-moving frame
    :math:`z = e^{-t} x` they collapse onto a few clusters at vertices of a convex polygon
    (Geshkovski, Letrouit, Polyanskiy, Rigollet 2023).  Clusters are counted by single
    linkage at ``cluster_tol`` times the radius of the final cloud
    (:func:`transformer_pde.diagnostics.clusters`).
    """
    from matplotlib.figure import Figure  # noqa: PLC0415

    from .. import plot  # noqa: PLC0415
    from ..attention import Attention  # noqa: PLC0415
    from ..integrate import planned_saves  # noqa: PLC0415
    from ..particles import FieldOptions, SaveAt, simulate  # noqa: PLC0415

    n_saved = planned_saves(t_max, dt, SaveAt())
    check_memory("--t-max", 8.0 * 2 * n_saved * n * 2,
                 f"saving {n_saved} states of {n} x 2 tokens (t_max / dt = {t_max / dt:.3g})")
    with OutputDir(out, force=force) as outdir:
        rng = np.random.default_rng(seed)
        X0 = rng.normal(size=(n, 2))
        att = Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
        t0 = time.perf_counter()
        traj = simulate(att, X0, t_max=t_max, dt=dt, solver="rk4",
                        field=FieldOptions(backend=backend))
        elapsed = time.perf_counter() - t0
        Z = plot.rescaled_states(traj, np.eye(2))
        k_final, labels = _clusters(Z[-1], cluster_tol)
        counts = [_clusters(z, cluster_tol)[0] for z in Z]
        rank = _cloud_rank(Z[-1])
        fig = Figure(figsize=(10.5, 4.6), layout="constrained")
        ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
        plot.particles(Z, labels=labels, ax=ax1,
                       title=f"softmax attention, Q=K=V=I: {k_final} clusters")
        ax1.set_xlabel(r"$(e^{-t}x)_1$")
        ax1.set_ylabel(r"$(e^{-t}x)_2$")
        ax2.step(traj.times, counts, where="post", color="C0")
        ax2.set_yscale("log")
        ax2.set_xlabel("depth t")
        ax2.set_ylabel(f"clusters (single linkage, {cluster_tol:g} x cloud radius)")
        ax2.set_title("number of clusters along depth")
        ax2.grid(alpha=0.3)
        files = {"figure": outdir.savefig(fig, "demo.png").name,
                 "trajectory": traj.save(outdir.path("trajectory.npz")).name}
        if gif:
            files["animation"] = plot.animate_particles(Z, outdir.path("demo.gif")).name
        summary = {
            "command": "demo", "n_tokens": n, "d": 2, "kind": "softmax", "Q=K=V": "identity",
            "t_max": t_max, "dt": dt, "method": "rk4",
            "backend": traj.info.get("backend", backend), "status": str(traj.status),
            "seconds": round(elapsed, 3), "clusters_final": k_final,
            "cluster_scale": cluster_tol, "cluster_sizes": np.bincount(labels).tolist(),
            "covariance_rank": rank, "covariance_rank_rtol": RANK_RTOL,
            "frame": "z = exp(-t) x (co-moving frame of V = I)", "files": files,
        }
        outdir.write_json("summary.json", summary)
        text = (
            "transformer-pde demo: clustering of 2-D tokens under softmax attention\n"
            f"  tokens: N = {n} drawn from N(0, I_2) (seed {seed}); Q = K = V = I; RK4, "
            f"dt = {dt}, t in [0, {t_max:g}]\n"
            f"  run: {traj.status} in {elapsed:.2f} s ({summary['backend']} backend)\n"
            f"  final number of clusters: {k_final} (single linkage at {cluster_tol:g} x cloud "
            "radius, frame e^(-t) x)\n"
            f"  cluster sizes: {summary['cluster_sizes']}\n"
            f"  covariance numerical rank of the final tokens: {rank} of 2 "
            f"(eigenvalues > {RANK_RTOL:g} x largest)\n"
            f"  files: {', '.join(files.values())}, summary.json, summary.txt in "
            f"{outdir.final}\n")
        outdir.write_text("summary.txt", text)
    summary["text"] = text
    return summary


# =========================================================================== simulate
OUTPUT_KEYS = ("rescale", "cluster_scale", "figure", "gif")


def _interrupted_run(directory: Path) -> bool:
    """Whether ``directory`` holds the files of an interrupted ``simulate`` (which a
    ``--resume`` run may replace)."""
    try:
        summary = json.loads((directory / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(summary, dict) and summary.get("command") == "simulate"
            and summary.get("status") == "interrupted")


def run_simulate(cfg: dict, out: str | Path, *, progress: bool = True, force: bool = False,
                 checkpoint: str | Path | None = None, checkpoint_every: float | None = None,
                 resume: bool = False, report_every: float | None = None) -> dict:
    """Particle simulation from a configuration (tables ``attention``, ``tokens``, ``run``,
    ``field``, ``limits``, ``block``, ``output``); writes ``trajectory.npz``,
    ``summary.json`` and ``particles.png``.

    With ``masked = true`` the tokens get positions ``linspace(0, 1, N)`` in input order
    (token ``i`` attends to tokens ``j <= i``).  A run interrupted by Ctrl-C (status
    ``interrupted``) writes the states computed so far, without figures.  ``checkpoint``,
    ``checkpoint_every``, ``resume`` and ``report_every`` are those of
    :class:`~transformer_pde.Monitor` (progress lines every ``report_every`` seconds): the
    state of the run is written to ``checkpoint`` every ``checkpoint_every`` seconds, and
    ``resume`` continues from it (bit for bit the uninterrupted run); a resumed run may
    replace the files of the interrupted run it continues in ``out``.
    """
    from .. import plot  # noqa: PLC0415
    from ..integrate.loop import Monitor  # noqa: PLC0415
    from ..particles import simulate  # noqa: PLC0415

    sections(cfg, ("attention", "tokens", "run", "field", "limits", "block", "output",
                   "title"))
    att = build_attention(cfg.get("attention"))
    X0 = build_tokens(cfg.get("tokens"), att.d, base=cfg.get("__dir__"))
    opts = build_simulate(cfg, att)
    block = opts["block"]
    if block is not None and getattr(block.constraint, "name", None) == "sphere":
        radius = np.linalg.norm(X0, axis=1)
        if np.max(np.abs(radius - 1.0)) > 1e-6:
            raise ConfigError("tokens: block.constraint = 'sphere' needs tokens on the unit "
                              "sphere (distribution = 'sphere', or a file of unit rows)")
    outp = Table(cfg.get("output"), "output", OUTPUT_KEYS)
    rescale_opt = outp.choice("rescale", "none", ("none", "value"))
    if rescale_opt == "value" and (att.heads != 1 or att.time_dependent):
        raise ConfigError("output.rescale: 'value' draws exp(-tV) x and needs a single-head "
                          "attention with a constant V")
    rel = outp.number("cluster_scale", CLUSTER_TOL, positive=True)
    want_figure = outp.boolean("figure", True)
    want_gif = outp.boolean("gif", False)
    if want_gif and att.d < 2:
        raise ConfigError(f"output.gif: the animation draws two coordinates and needs "
                          f"attention.d >= 2, got d = {att.d}")
    _preflight(att, opts, X0)
    if checkpoint is not None:
        _check_checkpoint(checkpoint)
    try:
        timing = {k: v for k, v in (("checkpoint_every", checkpoint_every),
                                    ("report_every", report_every)) if v is not None}
        monitor = Monitor(progress=progress, checkpoint=checkpoint, resume=resume, **timing)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    positions = np.linspace(0.0, 1.0, X0.shape[0]) if att.masked else None
    with OutputDir(out, force=force,
                   replaceable=_interrupted_run if resume else None) as outdir:
        logger.info("simulate: %d tokens in d = %d, t in [0, %g]; Ctrl-C stops the run and "
                    "keeps the states computed so far", X0.shape[0], att.d, opts["t_max"])
        t0 = time.perf_counter()
        try:
            traj = simulate(att, X0, positions=positions, monitor=monitor, **opts)
        except CheckpointError as exc:  # the library's own check of the path, before step 1
            raise UsageError(f"--checkpoint {checkpoint}: {exc}") from None
        elapsed = time.perf_counter() - t0
        files = {"trajectory": traj.save(outdir.path("trajectory.npz")).name}
        interrupted = str(traj.status) == "interrupted"
        Z = plot.rescaled_states(traj, "value" if rescale_opt == "value" else None)
        k, labels = _clusters(Z[-1], rel)
        title = str(cfg.get("title", f"{att.kind} attention"))
        if want_figure and not interrupted:
            fig = (plot.particles(Z, labels=labels, title=title) if att.d >= 2
                   else _depth_figure(traj.times, Z, labels, title))
            files["figure"] = outdir.savefig(fig, "particles.png").name
        if want_gif and not interrupted:
            files["animation"] = plot.animate_particles(Z, outdir.path("particles.gif")).name
        summary = {
            "command": "simulate", "attention": repr(att), "n_tokens": int(X0.shape[0]),
            "d": att.d, "status": str(traj.status), "message": traj.message,
            "t_final": traj.t_final, "seconds": round(elapsed, 3), "info": traj.info,
            "frame": rescale_opt, "clusters_final": k, "cluster_scale": rel,
            "covariance_rank": _cloud_rank(Z[-1]), "covariance_rank_rtol": RANK_RTOL,
            "max_abs_final": float(np.max(np.abs(traj.final))), "files": files,
        }
        if checkpoint is not None:
            summary["checkpoint"] = str(checkpoint)
        outdir.write_json("summary.json", summary)
    return summary


def _check_checkpoint(checkpoint: str | Path) -> None:
    """Refuse, before anything is computed, a ``--checkpoint`` path that cannot hold the
    run's checkpoints or whose file would be replaced although it is something else (a
    folder, a device such as ``/dev/null``, the configuration file, any file that is not
    a checkpoint): the library's own rule,
    :func:`~transformer_pde.integrate.checkpoint.check_path`.  An existing checkpoint is
    continued with ``--resume``, else replaced; any other file is refused with or without
    ``--resume``."""
    from ..integrate.checkpoint import check_path  # noqa: PLC0415

    if str(checkpoint).strip() == "":
        raise UsageError("--checkpoint: expected the path of a file, got an empty string")
    try:
        check_path(checkpoint, resume=False)
    except CheckpointError as exc:
        raise UsageError(f"--checkpoint {checkpoint}: {exc}") from None


def _preflight(att: Any, opts: dict, X0: np.ndarray) -> None:
    """Refuse, naming the key, a run the library would refuse: the library's own checks
    (:func:`~transformer_pde.integrate.check_step_budget` and
    :func:`~transformer_pde.integrate.preflight` on the run's arguments as
    :func:`~transformer_pde.simulate` reads them,
    :meth:`~transformer_pde.particles.simulation.RunSpec.of`), which ``simulate`` makes
    before its first step: the command line refuses exactly the runs the library refuses
    (``t_max = 0.07, dt = 0.01`` is 7 steps)."""
    from ..errors import ArgumentError  # noqa: PLC0415
    from ..integrate import check_step_budget, preflight  # noqa: PLC0415
    from ..particles.simulation import RunSpec  # noqa: PLC0415

    spec = RunSpec.of(att, X0, opts["t_max"], opts["dt"], opts["saveat"], opts["block"],
                      opts["field"], opts["limits"], None)
    adaptive = bool(getattr(opts["solver"], "adaptive", False))
    try:
        check_step_budget(spec.t_max, spec.dt, spec.saveat, spec.limits, adaptive=adaptive)
    except ArgumentError as exc:
        raise ConfigError(f"run.dt: {exc} (limits.max_steps)") from None
    try:
        preflight(spec.t_max, spec.dt, saveat=spec.saveat, limits=spec.limits,
                  adaptive=adaptive, state_shape=spec.X0.shape, dtype=spec.dtype)
    except ArgumentError as exc:
        key = "run.save_at" if spec.saveat.ts is not None else "run.save_every"
        raise ConfigError(f"{key}: {exc} (limits.max_memory)") from None


# =========================================================================== gaussian
def _gaussian_options(name: str, allowed: tuple[str, ...], data: Any,
                      t_max: float) -> tuple[Table, float, dict]:
    """The table ``name`` with its own keys ``allowed``, ``t_max`` (default ``t_max``) and
    the keyword options of :func:`transformer_pde.gaussian.solve` (``rtol``, ``atol``,
    ``blowup_threshold``, ``converge_tol``, ``convergence``; the library's defaults)."""
    from .. import gaussian  # noqa: PLC0415

    spec = typed_parameters(gaussian.solve, exclude=("att", "mean0", "cov0", "t_max", "t_eval"))
    sec = Table(data, name, (*allowed, "t_max", *spec))
    opts = read_options(sec, spec)
    for k, v in opts.items():
        if isinstance(v, float) and v <= 0:
            raise ConfigError(f"{sec.key(k)}: expected a finite number > 0, got {v!r}")
    return sec, sec.number("t_max", t_max, positive=True), opts


def run_gaussian(cfg: dict, out: str | Path, *, force: bool = False) -> dict:
    r"""Gaussian moment ODE from a configuration (tables ``attention`` and ``gaussian``).

    Writes ``gaussian.npz`` (times, means, covs, limit), ``summary.json`` (status, blow-up
    time, ranks of the limit) and ``gaussian.png`` (eigenvalues of :math:`\Sigma(t)`).
    """
    from matplotlib.figure import Figure  # noqa: PLC0415

    from .. import gaussian  # noqa: PLC0415
    from ..diagnostics import effective_rank, numerical_rank  # noqa: PLC0415

    sections(cfg, ("attention", "gaussian", "title"))
    att = build_attention(cfg.get("attention"))
    d = att.d
    sec, t_max, opts = _gaussian_options("gaussian", ("mean", "cov", "n_eval"),
                                         cfg.get("gaussian"), 10.0)
    mean = sec.vector("mean", d, [0.0] * d)
    cov = covariance(sec.raw("cov", "identity"), sec.key("cov"), d)
    n_eval = sec.integer("n_eval", 200, minimum=2)
    check_memory(sec.key("n_eval"), 8.0 * 4 * n_eval * d * (d + 1),
                 f"{n_eval} saved means and covariances")
    with OutputDir(out, force=force) as outdir:
        traj = library_call("gaussian", gaussian.solve, att, mean, cov, t_max=t_max,
                            t_eval=np.linspace(0.0, t_max, n_eval), names=opts, strict=False,
                            **opts)
        save_npz(outdir.path("gaussian.npz"), {"times": traj.times, "means": traj.means,
                                               "covs": traj.covs, "limit": traj.limit})
        lam = np.linalg.eigvalsh(traj.covs)
        fig = Figure(figsize=(6.0, 4.0), layout="constrained")
        ax = fig.add_subplot()
        for i in range(d):
            ax.semilogy(traj.times, np.clip(lam[:, i], 1e-300, None),
                        label=f"$\\lambda_{i + 1}$")
        if np.isfinite(traj.blowup_time):
            ax.axvline(traj.blowup_time, color="k", ls="--", lw=0.8, label="$T^*$")
        ax.set_xlabel("t")
        ax.set_ylabel(r"eigenvalues of $\Sigma(t)$")
        ax.set_title(str(cfg.get("title", f"{att.kind}: {traj.status}")))
        ax.legend(fontsize="small")
        outdir.savefig(fig, "gaussian.png")
        summary = {"command": "gaussian", "attention": repr(att), "status": str(traj.status),
                   "message": traj.message, "blowup_time": traj.blowup_time,
                   "t_final": traj.t_final, "trace_final": float(np.trace(traj.covs[-1])),
                   "limit_numerical_rank": numerical_rank(traj.limit, RANK_RTOL),
                   "limit_rank_rtol": RANK_RTOL,
                   "limit_effective_rank": effective_rank(traj.limit),
                   "mean_final": traj.means[-1], "nfev": traj.nfev,
                   "files": {"data": "gaussian.npz", "figure": "gaussian.png"}}
        outdir.write_json("summary.json", summary)
    return summary


# =========================================================================== studies
class StudyInterrupted(TransformerPDEError):
    """Ctrl-C during a ``ranks`` / ``cone`` study; ``store`` holds the finished cells (or is
    ``None`` when none had finished: nothing was written)."""

    def __init__(self, store: Path | None) -> None:
        self.store = store
        kept = (f"the cells finished so far are in {store}; rerun with --resume to complete it"
                if store is not None else "nothing was written")
        super().__init__(f"interrupted; {kept}")


def _run_study(study: Any, out: str | Path, cfg: dict, *, force: bool, resume: bool,
               scheduler: Any, scheduler_file: str | Path | None, workers: int | None,
               progress: bool) -> tuple[Any, OutputDir]:
    """Run ``study`` with :func:`transformer_pde.sweep.run` into ``out/results.zarr`` and
    return its Dataset and the (staged) :class:`OutputDir` for the command's other files.

    ``results.zarr`` is written in ``out`` itself as cells finish (so that ``--resume`` can
    complete it after a crash or Ctrl-C); without ``--resume`` an existing one is refused
    (``--force`` never replaces it).  A run that fails or is interrupted before any cell
    finished leaves nothing behind."""
    from .. import sweep  # noqa: PLC0415  (dask, xarray, zarr are imported only here)

    out = Path(out)
    store = out / "results.zarr"
    if store.exists() and not resume:
        raise OutputError(f"--out {out}: holds the results.zarr of an earlier run; pass "
                             "--resume to complete it (same configuration), or choose a new "
                             "directory (nothing was changed)")
    outdir = OutputDir(out, force=force,
                       replaceable=(lambda p: (p / "results.zarr").is_dir()) if resume else None)
    created = not out.exists()
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"--out {out}: cannot create it ({exc.strerror})") from None
        fresh = not store.exists()
        try:
            ds = sweep.run(study, store, scheduler=scheduler, workers=workers,
                           scheduler_file=scheduler_file, resume=resume, progress=progress,
                           config={k: v for k, v in cfg.items() if k != "__dir__"})
        except BaseException as exc:
            kept = store.exists() and _finished_cells(store) > 0
            if fresh and store.exists() and not kept:
                shutil.rmtree(store, ignore_errors=True)
            if created and out.exists() and not any(out.iterdir()):
                out.rmdir()
            if isinstance(exc, KeyboardInterrupt):
                raise StudyInterrupted(store if kept else None) from None
            raise
    except BaseException:
        outdir.discard()
        raise
    return ds, outdir


def _finished_cells(store: Path) -> int:
    from ..sweep import StoreError, open_results  # noqa: PLC0415

    try:
        return int((open_results(store)["cell_status"].values != 0).sum())
    except StoreError:
        return 0


def _study_summary(ds: Any) -> dict:
    from ..sweep import summary  # noqa: PLC0415

    return {"store": "results.zarr", **summary(ds)}


# =========================================================================== cone
CONE_KEYS = ("n", "init", "radius", "trace", "seed", "n_eval", "view", "color_by",
             "rank_one_line", "v_max")


def run_cone(cfg: dict, out: str | Path, *, force: bool = False, resume: bool = False,
             scheduler: Any = None, scheduler_file: str | Path | None = None,
             workers: int | None = None, progress: bool = True) -> dict:
    """Phase plot of many 2-D covariance trajectories (tables ``attention`` and ``cone``).

    A study of the sweep engine (:mod:`transformer_pde.sweep`): one cell per initial
    covariance (:class:`~transformer_pde.sweep.ConePathCell`, the numbers of
    :func:`transformer_pde.paper.solve_paths`), run on an embedded Dask cluster (``workers``
    processes), an existing one (``scheduler`` address or ``scheduler_file``) or in this
    process (``scheduler="serial"``), written to ``results.zarr`` as cells finish
    (``resume`` completes it).  Writes ``cone.npz`` (``covs0``; ``times_<i>``,
    ``covs_<i>`` per run, each up to its own end; ``status``, ``blowup_time``, ``limit``),
    ``summary.json`` and ``cone.png``."""
    from matplotlib.figure import Figure  # noqa: PLC0415

    from .. import gaussian, plot  # noqa: PLC0415
    from ..gaussian.affine import check_attention  # noqa: PLC0415
    from ..gaussian.system import check_solver_args  # noqa: PLC0415
    from ..paper import STATUS_COLOURS, slice_covariances  # noqa: PLC0415
    from ..sweep import STATUS_CODES, ConePathCell, Grid, Study  # noqa: PLC0415

    sections(cfg, ("attention", "cone", "title"))
    att = build_attention(cfg.get("attention"))
    if att.d != 2:
        raise ConfigError(f"attention.d: the cone phase plot needs d = 2, got {att.d}")
    sec, t_max, opts = _gaussian_options("cone", CONE_KEYS, cfg.get("cone"), 20.0)
    n = sec.integer("n", 24, minimum=1)
    n_eval = sec.integer("n_eval", 200, minimum=2)
    check_memory(sec.key("n"), 8.0 * 4 * 6 * n * n_eval, f"{n} runs of {n_eval} saved times")
    radius = sec.number("radius", 0.7, nonneg=True)
    if radius >= 1:
        raise ConfigError(f"{sec.key('radius')}: expected a number in [0, 1), got {radius}")
    covs0 = slice_covariances(n, radius=radius, trace=sec.number("trace", 1.0, positive=True),
                              init=sec.choice("init", "circle", ("circle", "random")),
                              seed=sec.integer("seed", 0))
    view = sec.choice("view", "both", ("cone", "slice", "both"))
    color_by = sec.choice("color_by", "start", ("start", "end", "status"))
    line = sec.vector("rank_one_line", 2) if sec.has("rank_one_line") else None
    v_max = sec.number("v_max", 0.0, positive=True) if sec.has("v_max") else None
    # the library's own argument checks, before any cell runs (errors name the key)
    spec = typed_parameters(gaussian.solve, exclude=("att", "mean0", "cov0", "t_max", "t_eval"))
    solver = {k: opts.get(k, default) for k, (_, default) in spec.items()}
    library_call("cone", check_solver_args, t_max, solver["rtol"], solver["atol"],
                 solver["blowup_threshold"], solver["converge_tol"], solver["convergence"],
                 names=opts)
    library_call("attention", check_attention, att)
    cell = ConePathCell(att, tuple(tuple(map(tuple, c)) for c in covs0.tolist()), t_max,
                        n_eval, tuple(sorted(opts.items())),
                        dumps(cfg.get("attention", {}), sort_keys=True, describe=True))
    study = Study(Grid({"run": list(range(n))}, draws=1), cell, name="cone")
    ds, outdir = _run_study(study, out, cfg, force=force, resume=resume, scheduler=scheduler,
                            scheduler_file=scheduler_file, workers=workers, progress=progress)
    with outdir:
        done = ds["cell_status"].values[:, 0] == 1
        status = [STATUS_CODES[c] if ok else "failed"
                  for c, ok in zip(ds["status"].values[:, 0], done, strict=True)]
        n_times = ds["n_times"].values[:, 0]
        times = [ds["times"].values[i, 0, :n_times[i]] for i in range(n)]
        covs = [ds["covs"].values[i, 0, :n_times[i]] for i in range(n)]
        paths = [covs[i] for i in range(n) if done[i]]
        colours = ([STATUS_COLOURS.get(s, "black") for s, ok in zip(status, done, strict=True) if ok]
                   if color_by == "status" else color_by)
        panels = ["cone", "slice"] if view == "both" else [view]
        if paths:
            fig = Figure(figsize=(5.5 * len(panels), 5.0), layout="constrained")
            for i, panel in enumerate(panels):
                if panel == "cone":
                    ax = fig.add_subplot(1, len(panels), i + 1, projection="3d")
                    plot.cone(paths, color_by=colours, rank_one_line=line, v_max=v_max, ax=ax)
                else:
                    ax = fig.add_subplot(1, len(panels), i + 1)
                    plot.cone_slice(paths, color_by=colours, rank_one_line=line, ax=ax)
            fig.suptitle(str(cfg.get("title", repr(att))))
            outdir.savefig(fig, "cone.png")
        arrays = {"covs0": covs0, "status": np.asarray(status, dtype=str),
                  "blowup_time": ds["blowup_time"].values[:, 0],
                  "limit": ds["limit"].values[:, 0]}
        for i in range(n):
            arrays[f"times_{i}"], arrays[f"covs_{i}"] = times[i], covs[i]
        save_npz(outdir.path("cone.npz"), arrays)
        summary = {"command": "cone", "attention": repr(att), "n": n,
                   "status_counts": {k: status.count(k) for k in dict.fromkeys(
                       [*STATUS_COLOURS, *status])},
                   "blowup_times": arrays["blowup_time"],
                   "t_final": ds["t_final"].values[:, 0].tolist(),
                   "study": _study_summary(ds),
                   "files": {"data": "cone.npz", "figure": "cone.png", "store": "results.zarr"}}
        if not paths:
            del summary["files"]["figure"]
        outdir.write_json("summary.json", summary)
    return summary


# =========================================================================== ranks
RANK_KINDS = ("softmax", "l2", "sinkhorn")
RANK_VALUES = ("identity", "random", "psd")


def run_ranks(cfg: dict, out: str | Path, *, progress: bool = True, force: bool = False,
              resume: bool = False, scheduler: Any = None,
              scheduler_file: str | Path | None = None, workers: int | None = None) -> dict:
    """Rank-histogram sweep (table ``ranks``); writes ``ranks.npz``, ``summary.json`` and
    ``ranks.png`` (:func:`transformer_pde.paper.rank_figure`: one panel per (kind, value),
    bars grouped by dimension).

    A study of the sweep engine (:mod:`transformer_pde.sweep`) over (kind, value, d, draw),
    one cell per draw (:class:`~transformer_pde.sweep.RankSweepCell`: the numbers of
    :func:`transformer_pde.paper.rank_sweep` with the same options; the draws of a task that
    share (kind, value, d) are solved together), run on an embedded Dask cluster
    (``workers`` processes), an existing one (``scheduler`` address or ``scheduler_file``)
    or in this process (``scheduler="serial"``), written to ``results.zarr`` as cells
    finish (``resume`` completes it).  A draw whose computation raised is recorded as
    failed (rank -1, status ``failed``) and the study goes on."""
    from ..paper import RankSweep, rank_figure, rank_sweep, rank_sweep_trials  # noqa: PLC0415
    from ..sweep import STATUS_CODES, Grid, RankSweepCell, Study  # noqa: PLC0415

    sections(cfg, ("ranks", "title"))
    spec = typed_parameters(rank_sweep, exclude=("kind", "d", "value"))
    sec = Table(cfg.get("ranks"), "ranks", ("kinds", "dims", "values", *spec))
    kinds = sec.list_of("kinds", ["softmax", "l2"], RANK_KINDS)
    values = sec.list_of("values", ["identity", "random"], RANK_VALUES)
    dims = sec.raw("dims", [3, 4, 5])
    if (not isinstance(dims, list) or not dims
            or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= 64
                   for x in dims)):
        raise ConfigError(f"{sec.key('dims')}: expected a non-empty list of integers in "
                          f"[1, 64], got {dims!r}")
    # the keywords of transformer_pde.paper.rank_sweep, with its defaults
    opts = read_options(sec, spec)
    for k, v in opts.items():
        if isinstance(v, float) and v <= 0:
            raise ConfigError(f"{sec.key(k)}: expected a finite number > 0, got {v!r}")
    if sec.has("draws"):
        sec.integer("draws", minimum=1, maximum=10**6)
    if opts.get("rtol", 0.5) >= 1:
        raise ConfigError(f"{sec.key('rtol')}: expected a number in (0, 1), got {opts['rtol']}")
    full = {k: opts.get(k, default) for k, (_, default) in spec.items()}
    rtol, draws, dist = full["rtol"], int(full["draws"]), full["distribution"]
    # distribution = "paper": the paper's study (K = -Q of rank floor(d/2), V = I or W^T W,
    # converged runs only, eigenvalues above `threshold`); see transformer_pde.paper
    allowed = ("identity", "psd") if dist == "paper" else ("identity", "random")
    if any(v not in allowed for v in values):
        raise ConfigError(f"{sec.key('values')}: with distribution = {dist!r} the values are "
                          f"{', '.join(map(repr, allowed))}, got {values!r}")
    if dist == "paper" and any(d < 2 for d in dims):
        raise ConfigError(f"{sec.key('dims')}: the paper's study needs d >= 2, got {dims!r}")
    for k in kinds:  # the library's argument checks, before any cell runs (no draw solved)
        for v in values:
            for d in dims:
                library_call("ranks", rank_sweep_trials, k, d, [], value=v, names=opts,
                             **full)
    cell = RankSweepCell(**full)
    grid = Grid({"kind": kinds, "value": values, "d": dims, "trial": list(range(draws))},
                draws=1, seed=int(full["seed"]))
    study = Study(grid, cell, name="ranks")
    ds, outdir = _run_study(study, out, cfg, force=force, resume=resume, scheduler=scheduler,
                            scheduler_file=scheduler_file, workers=workers, progress=progress)
    with outdir:
        sweeps = []
        for i, k in enumerate(kinds):
            for j, v in enumerate(values):
                for m, d in enumerate(dims):
                    done = ds["cell_status"].values[i, j, m, :, 0] == 1
                    ranks = np.where(done, ds["rank"].values[i, j, m, :, 0], -1).astype(int)
                    status = np.array([STATUS_CODES[c] if ok else "failed" for c, ok in
                                       zip(ds["status"].values[i, j, m, :, 0], done, strict=True)])
                    sweeps.append(RankSweep(k, int(d), v, ranks, status,
                                            float(full["threshold"] if dist == "paper"
                                                  else rtol),
                                            float(full["blowup_threshold"]),
                                            float(full["t_max"])))
        fig = rank_figure(sweeps, str(cfg.get(
            "title", f"numerical rank (rtol {rtol:g}) of the limit covariance, "
                     f"{draws} draws")))
        outdir.savefig(fig, "ranks.png")
        save_npz(outdir.path("ranks.npz"),
                 {**{f"{s.kind}_{s.value}_d{s.d}": s.ranks for s in sweeps},
                  **{f"{s.kind}_{s.value}_d{s.d}_status": s.status.astype(str) for s in sweeps}})
        summary = {"command": "ranks", "sweeps": [s.summary() for s in sweeps],
                   "study": _study_summary(ds),
                   "files": {"data": "ranks.npz", "figure": "ranks.png",
                             "store": "results.zarr"}}
        outdir.write_json("summary.json", summary)
    return summary


# =========================================================================== bench
def run_bench(*, quick: bool = True, out: str | Path | None = None,
              backends: Sequence[str] | None = None, force: bool = False) -> dict:
    r"""Small built-in timing: particle field evaluations and a Gaussian batch solve.

    Times (best of 3 repeats, after one warm-up call that also compiles numba kernels) one
    evaluation of the softmax field :math:`\Gamma_{\mu_N}` at all :math:`N` tokens in
    :math:`d = 16` on each available CPU backend, and one
    :func:`~transformer_pde.gaussian.solve_batch` of 256 random 4-D softmax Gaussians with
    :math:`V = I` (random :math:`Q, K`, most of which blow up in finite time).
    The project's full benchmark scripts are in ``benchmarks/``.
    """
    from .. import gaussian  # noqa: PLC0415
    from ..attention import Attention  # noqa: PLC0415
    from ..backends import available_backends  # noqa: PLC0415
    from ..fields import FieldEvaluator  # noqa: PLC0415

    outdir = OutputDir(out, force=force) if out is not None else None
    try:
        rng = np.random.default_rng(0)
        d = 16
        sizes = (256, 1024) if quick else (256, 1024, 4096, 16384)
        att = Attention("softmax", rng.normal(size=(d, d)) / d,
                        rng.normal(size=(d, d)) / math.sqrt(d), np.eye(d))
        rows = []
        wanted = ("numpy", "numba") if backends is None else tuple(backends)
        for be in [b for b in available_backends() if b in wanted]:
            for n in sizes:
                X = rng.normal(size=(n, d))
                ev = FieldEvaluator(att, n, backend=be)
                ev(0.0, ev.be.asarray(X, np.float64))  # warm-up (JIT compilation for numba)
                best = math.inf
                for _ in range(3):
                    t0 = time.perf_counter()
                    ev(0.0, ev.be.asarray(X, np.float64))
                    best = min(best, time.perf_counter() - t0)
                rows.append({"task": "softmax field", "backend": be, "N": n, "d": d,
                             "seconds": best})
        B, dg = 256, 4
        atts = [Attention("softmax", rng.normal(size=(dg, dg)) / 2, rng.normal(size=(dg, dg)),
                          np.eye(dg)) for _ in range(B)]
        F = rng.normal(size=(B, dg, dg))
        t0 = time.perf_counter()
        res = gaussian.solve_batch(atts, np.zeros((B, dg)), F @ np.swapaxes(F, -1, -2) / dg,
                                   t_max=10.0, blowup_threshold=1e3, rtol=1e-8, atol=1e-10)
        rows.append({"task": "gaussian solve_batch", "backend": "numpy", "N": B, "d": dg,
                     "seconds": time.perf_counter() - t0, "status_counts": res.counts()})
        result = {"command": "bench", "quick": quick, "machine": platform.platform(),
                  "python": platform.python_version(), "cpu_count": os.cpu_count(),
                  "rows": rows}
        if outdir is not None:
            outdir.write_json("bench.json", result)
            outdir.commit()
    finally:
        if outdir is not None:
            outdir.discard()
    return result


def benchmark_scripts(root: str | Path | None = None) -> list[Path]:
    """The project's benchmark scripts (``benchmarks/*.py`` of a source checkout: ``root``,
    or the directory above the installed package)."""
    base = Path(root) if root is not None else Path(__file__).resolve().parents[2]
    return sorted(p for p in (base / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def run_benchmark_scripts(scripts: Sequence[Path], *, full: bool = False) -> list[tuple[Path, int]]:
    """Run each benchmark script (``--quick`` unless ``full``); returns (script, status)
    pairs."""
    results = []
    for script in scripts:
        cmd = [sys.executable, str(script)] + ([] if full else ["--quick"])
        sys.stdout.write(f"$ {' '.join(cmd)}\n")
        sys.stdout.flush()
        results.append((script, subprocess.run(cmd, check=False).returncode))
    return results
