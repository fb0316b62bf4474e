"""Exit statuses of ``transformer-pde``, the errors that choose them, and the signals that
stop a command.

Every command ends with one :class:`ExitCode`: a run's own status maps to 0 or 1
(:func:`status_exit`), a refused command line to 2 (:class:`UsageError`), a command that
ran and failed to 4 (:class:`RunError`).  SIGTERM is handled as Ctrl-C
(:func:`sigterm_as_interrupt`): the command stops the same way, and only its exit status
(143 instead of 130) and the word in its message (:meth:`Signals.word`) differ.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import threading
from typing import Any

from ..errors import TransformerPDEError
from ..results import Status

__all__ = ["EXIT_HELP", "ExitCode", "RunError", "Signals", "UsageError",
           "sigterm_as_interrupt", "status_exit"]


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


#: the line of each exit status in ``transformer-pde --help``
EXIT_HELP = {
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


class UsageError(TransformerPDEError):
    """The command line asks for something that cannot be done (exit status 2)."""


class RunError(TransformerPDEError):
    """A command ran and failed (exit status 4)."""


def status_exit(status: str) -> int:
    """The exit status of a run that ended with ``status``
    (:class:`~transformer_pde.results.Status`): 0 for a successful status, 130 for
    ``interrupted``, 1 otherwise."""
    st = Status.parse(status)
    if st is Status.INTERRUPTED:
        return ExitCode.INTERRUPTED
    return ExitCode.OK if st.success else ExitCode.UNSUCCESSFUL


class Signals:
    """What stopped the command: SIGTERM is handled as Ctrl-C (a ``KeyboardInterrupt``
    raised in the main thread), and only its exit status and wording differ."""

    terminated = False

    @classmethod
    def on_sigterm(cls, signum: int, frame: Any) -> None:
        """The SIGTERM handler: remember the signal and stop as Ctrl-C does."""
        cls.terminated = True
        raise KeyboardInterrupt

    @classmethod
    def word(cls) -> str:
        """``"interrupted"``, or ``"terminated (SIGTERM)"``."""
        return "terminated (SIGTERM)" if cls.terminated else "interrupted"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Any:
    """Handle SIGTERM as SIGINT while the command runs (main thread only: elsewhere
    Python cannot install signal handlers, and the caller keeps its own)."""
    Signals.terminated = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, Signals.on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
