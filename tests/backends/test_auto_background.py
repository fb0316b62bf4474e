"""``backend="auto"`` never blocks on a compilation (:func:`transformer_pde.backends.get_backend`).

While the Numba kernels are not compiled (nor in Numba's disk cache), ``"auto"`` answers
with the NumPy reference and compiles them on one background thread; later runs get
Numba.  The kernel set is replaced by a fake whose "compilation" waits for the test, so the
tests see a compile in flight without the cost of a real one: the caller is not blocked
(the fake cannot finish before the test has its answer), a failing compile is logged and
never raised, ``TRANSFORMER_PDE_AUTO_COMPILE=foreground`` compiles in the caller's thread,
and a run on the NumPy answer agrees with the same run on Numba.  :func:`compile_notice.cached`
is checked against a real disk-cached function.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time

import numpy as np
import pytest

numba = pytest.importorskip("numba")

import transformer_pde as tp  # noqa: E402
from transformer_pde import backends  # noqa: E402
from transformer_pde.backends import compile_notice as cn  # noqa: E402

KEY = "numba kernels"
N = 200            # tokens: "auto" picks numba from 64


class _FakeKernel:
    """Stands in for a Numba dispatcher that is neither compiled nor cached."""

    signatures: list = []
    _cache = None              # cached() reads it and fails: "not cached"

    def __init__(self, call):
        self.call = call
        self.py_func = self.__call__    # a name for compile_kernels' report

    def __call__(self):
        return self.call()


@pytest.fixture
def fake_set(monkeypatch):
    """The Numba kernel set replaced by one fake kernel whose compile runs ``job``;
    a fresh job table and readiness; background mode.  Yields a setter for ``job``."""
    job = {"run": lambda: None, "threads": []}

    def call():
        job["threads"].append(threading.get_ident())
        job["run"]()

    kernel = _FakeKernel(call)
    monkeypatch.setitem(backends._KERNEL_SETS, "numba", lambda: [(kernel, "float64", kernel)])
    monkeypatch.setattr(backends, "_READY", set())
    monkeypatch.setattr(cn, "_JOBS", {})
    monkeypatch.delenv(backends.AUTO_COMPILE_ENV, raising=False)
    yield job
    _wait_done()             # never leave a fake job running into the next test


def _wait_done(timeout: float = 120.0) -> str | None:
    deadline = time.monotonic() + timeout
    while cn.job_state(KEY) in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.01)
    return cn.job_state(KEY)


def test_auto_answers_with_numpy_while_compiling_then_switches(fake_set):
    release = threading.Event()
    timed_out = []
    # the fake compile ends only when the test releases it (or after 60 s: then the
    # caller must have been blocked, and the assertion below fails)
    fake_set["run"] = lambda: timed_out.append(not release.wait(60.0))
    assert backends.get_backend("auto", n_tokens=N).name == "numpy"   # not blocked
    assert cn.job_state(KEY) in ("queued", "running")
    assert not backends.kernels_ready("numba")
    # a run resolved meanwhile is a NumPy run, and does not start a second compile
    att = tp.Attention("softmax", np.eye(2), np.eye(2), np.eye(2))
    X0 = np.random.default_rng(0).standard_normal((N, 2))
    run = tp.simulate(att, X0, t_max=0.2, dt=0.05)
    assert run.info["backend"] == "numpy"
    release.set()
    assert _wait_done() == "ready" and timed_out == [False]
    assert len(fake_set["threads"]) == 1 and fake_set["threads"][0] != threading.get_ident()
    assert backends.kernels_ready("numba")
    assert backends.get_backend("auto", n_tokens=N).name == "numba"
    assert backends.get_backend("auto", n_tokens=10).name == "numpy"   # the size rule holds


def test_a_failing_background_compile_is_logged_not_raised(fake_set, caplog):
    caplog.set_level(logging.DEBUG, logger=cn.LOGGER_NAME)

    def broken():
        raise RuntimeError("no LLVM today")

    fake_set["run"] = broken
    assert backends.get_backend("auto", n_tokens=N).name == "numpy"
    assert _wait_done() == "failed"
    warn = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no LLVM today" in r.getMessage() and KEY in r.getMessage() for r in warn)
    assert backends.get_backend("auto", n_tokens=N).name == "numpy"    # and stays there
    assert len(fake_set["threads"]) == 1                               # not retried


def test_foreground_mode_compiles_in_the_callers_thread(fake_set, monkeypatch):
    monkeypatch.setenv(backends.AUTO_COMPILE_ENV, "foreground")
    assert backends.get_backend("auto", n_tokens=N).name == "numba"
    assert fake_set["threads"] == [threading.get_ident()]
    assert cn.job_state(KEY) is None                 # no background job


def test_explicit_numba_never_waits_for_the_background(fake_set):
    fake_set["run"] = lambda: None
    assert backends.get_backend("numba").name == "numba"
    assert fake_set["threads"] == [] and cn.job_state(KEY) is None


def test_same_run_on_the_numpy_answer_and_on_numba(fake_set):
    # the run "auto" gives while compiling (NumPy) and the one it gives afterwards (Numba)
    # agree: float64 Numba kernels are within about 1e-13 relative of the reference per
    # evaluation (vexp a few ulp, reordered sums); 8 RK4 steps of a contracting flow keep
    # that well under rtol 1e-10
    release = threading.Event()
    fake_set["run"] = lambda: release.wait(60.0)
    rng = np.random.default_rng(1)
    att = tp.Attention("softmax", rng.standard_normal((3, 3)) / 2, np.eye(3), np.eye(3))
    X0 = rng.standard_normal((N, 3))
    kw = dict(t_max=0.4, dt=0.05, solver="rk4")
    first = tp.simulate(att, X0, **kw)
    release.set()
    assert _wait_done() == "ready"
    later = tp.simulate(att, X0, **kw)
    assert (first.info["backend"], later.info["backend"]) == ("numpy", "numba")
    np.testing.assert_allclose(later.states, first.states, rtol=1e-10, atol=1e-12)


def test_cached_reads_the_disk_cache_and_this_process(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("import numba\n\n@numba.njit(cache=True)\ndef scale(x):\n"
                    "    return 2 * x\n")

    def load():
        spec = importlib.util.spec_from_file_location("transformer_pde._cached_probe", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.scale

    first = load()
    assert not cn.cached(first, "float64")
    first(np.ones(3))                              # compiled here, written to disk
    assert cn.cached(first, "float64") and not cn.cached(first, "float32")
    second = load()                                # a new dispatcher: nothing in memory
    assert second.signatures == []
    assert cn.cached(second, "float64") and not cn.cached(second, "float32")
    assert not cn.cached(object(), "float64")      # not a dispatcher: "not cached"
