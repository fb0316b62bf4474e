r"""A one-line notice when a Numba compilation of the package takes a while.

The compiled kernels of the package (the attention kernels of the Numba backend, the
per-member integrator of :func:`transformer_pde.gaussian.solve_batch`) are compiled by
Numba the first time they run with a given argument type, and cached on disk
(``cache=True``; ``NUMBA_CACHE_DIR`` moves the cache).  A cold compilation takes seconds
to tens of seconds; a later run, in any process, loads the cached machine code in a
fraction of a second.

This module listens to Numba's own compilation events (``numba.core.event``, kind
``"numba:compile"``), which fire only when Numba really compiles, never when it loads a
cached kernel or calls one already compiled, so warm calls pay nothing.  When a
compilation of a function of this package is still running after :data:`NOTICE_AFTER`
seconds, it says so once:

* a log record on the logger ``"transformer_pde.compile"`` at level ``WARNING`` (so that a
  script or notebook with no logging configured shows it on stderr), for example::

      transformer_pde: compiling the Numba kernel softmax_kernel for first use
      (cached afterwards: later runs skip this)

* every open ``tqdm`` progress bar adds ``[compiling Numba kernels]`` to its description
  until the compilation ends.

When the compilation ends, an ``INFO`` record on the same logger gives the time it took,
and the progress bars get their description back.  Nested compilations (a kernel compiling the
functions it calls) are one compilation, named after the outermost function.  Silence
the notice with ``logging.getLogger("transformer_pde.compile").setLevel(logging.ERROR)``,
or with :func:`uninstall`.

A kernel is named with the dtype of its first array argument (``softmax_kernel
(float32)``), so two specialisations are two distinct lines.  A compilation that is
expected (inside :func:`expected`: ``transformer-pde warmup``, the background
compilation) is said at ``INFO`` instead of ``WARNING``: it blocks no one who did not ask
for it.

Background compilation.  :func:`compile_in_background` runs a compilation job on the
one background thread of the process (a daemon; jobs run one at a time, in the order
given, each once per key); :func:`job_state` tells whether it is queued, running, ready
or failed.  A job that raises is logged (``WARNING``, with the traceback at ``DEBUG``),
never raised in the caller's thread.  :func:`cached` tells whether a kernel's
specialisation for a dtype is compiled in this process or in Numba's disk cache (then a
call loads it in a fraction of a second).  :func:`ready_or_background` joins them for a
caller with a fallback that needs no compilation: ``backend="auto"``
(:func:`transformer_pde.backends.get_backend`) answers with NumPy meanwhile.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..validation import nonnegative

__all__ = ["BAR_NOTE", "COMPILE_ENV", "LOGGER_NAME", "NOTICE_AFTER", "cached",
           "compile_in_background", "expected", "install", "installed", "job_state",
           "ready_or_background", "runnable", "running", "uninstall"]

#: Name of the logger of the notice.
LOGGER_NAME = "transformer_pde.compile"
#: Seconds a compilation must have run before the notice is given.
NOTICE_AFTER = 1.0
#: What an open progress bar shows after its description while a compilation runs.
BAR_NOTE = "compiling Numba kernels"
#: Environment variable: ``foreground`` makes :func:`ready_or_background` compile in the
#: caller's thread (read at each call; default ``background``).
COMPILE_ENV = "TRANSFORMER_PDE_AUTO_COMPILE"

logger = logging.getLogger(LOGGER_NAME)

_PACKAGE = __name__.split(".", 1)[0]
_LOCK = threading.Lock()
_LISTENER: Any = None
_REFUSED = False      # uninstall() was called: implicit install() calls do nothing
_EXPECTED = threading.local()    # .depth > 0: this thread's compilations are expected


@contextmanager
def expected() -> Iterator[None]:
    """Within this block, compilations of this thread are expected (asked for: a warm-up,
    the background compilation): their notice is said at ``INFO``, not ``WARNING``."""
    _EXPECTED.depth = getattr(_EXPECTED, "depth", 0) + 1
    try:
        yield
    finally:
        _EXPECTED.depth -= 1


def _array_dtype(types: Any) -> str | None:
    """The dtype (``"float64"``) of the first array among Numba argument types, if any."""
    for t in getattr(types, "args", types) or ():
        if getattr(t, "ndim", 0) >= 1 and getattr(t, "dtype", None) is not None:
            return str(t.dtype)
    return None


def _function_name(event: Any) -> str | None:
    """Name of the compiled function when it belongs to this package, else ``None``."""
    data = getattr(event, "data", None) or {}
    func = getattr(data.get("dispatcher"), "py_func", None)
    module = getattr(func, "__module__", "") or ""
    if module != _PACKAGE and not module.startswith(_PACKAGE + "."):
        return None
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", "kernel")
    dtype = _array_dtype(data.get("args"))
    return name if dtype is None else f"{name} ({dtype})"


def _open_bars() -> list[Any]:
    """The open, enabled tqdm bars of the process (none when tqdm was never imported)."""
    std = sys.modules.get("tqdm.std")
    if std is None:
        return []
    try:
        bars = list(getattr(std.tqdm, "_instances", ()))
    except RuntimeError:     # the weak set changed while it was read
        return []
    return [b for b in bars if not getattr(b, "disable", True)]


class _Compilation:
    """One outermost compilation: the timer that gives the notice, the bars it marked."""

    def __init__(self, name: str, after: float, level: int = logging.WARNING) -> None:
        self.name = name
        self.level = level
        self.start = time.perf_counter()
        self.lock = threading.Lock()
        self.said = False
        self.ended = False
        self.bars: list[tuple[Any, Any]] = []
        self.timer: threading.Timer | None = None
        if after <= 0.0:
            self.say()
        else:
            self.timer = threading.Timer(after, self.say)
            self.timer.daemon = True
            self.timer.start()

    def say(self) -> None:
        with self.lock:
            if self.ended or self.said:
                return
            self.said = True
            logger.log(self.level, "transformer_pde: compiling the Numba kernel %s for first "
                       "use (cached afterwards: later runs skip this)", self.name)
            for bar in _open_bars():
                try:
                    old = bar.desc
                    bar.set_description_str(f"{old} [{BAR_NOTE}]" if old else BAR_NOTE)
                except Exception:  # noqa: BLE001 - a bar that cannot be drawn keeps quiet
                    continue
                self.bars.append((bar, old))

    def end(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        with self.lock:
            self.ended = True
            seconds = time.perf_counter() - self.start
            if self.said:
                logger.info("transformer_pde: compiled %s in %.1f s", self.name, seconds)
            else:
                logger.debug("transformer_pde: compiled %s in %.2f s", self.name, seconds)
            for bar, old in self.bars:
                try:
                    bar.set_description_str(old)
                except Exception:  # noqa: BLE001 - the bar may have been closed meanwhile
                    pass
            self.bars = []


def _listener_class() -> type:
    from numba.core import event  # noqa: PLC0415 - numba is imported only when installed

    class CompileNotice(event.Listener):
        """Numba listener: an outermost compilation of this package, timed."""

        def __init__(self, after: float) -> None:
            self.after = after
            self.local = threading.local()

        def on_start(self, ev: Any) -> None:
            stack = self.local.__dict__.setdefault("stack", [])
            name = _function_name(ev)
            if stack or name is None:
                stack.append(None)     # nested in an outer one, or not ours
                return
            level = logging.INFO if getattr(_EXPECTED, "depth", 0) else logging.WARNING
            stack.append(_Compilation(name, self.after, level))

        def on_end(self, ev: Any) -> None:
            stack = self.local.__dict__.get("stack")
            if not stack:
                return
            comp = stack.pop()
            if comp is not None:
                comp.end()

    return CompileNotice


def install(after: float | None = None) -> None:
    """Give the compilation notice from now on.

    The compiled parts of the package call ``install()`` when they are imported; an
    explicit :func:`uninstall` is respected by those calls.

    Parameters
    ----------
    after : float, optional
        Seconds a compilation must have run before the notice is given (``0``: at once).
        Default: keep the current setting, :data:`NOTICE_AFTER` at first.  An explicit
        value also undoes :func:`uninstall`.

    Raises
    ------
    ArgumentError
        ``after`` negative or not finite.
    ArgumentTypeError
        ``after`` not a real number.
    """
    global _LISTENER, _REFUSED
    if after is None:
        if _REFUSED or _LISTENER is not None:
            return
        after = NOTICE_AFTER
    after = nonnegative("after", after)
    from numba.core import event  # noqa: PLC0415 - numba is imported only when installed

    with _LOCK:
        _REFUSED = False
        if _LISTENER is not None:
            if _LISTENER.after == after:
                return
            event.unregister("numba:compile", _LISTENER)
        _LISTENER = _listener_class()(after)
        event.register("numba:compile", _LISTENER)


def uninstall() -> None:
    """Stop giving the notice, also when more compiled parts of the package are imported
    later (:func:`install` with an explicit ``after`` turns it on again)."""
    global _LISTENER, _REFUSED
    with _LOCK:
        _REFUSED = True
        if _LISTENER is None:
            return
        # deferred: only a listener that install() registered (numba already loaded) is removed
        from numba.core import event  # noqa: PLC0415

        event.unregister("numba:compile", _LISTENER)
        _LISTENER = None


def installed() -> bool:
    """Whether the notice is installed."""
    return _LISTENER is not None


def cached(dispatcher: Any, dtype: str) -> bool:
    """Whether the Numba ``dispatcher`` has a specialisation whose first array argument has
    dtype ``dtype`` (``"float64"``), compiled in this process or in its disk cache for this
    CPU and source (a call then loads it instead of compiling).

    Reads Numba's cache index (an internal of Numba): anything unexpected there answers
    ``False``, so the worst case is a compilation in the background that was not needed.
    """
    if any(_array_dtype(sig) == dtype for sig in getattr(dispatcher, "signatures", ())):
        return True
    try:
        cache = dispatcher._cache
        codegen = dispatcher.targetctx.codegen()
        index = cache._cache_file._load_index()
        return any(_array_dtype(sig) == dtype and magic == codegen.magic_tuple()
                   and stamp == cache._index_key(sig, codegen)[2]
                   for sig, magic, stamp in index)
    except Exception:  # noqa: BLE001 - an unreadable or changed cache: say "not cached"
        return False


_JOBS: dict[str, str] = {}        # key -> "queued", "running", "ready" or "failed"
_QUEUE: queue.Queue = queue.Queue()
_WORKER: threading.Thread | None = None


def _work() -> None:
    while True:
        key, job = _QUEUE.get()
        _JOBS[key] = "running"
        try:
            with expected():
                job()
        except Exception as exc:     # logged, never raised in the user's thread
            _JOBS[key] = "failed"
            logger.warning("transformer_pde: the background compilation %s failed (%s: %s); "
                           "its callers keep the NumPy backend", key, type(exc).__name__, exc)
            logger.debug("background compilation %s", key, exc_info=True)
        else:
            _JOBS[key] = "ready"
            logger.info("transformer_pde: the background compilation %s is done", key)
        finally:
            _QUEUE.task_done()


def compile_in_background(key: str, job: Callable[[], None]) -> str:
    """Run ``job`` (which compiles kernels, e.g. by calling them on tiny inputs) on the
    background compilation thread, once per ``key``; returns :func:`job_state` of ``key``.

    One daemon thread runs the jobs one at a time in the order given, so a compilation
    never competes with another for the cores; its compilations are :func:`expected`
    (said at ``INFO``).  A job that raises is ``"failed"`` and logged at ``WARNING``; it is
    not run again in this process.
    """
    global _WORKER
    with _LOCK:
        if key not in _JOBS:
            _JOBS[key] = "queued"
            _QUEUE.put((key, job))
            if _WORKER is None:
                _WORKER = threading.Thread(target=_work, name="transformer_pde-compile",
                                           daemon=True)
                _WORKER.start()
        return _JOBS[key]


def job_state(key: str) -> str | None:
    """``"queued"``, ``"running"``, ``"ready"`` or ``"failed"`` for a job given to
    :func:`compile_in_background`; ``None`` for a key never given."""
    return _JOBS.get(key)


def running() -> bool:
    """Whether a background compilation is queued or running.  A process that forks
    meanwhile gives its child a Numba compiler lock held by a thread the child does not
    have: start workers with ``spawn`` then (or wait for :func:`job_state` to be final)."""
    return any(state in ("queued", "running") for state in list(_JOBS.values()))


def runnable(key: str, kernels: list[tuple[Any, str]]) -> bool:
    """Whether every ``(dispatcher, dtype)`` of ``kernels`` runs now without compiling: the
    background job under ``key`` is done, or none was given and each is :func:`cached`."""
    state = job_state(key)
    return state == "ready" or (state is None
                                and all(cached(d, dtype) for d, dtype in kernels))


def ready_or_background(key: str, kernels: list[tuple[Any, str]],
                        job: Callable[[], Any]) -> bool:
    """Whether every ``(dispatcher, dtype)`` of ``kernels`` can run without compiling now:
    :func:`cached`, or compiled by ``job`` on the background thread
    (:func:`compile_in_background` under ``key``, started here if it was not).

    A caller that gets ``False`` takes a path that needs no compilation meanwhile, so it
    never waits for a compiler (Numba compiles one function at a time in a process: a call
    that compiled in the foreground would also wait for the background one).  With the
    environment variable :data:`COMPILE_ENV` set to ``foreground`` the job runs in the
    caller's thread instead and the answer is ``True``.
    """
    if runnable(key, kernels):
        return True
    if job_state(key) is None and os.environ.get(COMPILE_ENV, "").strip().lower() == "foreground":
        job()
        return True
    return compile_in_background(key, job) == "ready"
