"""The first-use compilation notice (:mod:`transformer_pde.backends.compile_notice`).

The notice listens to Numba's compilation events, so the tests compile small functions
whose ``__module__`` is inside the package (built with ``exec`` or loaded from a file under
a ``transformer_pde.`` module name) and look at the log records and at an open tqdm bar:
a real compilation of a package function is said (once, at level WARNING, then the INFO
line with its duration), a call of an already compiled or disk-cached function and a
compilation of a function outside the package are not, a compilation shorter than the
threshold is not, and :func:`uninstall` is respected by the implicit installs of the
compiled modules.  One slow test compiles a real kernel of the Numba backend from an empty
cache in a subprocess and reads the notice on its stderr.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import sys
import textwrap
import time

import numpy as np
import pytest

numba = pytest.importorskip("numba")
tqdm = pytest.importorskip("tqdm")

import subprocess_runs  # noqa: E402
from transformer_pde.backends import compile_notice as cn  # noqa: E402
from transformer_pde.errors import ArgumentError, ArgumentTypeError  # noqa: E402

SOURCE = """
def add_one(x):
    return x + 1
"""


@pytest.fixture
def notice():
    """The notice installed with ``after=0`` for the test, the previous state restored."""
    before = cn._LISTENER.after if cn._LISTENER is not None else None
    refused = cn._REFUSED
    cn.install(after=0.0)
    yield
    cn.uninstall()
    cn._REFUSED = refused
    if before is not None:
        cn.install(after=before)


def _package_function(module: str = "transformer_pde._notice_probe"):
    """A fresh (never compiled) jitted function whose module is ``module``."""
    scope: dict = {"__name__": module}
    exec(SOURCE, scope)
    return numba.njit(cache=False)(scope["add_one"])


def _records(caplog, level=logging.DEBUG):
    return [r for r in caplog.records if r.name == cn.LOGGER_NAME and r.levelno >= level]


def test_cold_compilation_is_said_once_then_warm_calls_are_silent(notice, caplog):
    caplog.set_level(logging.DEBUG, logger=cn.LOGGER_NAME)
    f = _package_function()
    assert f(1) == 2
    warn = _records(caplog, logging.WARNING)
    assert len(warn) == 1 and "compiling the Numba kernel add_one" in warn[0].getMessage()
    info = [r for r in _records(caplog) if r.levelno == logging.INFO]
    assert len(info) == 1 and "compiled add_one in" in info[0].getMessage()
    caplog.clear()
    assert f(2) == 3 and f(5) == 6        # compiled in this process: no event, nothing said
    assert _records(caplog) == []
    assert f(1.5) == 2.5                  # a new specialisation is a new compilation
    assert len(_records(caplog, logging.WARNING)) == 1


def test_functions_outside_the_package_are_not_announced(notice, caplog):
    caplog.set_level(logging.DEBUG, logger=cn.LOGGER_NAME)
    f = _package_function(module="someone_else.kernels")
    assert f(1) == 2
    g = _package_function(module="transformer_pdex")   # a prefix, not the package
    assert g(1) == 2
    assert _records(caplog) == []


def test_nested_compilations_are_one_notice_named_after_the_outer(notice, caplog):
    caplog.set_level(logging.DEBUG, logger=cn.LOGGER_NAME)
    inner = _package_function()
    scope = {"__name__": "transformer_pde._notice_probe", "inner": inner}
    exec("def outer(x):\n    return inner(x) * 2\n", scope)
    outer = numba.njit(cache=False)(scope["outer"])
    assert outer(1) == 4
    warn = _records(caplog, logging.WARNING)
    assert [r.getMessage().split()[5] for r in warn] == ["outer"]


def test_short_compilation_below_the_threshold_is_not_said(caplog):
    refused, before = cn._REFUSED, cn._LISTENER
    cn.install(after=30.0)                # a one-line function compiles in well under 30 s
    try:
        caplog.set_level(logging.DEBUG, logger=cn.LOGGER_NAME)
        f = _package_function()
        assert f(1) == 2
        assert _records(caplog, logging.INFO) == []
        debug = _records(caplog)
        assert len(debug) == 1 and "compiled add_one in" in debug[0].getMessage()
    finally:
        cn.uninstall()
        cn._REFUSED = refused
        if before is not None:
            cn.install(after=before.after)


def test_timer_says_it_while_the_compilation_runs(caplog):
    caplog.set_level(logging.DEBUG, logger=cn.LOGGER_NAME)
    comp = cn._Compilation("slow_kernel", after=0.01)
    deadline = time.monotonic() + 10.0
    while not comp.said and time.monotonic() < deadline:
        time.sleep(0.01)
    assert comp.said, "the timer did not fire within 10 s"
    comp.end()
    msgs = [(r.levelno, r.getMessage()) for r in _records(caplog)]
    assert msgs[0][0] == logging.WARNING and "slow_kernel" in msgs[0][1]
    assert msgs[1][0] == logging.INFO and "compiled slow_kernel in" in msgs[1][1]
    comp2 = cn._Compilation("quick_kernel", after=5.0)
    comp2.end()                           # ended before the timer: never said
    time.sleep(0.05)
    assert not comp2.said


def test_disk_cached_function_loads_silently(notice, caplog, tmp_path):
    caplog.set_level(logging.DEBUG, logger=cn.LOGGER_NAME)
    path = tmp_path / "probe.py"
    path.write_text("import numba\n\n@numba.njit(cache=True)\ndef twice(x):\n"
                    "    return 2 * x\n")
    spec = importlib.util.spec_from_file_location("transformer_pde._notice_file_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.twice(3) == 6              # compiled and written to the disk cache
    assert len(_records(caplog, logging.WARNING)) == 1
    caplog.clear()
    fresh = numba.njit(cache=True)(mod.twice.py_func)   # a new dispatcher, empty in memory
    assert fresh(4) == 8                  # loaded from the disk cache: no compilation
    assert fresh.stats.cache_hits and _records(caplog) == []


def test_open_progress_bar_shows_the_compilation(notice):
    out = io.StringIO()
    bar = tqdm.tqdm(total=1, desc="run", file=out, mininterval=0)
    try:
        f = _package_function()
        assert f(1) == 2
        assert f"run [{cn.BAR_NOTE}]" in out.getvalue()
        assert bar.desc == "run"          # given back when the compilation ended
    finally:
        bar.close()
    quiet = tqdm.tqdm(total=1, desc="off", file=out, disable=True)
    assert quiet not in cn._open_bars()


def test_install_arguments_and_uninstall_are_respected():
    refused, before = cn._REFUSED, cn._LISTENER
    try:
        with pytest.raises(ArgumentError, match="after"):
            cn.install(after=-1.0)
        with pytest.raises(ArgumentTypeError, match="after"):
            cn.install(after="1")
        cn.uninstall()
        assert not cn.installed()
        cn.install()                      # what importing a compiled module does
        assert not cn.installed()
        cn.install(after=2.0)             # explicit: on again
        assert cn.installed() and cn._LISTENER.after == 2.0
        cn.install()                      # implicit: keeps the setting
        assert cn._LISTENER.after == 2.0
    finally:
        cn.uninstall()
        cn._REFUSED = refused
        if before is not None:
            cn.install(after=before.after)


def test_compiled_modules_install_the_notice():
    pytest.importorskip("transformer_pde.backends.numba")
    import transformer_pde.gaussian.member  # noqa: F401
    if not cn._REFUSED:
        assert cn.installed()


@pytest.mark.slow
def test_real_kernel_from_an_empty_cache_is_said(tmp_path):
    code = textwrap.dedent("""
        import numpy as np
        import transformer_pde as tp
        att = tp.Attention("softmax", Q=np.eye(2), K=np.eye(2), V=np.eye(2))
        X0 = np.random.default_rng(0).normal(size=(20, 2))
        traj = tp.simulate(att, X0, t_max=0.1, dt=0.05,
                           field=tp.FieldOptions(backend="numba"))
        assert traj.status == "ok", traj.status
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    run = subprocess_runs.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "compiling the Numba kernel" in run.stderr


def test_kernels_are_named_with_their_dtype_and_expected_ones_said_at_info(notice, caplog):
    # two specialisations of one kernel are two distinct lines; inside expected() (warmup,
    # the background compilation) the start line is INFO, not WARNING
    caplog.set_level(logging.DEBUG, logger=cn.LOGGER_NAME)
    f = _package_function()
    with cn.expected():
        assert f(np.ones(2))[0] == 2.0
    assert f(np.ones(2, np.float32))[0] == 2.0
    said = [(r.levelno, r.getMessage()) for r in _records(caplog)
            if "compiling the Numba kernel" in r.getMessage()]
    assert [(lv, m.split()[5:7]) for lv, m in said] == [
        (logging.INFO, ["add_one", "(float64)"]), (logging.WARNING, ["add_one", "(float32)"])]
