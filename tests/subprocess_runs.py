"""Helpers of the tests that run the CLI in a subprocess and signal it mid-run."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

#: seconds a subprocess may take to start its time loop: room for a compile from an empty
#: Numba cache on a loaded 2-core machine (the test's own module fixture warms it first)
DEADLINE = 300


def wait_for_checkpoints(proc: subprocess.Popen, ck: Path, run_for: float = 0.5) -> None:
    """Wait for the "started" signal -- the first checkpoint: the kernels are compiled and
    the time loop runs -- then for checkpoints rewritten over ``run_for`` seconds of the
    loop (so that states were saved); never a fixed sleep from the process start."""
    deadline = time.monotonic() + DEADLINE
    seen: set = set()
    started = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            st = ck.stat()
            seen.add((st.st_ino, st.st_mtime_ns))
            started = time.monotonic() if started is None else started
        except FileNotFoundError:
            pass
        if started is not None and len(seen) >= 5 and time.monotonic() - started >= run_for:
            return
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"the run did not start: {proc.communicate()}")
