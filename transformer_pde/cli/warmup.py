r"""``transformer-pde warmup``: compile the package's Numba kernels ahead of their first use.

The compiled kernels are built by Numba the first time they run with a given argument
type and cached on disk (``NUMBA_CACHE_DIR`` moves the cache).  :func:`warmup` runs one
tiny call of each main path, so that the compilation happens now, once, instead of in the
first real run; later runs, in any process, load the cached machine code.  The paths
(:data:`WARMUP_PATHS`):

* ``gaussian``: :func:`~transformer_pde.gaussian.solve_batch` of softmax members (the
  lockstep kernel of softmax / linear);
* ``gaussian-general``: the same for a Sinkhorn member (the per-member kernel of l2 /
  sinkhorn);
* ``particles``: :func:`~transformer_pde.simulate` on the ``numba`` backend (the softmax
  field, float64 and float32);
* ``sinkhorn``: the Sinkhorn field on the ``numba`` backend.

Without numba there is nothing to compile and the command says so.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np

from ..attention import Attention
from ..errors import EarlyStopWarning
from ..fields import velocity
from ..particles.options import FieldOptions
from ..particles.simulation import simulate
from .exits import ExitCode, UsageError

__all__ = ["WARMUP_PATHS", "cmd_warmup", "configure_parser", "warmup"]


def _gaussian(general: bool = False) -> None:
    # deferred: SciPy takes seconds to import; only this path needs it
    from .. import gaussian  # noqa: PLC0415

    Q = np.array([[0.4, 0.1], [-0.2, 0.6]])
    covs = np.array([[[0.6, 0.1], [0.1, 0.4]], [[0.3, 0.0], [0.0, 0.7]]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EarlyStopWarning)
        if general:
            gaussian.solve_batch(Attention("sinkhorn", Q, np.eye(2), np.eye(2)),
                                 np.zeros((1, 2)), covs[:1], t_max=0.1)
        else:
            gaussian.solve_batch(Attention("softmax", Q, np.eye(2), np.eye(2)),
                                 np.zeros((2, 2)), covs, t_max=1.0)


def _particles() -> None:
    rng = np.random.default_rng(0)
    d = 4
    att = Attention("softmax", np.eye(d), np.eye(d), np.eye(d))
    for dtype in (np.float64, np.float32):
        X0 = rng.standard_normal((64, d)).astype(dtype)
        simulate(att, X0, t_max=0.02, dt=0.01, field=FieldOptions(backend="numba"))


def _sinkhorn() -> None:
    rng = np.random.default_rng(0)
    d = 4
    att = Attention("sinkhorn", np.eye(d), np.eye(d), np.eye(d))
    velocity(att, rng.standard_normal((64, d)), backend="numba")


#: The paths :func:`warmup` compiles, by name.
WARMUP_PATHS: dict[str, Callable[[], None]] = {
    "gaussian": _gaussian, "gaussian-general": lambda: _gaussian(True),
    "particles": _particles, "sinkhorn": _sinkhorn}


def warmup(paths: Sequence[str] | None = None) -> list[tuple[str, float]]:
    """Compile the Numba kernels of ``paths`` (default: all of :data:`WARMUP_PATHS`) by one
    tiny call each; returns ``(path, seconds)`` in order (a path already compiled and
    cached takes a fraction of a second).

    Raises
    ------
    UsageError
        An unknown path name, or numba not installed.
    """
    names = list(WARMUP_PATHS) if not paths else list(paths)
    unknown = [p for p in names if p not in WARMUP_PATHS]
    if unknown:
        raise UsageError(f"unknown warmup path(s) {unknown}; choose from {list(WARMUP_PATHS)}")
    try:
        # deferred: numba is optional; its absence is a usage error of this command only
        import numba  # noqa: F401, PLC0415
    except ImportError:
        raise UsageError("numba is not installed: there are no kernels to compile") from None
    out = []
    for name in names:
        t0 = time.perf_counter()
        WARMUP_PATHS[name]()
        out.append((name, time.perf_counter() - t0))
    return out


def configure_parser(p: argparse.ArgumentParser) -> None:
    """The arguments of ``transformer-pde warmup`` and its function."""
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=f"what to compile: {', '.join(WARMUP_PATHS)} (default: all)")
    p.set_defaults(func=cmd_warmup)


def cmd_warmup(args: argparse.Namespace) -> int:
    """``transformer-pde warmup [PATH ...]``: :func:`warmup`, one line per path on stdout."""
    for name, seconds in warmup(getattr(args, "paths", None)):
        sys.stdout.write(f"warmup: {name} ready ({seconds:.1f} s)\n")
    return ExitCode.OK
