r"""The single-run commands ``demo``, ``simulate`` and ``gaussian``: each reads its
options, calls the library and writes its files through an
:class:`~transformer_pde.cli.output.OutputDir` (checked before the run; nothing is left
behind when the run fails).

Each ``run_*`` function is usable from Python and returns the command's summary
dictionary (the content of its ``summary.json``); each ``cmd_*`` function is the
command-line handler that calls it and reports on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import particles
from ..attention import Attention
from ..backends import DEFAULT_BACKEND
from ..errors import ArgumentError, CheckpointError, ConfigError
from ..integrate import check_step_budget, planned_saves, preflight
from ..integrate.checkpoint import check_path
from ..integrate.loop import Monitor
from ..io.jsonfmt import dumps
from ..io.labelled import gaussian_dataset
from ..particles import FieldOptions, SaveAt
from ..particles.simulation import RunSpec
from .builders import build_attention, build_simulate, build_tokens, covariance
from .config import (Table, check_memory, library_call, load_config, read_options, sections,
                     typed_parameters)
from .exits import Signals, UsageError, status_exit
from .output import OutputDir, data_format as output_format

__all__ = [
    "CLUSTER_TOL",
    "OUTPUT_KEYS",
    "RANK_RTOL",
    "cmd_demo",
    "cmd_gaussian",
    "cmd_simulate",
    "gaussian_options",
    "run_demo",
    "run_gaussian",
    "run_simulate",
]

logger = logging.getLogger("transformer_pde.cli")

#: single-linkage scale of the cluster counts: a fraction of the cloud radius (largest
#: distance to the mean), as in :func:`transformer_pde.diagnostics.clusters`
CLUSTER_TOL = 0.02
#: relative tolerance of the covariance numerical rank reported by the CLI
RANK_RTOL = 1e-6


# =========================================================================== helpers
def _cloud_rank(X: np.ndarray) -> int:
    """Numerical rank (relative tolerance :data:`RANK_RTOL`) of the covariance of a cloud."""
    # deferred: SciPy takes seconds to import; only this path needs it
    from ..diagnostics import numerical_rank  # noqa: PLC0415

    # the rank is scale-invariant: scaled to entries <= 1 first, so that a cloud of huge
    # finite tokens (|x| ~ 1e300) does not overflow the covariance's products
    scale = float(np.max(np.abs(X))) if X.size else 0.0
    Y = X / scale if np.isfinite(scale) and scale > 0 else X
    Y = Y - Y.mean(axis=0)
    return numerical_rank(Y.T @ Y / X.shape[0], RANK_RTOL)


def _clusters(X: np.ndarray, tol: float) -> tuple[int, np.ndarray]:
    """Number of clusters and labels (single linkage at ``tol`` times the cloud radius)."""
    # deferred: SciPy takes seconds to import; only this path needs it
    from ..diagnostics import clusters  # noqa: PLC0415

    res = clusters(X, tol=tol)
    return res.n_clusters, res.labels


def _particles_figure(Z: np.ndarray, labels: np.ndarray, title: str) -> Any:
    """:func:`transformer_pde.plot.particles` on a figure pyplot does not manage (the CLI
    only saves it)."""
    # deferred: matplotlib takes seconds to import; only this path needs it
    from matplotlib.figure import Figure  # noqa: PLC0415

    # deferred: matplotlib takes seconds to import; only this path needs it
    from .. import plot  # noqa: PLC0415

    ax = Figure(figsize=(5.5, 5.0), layout="constrained").add_subplot()
    return plot.particles(Z, labels=labels, title=title, ax=ax).figure


def _depth_figure(times: np.ndarray, Z: np.ndarray, labels: np.ndarray, title: str) -> Any:
    """Tokens of a 1-D run against depth (one line per token, coloured by final cluster)."""
    # deferred: matplotlib takes seconds to import; only this path needs it
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
             t_max: float = 6.0, dt: float = 0.05, backend: str = DEFAULT_BACKEND,
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
    # deferred: matplotlib takes seconds to import; only this path needs it
    from matplotlib.figure import Figure  # noqa: PLC0415

    # deferred: matplotlib takes seconds to import; only this path needs it
    from .. import plot  # noqa: PLC0415

    n_saved = planned_saves(t_max, dt, SaveAt())
    check_memory("--t-max", 8.0 * 2 * n_saved * n * 2,
                 f"saving {n_saved} states of {n} x 2 tokens (t_max / dt = {t_max / dt:.3g})")
    with OutputDir(out, force=force) as outdir:
        rng = np.random.default_rng(seed)
        X0 = rng.normal(size=(n, 2))
        att = Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
        t0 = time.perf_counter()
        traj = particles.simulate(att, X0, t_max=t_max, dt=dt, solver="rk4",
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
    ``field``, ``limits``, ``block``, ``noise``, ``output``); writes ``trajectory.npz``,
    ``summary.json`` and ``particles.png``.

    With ``masked = true`` (or ``alibi``) the tokens get positions ``linspace(0, 1, N)``
    in input order (token ``i`` attends to tokens ``j <= i``).  A run interrupted by Ctrl-C (status
    ``interrupted``) writes the states computed so far, without figures.  ``checkpoint``,
    ``checkpoint_every``, ``resume`` and ``report_every`` are those of
    :class:`~transformer_pde.Monitor` (progress lines every ``report_every`` seconds): the
    state of the run is written to ``checkpoint`` every ``checkpoint_every`` seconds, and
    ``resume`` continues from it (bit for bit the uninterrupted run); a resumed run may
    replace the files of the interrupted run it continues in ``out``.
    """
    # deferred: matplotlib takes seconds to import; only this path needs it
    from .. import plot  # noqa: PLC0415

    sections(cfg, ("attention", "tokens", "run", "field", "limits", "block", "noise",
                   "output", "title"))
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
    positions = np.linspace(0.0, 1.0, X0.shape[0]) \
        if att.masked or att.alibi is not None else None
    with OutputDir(out, force=force,
                   replaceable=_interrupted_run if resume else None) as outdir:
        logger.info("simulate: %d tokens in d = %d, t in [0, %g]; Ctrl-C stops the run and "
                    "keeps the states computed so far", X0.shape[0], att.d, opts["t_max"])
        t0 = time.perf_counter()
        try:
            traj = particles.simulate(att, X0, positions=positions, monitor=monitor, **opts)
        except CheckpointError as exc:  # the library's own check of the path, before step 1
            raise UsageError(f"--checkpoint {checkpoint}: {exc}") from None
        elapsed = time.perf_counter() - t0
        files = {"trajectory": traj.save(outdir.path("trajectory.npz")).name}
        interrupted = str(traj.status) == "interrupted"
        Z = plot.rescaled_states(traj, "value" if rescale_opt == "value" else None)
        k, labels = _clusters(Z[-1], rel)
        title = str(cfg.get("title", f"{att.kind} attention"))
        if want_figure and not interrupted:
            fig = (_particles_figure(Z, labels, title) if att.d >= 2
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
    if str(checkpoint).strip() == "":
        raise UsageError("--checkpoint: expected the path of a file, got an empty string")
    try:
        check_path(checkpoint, resume=False)
    except CheckpointError as exc:
        raise UsageError(f"--checkpoint {checkpoint}: {exc}") from None


#: the key of a configuration named by a word of :meth:`RunSpec.of`'s messages, first match
_SPEC_KEYS = (("SaveAt", "run.save_at"), ("t_max", "run.t_max"), ("dt", "run.dt"),
              ("X0", "tokens"), ("block", "block"), ("field", "field"), ("limits", "limits"))


def _preflight(att: Any, opts: dict, X0: np.ndarray) -> None:
    """Refuse, naming the key, a run the library would refuse: the library's own checks
    (:func:`~transformer_pde.integrate.check_step_budget` and
    :func:`~transformer_pde.integrate.preflight` on the run's arguments as
    :func:`~transformer_pde.simulate` reads them,
    :meth:`~transformer_pde.particles.simulation.RunSpec.of`), which ``simulate`` makes
    before its first step: the command line refuses exactly the runs the library refuses
    (``t_max = 0.07, dt = 0.01`` is 7 steps)."""
    try:
        spec = RunSpec.of(att, X0, opts["t_max"], opts["dt"], opts["saveat"], opts["block"],
                          opts["field"], opts["limits"], None)
    except (TypeError, ValueError) as exc:  # the library's checks of the run's arguments
        key = next((k for word, k in _SPEC_KEYS if word in str(exc)), "run")
        raise ConfigError(f"{key}: {exc}") from None
    adaptive = bool(opts["solver"].adaptive)
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
def gaussian_options(name: str, allowed: tuple[str, ...], data: Any,
                     t_max: float) -> tuple[Table, float, dict]:
    """The table ``name`` with its own keys ``allowed``, ``t_max`` (default ``t_max``) and
    the keyword options of :func:`transformer_pde.gaussian.solve` (``rtol``, ``atol``,
    ``blowup_threshold``, ``converge_tol``, ``convergence``; the library's defaults)."""
    # deferred: SciPy takes seconds to import; only this path needs it
    from .. import gaussian  # noqa: PLC0415

    spec = typed_parameters(gaussian.solve, exclude=("att", "mean0", "cov0", "t_max", "t_eval"))
    sec = Table(data, name, (*allowed, "t_max", *spec))
    opts = read_options(sec, spec)
    for k, v in opts.items():
        if isinstance(v, float) and v <= 0:
            raise ConfigError(f"{sec.key(k)}: expected a finite number > 0, got {v!r}")
    return sec, sec.number("t_max", t_max, positive=True), opts


def run_gaussian(cfg: dict, out: str | Path, *, force: bool = False,
                 data_format: str | None = None) -> dict:
    r"""Gaussian moment ODE from a configuration (tables ``attention`` and ``gaussian``).

    Writes ``gaussian.nc`` (the labelled :meth:`~transformer_pde.gaussian.GaussianTrajectory.to_xarray`
    Dataset: ``means``, ``covs``, ``limit`` over ``time``, with the status, blow-up time,
    message, attention and configuration as attributes; ``data_format = "zarr"``:
    ``gaussian.zarr``; ``"npz"``: ``gaussian.npz`` with the arrays ``times``, ``means``,
    ``covs``, ``limit``, ``status``, ``blowup_time``, ``t_final``), ``summary.json``
    (status, blow-up time, ranks of the limit) and ``gaussian.png`` (eigenvalues of
    :math:`\Sigma(t)`).
    """
    # deferred: matplotlib takes seconds to import; only this path needs it
    from matplotlib.figure import Figure  # noqa: PLC0415

    # deferred: SciPy takes seconds to import; only this path needs it
    from .. import gaussian  # noqa: PLC0415
    from ..diagnostics import effective_rank, numerical_rank  # noqa: PLC0415

    sections(cfg, ("attention", "gaussian", "title"))
    att = build_attention(cfg.get("attention"))
    d = att.d
    sec, t_max, opts = gaussian_options("gaussian", ("mean", "cov", "n_eval"),
                                        cfg.get("gaussian"), 10.0)
    mean = sec.vector("mean", d, [0.0] * d)
    cov = covariance(sec.raw("cov", "identity"), sec.key("cov"), d)
    n_eval = sec.integer("n_eval", 200, minimum=2)
    check_memory(sec.key("n_eval"), 8.0 * 4 * n_eval * d * (d + 1),
                 f"{n_eval} saved means and covariances")
    fmt = output_format(data_format)
    with OutputDir(out, force=force) as outdir:
        traj = library_call("gaussian", gaussian.solve, att, mean, cov, t_max=t_max,
                            t_eval=np.linspace(0.0, t_max, n_eval), names=opts, strict=False,
                            aliases={"mean0": "mean", "cov0": "cov"}, **opts)
        data = outdir.write_data(
            "gaussian", fmt, lambda: _gaussian_dataset(traj, att, cfg),
            lambda: {"times": traj.times, "means": traj.means, "covs": traj.covs,
                     "limit": traj.limit, "status": np.asarray(str(traj.status)),
                     "blowup_time": np.asarray(traj.blowup_time),
                     "t_final": np.asarray(traj.t_final)})
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
                   "files": {"data": data, "figure": "gaussian.png"}}
        outdir.write_json("summary.json", summary)
    return summary


def _gaussian_dataset(traj: Any, att: Any, cfg: dict) -> Any:
    """The labelled Dataset of a ``gaussian`` run: the trajectory's own
    (:func:`~transformer_pde.io.labelled.gaussian_dataset`) with the command, the attention
    and the configuration (strict JSON) as attributes."""
    ds = gaussian_dataset(traj)
    ds.attrs.update({"command": "gaussian", "attention_repr": repr(att),
                     "config": dumps({k: v for k, v in cfg.items() if k != "__dir__"},
                                     sort_keys=True, describe=True, strict=True)})
    return ds


# =========================================================================== handlers
def cmd_demo(args: argparse.Namespace) -> int:
    """``transformer-pde demo``: :func:`run_demo`, its text on stdout; the exit status of
    the run's status."""
    s = run_demo(args.out, n=args.n, seed=args.seed, t_max=args.t_max,
                 backend=args.backend, gif=args.gif, force=args.force)
    if s["status"] == "interrupted":
        sys.stderr.write(f"transformer-pde demo: {Signals.word()}; the states computed so far "
                         f"are in {Path(args.out) / 'trajectory.npz'} (status interrupted)\n")
    else:
        sys.stdout.write(s["text"])
    return status_exit(s["status"])


def cmd_simulate(args: argparse.Namespace) -> int:
    """``transformer-pde simulate CONFIG``: :func:`run_simulate`, one line on stdout (on
    stderr when interrupted); the exit status of the run's status."""
    if not args.quiet:  # simulate reports progress (a tqdm bar, or INFO lines)
        logging.getLogger("transformer_pde").setLevel(logging.INFO)
    s = run_simulate(load_config(args.config), args.out, progress=not args.quiet,
                     force=args.force, checkpoint=args.checkpoint,
                     checkpoint_every=args.checkpoint_every, resume=args.resume,
                     report_every=args.report_every)
    files = ", ".join(s["files"].values())
    if s["status"] == "interrupted":
        sys.stderr.write(f"transformer-pde simulate: {Signals.word()} at t = {s['t_final']:.6g}; "
                         f"the states computed so far are in {Path(args.out) / 'trajectory.npz'} "
                         "(status interrupted)\n")
    else:
        sys.stdout.write(f"simulate: {s['status']} ({s['message']}); {s['clusters_final']} "
                         f"clusters, covariance rank {s['covariance_rank']}; files in "
                         f"{args.out}: {files}, summary.json\n")
    return status_exit(s["status"])


def cmd_gaussian(args: argparse.Namespace) -> int:
    """``transformer-pde gaussian CONFIG``: :func:`run_gaussian`, one line on stdout; the
    exit status of the run's status."""
    s = run_gaussian(load_config(args.config), args.out, force=args.force,
                     data_format=getattr(args, "format", None))
    sys.stdout.write(f"gaussian: {s['status']} ({s['message']}); limit rank "
                     f"{s['limit_numerical_rank']}; files in {args.out}: {s['files']['data']}, "
                     "gaussian.png, summary.json\n")
    return status_exit(s["status"])
