"""What ``transformer-pde`` shows on stderr: the package's own warnings, one line each, and
the rest -- Dask's log records, warnings of other libraries (a scipy ``RuntimeWarning:
overflow`` in a cell) -- counted and summed up in one line at the end.

Without ``-v``, :class:`Quiet` takes the log records of the loggers in
:data:`NOISY_LOGGERS` (Dask's scheduler, nannies and workers start, connect and close
with some thirty ``INFO`` records per study) off the console for the duration of the
command, and keeps the warnings that are not the package's
(:class:`~transformer_pde.errors.TransformerPDEWarning`) off it too; at the end
:meth:`Quiet.summary` gives one line counting what was not shown at level ``WARNING`` or
above.  With ``-v`` every record and warning is shown in full.  Warnings raised by cells on
Dask workers reach this process through :mod:`transformer_pde.sweep.worker_output`, so
they are counted here too.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections import Counter
from typing import Any

from tqdm import tqdm

from ..errors import TransformerPDEWarning

__all__ = ["NOISY_LOGGERS", "Quiet"]

#: loggers whose records are counted, not shown, without ``-v`` (with their children)
NOISY_LOGGERS = ("distributed", "dask", "tornado", "bokeh", "asyncio")


def _flat(text: Any) -> str:
    return " ".join(str(text).split())


class _Counting(logging.Handler):
    """Counts the records of level ``WARNING`` and above by level name."""

    def __init__(self, counts: Counter) -> None:
        super().__init__(logging.NOTSET)
        self.counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.counts[record.levelname] += 1


class Quiet:
    """The warning display and the log routing of one command (a context manager).

    Parameters
    ----------
    prog : str
        ``"transformer-pde COMMAND"``, the prefix of every line.
    verbose : bool
        Show every warning in full and leave the loggers alone.
    """

    def __init__(self, prog: str, verbose: bool) -> None:
        self.prog = prog
        self.verbose = verbose
        self.warnings: Counter = Counter()
        self.records: Counter = Counter()
        self._saved: list[tuple[logging.Logger, list, bool]] = []

    # ----------------------------------------------------------------- warnings
    def show_warning(self, message: Any, category: type, filename: str, lineno: int,
                     file: Any = None, line: str | None = None) -> None:
        """The ``warnings.showwarning`` of the command."""
        if self.verbose:
            text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
            tqdm.write(f"{self.prog}: warning: {text}", file=sys.stderr)
        elif issubclass(category, TransformerPDEWarning):
            # through tqdm.write: a progress bar on stderr is cleared, the line printed,
            # the bar redrawn
            tqdm.write(f"{self.prog}: warning: {category.__name__}: {_flat(message)}",
                       file=sys.stderr)
        else:
            self.warnings[(category.__name__, _flat(message))] += 1

    # ----------------------------------------------------------------- loggers
    def __enter__(self) -> Quiet:
        if not self.verbose:
            handler = _Counting(self.records)
            for name in NOISY_LOGGERS:
                lg = logging.getLogger(name)
                self._saved.append((lg, list(lg.handlers), lg.propagate))
                lg.handlers = [handler]
                lg.propagate = False
        return self

    def __exit__(self, *exc: Any) -> None:
        for lg, handlers, propagate in self._saved:
            lg.handlers = handlers
            lg.propagate = propagate
        self._saved = []

    # ----------------------------------------------------------------- summary
    def summary(self) -> str | None:
        """One line counting the warnings and log records not shown (None: nothing was
        hidden at level ``WARNING`` or above)."""
        parts = []
        n_warn = sum(self.warnings.values())
        if n_warn:
            (cat, msg), n = self.warnings.most_common(1)[0]
            msg = msg if len(msg) <= 60 else msg[:57] + "..."
            kinds = len(self.warnings)
            more = f"; {kinds - 1} other kind{'s' if kinds > 2 else ''}" if kinds > 1 else ""
            parts.append(f"{n_warn} warning{'s' if n_warn > 1 else ''} "
                         f"({cat}: {msg} x{n}{more})")
        n_rec = sum(self.records.values())
        if n_rec:
            levels = ", ".join(f"{k} x{v}" for k, v in sorted(self.records.items()))
            parts.append(f"{n_rec} Dask log message{'s' if n_rec > 1 else ''} ({levels})")
        if not parts:
            return None
        return f"{self.prog}: not shown: {' and '.join(parts)}; run with -v to see them"
