"""``transformer-pde``: the entry point, which turns every failure into one line and an
exit status.

Without ``-v`` the command shows the package's warnings (one line each) and counts the
rest -- Dask's log records, other libraries' warnings, also those of the cells run by Dask
workers -- in one summary line at the end (:class:`~transformer_pde.cli.quiet.Quiet`);
``-v`` shows them all in full.  The command line never shows a Python traceback: every failure ends with one line on
stderr, ``transformer-pde COMMAND: <what went wrong>``, and one of the exit statuses of
:class:`~transformer_pde.cli.exits.ExitCode`.  An unexpected internal error (a bug) writes
its traceback to a file and names the file (``--debug`` shows it instead).  The parser is
:func:`~transformer_pde.cli.parser.build_parser`; each command's handler lives with the
command (:mod:`~transformer_pde.cli.runs`, :mod:`~transformer_pde.cli.studies`,
:mod:`~transformer_pde.cli.bench`, :mod:`~transformer_pde.cli.pretrained`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm.contrib.logging import logging_redirect_tqdm

from ..errors import ConfigError, EarlyStopWarning, TransformerPDEError
from .exits import ExitCode, Signals, UsageError, sigterm_as_interrupt
from .output import OutputError
from .parser import build_parser
from .quiet import Quiet

__all__ = ["main"]


# --------------------------------------------------------------------------- errors
def _flat(text: Any) -> str:
    """A message on one line."""
    return " ".join(str(text).split())


def _is_backend_missing(exc: BaseException) -> bool:
    """Whether ``exc`` is a :class:`~transformer_pde.backends.BackendNotAvailable` (matched
    by name: the backends are not imported for it)."""
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

    # log records go through tqdm.write so they never break a progress bar's line; only where
    # they go to the console anyway (an application that captured logging keeps its handlers)
    console = any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
                  for h in logging.root.handlers)
    with sigterm_as_interrupt():
        code = _run(args, fail, Quiet(prog, bool(args.verbose)), console)
    if code == ExitCode.INTERRUPTED and Signals.terminated:
        return int(ExitCode.TERMINATED)
    return code


def _run(args: argparse.Namespace, fail: Callable[[ExitCode, str], int], quiet: Quiet,
         console: bool) -> int:
    """Run the command; every exception becomes a message and an :class:`ExitCode`."""
    try:
        try:
            with warnings.catch_warnings(), quiet, (logging_redirect_tqdm() if console
                                                    else contextlib.nullcontext()):
                # a warning of the package is one line, the others are counted (Quiet);
                # runs that end without an answer (EarlyStopWarning) are reported by the
                # command's status line
                warnings.showwarning = quiet.show_warning
                warnings.simplefilter("ignore", EarlyStopWarning)
                return int(args.func(args))
        finally:
            line = quiet.summary()
            if line is not None:  # before the command's last line (its result or error)
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
    except KeyboardInterrupt:
        return fail(ExitCode.INTERRUPTED, f"{Signals.word()}; nothing was written")
    except ConfigError as exc:
        return fail(ExitCode.USAGE, f"configuration error: {exc}")
    except UsageError as exc:
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
