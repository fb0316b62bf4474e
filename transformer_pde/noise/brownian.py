r"""The Brownian path of a noisy run: counter-based, refinable, one stream per system.

A run's noise is one Brownian motion :math:`Z` in :math:`\mathbb R^D` (:math:`D` the
number of scalar Brownian motions of the run: :math:`d` per token and :math:`K` per
system), named by ``(seed, path)``.

**One stream per system.**  System :math:`g` (its index: ``Noise.system`` plus its place
in the run) draws its :math:`D_g = K + n_g d` coordinates from its own stream, the
Philox-4x64-10 blocks with the key :math:`k` of ``SeedSequence([seed, path])`` and the
counters :math:`(c, g, \ell, j)`, :math:`c = 0, 1, \dots`, for refinement level
:math:`\ell` and coarse step :math:`j` (the interval :math:`[j b, (j+1) b]` of the base
step :math:`b`).  Each block gives four 64-bit words, turned into four standard normals
by Box–Muller (two pairs of uniforms :math:`((w \gg 11) + \tfrac12)\,2^{-53}`).  Within
the stream, number :math:`q = i R + r` is row :math:`r` of coordinate :math:`i` (:math:`R`
rows at the level), and the coordinates of a system are its :math:`K` common ones first,
then its tokens' :math:`d` individual ones token by token.  So a system's path depends only
on ``(seed, path)``, its index :math:`g` and its own coordinates: not on the number or the
sizes of the systems packed with it (member :math:`b` of an ensemble is the single run
with ``Noise(system=b)``); its common Brownian motions and the noise of its first tokens do
not depend on its number of tokens either.  Every block is a function of its counter
alone (one compiled pass draws all the systems of a step), so the path does not depend on
the backend, the thread count, a checkpoint and resume, or which steps were drawn before.  The
numbers are float64 on the host; the run moves them to its backend in its working
precision.  The generator is compiled (:mod:`~transformer_pde.noise.philox`); its blocks
are NumPy's ``Philox`` ones (tested against it).

**Refinable.**  Level 0 draws the coarse increments
:math:`\Delta Z_j = \sqrt b\, \xi_j`.  Level :math:`\ell \ge 1` splits each interval of
length :math:`\tau = b/2^{\ell-1}` at its midpoint by the Brownian bridge: an increment
:math:`\Delta` over it becomes :math:`\Delta/2 + \tfrac{\sqrt\tau}{2}\,\xi` and
:math:`\Delta - (\Delta/2 + \tfrac{\sqrt\tau}{2}\xi)`, which have the joint law of two
independent increments over the halves.  A run with :math:`\Delta t = b/2^L` uses level
:math:`L`; the sum of its increments over a coarse step is the coarse increment (to
rounding, :math:`\sim 10^{-16}` relative), so runs at different :math:`\Delta t` see the
same path at the coarse times (strong-order tests need exactly this).

**Layout.**  The :math:`D` columns of an increment are the systems' coordinates, system by
system, each in its stream's order (common, then individual).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..integrate.controller import STEP_TOL

__all__ = ["BrownianPath", "check_grid", "refinement_level"]

#: relative tolerance of the grid checks (``dt = base_dt / 2**L``, times on the grid)
GRID_TOL = 1e-9
#: the finest refinement below the base step (2**20 steps per coarse step)
MAX_LEVEL = 20


def refinement_level(base_dt: float, dt: float) -> int:
    """The level :math:`L` with ``dt = base_dt / 2**L``, or :class:`ArgumentError`
    naming ``dt``."""
    ratio = base_dt / dt
    level = round(math.log2(ratio)) if ratio > 0 else -1
    if not 0 <= level <= MAX_LEVEL or abs(ratio / 2 ** level - 1.0) > GRID_TOL:
        raise ArgumentError(
            f"dt={dt!r} must be noise.base_dt={base_dt!r} divided by a power of two "
            f"(2**0 .. 2**{MAX_LEVEL}): the Brownian path is refined by bisection")
    return level


def check_grid(t_max: float, dt: float, ts: Any = None) -> None:
    """Refuse a noisy run whose steps would leave the grid :math:`k\\,\\Delta t`: ``t_max``
    and the save times ``ts`` must be multiples of ``dt`` (a shortened step would need
    the path at a time off the grid)."""
    for name, values in (("t_max", [t_max]), ("saveat.ts", [] if ts is None else ts)):
        for t in values:
            # the loop cuts a segment into ceil(L/dt - STEP_TOL) steps: a time more than
            # STEP_TOL steps past a grid point would get a short extra step
            x = float(t) / dt
            k = round(x)
            if not -1e-6 <= x - k <= STEP_TOL:
                raise ArgumentError(
                    f"{name}: with noise every step has the size dt={dt!r}, so {name} must be "
                    f"a multiple of dt; {float(t)!r} is {float(t) / dt:.12g} steps")


def _stream_normals() -> Any:
    """The compiled generator (:func:`~transformer_pde.noise.philox.stream_normals`)."""
    # deferred: the kernel module imports numba, heavy to import, on the first noisy draw
    from .philox import stream_normals   # noqa: PLC0415
    return stream_normals


class BrownianPath:
    r"""Increments of one Brownian path in :math:`\mathbb R^D` on the grid of step
    :math:`\Delta t = b/2^L` (see the module docstring).

    Parameters
    ----------
    seed, path : int
        Name the path.
    dim : int or sequence of int
        The coordinates :math:`D_g` of each system (an int: one system), in the order of
        the columns; :math:`D = \sum_g D_g`.
    base_dt : float
        The base step :math:`b`.
    level : int
        Refinement level :math:`L` (0: the base grid itself).
    system : int, default 0
        The index :math:`g` of the first system (the next ones follow: ``system + 1``,
        ...); it names the systems' streams.
    """

    def __init__(self, seed: int, path: int, dim: Any, base_dt: float, level: int = 0,
                 system: int = 0):
        self.seed, self.path, self.system = int(seed), int(path), int(system)
        self.dims = np.atleast_1d(np.asarray(dim, dtype=np.int64))
        if self.dims.ndim != 1 or self.dims.size < 1 or np.any(self.dims < 0) \
                or self.system < 0:
            raise ArgumentError(f"dim must be a count or a sequence of counts >= 0 and system "
                                f">= 0, got dim={dim!r}, system={system!r}")
        self.dim = int(self.dims.sum())
        self.base_dt, self.level = float(base_dt), int(level)
        self.dt = self.base_dt / 2 ** self.level
        self._key = np.random.SeedSequence([self.seed, self.path]).generate_state(2, np.uint64)
        self._coarse: int | None = None
        self._fine: np.ndarray | None = None

    def _normals(self, j: int, level: int, rows: int) -> np.ndarray:
        """The ``(rows, D)`` standard normals of level ``level`` at coarse step ``j``."""
        out = np.empty(self.dim * rows)
        _stream_normals()(self.dims, rows, np.uint64(self.system), np.uint64(level),
                          np.uint64(j), self._key, out)
        return out.reshape(self.dim, rows).T

    def coarse_increments(self, j: int, level: int | None = None) -> np.ndarray:
        r"""The increments over the :math:`2^\ell` sub-steps of coarse step ``j`` at level
        :math:`\ell` (default: the path's level), shape :math:`(2^\ell, D)`."""
        level = self.level if level is None else int(level)
        if j < 0:
            raise ArgumentError(f"step index must be >= 0, got {j}")
        incr = math.sqrt(self.base_dt) * self._normals(j, 0, 1)
        tau = self.base_dt
        for lev in range(1, level + 1):
            left = 0.5 * incr + (0.5 * math.sqrt(tau)) * self._normals(j, lev, incr.shape[0])
            out = np.empty((2 * incr.shape[0], self.dim))
            out[0::2], out[1::2] = left, incr - left
            incr, tau = out, 0.5 * tau
        return incr

    def increment(self, index: int) -> np.ndarray:
        r"""The increment :math:`Z((k+1)\Delta t) - Z(k\Delta t)` of fine step
        ``index`` :math:`= k` (float64, shape (D,); a read-only view)."""
        j, sub = divmod(int(index), 2 ** self.level)
        if j != self._coarse:
            self._fine = self.coarse_increments(j)
            self._fine.setflags(write=False)
            self._coarse = j
        return self._fine[sub]

    def step_index(self, t: float, h: float) -> int:
        """The index :math:`k` of the step from ``t`` of size ``h``, which must be the grid
        step :math:`[k\\Delta t, (k+1)\\Delta t]` (``ArgumentError`` otherwise)."""
        k = round(t / self.dt)
        if abs(t / self.dt - k) > 1e-6 or abs(h / self.dt - 1.0) > 1e-6 or k < 0:
            raise ArgumentError(
                f"a noisy step must be a step of the grid k*dt (dt={self.dt!r}); got the step "
                f"from t={t!r} of size {h!r}")
        return k

    #: version of the plain data of :meth:`get_state` (2: one stream per system)
    STATE_VERSION = 2

    def get_state(self) -> dict[str, Any]:
        """What names the path (a checkpoint stores it and refuses another): seed, path,
        the first system's index, the systems' coordinate counts (run-length encoded as
        ``[count, repeats]`` pairs), base step and level."""
        cut = np.flatnonzero(np.diff(self.dims)) + 1
        starts = np.concatenate([[0], cut])
        lengths = np.diff(np.concatenate([starts, [self.dims.size]]))
        runs = [[int(self.dims[a]), int(m)] for a, m in zip(starts, lengths, strict=True)]
        return {"version": self.STATE_VERSION, "seed": self.seed, "path": self.path,
                "system": self.system, "dims": runs, "base_dt": self.base_dt,
                "level": self.level}

    def check_state(self, state: dict[str, Any]) -> None:
        """``ValueError`` unless ``state`` (of :meth:`get_state`) names this very path."""
        if state != self.get_state():
            raise ValueError(f"the checkpoint's Brownian path {state!r:.200} is not this "
                             f"run's {self.get_state()!r}")
