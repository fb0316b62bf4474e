r"""CuPy backend: fused streaming CUDA kernels for the three primitives, state on the GPU.

The primitives of :mod:`transformer_pde.backends` are one CUDA C kernel template in
``kernels/attention.cu`` (shipped as package data, compiled by NVRTC through
:class:`cupy.RawModule` once per specialisation and cached on disk by CuPy),
``tpde_reduce<P, QPT, NT, TK>``, with one *accumulator policy* ``P`` per primitive:

``tpde_softmax_acc<T, R, C>``
    softmax with key bias (``C = 0``: log-sum-exp alone, for Sinkhorn);
``tpde_pointwise_acc<T, R, C, PHI>``
    :math:`\sum_j w_j \varphi(q_i\cdot k_j) v_j` for identity, sigmoid and relu.

``T`` is float or double, ``R`` and ``C`` the widths of keys and values (at most
:data:`MAX_WIDTH`; wider values are split into column blocks, wider keys go to the
chunked dense path :func:`plain_softmax`).  A block of ``NT`` threads owns
``NT * QPT`` queries (``QPT`` queries per thread, held in registers, so that every key
read from shared memory serves ``QPT`` pairs) and streams the keys in tiles of ``TK``
through shared memory.  For every pair the kernel computes the base-2 logit
:math:`\ell = \log_2(e)(q\cdot k + b)` (the factor is folded into the queries and the
bias once), keeps a running maximum :math:`m` (online log-sum-exp: a larger logit folds
the partial sums into the totals and rescales them by :math:`2^{m-\ell}`) and adds
:math:`2^{\ell-m}` and :math:`2^{\ell-m} v` to partial sums in ``T``, which are added to
float64 totals at the end of every tile.  Then
:math:`\mathrm{lse} = \ln 2\,(m + \log_2 s)` and :math:`\mathrm{out} = a/s`.

When there are too few blocks of queries to fill the GPU (``M`` small), the keys are
split into chunks (``gridDim.y``) whose partial results :math:`(m, s, a)` are merged by
:func:`merge_softmax_partials` (:math:`m^* = \max_c m_c`,
:math:`s = \sum_c 2^{m_c - m^*} s_c`, likewise :math:`a`).

Key ranges (:class:`~transformer_pde.backends.ranges.KeyRanges`, query ``i`` sees the
keys :math:`\mathrm{lo}_i \le j < \mathrm{hi}_i`) go to the kernels as two int32
arrays.  The queries are sorted by their ranges (by ``hi`` for prefix masks, by
``(lo, hi)`` otherwise), so that each block visits only ``[min lo, max hi)`` of its
queries (one segment's keys for an ensemble or packed sequences, a band for sliding
windows); a key outside a query's own range is never used by that query.  Key tiles
start on a fixed grid, so a query's result does not depend on the other queries of its
block: prefix masks give bit for bit the results of the former per-query prefix lengths.

Special values follow the NumPy reference: a query with no visible mass (empty range or
every visible bias :math:`-\infty`) gets ``out = 0`` and ``lse = -inf``; a NaN or
:math:`+\infty` logit gives the same answer.

Every array the backend returns stays on the device (``xp`` is :mod:`cupy`); only
:meth:`CupyBackend.to_numpy` copies to the host.  The kernel launches go through a
*launcher* (:class:`CupyLauncher` on a GPU).  The test suite runs the same kernel source,
compiled as C++ for the CPU, through :class:`transformer_pde.backends.cuda_cpu.CpuLauncher`
with NumPy standing in for CuPy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

import numpy as np

from ..errors import BackendNotAvailable
from . import to_host
from .numpy_backend import NumpyBackend, overflow_scale
from .ranges import KeyRanges, check_ranges

__all__ = [
    "INSTALL_HINT",
    "MAX_WIDTH",
    "CupyBackend",
    "CupyLauncher",
    "KernelConfig",
    "Launcher",
    "kernel_config",
    "kernel_source",
    "merge_pointwise_partials",
    "merge_softmax_partials",
    "plain_pointwise",
    "plain_softmax",
    "pointwise_kernel_name",
    "softmax_kernel_name",
]

#: widest keys / values the fused kernels take (queries and partial sums live in registers)
MAX_WIDTH = 32
#: keys per shared-memory tile
TILE_KEYS = 64
#: threads per block
THREADS = 128
#: 32-bit registers per thread given to the per-query state (queries, sums)
_REGISTER_BUDGET = 96
#: fewest key tiles per chunk when the keys are split
_MIN_TILES_PER_CHUNK = 2
#: blocks per multiprocessor the key split aims for
_BLOCKS_PER_SM = 4

PHI_CODES = {"identity": 0, "sigmoid": 1, "relu": 2}

INSTALL_HINT = ("pip install 'transformer-pde[gpu-cuda12]' (NVIDIA driver for CUDA 12) or "
                "'transformer-pde[gpu-cuda13]' (CUDA 13)")

_REFERENCE = NumpyBackend()
# why the default GPU backend could not be created in this process (at most one entry)
_DEFAULT_FAILURE: list[BackendNotAvailable] = []


# --------------------------------------------------------------------------- kernels
def kernel_source() -> str:
    """The CUDA C source of the kernels (package data ``kernels/attention.cu``)."""
    return resources.files(__package__).joinpath("kernels/attention.cu").read_text()


@dataclass(frozen=True)
class KernelConfig:
    """Launch shape of one kernel specialisation: queries per thread, threads, key tile."""

    qpt: int
    nt: int = THREADS
    tk: int = TILE_KEYS


def kernel_config(dtype: Any, r: int, c: int, *, softmax: bool = True) -> KernelConfig:
    """Queries per thread for keys of width ``r`` and values of width ``c``.

    The per-query state (``r`` query coordinates, the running maximum, partial sums in
    ``dtype`` and float64 totals) must fit a register budget of about
    :data:`_REGISTER_BUDGET` 32-bit registers, so that nothing spills (checked with
    ``ptxas`` by the test suite); ``QPT`` is the largest power of two up to 8 that fits.
    (The kernels carry no ``__launch_bounds__``: with it, ptxas 13.0 traded a few bytes
    of spills for fewer registers at ``r = 1``.)
    """
    w = 2 if np.dtype(dtype) == np.float64 else 1
    per_query = w * r + (w + 2) * c + ((2 * w + 2) if softmax else 0)
    qpt = 8
    while qpt > 1 and qpt * per_query > _REGISTER_BUDGET:
        qpt //= 2
    return KernelConfig(qpt)


def _ctype(dtype: Any) -> str:
    return "double" if np.dtype(dtype) == np.float64 else "float"


def _reduce_name(policy: str, cfg: KernelConfig) -> str:
    return f"tpde_reduce<{policy}, {cfg.qpt}, {cfg.nt}, {cfg.tk}>"


def softmax_kernel_name(dtype: Any, r: int, c: int) -> str:
    """Name expression of the softmax (``c > 0``) or lse (``c = 0``) specialisation."""
    return _reduce_name(f"tpde_softmax_acc<{_ctype(dtype)}, {r}, {c}>",
                        kernel_config(dtype, r, c))


def pointwise_kernel_name(dtype: Any, r: int, c: int, phi: str) -> str:
    """Name expression of the pointwise specialisation for ``phi``."""
    return _reduce_name(f"tpde_pointwise_acc<{_ctype(dtype)}, {r}, {c}, {PHI_CODES[phi]}>",
                        kernel_config(dtype, r, c, softmax=False))


class Launcher(Protocol):
    """Runs kernels of :func:`kernel_source`: on a GPU (:class:`CupyLauncher`) or a CPU."""

    xp: Any
    n_multiprocessors: int

    def launch(self, name: str, grid: tuple[int, int], block: int,
               args: Sequence[Any]) -> None: ...


# --------------------------------------------------------------------------- merges
def merge_softmax_partials(xp: Any, part: Any, dtype: Any) -> tuple[Any, Any]:
    r"""Merge per-chunk softmax partials ``part`` (S, M, C + 2) into ``(out, lse)``.

    Chunk ``c`` holds :math:`(m_c, s_c, a_c)` with :math:`m_c` a base-2 maximum and
    :math:`s_c = \sum_j 2^{\ell_j - m_c}`, :math:`a_c = \sum_j 2^{\ell_j - m_c} v_j`.
    With :math:`m^* = \max_c m_c`: :math:`s = \sum_c 2^{m_c-m^*} s_c`, likewise
    :math:`a`, :math:`\mathrm{lse} = \ln 2\,(m^* + \log_2 s)`, :math:`\mathrm{out} = a/s`.
    A query with :math:`s = 0` (no visible mass) or a non-finite :math:`s` (NaN or
    :math:`+\infty` logits) gets ``out = 0``, ``lse = -inf``, as in the reference.
    """
    m = part[:, :, 0]
    mstar = m.max(axis=0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        f = xp.exp2(m - mstar[None, :])
        s = (f * part[:, :, 1]).sum(axis=0)
        a = (f[:, :, None] * part[:, :, 2:]).sum(axis=0)
        ok = (s > 0) & (s <= np.finfo(np.float64).max)
        s_safe = xp.where(ok, s, 1.0)
        lse = xp.where(ok, (mstar + xp.log2(s_safe)) * math.log(2.0), -np.inf)
        out = xp.where(ok[:, None], a / s_safe[:, None], 0.0)
    return out.astype(dtype), lse.astype(dtype)


def merge_pointwise_partials(xp: Any, part: Any, dtype: Any) -> Any:
    """Merge per-chunk pointwise partial sums ``part`` (S, M, C): their sum, in ``dtype``."""
    return part.sum(axis=0).astype(dtype)


# --------------------------------------------------------------------------- plain path
def _plain_blocks(xp: Any, m: int, n: int, ranges: KeyRanges | None, max_elems: int):
    """Row blocks ``sl`` of about ``max_elems`` scores, each with the first key ``a`` and
    the number of keys its queries may see, and the hidden entries among those keys
    (``None``: all visible).  General ranges restrict a block to its span
    ``[min lo, max hi)``; prefix masks and ``None`` keep every key (the results of a
    prefix mask stay those of a full-width product)."""
    step = max(1, max_elems // max(n, 1))
    for start in range(0, m, step):
        sl = slice(start, min(m, start + step))
        if ranges is None:
            yield sl, 0, n, None
            continue
        part = ranges.take(sl)
        a, b = (0, n) if ranges.is_prefix else part.span()
        cols = xp.arange(a, b)[None, :]
        yield sl, a, b, ((cols < xp.asarray(part.lo)[:, None])
                         | (cols >= xp.asarray(part.hi)[:, None]))


def plain_softmax(xp: Any, q: Any, k: Any, v: Any, bias: Any, ranges: KeyRanges | None, *,
                  max_elems: int = 1 << 25) -> tuple[Any, Any]:
    """Softmax by dense blocks of logits (``xp`` matmul, max, exp): the baseline path.

    Used for keys wider than :data:`MAX_WIDTH` and by the GPU benchmark as "plain CuPy
    chunks"; memory ``max_elems`` logits at a time.  Same contract as the primitives
    (``v = None`` returns only the lse).
    """
    m, n = q.shape[0], k.shape[0]
    dtype = q.dtype
    c = 0 if v is None else v.shape[1]
    out = xp.zeros((m, c), dtype=dtype)
    lse = xp.full(m, -np.inf, dtype=dtype)
    for sl, a, b, hidden in _plain_blocks(xp, m, n, ranges, max_elems):
        if a == b:
            continue                          # no visible key: out = 0, lse = -inf
        logits = q[sl] @ k[a:b].T
        if bias is not None:
            logits = logits + bias[None, a:b]
        if hidden is not None:
            logits = xp.where(hidden, -np.inf, logits)
        with np.errstate(invalid="ignore", over="ignore"):
            mx = logits.max(axis=1)
            ok = xp.isfinite(mx)
            mx = xp.where(ok, mx, 0.0)
            p = xp.exp(logits - mx[:, None])
            s = p.sum(axis=1)
            good = ok & (s > 0) & xp.isfinite(s)
            s_safe = xp.where(good, s, 1.0)
            lse[sl] = xp.where(good, mx + xp.log(s_safe), -np.inf)
            if c:
                out[sl] = xp.where(good[:, None], (p @ v[a:b]) / s_safe[:, None], 0.0)
    return out, lse


def plain_pointwise(xp: Any, phi: str, q: Any, k: Any, v: Any, w: Any,
                    ranges: KeyRanges | None, *, max_elems: int = 1 << 25) -> Any:
    """Pointwise kinds by dense blocks of scores (see :func:`plain_softmax`)."""
    m, n = q.shape[0], k.shape[0]
    out = xp.zeros((m, v.shape[1]), dtype=q.dtype)
    for sl, a, b, hidden in _plain_blocks(xp, m, n, ranges, max_elems):
        if a == b:
            continue
        z = q[sl] @ k[a:b].T
        if phi == "sigmoid":
            e = xp.exp(-xp.abs(z))
            f = xp.where(z >= 0, 1.0, e) / (1.0 + e)
        elif phi == "relu":
            f = xp.maximum(z, 0.0)
        else:
            f = z
        f = f * w[None, a:b]
        if hidden is not None:
            f = xp.where(hidden, 0.0, f)
        out[sl] = (f @ v[a:b]).astype(q.dtype)
    return out


# --------------------------------------------------------------------------- launcher
class CupyLauncher:
    """Compiles (NVRTC, through :class:`cupy.RawModule`) and launches the kernels on a GPU.

    Raises
    ------
    BackendNotAvailable
        CuPy is not installed, the CUDA driver is missing or too old, or no device is
        visible; the message says which and how to install.
    """

    def __init__(self, device: int | None = None):
        try:
            import cupy  # noqa: PLC0415 - optional dependency
        except ImportError as exc:
            raise BackendNotAvailable(
                f"backend='cupy' needs CuPy, which is not installed ({exc}); "
                f"{INSTALL_HINT}") from exc
        try:
            n_dev = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:  # CUDARuntimeError, or a library that fails to load
            raise BackendNotAvailable(_runtime_failure(exc)) from exc
        if n_dev < 1:
            raise BackendNotAvailable(
                "backend='cupy': CuPy is installed but no CUDA device is visible "
                "(check CUDA_VISIBLE_DEVICES)")
        self.xp = cupy
        self.device = cupy.cuda.Device(0 if device is None else int(device))
        try:
            with self.device:
                self.n_multiprocessors = int(self.device.attributes["MultiProcessorCount"])
        except Exception as exc:
            raise BackendNotAvailable(_runtime_failure(exc)) from exc
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        """The compiled kernel ``name`` (a name expression), compiled on first use."""
        fn = self._functions.get(name)
        if fn is None:
            mod = self.xp.RawModule(code=kernel_source(), options=("--std=c++17",),
                                    name_expressions=[name])
            fn = mod.get_function(name)
            self._functions[name] = fn
        return fn

    def launch(self, name: str, grid: tuple[int, int], block: int,
               args: Sequence[Any]) -> None:
        """Launch kernel ``name`` on ``grid`` blocks of ``block`` threads (ints -> int32)."""
        conv = tuple(np.int32(a) if isinstance(a, (int, np.integer)) else a for a in args)
        with self.device:
            self.function(name)((int(grid[0]), int(grid[1])), (int(block),), conv)


def _runtime_failure(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    text = str(exc)
    if status == 35 or "InsufficientDriver" in text or "driver" in text.lower():
        which = "no usable NVIDIA driver (missing, or older than CuPy's CUDA runtime)"
    elif status == 100 or "NoDevice" in text:
        which = "no CUDA device"
    else:
        which = "the CUDA runtime failed"
    return (f"backend='cupy': CuPy is installed but there is {which}: {text}. "
            f"Install the CuPy build matching the driver: {INSTALL_HINT}")


# --------------------------------------------------------------------------- backend
class CupyBackend:
    """GPU backend: fused streaming CUDA kernels (see the module docstring).

    Parameters
    ----------
    launcher : Launcher, optional
        Where kernels run; default :class:`CupyLauncher` (a GPU through CuPy).  The test
        suite passes :class:`~transformer_pde.backends.cuda_cpu.CpuLauncher` (the same
        kernels compiled for the CPU, NumPy arrays).
    target_blocks : int, optional
        Blocks a launch should have to fill the device (default 4 per multiprocessor);
        calls with fewer blocks of queries split the keys into chunks.
    self_test : bool, default True
        Run a tiny problem through the kernels and compare it with the NumPy reference
        before use, so that a GPU whose driver, compiler or kernels fail is reported as
        :class:`BackendNotAvailable` (and ``backend="auto"`` never picks it).

    Notes
    -----
    Inputs may be float32 or float64 (mixed inputs are promoted like NumPy); outputs
    have the promoted dtype and stay on the device.  Memory is O((N + M)(r + c)) plus,
    when the keys are split, S·M·(c + 2) float64 partials for S chunks.
    """

    name = "cupy"

    def __init__(self, launcher: Launcher | None = None, *, target_blocks: int | None = None,
                 self_test: bool = True):
        default = launcher is None
        if default and _DEFAULT_FAILURE:
            # the GPU failed once in this process: say so again at once (``"auto"`` asks
            # on every call) instead of retrying the driver and the compiler
            raise BackendNotAvailable(str(_DEFAULT_FAILURE[0]))
        try:
            self.launcher = CupyLauncher() if default else launcher
            self.xp = self.launcher.xp
            self.target_blocks = (int(target_blocks) if target_blocks is not None
                                  else _BLOCKS_PER_SM * int(self.launcher.n_multiprocessors))
            self._dummies: dict[Any, Any] = {}
            self._last_ranges: tuple[Any, Any] = (None, None)
            if self_test:
                self._self_test()
        except BackendNotAvailable as exc:
            if default:
                _DEFAULT_FAILURE.append(exc)
            raise

    def __repr__(self) -> str:
        return f"CupyBackend(launcher={type(self.launcher).__name__})"

    # ------------------------------------------------------------------ arrays
    def asarray(self, a: Any, dtype: Any = None) -> Any:
        return self.xp.asarray(a, dtype=dtype)

    def to_numpy(self, a: Any) -> np.ndarray:
        return to_host(a)

    # ------------------------------------------------------------------ checks
    def _self_test(self) -> None:
        rng = np.random.default_rng(0)
        q, k, v = rng.normal(size=(5, 2)), rng.normal(size=(7, 2)), rng.normal(size=(7, 2))
        bias = np.log(rng.uniform(0.1, 1.0, 7))
        tests = (None, KeyRanges([0, 2, 3, 1, 6], [7, 5, 3, 4, 7], 7))   # one range empty
        try:
            got = [[self.to_numpy(a) for a in self.softmax(
                *(self.asarray(a) for a in (q, k, v, bias)), r)] for r in tests]
        except Exception as exc:
            raise BackendNotAvailable(
                f"backend='cupy': the GPU kernels could not be compiled or run "
                f"({type(exc).__name__}: {exc}); {INSTALL_HINT}") from exc
        for r, (out, lse) in zip(tests, got, strict=True):
            ref_out, ref_lse = _REFERENCE.softmax(q, k, v, bias, r)
            if not (np.allclose(out, ref_out, rtol=1e-10, atol=1e-10)
                    and np.allclose(lse, ref_lse, rtol=1e-10, atol=1e-10)):
                raise BackendNotAvailable(
                    "backend='cupy': the GPU kernels ran but disagree with the NumPy "
                    f"reference on a 5x7 self-test (max error "
                    f"{np.abs(out - ref_out).max():.3g}); please report this")

    # ------------------------------------------------------------------ helpers
    def _dummy(self, dtype: Any) -> Any:
        key = np.dtype(dtype)
        d = self._dummies.get(key)
        if d is None:
            d = self._dummies[key] = self.xp.zeros(1, dtype=key)
        return d

    def _prepare(self, q, k, others, ranges):
        xp = self.xp
        q = xp.asarray(q)
        k = xp.asarray(k)
        others = [xp.asarray(o) for o in others]
        dtype = np.result_type(q.dtype, k.dtype, *[o.dtype for o in others], np.float32)
        if dtype not in (np.float32, np.float64):
            dtype = np.dtype(np.float64)
        if q.ndim != 2 or k.ndim != 2 or q.shape[1] != k.shape[1]:
            raise ValueError(f"q and k must be (M, r) and (N, r), got {q.shape} and {k.shape}")
        m, n = q.shape[0], k.shape[0]
        for o in others:
            if o.ndim != 2 or o.shape[0] != n:
                raise ValueError(f"v must have shape ({n}, c), got {o.shape}")
        ranges = check_ranges(ranges, m, n)
        qc = xp.ascontiguousarray(q, dtype=dtype)
        kc = xp.ascontiguousarray(k, dtype=dtype)
        oc = [xp.ascontiguousarray(o, dtype=dtype) for o in others]
        return dtype, qc, kc, oc, ranges

    def _vector(self, a, n, dtype, name):
        a = self.xp.asarray(a)
        if a.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {a.shape}")
        return self.xp.ascontiguousarray(a, dtype=dtype)

    def _needs_reference(self, q, k, s, ranges, weights: bool) -> bool:
        """Calls the NumPy reference answers instead of the kernels (as the numba backend).

        Logits that may come near the float range (the reference rescales them exactly,
        :func:`~transformer_pde.backends.numpy_backend.overflow_scale`), non-finite
        queries or keys, a NaN or ``+inf`` bias ``s``, non-finite pointwise weights ``s``
        (``weights``).  One device-to-host copy of a few numbers per call.  Only the keys
        ``[min lo, max hi)`` of the non-empty ranges are looked at (no query sees others).
        """
        xp = self.xp
        n = k.shape[0]
        j0, j1 = 0, n
        if ranges is not None:
            seen = ranges.lo < ranges.hi
            j0, j1 = ((int(ranges.lo[seen].min()), int(ranges.hi[seen].max())) if seen.any()
                      else (0, 0))
        if q.size == 0 or k.size == 0 or j0 == j1:
            return False
        k = k[j0:j1]
        zero = xp.zeros((), dtype=np.float64)
        bad = zero
        ba = zero
        if weights:
            bad = bad + (~xp.isfinite(s[j0:j1])).any()
        elif s is not None:
            s = s[j0:j1]
            ba = xp.where(xp.isfinite(s), xp.abs(s), 0).max()
            bad = bad + (xp.isnan(s) | (s == np.inf)).any()
        stats = [xp.abs(q).max(), xp.abs(k).max(), ba, bad]
        vals = self.to_numpy(xp.stack([xp.asarray(a, dtype=np.float64) for a in stats]))
        qa, ka, ba, bad = (float(x) for x in vals)
        if not (math.isfinite(qa) and math.isfinite(ka)) or bad != 0:
            return True
        r = q.shape[1]
        return overflow_scale(np.full((1, r), qa, q.dtype), np.full((1, r), ka, q.dtype),
                              np.array([ba], q.dtype)) != 1.0

    def _host(self, a):
        return None if a is None else self.to_numpy(a)

    def _split(self, m: int, n: int, qpt: int, nt: int, tk: int) -> tuple[int, int]:
        """(chunk, number of chunks) of the key split for ``m`` queries, ``n`` keys."""
        q_blocks = -(-m // (qpt * nt))
        n_tiles = max(1, -(-n // tk))
        want = max(1, -(-self.target_blocks // q_blocks))
        s = max(1, min(want, n_tiles // _MIN_TILES_PER_CHUNK))
        chunk = -(-n_tiles // s) * tk
        return chunk, max(1, -(-n // chunk))

    def _device_ranges(self, ranges: KeyRanges | None):
        """``(lo, hi, order, inverse)`` for the kernels: the ranges as int32 device
        arrays, sorted by ``hi`` (prefix masks) or ``(lo, hi)``, the sorting permutation
        of the queries and its inverse (all ``None`` without ranges; no sort for one
        query).  The last ranges are cached (a field passes the same :class:`KeyRanges`
        for every head and step, and their arrays are read-only)."""
        if ranges is None:
            return None, None, None, None
        if self._last_ranges[0] is ranges:
            return self._last_ranges[1]
        xp = self.xp
        lo = xp.asarray(ranges.lo, dtype=np.int32)
        hi = xp.asarray(ranges.hi, dtype=np.int32)
        order = inverse = None
        if len(ranges) > 1:
            key = hi if ranges.is_prefix else lo.astype(np.int64) * (ranges.n_keys + 1) + hi
            order = xp.argsort(key)
            inverse = xp.empty_like(order)
            inverse[order] = xp.arange(order.shape[0])
            lo, hi = lo[order], hi[order]
        self._last_ranges = (ranges, (lo, hi, order, inverse))
        return lo, hi, order, inverse

    def _run(self, dtype, q, k, v, s, lo, hi, phi):
        """One launch of the softmax (``phi = None``) or pointwise kernel (or one per key
        chunk, merged): ``(out (M, c), lse (M,) or None)``."""
        xp = self.xp
        (m, r), n = q.shape, k.shape[0]
        c = 0 if v is None else v.shape[1]
        if phi is None:
            name, cfg = softmax_kernel_name(dtype, r, c), kernel_config(dtype, r, c)
        else:
            name = pointwise_kernel_name(dtype, r, c, phi)
            cfg = kernel_config(dtype, r, c, softmax=False)
        chunk, n_chunks = self._split(m, n, cfg.qpt, cfg.nt, cfg.tk)
        grid = (-(-m // (cfg.qpt * cfg.nt)), n_chunks)
        dummy = self._dummy(dtype)
        idummy = self._dummy(np.int32)
        args = [q, k, dummy if v is None else v, dummy if s is None else s,
                idummy if lo is None else lo, idummy if hi is None else hi, m, n, chunk,
                int(s is not None), int(lo is not None)]
        if n_chunks == 1:
            out = xp.empty((m, c), dtype=dtype) if c else xp.zeros((m, 0), dtype=dtype)
            lse = xp.empty(m, dtype=dtype) if phi is None else None
            self.launcher.launch(name, grid, cfg.nt, args + [out if c else dummy,
                                                             dummy if lse is None else lse,
                                                             self._dummy(np.float64)])
            return out, lse
        part = xp.empty((n_chunks, m, c + 2 if phi is None else c), dtype=np.float64)
        self.launcher.launch(name, grid, cfg.nt, args + [dummy, dummy, part])
        if phi is None:
            return merge_softmax_partials(xp, part, dtype)
        return merge_pointwise_partials(xp, part, dtype), None

    def _columns(self, v):
        """``v`` in column blocks of at most :data:`MAX_WIDTH` (the kernels' widest)."""
        return [self.xp.ascontiguousarray(v[:, c0:c0 + MAX_WIDTH])
                for c0 in range(0, v.shape[1], MAX_WIDTH)]

    # ------------------------------------------------------------------ primitives
    def _reduce(self, phi, q, k, v, s, ranges):
        """Softmax (``phi = None``; ``s`` the bias, ``v = None`` for the lse alone) or
        pointwise ``phi`` (``s`` the weights): ``(out (M, c), lse (M,) or None)``."""
        xp = self.xp
        dtype, q, k, others, ranges = self._prepare(q, k, [] if v is None else [v], ranges)
        v = others[0] if others else None
        (m, r), n = q.shape, k.shape[0]
        c = 0 if v is None else v.shape[1]
        s = self._vector(s, n, dtype, "w" if phi else "bias") if phi or s is not None else None
        if m == 0 or n == 0 or (phi and c == 0):
            return xp.zeros((m, c), dtype=dtype), xp.full(m, -np.inf, dtype=dtype)
        if self._needs_reference(q, k, s, ranges, weights=phi is not None):
            h = [self._host(a) for a in (q, k, v if c else xp.zeros((n, 0), dtype), s)]
            res = (_REFERENCE.softmax(*h, ranges) if phi is None else
                   (_REFERENCE.pointwise(phi, *h, ranges), None))
            return tuple(None if a is None else self.asarray(a, dtype) for a in res)
        if r > MAX_WIDTH:
            return (plain_softmax(xp, q, k, v, s, ranges) if phi is None else
                    (plain_pointwise(xp, phi, q, k, v, s, ranges), None))
        lo, hi, order, inverse = self._device_ranges(ranges)
        q = q if order is None else q[order]
        outs = []
        for vb in [None] if c == 0 else self._columns(v):      # the same lse each time
            ob, lse = self._run(dtype, q, k, vb, s, lo, hi, phi)
            outs.append(ob)
        out = outs[0] if len(outs) == 1 else xp.concatenate(outs, axis=1)
        if inverse is None:
            return out, lse
        return out[inverse], None if lse is None else lse[inverse]

    def softmax(self, q, k, v, bias, ranges):
        """Streaming softmax ``(out (M, c), lse (M,))``; see :mod:`transformer_pde.backends`."""
        return self._reduce(None, q, k, v, bias, ranges)

    def lse(self, q, k, bias, ranges):
        r""":math:`\mathrm{lse}_i = \log\sum_{j=\mathrm{lo}_i}^{\mathrm{hi}_i-1} e^{q_i\cdot k_j + b_j}`
        (M,), one streaming pass."""
        return self._reduce(None, q, k, None, bias, ranges)[1]

    def pointwise(self, phi, q, k, v, w, ranges):
        r"""``out_i = sum_{lo_i <= j < hi_i} w_j phi(q_i . k_j) v_j`` for ``phi`` in
        identity/sigmoid/relu."""
        if phi not in PHI_CODES:
            raise ValueError(f"phi must be one of {sorted(PHI_CODES)}, got {phi!r}")
        return self._reduce(phi, q, k, v, w, ranges)[0]
