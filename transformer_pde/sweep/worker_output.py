"""Warnings and log records of the cells that Dask workers run, carried back to the process
that runs the study.

A cell run by a Dask worker writes its warnings (a ``RuntimeWarning: overflow`` of scipy,
say) and log records (the first-use compile notice) to the worker's stderr, where they
interleave with the study's progress bar and escape the filters and handlers of the
caller.  :func:`run_captured` runs a task's cells while collecting what the task's own
thread warns and logs in a worker process other than the caller's (each distinct event
once, with its count) and returns it with the results; :func:`reemit` then issues every
distinct event once in the calling process, through :func:`warnings.warn_explicit` (the
caller's warning filters apply, with the original category and source location) and
through the original logger (the caller's logging configuration applies).

The collection hooks are installed in the worker process on its first task: a wrapper of
:func:`warnings.showwarning` and a handler on the root logger.  Both act only for a thread
that is running :func:`run_captured`; elsewhere the warning is shown as before and a log
record with no other handler on the root logger is written by :data:`logging.lastResort`,
as Python does without any handler.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import warnings
from typing import Any, Callable, Iterable

__all__ = ["MAX_EVENTS", "Event", "process_id", "reemit", "run_captured"]

#: the most distinct events (warnings and log records) one task brings back
MAX_EVENTS = 64

#: ``(kind, source, level, message, filename, lineno)``: ``kind`` is ``"warning"`` (``source``
#: the warning category as ``module:qualname``) or ``"log"`` (``source`` the logger's name)
Event = tuple[str, str, int, str, str, int]

_local = threading.local()
_install_lock = threading.Lock()


def _buffer() -> dict | None:
    return getattr(_local, "events", None)


def _add(event: Event) -> bool:
    """Record ``event`` for the current thread; whether a capture was active."""
    events = _buffer()
    if events is None:
        return False
    if event in events or len(events) < MAX_EVENTS:
        events[event] = events.get(event, 0) + 1
    return True


def _category_name(category: type) -> str:
    return f"{category.__module__}:{category.__qualname__}"


def _wrap_showwarning(previous: Callable[..., None]) -> Callable[..., None]:
    def showwarning(message: Any, category: type, filename: str, lineno: int,
                    file: Any = None, line: str | None = None) -> None:
        if not _add(("warning", _category_name(category), logging.WARNING, str(message),
                     str(filename), int(lineno))):
            previous(message, category, filename, lineno, file, line)

    showwarning._transformer_pde_capture = True  # type: ignore[attr-defined]
    return showwarning


class _CaptureHandler(logging.Handler):
    """Root handler of a worker process: the records of a capturing thread are kept."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 -- a record whose arguments do not format is kept raw
            message = str(record.msg)
        if _add(("log", record.name, record.levelno, message, str(record.pathname),
                 int(record.lineno))):
            return
        others = [h for h in logging.getLogger().handlers if not isinstance(h, _CaptureHandler)]
        if not others and logging.lastResort is not None \
                and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)


def _install() -> None:
    """Install the hooks in this process (again if a ``catch_warnings`` block removed them)."""
    with _install_lock:
        if not getattr(warnings.showwarning, "_transformer_pde_capture", False):
            warnings.showwarning = _wrap_showwarning(warnings.showwarning)
        root = logging.getLogger()
        if not any(isinstance(h, _CaptureHandler) for h in root.handlers):
            root.addHandler(_CaptureHandler())


def process_id() -> str:
    """This process, as ``host:pid`` (the ``caller`` of :func:`run_captured`)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def run_captured(caller: str, func: Callable[..., Any],
                 *args: Any) -> tuple[Any, list[tuple[Event, int]]]:
    """``func(*args)`` and the distinct warnings and log records it emitted in this thread,
    each with its count (at most :data:`MAX_EVENTS`); none when this is the process
    ``caller`` (:func:`process_id`: a worker thread of the calling process, whose warnings and
    records reach the caller's filters and handlers already)."""
    if process_id() == caller:
        return func(*args), []
    _install()
    outer = _buffer()
    _local.events = {}
    try:
        result = func(*args)
        events = list(_local.events.items())
    finally:
        _local.events = outer
    return result, events


def _category(name: str) -> type[Warning]:
    """The warning class named ``module:qualname``; :class:`UserWarning` if it cannot be
    imported here."""
    module, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError):
        return UserWarning
    return obj if isinstance(obj, type) and issubclass(obj, Warning) else UserWarning


def reemit(events: Iterable[tuple[Event, int]], seen: set) -> None:
    """Issue in this process each event of ``events`` that is not in ``seen`` (which it
    updates): a warning through :func:`warnings.warn_explicit`, a log record through its
    logger."""
    for event, _count in events:
        if event in seen:
            continue
        seen.add(event)
        kind, source, level, message, filename, lineno = event
        if kind == "warning":
            warnings.warn_explicit(message, _category(source), filename, lineno)
            continue
        logger = logging.getLogger(source)
        if logger.isEnabledFor(level):
            logger.handle(logging.makeLogRecord({
                "name": source, "levelno": level, "levelname": logging.getLevelName(level),
                "msg": message, "args": None, "pathname": filename, "lineno": lineno}))
