"""The study commands ``cone``, ``ranks`` and ``sweep``: parameter studies on the sweep
engine (:mod:`transformer_pde.sweep`), written to ``OUT/results.zarr`` as cells finish.

``cone`` and ``ranks`` build a :class:`~transformer_pde.sweep.Study` from their
configuration tables, run it (an embedded Dask cluster, an existing one, or
``scheduler="serial"`` in this process) and draw its figure from the store; ``sweep`` runs
the study a TOML file describes (:func:`transformer_pde.sweep.config.run_config`).  A
cell that raises is recorded as failed and the study goes on (exit status 1); Ctrl-C
keeps the finished cells for ``--resume`` (:class:`StudyInterrupted`, exit status 130).
Each ``run_*`` function is usable from Python and returns the command's summary
dictionary; each ``cmd_*`` function is the command-line handler.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, TransformerPDEError
from ..io.jsonfmt import dumps
from .builders import build_attention
from .config import (Table, check_memory, library_call, load_config, read_options, sections,
                     typed_parameters)
from .exits import ExitCode, RunError, Signals, UsageError
from .output import OutputDir, OutputError, check_out, data_format as output_format
from .runs import gaussian_options

__all__ = [
    "CONE_KEYS",
    "RANK_KINDS",
    "RANK_VALUES",
    "StudyInterrupted",
    "cmd_cone",
    "cmd_ranks",
    "cmd_sweep",
    "run_cone",
    "run_ranks",
]

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
    # deferred: the study engine (Dask, Zarr) is imported by the study commands only
    from ..sweep import StoreError, open_results  # noqa: PLC0415

    try:
        return int((open_results(store)["cell_status"].values != 0).sum())
    except StoreError:
        return 0


def _study_summary(ds: Any) -> dict:
    # deferred: the study engine (Dask, Zarr) is imported by the study commands only
    from ..sweep import summary  # noqa: PLC0415

    return {"store": "results.zarr", **summary(ds)}


# =========================================================================== cone
CONE_KEYS = ("n", "init", "radius", "trace", "seed", "n_eval", "view", "color_by",
             "rank_one_line", "v_max")


def run_cone(cfg: dict, out: str | Path, *, force: bool = False, resume: bool = False,
             scheduler: Any = None, scheduler_file: str | Path | None = None,
             workers: int | None = None, progress: bool = True,
             data_format: str | None = None) -> dict:
    """Phase plot of many 2-D covariance trajectories (tables ``attention`` and ``cone``).

    A study of the sweep engine (:mod:`transformer_pde.sweep`): one cell per initial
    covariance (:class:`~transformer_pde.sweep.ConePathCell`, the numbers of
    :func:`transformer_pde.paper.solve_paths`), run on an embedded Dask cluster (``workers``
    processes), an existing one (``scheduler`` address or ``scheduler_file``) or in this
    process (``scheduler="serial"``), written to ``results.zarr`` as cells finish
    (``resume`` completes it).  Writes ``cone.nc`` (``data_format``: ``"zarr"`` for
    ``cone.zarr``; a labelled Dataset over ``run``: ``covs0 (run, row, col)``,
    ``times (run, time)`` and ``covs (run, time, row, col)`` (NaN after ``n_times``),
    ``status`` (codes with CF ``flag_meanings``; ``failed`` for a cell that raised),
    ``blowup_time``, ``t_final``, ``limit``; the attention and configuration as
    attributes), or on request ``cone.npz`` (``covs0``; ``times_<i>``, ``covs_<i>`` per run,
    each up to its own end; ``status``, ``blowup_time``, ``limit``), and ``summary.json``
    and ``cone.png``."""
    # deferred: matplotlib takes seconds to import; only this path needs it
    from matplotlib.figure import Figure  # noqa: PLC0415

    # deferred: matplotlib and SciPy take seconds to import; only this path needs it
    from .. import gaussian, plot  # noqa: PLC0415
    from ..gaussian.affine import check_attention  # noqa: PLC0415
    from ..gaussian.system import check_solver_args  # noqa: PLC0415
    from ..paper import STATUS_COLOURS, slice_covariances  # noqa: PLC0415
    from ..sweep import STATUS_CODES, ConePathCell, Grid, Study  # noqa: PLC0415

    sections(cfg, ("attention", "cone", "title"))
    att = build_attention(cfg.get("attention"))
    if att.d != 2:
        raise ConfigError(f"attention.d: the cone phase plot needs d = 2, got {att.d}")
    sec, t_max, opts = gaussian_options("cone", CONE_KEYS, cfg.get("cone"), 20.0)
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
    fmt = output_format(data_format)
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
        data = outdir.write_data("cone", fmt,
                                 lambda: _cone_dataset(ds, covs0, status, repr(att), cfg),
                                 lambda: arrays)
        summary = {"command": "cone", "attention": repr(att), "n": n,
                   "status_counts": {k: status.count(k) for k in dict.fromkeys(
                       [*STATUS_COLOURS, *status])},
                   "blowup_times": arrays["blowup_time"],
                   "t_final": ds["t_final"].values[:, 0].tolist(),
                   "study": _study_summary(ds),
                   "files": {"data": data, "figure": "cone.png", "store": "results.zarr"}}
        if not paths:
            del summary["files"]["figure"]
        outdir.write_json("summary.json", summary)
    return summary


def _labelled(ds: Any, grid_dims: tuple[str, ...], status: np.ndarray, attrs: dict) -> Any:
    """The data file of a study command: the study's outputs without the ``draw`` axis
    (one draw per grid point) and ``cell_status``, ``status`` as Status codes (a cell that
    raised: ``failed``), ``attrs`` plus the configuration as attributes."""
    # deferred: the study engine (Dask, Zarr) is imported by the study commands only
    from ..sweep import STATUS_CODES  # noqa: PLC0415

    out = ds.isel(draw=0, drop=True).drop_vars("cell_status")
    codes = np.array([STATUS_CODES.index(str(x)) for x in status.reshape(-1)], dtype=np.int8)
    out["status"] = (grid_dims, codes.reshape(status.shape))
    out.attrs = {k: v for k, v in out.attrs.items()
                 if k in ("name", "config", "versions", "failures")}
    out.attrs.update(attrs)
    return out


def _cone_dataset(ds: Any, covs0: np.ndarray, status: list[str], attention: str,
                  cfg: dict) -> Any:
    """The labelled Dataset of ``cone`` (see :func:`run_cone`)."""
    out = _labelled(ds, ("run",), np.asarray(status), {
        "transformer_pde": "cone-study", "command": "cone", "attention_repr": attention,
        "config": dumps({k: v for k, v in cfg.items() if k != "__dir__"}, sort_keys=True,
                        describe=True, strict=True)})
    dims = ds["limit"].dims[2:]
    out["covs0"] = (("run", *dims), np.asarray(covs0))
    out["covs0"].attrs["long_name"] = "initial covariance matrix"
    return out


# =========================================================================== ranks
RANK_KINDS = ("softmax", "l2", "sinkhorn")
RANK_VALUES = ("identity", "random", "psd")


def run_ranks(cfg: dict, out: str | Path, *, progress: bool = True, force: bool = False,
              resume: bool = False, scheduler: Any = None,
              scheduler_file: str | Path | None = None, workers: int | None = None,
              data_format: str | None = None) -> dict:
    """Rank-histogram sweep (table ``ranks``); writes ``ranks.nc`` (``data_format``:
    ``"zarr"`` for ``ranks.zarr``; ``rank (kind, value, d, trial)``, -1 for a draw without
    a rank, and ``status`` (codes with CF ``flag_meanings``), the options as attributes) or
    on request ``ranks.npz`` (``<kind>_<value>_d<d>`` and ``..._status`` per sweep),
    ``summary.json`` and ``ranks.png`` (:func:`transformer_pde.paper.rank_figure`: one
    panel per (kind, value), bars grouped by dimension).

    A study of the sweep engine (:mod:`transformer_pde.sweep`) over (kind, value, d, draw),
    one cell per draw (:class:`~transformer_pde.sweep.RankSweepCell`: the numbers of
    :func:`transformer_pde.paper.rank_sweep` with the same options; the draws of a task that
    share (kind, value, d) are solved together), run on an embedded Dask cluster
    (``workers`` processes), an existing one (``scheduler`` address or ``scheduler_file``)
    or in this process (``scheduler="serial"``), written to ``results.zarr`` as cells
    finish (``resume`` completes it).  A draw whose computation raised is recorded as
    failed (rank -1, status ``failed``) and the study goes on."""
    # deferred: the study engine (Dask, Zarr) is imported by the study commands only
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
    fmt = output_format(data_format)
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
        from matplotlib.figure import Figure  # noqa: PLC0415 (a figure pyplot does not keep)

        fig = rank_figure(sweeps, str(cfg.get(
            "title", f"numerical rank (rtol {rtol:g}) of the limit covariance, "
                     f"{draws} draws")),
                          figsize=(4.2 * len(values), 3.2 * len(kinds)),
                          fig=Figure(layout="constrained"))
        outdir.savefig(fig, "ranks.png")
        shape = (len(kinds), len(values), len(dims), draws)
        data = outdir.write_data(
            "ranks", fmt,
            lambda: _ranks_dataset(ds, sweeps, shape, full, cfg),
            lambda: {**{f"{s.kind}_{s.value}_d{s.d}": s.ranks for s in sweeps},
                     **{f"{s.kind}_{s.value}_d{s.d}_status": s.status.astype(str)
                        for s in sweeps}})
        summary = {"command": "ranks", "sweeps": [s.summary() for s in sweeps],
                   "study": _study_summary(ds),
                   "files": {"data": data, "figure": "ranks.png",
                             "store": "results.zarr"}}
        outdir.write_json("summary.json", summary)
    return summary


def _ranks_dataset(ds: Any, sweeps: list, shape: tuple, options: dict, cfg: dict) -> Any:
    """The labelled Dataset of ``ranks`` (see :func:`run_ranks`)."""
    status = np.stack([s.status for s in sweeps]).reshape(shape)
    out = _labelled(ds, ("kind", "value", "d", "trial"), status, {
        "transformer_pde": "rank-study", "command": "ranks",
        "options": dumps(options, sort_keys=True, describe=True, strict=True),
        "config": dumps({k: v for k, v in cfg.items() if k != "__dir__"}, sort_keys=True,
                        describe=True, strict=True)})
    out["rank"] = (out["rank"].dims, np.stack([s.ranks for s in sweeps]).reshape(shape))
    out["rank"].attrs.update({"long_name": "numerical rank of the limit covariance (-1: none)",
                              "units": "1"})
    return out


# =========================================================================== handlers
def _check_scheduler(args: argparse.Namespace) -> None:
    """Refuse a malformed ``--scheduler`` address or ``--scheduler-file`` (exit status 2)
    before anything is computed or connected to."""
    if args.scheduler is None and args.scheduler_file is None:
        return
    # deferred: the study engine imports dask, seconds at start-up for commands without it
    from ..sweep.run import SchedulerArgumentError, check_scheduler  # noqa: PLC0415

    try:
        check_scheduler(args.scheduler, args.scheduler_file,
                        names=("--scheduler", "--scheduler-file"))
    except SchedulerArgumentError as exc:
        raise UsageError(str(exc)) from None


@contextlib.contextmanager
def _scheduler_errors(args: argparse.Namespace) -> Any:
    """A scheduler that cannot be reached: one line naming the option (exit status 4)."""
    if args.scheduler is None and args.scheduler_file is None:
        yield
        return
    from ..sweep.run import SchedulerError  # noqa: PLC0415  (dask is imported only here)

    try:
        yield
    except SchedulerError as exc:
        option = (f"--scheduler {args.scheduler}" if args.scheduler is not None
                  else f"--scheduler-file {args.scheduler_file}")
        raise RunError(f"{option}: {exc}") from None


def _study_options(args: argparse.Namespace) -> dict:
    """The sweep-engine options of ``ranks`` / ``cone`` (as for ``sweep``), checked."""
    _check_scheduler(args)
    return {"scheduler": args.scheduler, "scheduler_file": args.scheduler_file,
            "workers": args.workers, "resume": args.resume, "progress": not args.quiet,
            "force": args.force, "data_format": getattr(args, "format", None)}


def _study_end(args: argparse.Namespace, s: dict) -> int:
    """Report the cells that failed; exit status 1 when some did."""
    study = s["study"]
    for message, count in study["failures"].items():
        sys.stdout.write(f"  {count} cell(s) failed: {message}\n")
    if study["failed"]:
        sys.stdout.write(f"{study['failed']} of {study['cells']} cells failed; "
                         f"--resume retries them\n")
    return ExitCode.OK if study["done"] == study["cells"] else ExitCode.UNSUCCESSFUL


def _interrupted(args: argparse.Namespace, exc: StudyInterrupted) -> int:
    """Report a study stopped by Ctrl-C or SIGTERM (exit status 130)."""
    message = str(exc)
    if Signals.terminated:
        message = message.replace("interrupted", Signals.word(), 1)
    sys.stderr.write(f"transformer-pde {args.command}: {message}\n")
    return ExitCode.INTERRUPTED


def cmd_cone(args: argparse.Namespace) -> int:
    """``transformer-pde cone CONFIG``: :func:`run_cone`, one line on stdout; exit status 1
    when some cells failed, 130 when interrupted."""
    try:
        with _scheduler_errors(args):
            s = run_cone(load_config(args.config), args.out, **_study_options(args))
    except StudyInterrupted as exc:
        return _interrupted(args, exc)
    counts = ", ".join(f"{k} {v}" for k, v in s["status_counts"].items() if v)
    files = ", ".join([*s["files"].values(), "summary.json"])
    sys.stdout.write(f"cone: {s['n']} trajectories ({counts}); files in {args.out}: "
                     f"{files}\n")
    return _study_end(args, s)


def cmd_ranks(args: argparse.Namespace) -> int:
    """``transformer-pde ranks [CONFIG]``: :func:`run_ranks` (the options override the
    ``[ranks]`` table), one line per sweep on stdout; exit status 1 when some cells failed,
    130 when interrupted."""
    cfg = load_config(args.config) if args.config else {}
    table = dict(cfg.get("ranks", {}) or {})
    for key in ("kinds", "dims", "values", "draws", "seed"):
        if getattr(args, key) is not None:
            table[key] = getattr(args, key)
    try:
        with _scheduler_errors(args):
            s = run_ranks({**cfg, "ranks": table}, args.out, **_study_options(args))
    except StudyInterrupted as exc:
        return _interrupted(args, exc)
    for sw in s["sweeps"]:
        sys.stdout.write(f"{sw['kind']:>8s} V={sw['value']:<8s} d={sw['d']}: ranks "
                         f"0..{sw['d']} -> {sw['rank_counts']}\n")
    sys.stdout.write(f"files in {args.out}: ranks.png, {s['files']['data']}, results.zarr, "
                     "summary.json\n")
    return _study_end(args, s)


#: bytes a study's store holds for each cell at the least (its status and fingerprint), so
#: that a grid which cannot fit is refused before anything is allocated
_CELL_BYTES = 33


def _check_study_size(config: str) -> None:
    """Refuse up front, naming ``study.draws`` (exit status 2), a study whose cells cannot
    fit in this machine's memory (:func:`~.config.check_memory`)."""
    # deferred: the study engine (Dask, Zarr) is imported by the study commands only
    from ..sweep.config import load_study_config, study_from_config  # noqa: PLC0415

    n = study_from_config(load_study_config(config)).grid.n_cells
    check_memory("study.draws", float(_CELL_BYTES) * n,
                 f"the store of the study's {n} cells (study.axes x study.draws)")


def _make_out(out: str) -> list[Path]:
    """Check ``--out`` (:func:`~.output.check_out`, exit status 3) and create it when new;
    returns the directories created, parents first."""
    path = check_out(out).absolute()
    made = [q for q in reversed([path, *path.parents]) if not q.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_empty(made)
        raise OutputError(f"--out {out}: cannot create it: {exc.strerror or exc}") from None
    return made


def _remove_empty(made: list[Path]) -> None:
    """Remove the directories of :func:`_make_out` that are still empty (deepest first)."""
    for q in reversed(made):
        try:
            q.rmdir()
        except OSError:
            break


def cmd_sweep(args: argparse.Namespace) -> int:
    """``transformer-pde sweep CONFIG``: :func:`transformer_pde.sweep.config.run_config`,
    its summary on stdout; exit status 1 when some cells failed, 130 when interrupted."""
    from ..sweep.config import run_config  # noqa: PLC0415  (dask is imported only here)

    store = Path(args.out) / "results.zarr"
    _check_scheduler(args)
    _check_study_size(args.config)
    made = _make_out(args.out)
    try:
        try:
            with _scheduler_errors(args):
                s = run_config(args.config, args.out, scheduler=args.scheduler,
                               scheduler_file=args.scheduler_file, workers=args.workers,
                               resume=args.resume, progress=not args.quiet)
        except BaseException:
            _remove_empty(made)
            raise
    except KeyboardInterrupt:
        kept = (f"the cells finished so far are in {store}; rerun with --resume to complete it"
                if store.exists() else "nothing was written")
        sys.stderr.write(f"transformer-pde sweep: {Signals.word()}; {kept}\n")
        return ExitCode.INTERRUPTED
    sys.stdout.write(f"sweep {s['name']!r}: {s['done']} of {s['cells']} cells done, "
                     f"{s['failed']} failed; results in {s['store']}, summary in "
                     f"{Path(args.out) / 'summary.json'}\n")
    for message, count in s["failures"].items():
        sys.stdout.write(f"  {count} cell(s) failed: {message}\n")
    return ExitCode.OK if s["done"] == s["cells"] else ExitCode.UNSUCCESSFUL
