"""Helpers of the tests that start a process: nothing a test starts outlives it, whatever
the process that started the tests.

Every test that starts a process goes through :func:`started` (a ``Popen`` as a context
manager) or :func:`run` (``subprocess.run``'s signature).  Their children

- start with SIGINT and SIGTERM at their default dispositions.  A disposition set to
  "ignore" survives ``exec``: a test run started in the background by a non-interactive
  shell, by ``nohup`` or by some CI runners has SIGINT ignored, and without the reset its
  children inherit it (a child Python then installs no ``KeyboardInterrupt`` handler, and
  a test that stops its child with SIGINT waits forever);
- lead a process group of their own, which is killed (SIGKILL to the group: the child and
  whatever it started, such as Dask workers) when the ``with`` block ends -- the test
  passed, failed, timed out waiting, or was interrupted;
- on Linux, are killed by the kernel if the thread that started them dies first (the test
  process killed by SIGKILL, or ended by ``os._exit``), so that even then nothing keeps a
  core busy (``PR_SET_PDEATHSIG``).

The signal the child gets from its process group (a terminal's Ctrl-C reaches the whole
foreground group) is sent with :func:`signal_group`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

__all__ = ["DEADLINE", "STOP_WAIT", "alive", "run", "signal_group", "started", "stop",
           "wait_for_checkpoints"]

#: seconds a subprocess may take to start its time loop: room for a compile from an empty
#: Numba cache on a loaded 2-core machine (the test's own module fixture warms it first)
DEADLINE = 300

#: seconds to wait for a killed child to be reaped and its pipes to close
STOP_WAIT = 30

_PR_SET_PDEATHSIG = 1
# loaded in the parent, so that the child (between fork and exec) calls prctl without
# loading a library
_LIBC = (ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
         if sys.platform.startswith("linux") else None)


def _child_setup(parent: int) -> None:
    """Run in the child between fork and exec (``preexec_fn``: the only hook of
    ``subprocess`` that runs there; it does nothing that takes a lock): default SIGINT and
    SIGTERM, and (Linux) SIGKILL when the parent dies."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(137)


def _popen(args: Sequence[str | os.PathLike], **kwargs: Any) -> subprocess.Popen:
    for key in ("preexec_fn", "start_new_session", "process_group"):
        if key in kwargs:
            raise TypeError(f"{key} is set by subprocess_runs (a process group of its own, "
                            "default signals); do not pass it")
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    parent = os.getpid()
    return subprocess.Popen(args, preexec_fn=lambda: _child_setup(parent), process_group=0,
                            **kwargs)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group of ``proc`` (what a terminal's Ctrl-C does to its
    foreground group: the command and every process it started)."""
    os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen) -> tuple[Any, Any]:
    """Kill the process group of ``proc`` (SIGKILL: it and everything it started), reap it
    and close its pipes; what was left to read on its pipes (``(None, None)`` when they
    were not pipes or were read already).  Safe to call on a process that already ended."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    left: tuple[Any, Any] = (None, None)
    try:
        left = proc.communicate(timeout=STOP_WAIT)
    except (subprocess.TimeoutExpired, ValueError):  # pipes held elsewhere, or closed
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_WAIT)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return left


@contextlib.contextmanager
def started(args: Sequence[str | os.PathLike], **kwargs: Any) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(args, **kwargs)`` whose process group is killed when the block
    ends, however it ends (stdin defaults to ``/dev/null``)."""
    proc = _popen(args, **kwargs)
    try:
        yield proc
    finally:
        stop(proc)


def run(args: Sequence[str | os.PathLike], *, timeout: float, check: bool = False,
        capture_output: bool = False, input: str | bytes | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` through :func:`started`: after ``timeout`` seconds (required:
    no test waits forever) ``subprocess.TimeoutExpired`` is raised and the child's whole
    process group is killed, as it is when the child ended (what it left running)."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with started(args, **kwargs) as proc:
        out, err = proc.communicate(input, timeout=timeout)
        done = subprocess.CompletedProcess(proc.args, proc.wait(), out, err)
    if check:
        done.check_returncode()
    return done


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a zombie no longer runs: only its
    exit status waits for its parent, which may be a PID 1 that never reaps)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no procfs: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_for_checkpoints(proc: subprocess.Popen, ck: Path, run_for: float = 0.5) -> None:
    """Wait for the "started" signal -- the first checkpoint: the kernels are compiled and
    the time loop runs -- then for checkpoints rewritten over ``run_for`` seconds of the
    loop (so that states were saved); never a fixed sleep from the process start."""
    deadline = time.monotonic() + DEADLINE
    seen: set = set()
    started_at = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            st = ck.stat()
            seen.add((st.st_ino, st.st_mtime_ns))
            started_at = time.monotonic() if started_at is None else started_at
        except FileNotFoundError:
            pass
        if started_at is not None and len(seen) >= 5 and time.monotonic() - started_at >= run_for:
            return
        time.sleep(0.01)
    out, err = stop(proc)
    pytest.fail(f"the run did not start (exit status {proc.returncode}): {out!r} {err!r}")
