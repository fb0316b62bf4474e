r"""``transformer-pde warmup``: compile the package's Numba kernels ahead of their first use.

The compiled kernels are built by Numba the first time they run with a given argument
type and cached on disk (``NUMBA_CACHE_DIR`` moves the cache).  :func:`warmup` compiles
the kernels of the main paths now, once, instead of in the first real run; later runs,
in any process, load the cached machine code.  The paths (:data:`WARMUP_PATHS`):

* ``backend``: every kernel of the Numba backend
  (:func:`~transformer_pde.backends.compile_kernels`: softmax and lse, pointwise and the
  Sinkhorn sweep, streaming and tiled, float64 and float32), which
  :func:`~transformer_pde.simulate`, :func:`~transformer_pde.velocity`, the Sinkhorn field
  and the pretrained models run on (``particles`` and ``sinkhorn`` are older names of it);
* ``gaussian``: :func:`~transformer_pde.gaussian.solve_batch` of softmax members (the
  lockstep kernel of softmax / linear);
* ``gaussian-general``: the same for a Sinkhorn member (the kernel of l2 / sinkhorn);
* ``clusters``: :func:`~transformer_pde.diagnostics.clusters` (the minimum-spanning-tree
  kernel of up to :data:`~transformer_pde.diagnostics.clustering.EXACT_MST_MAX` tokens);
* ``harmonic``: the exact harmonic field (``FieldOptions(method="harmonic")``, the
  kernels of its moments and evaluations on the circle and on :math:`S^2`);
* ``noise``: the Brownian path of a noisy run (``simulate(noise=...)``: the kernel that
  draws its counter-based normals).

Each kernel compiles once: a kernel already compiled (in this process or in the disk
cache) is loaded, not compiled again, and not reported.  While it compiles, the command
shows a line per kernel when it starts and one with its time when it ends (the compile
notice of :mod:`~transformer_pde.backends.compile_notice`, at ``INFO``: the compilations
are expected), then a line per path.  Without numba there is nothing to compile and the
command says so.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..backends import compile_kernels, compile_notice
from .exits import ExitCode, UsageError

__all__ = ["WARMUP_PATHS", "cmd_warmup", "configure_parser", "warmup"]


def _gaussian(general: bool = False) -> None:
    # deferred: SciPy takes seconds to import; only this path needs it
    from ..gaussian.batch import compile_kernel  # noqa: PLC0415

    compile_kernel(general)


def _clusters() -> None:
    # deferred: the diagnostics import SciPy (seconds); only this path needs them
    from ..diagnostics import clusters  # noqa: PLC0415

    clusters(np.random.default_rng(0).standard_normal((32, 2)))


def _harmonic() -> None:
    # deferred: the particle engine is only needed by this path
    from ..attention import Attention  # noqa: PLC0415
    from ..blocks import Block, Sphere  # noqa: PLC0415
    from ..particles import FieldOptions, simulate  # noqa: PLC0415

    field = FieldOptions(backend="numba", method="harmonic")
    for d in (2, 3):
        X = np.random.default_rng(0).standard_normal((16, d))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        simulate(Attention("softmax", np.eye(d), np.eye(d), np.eye(d)), X, t_max=0.1,
                 dt=0.1, solver="euler", block=Block(constraint=Sphere()), field=field)


def _noise() -> None:
    # deferred: the particle engine and the noise are only needed by this path
    from ..attention import Attention  # noqa: PLC0415
    from ..noise import Noise  # noqa: PLC0415
    from ..particles import FieldOptions, simulate  # noqa: PLC0415

    simulate(Attention("softmax", np.eye(2), np.eye(2), np.eye(2)), np.eye(2), t_max=0.1,
             dt=0.1, solver="euler_maruyama", noise=Noise(sigma=0.1),
             field=FieldOptions(backend="numpy"))


#: The paths :func:`warmup` compiles, by name.
WARMUP_PATHS: dict[str, Callable[[], object]] = {
    "backend": compile_kernels, "gaussian": _gaussian,
    "gaussian-general": lambda: _gaussian(True), "clusters": _clusters,
    "harmonic": _harmonic, "noise": _noise}
#: older names of a path
_ALIASES = {"particles": "backend", "sinkhorn": "backend"}


def warmup(paths: Sequence[str] | None = None) -> list[tuple[str, float]]:
    """Compile the Numba kernels of ``paths`` (default: all of :data:`WARMUP_PATHS`, each
    once), one kernel at a time; returns ``(path, seconds)`` in order (a path already
    compiled and cached takes a fraction of a second).  Every kernel that compiles is said
    when it starts and when it ends, at ``INFO`` on the logger ``"transformer_pde.compile"``.

    Raises
    ------
    UsageError
        An unknown path name, or numba not installed.
    """
    names = list(WARMUP_PATHS) if not paths else list(paths)
    unknown = [p for p in names if p not in WARMUP_PATHS and p not in _ALIASES]
    if unknown:
        raise UsageError(f"unknown warmup path(s) {unknown}; choose from {list(WARMUP_PATHS)}")
    names = list(dict.fromkeys(_ALIASES.get(p, p) for p in names))
    try:
        # deferred: numba is optional; its absence is a usage error of this command only
        import numba  # noqa: F401, PLC0415
    except ImportError:
        raise UsageError("numba is not installed: there are no kernels to compile") from None
    notice_after = compile_notice._LISTENER.after if compile_notice.installed() else None
    compile_notice.install(after=0.0)           # each kernel said as it starts
    out = []
    try:
        with compile_notice.expected():
            for name in names:
                t0 = time.perf_counter()
                WARMUP_PATHS[name]()
                out.append((name, time.perf_counter() - t0))
    finally:
        if notice_after is None:
            compile_notice.uninstall()
        else:
            compile_notice.install(after=notice_after)
    return out


def configure_parser(p: argparse.ArgumentParser) -> None:
    """The arguments of ``transformer-pde warmup`` and its function."""
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=f"what to compile: {', '.join(WARMUP_PATHS)} (default: all)")
    p.set_defaults(func=cmd_warmup)


class _Progress(logging.Handler):
    """The compile notice as ``warmup:`` lines on stdout, as they come."""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().removeprefix("transformer_pde: ")
        sys.stdout.write(f"warmup: {text}\n")
        sys.stdout.flush()


def cmd_warmup(args: argparse.Namespace) -> int:
    """``transformer-pde warmup [PATH ...]``: :func:`warmup`, a line per kernel as it
    starts and ends, then a line per path, on stdout."""
    log = logging.getLogger(compile_notice.LOGGER_NAME)
    handler, level, propagate = _Progress(logging.INFO), log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        for name, seconds in warmup(getattr(args, "paths", None)):
            sys.stdout.write(f"warmup: {name} ready ({seconds:.1f} s)\n")
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
    return ExitCode.OK
