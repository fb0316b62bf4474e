"""Nothing a test starts outlives it (issue 40, item 2): the helpers of
``tests/subprocess_runs.py`` give each child default SIGINT and SIGTERM even when the test
process ignores SIGINT (``nohup``, a background job of a script, some CI runners), and kill
the child's process group -- the child and what it started -- when the test fails, times
out waiting for it, or passes; on Linux a child also dies with the process that started it.

The tests run a small pytest session of their own in a subprocess, with SIGINT ignored as
such a runner would, and then look for every process that session started."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from subprocess_runs import alive, run

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

#: seconds for a SIGKILLed process to disappear (the kernel's work, not the test's speed)
GONE_WITHIN = 30

#: a child that records its process id and whether its SIGINT raises KeyboardInterrupt,
#: optionally starts a grandchild (same process group) doing the same, then sleeps
CHILD = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with open(sys.argv[1], "a") as fh:
        fh.write(f"{os.getpid()} {default}\\n")
    if len(sys.argv) > 2:
        subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]])
    time.sleep(600)
""")

INNER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    import pytest
    from subprocess_runs import run, started

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup or a background job
    PIDS = os.environ["TPDE_PIDS"]
    CHILD = os.environ["TPDE_CHILD"]

    def _wait_lines(n):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if os.path.exists(PIDS) and open(PIDS).read().count("\\n") >= n:
                return
            time.sleep(0.02)
        raise AssertionError("the child did not start")

    def _lines():
        return open(PIDS).read().count("\\n") if os.path.exists(PIDS) else 0

    def test_fails_while_its_child_runs():
        n = _lines()
        with started([sys.executable, "-c", CHILD, PIDS]):
            _wait_lines(n + 1)
            assert False, "a failing test"

    def test_times_out_waiting_for_its_child():
        n = _lines()
        with started([sys.executable, "-c", CHILD, PIDS, CHILD],
                     stdout=subprocess.PIPE, text=True) as proc:
            _wait_lines(n + 2)  # the child and its grandchild
            proc.communicate(timeout=0.1)

    def test_run_times_out():
        run([sys.executable, "-c", CHILD, PIDS, CHILD], timeout=1, capture_output=True)

    def test_child_ended_by_sigint_leaves_no_grandchild():
        n = _lines()
        with started([sys.executable, "-c", CHILD, PIDS, CHILD]) as proc:
            _wait_lines(n + 2)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == -signal.SIGINT
""")


def _env(**extra: str) -> dict:
    path = os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def _records(path: Path) -> list[tuple[int, bool]]:
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(int(pid), flag == "True") for pid, flag in rows]


def _all_gone(pids: list[int]) -> list[int]:
    """The processes of ``pids`` still alive after waiting up to GONE_WITHIN seconds."""
    deadline = time.monotonic() + GONE_WITHIN
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_nothing_a_test_starts_outlives_it(tmp_path):
    inner = tmp_path / "test_inner.py"
    inner.write_text(INNER)
    pids = tmp_path / "pids.txt"
    res = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "no:hypothesispytest", str(inner)], capture_output=True, text=True, cwd=tmp_path,
              timeout=600,
              env=_env(TPDE_PIDS=str(pids), TPDE_CHILD=CHILD))
    assert "3 failed, 1 passed" in res.stdout, res.stdout + res.stderr
    assert "TimeoutExpired" in res.stdout and "a failing test" in res.stdout
    records = _records(pids)
    # one child, a child and its grandchild, the same under run (which may time out before
    # they start on a loaded machine), and a child and its grandchild: 5 to 7 processes
    assert 5 <= len(records) <= 7, records
    # each started with the default SIGINT although the test process ignored it
    assert all(default for _, default in records), records
    leftover = _all_gone([pid for pid, _ in records])
    for pid in leftover:  # do not leave them running even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not leftover


PARENT_DIES = textwrap.dedent("""
    import os, signal, sys, time
    from subprocess_runs import started
    with started([sys.executable, "-c", sys.argv[2], sys.argv[1]]):
        deadline = time.monotonic() + 120
        while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # the file has its line
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no clean-up
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_dies_with_the_process_that_started_it(tmp_path):
    pids = tmp_path / "pids.txt"
    res = run([sys.executable, "-c", PARENT_DIES, str(pids), CHILD], capture_output=True,
              text=True, env=_env(), timeout=300)
    assert res.returncode == -signal.SIGKILL, res.stderr
    [(pid, default)] = _records(pids)
    assert default
    leftover = _all_gone([pid])
    if leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover


def test_run_and_started_refuse_what_they_set():
    with pytest.raises(TypeError, match="start_new_session"):
        run([sys.executable, "-c", "pass"], timeout=60, start_new_session=True)
